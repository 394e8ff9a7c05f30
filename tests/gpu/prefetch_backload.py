#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Backload after a prefetch, against cold and warm (issue 12: a backload right after a completed
prefetch runs at >= 0.9x the warm rate). Runs on the GPU machine as root, a weightfs mount given:

    prefetch_backload.py MNT [SIZE_GIB] [ROUNDS]

Writes SIZE_GIB of random bytes through the mount, then per round: drop caches + backload (cold);
drop caches + weightfs.prefetch(...).wait() + backload (after prefetch); backload again (warm).
Prints GB/s medians and the ratio after-prefetch / warm."""
import os
import statistics
import sys
import time

import torch
import weightfs


def drop():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    mnt = sys.argv[1]
    size = int(float(sys.argv[2]) * (1 << 30)) if len(sys.argv) > 2 else 2 << 30
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    path = os.path.join(mnt, "prefetch.bin")
    with open(path, "wb") as f:
        for _ in range(size >> 26):
            f.write(os.urandom(1 << 26))
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    stager = weightfs.Stager()

    def backload():
        torch.cuda.synchronize()
        t = time.perf_counter()
        weightfs.backload(path, dev, stager=stager)
        torch.cuda.synchronize()
        return size / (time.perf_counter() - t) / 1e9

    res = {"cold": [], "after prefetch": [], "warm": [], "prefetch": []}
    for _ in range(rounds):
        drop()
        res["cold"].append(backload())
        drop()
        t = time.perf_counter()
        weightfs.prefetch([path]).wait()
        res["prefetch"].append(size / (time.perf_counter() - t) / 1e9)
        res["after prefetch"].append(backload())
        res["warm"].append(backload())
    med = {k: statistics.median(v) for k, v in res.items()}
    for k, v in res.items():
        print(f"  {k:16s} median {med[k]:6.2f} GB/s  runs " + " ".join(f"{x:.2f}" for x in v))
    print(f"  after prefetch / warm = {med['after prefetch'] / med['warm']:.2f}  (goal >= 0.9)")
    print(f"  cold / warm = {med['cold'] / med['warm']:.2f}")
    os.unlink(path)


if __name__ == "__main__":
    main()
