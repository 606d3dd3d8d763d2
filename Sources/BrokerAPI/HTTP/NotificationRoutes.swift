import AppleID
import BrokerCore
import HTTPServer
import StrictJSON

/// `POST /v1/apple/notifications` (or `BROKER_NOTIFICATIONS_PATH`): Apple's webhook.
/// Read whatever its `Content-Type` (Apple's has varied); answered 200 with the outcome once
/// it is durable, so Apple stops retrying; a JWS that does not verify is 401.
enum NotificationRoutes {
    static func register(on router: inout Router, path: String, receiver: NotificationReceiver, perAddress: RateLimiter) {
        router.post(path) { request in
            try perAddress.check(address: request.remoteAddress)
            let body: JSONObjectReader
            do {
                body = try request.jsonObject(anyContentType: true)
            } catch let problem as Problem {
                receiver.rejected(code: problem.code, logger: request.logger)
                throw problem
            }
            do {
                let outcome = try receiver.receive(body, logger: request.logger)
                return .json(.object(["status": .string(outcome.rawValue)]))
            } catch let rejection as TokenRejection {
                // Every failure to verify Apple's JWS is an authentication failure here, a
                // malformed one included.
                var problem = ProblemCatalog.problem(rejection)
                problem.status = 401
                throw problem
            }
        }
    }
}
