import AppleID
import BrokerAPI
import BrokerCore
import Foundation
import FuzzDriver
import StrictJSON

// libFuzzer target: decoding an Apple server-to-server notification from its claims (the
// JSON object inside the signed payload, `events` as a string or an object), exactly as the
// receiver does after the signature verified, and the claims reader held to the dictionary
// parser. Anything but an AppleNotification or a thrown problem is a bug.

private let clientIDs: Set<String> = ["com.example.app", "com.example.web"]
private let now = Date(timeIntervalSince1970: 1_750_000_000)

runFuzzer { input in
    let bytes = Array(input)
    // The claims reader accepts exactly what the dictionary parser accepts, with the same values.
    let strict = try? JSONValue.parseObject(bytes)
    let read = try? AppleClaims(payload: bytes, leeway: 60, now: now.timeIntervalSince1970)
    precondition((strict == nil) == (read == nil), "AppleClaims and parseObject disagree on accepting the text")
    guard let strict, let claims = read else { return }
    for name in AppleClaims.Name.allCases { precondition(claims[name] == strict[name.text.description]) }
    if let notification = try? NotificationReceiver.decode(claims: claims, clientIDs: clientIDs) {
        precondition(!notification.jti.isEmpty && !notification.type.isEmpty && !notification.sub.isEmpty)
    }
}
