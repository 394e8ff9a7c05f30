#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A file written in small write(2)s, as Python's buffered writer, torch.save and np.save do.

    tests/bench/small_writes.py MNT DIR [--rounds N] [--mib M] [--chunk BYTES]

Writes M MiB (default 64) in write(2)s of BYTES (default 8192) to a new file, open(O_CREAT|O_TRUNC)
to close(2), on MNT (a weightfs mount: the kernel writes such a file through passthrough) and in
DIR (a plain directory of the store's filesystem), N rounds (default 7), sides alternating first, a
second's pause after each file (the seal's hash, or writeback, out of the next one's way). Prints
every round, the medians and the FUSE requests per mounted file (`requests` of user.weightfs.stats):
GETXATTR is the kernel asking for security.capability (docs/benchmarks.md).
"""
import argparse
import json
import os
import statistics
import sys
import time


def requests(mnt):
    return json.loads(os.getxattr(mnt, "user.weightfs.stats"))["since_mount"]["requests"]


def write_one(path, chunk, total):
    buf = os.urandom(chunk)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(total // chunk):
        os.write(fd, buf)
    os.close(fd)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("mnt")
    ap.add_argument("dir")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=8192)
    a = ap.parse_args()
    sides = {"mount": [], "plain": []}
    before = requests(a.mnt)
    for i in range(a.rounds):
        for side in ("mount", "plain") if i % 2 == 0 else ("plain", "mount"):
            root = a.mnt if side == "mount" else a.dir
            sides[side].append(write_one(os.path.join(root, "small-writes-%d" % i), a.chunk, a.mib << 20))
            time.sleep(1.0)
    after = requests(a.mnt)
    for side, secs in sides.items():
        print("%s s: %s" % (side, " ".join("%.3f" % s for s in secs)))
    m, p = statistics.median(sides["mount"]), statistics.median(sides["plain"])
    print("median: mount %.3f s, plain %.3f s (mount / plain %.2f)" % (m, p, m / p))
    per_file = {k: (after[k] - before.get(k, 0)) / a.rounds for k in after if after[k] != before.get(k, 0)}
    print("requests per mounted file: " + ", ".join("%s %.0f" % kv for kv in sorted(per_file.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
