// swift-tools-version:6.1
//
// appleid-broker: a self-hosted Sign in with Apple identity broker.
//
// The module map (README and docs/development.md link here; keep it true when a module comes or goes).
// Bottom up; each module has one job and depends only on modules above it in this list.
//
//   C bridges     CMicroHTTPD, CLibpq, COpenSSL, CCurl: system libraries, headers via pkg-config
//                 CMicroHTTPDShims, CCurlShims: C wrappers for the libraries' variadic calls
//   Foundations   Locking           `Lock`, the one lock type (a pthread mutex)
//                 StrictJSON        a strict JSON reader (duplicate names refused) and writer
//                 Observability     JSON-lines logger, Prometheus metrics registry
//                 BrokerCrypto      OpenSSL: SHA-256, HMAC, AES-256-GCM, RSA/EC keys, signatures, base64url
//                 JOSE              JWS/JWK/JWK Set: verify RS256/ES256 safely, sign client secrets
//                 Workers           worker loops (lanes), the wake-up signal, `Backoff` (the one retry schedule) and
//                                   `Coalescer` (what many threads submit, run in batches on one thread)
//                 PostgresClient    libpq: connections, typed rows, pool, transactions, LISTEN/NOTIFY, the
//                                   read pipeline; works through PgBouncer in transaction pooling
//                 ProcessRunner     posix_spawn/waitpid child processes
//                 CommandArguments  command lines: commands, options, usage text
//                 EmbeddedPostgres  a private PostgreSQL cluster on a Unix socket, never outliving its users
//                 HTTPServer        libmicrohttpd: router, per-group middleware, problems (RFC 9457), limits,
//                                   client address behind trusted proxies, metrics, graceful stop
//                 HTTPClient        libcurl behind the HTTPTransport protocol; outbound address rules
//                 Deliveries        the delivery engine: outbound deliveries in lanes (webhooks, Back-Channel
//                                   Logout), each over its own table: claim under a lease, address pinning,
//                                   backoff, dead letters, re-drive, pruning; a lane brings its rules
//   Product       AppleID           appleid.apple.com's side: keys, identity-token and notification claim
//                                   rules, /auth/token and /auth/revoke, client secrets. No database, no server
//                 BrokerCore        the components, one folder each, a service and its store (SQL only in
//                                   *Store.swift, Storage/ and sql/): Login/ Users/ Notifications/ Deletions/
//                                   Events/ WebSignIn/ Transfer/ Auth/ Errors/ Storage/ Configuration/. No HTTP
//                 OpenIDProvider    the OpenID Provider in front of BrokerCore (OIDC_ISSUER): Configuration/
//                                   Keys/ Clients/ Authorization/ Tokens/ HTTP/; Apple's form post reaches it
//                                   through the web callback's AppleFormPostContinuation seam
//                 Console           the operators' console (docs/console.md): its own listener, server-rendered
//                                   HTML, sessions, roles; pages call BrokerCore's services. BrokerCore never
//                                   imports it; BrokerAPI starts it when BROKER_CONSOLE_LISTEN is set
//                 BrokerAPI         BrokerCore's HTTP face: HTTP/ (routes, middleware, ProblemCatalog) and
//                                   Application/ (the roles wired into a running broker, the provider too)
//                 appleid-broker    the executable: the command line (serve, migrate, api-keys, delete-user, …)
//                 broker-bench      micro-benchmarks (JWT verification against openssl speed, seeding)
//   Simulator     AppleSimulator + apple-sim: appleid.apple.com on loopback, as inconvenient as Apple
//   Client        AppleIDBrokerClient: the library Swift app backends call the broker with (URLSession)
//   Tests         one target per foundation module; BrokerRuleTests (the product's rules and routes, no
//                 database), BrokerCoreTests (the product end to end: brokers, CLI, clusters) and
//                 OpenIDProviderTests (the provider end to end against the simulator); BrokerStoreTests
//                 and DeliveriesTests (one store, service or the engine against a migrated database, no broker);
//                 TestSupport (throwaway clusters, PgBouncer, test threads). `make check` runs every
//                 database-free target, `make test` everything (docs/testing.md).
//   Elsewhere     sql/ (migrations; sql/functions/ one file per SQL function, docs/database.md),
//                 Plugins/ (embeds sql/ and docs/openapi.json), Fuzz/ (libFuzzer targets, BROKER_FUZZ=1)
import PackageDescription

