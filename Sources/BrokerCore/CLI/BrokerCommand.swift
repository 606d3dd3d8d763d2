import Foundation
import Glibc
import Observability

/// The `appleid-broker` command line: `serve`, `migrate`, `api-keys …` (and more as the
/// service grows). `main.swift` only calls `BrokerCommand.main()`.
public enum BrokerCommand {
    static let usage = """
        usage: appleid-broker <command> [options]

        commands:
          serve [--roles api,notifications,deletion,dispatch,sweep]
                                run the service until SIGTERM/SIGINT
          migrate               apply pending database migrations and exit
          api-keys create --name NAME --scopes login,read[,compliance,events,admin]
                                create an API key; prints the key as the only line on stdout
          api-keys list [--json]
          api-keys revoke ID
          delete-user (--user-id ID | --apple-sub SUB) --reason TEXT [--requested-by NAME]
                                request a cascaded deletion (revokes at Apple, then purges);
                                prints the deletion id
          deletions list [--state requested|revoking|purging|done|failed] [--json]
          deletions retry ID    queue a failed deletion again
          transfer export --recipient-team TEAMID --out FILE [--client-id ID] [--rate 10]
                                team transfer, sending side: a transfer_sub per user from
                                Apple, written to FILE; resumable (rerun the same command)
          transfer import --in FILE [--client-id ID] [--rate 10]
                                receiving side: each transfer_sub exchanged for the new sub
                                and linked to its user; prints a report; resumable
          version

        Configuration comes from environment variables; see README.md. With DATABASE_URL
        unset, commands use the embedded PostgreSQL in $BROKER_DATA_DIR/postgres.
        """

    static let version = "0.1.0"

    /// Runs the command named by the process arguments and exits with its status.
    public static func main() -> Never {
        // Block SIGTERM/SIGINT before any thread exists, so every thread inherits the mask
        // and `serve` can wait for them with sigwait on this thread.
        TerminationSignals.block()
        exit(run(Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment))
    }

    /// Runs one command; returns the exit status (0 success, 1 failure, 2 usage or configuration error).
    public static func run(_ arguments: [String], environment: [String: String]) -> Int32 {
        let parsed: Arguments
        do {
            parsed = try Arguments(arguments)
        } catch {
            printError("\(error)\n\n\(usage)")
            return 2
        }
        let words = parsed.positional
        if parsed.flags.contains("help") || words.first == "help" || words.isEmpty {
            print(usage)
            return words.isEmpty && !parsed.flags.contains("help") ? 2 : 0
        }
        do {
            switch (words[0], words.count > 1 ? words[1] : nil) {
            case ("version", _):
                print("appleid-broker \(version)")
                return 0
            case ("serve", _):
                return try ServeCommand.run(parsed, environment: environment)
            case ("migrate", _):
                return try withDatabase(environment) { database in
                    _ = database
                    printError("migrations are up to date")
                    return 0
                }
            case ("api-keys", let sub?):
                return try APIKeysCommand.run(sub, parsed, environment: environment)
            case ("delete-user", _):
                return try DeletionCommands.deleteUser(parsed, environment: environment)
            case ("deletions", let sub?):
                return try DeletionCommands.run(sub, parsed, environment: environment)
            case ("transfer", let sub?):
                return try TransferCommands.run(sub, parsed, environment: environment)
            default:
                printError("unknown command '\(words.joined(separator: " "))'\n\n\(usage)")
                return 2
            }
        } catch let error as Arguments.UsageError {
            printError("\(error)\n\n\(usage)")
            return 2
        } catch let error as BrokerConfiguration.Invalid {
            printError("\(error)")
            return 2
        } catch {
            printError("error: \(error)")
            return 1
        }
    }

    /// Opens the database for a one-off command (embedded cluster started and stopped if
    /// it was not running), logging to stderr so stdout stays for the command's output.
    static func withDatabase<T>(_ environment: [String: String], _ body: (Database) throws -> T) throws -> T {
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: false)
        let logger = Logger(label: "cli", sink: LogSink(level: max(configuration.logLevel, .notice), descriptor: 2))
        let database = try Database.open(configuration, logger: logger, waitForServer: .seconds(5))
        defer { database.close() }
        return try body(database)
    }

    static func printError(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }
}

/// SIGTERM and SIGINT, blocked in every thread and awaited with `sigwait`.
enum TerminationSignals {
    static func block() {
        var set = signals()
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    /// Blocks until SIGTERM or SIGINT arrives; returns its number.
    static func wait() -> Int32 {
        var set = signals()
        var received: Int32 = 0
        sigwait(&set, &received)
        return received
    }

    private static func signals() -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        return set
    }
}
