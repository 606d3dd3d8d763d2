import Foundation

/// The independent test vectors in `../shared/testdata` (Wycheproof, RFC 7515/7520, Apple-shaped
/// token cases), read in place and never copied into this repository.
///
/// The folder is found beside the checkout (`<checkout>/../shared/testdata`) or at
/// `$APPLEID_BROKER_TESTDATA`. When it is absent, the suites that need it are skipped with
/// `skipMessage` on a developer's machine, but under `CI=true` they run and each test that reads a
/// vector fails with `Missing`'s message: in CI a gate that skipped its vectors would pass untested.
public enum TestData {
    /// Where the vectors are, or why there are none.
    public enum Resolution: Equatable, Sendable {
        /// The folder holding the vectors.
        case found(String)
        /// Absent on a developer's machine: the suites that need it are skipped.
        case absent
        /// Absent under `CI=true`: the suites run and fail, each read throwing `Missing`.
        case requiredButAbsent
    }

    /// The lookup, from an environment and the checkout's root; `exists` answers for a path.
    public static func resolve(
        environment: [String: String], root: URL, exists: (String) -> Bool = { FileManager.default.fileExists(atPath: $0) }
    ) -> Resolution {
        if let configured = environment["APPLEID_BROKER_TESTDATA"], exists(configured) { return .found(configured) }
        let sibling = root.deletingLastPathComponent().appendingPathComponent("shared/testdata").path
        if exists(sibling) { return .found(sibling) }
        // CI services set CI=true (GitHub Actions, GitLab, .ci/run's callers).
        return environment["CI"]?.lowercased() == "true" ? .requiredButAbsent : .absent
    }

    public static let resolution = resolve(environment: ProcessInfo.processInfo.environment, root: Repository.root)

    public static var directory: String? {
        if case .found(let directory) = resolution { return directory }
        return nil
    }

    public static var isAvailable: Bool { directory != nil }

    /// Whether the suites that read vectors run: when they are here, and under CI always (to fail).
    public static var shouldRun: Bool { resolution != .absent }

    public static let skipMessage =
        "test vectors not found: expected ../shared/testdata beside the checkout or APPLEID_BROKER_TESTDATA"

    /// What a test reading a vector fails with when there are none.
    public static func missingMessage(_ resolution: Resolution) -> String {
        resolution == .requiredButAbsent
            ? "CI=true and the test vectors are absent: expected ../shared/testdata beside the checkout or a folder at "
                + "APPLEID_BROKER_TESTDATA (skipped only outside CI)"
            : skipMessage
    }

    /// The bytes of a file under the test-data folder.
    public static func bytes(_ relativePath: String) throws -> [UInt8] {
        guard let directory else { throw Missing() }
        return Array(try Data(contentsOf: URL(fileURLWithPath: directory + "/" + relativePath)))
    }

    /// A JSON file decoded with JSONSerialization.
    public static func json(_ relativePath: String) throws -> Any {
        try JSONSerialization.jsonObject(with: Data(bytes(relativePath)))
    }

    public struct Missing: Error, CustomStringConvertible {
        public var description: String { TestData.missingMessage(TestData.resolution) }
    }
}
