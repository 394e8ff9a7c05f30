#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Readers beside in-place rewriters (issue 33, item 6): what a read of a name being rewritten sees.

Four processes for --seconds on five names of 1 MiB (256 records of 4 KiB, each naming its version
and index): rewrite a name in place (open 'wb', one write of a whole new version), link one name
over another (link + os.replace), rename, unlink, and read a name whole (read(2), or with `map` a
MAP_PRIVATE mapping, made in a forked child so that a SIGBUS past a shrinking end is counted, not
fatal). Each read is classed by its worst page: a record of the wrong index or with wrong bytes
("torn/misplaced": ext4 shows these too, a read racing a write within a page), a page of zeros,
or other bytes ("garbage"). It prints the counts and exits 1 if more than TOLERATE reads (default 0)
saw zeros or garbage; torn pages and errors are counted, not failed. A plain directory on ext4 is
not always clean: 0 such reads in 10 s on a 2-core machine, 2 in 20,609 reads on a 16-core one (its
rewrite races its readers page by page), so run-stress tolerates what its native control run shows.

    tests/stress/rewrite_readers.py DIR [SECONDS] [read|map] [TOLERATE]
"""
import errno
import mmap
import os
import random
import struct
import sys
import time
import zlib
from multiprocessing import Process, Queue

REC, N = 4096, 256
MAGIC = b"WFSR"
HEAD = struct.Struct("<4sQII")  # magic, version, index, records in the version


def record(version, index):
    head = HEAD.pack(MAGIC, version, index, N)
    return head + (zlib.crc32(head).to_bytes(4, "little") * (REC // 4))[: REC - len(head)]


def classify(data):
    found = set()
    for off in range(0, len(data) - len(data) % REC, REC):
        page = data[off : off + REC]
        magic, version, index, _ = HEAD.unpack_from(page)
        if magic != MAGIC:
            found.add("zeros" if page.count(0) == REC else "garbage")
        elif page != record(version, index) or index != off // REC:
            found.add("torn/misplaced")
    return found


def read_mapped(fd, size):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            with mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
                os.write(w, (",".join(sorted(classify(bytes(m)))) or "-").encode())
        except BaseException as e:  # noqa: B902 - any end of the child is reported, not raised
            os.write(w, ("exception " + type(e).__name__).encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 4096).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"sigbus" if os.WTERMSIG(status) == 7 else "signal %d" % os.WTERMSIG(status)}
    return {x for x in out.split(",") if x and x != "-"}


def worker(root, wid, seconds, mapped, q):
    rng = random.Random(wid * 7919 + int(time.time()))
    names = ["n%d" % k for k in range(5)]
    path = lambda n: os.path.join(root, n)  # noqa: E731
    count, reads, bad, errors = 0, 0, {}, {}
    end = time.time() + seconds
    while time.time() < end:
        op = rng.choice(["rewrite"] * 3 + ["link", "rename", "unlink"] + ["read"] * 4)
        try:
            if op == "rewrite":
                count += 1
                with open(path(rng.choice(names)), "wb") as f:
                    f.write(b"".join(record((wid << 40) | count, i) for i in range(N)))
            elif op == "link":
                a, b = rng.sample(names, 2)
                os.link(path(a), path(".l%d" % wid))
                os.replace(path(".l%d" % wid), path(b))
            elif op == "rename":
                a, b = rng.sample(names, 2)
                os.rename(path(a), path(b))
            elif op == "unlink":
                os.unlink(path(rng.choice(names)))
            else:
                fd = os.open(path(rng.choice(names)), os.O_RDONLY)
                try:
                    size = os.fstat(fd).st_size
                    found = read_mapped(fd, size) if mapped and size else classify(os.pread(fd, N * REC, 0))
                finally:
                    os.close(fd)
                reads += 1
                for k in found:
                    bad[k] = bad.get(k, 0) + 1
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EEXIST):
                key = "%s %s" % (op, errno.errorcode.get(e.errno, e.errno))
                errors[key] = errors.get(key, 0) + 1
    q.put((reads, bad, errors))


def main():
    root = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10
    mapped = len(sys.argv) > 3 and sys.argv[3] == "map"
    tolerate = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    os.makedirs(root, exist_ok=True)
    for k in range(5):
        with open(os.path.join(root, "n%d" % k), "wb") as f:
            f.write(b"".join(record(999, i) for i in range(N)))
    q = Queue()
    procs = [Process(target=worker, args=(root, w + 1, seconds, mapped, q)) for w in range(4)]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    reads, bad, errors = 0, {}, {}
    for r, b, e in results:
        reads += r
        for k, n in b.items():
            bad[k] = bad.get(k, 0) + n
        for k, n in e.items():
            errors[k] = errors.get(k, 0) + n
    print("rewrite_readers: %d reads (%s), bad reads %s, errors %s"
          % (reads, "maps" if mapped else "read(2)", bad or "none", errors or "none"))
    zeroed = bad.get("zeros", 0) + bad.get("garbage", 0)
    print("rewrite_readers: %d reads saw zeros or garbage" % zeroed)
    return 1 if zeroed > tolerate else 0


if __name__ == "__main__":
    sys.exit(main())
