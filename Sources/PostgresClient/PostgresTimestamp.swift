import Foundation

/// `timestamptz` text in the ISO `DateStyle` the client sets on every connection,
/// e.g. `2026-11-29 14:42:37.123456+00` or `…+05:30`.
enum PostgresTimestamp {
    /// Formats in UTC with microseconds. Digits are written directly: `String(format:)` went
    /// through Foundation's format parser on every login's bind (5 % of the broker's CPU
    /// under the login benchmark, by linux-perf).
    static func format(_ date: Date) -> String {
        let totalMicros = (date.timeIntervalSince1970 * 1_000_000).rounded(.down)
        var seconds = time_t((totalMicros / 1_000_000).rounded(.down))
        let micros = Int(totalMicros - Double(seconds) * 1_000_000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        // "YYYY-MM-DD HH:MM:SS.ffffff+00": 29 bytes; room for a year of more digits.
        return String(unsafeUninitializedCapacity: 40) { buffer in
            var index = 0
            func put(_ value: Int, _ digits: Int, _ separator: UInt8) {
                var width = 1
                var rest = value / 10
                while rest > 0 {
                    width += 1
                    rest /= 10
                }
                var remaining = value
                for position in stride(from: index + max(digits, width) - 1, through: index, by: -1) {
                    buffer[position] = UInt8(ascii: "0") + UInt8(remaining % 10)
                    remaining /= 10
                }
                index += max(digits, width)
                buffer[index] = separator
                index += 1
            }
            put(Int(parts.tm_year) + 1900, 4, UInt8(ascii: "-"))
            put(Int(parts.tm_mon) + 1, 2, UInt8(ascii: "-"))
            put(Int(parts.tm_mday), 2, UInt8(ascii: " "))
            put(Int(parts.tm_hour), 2, UInt8(ascii: ":"))
            put(Int(parts.tm_min), 2, UInt8(ascii: ":"))
            put(Int(parts.tm_sec), 2, UInt8(ascii: "."))
            put(micros, 6, UInt8(ascii: "+"))
            buffer[index] = UInt8(ascii: "0")
            buffer[index + 1] = UInt8(ascii: "0")
            return index + 2
        }
    }

    /// Parses `YYYY-MM-DD HH:MM:SS[.ffffff](+|-)HH[:MM[:SS]]`; nil for anything else
    /// (`infinity`, BC dates), which this service never stores.
    static func parse(_ text: String) -> Date? {
        let bytes = Array(text.utf8)
        var index = 0

        func number(_ digits: Int) -> Int? {
            guard index + digits <= bytes.count else { return nil }
            var value = 0
            for _ in 0..<digits {
                let c = bytes[index]
                guard c >= 48, c <= 57 else { return nil }
                value = value * 10 + Int(c - 48)
                index += 1
            }
            return value
        }
        func expect(_ c: Character) -> Bool {
            guard index < bytes.count, bytes[index] == c.asciiValue! else { return false }
            index += 1
            return true
        }

        guard let year = number(4), expect("-"), let month = number(2), expect("-"), let day = number(2),
            expect(" "), let hour = number(2), expect(":"), let minute = number(2), expect(":"),
            let second = number(2)
        else { return nil }
        var fraction = 0.0
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            var scale = 0.1
            while index < bytes.count, bytes[index] >= 48, bytes[index] <= 57 {
                fraction += Double(bytes[index] - 48) * scale
                scale /= 10
                index += 1
            }
        }
        guard index < bytes.count else { return nil }
        let sign: Int
        switch bytes[index] {
        case UInt8(ascii: "+"): sign = 1
        case UInt8(ascii: "-"): sign = -1
        default: return nil
        }
        index += 1
        guard let offsetHours = number(2) else { return nil }
        var offsetSeconds = offsetHours * 3600
        if expect(":"), let offsetMinutes = number(2) {
            offsetSeconds += offsetMinutes * 60
            if expect(":"), let extra = number(2) { offsetSeconds += extra }
        }
        guard index == bytes.count else { return nil }

        var parts = tm()
        parts.tm_year = Int32(year - 1900)
        parts.tm_mon = Int32(month - 1)
        parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(hour)
        parts.tm_min = Int32(minute)
        parts.tm_sec = Int32(second)
        let epoch = timegm(&parts)
        return Date(timeIntervalSince1970: Double(epoch - sign * offsetSeconds) + fraction)
    }
}
