import BrokerCore
import HTTPClient
import HTTPServer
import StrictJSON

/// The provider's endpoints, under the issuer's path (the admin API is AdminRoutes). OAuth
/// endpoints answer OAuth errors as JSON (RFC 6749 §5.2), not problem documents: that is what
/// relying parties parse.
enum OpenIDRoutes {
    static func register(on router: inout Router, provider: OpenIDProvider, admin: AdminAccess, perAddress: RateLimiter) {
        let endpoints = provider.endpoints
        let discovery = provider.discoveryDocument
        let metadata: HTTPHandler = { _ in
            var response = HTTPResponse.json(discovery)
            response.headers.set("Cache-Control", "public, max-age=3600")
            response.headers.set("Access-Control-Allow-Origin", "*")
            return response
        }
        router.get(endpoints.path(Endpoints.discovery), metadata)
        router.get(endpoints.path(Endpoints.authorizationServer), metadata)
        // RFC 8414 §3.1: for an issuer with a path, the metadata also sits at the well-known path's end.
        if !endpoints.pathPrefix.isEmpty { router.get(Endpoints.authorizationServer + endpoints.pathPrefix, metadata) }
        router.get(endpoints.path(Endpoints.jwks)) { _ in
            var response = HTTPResponse(
                status: 200, headers: ["Content-Type": "application/jwk-set+json"], body: try provider.keys.jwks())
            // Short enough that a rotated-in key is seen long before it signs (OIDC_KEY_PREPUBLISH_SECONDS).
            response.headers.set("Cache-Control", "public, max-age=300")
            response.headers.set("Access-Control-Allow-Origin", "*")
            return response
        }
        // OpenID Connect Core §3.1.2.1: GET and POST (form) alike.
        let authorize: HTTPHandler = { request in
            let (parameters, repeated) = requestParameters(request)
            switch try provider.authorization.authorize(
                parameters, repeated: repeated, sessionSecret: request.cookies[SessionCookie.name],
                bindingSecret: request.cookies[BrowserBinding.name])
            {
            case .redirect(let location): return redirect(location)
            case .apple(let location, let bindingCookie):
                var response = redirect(location)
                response.headers.add("Set-Cookie", bindingCookie)
                return response
            case .formPost(let headers, let html): return page(html, headers: headers)
            case .page(let status, let title, let message):
                return HTMLPage.response(status: status, title: title, message: message, link: nil)
            }
        }
        // RP-Initiated Logout 1.0 §2: GET and POST (form) alike.
        let endSession: HTTPHandler = { request in
            let (parameters, repeated) = requestParameters(request)
            let (outcome, ended) = try provider.endSession.endSession(
                parameters, repeated: repeated, sessionSecret: request.cookies[SessionCookie.name])
            return LogoutPages.response(
                outcome, clearCookie: ended, confirmAction: endpoints.path(Endpoints.endSessionConfirmation))
        }
        router.group(AddressBudget(perAddress)) { router in
            router.get(endpoints.path(Endpoints.authorize), authorize)
            router.post(endpoints.path(Endpoints.authorize), authorize)
            router.get(endpoints.path(Endpoints.endSession), endSession)
            router.post(endpoints.path(Endpoints.endSession), endSession)
            router.post(endpoints.path(Endpoints.endSessionConfirmation)) { request in
                let form = FormEncoding.fields(String(decoding: request.body, as: UTF8.self))
                let (outcome, ended) = try provider.endSession.confirm(
                    token: form["token"], sessionSecret: request.cookies[SessionCookie.name])
                return LogoutPages.response(
                    outcome, clearCookie: ended, confirmAction: endpoints.path(Endpoints.endSessionConfirmation))
            }
        }
        // Outsiders' refusals (bad client credentials, unknown tokens) are budgeted per address:
        // each one costs a database lookup. Successes are never charged. Browser apps reach
        // /token, /revoke and /userinfo across origins (CORS).
        router.group(AddressBudget(perAddress, charge: .failures)) { router in
            router.group(CORSMiddleware(origins: provider.cors, methods: "POST")) { router in
                router.post(endpoints.path(Endpoints.token)) { request in
                    var response = try oauth {
                        HTTPResponse.json(try provider.tokens.token(try credentials(request, reading: Parameters.token)))
                    }
                    // RFC 6749 §5.1 and §5.2 (its example): tokens and refusals alike are never cached.
                    response.headers.set("Cache-Control", "no-store")
                    response.headers.set("Pragma", "no-cache")
                    return response
                }
                router.on(.options, endpoints.path(Endpoints.token)) { _ in HTTPResponse(status: 204) }
                router.post(endpoints.path(Endpoints.revocation)) { request in
                    try oauth {
                        try provider.tokens.revoke(try credentials(request, reading: Parameters.revocation))
                        return HTTPResponse(status: 200, headers: ["Cache-Control": "no-store"])
                    }
                }
                router.on(.options, endpoints.path(Endpoints.revocation)) { _ in HTTPResponse(status: 204) }
            }
            // RFC 7662: resource servers, server to server (no CORS).
            router.post(endpoints.path(Endpoints.introspection)) { request in
                try oauth {
                    var response = HTTPResponse.json(
                        try provider.tokens.introspect(try credentials(request, reading: Parameters.introspection)))
                    response.headers.set("Cache-Control", "no-store")
                    return response
                }
            }
            let userinfo: HTTPHandler = { request in
                // RFC 6750 §2.1 (header) or §2.2 (a POST's form body); §3.1: no token, no
                // error code; a bad one, invalid_token.
                let formToken =
                    request.method == .post && request.mediaType == "application/x-www-form-urlencoded"
                    ? FormEncoding.fields(String(decoding: request.body, as: UTF8.self))["access_token"] : nil
                // §2: a client uses one method; a token in both is invalid_request (§3.1, 400).
                if request.bearerToken != nil && formToken != nil {
                    return HTTPResponse(
                        status: 400,
                        headers: [
                            "WWW-Authenticate":
                                "Bearer error=\"invalid_request\", error_description=\"send the token in one place\"",
                            "Cache-Control": "no-store",
                        ])
                }
                guard let token = request.bearerToken ?? formToken else {
                    return HTTPResponse(status: 401, headers: ["WWW-Authenticate": "Bearer", "Cache-Control": "no-store"])
                }
                guard let claims = try provider.tokens.userinfo(accessToken: token) else {
                    return HTTPResponse(
                        status: 401,
                        headers: [
                            "WWW-Authenticate":
                                "Bearer error=\"invalid_token\", error_description=\"the access token is not valid\"",
                            "Cache-Control": "no-store",
                        ])
                }
                var response = HTTPResponse.json(claims)
                response.headers.set("Cache-Control", "no-store")
                return response
            }
            router.group(CORSMiddleware(origins: provider.cors, methods: "GET, POST")) { router in
                router.get(endpoints.path(Endpoints.userinfo), userinfo)
                router.post(endpoints.path(Endpoints.userinfo), userinfo)
                router.on(.options, endpoints.path(Endpoints.userinfo)) { _ in HTTPResponse(status: 204) }
            }
        }
        let audit = AdminAuditStore(pool: provider.clients.pool)
        router.post(endpoints.path(Endpoints.registration)) { request in
            try oauth {
                let actor = try admin.registrationActor(request, audit: audit)
                let metadata = try ClientMetadata(json: try request.jsonObject(), outboundURL: provider.checkOutboundURL)
                let (client, secret) = try provider.clients.create(metadata, createdBy: actor)
                provider.cors.changed()
                guard case .object(var members) = client.json else { preconditionFailure("a client is a JSON object") }
                if let secret { members["client_secret"] = .string(secret) }
                var response = HTTPResponse.json(.object(members), status: 201)
                response.headers.set("Cache-Control", "no-store")
                return response
            }
        }
    }

