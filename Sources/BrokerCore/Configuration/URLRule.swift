/// The absolute URLs the broker sends requests or browsers to (webhook receivers, web
/// sign-in return URLs and its own public URL): https anywhere, plain http only to this
/// machine (local development and tests); no user info, no fragment. The same pattern is
/// in docs/openapi.json (`SubscriptionRequest.url`), so the description and the server agree.
package enum URLRule {
    package static let pattern =
        #"^(https://[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|http://(127\.0\.0\.1|localhost|\[::1\]))(:[0-9]{1,5})?(/([A-Za-z0-9._~!$&'()*+,;=:@/-]|%[0-9A-Fa-f]{2})*)?(\?([A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?$"#

    package static let maximumBytes = 2048

    /// Whether `text` is such a URL.
    package static func accepts(_ text: String) -> Bool {
        // Built per call: these URLs are checked rarely, and Regex is not Sendable.
        guard text.utf8.count <= maximumBytes, let regex = try? Regex(pattern) else { return false }
        return (try? regex.wholeMatch(in: text)) != nil
    }
}
