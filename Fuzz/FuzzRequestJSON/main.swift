import BrokerCore
import FuzzDriver
import HTTPServer
import StrictJSON

// libFuzzer target: the request bodies of the HTTP API, read the way the routes read them
// (strict JSON object, then the login, deletion and webhook-subscription decoders and
// their bounds), and the lazy JSONObjectView checked against the strict parser. A thrown
// Problem is the expected answer to bad input; a crash or a disagreement is a bug.

private let headers = HTTPHeaders([("Content-Type", "application/json")])

runFuzzer { input in
    // The lazy view that reads identity-token claims must refuse exactly what the strict
    // parser refuses, and read the same values.
    let bytes = Array(input)
    let strict = try? JSONValue.parseObject(bytes)
    let view = try? JSONValue.parseObjectView(bytes)
    precondition((strict == nil) == (view == nil), "parseObjectView and parseObject disagree")
    if let strict, let view {
        precondition(view.dictionary == strict, "parseObjectView reads other values")
        // The byte-comparing string check must agree with comparing built Strings.
        let strings = Array(strict.values.compactMap(\.stringValue).prefix(3)) + ["https://appleid.apple.com", "K"]
        for name in strict.keys {
            precondition(view[name] == strict[name], "the view finds another member than the dictionary")
            for expected in strings {
                precondition(
                    view.isString(name, equalTo: expected) == (strict[name]?.stringValue == expected),
                    "isString disagrees with String ==")
            }
        }
    }

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
