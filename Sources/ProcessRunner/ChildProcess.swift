import Glibc

/// A child process started with `posix_spawn` and reaped with `waitpid`.
///
/// Foundation's `Process` relies on a run loop and a SIGCHLD dispatch source that were
/// seen to miss exits when called from Swift Testing's worker threads; this wrapper only
/// uses plain system calls, so it works from any thread.
public final class ChildProcess: @unchecked Sendable {
    /// Where the child's standard output and error go.
    public enum Output: Sendable {
        /// Inherit this process's descriptors.
        case inherit
        /// Discard.
        case null
        /// Append to a file (created if missing).
        case file(String)
        /// This open descriptor (a pipe's write end); the caller keeps and closes its own copy.
        case descriptor(Int32)
    }

    /// A failure to start the program, or a non-zero exit of `run`.
    public struct Failure: Error, CustomStringConvertible, Sendable {
        public let description: String
    }

    public let pid: pid_t
    private var status: Int32?

    private init(pid: pid_t) { self.pid = pid }

    /// Runs `program` to completion and returns its exit status and combined stdout/stderr.
    public static func run(
        _ program: String, _ arguments: [String], environment: [String: String]? = nil
    ) throws -> (status: Int32, output: String) {
        var descriptors: [Int32] = [0, 0]
        guard pipe(&descriptors) == 0 else { throw Failure(description: "pipe: \(errorText())") }
        // Close-on-exec, so only the child's dup2'ed copy survives in other spawned children.
        _ = fcntl(descriptors[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(descriptors[1], F_SETFD, FD_CLOEXEC)
        let child: ChildProcess
        do {
            child = try spawn(program, arguments, environment: environment, outputDescriptor: descriptors[1])
        } catch {
            close(descriptors[0])
            close(descriptors[1])
            throw error
        }
        close(descriptors[1])
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(descriptors[0], &buffer, buffer.count)
            if count > 0 {
                output.append(contentsOf: buffer[0..<count])
            } else if count == 0 || errno != EINTR {
                break
            }
        }
        close(descriptors[0])
        return (child.wait(), String(decoding: output, as: UTF8.self))
    }

    /// Starts `program` in the background with its own process group, or with `detached`
    /// in a session of its own (no controlling terminal: it outlives a closed terminal).
    public static func start(
        _ program: String, _ arguments: [String], environment: [String: String]? = nil, output: Output = .inherit,
        detached: Bool = false
    ) throws -> ChildProcess {
        switch output {
        case .inherit:
            return try spawn(program, arguments, environment: environment, outputDescriptor: nil, detached: detached)
        case .null:
            return try start(program, arguments, environment: environment, output: .file("/dev/null"), detached: detached)
        case .file(let path):
            let descriptor = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            guard descriptor >= 0 else { throw Failure(description: "open \(path): \(errorText())") }
            defer { close(descriptor) }
            return try spawn(program, arguments, environment: environment, outputDescriptor: descriptor, detached: detached)
        case .descriptor(let descriptor):
            return try spawn(program, arguments, environment: environment, outputDescriptor: descriptor, detached: detached)
        }
    }

    private static func spawn(
        _ program: String, _ arguments: [String], environment: [String: String]?, outputDescriptor: Int32?,
        detached: Bool = false
    ) throws -> ChildProcess {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        if let outputDescriptor {
            posix_spawn_file_actions_adddup2(&actions, outputDescriptor, 1)
            posix_spawn_file_actions_adddup2(&actions, outputDescriptor, 2)
        }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Own process group (so a test can signal the whole tree), default signal mask, and
        // SIGPIPE back to its default: an ignored signal stays ignored across exec, and the
        // broker ignores SIGPIPE.
        var emptySet = sigset_t()
        sigemptyset(&emptySet)
        posix_spawnattr_setsigmask(&attributes, &emptySet)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGPIPE)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setpgroup(&attributes, 0)
        let group = detached ? Self.spawnSetSID : Int32(POSIX_SPAWN_SETPGROUP)
        posix_spawnattr_setflags(&attributes, Int16(group | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let argv = ([program] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let environmentList = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
        defer { environmentList?.forEach { free($0) } }

        var pid: pid_t = 0
        let result: Int32
        if let environmentList {
            result = posix_spawn(&pid, program, &actions, &attributes, argv, environmentList)
        } else {
            result = posix_spawn(&pid, program, &actions, &attributes, argv, environ)
        }
        guard result == 0 else {
            throw Failure(description: "cannot start \(program): \(String(cString: strerror(result)))")
        }
        return ChildProcess(pid: pid)
    }

    /// Waits for the child to end; returns its exit status (128 + signal when killed).
    @discardableResult
    public func wait() -> Int32 {
        if let status { return status }
        var raw: Int32 = 0
        while waitpid(pid, &raw, 0) < 0 && errno == EINTR {}
        let decoded = Self.decode(raw)
        status = decoded
        return decoded
    }

    /// Whether the child is still running (reaps it if it has ended).
    public var isRunning: Bool {
        if status != nil { return false }
        var raw: Int32 = 0
        let result = waitpid(pid, &raw, WNOHANG)
        if result == pid {
            status = Self.decode(raw)
            return false
        }
        return result == 0
    }

    /// Sends `signal` to the child (or its whole process group).
    public func send(_ signal: Int32, toGroup: Bool = false) {
        kill(toGroup ? -pid : pid, signal)
    }

    private static func decode(_ raw: Int32) -> Int32 {
        // WIFEXITED / WEXITSTATUS / WTERMSIG are macros; this is their glibc definition.
        let signal = raw & 0x7F
        return signal == 0 ? (raw >> 8) & 0xFF : 128 + signal
    }

    /// glibc's POSIX_SPAWN_SETSID (2.26+), which Swift does not see: it is behind _GNU_SOURCE.
    private static let spawnSetSID: Int32 = 0x80

    private static func errorText() -> String { String(cString: strerror(errno)) }
}