    /// A browser endpoint's parameters: the query, or a POST's form (RFC 6749 §3.1: a parameter
    /// without a value is omitted), with the names sent more than once.
    static func requestParameters(_ request: HTTPRequest) -> ([String: String], Set<String>) {
        guard request.method == .post else { return (request.query, request.repeatedQueryNames) }
        let pairs = FormEncoding.decode(String(decoding: request.body, as: UTF8.self)).filter { !$0.1.isEmpty }
        return (
            Dictionary(pairs, uniquingKeysWith: { first, _ in first }),
            Set(Dictionary(grouping: pairs, by: \.0).filter { $0.value.count > 1 }.keys)
        )
    }

    static func redirect(_ location: String) -> HTTPResponse {
        HTTPResponse(status: 302, headers: ["Location": location, "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"])
    }

    static func page(_ html: String, status: Int = 200, headers: [String: String]) -> HTTPResponse {
        var response = HTTPResponse.text(html, status: status, contentType: "text/html; charset=utf-8")
        for (name, value) in headers { response.headers.set(name, value) }
        return response
    }

    /// Runs an OAuth endpoint: its refusals become OAuth error answers.
    static func oauth(_ body: () throws -> HTTPResponse) rethrows -> HTTPResponse {
        do {
            return try body()
        } catch let error as OAuthError {
            return error.response
        } catch let failure as ClientAuthenticationFailure {
            return failure.response
        } catch let refusal as BearerRefusal {
            return refusal.response
        } catch is JSONFieldError {
            return OAuthError.invalidClientMetadata("the body is not valid client metadata").response
        } catch let problem as Problem where problem.status == 400 || problem.status == 415 {
            return OAuthError.invalidRequest(problem.detail ?? problem.title).response
        }
    }

