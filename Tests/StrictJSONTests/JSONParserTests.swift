import StrictJSON
import Testing

@Suite("StrictJSON")
struct JSONParserTests {
    private func parse(_ text: String) throws -> JSONValue { try JSONValue.parse(Array(text.utf8)) }

    @Test("reads every JSON type and keeps true apart from 1 and \"true\"")
    func types() throws {
        let value = try parse(#"{"s":"x","i":-12,"d":1.5,"e":2e3,"t":true,"f":false,"n":null,"a":[1,"2",[]],"o":{}}"#)
        let object = try #require(value.objectValue)
        #expect(object["s"] == "x")
        #expect(object["i"] == .integer(-12))
        #expect(object["d"] == .double(1.5))
        #expect(object["e"] == .double(2000))
        #expect(object["t"] == .bool(true))
        #expect(object["t"] != .integer(1))
        #expect(object["f"]?.lenientBoolValue == false)
        #expect(object["n"] == .null)
        #expect(object["a"] == .array([1, "2", .array([])]))
        #expect(object["o"] == .object([:]))
        #expect(JSONValue.string("true").lenientBoolValue == true)
    }

    @Test("integers are exact up to Int64's limits; beyond them they are doubles")
    func integers() throws {
        #expect(try parse("0") == .integer(0))
        #expect(try parse("-0") == .integer(0))
        #expect(try parse("999999999999999999") == .integer(999_999_999_999_999_999))
        #expect(try parse("-999999999999999999") == .integer(-999_999_999_999_999_999))
        #expect(try parse("9223372036854775807") == .integer(Int64.max))
        #expect(try parse("-9223372036854775808") == .integer(Int64.min))
        #expect(try parse("9223372036854775808") == .double(9_223_372_036_854_775_808))
        #expect(try parse("1796057647000") == .integer(1_796_057_647_000), "Apple's event_time in milliseconds")
        #expect(try parse("12.0") == .double(12))
        #expect(try parse("[1,22,333]") == .array([1, 22, 333]))
    }

    @Test("duplicate member names are refused, also when one is escaped")
    func duplicates() {
        #expect(throws: JSONParseError.self) { try parse(#"{"aud":"a","aud":"b"}"#) }
        #expect(throws: JSONParseError.self) { try parse(#"{"aud":"a","\u0061ud":"b"}"#) }
        #expect(throws: JSONParseError.self) { try parse(#"{"x":{"k":1,"k":2}}"#) }
        #expect((try? parse(#"{"a":{"k":1},"b":{"k":2}}"#)) != nil, "the same name in different objects is fine")
    }

    @Test("escapes and surrogate pairs decode; lone surrogates, control characters and invalid UTF-8 are refused")
    func strings() throws {
        #expect(try parse(#""a\"b\\c\/d\n\u00e9\ud83c\udf4f""#) == .string("a\"b\\c/d\né🍏"))
        #expect(throws: JSONParseError.self) { try parse(#""\ud83c""#) }
        #expect(throws: JSONParseError.self) { try parse(#""\udf4f""#) }
        #expect(throws: JSONParseError.self) { try parse("\"a\u{1}b\"") }
        #expect(throws: JSONParseError.self) { try JSONValue.parse([0x22, 0xC3, 0x28, 0x22]) }
        #expect(throws: JSONParseError.self) { try parse(#""\x""#) }
    }

    @Test("malformed numbers, trailing text, deep nesting and non-objects are refused where asked")
    func malformed() {
        for text in ["01", "1.", ".5", "-", "1e", "+1", "{", "[1,]", #"{"a":1,}"#, "nul", "1 2", "{} x", ""] {
            #expect(throws: JSONParseError.self, "\(text)") { try parse(text) }
        }
        let deep = String(repeating: "[", count: 40) + String(repeating: "]", count: 40)
        #expect(throws: JSONParseError.self) { try parse(deep) }
        #expect(throws: JSONParseError.self) { try JSONValue.parseObject(Array("[1]".utf8)) }
    }

    @Test("members(ofObject:named:) accepts exactly what parseObject accepts and reads the same values")
    func selectedMembers() throws {
        var cases = [
            #"{"iss":"https://appleid.apple.com","aud":["a","b"],"exp":1796057647,"email_verified":"true","n":null}"#,
            #"{"aud":"a","aud":"b"}"#, #"{"aud":"a","\u0061ud":"b"}"#, #"{"\u0061ud":"a"}"#, #"{"x":{"k":1,"k":2}}"#,
            #"{"é":1,"e\u0301":2}"#, #"{"é":1,"\u00e9":2}"#, #"{"K":1,"\u212a":2}"#, "{\"\u{212A}\":1,\"K\":2}", #"{"\u212a":1}"#,
            #"{"s":"\ud83c"}"#, #"{"s":"a\u0000b","t":"\n"}"#, #"{"abc":1,"abd":2}"#, #"{"abc":1,"abc":2}"#, #"{"a":01}"#,
            #"{"a":-0.5e3,"b":[{}]}"#, #"{"t":true,"f":false,"z":null,"e":"","u":"é€","q":"a\"b","s":" x ","o":{"p":"é"}}"#,
            #"{"a":tru}"#, #"{"a":1,}"#, #"{"a" 1}"#, #"{} x"#, "[1]", #""s""#, "{", "", " { } ", #"{"a":5.0e322}"#,
            "{\"a\":\"\u{1}\"}", #"{"deep":"# + String(repeating: "[", count: 40) + String(repeating: "]", count: 40) + "}",
        ]
        // Past the 32 names compared one by one: distinct names, then one repeated at the
        // end, then one repeated after an escaped name moved the check to a set.
        let many = (0..<40).map { #""m\#($0)":\#($0)"# }
        cases.append("{" + many.joined(separator: ",") + "}")
        cases.append("{" + many.joined(separator: ",") + #","m3":0}"#)
        cases.append(#"{"m1":1,"\u006d2":2,"m2":3}"#)
        let names: [StaticString] = ["iss", "aud", "exp", "email_verified", "n", "K", "a", "m3", "m39", "absent"]
        for text in cases {
            let bytes = Array(text.utf8)
            let strict = try? JSONValue.parseObject(bytes)
            let selected = try? JSONValue.members(ofObject: bytes, named: names)
            #expect(
                (strict == nil) == (selected == nil),
                "\(text): parseObject \(strict == nil ? "refused" : "accepted"), members disagrees")
            guard let strict, let selected else { continue }
            for (position, name) in names.enumerated() {
                #expect(selected[position] == strict[name.description], "\(text): \(name)")
            }
        }
        // Invalid UTF-8 in a member not asked for is still refused.
        #expect(throws: JSONParseError.self) {
            try JSONValue.members(ofObject: [0x7B, 0x22, 0x62, 0x22, 0x3A, 0x22, 0xC3, 0x28, 0x22, 0x7D], named: ["a"])
        }
    }

    @Test("serialization is compact, sorted and round-trips through the parser")
    func serialization() throws {
        let value: JSONValue = .object(["b": "x\"y\n\u{1}", "a": .array([.integer(1), .double(0.5), .bool(false), .null])])
        let text = String(decoding: value.serialized(), as: UTF8.self)
        #expect(text == #"{"a":[1,0.5,false,null],"b":"x\"y\n\u0001"}"#)
        #expect(try JSONValue.parse(value.serialized()) == value)
    }
}
