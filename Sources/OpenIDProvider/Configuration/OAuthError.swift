import StrictJSON

/// An OAuth 2.0 error (RFC 6749 §5.2, RFC 7591 §3.2.2, RFC 6750 §3.1): the `error` code is
/// the contract, the description is for people. Never a 500: every refusal is one of these.
package struct OAuthError: Error, Sendable, Equatable {
    package let code: String
    package let description: String
    package let status: Int

    package init(_ code: String, _ description: String, status: Int = 400) {
        self.code = code
        // RFC 6749 §5.2: error_description holds only %x20-21 / %x23-5B / %x5D-7E; what a
        // description quotes (a refused redirect URI) is narrowed to that, the rest becomes '?'.
        self.description = String(
            String.UnicodeScalarView(
                description.unicodeScalars.map { (0x20...0x7E).contains($0.value) && $0 != "\"" && $0 != "\\" ? $0 : "?" }))
        self.status = status
    }

    static func invalidRequest(_ description: String) -> OAuthError { OAuthError("invalid_request", description) }
    static func invalidGrant(_ description: String) -> OAuthError { OAuthError("invalid_grant", description) }
    static func invalidClient(_ description: String) -> OAuthError { OAuthError("invalid_client", description, status: 401) }
    static func invalidClientMetadata(_ description: String) -> OAuthError {
        OAuthError("invalid_client_metadata", description)
    }
    static func invalidRedirectURI(_ description: String) -> OAuthError { OAuthError("invalid_redirect_uri", description) }
}
