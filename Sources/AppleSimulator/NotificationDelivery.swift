import Foundation
import HTTPClient
import Locking
import Synchronization

/// One attempt to deliver a notification on Apple's own initiative (`AppleSimulator.deliver`).
public struct NotificationDelivery: Sendable, Codable, Equatable {
    public var jti: String
    public var type: String
    public var sub: String
    /// The event's time (milliseconds): the same for every attempt and every duplicate.
    public var eventTimeMilliseconds: Int64
    /// 1 for the first attempt of this `jti`, 2 for its first retry, …
    public var attempt: Int
    /// 0 for the notification, 1… for its duplicates (each with a `jti` of its own).
    public var copy: Int
    /// The endpoint's status; 0 when it did not answer within `notification_timeout_ms`.
    public var status: Int

    enum CodingKeys: String, CodingKey {
        case jti, type, sub
        case eventTimeMilliseconds = "event_time_ms"
        case attempt, copy, status
    }
}

/// What the simulator keeps for Apple's clock (issue 35): the seeded draws of
/// `FaultSettings.requestErrorRate`, and the notifications it delivers on its own.
struct AppleClockState: Sendable {
    /// SplitMix64 (Steele, Lea, Flood 2014): small, seedable, good enough for a fault share.
    struct Draws: Sendable {
        var state: UInt64

        init(seed: Int) { state = UInt64(bitPattern: Int64(seed)) }

        /// The next draw in [0, 1).
        mutating func next() -> Double {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            z ^= z >> 31
            return Double(z >> 11) / Double(UInt64(1) << 53)
        }
    }

    var draws = Draws(seed: 1)
    /// Every delivery attempt, oldest first (the last `deliveryLimit`).
    var deliveries: [NotificationDelivery] = []
    /// Set by `stop()`: pending deliveries are dropped.
    var stopped = false

    static let deliveryLimit = 10_000
}

extension AppleSimulator {
    /// Whether this call is one of the `requestErrorRate` share (the seeded draws).
    func drawsRequestError(_ faults: FaultSettings) -> Bool {
        faults.requestErrorRate > 0 && appleClock.withLock { $0.draws.next() } < faults.requestErrorRate
    }

    /// Every attempt to deliver a notification on Apple's own initiative so far, oldest first.
    public var notificationDeliveries: [NotificationDelivery] { appleClock.withLock { $0.deliveries } }

    /// Delivers a notification as Apple does, in the background, by the current faults:
    /// `notification_delay_ms` after its event, retried with the same `jti` while the endpoint
    /// does not answer 2xx within `notification_timeout_ms` (up to `notification_retries`
    /// times, `notification_retry_ms` apart), then `notification_duplicates` more times with
    /// a new `jti` each. `event_time` is the event's (now, unless the request names one).
    public func deliver(_ request: NotificationRequest) {
        let faults = self.faults
        var timed = request
        timed.eventTimeMilliseconds = request.eventTimeMilliseconds ?? Int64(Date().timeIntervalSince1970 * 1000)
        let thread = Thread { [self, request = timed] in
            for copy in 0...max(0, faults.notificationDuplicates) {
                guard
                    pause(milliseconds: copy == 0 ? faults.notificationDelayMilliseconds : faults.notificationRetryMilliseconds),
                    let (jti, payload) = try? signNotification(request)
                else { return }
                for attempt in 1...(1 + max(0, faults.notificationRetries)) {
                    if attempt > 1, !pause(milliseconds: faults.notificationRetryMilliseconds) { return }
                    let status = post(payload, to: request.url, timeoutMilliseconds: faults.notificationTimeoutMilliseconds)
                    appleClock.withLock { state in
                        state.deliveries.append(
                            NotificationDelivery(
                                jti: jti, type: request.type, sub: request.sub,
                                eventTimeMilliseconds: request.eventTimeMilliseconds ?? 0, attempt: attempt, copy: copy,
                                status: status))
                        if state.deliveries.count > AppleClockState.deliveryLimit { state.deliveries.removeFirst() }
                    }
                    if (200..<300).contains(status) { break }
                }
            }
        }
        thread.start()
    }

    /// Waits, unless the simulator stops meanwhile; false when it did.
    private func pause(milliseconds: Int) -> Bool {
        let deadline = Date().addingTimeInterval(Double(milliseconds) / 1000)
        while Date() < deadline {
            if appleClock.withLock({ $0.stopped }) { return false }
            Thread.sleep(forTimeInterval: min(0.02, max(0, deadline.timeIntervalSinceNow)))
        }
        return !appleClock.withLock { $0.stopped }
    }

    /// POSTs `{"payload": …}`; the status, or 0 without an answer in time.
    private func post(_ payload: String, to url: String, timeoutMilliseconds: Int) -> Int {
        let body = Array(#"{"payload":""#.utf8) + Array(payload.utf8) + Array(#""}"#.utf8)
        return
            (try? transport.send(
                .init(
                    method: "POST", url: url, headers: [("Content-Type", "application/json")], body: body,
                    timeout: .milliseconds(timeoutMilliseconds))
            ).status) ?? 0
    }
}
