import BrokerAPI
import BrokerCore
import CommandArguments
import Foundation
import OpenIDProvider
import Workers

/// `appleid-broker reencrypt [--batch N]`: see `ReEncryption`.
enum ReEncryptCommand {
    static func run(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let batch =
            try arguments.options["batch"].map {
                guard let value = Int($0), (1...10_000).contains(value) else {
                    throw arguments.usageError("--batch must be 1…10000")
                }
                return value
            } ?? 500
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: false)
        guard let keys = configuration.tokenKeys else {
            throw BrokerConfiguration.Invalid(problems: [
                "reencrypt needs TOKEN_ENCRYPTION_KEY (the new key first, the old ones after it)"
            ])
        }
        return try BrokerCommand.withDatabase(environment) { database in
            // The provider's signing keys are its own table, re-sealed by its store.
            let job = ReEncryption(
                pool: database.pool, keys: keys, batchSize: batch,
                others: [SigningKeyStore(pool: database.pool, tokenKeys: keys)])
            let counts = try job.run()
            var left = 0
            for count in counts {
                // stdout: one line per kind, for scripts; nothing secret.
                print("\(count.kind) resealed=\(count.resealed) unreadable=\(count.unreadable) remaining=\(count.remaining)")
                left += count.remaining
            }
            if left == 0 {
                let others = keys.keyIDs.dropFirst().map { "'\($0)'" }.joined(separator: ", ")
                BrokerCommand.printError(
                    "every secret is sealed with key '\(keys.currentKeyID)'"
                        + (others.isEmpty ? "" : "; \(others) can now be removed from TOKEN_ENCRYPTION_KEY"))
                return 0
            }
            BrokerCommand.printError(
                "\(left) secrets are still sealed with other keys (unreadable ones name a key that is missing, or were altered); keep those keys"
            )
            return 1
        }
    }
}
