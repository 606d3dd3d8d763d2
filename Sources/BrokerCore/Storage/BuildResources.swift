/// The files the EmbedResources plugin compiled into BrokerCore, for the targets above it:
/// the API description and the build's commit (BrokerAPI serves both).
package enum BuildResources {
    /// `docs/openapi.json` as built into the binary.
    package static var openAPIDescription: String { EmbeddedFiles.text(named: "openapi.json") ?? "{}" }
    /// The commit the binary was built from, `unknown` outside a checkout.
    package static var commit: String { EmbeddedFiles.text(named: "build-commit") ?? "unknown" }
}
