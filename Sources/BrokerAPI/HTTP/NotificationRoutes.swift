import AppleID
import BrokerCore
import HTTPServer
import StrictJSON

/// `POST /v1/apple/notifications` (or `BROKER_NOTIFICATIONS_PATH`): Apple's webhook.
/// Read whatever its `Content-Type` (Apple's has varied); answered 200 with the outcome once
/// it is durable, so Apple stops retrying; a JWS that does not verify is 401, and 429 once
/// the address's budget for refusals (`BROKER_RATE_LIMIT_NOTIFICATIONS_PER_IP`) is spent.
enum NotificationRoutes {
    static func register(on router: inout Router, path: String, receiver: NotificationReceiver, perAddress: RateLimiter) {
        // Only refusals are charged: a flood of junk from an address (a proxy's, or one Apple
        // shares with others) never makes Apple's own signed notifications answer 429.
        router.group(AddressBudget(perAddress, charge: .failures)) { router in route(on: &router, path: path, receiver: receiver)
        }
    }

    private static func route(on router: inout Router, path: String, receiver: NotificationReceiver) {
        router.post(path) { request in
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
