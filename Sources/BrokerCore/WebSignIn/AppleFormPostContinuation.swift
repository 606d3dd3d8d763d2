/// Another sign-in that sends browsers to Apple with the web sign-in's Return URL (the
/// OpenID Provider does): Apple's form post comes back to `POST /v1/apple/web/callback`,
/// and the state's prefix says whose sign-in it finishes, so one Return URL registered at
/// Apple serves both. BrokerCore knows only this protocol, never who implements it.
package protocol AppleFormPostContinuation: Sendable {
    /// Every state this continuation seals starts with it; the web sign-in's states never do
    /// (they start with a key id and a '.').
    var statePrefix: String { get }
    /// Handles Apple's form post (`cookies`: the browser's, by name); answers the browser's next step.
    func callback(form fields: [String: String], cookies: [String: String]) throws -> CallbackAnswer
}

/// Where a browser goes after Apple's form post, and the cookies it gets on the way.
package struct CallbackAnswer: Sendable, Equatable {
    package enum Next: Sendable, Equatable {
        /// A redirect (303: the browser follows a form POST's redirect with a GET).
        case redirect(String)
        /// A page of the continuation's own (the OpenID Provider's auto-submitting form post
        /// response), with the headers it needs (its Content-Security-Policy).
        case page(status: Int, headers: [String: String], html: String)
    }

    package var next: Next
    /// `Set-Cookie` values.
    package var cookies: [String]

    package init(_ next: Next, cookies: [String] = []) {
        self.next = next
        self.cookies = cookies
    }
}
