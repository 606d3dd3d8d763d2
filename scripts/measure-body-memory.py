#!/usr/bin/env python3
"""Peak memory of a running broker under the worst request-body input (issue 29, item 2).

Opens CONNECTIONS connections to the broker and sends on every one a POST whose body is the
largest allowed (BROKER_MAX_BODY_BYTES, announced by Content-Length or, with --chunked, in
one chunk), all but its last byte (or last chunk), so that every
connection holds a body at the limit at the same time; then prints the broker's peak resident
memory (VmHWM of /proc/PID/status) against its resident memory before, and what that is per
connection. Then it sends the last bytes (every body reaches a handler) and prints the peak
again. The bodies must all be in within BROKER_HEADER_TIMEOUT_SECONDS (10 s by default) of
each connection opening, or the broker cuts them off: the script says how long it took.

    scripts/measure-body-memory.py --pid PID --port 8080 [--connections 1024] [--body 65536] [--chunked]

Run it against a broker started for the purpose (VmHWM never goes down): for example
`BROKER_LISTEN=127.0.0.1:8080 .build/release/appleid-broker serve` with the settings of
scripts/run.sh. Needs `ulimit -n` above the connection count (it raises its own soft limit).
"""
import argparse
import resource
import socket
import time


def status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"no {field} for pid {pid}")


def mib(n):
    return f"{n / 1048576:.1f} MiB"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--connections", type=int, default=1024)
    parser.add_argument("--body", type=int, default=65536, help="BROKER_MAX_BODY_BYTES")
    parser.add_argument("--path", default="/v1/apple/login")
    parser.add_argument("--chunked", action="store_true", help="send the bodies chunked (the server cannot size them ahead)")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    before_rss = status(args.pid, "VmRSS")
    before_peak = status(args.pid, "VmHWM")
    framing = "Transfer-Encoding: chunked" if args.chunked else f"Content-Length: {args.body}"
    head = f"POST {args.path} HTTP/1.1\r\nHost: {args.host}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n".encode()
    body = b'{"identity_token":"' + b"a" * (args.body - 21) + b'"}'
    assert len(body) == args.body
    # All but the end: the last byte, or the last chunk.
    if args.chunked:
        body, end = b"%x\r\n" % len(body) + body + b"\r\n", b"0\r\n\r\n"
    else:
        body, end = body[:-1], body[-1:]
    started = time.monotonic()
    sockets = []
    for _ in range(args.connections):
        s = socket.create_connection((args.host, args.port), timeout=10)
        s.sendall(head + body)
        sockets.append(s)
    loaded = time.monotonic() - started
    time.sleep(1)  # let the workers read what is in the socket buffers
    held = [s for s in sockets if not closed(s)]
    peak_held = status(args.pid, "VmHWM")
    print(f"connections: {args.connections} (all open after {loaded:.1f} s: {len(held)}), body {args.body} bytes each")
    print(f"resident before: {mib(before_rss)} (peak so far {mib(before_peak)})")
    print(
        f"peak with every body held: {mib(peak_held)}: +{mib(peak_held - before_rss)},"
        f" {(peak_held - before_rss) / max(1, len(held)) / 1024:.0f} KiB per connection"
    )
    for s in held:
        s.sendall(end)
    answered = 0
    for s in held:
        try:
            if s.recv(64).startswith(b"HTTP/1.1 "):
                answered += 1
        except OSError:
            pass
    peak_all = status(args.pid, "VmHWM")
    print(f"answered: {answered}; peak with the handlers run: {mib(peak_all)}: +{mib(peak_all - before_rss)}")
    for s in sockets:
        s.close()


def closed(s):
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


if __name__ == "__main__":
    main()
