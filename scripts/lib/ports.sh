# free_port: a port nobody listens on now (the kernel's pick), so that a test run beside
# `make run`, or two runs on one machine, never collide on a fixed port. Sourced.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
