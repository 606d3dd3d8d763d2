import BrokerCrypto
import Foundation
import Observability
import PostgresClient
import Synchronization

/// Re-validates stored refresh tokens with Apple's refresh grant, each at most once per
/// `validationIntervalSeconds` (daily by default, with jitter), so a revocation is caught
/// even when Apple's `consent-revoked` notification never arrives: `invalid_grant` marks
/// the identity's consent revoked and writes the same `consent.revoked` event.
///
/// Due tokens are claimed with `FOR UPDATE SKIP LOCKED` and leased for ten minutes, so
/// replicas and lanes share the work and a crashed worker's tokens come back on their own.
/// It runs as a `WorkerGroup` of `BROKER_SWEEP_CONCURRENCY` lanes.
final class RefreshTokenSweep: Sendable {
    private let pool: PostgresPool
    private let apple: AppleClient
    private let tokenKeys: TokenKeyRing
    private let settings: BrokerConfiguration.SweepSettings
    private let logger: Logger
    private let outcomes: CounterFamily
    private let batchSize = 10

    init(
        pool: PostgresPool, apple: AppleClient, tokenKeys: TokenKeyRing, settings: BrokerConfiguration.SweepSettings,
        metrics: MetricsRegistry, logger: Logger
    ) {
        self.pool = pool
        self.apple = apple
        self.tokenKeys = tokenKeys
        self.settings = settings
        self.logger = logger
        outcomes = metrics.counter(
            "refresh_token_validations_total", help: "Refresh-token re-validations by outcome.", labels: ["outcome"])
    }

    struct DueToken: Sendable {
        var id: UUID
        var identityID: UUID
        var clientID: String
        var sealed: [UInt8]
        var keyID: String
        var teamID: String
        var sub: String
    }

    /// One batch: claims due tokens and validates them; true when the batch was full.
    func step() throws -> Bool {
        let due = try pool.query(
            """
            WITH due AS (
                SELECT t.id FROM apple_tokens t JOIN users u ON u.id = t.user_id
                WHERE t.next_validation_at <= now() AND t.revoked_at IS NULL AND u.status = 'active'
                ORDER BY t.next_validation_at LIMIT \(batchSize)
                FOR UPDATE OF t SKIP LOCKED)
            UPDATE apple_tokens t SET next_validation_at = now() + interval '10 minutes'
            FROM due, apple_identities i
            WHERE t.id = due.id AND i.id = t.identity_id
            RETURNING t.id, t.identity_id, t.client_id, t.refresh_token, t.key_id, i.team_id, i.sub
            """
        ).map { row in
            DueToken(
                id: try row.decode(UUID.self, 0), identityID: try row.decode(UUID.self, 1), clientID: try row.decode(String.self, 2),
                sealed: try row.decode([UInt8].self, 3), keyID: try row.decode(String.self, 4),
                teamID: try row.decode(String.self, 5), sub: try row.decode(String.self, 6))
        }
        guard !due.isEmpty else { return false }
        due.forEach(validate)
        return due.count == batchSize
    }

    private func validate(_ token: DueToken) {
        let refreshToken: String
        do {
            refreshToken = String(
                decoding: try tokenKeys.open(
                    token.sealed, keyID: token.keyID,
                    associatedData: RefreshTokenSealing.associatedData(teamID: token.teamID, sub: token.sub, clientID: token.clientID)),
                as: UTF8.self)
        } catch {
            outcomes.increment("undecryptable")
            logger.error("a stored refresh token cannot be decrypted", [("token_id", token.id.lowercasedString)])
            return
        }
        do {
            _ = try apple.refresh(refreshToken, clientID: token.clientID, retry: RetryPolicy(maximumAttempts: 2))
            let next = settings.validationIntervalSeconds + Int.random(in: 0...max(1, settings.validationIntervalSeconds / 10))
            try pool.query(
                """
                UPDATE apple_tokens SET last_validated_at = now(),
                    next_validation_at = now() + \(String(next) + " seconds")::interval
                WHERE id = \(token.id)
                """)
            outcomes.increment("valid")
        } catch AppleAPIError.invalidGrant {
            do {
                try pool.query("SELECT broker_revoke_consent(\(token.identityID), now(), 'refresh_sweep')")
                outcomes.increment("revoked")
                logger.info("refresh token no longer valid: consent revoked", [("identity_id", token.identityID.lowercasedString)])
            } catch {
                outcomes.increment("error")
            }
        } catch {
            // Apple unavailable or refusing our client: the lease expires and it is retried.
            outcomes.increment("error")
            logger.warning("refresh-token validation failed", [("error", "\(error)")])
        }
    }
}
