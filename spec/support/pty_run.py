#!/usr/bin/env python3
# spec/support/pty_run.py -- runs one command with some of its standard
# descriptors on a fresh pseudo-terminal (its controlling terminal), for the
# specs of what `moonjob` shows on a terminal (spec/support/terminal.lua).
#
# One argument: a JSON object
#   argv        the command (a list; run through PATH)
#   tty         the descriptors on the terminal, e.g. [0, 2]
#   stdin       a file for fd 0 when it is not on the terminal (default /dev/null)
#   stdout      "pipe" (read here, written to `stdout_file`), or a file path,
#               when fd 1 is not on the terminal
#   stderr      a file path when fd 2 is not on the terminal
#   steps       [{"wait": regex, "send": text}], in order: once the
#               terminal's transcript (after the previous step's match) matches
#               `wait`, `send` is typed ("\u0004" is Ctrl-D)
#   transcript  the file that gets what the terminal showed
#   stdout_file the file that gets what the pipe on fd 1 carried
#   timeout     seconds before the command is killed (a hang catcher)
# Prints the command's exit status (128 + N for signal N; 124 after the
# timeout). The terminal is 80 columns by 24 rows, in its default mode (echo
# on, \n shown as \r\n).
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time


def main():
    spec = json.loads(sys.argv[1])
    tty = set(spec.get("tty", [0, 1, 2]))
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    out_r = None
    if 1 not in tty and spec.get("stdout") == "pipe":
        out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        files = {0: spec.get("stdin", "/dev/null"), 1: spec.get("stdout", "/dev/null"),
                 2: spec.get("stderr", "/dev/null")}
        for fd in (0, 1, 2):
            if fd in tty:
                os.dup2(slave, fd)
            elif fd == 1 and out_r is not None:
                os.dup2(out_w, 1)
            else:
                mode = os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                f = os.open(files[fd], mode, 0o644)
                os.dup2(f, fd)
                os.close(f)
        os.closerange(3, 1024)
        try:
            os.execvp(spec["argv"][0], spec["argv"])
        finally:
            os._exit(127)
    os.close(slave)
    if out_r is not None:
        os.close(out_w)
    transcript, piped = bytearray(), bytearray()
    steps = list(spec.get("steps", []))
    searched_from = 0
    deadline = time.monotonic() + spec.get("timeout", 60)
    status = None
    open_fds = [master] + ([out_r] if out_r is not None else [])
    while open_fds:
        if time.monotonic() > deadline and status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = 124
        ready, _, _ = select.select(open_fds, [], [], 0.05)
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every holder of the terminal closed it
                chunk = b""
            if not chunk:
                open_fds.remove(fd)
            elif fd == master:
                transcript += chunk
            else:
                piped += chunk
        while steps:
            m = re.search(steps[0]["wait"].encode(), bytes(transcript[searched_from:]))
            if not m:
                break
            searched_from += m.end()
            os.write(master, steps.pop(0)["send"].encode())
        if status is None:
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(wstatus)
                if status < 0:
                    status = 128 - status
                deadline = time.monotonic() + 5  # what is left to read
        elif time.monotonic() > deadline:
            break
    if status is None:
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    with open(spec["transcript"], "wb") as f:
        f.write(transcript)
    if spec.get("stdout_file"):
        with open(spec["stdout_file"], "wb") as f:
            f.write(piped)
    print(status)


main()
