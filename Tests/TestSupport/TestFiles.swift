import Foundation
import Glibc

/// Where tests write files (throwaway `.p8` keys, logs, exports): one directory per test
/// process, `$TMPDIR/abk-files-<pid>`, removed when the process exits. One left by a process
/// that died (a crash, a kill) is removed by the next test process. Before, every run left
/// its files in `$TMPDIR`, private keys among them: twelve thousand on a machine that had run
/// the suites a few hundred times.
public enum TestFiles {
    /// This process's directory, made at first use.
    public static let directory: String = {
        let temporary = NSTemporaryDirectory()
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []
        where entry.hasPrefix("abk-files-") {
            guard let pid = Int32(entry.dropFirst("abk-files-".count)), pid != getpid(), kill(pid, 0) != 0, errno == ESRCH
            else { continue }
            try? FileManager.default.removeItem(atPath: temporary + entry)
        }
        let directory = temporary + "abk-files-\(getpid())"
        try? FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        atexit { try? FileManager.default.removeItem(atPath: TestFiles.directory) }
        return directory
    }()

    /// A fresh path in this process's directory, `name-<uuid><suffix>`; nothing is created.
    public static func path(_ name: String, suffix: String = "") -> String {
        directory + "/\(name)-\(UUID().uuidString)\(suffix)"
    }
}
