import Foundation

/// The independent test vectors in `../shared/testdata` (Wycheproof, RFC 7515/7520, Apple-shaped
/// token cases), read in place and never copied into this repository.
///
/// The folder is found beside the checkout (`<checkout>/../shared/testdata`) or at
/// `$APPLEID_BROKER_TESTDATA`. Tests that need it are skipped, with this message, when it is absent.
public enum TestData {
    public static let directory: String? = {
        if let configured = ProcessInfo.processInfo.environment["APPLEID_BROKER_TESTDATA"],
            FileManager.default.fileExists(atPath: configured)
        {
            return configured
        }
        let sibling = Repository.root.deletingLastPathComponent().appendingPathComponent("shared/testdata").path
        return FileManager.default.fileExists(atPath: sibling) ? sibling : nil
    }()

    public static var isAvailable: Bool { directory != nil }

    public static let skipMessage =
        "test vectors not found: expected ../shared/testdata beside the checkout or APPLEID_BROKER_TESTDATA"

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
        public var description: String { TestData.skipMessage }
    }
}
