#!/usr/bin/env python3
"""Runs one stage of `make test` and measures it: wall seconds and the CPU seconds (user +
system) of the whole process tree, daemons included.

    stage-time.py RESULT_FILE COMMAND [ARGS...]

/usr/bin/time counts only the descendants their parents wait for; a PostgreSQL started
by pg_ctl is re-parented and its CPU would be lost. This process makes itself a child
subreaper (prctl PR_SET_CHILD_SUBREAPER), so every orphan of the stage is re-parented to
it, and reaps them all: its RUSAGE_CHILDREN is then the stage's CPU, whatever else runs on
the machine. Writes "exit wall user system" to RESULT_FILE and exits with the command's
status. A process of the stage still running 10 s after the command ended is named on
stderr (a stage must stop what it starts).
"""
import ctypes
import os
import resource
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def children(of):
    """The pids whose parent is `of` (orphans of the stage re-parented to us)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == of:
            found.append(int(entry))
    return found


def main():
    result_file, command = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("stage-time: prctl(PR_SET_CHILD_SUBREAPER) failed")
    started = time.monotonic()
    child = os.fork()
    if child == 0:
        try:
            os.execvp(command[0], command)
        except OSError as error:
            print(f"stage-time: {command[0]}: {error}", file=sys.stderr)
            os._exit(127)
    # An interrupted run stops the stage too.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: os.kill(child, number))
    status = None
    while status is None:
        pid, wait_status = os.waitpid(-1, 0)
        if pid == child:
            status = os.waitstatus_to_exitcode(wait_status)
            if status < 0:
                status = 128 - status
    wall = time.monotonic() - started
    # Reap what the stage left behind (a daemon stopping as its stage ends) for up to 10 s.
    deadline = time.monotonic() + 10
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() > deadline:
                for pid in children(os.getpid()):
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                            name = cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:200]
                    except OSError:
                        name = "?"
                    print(f"stage-time: the stage left pid {pid} running: {name}", file=sys.stderr)
                break
            time.sleep(0.1)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(result_file, "w") as out:
        out.write(f"{status} {wall:.1f} {usage.ru_utime:.1f} {usage.ru_stime:.1f}\n")
    sys.exit(status)


if __name__ == "__main__":
    main()
