// Runs libFuzzer (linked by `-sanitize=fuzzer`) from a Swift `main`: SwiftPM gives every
// executable its own entry point, so the fuzz targets hand their body to libFuzzer's
// driver instead of exporting LLVMFuzzerTestOneInput and leaving `main` to libFuzzer.

// swift-format-ignore: AlwaysUseLowerCamelCase
@_silgen_name("LLVMFuzzerRunDriver")
private func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

// libFuzzer calls back on the thread that called it, one input at a time.
nonisolated(unsafe) private var fuzzBody: ((UnsafeRawBufferPointer) -> Void)?

/// Hands `body` to libFuzzer with this process's arguments (corpus directories, -max_total_time, …)
/// and exits with its status. `body` must not crash on any input.
public func runFuzzer(_ body: @escaping (UnsafeRawBufferPointer) -> Void) -> Never {
    fuzzBody = body
    var argc = CommandLine.argc
    var argv = CommandLine.unsafeArgv
    exit(LLVMFuzzerRunDriver(&argc, &argv) { data, count in fuzzOne(data, count) })
}

/// The entry point libFuzzer's objects refer to (they are linked whole); the driver above
/// passes its callback explicitly, which lands here too.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    fuzzBody?(UnsafeRawBufferPointer(start: data, count: count))
    return 0
}

@_silgen_name("exit")
private func exit(_ status: CInt) -> Never
