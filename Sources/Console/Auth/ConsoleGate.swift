import BrokerCrypto
import Foundation
import HTTPServer

/// Why the console refused a request: a stable code, a status and words for the page.
struct ConsoleRefusal: Error, Equatable {
    var status: Int
    var code: String
    var title: String
    var message: String

    static let forbidden = ConsoleRefusal(
        status: 403, code: "console_forbidden", title: "Not allowed",
        message: "Your role does not include this page. Ask an administrator if you need it.")
    static let csrf = ConsoleRefusal(
        status: 403, code: "console_csrf", title: "Form refused",
        message: "This form was not sent from a page of your current session. Reload the page and try again.")
    static let signedOut = ConsoleRefusal(
        status: 403, code: "console_signed_out", title: "Signed out",
        message: "Your session has ended. Sign in again.")
    static let notFound = ConsoleRefusal(
        status: 404, code: "console_not_found", title: "Not found", message: "There is nothing at this address.")
    static func invalid(_ message: String) -> ConsoleRefusal {
        ConsoleRefusal(status: 400, code: "console_invalid", title: "Check the form", message: message)
    }
}

/// A request as a console page sees it: the session (nil on the public pages) and the form.
struct ConsoleRequest {
    var http: HTTPRequest
    var session: ConsoleSession?
    var form: [String: String]

    /// The signed-in session (routes with roles always have one).
    var signedIn: ConsoleSession {
        get throws {
            guard let session else { throw ConsoleRefusal.signedOut }
            return session
        }
    }

    func field(_ name: String, maximum: Int = 500) throws -> String {
        let value = (form[name] ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
        guard !value.isEmpty else { throw ConsoleRefusal.invalid("Fill in “\(name.replacingOccurrences(of: "_", with: " "))”.") }
        guard value.utf8.count <= maximum else { throw ConsoleRefusal.invalid("“\(name)” is longer than \(maximum) bytes.") }
        return value
    }
}

typealias ConsoleHandler = @Sendable (ConsoleRequest) throws -> HTTPResponse

/// Everything between a console route and its page, in this order: the session from the
/// `__Host-` cookie, the route's roles (403, never an empty page), the CSRF token of every
/// POST (and browsers' own word that the form is not cross-site), then a recent enough
/// sign-in on step-up routes.
struct ConsoleGate {
    static let cookieName = "__Host-console"
    static let maximumFormBytes = 16 * 1024

    let sessions: ConsoleSessionStore
    let stepUpWindow: Duration
    /// The console's origin as browsers see it (`BROKER_CONSOLE_URL`): a POST whose `Origin`
    /// names another is refused, sign-in forms included (login CSRF), also where a browser
    /// sends no Fetch metadata.
    var origin: String? = nil

    func handler(for route: ConsoleRoute, _ page: @escaping ConsoleHandler) -> HTTPHandler {
        { http in
            let session: ConsoleSession?
            do {
                session = try Self.cookie(http).flatMap { try sessions.session(secret: $0) }
                var request = ConsoleRequest(http: http, session: session, form: [:])
                if http.method == .post {
                    // Fetch metadata: a browser says when a form comes from another site.
                    if let site = http.headers["Sec-Fetch-Site"], site != "same-origin" { throw ConsoleRefusal.csrf }
                    // `null` is what a browser sends under the console's own `Referrer-Policy: no-referrer`;
                    // Fetch metadata speaks for those requests.
                    if let sent = http.headers["Origin"], sent != "null", let origin, sent != origin {
                        throw ConsoleRefusal.csrf
                    }
                    request.form = try Self.form(http)
                }
                if let roles = route.roles {
                    guard let session else {
                        if http.method == .get { return Layout.redirect("/login") }
                        throw ConsoleRefusal.signedOut
                    }
                    guard session.allows(roles) else { throw ConsoleRefusal.forbidden }
                    if http.method == .post {
                        let sent = Array((request.form["csrf_token"] ?? "").utf8)
                        guard ConstantTime.equals(sent, Array(session.csrfToken.utf8)) else { throw ConsoleRefusal.csrf }
                    }
                    if route.stepUp, session.authTime.timeIntervalSinceNow < -Double(stepUpWindow.components.seconds) {
                        if http.method == .get { return Layout.redirect("/step-up?next=" + Self.percentEncoded(http.path)) }
                        // A form's POST answered by a redirect that ends at the identity provider breaks
                        // `form-action 'self'` (Chromium applies it to the whole redirect chain): answer a
                        // page that moves on to the step-up by a GET instead.
                        let back = route.page == .createDeletion ? "/deletions/new" : http.path
                        return Layout.moveOn(to: "/step-up?next=" + Self.percentEncoded(back), session: session)
                    }
                }
                return try page(request)
            } catch let refusal as ConsoleRefusal {
                let current = try? Self.cookie(http).flatMap { try sessions.session(secret: $0) }
                var response = Layout.refusal(refusal.status, refusal.title, refusal.message, session: current ?? nil)
                response.headers.set("X-Console-Refusal", refusal.code)
                return response
            }
        }
    }

