import Foundation
import Glibc

/// The usual `process_*` metrics, read from `/proc/self` at each scrape (Linux): resident
/// and virtual memory, CPU seconds, open and maximum file descriptors, threads, start time.
/// Names and meanings follow the Prometheus client libraries' process collector.
public enum ProcessMetrics {
    public static func register(on registry: MetricsRegistry) {
        let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))
        let pageSize = Double(sysconf(Int32(_SC_PAGESIZE)))
        let bootTime = Self.bootTime()
        registry.collect {
            var samples: [CollectedSample] = []
            // /proc/self/stat: fields after the parenthesised command name; utime 14, stime 15,
            // num_threads 20, starttime 22, vsize 23, rss 24 (1-based, man proc(5)).
            if let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")")
            {
                let fields = stat[stat.index(after: close)...].split(separator: " ").map(String.init)
                func field(_ number: Int) -> Double? { fields.count > number - 3 ? Double(fields[number - 3]) : nil }
                if let user = field(14), let system = field(15) {
                    samples.append(
                        CollectedSample(
                            name: "process_cpu_seconds_total", help: "User and system CPU time spent, in seconds.",
                            type: .counter,
                            value: (user + system) / ticksPerSecond))
                }
                if let threads = field(20) {
                    samples.append(CollectedSample(name: "process_threads", help: "Threads of the process.", value: threads))
                }
                if let start = field(22), let bootTime {
                    samples.append(
                        CollectedSample(
                            name: "process_start_time_seconds",
                            help: "Start time of the process since the Unix epoch, in seconds.",
                            value: bootTime + start / ticksPerSecond))
                }
                if let virtual = field(23) {
                    samples.append(
                        CollectedSample(
                            name: "process_virtual_memory_bytes", help: "Virtual memory size in bytes.", value: virtual))
                }
                if let resident = field(24) {
                    samples.append(
                        CollectedSample(
                            name: "process_resident_memory_bytes", help: "Resident memory size in bytes.",
                            value: resident * pageSize))
                }
            }
            if let descriptors = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") {
                samples.append(
                    CollectedSample(name: "process_open_fds", help: "Open file descriptors.", value: Double(descriptors.count)))
            }
            samples.append(
                CollectedSample(
                    name: "broker_log_lines_dropped_total",
                    help: "Log lines that could not be written (stdout or stderr closed) and were dropped.", type: .counter,
                    value: Double(LogSink.droppedLines)))
            var limit = rlimit()
            if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 {
                samples.append(
                    CollectedSample(
                        name: "process_max_fds", help: "Maximum open file descriptors.", value: Double(limit.rlim_cur)))
            }
            return samples
        }
    }

    /// `btime` of /proc/stat: when the machine booted, in Unix seconds.
    private static func bootTime() -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8) else { return nil }
        return stat.split(separator: "\n").first { $0.hasPrefix("btime ") }.flatMap { Double($0.dropFirst(6)) }
    }
}
