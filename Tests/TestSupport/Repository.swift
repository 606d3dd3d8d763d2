import Foundation

/// Files of this checkout (the API description, deployment manifests), read by tests that
/// check them against the running code.
public enum Repository {
    /// The checkout's root; `#filePath` is …/<checkout>/Tests/TestSupport/Repository.swift.
    public static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// The path of a file given relative to the root.
    public static func path(_ relativePath: String) -> String {
        root.appendingPathComponent(relativePath).path
    }

    /// The UTF-8 text of a file given relative to the root.
    public static func text(_ relativePath: String) throws -> String {
        try String(contentsOfFile: path(relativePath), encoding: .utf8)
    }

    /// The absolute path of `program` on PATH, or nil.
    public static func executable(_ program: String) -> String? {
        let directories = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":")
        return directories.map { "\($0)/\(program)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}
