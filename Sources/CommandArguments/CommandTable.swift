/// The shape of one command of a command-line program: the words that name it, the options
/// it takes and its usage line. A `CommandTable` parses arguments against its commands and
/// refuses anything a command does not declare, so a mistyped or invented option is an
/// error rather than silently ignored.
public struct CommandSpec: Sendable {
    /// The words naming the command: `["api-keys", "create"]`.
    public let words: [String]
    /// What follows the words in the usage line: `--name NAME --scopes login,read`.
    public let synopsis: String
    /// What the command does, one or more lines for the program's usage text.
    public let summary: String
    /// Options that take a value (`--name value`, `--name=value`).
    public let options: Set<String>
    /// Options that take none (`--json`).
    public let flags: Set<String>
    /// How many operands (plain words) may follow the command's words.
    public let operands: ClosedRange<Int>

    public init(
        _ words: [String], _ synopsis: String = "", summary: String = "", options: Set<String> = [],
        flags: Set<String> = [], operands: ClosedRange<Int> = 0...0
    ) {
        self.words = words
        self.synopsis = synopsis
        self.summary = summary
        self.options = options
        self.flags = flags
        self.operands = operands
    }

    /// `appleid-broker api-keys create --name NAME …`.
    public func usageLine(program: String) -> String {
        ([program] + words + (synopsis.isEmpty ? [] : [synopsis])).joined(separator: " ")
    }
}

/// A command line parsed against its `CommandSpec`.
public struct ParsedArguments: Sendable {
    public let command: CommandSpec
    /// Plain words after the command's words.
    public let operands: [String]
    public let options: [String: String]
    public let flags: Set<String>
    let program: String

    /// The value of a required option.
    /// - Throws: `UsageError` naming the option when it is missing or empty.
    public func required(_ name: String) throws(UsageError) -> String {
        guard let value = options[name], !value.isEmpty else { throw usageError("--\(name) is required") }
        return value
    }

    /// A usage error about this command: the message, then the command's usage line.
    public func usageError(_ message: String) -> UsageError {
        UsageError(message: message, usage: "usage: " + command.usageLine(program: program))
    }
}

/// A command line that does not fit any command: exit status 2, with the message and the
/// usage that applies (one command's line where the command is known).
public struct UsageError: Error, CustomStringConvertible, Sendable {
    public let message: String
    public let usage: String

    public init(message: String, usage: String) {
        self.message = message
        self.usage = usage
    }

    public var description: String { message + "\n" + usage }
}

/// Every command of a program, and the parser for its arguments.
public struct CommandTable: Sendable {
    /// What a command line asks for.
    public enum Request: Sendable {
        /// Run this command.
        case run(ParsedArguments)
        /// `--help`, `-h` or `help`: print `usage` and exit 0.
        case help
        /// `--version` (a program's `version` command, if it has one, is a command like the others).
        case version
        /// The first word of a group of commands alone (`api-keys`): print `groupUsage(_:)`.
        case group(String)
    }

    public let program: String
    public let commands: [CommandSpec]
    /// Lines after the list of commands in `usage`.
    public let footer: String

    public init(program: String, commands: [CommandSpec], footer: String = "") {
        self.program = program
        self.commands = commands
        self.footer = footer
    }

    /// The whole usage text: every command with its summary.
    public var usage: String {
        var lines = ["usage: \(program) <command> [options]", "", "commands:"]
        for command in commands {
            let line = "  " + (command.words + (command.synopsis.isEmpty ? [] : [command.synopsis])).joined(separator: " ")
            var summary = command.summary.split(separator: "\n").map(String.init)
            let column = 24
            if line.count < column - 1, let first = summary.first {
                // A short command keeps its first summary line beside it.
                lines.append(line + String(repeating: " ", count: column - line.count) + first)
                summary.removeFirst()
            } else {
                lines.append(line)
            }
            lines += summary.map { String(repeating: " ", count: column) + $0 }
        }
        if !footer.isEmpty { lines += ["", footer] }
        return lines.joined(separator: "\n")
    }

    /// The commands of one group (`api-keys`), one usage line each.
    public func groupUsage(_ group: String) -> String {
        (["\(program) \(group) commands:"]
            + commands.filter { $0.words.first == group }.map { "  " + $0.usageLine(program: program) })
            .joined(separator: "\n")
    }

    /// Parses a command line (the arguments after the program name).
    /// - Throws: `UsageError` for an unknown command, an option the command does not take,
    ///   an option without its value, a flag given a value, or a stray operand.
    public func parse(_ arguments: [String]) throws(UsageError) -> Request {
        let leading = Array(arguments.prefix { !$0.hasPrefix("-") })
        if arguments.isEmpty { throw UsageError(message: "no command given", usage: usage) }
        if leading.isEmpty {
            switch arguments[0] {
            case "--help", "-h": return .help
            case "--version": return .version
            default: throw UsageError(message: "unknown option \(arguments[0]): a command comes first", usage: usage)
            }
        }
        if leading == ["help"] || arguments.contains("--help") || arguments.contains("-h") { return .help }
        // The command whose words are the longest prefix of the leading words.
        let command = commands.filter { $0.words.count <= leading.count && Array(leading.prefix($0.words.count)) == $0.words }
            .max { $0.words.count < $1.words.count }
        guard let command else {
            if commands.contains(where: { $0.words.count > 1 && $0.words.first == leading[0] }) {
                if leading.count == 1 && arguments.count == 1 { return .group(leading[0]) }
                throw UsageError(
                    message: "unknown \(leading[0]) command '\(leading.dropFirst().first ?? arguments[1])'",
                    usage: groupUsage(leading[0]))
            }
            throw UsageError(message: "unknown command '\(leading[0])'", usage: usage)
        }
        let commandUsage = "usage: " + command.usageLine(program: program)
        let name = command.words.joined(separator: " ")
        func refuse(_ message: String) -> UsageError { UsageError(message: "\(name): \(message)", usage: commandUsage) }

        var operands: [String] = []
        var options: [String: String] = [:]
        var flags = Set<String>()
        var index = command.words.count
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            guard argument.hasPrefix("--"), argument.count > 2 else {
                if argument.hasPrefix("-") && argument != "-" { throw refuse("unknown option \(argument)") }
                operands.append(argument)
                continue
            }
            let body = argument.dropFirst(2)
            let optionName: String
            var value: String?
            if let equals = body.firstIndex(of: "=") {
                optionName = String(body[..<equals])
                value = String(body[body.index(after: equals)...])
            } else {
                optionName = String(body)
            }
            if command.flags.contains(optionName) {
                guard value == nil else { throw refuse("option --\(optionName) takes no value") }
                flags.insert(optionName)
            } else if command.options.contains(optionName) {
                if value == nil {
                    guard index < arguments.count, !arguments[index].hasPrefix("--") else {
                        throw refuse("option --\(optionName) needs a value")
                    }
                    value = arguments[index]
                    index += 1
                }
                guard options[optionName] == nil else { throw refuse("option --\(optionName) given twice") }
                options[optionName] = value
            } else {
                throw refuse("unknown option --\(optionName)")
            }
        }
        guard command.operands.contains(operands.count) else {
            throw refuse(
                operands.count > command.operands.upperBound
                    ? "unexpected argument '\(operands[command.operands.upperBound])'" : "missing argument")
        }
        return .run(ParsedArguments(command: command, operands: operands, options: options, flags: flags, program: program))
    }
}
