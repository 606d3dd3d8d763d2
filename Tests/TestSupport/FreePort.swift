import Glibc

/// A loopback TCP port nobody listens on right now (the kernel's pick), for a child process
/// that must be told its port up front. Random ports collide with whatever else runs here.
public enum FreePort {
    public static func next() -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        precondition(descriptor >= 0, "socket() failed")
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
                bind(descriptor, generic, length) == 0 && getsockname(descriptor, generic, &length) == 0
            }
        }
        precondition(bound, "bind() to 127.0.0.1:0 failed")
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
