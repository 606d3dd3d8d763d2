import Foundation
import Locking
import StrictJSON
import Synchronization

/// A structured logger that writes one JSON object per line.
///
/// Loggers are values: `with(_:)` returns a copy carrying more metadata (a request id,
/// a worker name), so call sites never share mutable state.
///
/// Never put tokens, e-mail addresses, names or other personal data into a message or
/// its metadata. Identify users by the broker's `user_id` or by `LogRedaction.hash(_:)`.
public struct Logger: Sendable {
    /// Severity, lowest first.
    public enum Level: Int, Comparable, Sendable, CaseIterable, CustomStringConvertible {
        case debug, info, notice, warning, error

        public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }

        public var description: String {
            switch self {
            case .debug: "debug"
            case .info: "info"
            case .notice: "notice"
            case .warning: "warning"
            case .error: "error"
            }
        }

        /// Parses `debug`, `info`, `notice`, `warning` (or `warn`), `error`.
        public init?(name: String) {
            switch name.lowercased() {
            case "debug": self = .debug
            case "info": self = .info
            case "notice": self = .notice
            case "warning", "warn": self = .warning
            case "error": self = .error
            default: return nil
            }
        }
    }

    /// Where lines go and from which level on.
    public let sink: LogSink
    /// The component that logs (`http`, `migrations`, `deletion-worker`, …).
    public let label: String
    /// Key-value pairs added to every line of this logger.
    public private(set) var metadata: [(String, String)]

    public init(label: String, sink: LogSink = .standardOutput, metadata: [(String, String)] = []) {
        self.label = label
        self.sink = sink
        self.metadata = metadata
    }

    /// A copy of this logger with more metadata on every line.
    public func with(_ extra: (String, String)...) -> Logger {
        var copy = self
        copy.metadata.append(contentsOf: extra)
        return copy
    }

    /// A logger for another component writing to the same sink.
    public func labelled(_ label: String) -> Logger {
        Logger(label: label, sink: sink, metadata: metadata)
    }

    public func isEnabled(_ level: Level) -> Bool { level >= sink.level }

    public func log(_ level: Level, _ message: @autoclosure () -> String, _ fields: [(String, String)] = []) {
        guard isEnabled(level) else { return }
        sink.write(level: level, label: label, message: message(), fields: metadata + fields)
    }

    public func debug(_ message: @autoclosure () -> String, _ fields: [(String, String)] = []) {
        log(.debug, message(), fields)
    }
    public func info(_ message: @autoclosure () -> String, _ fields: [(String, String)] = []) {
        log(.info, message(), fields)
    }
    public func notice(_ message: @autoclosure () -> String, _ fields: [(String, String)] = []) {
        log(.notice, message(), fields)
    }
    public func warning(_ message: @autoclosure () -> String, _ fields: [(String, String)] = []) {
        log(.warning, message(), fields)
    }
    public func error(_ message: @autoclosure () -> String, _ fields: [(String, String)] = []) {
        log(.error, message(), fields)
    }
}

/// The destination of log lines: a file descriptor (stdout by default) and a threshold.
///
/// Lines are written whole under a lock, so lines from different threads never interleave.
/// A line that cannot be written (stdout closed, a log shipper gone: EPIPE with SIGPIPE
/// ignored) is dropped and counted in `droppedLines`; logging never stops the service.
public final class LogSink: Sendable {
    /// Lines no sink of this process could write, since start (`broker_log_lines_dropped_total`).
    public static var droppedLines: Int { dropped.load(ordering: .relaxed) }
    private static let dropped = Atomic<Int>(0)

    public let level: Logger.Level
    private let descriptor: Int32
    private let capture: Lock<[String]?>

    /// Lines to standard output at `info` and above.
    public static let standardOutput = LogSink(level: .info)

    public init(level: Logger.Level, descriptor: Int32 = 1) {
        self.level = level
        self.descriptor = descriptor
        self.capture = Lock(nil)
    }

    /// A sink that keeps its lines in memory instead of writing them (for tests).
    public static func capturing(level: Logger.Level = .debug) -> LogSink {
        let sink = LogSink(level: level, descriptor: -1)
        sink.capture.withLock { $0 = [] }
        return sink
    }

    /// The lines kept by a capturing sink.
    public var capturedLines: [String] { capture.withLock { $0 ?? [] } }

    func write(level: Logger.Level, label: String, message: String, fields: [(String, String)]) {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(256)
        bytes.append(contentsOf: "{\"ts\":\"\(RFC3339.now())\",\"level\":\"\(level)\",\"logger\":".utf8)
        JSONString.append(label, to: &bytes)
        bytes.append(contentsOf: ",\"msg\":".utf8)
        JSONString.append(message, to: &bytes)
        for (key, value) in fields {
            bytes.append(UInt8(ascii: ","))
            JSONString.append(key, to: &bytes)
            bytes.append(UInt8(ascii: ":"))
            JSONString.append(value, to: &bytes)
        }
        bytes.append(contentsOf: "}\n".utf8)
        let kept = capture.withLock { lines -> Bool in
            guard lines != nil else { return false }
            lines!.append(String(decoding: bytes, as: UTF8.self))
            return true
        }
        if kept { return }
        capture.withLock { _ in
            // The lock keeps lines whole; write(2) of one buffer is one call.
            var offset = 0
            while offset < bytes.count {
                let written = bytes.withUnsafeMutableBytes { raw in
                    Glibc.write(descriptor, raw.baseAddress! + offset, raw.count - offset)
                }
                if written < 0 && errno == EINTR { continue }
                if written <= 0 {
                    // EPIPE, EBADF, ENOSPC: the line is lost; the next one tries again.
                    Self.dropped.add(1, ordering: .relaxed)
                    break
                }
                offset += written
            }
            bytes.removeAll()
        }
    }
}

/// RFC 3339 timestamps in UTC with milliseconds (`2026-11-29T14:42:37.123Z`), cheap enough
/// for every log line and used wherever the service writes a time as text.
public enum RFC3339 {
    public static func string(from date: Date) -> String {
        let milliseconds = (date.timeIntervalSince1970 * 1000).rounded(.down)
        return format(seconds: Int(milliseconds / 1000), milliseconds: Int(milliseconds.truncatingRemainder(dividingBy: 1000)))
    }

    static func now() -> String {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return format(seconds: spec.tv_sec, milliseconds: spec.tv_nsec / 1_000_000)
    }

    private static func format(seconds: Int, milliseconds: Int) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
            Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
            Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), max(0, milliseconds))
    }
}