    /// Who a token, revocation or introspection request says it is: its Authorization header and
    /// the form parameters the endpoint reads (`reading`).
    static func credentials(_ request: HTTPRequest, reading: Set<String>) throws -> ClientCredentials {
        ClientCredentials(authorization: request.headers["Authorization"], form: try form(request, reading: reading))
    }

    /// The parameters each form endpoint reads; RFC 6749 §3.1: any other is ignored.
    enum Parameters {
        static let clientAuthentication: Set<String> = [
            "client_id", "client_secret", "client_assertion_type", "client_assertion",
        ]
        static let token = clientAuthentication.union([
            "grant_type", "code", "redirect_uri", "code_verifier", "refresh_token", "scope",
        ])
        static let revocation = clientAuthentication.union(["token", "token_type_hint"])
        /// Resource servers authenticate with their id and secret only.
        static let introspection: Set<String> = ["client_id", "client_secret", "token", "token_type_hint"]
    }

    /// The form body of a token, revocation or introspection request: the parameters in `reading`.
    static func form(_ request: HTTPRequest, reading: Set<String>) throws -> [String: String] {
        guard request.mediaType == "application/x-www-form-urlencoded" else {
            throw OAuthError.invalidRequest("the body must be application/x-www-form-urlencoded")
        }
        return try fields(request.body, reading: reading)
    }

    /// Form fields as RFC 6749 reads them (§3.1): a parameter without a value is omitted, one the
    /// endpoint does not read is ignored (repeated or not), and one it reads sent twice is refused
    /// rather than guessed at (§3.1, §3.2), as is a NUL byte in one (no database text holds one:
    /// it would end as a 500 further in).
    static func fields(_ body: [UInt8], reading: Set<String>) throws -> [String: String] {
        var fields: [String: String] = [:]
        for (name, value) in FormEncoding.decode(String(decoding: body, as: UTF8.self))
        where !value.isEmpty && reading.contains(name) {
            guard fields.updateValue(value, forKey: name) == nil else {
                throw OAuthError.invalidRequest("\(name) is sent more than once")
            }
            guard !value.utf8.contains(0) else { throw OAuthError.invalidRequest("\(name) holds a NUL byte") }
        }
        return fields
    }

    /// The HTTP server's own refusal of a request to one of these endpoints, made before any
    /// route runs: a body over `BROKER_MAX_BODY_BYTES` (413 `payload_too_large`). Relying
    /// parties parse their RFCs' errors, not problem documents, so it is `invalid_request` 400
    /// (RFC 6749 §5.2, RFC 7009 §2.2.1, RFC 7662 §2.3, RFC 7591 §3.2.2), RFC 6750 §3.1's
    /// challenge at userinfo, an error page at authorize and logout (browsers). nil: not the provider's to answer.
    static func refusal(_ problem: Problem, _ request: HTTPRequest, endpoints: Endpoints) -> HTTPResponse? {
        guard problem.code == "payload_too_large", request.method == .post else { return nil }
        let description = OAuthError.invalidRequest(problem.detail ?? problem.title).description
        switch request.path {
        case endpoints.path(Endpoints.token), endpoints.path(Endpoints.revocation),
            endpoints.path(Endpoints.introspection), endpoints.path(Endpoints.registration):
            var response = OAuthError.invalidRequest(description).response
            response.headers.set("Pragma", "no-cache")
            return response
        case endpoints.path(Endpoints.userinfo):
            return HTTPResponse(
                status: 400,
                headers: [
                    "WWW-Authenticate": "Bearer error=\"invalid_request\", error_description=\"\(description)\"",
                    "Cache-Control": "no-store",
                ])
        case endpoints.path(Endpoints.authorize), endpoints.path(Endpoints.endSession),
            endpoints.path(Endpoints.endSessionConfirmation):
            return HTMLPage.response(status: 400, title: "Request too large", message: description, link: nil)
        default:
            return nil
        }
    }
}
