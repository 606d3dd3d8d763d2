import Foundation
import TestSupport
import Testing

/// Where the suites that read `../shared/testdata` find it, and what happens when it is absent:
/// skipped on a developer's machine, a failure with a clear message under `CI=true`.
@Suite("Test-data lookup")
struct TestDataLookupTests {
    let root = URL(fileURLWithPath: "/checkouts/appleid-broker")

    @Test("found beside the checkout, or at APPLEID_BROKER_TESTDATA first")
    func found() {
        #expect(
            TestData.resolve(environment: [:], root: root) { $0 == "/checkouts/shared/testdata" }
                == .found("/checkouts/shared/testdata"))
        #expect(
            TestData.resolve(environment: ["APPLEID_BROKER_TESTDATA": "/vectors", "CI": "true"], root: root) { _ in true }
                == .found("/vectors"))
        // A configured folder that does not exist falls back to the sibling.
        #expect(
            TestData.resolve(environment: ["APPLEID_BROKER_TESTDATA": "/gone"], root: root) { $0 != "/gone" }
                == .found("/checkouts/shared/testdata"))
    }

    @Test("absent: skipped outside CI, required (the suites run and fail) under CI=true")
    func absent() {
        #expect(TestData.resolve(environment: [:], root: root) { _ in false } == .absent)
        #expect(TestData.resolve(environment: ["CI": "false"], root: root) { _ in false } == .absent)
        #expect(TestData.resolve(environment: ["CI": "true"], root: root) { _ in false } == .requiredButAbsent)
        #expect(TestData.resolve(environment: ["CI": "TRUE"], root: root) { _ in false } == .requiredButAbsent)
        let message = TestData.missingMessage(.requiredButAbsent)
        #expect(
            message.contains("CI=true") && message.contains("../shared/testdata") && message.contains("APPLEID_BROKER_TESTDATA"))
        #expect(TestData.missingMessage(.absent) == TestData.skipMessage)
    }
}
