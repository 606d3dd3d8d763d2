/// Whether a request says unambiguously where its body ends (RFC 9112 §6.3), checked on its
/// head before any handler runs and before the body is read.
///
/// libmicrohttpd 0.9.75 frames loosely: with both `Transfer-Encoding` and `Content-Length` it
/// takes the first and ignores the second; of two `Content-Length` fields it takes the first;
/// a field named `Content-Length ` (whitespace before the colon) is another field to it, so
/// the body it announces is read as the next request. A proxy in front that frames the same
/// bytes differently and reuses its upstream connection would let a client smuggle a request
/// past it. So these are refused with 400 and the connection closed: both length fields, a
/// repeated `Content-Length` (equal values too: RFC 9112 allows refusing), a repeated or
/// non-`chunked` `Transfer-Encoding` (the only coding libmicrohttpd decodes; any other leaves
/// the body's end to the connection's), and whitespace or any other non-token character in a
/// field name (RFC 9112 §5.1: a server MUST reject whitespace before the colon with 400).
/// A `Content-Length` value other than decimal digits (a sign, a list, hex) libmicrohttpd
/// answers itself (its own 400, then it closes) before this check runs; refused here too, so the
/// rule holds whatever a libmicrohttpd release lets through.
enum RequestFraming {
    /// Why the head's framing is refused, or nil when it is unambiguous.
    static func problem(_ fields: [(String, String)]) -> String? {
        var lengths = 0
        var codings = 0
        for (name, value) in fields {
            guard !name.isEmpty, name.utf8.allSatisfy(isTokenCharacter) else {
                return "a header field name holds whitespace or another character a field name cannot hold"
            }
            switch name.lowercased() {
            case "content-length":
                lengths += 1
                // Digits only (RFC 9110 §8.6): a sign, a list ("3, 3"), hex or trailing junk is
                // read differently by different parsers.
                let digits = value.trimmingCharacters(in: " \t")
                guard !digits.isEmpty, digits.utf8.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }) else {
                    return "a Content-Length that is not a decimal number"
                }
            case "transfer-encoding":
                codings += 1
                guard value.trimmingCharacters(in: " \t").lowercased() == "chunked" else {
                    return "Transfer-Encoding other than chunked"
                }
            default: break
            }
        }
        if lengths > 0 && codings > 0 { return "both Content-Length and Transfer-Encoding" }
        if lengths > 1 { return "more than one Content-Length" }
        if codings > 1 { return "more than one Transfer-Encoding" }
        return nil
    }

    /// RFC 9110 §5.6.2's `tchar`.
    static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            true
        default: Array("!#$%&'*+-.^_`|~".utf8).contains(byte)
        }
    }
}

extension String {
    fileprivate func trimmingCharacters(in set: String) -> String {
        String(drop { set.contains($0) }.reversed().drop { set.contains($0) }.reversed())
    }
}

extension Problem {
    /// 400 `ambiguous_framing`: the head does not say unambiguously where the body ends
    /// (`RequestFraming`); the connection closes after the answer.
    static func ambiguousFraming(_ reason: String) -> Problem {
        Problem(
            status: 400, code: "ambiguous_framing", title: "Ambiguous request framing",
            detail: "the request's framing is refused: \(reason)")
    }
}
