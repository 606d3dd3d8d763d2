import BrokerAPI
import BrokerCore
import CommandArguments
import Console
import Foundation
import Observability
import Workers

/// `appleid-broker serve`: runs the service until SIGTERM or SIGINT, then stops gracefully.
enum ServeCommand {
    static func run(_ arguments: ParsedArguments, environment: [String: String]) throws -> Int32 {
        var environment = environment
        if let roles = arguments.options["roles"] { environment["BROKER_ROLES"] = roles }
        let configuration = try BrokerConfiguration.load(environment: environment, requireApple: true)
        let console = try ConsoleConfiguration.load(environment: environment, apiListen: configuration.listen)
        let logger = Logger(label: "broker", sink: LogSink(level: configuration.logLevel))
        let application: BrokerApplication
        do {
            application = try BrokerApplication(configuration: configuration, console: console, logger: logger)
            try application.start()
        } catch {
            logger.error("start-up failed", [("error", "\(error)")])
            return 1
        }
        let signal = TerminationSignals.wait()
        logger.notice("shutting down", [("signal", signal == SIGTERM ? "SIGTERM" : "SIGINT")])
        application.stop()
        return 0
    }
}
