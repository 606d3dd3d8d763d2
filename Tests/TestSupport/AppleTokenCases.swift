import Foundation

/// The 26 Apple-shaped identity tokens of ../shared/testdata/apple, each with a recommended
/// verdict (`accept`, `reject`, or `policy`: either is defensible).
public struct AppleTokenCases {
    public struct Case {
        public var name: String
        public var expected: String
        /// nil: accepted; otherwise how it was refused (a problem code, a status).
        public var verdict: String?

        /// Whether the verdict goes against the recommended one.
        public var isWrong: Bool { expected == "accept" ? verdict != nil : expected == "reject" && verdict == nil }
    }

    public let audience: String
    /// The file's JWK Set, to serve or hold as Apple's keys.
    public let jwks: Data
    private let cases: [[String: Any]]

    public init() throws {
        let file = try TestData.json("apple/apple_id_token_cases.json") as! [String: Any]
        audience = file["audience"] as! String
        jwks = try JSONSerialization.data(withJSONObject: file["jwks"]!)
        cases = file["cases"] as! [[String: Any]]
    }

    /// Every case judged by `judge`, which gets the token and returns nil when it accepted it.
    /// The tokens were issued on 2026-01-01: judge them with the maximum age relaxed.
    public func judged(by judge: (String) throws -> String?) rethrows -> [Case] {
        try cases.map { testCase in
            Case(
                name: testCase["name"] as! String, expected: testCase["expected"] as! String,
                verdict: try judge(testCase["token"] as! String))
        }
    }
}