/// `BROKER_FUZZ=1` (scripts/fuzz.sh): every Swift target gets libFuzzer's coverage and
/// AddressSanitizer, and the fuzz targets below exist. Build tools are left alone.
let fuzzing = Context.environment["BROKER_FUZZ"] == "1"

let swiftSettings: [SwiftSetting] =
    [.enableUpcomingFeature("ExistentialAny"), .enableUpcomingFeature("MemberImportVisibility")]
    + (fuzzing ? [.unsafeFlags(["-sanitize=fuzzer,address"])] : [])

let package = Package(
    name: "appleid-broker",
    products: [
        .executable(name: "appleid-broker", targets: ["appleid-broker"]),
        .executable(name: "apple-sim", targets: ["apple-sim"]),
        // For Swift app backends (Vapor, Hummingbird): typed calls to the broker over URLSession.
        .library(name: "AppleIDBrokerClient", targets: ["AppleIDBrokerClient"]),
    ],
    targets: [
        // MARK: C bridges (headers and link flags come from pkg-config)
        .systemLibrary(name: "CMicroHTTPD", pkgConfig: "libmicrohttpd", providers: [.apt(["libmicrohttpd-dev"])]),
        .systemLibrary(name: "CLibpq", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        // C wrappers for each library's variadic calls, one target per library.
        // CMicroHTTPDShims also writes on libmicrohttpd's GnuTLS sessions (libmicrohttpd-dev
        // depends on libgnutls28-dev, libmicrohttpd12 on libgnutls30: no new package).
        .target(name: "CMicroHTTPDShims", dependencies: ["CMicroHTTPD"], linkerSettings: [.linkedLibrary("gnutls")]),
        .target(name: "CCurlShims", dependencies: ["CCurl"]),

        // MARK: Foundations, one job each
        .target(name: "Observability", dependencies: ["StrictJSON"], swiftSettings: swiftSettings),
        .target(name: "BrokerCrypto", dependencies: ["COpenSSL"], swiftSettings: swiftSettings),
        .target(name: "PostgresClient", dependencies: ["CLibpq", "Observability", "Workers"], swiftSettings: swiftSettings),
        .target(name: "ProcessRunner", swiftSettings: swiftSettings),
        .target(name: "CommandArguments", swiftSettings: swiftSettings),
        .target(
            name: "EmbeddedPostgres",
            dependencies: ["PostgresClient", "ProcessRunner", "Observability"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "HTTPServer",
            dependencies: ["CMicroHTTPD", "CMicroHTTPDShims", "Observability", "StrictJSON"],
            swiftSettings: swiftSettings
        ),
        .target(name: "HTTPClient", dependencies: ["CCurl", "CCurlShims"], swiftSettings: swiftSettings),
        .target(name: "StrictJSON", swiftSettings: swiftSettings),
        .target(name: "Workers", dependencies: ["Observability"], swiftSettings: swiftSettings),
        .target(
            name: "Deliveries", dependencies: ["Workers", "PostgresClient", "HTTPClient", "Observability"],
            swiftSettings: swiftSettings),
        .target(name: "JOSE", dependencies: ["BrokerCrypto", "StrictJSON"], swiftSettings: swiftSettings),

        // MARK: The product
        // appleid.apple.com's side of Sign in with Apple: its keys, the identity-token and
        // notification claim rules, /auth/token and /auth/revoke. No database, no HTTP server.
        .target(
            name: "AppleID",
            dependencies: ["BrokerCrypto", "JOSE", "StrictJSON", "HTTPClient", "Observability", "Workers"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "BrokerCore",
            dependencies: [
                "Observability", "BrokerCrypto", "StrictJSON", "JOSE", "PostgresClient", "EmbeddedPostgres", "HTTPClient",
                "Workers", "AppleID", "Deliveries",
            ],
            swiftSettings: swiftSettings,
            plugins: ["EmbedResources"]
        ),
        // The OpenID Provider: its own room, using BrokerCore's services; BrokerCore never imports it.
        .target(
            name: "OpenIDProvider",
            dependencies: [
                "BrokerCore", "AppleID", "HTTPServer", "HTTPClient", "JOSE", "BrokerCrypto", "StrictJSON", "Observability",
                "PostgresClient", "Workers", "Deliveries",
            ],
            swiftSettings: swiftSettings
        ),
        // The operators' console: HTML pages on a listener of its own, on BrokerCore's services.
        .target(
            name: "Console",
            dependencies: [
                "BrokerCore", "HTTPServer", "HTTPClient", "PostgresClient", "BrokerCrypto", "StrictJSON", "Observability", "JOSE",
                "Deliveries",
            ],
            swiftSettings: swiftSettings
        ),
        // The HTTP face of BrokerCore: routes, problem codes, middleware, and the application
        // that wires the components into a running broker. BrokerCore cannot import HTTPServer.
        .target(
            name: "BrokerAPI",
            dependencies: [
                "BrokerCore", "OpenIDProvider", "Console", "Observability", "BrokerCrypto", "StrictJSON", "PostgresClient",
                "HTTPServer", "HTTPClient", "Workers", "AppleID", "Deliveries",
            ],
            swiftSettings: swiftSettings
        ),
        // The command line (serve, api-keys, delete-user, …): parses, prints and exits; the
        // broker itself is BrokerAPI and BrokerCore.
        .executableTarget(
            name: "appleid-broker",
            dependencies: [
                "BrokerAPI", "BrokerCore", "OpenIDProvider", "Console", "AppleID", "CommandArguments", "HTTPClient",
                "Observability", "PostgresClient", "StrictJSON", "Workers",
            ],
            swiftSettings: swiftSettings),

        // MARK: The Apple simulator: appleid.apple.com on loopback, for development and tests
        .target(
            name: "AppleSimulator",
            dependencies: [
                "BrokerCrypto", "JOSE", "StrictJSON", "HTTPServer", "HTTPClient", "Observability", "CommandArguments",
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(name: "apple-sim", dependencies: ["AppleSimulator"], swiftSettings: swiftSettings),

        // MARK: The client library for Swift app backends: Foundation's URLSession, OpenSSL's
        // HMAC (BrokerCrypto) for webhook signatures, StrictJSON for event data; nothing of the server.
        .target(name: "AppleIDBrokerClient", dependencies: ["BrokerCrypto", "StrictJSON"], swiftSettings: swiftSettings),

        // MARK: Micro-benchmarks (figures for `make bench`, never timed tests)
        .executableTarget(
            name: "broker-bench",
            dependencies: [
                "BrokerAPI", "BrokerCore", "AppleID", "BrokerCrypto", "COpenSSL", "JOSE", "StrictJSON", "PostgresClient",
                "HTTPServer", "HTTPClient", "Observability",
            ],
            swiftSettings: swiftSettings),

        // MARK: Build tooling: sql/*.sql, sql/functions/*.sql and docs/openapi.json compiled into the binary
        .executableTarget(name: "embed-resources", path: "Plugins/EmbedResourcesTool"),
        .plugin(name: "EmbedResources", capability: .buildTool(), dependencies: ["embed-resources"]),

        // MARK: Tests
        .target(
            name: "TestSupport",
            dependencies: [
                "PostgresClient", "EmbeddedPostgres", "HTTPClient", "HTTPServer", "ProcessRunner", "Observability",
                "BrokerCore", "BrokerCrypto",
            ],
            path: "Tests/TestSupport",
            swiftSettings: swiftSettings
        ),
        .testTarget(name: "BrokerCryptoTests", dependencies: ["BrokerCrypto"], swiftSettings: swiftSettings),
        .testTarget(
            name: "AppleIDTests", dependencies: ["AppleID", "JOSE", "StrictJSON", "TestSupport"], swiftSettings: swiftSettings),
        .testTarget(name: "StrictJSONTests", dependencies: ["StrictJSON"], swiftSettings: swiftSettings),
        .testTarget(name: "WorkersTests", dependencies: ["Workers", "TestSupport"], swiftSettings: swiftSettings),
        // BrokerCore's stores and services against a migrated database, no broker.
        .testTarget(
            name: "BrokerStoreTests",
            dependencies: ["BrokerCore", "BrokerCrypto", "PostgresClient", "Observability", "TestSupport"],
            swiftSettings: swiftSettings
        ),
        // The delivery engine against a migrated database and a receiver on loopback, no broker.
        .testTarget(
            name: "DeliveriesTests",
            dependencies: [
                "Deliveries", "Workers", "PostgresClient", "HTTPClient", "HTTPServer", "Observability", "TestSupport",
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "JOSETests", dependencies: ["JOSE", "StrictJSON", "BrokerCrypto", "TestSupport"], swiftSettings: swiftSettings),
        .testTarget(
            name: "AppleSimulatorTests",
            dependencies: [
                "AppleSimulator", "JOSE", "StrictJSON", "BrokerCrypto", "HTTPClient", "HTTPServer", "Observability",
                "TestSupport",
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "PostgresClientTests",
            dependencies: ["PostgresClient", "EmbeddedPostgres", "Observability", "TestSupport", "Workers"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "HTTPServerTests",
            dependencies: ["HTTPServer", "HTTPClient", "Observability", "TestSupport"],
            swiftSettings: swiftSettings
        ),
        // Rules and routes of the product without a database or a broker (make check runs them).
        .testTarget(
            name: "BrokerRuleTests",
            dependencies: [
                "BrokerAPI", "BrokerCore", "HTTPServer", "JOSE", "StrictJSON", "BrokerCrypto", "TestSupport", "AppleID",
                "PostgresClient", "Observability", "Deliveries",
            ],
            swiftSettings: swiftSettings
        ),
        // The console end to end: a broker with its console listener, browsers' requests by hand.
        .testTarget(
            name: "ConsoleTests",
            dependencies: [
                "Console", "BrokerAPI", "BrokerCore", "AppleSimulator", "HTTPServer", "HTTPClient", "JOSE", "StrictJSON",
                "BrokerCrypto", "TestSupport", "PostgresClient", "Observability", "ProcessRunner",
            ],
            swiftSettings: swiftSettings
        ),
        // The product end to end: brokers, the CLI, clusters, the simulator over HTTP.
        .testTarget(
            name: "BrokerCoreTests",
            dependencies: [
                "BrokerAPI", "BrokerCore", "AppleSimulator", "HTTPServer", "JOSE", "StrictJSON", "BrokerCrypto", "TestSupport",
                "ProcessRunner",
                "CommandArguments", "AppleIDBrokerClient", "Workers", "AppleID", "HTTPClient", "Observability", "PostgresClient",
                "EmbeddedPostgres",
            ],
            swiftSettings: swiftSettings
        ),
        // The OpenID Provider end to end: a broker, the simulator, relying parties driven over HTTP.
        .testTarget(
            name: "OpenIDProviderTests",
            dependencies: [
                "OpenIDProvider", "BrokerAPI", "BrokerCore", "AppleSimulator", "HTTPClient", "HTTPServer", "JOSE", "StrictJSON",
                "BrokerCrypto", "TestSupport", "PostgresClient", "Observability", "ProcessRunner",
            ],
            swiftSettings: swiftSettings
        ),
    ]
)

// One lock type for every Swift target: `Lock`, a pthread mutex (Sources/Locking/Lock.swift says why).
// Not the C wrappers (a name prefix would also skip Console and CommandArguments).
package.targets.append(.target(name: "Locking", swiftSettings: swiftSettings))
for target in package.targets
where [.regular, .executable, .test].contains(target.type)
    && !["CMicroHTTPDShims", "CCurlShims", "Locking", "embed-resources"].contains(target.name)
{
    target.dependencies.append("Locking")
}

// MARK: Fuzz targets (scripts/fuzz.sh): each hands its body to libFuzzer through FuzzDriver.
if fuzzing {
    package.targets.append(.target(name: "FuzzDriver", path: "Fuzz/FuzzDriver", swiftSettings: swiftSettings))
    let fuzzTargets: [(name: String, folder: String, dependencies: [Target.Dependency])] = [
        ("fuzz-jose", "FuzzJOSE", ["JOSE", "BrokerCrypto", "StrictJSON"]),
        ("fuzz-notification", "FuzzNotification", ["AppleID", "BrokerCore", "BrokerAPI", "StrictJSON"]),
        ("fuzz-request-json", "FuzzRequestJSON", ["BrokerAPI", "BrokerCore", "HTTPServer", "StrictJSON"]),
    ]
    for fuzz in fuzzTargets {
        package.targets.append(
            .executableTarget(
                name: fuzz.name, dependencies: fuzz.dependencies + ["FuzzDriver"], path: "Fuzz/\(fuzz.folder)",
                swiftSettings: swiftSettings,
                // lld: gold fails on the sanitizer runtime's debug info.
                linkerSettings: [.unsafeFlags(["-sanitize=fuzzer,address", "-use-ld=lld"])]))
    }
}
