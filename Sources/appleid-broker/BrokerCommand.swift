import BrokerAPI
import BrokerCore
import CommandArguments
import Console
import Foundation
import Glibc
import Observability
import Workers

/// The `appleid-broker` command line: `serve`, `migrate`, `api-keys …` (and more as the
/// service grows). `main.swift` only calls `BrokerCommand.main()`.
enum BrokerCommand {
    /// Every command, its options and its line in the usage text: the parser refuses any
    /// option a command does not list here.
    static let commands = CommandTable(
        program: "appleid-broker",
        commands: [
            CommandSpec(
                ["serve"], "[--roles api,notifications,deletion,dispatch,sweep]",
                summary: "run the service until SIGTERM/SIGINT", options: ["roles"]),
            CommandSpec(["migrate"], summary: "apply pending database migrations and exit"),
            CommandSpec(
                ["healthcheck"], "[--url http://127.0.0.1:8080/readyz]",
                summary: "exit 0 when the broker on BROKER_LISTEN (or --url) answers /readyz with 200;\n"
                    + "for container healthchecks (needs no shell)",
                options: ["url"]),
            CommandSpec(
                ["api-keys", "create"], "--name NAME --scopes login,read[,compliance,events,admin] [--client-ids A,B]",
                summary: "create an API key; prints the key as the only line on stdout.\n"
                    + "--client-ids limits it to exactly those client ids (not their app groups)",
                options: ["name", "scopes", "client-ids"]),
            CommandSpec(["api-keys", "list"], "[--json]", flags: ["json"]),
            CommandSpec(["api-keys", "revoke"], "ID", operands: 1...1),
            CommandSpec(
                ["delete-user"],
                "(--user-id ID | --apple-sub SUB) --reason TEXT [--requested-by NAME] "
                    + "[--authorization-code CODE [--client-id ID] [--redirect-uri URL]]",
                summary: "request a cascaded deletion (revokes at Apple, then purges);\nprints the deletion id. "
                    + "A fresh authorization code lets it revoke\na user whose refresh token the broker does not hold",
                options: ["user-id", "apple-sub", "reason", "requested-by", "authorization-code", "client-id", "redirect-uri"]),
            CommandSpec(
                ["deletions", "list"], "[--state requested|revoking|purging|done|failed] [--limit 100] [--json]",
                options: ["state", "limit"], flags: ["json"]),
            CommandSpec(["deletions", "retry"], "ID", summary: "queue a failed deletion again", operands: 1...1),
            CommandSpec(
                ["transfer", "export"], "--recipient-team TEAMID --out FILE [--client-id ID] [--rate 10]",
                summary: "team transfer, sending side: a transfer_sub per user from\n"
                    + "Apple, written to FILE; resumable (rerun the same command)",
                options: ["recipient-team", "out", "client-id", "rate"]),
            CommandSpec(
                ["transfer", "import"], "--in FILE [--client-id ID] [--rate 10] [--stage-only] [--transferred-at DATE]",
                summary: "receiving side: each transfer_sub exchanged for the new sub\n"
                    + "and linked to its user; prints a report; resumable. --stage-only writes\n"
                    + "the file's lines down without calling Apple (before the transfer completes);\n"
                    + "--transferred-at says when the transfer completed (staged lines live 61 days after)",
                options: ["in", "client-id", "rate", "transferred-at"], flags: ["stage-only"]),
            CommandSpec(
                ["transfer", "complete"], "--recipient-team TEAMID [--client-id ID] [--transferred-at DATE]",
                summary: "sending side, once the transfer completed: the app group of ID moved to\n"
                    + "TEAMID; its tokens are retired here (this team can neither refresh nor revoke them)",
                options: ["recipient-team", "client-id", "transferred-at"]),
            CommandSpec(
                ["reencrypt"], "[--batch 500]",
                summary: "re-seal every secret at rest (refresh and access tokens, webhook secrets,\n"
                    + "deletion codes) with the first key of TOKEN_ENCRYPTION_KEY; resumable.\n"
                    + "Prints counts; exit 0 when no row is left under another key",
                options: ["batch"]),
            CommandSpec(
                ["console", "link"], "--operator NAME --role ROLE[,ROLE…] [--ttl 15m]",
                summary: "print a single-use sign-in URL for the console (BROKER_CONSOLE_LISTEN);\n"
                    + "ROLE viewer, operator, compliance or admin, several comma-separated;\n"
                    + "stored hashed, audited; --ttl up to 24h (s, m or h)",
                options: ["operator", "role", "ttl"]),
            CommandSpec(
                ["console", "end-sessions"], "--operator NAME",
                summary: "end every live console session of an operator (IdP sub or link name) now; audited",
                options: ["operator"]),
            CommandSpec(["version"], summary: "print the version (also --version)"),
        ] + OpenIDCommands.specs,
        footer: """
            Configuration comes from environment variables; see README.md. With DATABASE_URL
            unset, commands use the embedded PostgreSQL in $BROKER_DATA_DIR/postgres.
            """)

