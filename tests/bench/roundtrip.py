#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The FUSE round-trip floor: what one request costs with no work in the daemon.

    tests/bench/roundtrip.py MNT [DIR]

getxattr(2) of a security.* name on MNT is sent to the daemon and answered ENODATA at once (no lock,
no catalog: fs/xattr.c); on DIR (a plain directory, for scale) it is a syscall. Prints the mean of
20,000 calls in microseconds for each. Every FUSE request a create, rename or unlink sends costs at
least this: docs/benchmarks.md (issue 10) multiplies it by the requests each operation sends.
"""
import os
import sys
import time


def per_call_us(path, n=20000):
    t = time.perf_counter()
    for _ in range(n):
        try:
            os.getxattr(path, "security.weightfs-roundtrip")
        except OSError:
            pass
    return (time.perf_counter() - t) / n * 1e6


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("%s: %.1f us per getxattr (a FUSE round trip)" % (sys.argv[1], per_call_us(sys.argv[1])))
    if len(sys.argv) == 3:
        print("%s: %.1f us per getxattr (a syscall)" % (sys.argv[2], per_call_us(sys.argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
