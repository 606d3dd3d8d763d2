import BrokerCore
import BrokerCrypto
import Foundation
import HTTPServer

/// How an authorization response reaches the relying party (OAuth 2.0 Multiple Response Type
/// Encoding Practices §2.1, OAuth 2.0 Form Post Response Mode §2): in the redirect's query, or
/// as an auto-submitting HTML form POSTed to the redirect URI.
enum ResponseMode: String, Sendable, Equatable {
    case query
    case formPost = "form_post"
}

/// An authorization response (success or error) for one redirect URI: its parameters, the
/// RP's `state` and our `iss` (RFC 9207), delivered in the requested mode.
struct AuthorizationResponse: Sendable, Equatable {
    var redirectURI: String
    var parameters: [Field]
    var mode: ResponseMode

    struct Field: Sendable, Equatable {
        var name: String
        var value: String
    }

    init(redirectURI: String, _ parameters: [(String, String)], state: String?, issuer: String, mode: ResponseMode) {
        self.redirectURI = redirectURI
        self.parameters = (parameters + (state.map { [("state", $0)] } ?? []) + [("iss", issuer)]).map(Field.init)
        self.mode = mode
    }

    /// The query-mode redirect target.
    var location: String {
        redirectURI + (redirectURI.contains("?") ? "&" : "?")
            + WebSignInService.query(parameters.map { ($0.name, $0.value) })
    }

    /// The form-post page: the fields as hidden inputs, submitted by a script the
    /// Content-Security-Policy admits by its hash (no other script runs), a button for
    /// browsers without script; forms may go only to the redirect URI's origin, and only
    /// pages of that origin may frame it (a relying party renewing silently in an iframe).
    var page: (headers: [String: String], html: String) {
        let inputs = parameters.map {
            "<input type=\"hidden\" name=\"\(HTMLPage.escape($0.name))\" value=\"\(HTMLPage.escape($0.value))\">"
        }.joined()
        let html = """
            <!DOCTYPE html>
            <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
            <title>Signing in</title></head>
            <body><form method="post" action="\(HTMLPage.escape(redirectURI))">\(inputs)<noscript><p>Your browser does not \
            run scripts: press Continue to go back to the application.</p><button type="submit">Continue</button></noscript>\
            </form><script>\(Self.script)</script></body></html>
            """
        let origin = Self.origin(of: redirectURI) ?? "'none'"
        return (
            [
                "Content-Security-Policy":
                    "default-src 'none'; script-src '\(Self.scriptHash)'; form-action \(origin); frame-ancestors \(origin); base-uri 'none'",
                "Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
            ], html
        )
    }

    /// The one script: submit the form.
    static let script = "document.forms[0].submit()"
    /// CSP Level 3 hash source of `script`.
    static let scriptHash = "sha256-" + Data(SHA256.hash(script)).base64EncodedString()

    /// The redirect URI's origin as a CSP source (`https://rp.example.com:8443`, or the scheme
    /// `com.example.app:` of a private-use redirect); nil when it cannot be one safely.
    static func origin(of uri: String) -> String? {
        let source: Substring
        if let range = uri.range(of: "://") {
            let rest = uri[range.upperBound...]
            source = uri[..<(rest.firstIndex { "/?#".contains($0) } ?? uri.endIndex)]
        } else if let colon = uri.firstIndex(of: ":") {
            source = uri[...colon]
        } else {
            return nil
        }
        // A source expression is a single token: nothing that ends it or starts another directive.
        guard !source.isEmpty, !source.contains(where: { " ;,'\"\t\r\n".contains($0) || !$0.isASCII }) else { return nil }
        return String(source)
    }
}
