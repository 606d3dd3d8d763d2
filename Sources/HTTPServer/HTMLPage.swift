/// Short HTML pages for people in a browser (the web sign-in's errors), and the one HTML
/// escaper of the code base.
public enum HTMLPage {
    /// `text` safe inside an element or a quoted attribute. Per Unicode scalar, not per
    /// Character: a grapheme cluster can hold a `<` (U+0600 followed by `<` is one Character),
    /// and a browser's parser reads scalars.
    public static func escape(_ text: String) -> String {
        var escaped = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": escaped.append(contentsOf: "&amp;".unicodeScalars)
            case "<": escaped.append(contentsOf: "&lt;".unicodeScalars)
            case ">": escaped.append(contentsOf: "&gt;".unicodeScalars)
            case "\"": escaped.append(contentsOf: "&quot;".unicodeScalars)
            case "'": escaped.append(contentsOf: "&#39;".unicodeScalars)
            default: escaped.append(scalar)
            }
        }
        return String(escaped)
    }

    /// A page saying what happened and what to do, with a link when there is somewhere to go.
    /// No script, no outside resource; it may not be framed.
    public static func response(
        status: Int, title: String, message: String, link: (url: String, label: String)?, headers: HTTPHeaders = [:]
    ) -> HTTPResponse {
        let anchor = link.map { "<p><a href=\"\(escape($0.url))\">\(escape($0.label))</a></p>" } ?? ""
        let html = """
            <!DOCTYPE html>
            <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
            <title>\(escape(title))</title></head>
            <body style="font-family: system-ui, sans-serif; max-width: 32em; margin: 4em auto; padding: 0 1em">
            <h1>\(escape(title))</h1><p>\(escape(message))</p>\(anchor)</body></html>
            """
        var response = HTTPResponse.text(html, status: status, contentType: "text/html; charset=utf-8")
        for (name, value) in headers { response.headers.set(name, value) }
        response.headers.set(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; form-action 'none'; base-uri 'none'")
        response.headers.set("Cache-Control", "no-store")
        return response
    }
}
