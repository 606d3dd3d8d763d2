import BrokerCore
import Foundation

/// A bar chart of the last days, one bar a day stacked by category: server-rendered SVG (no
/// script; colours and type from the console's stylesheet, so the CSP's `style-src 'self'`
/// holds), its totals as the image's accessible name, and every figure in a table for screen
/// readers, axe and anyone who wants the numbers. Bounded by construction: the days asked for
/// and the series given (the overview keeps both small).
struct DailyChart {
    struct Series {
        /// What a bar segment counts, in words.
        var label: String
        /// The stylesheet's class for its colour (`c-good`, `c-bad`, …).
        var style: String
        /// One value per day, oldest first.
        var values: [Int]
    }

    /// Unique on the page (element ids are derived from it).
    var id: String
    var title: String
    /// Midnight UTC of each day, oldest first.
    var days: [Date]
    var series: [Series]

    /// The last `count` UTC days up to `now`'s, oldest first.
    static func lastDays(_ count: Int, now: Date = Date()) -> [Date] {
        let today = floor(now.timeIntervalSince1970 / 86_400) * 86_400
        return (0..<count).reversed().map { Date(timeIntervalSince1970: today - Double($0) * 86_400) }
    }

    /// A chart of `counts` (day × category), one series per category in `categories` order;
    /// a count on a day outside `days` or of another category is left out.
    init(id: String, title: String, days: [Date], counts: [DailyCount], categories: [(key: String, label: String, style: String)])
    {
        self.id = id
        self.title = title
        self.days = days
        var index: [Int: Int] = [:]
        for (position, day) in days.enumerated() { index[Int(day.timeIntervalSince1970 / 86_400)] = position }
        series = categories.map { category in
            var values = Array(repeating: 0, count: days.count)
            for count in counts where count.category == category.key {
                if let position = index[Int(floor(count.day.timeIntervalSince1970 / 86_400))] { values[position] += count.count }
            }
            return Series(label: category.label, style: category.style, values: values)
        }
    }

    var totals: [Int] { days.indices.map { day in series.reduce(0) { $0 + $1.values[day] } } }

    /// What the picture says, for its accessible name: the sum of each series over the days.
    var summary: String {
        let sums = series.map { "\($0.label) \($0.values.reduce(0, +))" }.joined(separator: ", ")
        return "\(title), last \(days.count) days: \(sums)"
    }

    static func dayLabel(_ day: Date) -> String { String(RFC3339Date.dayString(day).dropFirst(5)) }  // MM-DD

    /// The figure: the SVG, a legend, and the figures in a table behind a disclosure.
    var html: HTML {
        let width = 640.0
        let height = 200.0
        let (left, right, top, bottom) = (44.0, 8.0, 12.0, 26.0)
        let plotWidth = width - left - right
        let plotHeight = height - top - bottom
        let scale = Self.niceMaximum(totals.max() ?? 0)
        let slot = plotWidth / Double(max(days.count, 1))
        let barWidth = (slot * 0.7).rounded()
        var shapes: [HTML] = []
        for (position, day) in days.enumerated() {
            let x = left + Double(position) * slot + (slot - barWidth) / 2
            var base = top + plotHeight
            for series in series where series.values[position] > 0 {
                let extent = plotHeight * Double(series.values[position]) / Double(scale)
                base -= extent
                shapes.append(
                    "<rect class=\"\(series.style)\" x=\"\(Self.number(x))\" y=\"\(Self.number(base))\" width=\"\(Self.number(barWidth))\" height=\"\(Self.number(extent))\"><title>\(Self.dayLabel(day)): \(series.label) \(series.values[position])</title></rect>"
                )
            }
            if position % 2 == (days.count - 1) % 2 {
                shapes.append(
                    "<text x=\"\(Self.number(left + Double(position) * slot + slot / 2))\" y=\"\(Self.number(height - 8))\" text-anchor=\"middle\">\(Self.dayLabel(day))</text>"
                )
            }
        }
        let axis: HTML = """
            <line class="axis" x1="\(Self.number(left))" y1="\(Self.number(top + plotHeight))" x2="\(Self.number(width - right))" y2="\(Self.number(top + plotHeight))"></line>\
            <line class="grid" x1="\(Self.number(left))" y1="\(Self.number(top))" x2="\(Self.number(width - right))" y2="\(Self.number(top))"></line>\
            <text x="\(Self.number(left - 6))" y="\(Self.number(top + 4))" text-anchor="end">\(scale)</text>\
            <text x="\(Self.number(left - 6))" y="\(Self.number(top + plotHeight + 4))" text-anchor="end">0</text>
            """
        let legend = HTML.join(
            series.map { "<li><span class=\"swatch \($0.style)\" aria-hidden=\"true\"></span>\($0.label)</li>" })
        let totals = totals
        let rows: [[HTML]] = days.enumerated().map { position, day in
            let day: HTML = "\(RFC3339Date.dayString(day))"
            let values: [HTML] = series.map { "\($0.values[position])" }
            let total: HTML = "\(totals[position])"
            return [day] + values + [total]
        }
        return """
            <figure class="chart" id="\(id)"><figcaption>\(title)</figcaption>
            <svg class="chart" viewBox="0 0 \(Int(width)) \(Int(height))" role="img" aria-label="\(summary)" focusable="false">\(axis)\(shapes)</svg>
            <ul class="legend">\(legend)</ul>
            <details><summary>The figures: \(title.prefix(1).lowercased() + title.dropFirst())</summary>
            \(HTML.table(caption: "\(title), per day (UTC)", headers: ["Day"] + series.map(\.label) + ["Total"], rows: rows))
            </details></figure>
            """
    }

    /// The axis' top: 1, 2 or 5 times a power of ten, at least `value` (and at least 1).
    static func niceMaximum(_ value: Int) -> Int {
        var step = 1
        while true {
            for factor in [1, 2, 5] where factor * step >= max(value, 1) { return factor * step }
            step *= 10
        }
    }

    static func number(_ value: Double) -> String { String(format: "%.1f", value) }
}
