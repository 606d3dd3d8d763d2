import Foundation
import PackagePlugin

/// Compiles the package's run-time resources into the target as Swift string constants,
/// so the binary needs no files beside it: the numbered migrations in `sql/`, the function
/// files in `sql/functions/`, the released migrations' former checksums, the API
/// description `docs/openapi.json`, and the commit the binary was built from (`build-commit`,
/// from `.git`; `unknown` outside a checkout), for `appleid_broker_build_info`.
@main
struct EmbedResources: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let root = context.package.directoryURL
        let migrations = try Self.sqlFiles(in: root.appending(path: "sql"))
        // Embedded as `functions/<name>.sql` (the tool names a file in a `functions` folder so).
        let functions = try Self.sqlFiles(in: root.appending(path: "sql/functions"))
        let (commit, gitFiles) = Self.commit(root)
        let commitFile = context.pluginWorkDirectoryURL.appending(path: "build-commit")
        if (try? String(contentsOf: commitFile, encoding: .utf8)) != commit {
            try Data(commit.utf8).write(to: commitFile)
        }
        let files =
            migrations + functions + [
                root.appending(path: "sql/former-checksums"), root.appending(path: "docs/openapi.json"), commitFile,
            ]
        let output = context.pluginWorkDirectoryURL.appending(path: "EmbeddedFiles.swift")
        return [
            .buildCommand(
                displayName: "Embedding \(files.count) resource files into \(target.name)",
                executable: try context.tool(named: "embed-resources").url,
                arguments: [output.path] + files.map(\.path),
                // The git files make a new commit rebuild the constants.
                inputFiles: files + gitFiles,
                outputFiles: [output]
            )
        ]
    }

    static func sqlFiles(in folder: URL) throws -> [URL] {
        try FileManager.default.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "sql" }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    /// HEAD's commit, read from `.git` without running git, and the files it came from.
    static func commit(_ root: URL) -> (String, [URL]) {
        let git = root.appending(path: ".git")
        let head = git.appending(path: "HEAD")
        guard let text = try? String(contentsOf: head, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines) else {
            return ("unknown", [])
        }
        guard text.hasPrefix("ref: ") else { return (String(text.prefix(12)), [head]) }
        let name = String(text.dropFirst(5))
        let ref = git.appending(path: name)
        if let hash = try? String(contentsOf: ref, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines) {
            return (String(hash.prefix(12)), [head, ref])
        }
        let packed = git.appending(path: "packed-refs")
        let line = (try? String(contentsOf: packed, encoding: .utf8))?.split(separator: "\n").first { $0.hasSuffix(" " + name) }
        return (line.map { String($0.prefix(12)) } ?? "unknown", [head, packed])
    }
}
