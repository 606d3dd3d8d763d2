import BrokerCore
import Foundation
import FuzzDriver
import StrictJSON

// libFuzzer target: decoding an Apple server-to-server notification from its claims (the
// JSON object inside the signed payload, `events` as a string or an object), exactly as the
// receiver does after the signature verified. Anything but an AppleNotification or a
// thrown problem is a bug.

private let clientIDs: Set<String> = ["com.example.app", "com.example.web"]
private let now = Date(timeIntervalSince1970: 1_750_000_000)

runFuzzer { input in
    let bytes = Array(input)
    guard let claims = try? JSONValue.parseObject(bytes) else { return }
    if let notification = try? NotificationReceiver.decode(claims: claims, clientIDs: clientIDs, leeway: 60, now: now) {
        precondition(!notification.jti.isEmpty && !notification.type.isEmpty && !notification.sub.isEmpty)
    }
}