    /// `scheme://host[:port]` of a URL, as a browser writes it in `Origin`.
    static func origin(of url: String) -> String? {
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
            let host = components.host?.lowercased()
        else { return nil }
        let defaultPort = scheme == "https" ? 443 : 80
        return scheme + "://" + host + (components.port.map { $0 == defaultPort ? "" : ":\($0)" } ?? "")
    }

    /// The session cookie's value, if the request carries one.
    static func cookie(_ request: HTTPRequest) -> String? { cookie(cookieName, request) }

    /// The value of the cookie `name`, if the request carries one.
    static func cookie(_ name: String, _ request: HTTPRequest) -> String? {
        for header in request.headers.values("Cookie") {
            for pair in header.split(separator: ";") {
                let parts = pair.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
                if parts.count == 2, parts[0] == name, !parts[1].isEmpty { return parts[1] }
            }
        }
        return nil
    }

    /// `Set-Cookie` for a session: host-only, HTTPS-only, out of script's reach, never sent
    /// on a request another site starts.
    static func setCookie(_ session: ConsoleSession) -> String {
        "\(cookieName)=\(session.secret); Path=/; Secure; HttpOnly; SameSite=Strict"
    }

    static let clearCookie = "\(cookieName)=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0"

    /// An `application/x-www-form-urlencoded` body; a repeated field is refused.
    static func form(_ request: HTTPRequest) throws -> [String: String] {
        guard request.body.count <= maximumFormBytes else { throw ConsoleRefusal.invalid("The form is too large.") }
        guard request.body.isEmpty || request.mediaType == "application/x-www-form-urlencoded" else {
            throw ConsoleRefusal.invalid("Send the form as a browser does (application/x-www-form-urlencoded).")
        }
        var fields: [String: String] = [:]
        for pair in request.body.split(separator: UInt8(ascii: "&")) {
            let parts = pair.split(separator: UInt8(ascii: "="), maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ bytes: ArraySlice<UInt8>) -> String? {
                String(decoding: bytes.map { $0 == UInt8(ascii: "+") ? UInt8(ascii: " ") : $0 }, as: UTF8.self)
                    .removingPercentEncoding
            }
            guard let name = decode(parts[0]), let value = decode(parts.count > 1 ? parts[1] : []), fields[name] == nil
            else { throw ConsoleRefusal.invalid("The form could not be read.") }
            guard !hasControlCharacters(name), !hasControlCharacters(value) else { throw refusedControl }
            fields[name] = value
        }
        return fields
    }

    /// A NUL cannot be stored (PostgreSQL text refuses it, so it would surface as a 500 after
    /// part of the work was done) and no console field needs another control character than
    /// a tab or a line break.
    static func hasControlCharacters(_ text: String) -> Bool {
        text.unicodeScalars.contains { ($0.value < 0x20 && !"\t\n\r".unicodeScalars.contains($0)) || $0.value == 0x7F }
    }

    static let refusedControl = ConsoleRefusal.invalid("The form holds a control character; type the text again.")

    static func percentEncoded(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~/"))) ?? ""
    }
}
