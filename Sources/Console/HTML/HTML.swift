import HTTPServer

/// A fragment of HTML. Text interpolated into it is escaped (per Unicode scalar, by
/// `HTMLPage.escape`, the code base's one escaper); only another `HTML` goes in as it is. So
/// a page cannot put a database value into markup unescaped by forgetting to.
public struct HTML: Sendable, ExpressibleByStringInterpolation, CustomStringConvertible {
    public private(set) var markup: String

    public init(stringLiteral value: String) { markup = value }
    public init(stringInterpolation: Interpolation) { markup = stringInterpolation.markup }
    init(raw markup: String) { self.markup = markup }
    public var description: String { markup }

    public struct Interpolation: StringInterpolationProtocol {
        var markup = ""
        public init(literalCapacity: Int, interpolationCount: Int) { markup.reserveCapacity(literalCapacity * 2) }
        public mutating func appendLiteral(_ literal: String) { markup += literal }
        public mutating func appendInterpolation(_ text: String) { markup += HTMLPage.escape(text) }
        public mutating func appendInterpolation(_ text: String?) { markup += HTMLPage.escape(text ?? "") }
        public mutating func appendInterpolation(_ number: Int) { markup += String(number) }
        public mutating func appendInterpolation(_ html: HTML) { markup += html.markup }
        public mutating func appendInterpolation(_ parts: [HTML]) { markup += parts.map(\.markup).joined() }
    }

    public static func + (lhs: HTML, rhs: HTML) -> HTML { HTML(raw: lhs.markup + rhs.markup) }
    public static let empty = HTML(raw: "")

    /// `items` joined, for lists built in a loop.
    public static func join(_ items: [HTML]) -> HTML { HTML(raw: items.map(\.markup).joined()) }

    /// A table with a caption and header row; cells are HTML already.
    static func table(caption: String, headers: [String], rows: [[HTML]]) -> HTML {
        let head = HTML.join(headers.map { "<th scope=\"col\">\($0)</th>" })
        let body = HTML.join(rows.map { row in "<tr>\(HTML.join(row.map { "<td>\($0)</td>" }))</tr>" })
        return "<table><caption>\(caption)</caption><thead><tr>\(head)</tr></thead><tbody>\(body)</tbody></table>"
    }
}
