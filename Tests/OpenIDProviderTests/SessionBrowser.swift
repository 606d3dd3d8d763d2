import AppleSimulator
import Foundation
import HTTPClient
import Testing

/// A browser for the provider's session tests: keeps the provider's cookies (the session's
/// `__Host-abk_oidc`, the authorization's binding) between requests, as a browser would, and
/// plays Apple's page through the simulator when the provider sends it there.
final class SessionBrowser {
    let harness: ProviderHarness
    /// The provider's cookies, by name, as the last Set-Cookie of each left them.
    var cookies: [String: String] = [:]
    /// Every Set-Cookie for the session cookie the provider sent, in order.
    var setCookies: [String] = []

    static let cookie = "__Host-abk_oidc"

    /// The session cookie's value.
    var session: String? {
        get { cookies[Self.cookie] }
        set { cookies[Self.cookie] = newValue }
    }

    init(_ harness: ProviderHarness) { self.harness = harness }

    private var cookieHeader: [(String, String)] {
        cookies.isEmpty
            ? [] : [("Cookie", cookies.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "; "))]
    }

    private func keep(_ response: HTTPClientResponse) {
        for (name, value) in response.headers where name == "set-cookie" {
            let pair = value.split(separator: ";", maxSplits: 1)[0].split(separator: "=", maxSplits: 1)
            guard let cookieName = pair.first.map(String.init) else { continue }
            let cookieValue = pair.count > 1 ? String(pair[1]) : ""
            if cookieName == Self.cookie { setCookies.append(value) }
            cookies[cookieName] = cookieValue.isEmpty || value.contains("Max-Age=0") ? nil : cookieValue
        }
    }

    /// Apple's form post for an authorization this browser starts, as Apple's page would post
    /// it (the simulator playing the person), without posting it.
    func appleForm(_ parameters: [(String, String)]) throws -> [(String, String)] {
        let first = try answer(try authorize(parameters))
        guard case .apple(let location) = first else {
            Issue.record("not sent to Apple: \(first)")
            throw CancellationError()
        }
        let page = try harness.send("GET", location + "&" + FormEncoding.encode([("sim_first_name", "Ada")]))
        #expect(page.status == 200, "\(page.bodyText)")
        return page.bodyText.matches(of: /name="([^"]*)" value="([^"]*)"/).map {
            (Self.unescape(String($0.1)), Self.unescape(String($0.2)))
        }
    }

    func get(_ path: String) throws -> HTTPClientResponse {
        let response = try harness.send("GET", path, headers: cookieHeader + [("Accept", "text/html")])
        keep(response)
        return response
    }

    func post(_ path: String, form: [(String, String)]) throws -> HTTPClientResponse {
        let response = try harness.send(
            "POST", path, headers: cookieHeader + [("Content-Type", "application/x-www-form-urlencoded")],
            body: FormEncoding.encode(form))
        keep(response)
        return response
    }

    func authorize(_ parameters: [(String, String)]) throws -> HTTPClientResponse {
        try get("/oidc/authorize?" + FormEncoding.encode(parameters))
    }

    /// What the provider's answer (an authorize or a callback) tells the RP, in either mode.
    enum Answer {
        case apple(String)
        case query(ProviderHarness.Redirect)
        case formPost(action: String, fields: [String: String], response: HTTPClientResponse)
        case other(HTTPClientResponse)
    }

    func answer(_ response: HTTPClientResponse) throws -> Answer {
        if [302, 303].contains(response.status) {
            let redirect = try ProviderHarness.Redirect(response)
            if redirect.base == harness.simulator.baseURL + "/auth/authorize" {
                return .apple(try #require(response.header("location")))
            }
            return .query(redirect)
        }
        if response.status == 200, response.header("content-type")?.hasPrefix("text/html") == true,
            let action = response.bodyText.firstMatch(of: /<form method="post" action="([^"]*)">/)
        {
            var fields: [String: String] = [:]
            for match in response.bodyText.matches(of: /<input type="hidden" name="([^"]*)" value="([^"]*)">/) {
                fields[Self.unescape(String(match.1))] = Self.unescape(String(match.2))
            }
            return .formPost(action: Self.unescape(String(action.1)), fields: fields, response: response)
        }
        return .other(response)
    }

    /// Follows the provider to Apple (the simulator playing the person with `sim`) and back.
    func throughApple(_ location: String, sim: [(String, String)] = []) throws -> HTTPClientResponse {
        let page = try harness.send(
            "GET", location + "&" + FormEncoding.encode(sim.isEmpty ? [("sim_first_name", "Ada")] : sim))
        #expect(page.status == 200, "\(page.bodyText)")
        let html = page.bodyText
        let fields = html.matches(of: /name="([^"]*)" value="([^"]*)"/).map {
            (Self.unescape(String($0.1)), Self.unescape(String($0.2)))
        }
        return try post("/v1/apple/web/callback", form: fields)
    }

    /// An authorization from start to the RP's answer: through Apple when the provider sends
    /// the browser there (`viaApple` says whether it did).
    func signIn(_ parameters: [(String, String)], sim: [(String, String)] = []) throws -> (Answer, viaApple: Bool) {
        let first = try answer(try authorize(parameters))
        guard case .apple(let location) = first else { return (first, false) }
        return (try answer(try throughApple(location, sim: sim)), true)
    }

    static func unescape(_ text: String) -> String {
        text.replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&#39;", with: "'")
            .replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
            .replacingOccurrences(of: "&amp;", with: "&")
    }
}
