#!/usr/bin/env python3
"""The direct path against the mounted file without passthrough, and native (docs/direct.md).

    bench_direct.py --build BUILD [--mib 1024] [--dir DIR]     (root: drops the page cache)

Mounts a fresh store under DIR (default $TMPDIR) with -o passthrough=off, writes one tensor of MIB
MiB, and reads it by mmap, touching every byte (numpy sum over a uint64 view), cold (page cache
dropped) and warm: through the mounted file, through the direct path (weightfs.open_object), and
natively (a plain file with the same bytes on the store's filesystem). Then the page-cache growth of
4 names with that content read in full, through the mounted files and through the direct path.
Prints a table and one JSON line.
"""

import argparse
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
sys.path.insert(0, os.path.join(repo, "lib", "python"))
sys.path.insert(0, os.path.join(repo, "tests", "python"))
import numpy as np  # noqa: E402
import weightfs  # noqa: E402
import wfstest  # noqa: E402

MIB = 1 << 20


def read_map(fd, size):
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    try:
        t0 = time.perf_counter()
        int(np.frombuffer(m, dtype=np.uint64).sum())
        return time.perf_counter() - t0
    finally:
        m.close()


def timed(open_fd, size, runs=3):
    """(cold seconds, best warm seconds) of an mmap read of the descriptor open_fd() gives."""
    wfstest.drop_caches()
    fd = open_fd()
    try:
        cold = read_map(fd, size)
        warm = min(read_map(fd, size) for _ in range(runs))
    finally:
        os.close(fd)
    return cold, warm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(repo, "build"))
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    os.environ.setdefault("WEIGHTFS_LIB", os.path.join(a.build, "libweightfs.so"))
    work = tempfile.mkdtemp(prefix="wfs-bench-direct.", dir=a.dir)
    store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    size = a.mib * MIB
    body = np.random.default_rng(1).integers(0, 2**63, size // 8, dtype=np.uint64).tobytes()
    subprocess.run([os.path.join(a.build, "weightfs"), store, mnt, "-o", "passthrough=off,nosync"], check=True)
    out = {"mib": a.mib, "mount": "passthrough=off"}
    try:
        names = [os.path.join(mnt, f"t{i}") for i in range(4)]
        for p in names:
            with open(p, "wb") as f:
                f.write(body)
        native = os.path.join(work, "native.bin")
        with open(native, "wb") as f:
            f.write(body)
        os.sync()
        rows = [("mounted file", lambda: os.open(names[0], os.O_RDONLY)),
                ("direct path", lambda: weightfs.open_object(names[0])),
                ("native", lambda: os.open(native, os.O_RDONLY))]
        print(f"mmap read of a {a.mib} MiB tensor (-o passthrough=off): GB/s cold / warm")
        for label, fn in rows:
            cold, warm = timed(fn, size)
            out[label] = {"cold_gbps": round(size / cold / 1e9, 2), "warm_gbps": round(size / warm / 1e9, 2)}
            print(f"  {label:14s} {size / cold / 1e9:6.2f} / {size / warm / 1e9:6.2f}", flush=True)
        print("page cache growth, 4 names x the same content read in full (meminfo Cached):")
        for label, fn in (("mounted files", lambda p: os.open(p, os.O_RDONLY)), ("direct path", weightfs.open_object)):
            # A new daemon each time: the FUSE inodes' caches of the previous round are gone.
            subprocess.run(["fusermount3", "-u", mnt], check=True)
            time.sleep(0.5)
            subprocess.run([os.path.join(a.build, "weightfs"), store, mnt, "-o", "passthrough=off,nosync"],
                           check=True)
            wfstest.drop_caches()
            before = wfstest.cached_bytes()[0]
            for p in names:
                fd = fn(p)
                read_map(fd, size)
                os.close(fd)
            grow = wfstest.cached_bytes()[0] - before
            out[f"footprint {label}"] = {"mib": round(grow / MIB), "copies": round(grow / size, 2)}
            print(f"  {label:14s} +{grow / MIB:7.0f} MiB = {grow / size:.2f} copies", flush=True)
    finally:
        subprocess.run(["fusermount3", "-u", mnt])
        time.sleep(0.5)
        subprocess.run(["rm", "-rf", work])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
