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
    /// Byte by byte, with no allocation: it runs on every request's head (Foundation's
    /// trimming and a lowercased copy of every field name were 3% of a login's CPU).
    static func problem(_ fields: [(String, String)]) -> String? {
        var lengths = 0
        var codings = 0
        for (name, value) in fields {
            guard !name.isEmpty, name.utf8.allSatisfy(isTokenCharacter) else {
                return "a header field name holds whitespace or another character a field name cannot hold"
            }
            if equalsIgnoringASCIICase(name.utf8, "content-length") {
                lengths += 1
                // Digits only (RFC 9110 §8.6): a sign, a list ("3, 3"), hex or trailing junk is
                // read differently by different parsers.
                let digits = trimmingWhitespace(value.utf8[...])
                guard !digits.isEmpty, digits.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }) else {
                    return "a Content-Length that is not a decimal number"
                }
            } else if equalsIgnoringASCIICase(name.utf8, "transfer-encoding") {
                codings += 1
                // ASCII case only (RFC 9110 §5.6.2: codings are tokens): no Unicode case mapping
                // turns another spelling into "chunked".
                guard equalsIgnoringASCIICase(trimmingWhitespace(value.utf8[...]), "chunked") else {
                    return "Transfer-Encoding other than chunked"
                }
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
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"), UInt8(ascii: "'"),
            UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^"), UInt8(ascii: "_"),
            UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            true
        default: false
        }
    }

    /// Without the optional whitespace (space, tab) around a field value (RFC 9110 §5.5).
    private static func trimmingWhitespace(_ bytes: Substring.UTF8View) -> Substring.UTF8View {
        let isWhitespace = { (byte: UInt8) in byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }
        var bytes = bytes.drop(while: isWhitespace)
        while let last = bytes.last, isWhitespace(last) { bytes = bytes.dropLast() }
        return bytes
    }

    /// `bytes` equals `lowercase` (ASCII lowercase letters and punctuation) in ASCII case only.
    private static func equalsIgnoringASCIICase<Bytes: Collection<UInt8>>(_ bytes: Bytes, _ lowercase: StaticString) -> Bool {
        guard bytes.count == lowercase.utf8CodeUnitCount else { return false }
        return lowercase.withUTF8Buffer { expected in
            zip(bytes, expected).allSatisfy { byte, wanted in
                (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte | 0x20 == wanted : byte == wanted
            }
        }
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
