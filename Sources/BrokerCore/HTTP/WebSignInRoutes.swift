import Foundation
import HTTPClient
import HTTPServer

/// Web sign-in: `GET /v1/apple/web/authorize` and `POST /v1/apple/web/callback` (browsers;
/// no API key, limited per address) and `POST /v1/apple/web/redeem` (scope `login`).
enum WebSignInRoutes {
    static func register(on router: inout Router, service: WebSignInService, keys: APIKeyAuthenticator, perAddress: RateLimiter) {
        router.get("/v1/apple/web/authorize") { request in
            try perAddress.check(address: request.remoteAddress)
            let location = try service.authorize(
                clientID: request.query["client_id"], returnTo: request.query["return_to"], appState: request.query["app_state"])
            return redirect(to: location, status: 302)
        }
        router.post("/v1/apple/web/callback") { request in
            try perAddress.check(address: request.remoteAddress)
            guard request.mediaType == "application/x-www-form-urlencoded" else {
                throw Problem(
                    status: 415, code: "unsupported_media_type", title: "Unsupported media type",
                    detail: "Apple posts the callback as application/x-www-form-urlencoded")
            }
            // 303: the browser follows a form POST's redirect with a GET.
            let fields = FormEncoding.fields(String(decoding: request.body, as: UTF8.self))
            return redirect(to: try service.callback(form: fields), status: 303)
        }
        router.post("/v1/apple/web/redeem", keys.protect(.login) { request, _ in
            .json(try service.redeem(try request.jsonObject().requiredString("result_code")))
        })
    }

    static func redirect(to location: String, status: Int) -> HTTPResponse {
        HTTPResponse(status: status, headers: ["Location": location, "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"])
    }
}
