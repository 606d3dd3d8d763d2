import AppleID
import BrokerAPI
import BrokerCore
import CommandArguments
import Foundation
import HTTPClient
import Observability
import Synchronization
import Workers

/// `appleid-broker transfer export --recipient-team TEAMID --out FILE`,
/// `appleid-broker transfer import --in FILE` and `appleid-broker transfer complete
/// --recipient-team TEAMID` (see `TeamTransfer`).
enum TransferCommands {
    static func run(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let subcommand = arguments.command.words[1]
        if subcommand == "complete" { return try complete(arguments, environment: environment) }
        let transferredAt = try date(arguments, "transferred-at")
        let path = try arguments.required(subcommand == "export" ? "out" : "in")
        let recipient = subcommand == "export" ? try arguments.required("recipient-team") : ""
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: true)
        guard let settings = configuration.apple else { return 2 }
        let clientID = try Self.clientID(arguments, settings)
        guard let rate = Double(arguments.options["rate"] ?? "10"), rate >= 0, rate.isFinite else {
            throw arguments.usageError("--rate must be calls per second (0: no limit)")
        }

        // Ctrl-C or SIGTERM: finish the current user, write down progress, report, exit 130.
        let stop = Flag()
        let watcher = Thread {
            _ = TerminationSignals.wait()
            stop.raise()
        }
        watcher.start()

        return try BrokerCommand.withDatabase(environment) { database in
            let apple = appleClient(settings)
            let transfer = TeamTransfer(
                pool: database.pool, apple: apple, teamID: settings.teamID, clientID: clientID, rate: rate,
                shouldStop: { stop.isRaised })
            if arguments.flags.contains("stage-only") {
                do {
                    print("staged: \(try transfer.stageFile(path, transferredAt: transferredAt))")
                    return 0
                } catch let error as TeamTransfer.TransferError {
                    BrokerCommand.printError("error: \(error)")
                    return 1
                }
            }
            let verb = subcommand == "export" ? "exported" : "migrated"
            var lastPrint = ContinuousClock.now
            let started = ContinuousClock.now
            let progress = { (report: TeamTransfer.Report) in
                guard ContinuousClock.now - lastPrint > .seconds(1) else { return }
                lastPrint = .now
                let perSecond = Double(report.done) / max(0.001, (ContinuousClock.now - started).seconds)
                BrokerCommand.printError(
                    "\(verb) \(report.done + report.skipped) of \(report.total) (failed \(report.failed.count)), "
                        + String(format: "%.0f/s", perSecond))
            }
            let report: TeamTransfer.Report
            do {
                report =
                    subcommand == "export"
                    ? try transfer.export(recipientTeam: recipient, to: path, progress: progress)
                    : try transfer.importFile(path, transferredAt: transferredAt, progress: progress)
            } catch let error as TeamTransfer.TransferError {
                BrokerCommand.printError("error: \(error)")
                return 1
            } catch let error as AppleAPIError {
                BrokerCommand.printError("stopped: \(error); what is done is kept, run the same command again to resume")
                return 1
            }
            print(summary(report, verb: verb, path: path))
            if report.interrupted { return 130 }
            return report.failed.isEmpty ? 0 : 1
        }
    }

    /// `transfer complete`: the sending side's record that the app group moved, its tokens retired.
    static func complete(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        let recipient = try arguments.required("recipient-team")
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: true)
        guard let settings = configuration.apple else { return 2 }
        let clientID = try Self.clientID(arguments, settings)
        let transferredAt = try date(arguments, "transferred-at") ?? Date()
        // The Services IDs move with their primary App ID (TN3159): the whole group goes.
        let group = settings.appGroups.group(of: clientID)
        return try BrokerCommand.withDatabase(environment) { database in
            let apple = appleClient(settings)
            let transfer = TeamTransfer(pool: database.pool, apple: apple, teamID: settings.teamID, clientID: clientID, rate: 0)
            do {
                let retired = try transfer.complete(
                    clientIDs: group.clientIDs, recipientTeam: recipient, transferredAt: transferredAt)
                print("moved to \(recipient): \(group.clientIDs.joined(separator: ", "))")
                print("tokens retired: \(retired)")
                return 0
            } catch let error as TeamTransfer.TransferError {
                BrokerCommand.printError("error: \(error)")
                return 1
            }
        }
    }

    /// `--client-id`, one of APPLE_CLIENT_IDS (the first when not given).
    static func clientID(_ arguments: ParsedArguments, _ settings: AppleConfiguration) throws -> String {
        let clientID = arguments.options["client-id"] ?? settings.clientIDs[0]
        guard settings.clientIDs.contains(clientID) else {
            throw arguments.usageError("--client-id must be one of APPLE_CLIENT_IDS")
        }
        return clientID
    }

    /// The Apple client a transfer calls Apple with; it logs warnings and worse to stderr.
    static func appleClient(_ settings: AppleConfiguration) -> AppleClient {
        let logger = Logger(label: "transfer", sink: LogSink(level: .warning, descriptor: 2))
        return AppleClient(
            baseURL: settings.baseURL, transport: CurlTransport(),
            secrets: ClientSecretProvider(
                teamID: settings.teamID, keyID: settings.keyID, keyPath: settings.privateKeyPath,
                keyIDPath: settings.keyIDPath),
            timeout: settings.timeout, metrics: MetricsRegistry(), logger: logger)
    }

    /// An option holding a date (`2026-12-01`, midnight UTC) or an RFC 3339 time.
    static func date(_ arguments: ParsedArguments, _ name: String) throws -> Date? {
        guard let text = arguments.options[name] else { return nil }
        let full = ISO8601DateFormatter()
        let day = ISO8601DateFormatter()
        day.formatOptions = [.withFullDate]
        guard let date = full.date(from: text) ?? day.date(from: text), date.timeIntervalSinceNow < 86_400 else {
            throw arguments.usageError("--\(name) takes a date (2026-12-01) or an RFC 3339 time, not in the future")
        }
        return date
    }

    /// The report: counts, then failures grouped by reason with the users they hit.
    static func summary(_ report: TeamTransfer.Report, verb: String, path: String) -> String {
        var lines = [
            "\(verb): \(report.done)", "already done before: \(report.skipped)", "failed: \(report.failed.count)",
            "total: \(report.total)",
        ]
        if report.interrupted { lines.append("interrupted: run the same command again to resume (\(path))") }
        for (reason, count) in report.failureReasons {
            let users = report.failed.filter { $0.reason == reason }.prefix(10).map(\.userID)
            lines.append("  \(count) × \(reason): \(users.joined(separator: " "))\(count > users.count ? " …" : "")")
        }
        return lines.joined(separator: "\n")
    }
}

/// A flag one thread raises and others read.
final class Flag: Sendable {
    private let raised = Atomic<Bool>(false)
    func raise() { raised.store(true, ordering: .releasing) }
    var isRaised: Bool { raised.load(ordering: .acquiring) }
}
