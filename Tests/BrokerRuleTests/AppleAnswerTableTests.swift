import AppleID
import BrokerCore
import Foundation
import TestSupport
import Testing

/// docs/api.md's one table of Apple's answers (issue 28): every metric label and problem code
/// it names is one the code has, and the threat model points to it instead of copying it.
@Suite("Apple answer table")
struct AppleAnswerTableTests {
    static let header = "| Apple's answer | to | what it means (source) | what the broker does | metric label / event field |"

    /// The table's rows, each split into its five cells.
    func rows() throws -> [[String]] {
        let lines = try Repository.text("docs/api.md").split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let start = try #require(lines.firstIndex(of: Self.header))
        return lines[(start + 2)...].prefix { $0.hasPrefix("|") }.map { line in
            line.split(separator: "|", omittingEmptySubsequences: false).dropFirst().dropLast().map {
                $0.trimmingCharacters(in: .whitespaces)
            }
        }
    }

    /// Every Swift source of the broker, as one text.
    func sources() throws -> String {
        var text = ""
        for module in ["BrokerCore", "BrokerAPI", "AppleID"] {
            let directory = URL(fileURLWithPath: Repository.path("Sources/" + module))
            let files = try #require(FileManager.default.enumerator(at: directory, includingPropertiesForKeys: nil))
            for case let file as URL in files where file.pathExtension == "swift" {
                text += try String(contentsOf: file, encoding: .utf8)
            }
        }
        return text
    }

    func matches(_ pattern: String, in text: String) throws -> [String] {
        let expression = try NSRegularExpression(pattern: pattern)
        return expression.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap {
            Range($0.range(at: 1), in: text).map { String(text[$0]) }
        }
    }

    @Test("every row has five cells; every metric, label value and problem code it names exists in the code")
    func tableMatchesCode() throws {
        let rows = try rows()
        #expect(rows.count >= 20, "the table lists the token, revoke, keys and migration answers")
        let code = try sources()
        let problemCodes = Set(BrokerError.Code.allCases.map(\.rawValue) + TokenRejection.Code.allCases.map(\.rawValue))
        for row in rows {
            #expect(row.count == 5, "\(row)")
            guard row.count == 5 else { continue }
            // Metric names: `name_total{…}`, `name_seconds`, `deletion_dead_letters`, gauges.
            for metric in try matches(#"`([a-z_]+(?:_total|_seconds|_open|_letters))[`{]"#, in: row[4]) {
                #expect(code.contains("\"\(metric)\""), "metric \(metric) (\(row[0]))")
            }
            // Label values: outcome="x", error="x", and the "x"/"y" alternatives.
            for value in try matches(#""([a-z_]+)""#, in: row[4]) {
                #expect(code.contains("\"\(value)\"") || code.contains("case \(value)"), "label value \(value) (\(row[0]))")
            }
            // Problem codes the broker answers with: a status, then the code.
            for problem in try matches(#"[0-9]{3} `([a-z_]+)`"#, in: row[3]) {
                #expect(problemCodes.contains(problem), "problem code \(problem) (\(row[0]))")
            }
        }
    }

    @Test("the threat model points to the table instead of keeping a second copy")
    func oneTable() throws {
        let threatModel = try Repository.text("docs/threat-model.md")
        #expect(!threatModel.contains(Self.header))
        #expect(threatModel.contains("api.md#the-refresh-token-sweep"))
    }
}