    static var usage: String { commands.usage }

    static let version = BrokerApplication.version

    /// Runs the command named by the process arguments and exits with its status.
    static func main() -> Never {
        // Block SIGTERM/SIGINT before any thread exists, so every thread inherits the mask
        // and `serve` can wait for them with sigwait on this thread.
        TerminationSignals.block()
        StandardStreams.secure()
        exit(run(Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment))
    }

    /// Runs one command; returns the exit status (0 success, 1 failure, 2 usage or configuration error).
    static func run(_ arguments: [String], environment: [String: String]) -> Int32 {
        do {
            let parsed: ParsedArguments
            switch try commands.parse(arguments) {
            case .help:
                print(usage)
                return 0
            case .version:
                print("appleid-broker \(version)")
                return 0
            case .group(let group):
                print(commands.groupUsage(group))
                return 0
            case .run(let arguments):
                parsed = arguments
            }
            switch parsed.command.words.joined(separator: " ") {
            case "serve":
                return try ServeCommand.run(parsed, environment: environment)
            case "migrate":
                return try withDatabase(environment) { database in
                    _ = database
                    printError("migrations are up to date")
                    return 0
                }
            case "healthcheck":
                return try HealthcheckCommand.run(parsed, environment: environment)
            case "api-keys create", "api-keys list", "api-keys revoke":
                return try APIKeysCommand.run(parsed, environment: environment)
            case "delete-user":
                return try DeletionCommands.deleteUser(parsed, environment: environment)
            case "deletions list", "deletions retry":
                return try DeletionCommands.run(parsed, environment: environment)
            case "transfer export", "transfer import", "transfer complete":
                return try TransferCommands.run(parsed, environment: environment)
            case "reencrypt":
                return try ReEncryptCommand.run(parsed, environment: environment)
            case "console link":
                return try ConsoleCommand.link(parsed, environment: environment)
            case "console end-sessions":
                return try ConsoleCommand.endSessions(parsed, environment: environment)
            case "oidc-keys rotate", "oidc-keys list", "oidc-clients create", "oidc-clients list", "oidc-clients delete",
                "oidc-resource-servers create", "oidc-resource-servers list", "oidc-resource-servers delete":
                return try OpenIDCommands.run(parsed, environment: environment)
            case "version":
                print("appleid-broker \(version)")
                return 0
            default:
                preconditionFailure("command \(parsed.command.words) is in the table but has no handler")
            }
        } catch let error as UsageError {
            printError("\(error)")
            return 2
        } catch let error as BrokerConfiguration.Invalid {
            printError("\(error)")
            return 2
        } catch let error as ConsoleConfiguration.Invalid {
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

    /// Writes to stderr with write(2): FileHandle traps when stderr is closed, and a message
    /// nobody can read is not worth a crash.
    static func printError(_ text: String) {
        let bytes = Array((text + "\n").utf8)
        _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
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

/// The process's standard streams must never end it: a log shipper restarting, or
/// `make run | tee log` and Ctrl-C, closes the read end of stdout.
enum StandardStreams {
    static func secure() {
        // Writes to a closed pipe fail with EPIPE (LogSink drops and counts the line) instead
        // of killing the process. posix_spawn children get SIGPIPE back (ChildProcess).
        signal(SIGPIPE, SIG_IGN)
        // Started with 0, 1 or 2 closed (`serve >&-`), the next socket or libpq connection
        // would get that number and log lines would be written into it: hold them on /dev/null.
        for descriptor: Int32 in 0...2 where fcntl(descriptor, F_GETFD) < 0 && errno == EBADF {
            let null = open("/dev/null", descriptor == 0 ? O_RDONLY : O_WRONLY)
            if null >= 0 && null != descriptor {
                dup2(null, descriptor)
                close(null)
            }
        }
    }
}
