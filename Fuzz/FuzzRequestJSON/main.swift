import BrokerAPI
import BrokerCore
import FuzzDriver
import HTTPServer
import StrictJSON

// libFuzzer target: the request bodies of the HTTP API, read the way the routes read them
// (strict JSON object, then the login, deletion and webhook-subscription decoders and
// their bounds). A thrown error is the expected answer to bad input; a crash is a bug.

private let headers = HTTPHeaders([("Content-Type", "application/json")])

runFuzzer { input in
    let request = HTTPRequest(
        method: .post, path: "/fuzz", headers: headers, body: Array(input))
    guard let body = try? request.jsonObject() else { return }
    if let login = try? LoginRequest(body) {
        _ = try? login.validate()
    }
    _ = try? DeletionService.Request(body)
    if let url = try? body.requiredString("url") {
        _ = try? WebhookSubscriptionStore.validate(url: url)
    }
    if let topics = try? body.strings("topics") {
        _ = try? WebhookSubscriptionStore.validate(topics: topics)
    }
}
