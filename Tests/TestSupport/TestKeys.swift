import BrokerCrypto
import Foundation

/// Throwaway Apple credentials for tests.
public enum TestKeys {
    /// A P-256 `.p8` written to a temporary file, as Apple hands them out.
    public static func privateKeyFile() throws -> String {
        let path = TestFiles.path("key", suffix: ".p8")
        try AsymmetricKey.generateP256().privateKeyPEM().write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
}
