#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The workload tests/takeover/run-takeover kills the server under: RANKS processes, each on its own
directory of a few names, mixing
  - write: a new version of a name through a temporary name (create, write, close, rename), 4 KiB
    to 3 MiB, its bytes derived from a seed;
  - read:  open + read(2) of a name, checked against the last version written to it;
  - map:   open + mmap of a name, checked, kept mapped (up to 3 per rank) and checked again later:
           a mapping keeps the bytes of the version it mapped;
  - base:  open + read of a file every rank shares, written before the kills and never changed;
  - list:  listdir + stat of every name.
Every operation is timed. A write in flight at a kill (its file open, part of it written) goes on
with the successor, which adopts its writer (docs/design.md, "Takeover: writers in flight"): an
error of any operation, and any byte that differs, is a failure. Half the writes create their tmp
name with O_TRUNC (written through passthrough where it is on), a third fsync before close.

Prints one JSON object: counts, failures (at most 20 shown), the slowest operation
(ms, kind, when), and the final seed of every name (for the check after a remount).
"""
import argparse
import errno
import hashlib
import json
import mmap
import multiprocessing
import os
import queue
import random
import sys
import time

SIZES = [4096, 65536, 1536 * 1024, 3 * 1024 * 1024]
NAMES = 5


def content(seed, size):
    return random.Random(seed).randbytes(size)


def seed_size(seed):
    return SIZES[seed % len(SIZES)]


def digest(b):
    return hashlib.blake2b(b, digest_size=16).hexdigest()


def rank_main(mnt, rank, seconds, start, q):
    rnd = random.Random(rank * 7919 + int(start))
    d = os.path.join(mnt, "r%d" % rank)
    os.makedirs(d, exist_ok=True)
    expected = {}  # name -> seed
    maps = []  # (mmap, fd, seed, name)
    stats = {"ops": 0, "writes": 0, "reads": 0, "maps": 0, "base": 0, "lists": 0,
             "slowest_ms": 0.0, "slowest": "", "slow_ops": 0}
    failures = []
    base = sorted(os.listdir(os.path.join(mnt, "base")))
    base_sums = {}
    for b in base:
        with open(os.path.join(mnt, "base", b), "rb") as f:
            base_sums[b] = digest(f.read())
    next_seed = rank * 1000000

    def fail(what):
        if len(failures) < 20:
            failures.append("%.3f rank %d: %s" % (time.time() - start, rank, what))
        else:
            failures.append("...")

    def timed(kind, fn):
        t0 = time.monotonic()
        try:
            fn()
        except OSError as e:
            fail("%s: %s" % (kind, e))
        ms = (time.monotonic() - t0) * 1000
        stats["ops"] += 1
        if ms > 100:
            stats["slow_ops"] += 1
        if ms > stats["slowest_ms"]:
            stats["slowest_ms"] = ms
            stats["slowest"] = "%s at %.2f s" % (kind, t0 - start_mono)

    def write_once(name, seed):
        tmp = os.path.join(d, ".tmp.%s.%d" % (name, seed))
        data = content(seed, seed_size(seed))
        how = os.O_TRUNC if seed % 2 else os.O_EXCL
        fd = os.open(tmp, os.O_CREAT | how | os.O_WRONLY, 0o644)
        try:
            for off in range(0, len(data), 262144):
                os.write(fd, data[off:off + 262144])
            if seed % 3 == 0:
                os.fsync(fd)
        except OSError:
            os.close(fd)
            raise
        os.close(fd)
        os.rename(tmp, os.path.join(d, name))

    def op_write():
        nonlocal next_seed
        name = "f%d" % rnd.randrange(NAMES)
        next_seed += 1
        write_once(name, next_seed)
        expected[name] = next_seed
        stats["writes"] += 1

    def check(name, seed, b, how):
        want = content(seed, seed_size(seed))
        if b != want:
            fail("%s %s: wrong bytes (%d bytes, want %d of seed %d)" % (how, name, len(b), len(want), seed))

    def op_read():
        if not expected:
            return
        name = rnd.choice(sorted(expected))
        with open(os.path.join(d, name), "rb") as f:
            check(name, expected[name], f.read(), "read")
        stats["reads"] += 1

    def op_map():
        if not expected:
            return
        name = rnd.choice(sorted(expected))
        fd = os.open(os.path.join(d, name), os.O_RDONLY)
        m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        check(name, expected[name], m[:], "map")
        maps.append((m, fd, expected[name], name))
        if len(maps) > 3:
            old = maps.pop(0)
            check(old[3], old[2], old[0][:], "old map")
            old[0].close()
            os.close(old[1])
        stats["maps"] += 1

    def op_base():
        b = rnd.choice(base)
        with open(os.path.join(mnt, "base", b), "rb") as f:
            if digest(f.read()) != base_sums[b]:
                fail("base %s: wrong bytes" % b)
        stats["base"] += 1

    def op_list():
        for n in os.listdir(d):
            os.stat(os.path.join(d, n))
        stats["lists"] += 1

    ops = [("write", op_write)] * 3 + [("read", op_read)] * 3 + [("map", op_map)] * 2 + \
        [("base", op_base)] * 2 + [("list", op_list)]
    start_mono = time.monotonic() - (time.time() - start)
    while time.time() - start < seconds:
        kind, fn = rnd.choice(ops)
        timed(kind, fn)
    for m, fd, seed, name in maps:
        check(name, seed, m[:], "map at the end")
        m.close()
        os.close(fd)
    for name, seed in expected.items():
        with open(os.path.join(d, name), "rb") as f:
            check(name, seed, f.read(), "read at the end")
    q.put({"rank": rank, "stats": stats, "failures": failures, "expected": expected})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mnt")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--start-file", help="touched once every rank is running")
    a = ap.parse_args()
    q = multiprocessing.Queue()
    start = time.time()
    procs = [multiprocessing.Process(target=rank_main, args=(a.mnt, r, a.seconds, start, q))
             for r in range(a.ranks)]
    for p in procs:
        p.start()
    if a.start_file:
        open(a.start_file, "w").close()
    results = []
    while len(results) < len(procs):
        try:
            results.append(q.get(timeout=1))
        except queue.Empty:
            # A rank that a signal ended (SIGBUS from a mapping) never reports: fail, not hang.
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                print(json.dumps({"failures": ["rank process %d ended: exit code %d (a negative one is "
                                               "the signal)" % (p.pid, p.exitcode) for p in dead]}))
                return 1
    for p in procs:
        p.join()
    total = {}
    failures, expected, slowest = [], {}, (0.0, "")
    for r in sorted(results, key=lambda x: x["rank"]):
        for k, v in r["stats"].items():
            if isinstance(v, (int, float)) and k != "slowest_ms":
                total[k] = total.get(k, 0) + v
        if r["stats"]["slowest_ms"] > slowest[0]:
            slowest = (r["stats"]["slowest_ms"], "rank %d: %s" % (r["rank"], r["stats"]["slowest"]))
        failures += r["failures"]
        for n, s in r["expected"].items():
            expected["r%d/%s" % (r["rank"], n)] = s
    out = {"counts": total, "slowest_ms": round(slowest[0], 1), "slowest": slowest[1],
           "failures": failures, "expected": expected}
    print(json.dumps(out))
    return 1 if failures else 0


def verify(mnt, expected_json):
    """--verify MNT FILE: every name holds the bytes of its last version (after a remount)."""
    exp = json.load(open(expected_json))["expected"]
    bad = 0
    for name, seed in exp.items():
        with open(os.path.join(mnt, name), "rb") as f:
            if f.read() != content(seed, seed_size(seed)):
                print("verify: %s: wrong bytes" % name)
                bad += 1
    print("verify: %d names, %d wrong" % (len(exp), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--verify":
        sys.exit(verify(sys.argv[2], sys.argv[3]))
    sys.exit(main())
