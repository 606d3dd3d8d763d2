import Foundation
import Locking
import Synchronization

/// A Prometheus metrics registry: counters, gauges and histograms with labels,
/// rendered in the text exposition format (version 0.0.4) by `render()`.
///
/// Families are created once at start-up and kept; updating a series takes one lock.
public final class MetricsRegistry: Sendable {
    private let families: Lock<[any MetricFamily]>
    private let collectors: Lock<[@Sendable () -> [CollectedSample]]>

    public init() {
        families = Lock([])
        collectors = Lock([])
    }

    /// A monotonically increasing counter family.
    public func counter(_ name: String, help: String, labels: [String] = []) -> CounterFamily {
        let family = CounterFamily(name: name, help: help, labelNames: labels)
        families.withLock { $0.append(family) }
        return family
    }

    /// The counter family registered under `name`, for a reader that did not register it
    /// (the console's overview); nil when there is none.
    public func registeredCounter(_ name: String) -> CounterFamily? {
        families.withLock { families in families.lazy.compactMap { $0 as? CounterFamily }.first { $0.name == name } }
    }

    /// A gauge family whose series are set by the caller.
    public func gauge(_ name: String, help: String, labels: [String] = []) -> GaugeFamily {
        let family = GaugeFamily(name: name, help: help, labelNames: labels)
        families.withLock { $0.append(family) }
        return family
    }

    /// A histogram family; `buckets` are upper bounds in the metric's unit.
    public func histogram(
        _ name: String, help: String, labels: [String] = [], buckets: [Double] = Histogram.defaultSecondsBuckets
    ) -> HistogramFamily {
        let family = HistogramFamily(name: name, help: help, labelNames: labels, buckets: buckets)
        families.withLock { $0.append(family) }
        return family
    }

    /// Registers values computed at scrape time (pool usage, queue backlogs).
    /// The closure must be cheap or bounded: it runs on every scrape.
    public func collect(_ collector: @escaping @Sendable () -> [CollectedSample]) {
        collectors.withLock { $0.append(collector) }
    }

    /// The whole registry in Prometheus text format.
    public func render() -> String {
        var output = ""
        for family in families.withLock({ $0 }) {
            family.render(into: &output)
        }
        var collected: [CollectedSample] = []
        for collector in collectors.withLock({ $0 }) {
            collected.append(contentsOf: collector())
        }
        var described = Set<String>()
        for sample in collected {
            if described.insert(sample.name).inserted {
                output += "# HELP \(sample.name) \(sample.help)\n# TYPE \(sample.name) \(sample.type)\n"
            }
            output += sample.name + Self.labelText(sample.labels) + " " + Self.number(sample.value) + "\n"
        }
        return output
    }

    /// The names of every family and collected sample, for documentation checks.
    public func familyNames() -> [String] {
        var names = families.withLock { $0.map(\.name) }
        for collector in collectors.withLock({ $0 }) {
            names.append(contentsOf: collector().map(\.name))
        }
        return Array(Set(names)).sorted()
    }

    static func labelText(_ pairs: [(String, String)]) -> String {
        guard !pairs.isEmpty else { return "" }
        var text = "{"
        for (index, (name, value)) in pairs.enumerated() {
            if index > 0 { text += "," }
            text += name + "=\""
            for character in value {
                switch character {
                case "\\": text += "\\\\"
                case "\"": text += "\\\""
                case "\n": text += "\\n"
                default: text.append(character)
                }
            }
            text += "\""
        }
        return text + "}"
    }

    static func number(_ value: Double) -> String {
        if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
        if value.isNaN { return "NaN" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }
}

/// One value computed at scrape time.
public struct CollectedSample: Sendable {
    public enum Kind: String, Sendable { case gauge, counter }
    public var name: String
    public var help: String
    public var type: Kind
    public var labels: [(String, String)]
    public var value: Double

    public init(name: String, help: String, type: Kind = .gauge, labels: [(String, String)] = [], value: Double) {
        self.name = name
        self.help = help
        self.type = type
        self.labels = labels
        self.value = value
    }
}

protocol MetricFamily: Sendable {
    var name: String { get }
    func render(into output: inout String)
}

/// Counters sharing a name, one series per label-value tuple.
public final class CounterFamily: MetricFamily, Sendable {
    public let name: String
    let help: String
    let labelNames: [String]
    private let series: Lock<[[String]: Double]>

    init(name: String, help: String, labelNames: [String]) {
        self.name = name
        self.help = help
        self.labelNames = labelNames
        self.series = Lock([:])
    }

    /// Adds `amount` (default 1) to the series with these label values.
    public func increment(_ labelValues: String..., by amount: Double = 1) {
        add(labelValues, amount)
    }

    /// Adds `amount` to the series named by `labelValues`.
    public func add(_ labelValues: [String], _ amount: Double) {
        precondition(labelValues.count == labelNames.count, "\(name): wrong number of label values")
        series.withLock { $0[labelValues, default: 0] += amount }
    }

