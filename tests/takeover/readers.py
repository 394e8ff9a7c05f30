#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Rewrites beside readers that map (tests/takeover/run-readers): one process rewrites PATH whole
(open 'wb', SIZE bytes of one value, close) in a loop; another opens and maps it read-only, keeping
its last 8 mappings, and checks each before letting it go: all SIZE bytes hold the value of the
last rewrite that had finished when it opened. A rewrite sets a shared sequence odd while it writes
and even once it has closed, so a mapping opened between two even reads of the same value must
hold that rewrite's bytes; they stay, since a rewrite beside readers moves the name to a new inode
(fs/core/openmode.h) and leaves theirs as it was.

Usage: readers.py PATH SECONDS [SIZE]. Prints one line per error and a summary
"readers: W rewrites, M maps checked, E errors, B wrong"; exits 1 if E or B is not 0.
"""
import mmap
import multiprocessing as mp
import os
import sys
import time


def value(k):
    return k % 251 + 1


def writer(path, size, seconds, seq, errors, rewrites):
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        k += 1
        seq.value = 2 * k - 1
        try:
            with open(path, "wb") as f:
                f.write(bytes([value(k)]) * size)
        except OSError as e:
            errors.value += 1
            print(f"rewrite {k}: {e!r}", flush=True)
            continue  # the sequence stays odd: no reader checks what a failed rewrite left
        seq.value = 2 * k
        rewrites.value = k
        time.sleep(0.001)


def reader(path, size, seconds, seq, errors, wrong, checked):
    end = time.monotonic() + seconds
    maps = []

    def check(m, fd, k):
        got = m[:]
        checked.value += 1
        if got != bytes([value(k)]) * size:
            wrong.value += 1
            print(f"mapping opened after rewrite {k}: {len(got)} bytes, values "
                  f"{sorted(set(got))[:8]}, expected {value(k)}", flush=True)
        m.close()
        os.close(fd)

    while time.monotonic() < end:
        s0 = seq.value
        if s0 % 2 or s0 == 0:
            time.sleep(0.0005)
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            errors.value += 1
            print(f"open for reading: {e!r}", flush=True)
            continue
        if seq.value != s0:
            os.close(fd)  # a rewrite began meanwhile: what this open found is not known
            continue
        try:
            m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        except (OSError, ValueError) as e:
            errors.value += 1
            print(f"mmap after rewrite {s0 // 2}: {e!r}", flush=True)
            os.close(fd)
            continue
        maps.append((m, fd, s0 // 2))
        if len(maps) > 8:
            check(*maps.pop(0))
        time.sleep(0.002)
    for x in maps:
        check(*x)


def main():
    path, seconds = sys.argv[1], float(sys.argv[2])
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 2 << 20
    seq = mp.Value("l", 0, lock=False)
    errors, wrong, checked, rewrites = (mp.Value("l", 0) for _ in range(4))
    ps = [mp.Process(target=writer, args=(path, size, seconds, seq, errors, rewrites)),
          mp.Process(target=reader, args=(path, size, seconds, seq, errors, wrong, checked))]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
        if p.exitcode:
            errors.value += 1
            print(f"a workload process died (exit {p.exitcode})", flush=True)
    print(f"readers: {rewrites.value} rewrites, {checked.value} maps checked, {errors.value} errors, "
          f"{wrong.value} wrong", flush=True)
    return 1 if errors.value or wrong.value else 0


if __name__ == "__main__":
    sys.exit(main())
