#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a small tensor's time goes, call by call: bench_plain's "small" pattern, timed per syscall.

    tests/bench/small_calls.py N DIR [DIR ...]

For each DIR (a plain directory, a weightfs mount, ...) writes N tensors of 4 KiB as SkyRL's offload
does (open a temporary name O_WRONLY|O_CREAT|O_TRUNC, write, close, os.replace over the name, open
it, fstat, map MAP_PRIVATE and read a byte, close) and prints the median microseconds of each call
and their sum, one line per DIR. Run the sides one after the other, more than once, on a quiet
machine; compare with the FUSE round trip (tests/bench/roundtrip.py) and with the requests each
call sends (bench_plain.py's last column; docs/benchmarks.md, "small").
"""
import mmap
import os
import statistics
import sys
import time

CALLS = ("open_tmp", "write", "close_w", "replace", "open", "fstat", "mmap+touch", "close_r")


def run(d, n):
    """{call: [microseconds]} for @n tensors written and mapped under directory @d."""
    os.makedirs(d, exist_ok=True)
    times = {k: [] for k in CALLS}
    now = time.perf_counter_ns
    buf = bytearray(os.urandom(4096))
    for i in range(n):
        buf[:8] = i.to_bytes(8, "little")  # distinct content: no tensor is a copy of another
        path = os.path.join(d, "t%d" % i)
        tmp = path + ".tmp"
        t = [now()]
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        t.append(now())
        os.write(fd, buf)
        t.append(now())
        os.close(fd)
        t.append(now())
        os.replace(tmp, path)
        t.append(now())
        fd = os.open(path, os.O_RDONLY)
        t.append(now())
        size = os.fstat(fd).st_size
        t.append(now())
        m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ)
        _ = m[0]
        m.close()
        t.append(now())
        os.close(fd)
        t.append(now())
        for k, a, b in zip(CALLS, t, t[1:]):
            times[k].append((b - a) / 1000)
    return times


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    n = int(sys.argv[1])
    for d in sys.argv[2:]:
        times = run(d, n)
        med = {k: statistics.median(v) for k, v in times.items()}
        print("%s: %s | sum %.1f us" % (d, " ".join("%s %.1f" % (k, med[k]) for k in CALLS), sum(med.values())),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
