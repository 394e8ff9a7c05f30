#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Randomized concurrent workload on a few names, checked against a model of what each may hold.

Several processes (--procs) run for --seconds on a directory (a weightfs mount, or a native one as the
control), each a random mix of operations, until the time is up:

  whole names (w0..w2)   written only whole: a version written to a temporary name and renamed over
                         the name (os.replace), or a hard link of another whole name made and renamed
                         over it; also unlinked, and read by read(2) and by a private or shared mapping.
                         A read must see exactly one whole version: every record of it, in order.
  changing names (a0..a2) rewritten in place (open 'wb', then written), appended to ('>>': O_APPEND,
                         one record per open, as a shell loop does), truncated to fewer records
                         (truncate(2) and ftruncate(2)), unlinked; read by read(2). A read must see a
                         sequence of records whose bytes are right, runs of one version in order
                         (the last one may be cut short by a write in progress, as on ext4).

A record is 4096 bytes: a header (magic, version id, index, count of records in its version) and bytes
derived from (version, index), so a torn, zeroed or misplaced page is caught. Operations may fail
with ENOENT (another process unlinked or renamed the name meanwhile); any other error is counted by
its errno and reported. The run fails (exit 1) on a read that breaks the model, on a mount that stops
answering (ENOTCONN: the daemon died), or on an error outside --allow. Prints one summary line:
"stress: N operations, N reads checked, N model violations, errors {...}".
"""
import argparse
import errno
import mmap
import os
import random
import struct
import sys
import time
import zlib
from multiprocessing import Process, Queue

RECORD = 4096
MAGIC = b"WFSR"
HEADER = struct.Struct("<4sQII")  # magic, version id, index, records in the version
WHOLE = ["w0", "w1", "w2"]
CHANGING = ["a0", "a1", "a2"]


def record(version, index, count):
    head = HEADER.pack(MAGIC, version, index, count)
    seed = zlib.crc32(head)
    body = (seed.to_bytes(4, "little") * (RECORD // 4))[: RECORD - len(head)]
    return head + body


def parse(data, partial_end=False):
    """The records of @data as (version, index, count), or a string saying what is wrong. With
    @partial_end, the last record may be cut short (a read racing a write that extends the file, as
    on ext4), as long as the bytes it has are right."""
    if len(data) % RECORD and not partial_end:
        return "size %d is not a whole number of records" % len(data)
    out = []
    for off in range(0, len(data), RECORD):
        chunk = data[off : off + RECORD]
        if len(chunk) < HEADER.size:
            break  # a cut-short last record too short to tell: its bytes are checked by nothing
        magic, version, index, count = HEADER.unpack_from(chunk)
        if magic != MAGIC:
            zeros = chunk.count(0) == len(chunk)
            return "record at %d is %s" % (off, "all zeros" if zeros else "not a record")
        if chunk != record(version, index, count)[: len(chunk)]:
            return "record at %d (version %x, index %d) is torn" % (off, version, index)
        out.append((version, index, count))
    return out


def check_whole(data):
    recs = parse(data)
    if isinstance(recs, str):
        return recs
    if not recs:
        return "empty (a whole name always holds a version)"
    version, _, count = recs[0]
    if recs != [(version, i, count) for i in range(count)]:
        return "not one whole version: %s" % recs[:4]
    return None


def check_changing(data):
    recs = parse(data, partial_end=True)
    if isinstance(recs, str):
        return recs
    for i, (version, index, count) in enumerate(recs):
        if index >= count:
            return "record %d: index %d of %d" % (i, index, count)
        # Inside a run of one version the indexes follow each other. A run may start past index 0:
        # two in-place rewriters that truncated before either wrote leave the longer one's tail
        # after the shorter one's records (ext4 too).
        if i and recs[i - 1][0] == version and recs[i - 1][1] + 1 != index:
            return "record %d: version %x index %d after %d" % (i, version, index, recs[i - 1][1])
    return None


class Worker:
    def __init__(self, root, wid, seconds, seed, maps, only):
        self.root, self.wid, self.maps, self.only = root, wid, maps, only
        self.deadline = time.monotonic() + seconds
        self.rng = random.Random(seed)
        self.counter = 0
        self.ops = self.reads = 0
        self.errors = {}
        self.violations = []

    def path(self, name):
        return os.path.join(self.root, name)

    def version(self):
        self.counter += 1
        return (self.wid << 40) | self.counter

    def content(self, records=None):
        count = records or self.rng.randint(1, 6)
        v = self.version()
        return b"".join(record(v, i, count) for i in range(count))

    # --- whole names -------------------------------------------------------------------------
    def replace_whole(self):
        tmp = self.path(".tmp-%d-%d" % (self.wid, self.counter))
        with open(tmp, "wb") as f:
            f.write(self.content())
        os.replace(tmp, self.path(self.rng.choice(WHOLE)))

    def link_whole(self):
        src, dst = self.rng.sample(WHOLE, 2)
        tmp = self.path(".lnk-%d-%d" % (self.wid, self.version()))
        os.link(self.path(src), tmp)
        os.replace(tmp, self.path(dst))

    def read_whole(self):
        name = self.rng.choice(WHOLE)
        how = self.rng.choice(["read", "map-private", "map-shared"] if self.maps else ["read"])
        fd = os.open(self.path(name), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if how == "read" or size == 0:
                data = os.pread(fd, size + RECORD, 0)
            else:
                flags = mmap.MAP_PRIVATE if how == "map-private" else mmap.MAP_SHARED
                with mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ) as m:
                    data = bytes(m)
        finally:
            os.close(fd)
        self.reads += 1
        bad = check_whole(data)
        if bad:
            self.violations.append("%s by %s: %s" % (name, how, bad))

    # --- changing names ----------------------------------------------------------------------
    def rewrite(self):
        with open(self.path(self.rng.choice(CHANGING)), "wb") as f:
            f.write(self.content())

    def append(self):
        fd = os.open(self.path(self.rng.choice(CHANGING)), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, record(self.version(), 0, 1))
        finally:
            os.close(fd)

    def truncate(self):
        p = self.path(self.rng.choice(CHANGING))
        if self.rng.random() < 0.5:
            os.truncate(p, (os.stat(p).st_size // RECORD // 2) * RECORD)
        else:
            fd = os.open(p, os.O_WRONLY)
            try:
                os.ftruncate(fd, (os.fstat(fd).st_size // RECORD // 2) * RECORD)
            finally:
                os.close(fd)

    def read_changing(self):
        name = self.rng.choice(CHANGING)
        with open(self.path(name), "rb") as f:
            data = f.read()
        self.reads += 1
        bad = check_changing(data)
        if bad:
            self.violations.append("%s by read: %s" % (name, bad))

    def unlink(self):
        os.unlink(self.path(self.rng.choice(WHOLE + CHANGING)))

    def rename_changing(self):
        src, dst = self.rng.sample(CHANGING, 2)
        os.rename(self.path(src), self.path(dst))

    def run(self):
        ops = [
            (self.replace_whole, 4), (self.link_whole, 1), (self.read_whole, 5),
            (self.rewrite, 2), (self.append, 4), (self.truncate, 1), (self.read_changing, 3),
            (self.unlink, 1), (self.rename_changing, 1),
        ]
        if self.only:
            ops = [(f, w) for f, w in ops if f.__name__ in self.only]
        funcs = [f for f, w in ops for _ in range(w)]
        while time.monotonic() < self.deadline:
            op = self.rng.choice(funcs)
            try:
                op()
            except OSError as e:
                if e.errno == errno.ENOTCONN:
                    self.errors["ENOTCONN"] = self.errors.get("ENOTCONN", 0) + 1
                    break
                if e.errno != errno.ENOENT:
                    key = "%s %s" % (op.__name__, errno.errorcode.get(e.errno, e.errno))
                    self.errors[key] = self.errors.get(key, 0) + 1
            self.ops += 1
        return {"ops": self.ops, "reads": self.reads, "errors": self.errors,
                "violations": self.violations}


def work(q, *args):
    try:
        q.put(Worker(*args).run())
    except Exception as e:  # a bug of this script: report it rather than hang the parent
        q.put({"ops": 0, "reads": 0, "errors": {"crash " + repr(e): 1}, "violations": []})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="directory to work in (made if missing)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    ap.add_argument("--no-maps", dest="maps", action="store_false", help="read whole names by read(2) only")
    ap.add_argument("--ops", default="", help="comma-separated operations to run (default: all), e.g. "
                    "replace_whole,link_whole,read_whole,rewrite,append,truncate,read_changing,unlink,"
                    "rename_changing")
    ap.add_argument("--violations-ok", action="store_true",
                    help="print model violations but do not fail on them (a known gap under study)")
    ap.add_argument("--allow", default="", help="comma-separated errno names tolerated (counted, not failed)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(time.time())
    os.makedirs(a.dir, exist_ok=True)
    for name in WHOLE:  # every whole name starts with a version
        with open(os.path.join(a.dir, name), "wb") as f:
            f.write(record(name.encode()[1], 0, 1))
    q = Queue()
    procs = [Process(target=work, args=(q, a.dir, i + 1, a.seconds, seed * 1000 + i, a.maps,
                                                  {o for o in a.ops.split(",") if o}))
             for i in range(a.procs)]
    for p in procs:
        p.start()
    results = [q.get(timeout=a.seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    errors, violations = {}, []
    for r in results:
        for k, n in r["errors"].items():
            errors[k] = errors.get(k, 0) + n
        violations += r["violations"]
    for v in violations[:20]:
        print("stress: model violation: " + v)
    allowed = {e for e in a.allow.split(",") if e}
    fatal = {k: n for k, n in errors.items() if k.split()[-1] not in allowed}
    print("stress: seed %d, %d processes, %d operations, %d reads checked, %d model violations, errors %s"
          % (seed, a.procs, sum(r["ops"] for r in results), sum(r["reads"] for r in results),
             len(violations), errors or "none"))
    return 1 if (violations and not a.violations_ok) or fatal else 0


if __name__ == "__main__":
    sys.exit(main())
