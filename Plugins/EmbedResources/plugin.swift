import Foundation
import PackagePlugin

/// Compiles the package's run-time resources into the target as Swift string constants,
/// so the binary needs no files beside it: the numbered migrations in `sql/` and the API
/// description `docs/openapi.json`.
@main
struct EmbedResources: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let root = context.package.directoryURL
        let migrations = try FileManager.default
            .contentsOfDirectory(at: root.appending(path: "sql"), includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "sql" }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
        let files = migrations + [root.appending(path: "docs/openapi.json")]
        let output = context.pluginWorkDirectoryURL.appending(path: "EmbeddedFiles.swift")
        return [
            .buildCommand(
                displayName: "Embedding \(files.count) resource files into \(target.name)",
                executable: try context.tool(named: "embed-resources").url,
                arguments: [output.path] + files.map(\.path),
                inputFiles: files,
                outputFiles: [output]
            )
        ]
    }
}
