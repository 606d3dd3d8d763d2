import Foundation
import PackagePlugin

/// Compiles the numbered migrations in the package's top-level `sql/` folder into
/// the target as Swift string constants, so the binary needs no files at run time.
@main
struct EmbedMigrations: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let sqlDirectory = context.package.directoryURL.appending(path: "sql")
        let files = try FileManager.default
            .contentsOfDirectory(at: sqlDirectory, includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "sql" }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
        let output = context.pluginWorkDirectoryURL.appending(path: "EmbeddedMigrations.swift")
        return [
            .buildCommand(
                displayName: "Embedding \(files.count) SQL migrations into \(target.name)",
                executable: try context.tool(named: "embed-sql").url,
                arguments: [output.path] + files.map(\.path),
                inputFiles: files,
                outputFiles: [output]
            )
        ]
    }
}
