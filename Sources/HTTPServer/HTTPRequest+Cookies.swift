extension HTTPRequest {
    /// The cookies the request carries (RFC 6265 §5.4: `name=value` pairs separated by `;`
    /// in one or more `Cookie` headers). The first of two cookies with one name wins, as
    /// browsers send the most specific first. Pairs without `=` are skipped.
    public var cookies: [String: String] {
        var cookies: [String: String] = [:]
        for header in headers.values("Cookie") {
            for pair in header.split(separator: ";") {
                let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                guard parts.count == 2 else { continue }
                let name = Self.trimmed(parts[0])
                if !name.isEmpty, cookies[name] == nil { cookies[name] = Self.trimmed(parts[1]) }
            }
        }
        return cookies
    }

    private static func trimmed(_ text: Substring) -> String {
        String(text.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
