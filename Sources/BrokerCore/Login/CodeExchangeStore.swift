import BrokerCrypto
import Foundation
import PostgresClient

/// Remembers which authorization codes have been (or are being) exchanged, by SHA-256, so
/// a code is exchanged at most once even when a client retries a login concurrently: the
/// second request waits for the first and reuses its outcome.
struct CodeExchangeStore: Sendable {
    let pool: PostgresPool
    /// Names a code's user by a keyed hash of team and sub (never the sub, nor a plain hash a
    /// lookup away): the ledger row outlives a purge by up to an hour.
    let hasher: SubjectHasher
    let teamID: String
    /// How long a second request waits for the first to finish.
    var waitLimit: Duration = .seconds(15)
    /// Codes of one user (client id and sub) sent to Apple per hour, the ledger's lifetime: a
    /// login key plus one valid identity token buys at most this many calls to Apple's token
    /// endpoint (and ledger rows) an hour; the stored refresh token is one row per identity and
    /// client id whatever the count. A person signs in a few times an hour at most.
    static let exchangesPerUserPerHour = 10

    /// `authorization_codes.state`.
    enum State: String {
        case exchanging, exchanged, failed
    }

    enum Claim {
        /// This request exchanges the code.
        case claimed
        /// Another request exchanged it and stored the refresh token.
        case alreadyExchanged
        /// An earlier exchange sent the code and got no usable answer: Apple may have consumed
        /// it, so it is never sent again (protocol reference §11.4); the login goes on without
        /// a token.
        case spent
        /// The user's hourly budget of exchanges is spent: the code is not sent (the ledger row
        /// is taken back) and the sign-in goes on without it, as for a spent code. Apple bounds
        /// nothing per user (protocol reference §12.5): a verified sign-in is never refused.
        case overBudget
    }

    /// Claims `code` for this request. `sub` is the identity token's: over the user's hourly
    /// budget (per client id) the claim is taken back and answered `.overBudget`, before Apple.
    func claim(_ code: String, clientID: String, sub: String) throws -> Claim {
        let hash = SHA256.hexHash(code)
        let subject = hasher.hash(teamID: teamID, sub: sub)
        let inserted = try pool.query(
            """
            INSERT INTO authorization_codes (code_hash, client_id, state, subject_hash)
            VALUES (\(hash), \(clientID), \(State.exchanging.rawValue), \(subject))
            ON CONFLICT (code_hash) DO NOTHING RETURNING 1
            """)
        if !inserted.isEmpty {
            return try withinBudget(hash, clientID: clientID, subject: subject) ? .claimed : .overBudget
        }
        let deadline = ContinuousClock.now + waitLimit
        while ContinuousClock.now < deadline {
            guard
                let row = try pool.query(
                    """
                    SELECT state, error_code, now() - updated_at > interval '60 seconds' AS abandoned
                    FROM authorization_codes WHERE code_hash = \(hash)
                    """
                ).first
            else {
                // The other attempt failed transiently and let go: try to take it.
                return try claim(code, clientID: clientID, sub: sub)
            }
            switch State(rawValue: try row.decode(String.self, "state")) {
            case .exchanged:
                return .alreadyExchanged
            case .failed:
                let code = try row.decode(String?.self, "error_code").flatMap(BrokerError.Code.init(rawValue:))
                if code == .appleUnavailable { return .spent }
                throw BrokerError(code ?? .authorizationCodeInvalid, "the code was refused")
            case .exchanging, nil:
                if try row.decode(Bool.self, "abandoned") {
                    // Its exchanger died mid-way; Apple has likely consumed the code: not our
                    // code's fault, so no authorization_code_invalid, and not sent again.
                    return .spent
                }
                Thread.sleep(forTimeInterval: 0.05)
            }
        }
        throw BrokerError.appleUnavailable("the code is still being exchanged by another request")
    }

    /// Counted after the insert (each insert commits before its count), so concurrent claims
    /// cannot all pass: at most `exchangesPerUserPerHour` rows of the last hour stay claimed.
    /// False (and the row taken back) past the budget.
    private func withinBudget(_ hash: String, clientID: String, subject: String) throws -> Bool {
        let codes = try pool.query(
            """
            SELECT count(*) AS codes FROM authorization_codes
            WHERE subject_hash = \(subject) AND client_id = \(clientID) AND created_at > now() - interval '1 hour'
            """
        ).single().decode(Int.self, "codes")
        guard codes > Self.exchangesPerUserPerHour else { return true }
        try pool.query("DELETE FROM authorization_codes WHERE code_hash = \(hash)")
        return false
    }

    /// Records that the code went to Apple and no usable answer came back (a timeout, 5xx,
    /// or a failure after the exchange): a retry gets `.spent`, never a second call.
    func finishSpent(_ code: String) {
        finish(code, succeeded: false, errorCode: .appleUnavailable)
    }

    func finish(_ code: String, succeeded: Bool, errorCode: BrokerError.Code? = nil) {
        let hash = SHA256.hexHash(code)
        if succeeded {
            _ = try? pool.query(
                "UPDATE authorization_codes SET state = \(State.exchanged.rawValue), updated_at = now() WHERE code_hash = \(hash)"
            )
        } else if let errorCode {
            _ = try? pool.query(
                """
                UPDATE authorization_codes SET state = \(State.failed.rawValue), error_code = \(errorCode.rawValue), updated_at = now()
                WHERE code_hash = \(hash)
                """)
        } else {
            // A transient failure (Apple or the database down): let a retry try again.
            _ = try? pool.query("DELETE FROM authorization_codes WHERE code_hash = \(hash)")
        }
    }

    /// Authorization codes live five minutes; their ledger entries one hour.
    static func prune(_ pool: PostgresPool) throws {
        try pool.query("DELETE FROM authorization_codes WHERE created_at < now() - interval '1 hour'")
    }
}