    /// The current value of one series (0 when it has never been incremented).
    public func value(_ labelValues: String...) -> Double {
        series.withLock { $0[labelValues] ?? 0 }
    }

    /// Every series: its label values (in the order of `labelNames`) and value, sorted.
    public var samples: [(labels: [String], value: Double)] {
        series.withLock { $0 }.sorted { $0.key.lexicographicallyPrecedes($1.key) }.map { ($0.key, $0.value) }
    }

    func render(into output: inout String) {
        output += "# HELP \(name) \(help)\n# TYPE \(name) counter\n"
        for (values, value) in series.withLock({ $0 }).sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            output += name + MetricsRegistry.labelText(Array(zip(labelNames, values)))
            output += " " + MetricsRegistry.number(value) + "\n"
        }
    }
}

/// Gauges sharing a name, one series per label-value tuple.
public final class GaugeFamily: MetricFamily, Sendable {
    public let name: String
    let help: String
    let labelNames: [String]
    private let series: Lock<[[String]: Double]>

    init(name: String, help: String, labelNames: [String]) {
        self.name = name
        self.help = help
        self.labelNames = labelNames
        self.series = Lock([:])
    }

    public func set(_ value: Double, _ labelValues: String...) {
        precondition(labelValues.count == labelNames.count, "\(name): wrong number of label values")
        series.withLock { $0[labelValues] = value }
    }

    public func add(_ amount: Double, _ labelValues: String...) {
        precondition(labelValues.count == labelNames.count, "\(name): wrong number of label values")
        series.withLock { $0[labelValues, default: 0] += amount }
    }

    public func value(_ labelValues: String...) -> Double {
        series.withLock { $0[labelValues] ?? 0 }
    }

    func render(into output: inout String) {
        output += "# HELP \(name) \(help)\n# TYPE \(name) gauge\n"
        for (values, value) in series.withLock({ $0 }).sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            output += name + MetricsRegistry.labelText(Array(zip(labelNames, values)))
            output += " " + MetricsRegistry.number(value) + "\n"
        }
    }
}

/// The cumulative buckets, sum and count of one histogram series.
public struct Histogram: Sendable {
    /// Latency buckets in seconds, from 0.25 ms to 10 s.
    public static let defaultSecondsBuckets: [Double] = [
        0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
    ]

    var counts: [UInt64]
    var sum: Double = 0
    var count: UInt64 = 0

    init(bucketCount: Int) { counts = Array(repeating: 0, count: bucketCount) }

    mutating func record(_ value: Double, inBucket index: Int) {
        counts[index] += 1
        sum += value
        count += 1
    }
}

/// Histograms sharing a name and buckets, one series per label-value tuple.
public final class HistogramFamily: MetricFamily, Sendable {
    public let name: String
    let help: String
    let labelNames: [String]
    let buckets: [Double]
    private let series: Lock<[[String]: Histogram]>

    init(name: String, help: String, labelNames: [String], buckets: [Double]) {
        self.name = name
        self.help = help
        self.labelNames = labelNames
        self.buckets = buckets.sorted()
        self.series = Lock([:])
    }

    /// Records one observation in the series with these label values.
    public func observe(_ value: Double, _ labelValues: String...) {
        observe(value, labelValues: labelValues)
    }

    public func observe(_ value: Double, labelValues: [String]) {
        precondition(labelValues.count == labelNames.count, "\(name): wrong number of label values")
        let index = buckets.firstIndex(where: { value <= $0 }) ?? buckets.count
        // In place (the dictionary's defaulted subscript): a copy taken out and stored back
        // would copy the bucket array on every request, inside the lock.
        series.withLock { all in
            all[labelValues, default: Histogram(bucketCount: buckets.count + 1)].record(value, inBucket: index)
        }
    }

    /// How many observations one series holds.
    public func count(_ labelValues: String...) -> UInt64 {
        series.withLock { $0[labelValues]?.count ?? 0 }
    }

    func render(into output: inout String) {
        output += "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        for (values, histogram) in series.withLock({ $0 }).sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            let labels = Array(zip(labelNames, values))
            var cumulative: UInt64 = 0
            for (index, bound) in buckets.enumerated() {
                cumulative += histogram.counts[index]
                output += name + "_bucket" + MetricsRegistry.labelText(labels + [("le", MetricsRegistry.number(bound))])
                output += " \(cumulative)\n"
            }
            cumulative += histogram.counts[buckets.count]
            output += name + "_bucket" + MetricsRegistry.labelText(labels + [("le", "+Inf")]) + " \(cumulative)\n"
            output += name + "_sum" + MetricsRegistry.labelText(labels) + " " + MetricsRegistry.number(histogram.sum) + "\n"
            output += name + "_count" + MetricsRegistry.labelText(labels) + " \(histogram.count)\n"
        }
    }
}
