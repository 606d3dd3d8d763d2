import HTTPServer
import StrictJSON

// The provider's refusals as HTTP answers: the services throw typed errors, the HTTP layer
// alone turns them into responses (RFC 6749 §5.2's JSON, never cached).

extension OAuthError {
    /// The JSON answer, never cached (RFC 6749 §5.1).
    var response: HTTPResponse {
        var response = HTTPResponse.json(
            .object(["error": .string(code), "error_description": .string(description)]), status: status)
        response.headers.set("Cache-Control", "no-store")
        return response
    }
}

extension ClientAuthenticationFailure {
    /// 401 `invalid_client`, with `WWW-Authenticate: Basic` when the client tried Basic.
    var response: HTTPResponse {
        var response = OAuthError.invalidClient("client authentication failed").response
        if basic { response.headers.set("WWW-Authenticate", "Basic realm=\"token\"") }
        return response
    }
}
