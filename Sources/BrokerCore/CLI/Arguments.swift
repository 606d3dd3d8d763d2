/// A minimal command-line parser: positional words and `--name value` / `--name=value` /
/// `--flag` options.
struct Arguments {
    private(set) var positional: [String] = []
    private(set) var options: [String: String] = [:]
    private(set) var flags: Set<String> = []

    struct UsageError: Error, CustomStringConvertible {
        let description: String
    }

    /// - Parameter flagNames: options that take no value.
    init(_ arguments: [String], flagNames: Set<String> = ["help", "json"]) throws {
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if argument.hasPrefix("--") {
                let body = String(argument.dropFirst(2))
                if let equals = body.firstIndex(of: "=") {
                    options[String(body[..<equals])] = String(body[body.index(after: equals)...])
                } else if flagNames.contains(body) {
                    flags.insert(body)
                } else {
                    guard index + 1 < arguments.count, !arguments[index + 1].hasPrefix("--") else {
                        throw UsageError(description: "option --\(body) needs a value")
                    }
                    options[body] = arguments[index + 1]
                    index += 1
                }
            } else if argument == "-h" {
                flags.insert("help")
            } else {
                positional.append(argument)
            }
            index += 1
        }
    }

    func required(_ name: String) throws -> String {
        guard let value = options[name], !value.isEmpty else { throw UsageError(description: "--\(name) is required") }
        return value
    }
}
