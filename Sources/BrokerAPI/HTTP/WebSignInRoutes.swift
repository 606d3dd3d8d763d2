import BrokerCore
import Foundation
import HTTPClient
import HTTPServer
import StrictJSON

/// Web sign-in: `GET /v1/apple/web/authorize` and `POST /v1/apple/web/callback` (browsers;
/// no API key, limited per address) and `POST /v1/apple/web/redeem` (scope `login`).
///
/// A browser (its `Accept` names `text/html`) that meets an error on the first two gets a
/// short page saying what happened, with a link back to the app when a registered
/// `return_to` is known; anything else gets the problem as JSON.
enum WebSignInRoutes {
    static func register(on router: inout Router, service: WebSignInService, keys: APIKeyAuthenticator, perAddress: RateLimiter) {
        // The page outside the budget, so a browser over it gets a page too.
        router.group(BrowserPages(service: service), AddressBudget(perAddress)) { router in
            router.get("/v1/apple/web/authorize") { request in
                let started = try service.authorize(
                    clientID: request.query["client_id"], returnTo: request.query["return_to"],
                    appState: request.query["app_state"])
                var response = redirect(to: started.location, status: 302)
                // SameSite=None: Apple's callback is a cross-site form post, which Lax would strip.
                response.headers.add(
                    "Set-Cookie",
                    "\(bindingCookie)=\(started.browserBinding); Path=/; Max-Age=\(started.lifetime.components.seconds); Secure; HttpOnly; SameSite=None"
                )
                return response
            }
            router.post("/v1/apple/web/callback") { request in
                guard request.mediaType == "application/x-www-form-urlencoded" else {
                    throw Problem(
                        status: 415, code: "unsupported_media_type", title: "Unsupported media type",
                        detail: "Apple posts the callback as application/x-www-form-urlencoded")
                }
                let answer = try service.callback(
                    form: FormEncoding.fields(String(decoding: request.body, as: UTF8.self)), cookies: request.cookies)
                var response: HTTPResponse
                switch answer.next {
                // 303: the browser follows a form POST's redirect with a GET.
                case .redirect(let location): response = redirect(to: location, status: 303)
                case .page(let status, let headers, let html):
                    response = .text(html, status: status, contentType: "text/html; charset=utf-8")
                    for (name, value) in headers { response.headers.set(name, value) }
                }
                response.headers.add("Set-Cookie", "\(bindingCookie)=; Path=/; Max-Age=0; Secure; HttpOnly; SameSite=None")
                for cookie in answer.cookies { response.headers.add("Set-Cookie", cookie) }
                return response
            }
        }
        router.group(keys.requiring(.login)) { router in
            router.post(
                "/v1/apple/web/redeem",
                authenticated { request, key in
                    .json(try service.redeem(try request.jsonObject().requiredString("result_code"), by: key))
                })
        }
    }

    /// Binds a sign-in's state to the browser that started it (WebSignInService names it).
    static let bindingCookie = WebSignInService.bindingCookie

    /// The value of the cookie `name` the request carries, if any.
    static func cookie(_ name: String, in request: HTTPRequest) -> String? {
        for header in request.headers.values("Cookie") {
            for pair in header.split(separator: ";") {
                let parts = pair.split(separator: "=", maxSplits: 1)
                if parts.count == 2, parts[0].trimmingCharacters(in: .whitespaces) == name {
                    return parts[1].trimmingCharacters(in: .whitespaces)
                }
            }
        }
        return nil
    }

    static func redirect(to location: String, status: Int) -> HTTPResponse {
        HTTPResponse(
            status: status, headers: ["Location": location, "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"])
    }

    /// A problem becomes a page when a browser asked (the authorize query's app and
    /// `return_to`, or the callback form's `state`, find the way back to the app).
    struct BrowserPages: HTTPMiddleware {
        let service: WebSignInService

        func handle(_ request: HTTPRequest, next: HTTPHandler) throws -> HTTPResponse {
            do {
                return try next(request)
            } catch  where request.prefersHTML {
                guard let problem = (error as? Problem) ?? ProblemCatalog.problem(for: error) else { throw error }
                let form = request.method == .post ? FormEncoding.fields(String(decoding: request.body, as: UTF8.self)) : [:]
                let cancelled = form["error"] != nil
                let back = service.returnTo(
                    state: form["state"], clientID: request.query["client_id"], returnTo: request.query["return_to"])
                return HTMLPage.response(
                    status: problem.status, title: cancelled ? "Sign-in cancelled" : pageTitle(problem.code),
                    message: cancelled
                        ? "Sign in with Apple was cancelled. Go back to the app to try again." : pageMessage(problem),
                    link: back.map { ($0, "Back to the app") },
                    headers: HTTPHeaders(problem.headers.map { ($0.key, $0.value) }))
            }
        }
    }

    private static func pageTitle(_ code: String) -> String {
        switch code {
        case "invalid_state": "This sign-in has already finished or expired"
        case "rate_limited": "Too many sign-in attempts"
        case "web_signin_not_configured": "Sign-in on the web is not available"
        default: "Sign-in could not start"
        }
    }

    private static func pageMessage(_ problem: Problem) -> String {
        switch problem.code {
        case "invalid_state":
            "The page was probably submitted twice or reopened with the Back button. Go back to the app and sign in again."
        case "rate_limited": "Wait a minute, then try again from the app."
        default:
            (problem.detail ?? problem.title) + ". Go back to the app and try again; if it keeps happening, tell the app's team."
        }
    }
}
