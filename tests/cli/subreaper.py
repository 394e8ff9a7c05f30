#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run a command as a child subreaper and record how it and every process it leaves behind exit.

usage: subreaper.py STATUS_FILE COMMAND [ARG...]

`mount -t fuse.weightfs STORE MNT` returns once the weightfs daemon has forked itself into the
background; the daemon is then reparented to this process (PR_SET_CHILD_SUBREAPER) instead of init,
so its exit status can be seen. Lines are appended to STATUS_FILE as things happen:
    command EXIT     COMMAND exited with EXIT (-N: killed by signal N)
    exit PID EXIT    a process it left behind exited with EXIT
    signal PID SIG   ... was killed by signal SIG
Exits when no descendant is left, with COMMAND's status (2 when this script itself fails).
"""
import ctypes
import os
import sys

PR_SET_CHILD_SUBREAPER = 36


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("subreaper.py: prctl(PR_SET_CHILD_SUBREAPER): " + os.strerror(ctypes.get_errno()),
              file=sys.stderr)
        return 2
    rc = 2
    with open(sys.argv[1], "a", buffering=1) as out:
        child = os.fork()
        if child == 0:
            try:
                os.execvp(sys.argv[2], sys.argv[2:])
            except OSError as e:
                print(f"subreaper.py: {sys.argv[2]}: {e.strerror}", file=sys.stderr)
            os._exit(127)
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid == child:
                rc = os.waitstatus_to_exitcode(status)
                out.write(f"command {rc}\n")
            elif os.WIFEXITED(status):
                out.write(f"exit {pid} {os.WEXITSTATUS(status)}\n")
            elif os.WIFSIGNALED(status):
                out.write(f"signal {pid} {os.WTERMSIG(status)}\n")
    return rc if rc >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
