#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write-side benchmark (issue 10): weightfs vs the filesystem under its store, side by side in one run.

    bench_write.py --build BUILD --work DIR [--rounds 3] [--quick] [--tensors 20000] [--files 20000]
                   [--claims 2000] [--size 1GiB] [--writer-size 512MiB] [--sparse-size 1GiB]
                   [--rows 1,2,3,4,5,6] [-o MOUNT_OPT ...] [--doc docs/benchmarks.md]
                   [--chart PNG | --no-chart] [--command CMD]

Needs root (FUSE mounts, drop_caches). Run by tests/bench/run-bench after bench.py and
bench_offload.py. Under DIR: store-sync/ + mnt-sync/ (default options), store-nosync/ + mnt-nosync/
(`-o nosync`), per-round stores for rows 5 and 6, and native/, a plain directory on the same
filesystem (st_dev checked). -o options are added to every mount. Each round runs every row on both
sides, the side that goes first alternating from round to round; reported: the median of the
per-round ratios and the medians of the absolute numbers, with every round's values. Ratios are
weightfs / native of a speed (so higher is better) except row 5's, which is a ratio of two weightfs
times (lower is better). Native writes as trainers do (no fsync) unless a row says otherwise.

Rows:
  1 ingest     one --size tensor (1 GiB) in host memory (distinct content in every 1 MiB chunk and
               round) written as trainers write it: on weightfs weightfs.offload(buf, path,
               claim=False) (temp name, dtype and shape xattrs, reopened to write through passthrough
               while a second thread hashes the memory, digest declared, close, seal, rename), on
               native write in 16 MiB chunks + close; GB/s until offload returns (the seal included)
               or close returns; os.sync() before each. Twice: the `-o nosync` mount vs native write
               + close, and the default mount with both sides writing + fdatasync + close (the
               writer's fsync makes the seal durable at close; offload(fsync=True)). With it: XXH3-128
               of --size bytes of fresh memory (libweightfs's wfs_digest_buf), the ingest ratio a
               digest computed after the write would allow (native / (native + hash)), and the first
               open after the offload (it waits for the daemon's check of the declared digest).
  2 writers    4 processes write distinct --writer-size (512 MiB) tensors at once, as in row 1:
               aggregate GB/s = 4 x size / (start to the last close, or seal on weightfs). Meanwhile a fifth process, every
               5 ms, opens another file (8 MiB, sealed before), mmaps it, reads one byte of one page
               (a different page each time), munmaps and closes it: median and worst latency.
               The default mount (-o sync=group) syncs seals in groups within 1 s of their close, 
               as native writeback does later still. Then, without the probe, the same four writers
               on the `-o nosync` mount, and four writers that fdatasync before close on the default
               mount and natively (durable at close on both sides).
  3 small      --tensors N (20,000) tensors of 4 KiB-1 MiB, fixed seed, same sizes both sides; sizes
               log-triangular: the log2 size is the minimum of two uniform draws in [12, 20], so small
               tensors are more common (mean ~66 KB, 20,000 tensors ~1.3 GB per side; log-uniform
               would be ~3.8 GB). Write phase: each tensor written to a temp name, closed, renamed to
               its final name. Read phase (right after, warm): open + mmap + read 1 byte per 4 KiB
               page + munmap + close each. Ratio of the totals (native s / weightfs s).
  4 metadata   --files N (20,000) empty files: create (O_CREAT|O_EXCL, close) after sync + drop_caches;
               `ls -l DIR > /dev/null` right after the creates (warm); os.stat of every file; unlink of
               every file. Phase-major within a round (create both sides, ls both, stat both, unlink
               both), sync + drop_caches + sleep 1 s between rounds (ext4 with discard creates slowly
               right after a big unlink). files/s. With it, the FUSE floor: the mean of 20,000
               requests the daemon answers at once (roundtrip.py), times the requests a create (4) and
               an unlink (2) wait for, against the native operation.
  5 restart    --claims M (2,000) tensors, 4 KiB-1 MiB log-uniform (float32, fixed seed), offloaded
               with weightfs.FrozenOffload(MNT, 0).offload() into rank0/ of a fresh store (seconds of
               the call, in a worker process with torch); then unmount, mount the same store again
               (a restart) and FrozenOffload(MNT, 1) offloads the same tensors into rank1/: digest
               claims. Ratio re-offload / first (goal <= 0.1). Native context: the same two passes
               into a plain directory (every byte written twice). Skipped, with a line saying so,
               when no python3 with torch is found ($WFS_PYTHON, this interpreter, /usr/bin/python3).
  6 sparse     a --sparse-size (1 GiB) sparse file (8 bytes at the start, 8 at the end) written and
               closed (fresh store each round), then opened O_WRONLY (no O_TRUNC), 1 byte written at
               offset 4096, closed: time of the change; then sync and bytes on disk: the sum of
               st_blocks x 512 of STORE/objects vs st_blocks x 512 of the native file.
--quick: 64 MiB tensors (rows 1, 2, 6), 1,000 files, 500 small tensors, 200 claims (a smoke run).
--doc rewrites the block between <!-- bench-write:begin --> and <!-- bench-write:end --> (text around
it kept) and draws the ratios against the goals into --chart (default: bench-write.png next to the
doc) with matplotlib (Debian: python3-matplotlib); without matplotlib the chart is skipped with a
message.
"""

import argparse
import datetime
import json
import mmap
import multiprocessing
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BEGIN = "<!-- bench-write:begin -->"
END = "<!-- bench-write:end -->"
PAGE = 4096
CHUNK = 1 << 20
WRITE_CHUNK = 16 << 20  # bytes per write(2) of a native tensor: what weightfs.offload writes at a time
PROBE_SIZE = 8 << 20
PROBE_EVERY = 0.005
SEED = 20261130
GOALS = {"ingest-nosync": 0.9, "ingest-sync": 0.9, "writers": 0.9, "small": 0.5, "create": 0.5,
         "ls": 0.5, "unlink": 0.5, "restart": 0.1}
med = statistics.median

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import drop_caches, human, parse_size, write_doc_block  # noqa: E402  (one copy each)
from roundtrip import per_call_us  # noqa: E402


def tree_blocks(top):
    total = 0
    for d, _, files in os.walk(top):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def sh(argv):
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


class Mount:
    """BUILD/weightfs STORE MNT -f OPTS in the background; start() waits for the mount, stop() unmounts
    and returns the daemon's exit status."""

    def __init__(self, build, store, mnt, opts):
        self.argv = [os.path.join(build, "weightfs"), store, mnt, "-f"] + opts
        self.store, self.mnt, self.proc = store, mnt, None
        self.log = os.path.join(os.path.dirname(mnt), f"weightfs-{os.path.basename(mnt)}.log")
        os.makedirs(store, exist_ok=True)
        os.makedirs(mnt, exist_ok=True)

    def start(self):
        if os.path.ismount(self.mnt):
            raise RuntimeError(f"{self.mnt} is already a mount point (fusermount3 -u {self.mnt})")
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.time() > deadline:
                if self.proc.poll() is None:
                    self.proc.kill()
                self.proc.wait()
                self.proc = None
                raise RuntimeError(f"weightfs did not mount {self.mnt}: {' '.join(self.argv)} (log "
                                   f"{self.log}: {self.log_tail()})")
            time.sleep(0.05)
        return self

    def log_tail(self):
        try:
            with open(self.log) as f:
                return " | ".join(f.read().splitlines()[-3:])
        except OSError:
            return "?"

    def stop(self):
        if self.proc is None:
            return 0
        for _ in range(100):
            if not os.path.ismount(self.mnt):
                break
            if unmount(self.mnt):
                break
            time.sleep(0.1)
        else:
            unmount(self.mnt, lazy=True)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc


def unmount(mnt, lazy=False):
    """fusermount3 -u, or umount(8) where fuse3's tools are not installed (the GPU machine)."""
    for argv in (["fusermount3", "-u"] + (["-z"] if lazy else []), ["umount"] + (["-l"] if lazy else [])):
        try:
            if subprocess.run(argv + [mnt], stderr=subprocess.DEVNULL).returncode == 0:
                return True
        except FileNotFoundError:
            continue
    return False


# ---- writing and reading ----------------------------------------------------------------------

_BUF = None
_TENSOR = None
BUILD = "build"  # set by main(): the package() loads this build's libweightfs.so


def chunk_buf():
    global _BUF
    if _BUF is None:
        _BUF = bytearray(os.urandom(CHUNK))
    return _BUF


def write_all(fd, view):
    while view:
        view = view[os.write(fd, view):]


def tensor_bytes(size, stamp):
    """A trainer's tensor in host memory: size bytes, the random 1 MiB chunk_buf() over and over,
    each MiB stamped with stamp and its index (distinct content in every chunk, writer and round).
    One buffer per process, restamped in place."""
    global _TENSOR
    if _TENSOR is None or len(_TENSOR) != size:
        _TENSOR = None
        _TENSOR = bytearray(size)
        chunk = chunk_buf()
        for off in range(0, size, CHUNK):
            n = min(CHUNK, size - off)
            _TENSOR[off:off + n] = chunk[:n]
    for i, off in enumerate(range(0, size, CHUNK)):
        _TENSOR[off:off + 16] = stamp.to_bytes(8, "little") + i.to_bytes(8, "little")
    return _TENSOR


def package():
    """The weightfs Python package of this tree, on this build's libweightfs.so."""
    os.environ.setdefault("WEIGHTFS_LIB", os.path.join(os.path.abspath(BUILD), "libweightfs.so"))
    if os.path.join(REPO, "lib", "python") not in sys.path:
        sys.path.insert(0, os.path.join(REPO, "lib", "python"))
    import weightfs
    return weightfs


def write_tensor(path, buf, datasync, wfs):
    """Write tensor buf (host memory) to path as a trainer does; returns seconds. On weightfs:
    weightfs.offload(buf, path, claim=False), the package's writer (create a temp name, dtype U8 and
    shape [size], open it again to write through kernel passthrough, write while a second thread
    hashes the same memory, declare the digest, close, wait for the seal, rename): the time includes
    the seal (publish; with datasync, offload(fsync=True): the writer's fdatasync, after which the
    seal is durable at close). Native: open(O_CREAT|O_TRUNC), write in 16 MiB chunks [+ fdatasync],
    close."""
    t0 = time.perf_counter()
    if wfs:
        package().offload(buf, path, claim=False, fsync=datasync)
        return time.perf_counter() - t0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        mv = memoryview(buf)
        for off in range(0, len(buf), WRITE_CHUNK):
            write_all(fd, mv[off:off + WRITE_CHUNK])
        if datasync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def first_open_seconds(path):
    """open + close of a file just written: on weightfs the first open of an object sealed on its
    writer's declared digest waits for its check (the checker thread's, or its own)."""
    t0 = time.perf_counter()
    os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    return time.perf_counter() - t0


def touch_pages(path):
    """open + mmap + read 1 byte per 4 KiB page + munmap + close."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                m[0:size:PAGE]
    finally:
        os.close(fd)


def rm_tree(d):
    shutil.rmtree(d, ignore_errors=True)


# ---- row 1: large tensor ingest ----------------------------------------------------------------

def row_ingest(ctx, r, order):
    res = {}
    for dur, wdir, native_sync in (("nosync", ctx.nosync_dir, False), ("sync", ctx.sync_dir, True)):
        for side in order:
            d = wdir if side == "wfs" else ctx.native_dir
            path = os.path.join(d, f"ingest-{dur}.bin")
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            stamp = (ctx.nonce << 16) | (r << 4) | (dur == "sync") << 1 | (side == "wfs")
            buf = tensor_bytes(ctx.size, stamp)
            os.sync()
            s = write_tensor(path, buf, native_sync, side == "wfs")
            res[f"ingest-{dur}/{side}"] = ctx.size / s / 1e9
            if side == "wfs":
                res[f"ingest-{dur}-open-s"] = first_open_seconds(path)
    for dur in ("nosync", "sync"):
        for d in (ctx.nosync_dir if dur == "nosync" else ctx.sync_dir, ctx.native_dir):
            try:
                os.unlink(os.path.join(d, f"ingest-{dur}.bin"))
            except FileNotFoundError:
                pass
    res["hash-s"] = hash_seconds(ctx, ctx.size)
    return res


def hash_seconds(ctx, size):
    """Seconds for XXH3-128 (libweightfs's wfs_digest_buf: one stream, the dispatched SIMD build) of
    size bytes of fresh anonymous memory: the least a digest of bytes just written costs, since it
    cannot start before they exist and runs at one core's memory bandwidth."""
    import ctypes
    lib = ctypes.CDLL(os.path.join(os.path.abspath(ctx.build), "libweightfs.so"))
    lib.wfs_digest_buf.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.wfs_digest_buf.restype = None
    buf = bytearray(size)
    mv = memoryview(buf)
    for off in range(0, size, CHUNK):  # touch every page: resident, not in the caches
        mv[off:off + 16] = os.urandom(16)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    out = (ctypes.c_uint8 * 16)()
    t0 = time.perf_counter()
    lib.wfs_digest_buf(addr, size, out)
    return time.perf_counter() - t0


# ---- row 2: four writers and an mmap prober ----------------------------------------------------

def _writer(path, size, stamp, go, conn, wfs, sync):
    global _BUF, _TENSOR
    _BUF = _TENSOR = None  # a fresh random buffer per writer
    buf = tensor_bytes(size, stamp)
    go.wait()
    t0 = time.perf_counter()
    write_tensor(path, buf, sync, wfs)
    conn.send((t0, time.perf_counter()))
    conn.close()


def _prober(path, stop, conn):
    lat = []
    npages = PROBE_SIZE // PAGE
    i = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        to = time.perf_counter()
        m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        t1 = time.perf_counter()
        m[(i % npages) * PAGE]
        m.close()
        os.close(fd)
        lat.append((t0, t1 - t0, time.perf_counter() - t0, to - t0))
        i += 1
        time.sleep(PROBE_EVERY)
    conn.send(lat)
    conn.close()


def writers_pass(ctx, d, r, k0, probe, sync=False):
    """Four processes write distinct ctx.writer_size tensors under d at once (each until its digest
    answers on weightfs; with sync, each fdatasyncs before its close), with the mmap prober on
    d/probe.bin beside them when probe. Returns
    (aggregate GB/s, [(start, open + mmap s, whole probe s, open alone s)] of the probes that ran
    meanwhile)."""
    mp = multiprocessing.get_context("fork")
    wfs = not d.startswith(ctx.native_dir)
    wdir = os.path.join(d, "writers")
    rm_tree(wdir)
    os.makedirs(wdir)
    os.sync()
    stop, go = mp.Event(), mp.Event()
    prober = None
    if probe:
        pparent, pchild = mp.Pipe(duplex=False)
        prober = mp.Process(target=_prober, args=(os.path.join(d, "probe.bin"), stop, pchild))
        prober.start()
        pchild.close()
    writers = []
    for k in range(4):
        parent, child = mp.Pipe(duplex=False)
        stamp = (ctx.nonce << 16) | (r << 8) | ((k0 + k) << 1) | wfs
        p = mp.Process(target=_writer, args=(os.path.join(wdir, f"w{k}.bin"), ctx.writer_size,
                                             stamp, go, child, wfs, sync))
        p.start()
        child.close()
        writers.append((p, parent))
    time.sleep(0.3)  # writers ready at the barrier, the prober going
    t0 = time.perf_counter()
    go.set()
    ends = []
    for p, conn in writers:
        try:
            ends.append(conn.recv()[1])
        except EOFError:
            ends.append(None)
        p.join()
    stop.set()
    lat = []
    if prober:
        try:
            lat = pparent.recv()
        except EOFError:
            lat = None
        prober.join()
    if lat and None not in ends:  # only the probes that started while the writers ran
        lat = [x for x in lat if t0 <= x[0] <= max(ends)] or [x for x in lat if x[0] >= t0][:1]
    if None in ends or lat is None or any(p.exitcode for p, _ in writers) or (prober and prober.exitcode):
        raise RuntimeError(f"row 2 ({d}): a writer or the prober failed")
    rm_tree(wdir)
    return 4 * ctx.writer_size / (max(ends) - t0) / 1e9, lat


def row_writers(ctx, r, order):
    res = {}
    for side in order:
        d = ctx.sync_dir if side == "wfs" else ctx.native_dir
        lock0 = daemon_lock(ctx) if side == "wfs" else None
        res[f"writers/{side}"], lat = writers_pass(ctx, d, r, 0, True)
        if side == "wfs":
            lock1 = daemon_lock(ctx)
            res["lock-slow"] = lock1["holds_slow"] - lock0["holds_slow"]
            res["lock-slow-ms"] = lock1["holds_slow_ms"] - lock0["holds_slow_ms"]
            if lock1["held_max_ms"] > lock0["held_max_ms"]:
                res["lock-max"] = (lock1["held_max_ms"], lock1["held_max_at"])
            res["commit-max"] = (lock1.get("catalog-commit_max_ms", 0), lock1.get("catalog-refill_max_ms", 0))
        res[f"probe-open-max/{side}"] = max(x[3] for x in lat) * 1e3 if lat else float("nan")
        opens, whole = [x[1] for x in lat], [x[2] for x in lat]
        res[f"probe-med/{side}"] = med(opens) * 1e3 if lat else float("nan")
        res[f"probe-max/{side}"] = max(opens) * 1e3 if lat else float("nan")
        res[f"probe-whole-med/{side}"] = med(whole) * 1e3 if lat else float("nan")
        res[f"probe-whole-max/{side}"] = max(whole) * 1e3 if lat else float("nan")
        res[f"probe-n/{side}"] = len(lat)
    # At equal durability (both without a sync), the same four writers on the -o nosync mount.
    res["writers-nosync/wfs"], _ = writers_pass(ctx, ctx.nosync_dir, r, 4, False)
    res["writers-nosync/native"] = res["writers/native"]
    # And the other way to equal durability: writers that fdatasync before close on both sides (on
    # the default mount the seal is then durable when close(2) returns).
    res["writers-durable/wfs"], _ = writers_pass(ctx, ctx.sync_dir, r, 8, False, sync=True)
    res["writers-durable/native"], _ = writers_pass(ctx, ctx.native_dir, r, 12, False, sync=True)
    return res


# ---- row 3: small tensors ------------------------------------------------------------------------

def small_sizes(n):
    rng = random.Random(SEED)
    return [max(PAGE, min(1 << 20, int(2 ** min(rng.uniform(12, 20), rng.uniform(12, 20)))))
            for _ in range(n)]


SMALL_RANKS = 16  # rank processes of row 3's many-writer pass: a node's 8-16 ranks through one mount


def write_small(d, first, sizes, pool, stamp):
    """The trainer pattern for tensors @first.. of @sizes in directory @d: temp name, write, close,
    rename. Each tensor's bytes are @pool's at a shifting offset with (@stamp, index) in front, so
    no two tensors of a run share content."""
    for i, size in enumerate(sizes, first):
        off = (i * 4099) % 4096
        pool[off:off + 16] = stamp.to_bytes(8, "little") + i.to_bytes(8, "little")
        tmp = os.path.join(d, f".tmp-{i}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, memoryview(pool)[off:off + size])
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(d, f"model.layers.{i}.weight"))


def small_ranks_pass(top, sizes, stamp):
    """Row 3's tensors written by SMALL_RANKS processes at once, each into its own directory under
    @top (rankN/, a slice of @sizes each); returns the seconds from the start signal to the last
    rank's end."""
    per = -(-len(sizes) // SMALL_RANKS)
    mp = multiprocessing.get_context("fork")  # the ranks share this process's sizes and stamp
    go, done = mp.Event(), mp.Queue()

    def rank(n):
        d = os.path.join(top, f"rank{n}")
        os.makedirs(d)
        pool = bytearray(os.urandom((1 << 20) + 4096))
        done.put(("ready", n))
        go.wait()
        write_small(d, n * per, sizes[n * per:(n + 1) * per], pool, stamp)
        done.put(("done", time.perf_counter()))

    procs = [mp.Process(target=rank, args=(n,)) for n in range(SMALL_RANKS)]
    for p in procs:
        p.start()
    for _ in procs:
        done.get()
    t0 = time.perf_counter()
    go.set()
    ends = [done.get()[1] for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a rank of the many-writer pass exited with {p.exitcode}")
    return max(ends) - t0


def row_small(ctx, r, order):
    res = {}
    pool = bytearray(os.urandom((1 << 20) + 4096))
    for side in order:
        d = os.path.join(ctx.sync_dir if side == "wfs" else ctx.native_dir, "small")
        rm_tree(d)
        os.makedirs(d)
        os.sync()
        names = [os.path.join(d, f"model.layers.{i}.weight") for i in range(len(ctx.sizes))]
        q0 = fuse_requests(ctx) if side == "wfs" else None
        t0 = time.perf_counter()
        write_small(d, 0, ctx.sizes, pool, (ctx.nonce << 16) | (r << 2) | (side == "wfs"))
        t1 = time.perf_counter()
        q1 = fuse_requests(ctx) if side == "wfs" else None
        for name in names:
            touch_pages(name)
        t2 = time.perf_counter()
        if side == "wfs":
            q2 = fuse_requests(ctx)
            res["req/small-write"], res["us/small-write"] = per_op(q0, q1, len(names)), handler_us(q0, q1, len(names))
            res["req/small-read"], res["us/small-read"] = per_op(q1, q2, len(names)), handler_us(q1, q2, len(names))
        res[f"small-write/{side}"] = t1 - t0
        res[f"small-read/{side}"] = t2 - t1
        res[f"small/{side}"] = t2 - t0
    for side in order:
        rm_tree(os.path.join(ctx.sync_dir if side == "wfs" else ctx.native_dir, "small"))
    settle()
    for side in order:
        top = os.path.join(ctx.sync_dir if side == "wfs" else ctx.native_dir, "small-ranks")
        rm_tree(top)
        os.makedirs(top)
        os.sync()
        res[f"small-ranks/{side}"] = small_ranks_pass(top, ctx.sizes,
                                                      (ctx.nonce << 16) | (r << 2) | 2 | (side == "wfs"))
        rm_tree(top)
    settle()
    return res


def fuse_requests(ctx):
    """The sync mount's FUSE requests so far, by opcode (user.weightfs.stats, counted by the daemon),
    and under "ms:OPCODE" the milliseconds its handlers ran for them."""
    since = json.loads(os.getxattr(os.path.dirname(ctx.sync_dir), "user.weightfs.stats"))["since_mount"]
    return dict(since.get("requests", {}), **{"ms:" + k: v for k, v in since.get("request_ms", {}).items()})


def daemon_lock(ctx):
    """The sync mount's fs->lock record (fs/core/lock.h): longest hold and holds of 10 ms or more."""
    stats = json.loads(os.getxattr(os.path.dirname(ctx.sync_dir), "user.weightfs.stats"))
    return dict(stats["lock"], **{"catalog-" + k: v for k, v in stats.get("commits", {}).items()})


def per_op(before, after, n):
    """Requests per operation between two fuse_requests() readings, over n operations (the second
    reading's own GETXATTR left out)."""
    d = {k: after.get(k, 0) - before.get(k, 0) - (k == "GETXATTR") for k in after if not k.startswith("ms:")}
    return {k: v / n for k, v in d.items() if v > 0}


def handler_us(before, after, n):
    """Microseconds per operation in the daemon's handlers, by opcode, between two fuse_requests()
    readings over n operations (the second reading's own GETXATTR is in, and is tiny)."""
    d = {k[3:]: after[k] - before.get(k, 0) for k in after if k.startswith("ms:")}
    return {k: v * 1e3 / n for k, v in d.items() if v > 0}


def settle():
    drop_caches()
    time.sleep(1)


# ---- row 4: metadata -----------------------------------------------------------------------------

def row_meta(ctx, r, order):
    res = {}
    dirs = {s: os.path.join(ctx.sync_dir if s == "wfs" else ctx.native_dir, "meta") for s in order}
    names = {s: [os.path.join(dirs[s], f"f{i:06d}") for i in range(ctx.files)] for s in order}
    for side in order:
        rm_tree(dirs[side])
        os.makedirs(dirs[side])
    def phase(key, side, work):
        """Time work() for one side; on weightfs also count its FUSE requests per file."""
        q0 = fuse_requests(ctx) if side == "wfs" else None
        t0 = time.perf_counter()
        work()
        res[f"{key}/{side}"] = ctx.files / (time.perf_counter() - t0)
        if side == "wfs":
            time.sleep(0.2)  # RELEASE and FORGET arrive after the calls return
            q1 = fuse_requests(ctx)
            res[f"req/{key}"], res[f"us/{key}"] = per_op(q0, q1, ctx.files), handler_us(q0, q1, ctx.files)

    for side in order:
        drop_caches()
        phase("create", side, lambda: [os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                                                        0o644)) for p in names[side]])
    for side in order:
        phase("ls", side, lambda: subprocess.run(["ls", "-l", dirs[side]], stdout=subprocess.DEVNULL, check=True))
    for side in order:
        phase("stat", side, lambda: [os.stat(p) for p in names[side]])
    for side in order:
        phase("unlink", side, lambda: [os.unlink(p) for p in names[side]])
    for side in order:
        os.rmdir(dirs[side])
    res["rtt-us"] = per_call_us(ctx.sync_dir)  # one FUSE request answered at once (roundtrip.py)
    settle()
    return res


# ---- row 5: restart with claims ------------------------------------------------------------------

def offload_worker(root, rank, m):
    """In a python with torch: offload m tensors (fixed seed) with FrozenOffload(root, rank); print
    the summary as JSON."""
    import warnings

    import torch

    import weightfs

    warnings.simplefilter("ignore", weightfs.WeightfsWarning)
    torch.set_num_threads(1)
    rng = random.Random(SEED + 5)
    sizes = [int(2 ** rng.uniform(12, 20)) // 4 * 4 for _ in range(m)]
    g = torch.Generator().manual_seed(SEED + 5)
    pool = torch.randint(0, 256, (sum(sizes),), dtype=torch.uint8, generator=g)
    params, off = {}, 0
    for i, n in enumerate(sizes):
        params[f"model.layers.{i}.weight"] = pool[off:off + n].view(torch.float32)
        off += n
    s = weightfs.FrozenOffload(root, rank).offload(params)
    print(json.dumps({"seconds": s.seconds, "tensors": s.tensors, "bytes": s.bytes,
                      "written": s.written, "claimed": s.claimed, "skipped": s.skipped,
                      "written_bytes": s.written_bytes}))
    return 0


def torch_python():
    cands = [os.environ.get("WFS_PYTHON"), sys.executable, "/usr/bin/python3"]
    for c in cands:
        if c and shutil.which(c) and subprocess.run([c, "-c", "import torch"], stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL).returncode == 0:
            return c
    return None


def run_worker(ctx, root, rank):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "lib", "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("WEIGHTFS_LIB", os.path.join(os.path.abspath(ctx.build), "libweightfs.so"))
    p = subprocess.run([ctx.torch_py, os.path.abspath(__file__), "--offload-worker", root, str(rank),
                        str(ctx.claims)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env)
    if p.returncode != 0:
        raise RuntimeError(f"offload worker ({root}, rank {rank}) failed: {p.stderr.strip()[-800:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def row_restart(ctx, r, order):
    res = {}
    for side in order:
        base = os.path.join(ctx.work, f"restart-r{r}")
        if side == "wfs":
            m = Mount(ctx.build, os.path.join(base, "store"), os.path.join(base, "mnt"), ctx.opts).start()
            try:
                first = run_worker(ctx, m.mnt, 0)
                if m.stop() != 0:
                    raise RuntimeError("row 5: the daemon exited non-zero at the restart")
                m.start()
                again = run_worker(ctx, m.mnt, 1)
            finally:
                rc = m.stop()
            if rc != 0:
                raise RuntimeError(f"row 5: the daemon exited with status {rc}")
            if first["written"] != first["tensors"] or again["claimed"] != again["tensors"]:
                raise RuntimeError(f"row 5: expected all written then all claimed: {first} / {again}")
        else:
            plain = os.path.join(base, "native")
            os.makedirs(plain, exist_ok=True)
            first = run_worker(ctx, plain, 0)
            again = run_worker(ctx, plain, 1)
        res[f"first/{side}"] = first["seconds"]
        res[f"again/{side}"] = again["seconds"]
        res["restart-bytes"] = first["bytes"]
    rm_tree(os.path.join(ctx.work, f"restart-r{r}"))
    settle()
    return res


# ---- row 6: sparse in-place change ---------------------------------------------------------------

def row_sparse(ctx, r, order):
    res = {}
    for side in order:
        base = os.path.join(ctx.work, f"sparse-r{r}")
        m = None
        if side == "wfs":
            m = Mount(ctx.build, os.path.join(base, "store"), os.path.join(base, "mnt"), ctx.opts).start()
            d = m.mnt
        else:
            d = os.path.join(base, "native")
            os.makedirs(d, exist_ok=True)
        try:
            path = os.path.join(d, "sparse.bin")
            t0 = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.pwrite(fd, r.to_bytes(8, "little"), 0)
                os.pwrite(fd, (side == "wfs").to_bytes(8, "little"), ctx.sparse_size - 8)
            finally:
                os.close(fd)
            t1 = time.perf_counter()
            os.sync()
            t2 = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.pwrite(fd, b"x", 4096)
            finally:
                os.close(fd)
            t3 = time.perf_counter()
            os.sync()
            st = os.stat(path)
            if st.st_size != ctx.sparse_size:
                raise RuntimeError(f"row 6 ({side}): size {st.st_size} after the change")
            res[f"sparse-write/{side}"] = (t1 - t0) * 1e3
            res[f"sparse-change/{side}"] = (t3 - t2) * 1e3
            if side == "wfs":
                res["sparse-disk/wfs"] = tree_blocks(os.path.join(m.store, "objects"))
                res["sparse-store/wfs"] = tree_blocks(m.store)
            else:
                res["sparse-disk/native"] = st.st_blocks * 512
        finally:
            if m is not None:
                rc = m.stop()
                if rc != 0:
                    raise RuntimeError(f"row 6: the daemon exited with status {rc}")
    rm_tree(os.path.join(ctx.work, f"sparse-r{r}"))
    return res


ROWS = {1: ("ingest", row_ingest), 2: ("writers", row_writers), 3: ("small", row_small),
        4: ("metadata", row_meta), 5: ("restart", row_restart), 6: ("sparse", row_sparse)}


# ---- report --------------------------------------------------------------------------------------

def series(results, key):
    return [x[key] for x in results if key in x]


def ratios(results, num, den):
    return [x[num] / x[den] for x in results if num in x and den in x and x[den]]


def f2(xs, fmt="{:.2f}"):
    return " ".join(fmt.format(x) for x in xs)


def hash_floor(ctx, results):
    """Row 1's note: the digest against the write, and what the check after the seal costs."""
    hs, ns = series(results, "hash-s"), series(results, "ingest-nosync/native")
    if not hs or not ns:
        return None
    native_s = [ctx.size / (x * 1e9) for x in ns]
    ceil = [n / (n + h) for n, h in zip(native_s, hs)]
    opens = series(results, "ingest-nosync-open-s")
    after = ""
    if opens:
        after = (f" The daemon checks an object sealed on a declared digest after the seal, on its "
                 f"checker thread (docs/integrity.md): an open right after the offload waits for that "
                 f"check, {med(opens):.3f} s here (rounds {f2(opens, '{:.3f}')}; `-o nosync` mount), "
                 f"time that is not in the ratios above: a trainer opens its tensor at backload, "
                 f"long after.")
    return (f"The digest: XXH3-128 of {human(ctx.size)} in memory takes {med(hs):.3f} s here "
            f"(rounds {f2(hs, '{:.3f}')}; one stream at one core's memory bandwidth, the dispatched SIMD "
            f"build), against {med(native_s):.3f} s for the native write. Hashed after the write (as the "
            f"daemon would, reading the file the kernel wrote through passthrough), ingest could reach at "
            f"most native ÷ (native + hash) = **{med(ceil):.2f}×** native. `weightfs.offload` hashes "
            f"on a second thread while it writes, and declares the digest on the open file before "
            f"close(2) (setxattr `user.weightfs.digest`); the seal takes it for new content instead of "
            f"reading the file again.{after}")


ASYNC_REQUESTS = ("RELEASE", "RELEASEDIR", "FORGET", "BATCH_FORGET")  # sent after the call returns


def waited(req):
    """Requests per operation that the caller waits for (all but ASYNC_REQUESTS)."""
    return sum(v for k, v in req.items() if k not in ASYNC_REQUESTS)


def requests_note(results, keys):
    """The FUSE requests per operation that the daemon counted in round 1, for keys (label, key)."""
    parts = []
    for label, key in keys:
        req = next((x[key] for x in results if key in x), None)
        if req is None:
            continue
        us = next((x["us/" + key[4:]] for x in results if "us/" + key[4:] in x), {})
        ops = ", ".join(f"{k} {v:.2f}" + (f" ({us[k]:.0f} µs)" if k in us else "")
                        for k, v in sorted(req.items(), key=lambda kv: -kv[1]))
        parts.append(f"{label}: {ops or 'none'} ({waited(req):.2f} waited for"
                     + (f"; {sum(us.get(k, 0) for k in req if k not in ASYNC_REQUESTS):.0f} µs in their handlers"
                        if us else "") + ")")
    if not parts:
        return None
    return ("FUSE requests per operation, counted by the daemon (`requests` in `user.weightfs.stats`, "
            "round 1; the caller waits for all but " + ", ".join(ASYNC_REQUESTS) + "; in parentheses the "
            "daemon's time in each opcode's handlers per operation, `request_ms`): " + "; ".join(parts) + ".")


def lock_note(results):
    """Row 2's note: the probe's open alone, and how long the daemon held fs->lock meanwhile."""
    po, pn = series(results, "probe-open-max/wfs"), series(results, "probe-open-max/native")
    slow, slow_ms = series(results, "lock-slow"), series(results, "lock-slow-ms")
    out = []
    if po:
        out.append(f"Worst open(2) alone, per round: weightfs {f2(po)} ms; native {f2(pn)} ms.")
    if slow:
        out.append(f"The daemon's fs->lock during the default mount's pass (`lock` in "
                   f"`user.weightfs.stats`, fs/core/lock.h), per round: {f2(slow, '{:.0f}')} holds of "
                   f"10 ms or more, {f2(slow_ms, '{:.0f}')} ms in all.")
    for i, x in enumerate(results):
        if "lock-max" in x:
            out.append(f"Round {i + 1} set the longest hold since the mount: {x['lock-max'][0]:.1f} ms "
                       f"({x['lock-max'][1]}).")
    cm = [x["commit-max"] for x in results if "commit-max" in x]
    if cm:
        out.append(f"The catalog's longest COMMIT since the mount, after each round: "
                   f"{' '.join(f'{a:.1f}' for a, _ in cm)} ms; its longest WAL headroom refill: "
                   f"{' '.join(f'{b:.1f}' for _, b in cm)} ms (`commits` in `user.weightfs.stats`).")
    return " ".join(out)


def fuse_floor(results):
    """Row 4's note: what the FUSE requests alone cost, against the native operations."""
    rtt = series(results, "rtt-us")
    nc, nu = series(results, "create/native"), series(results, "unlink/native")
    if not rtt or not nc or not nu:
        return None
    c_us, u_us = 1e6 / med(nc), 1e6 / med(nu)
    rc = next((waited(x["req/create"]) for x in results if "req/create" in x), 4)
    ru = next((waited(x["req/unlink"]) for x in results if "req/unlink" in x), 2)
    return (f"The FUSE floor: one request that the daemon answers at once (no lock, no catalog; "
            f"`tests/bench/roundtrip.py`) costs {med(rtt):.1f} µs here; a native create costs {c_us:.1f} µs "
            f"and a native unlink {u_us:.1f} µs. A create through FUSE waits for {rc:.2f} requests and an "
            f"unlink for {ru:.2f} (counted below), so with no work at all in the daemon create could reach "
            f"**{c_us / (rc * med(rtt)):.2f}×** and unlink **{u_us / (ru * med(rtt)):.2f}×** native. "
            + (requests_note(results, [("create", "req/create"), ("`ls -l`, per file", "req/ls"),
                                       ("stat", "req/stat"), ("unlink", "req/unlink")]) or ""))


def summarize(ctx, results):
    """{chart label: (median ratio, goal, lower_is_better)} plus the markdown block."""
    chart = {}
    out = []
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        memk = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal:"))
    out.append(f"Generated by `tests/bench/bench_write.py` on {now}.")
    out.append("")
    out.append(f"Command: `{ctx.command}`")
    out.append("")
    if ctx.quick:
        out.append("**--quick run: small sizes (a smoke test of the script); not the numbers to quote.**")
        out.append("")
    extra = "".join(" " + x for x in ctx.opts)
    out += ["| machine | |", "|---|---|",
            f"| date | {now} |", f"| kernel | {platform.release()} |",
            f"| cpu | {cpu} ({os.cpu_count()} CPUs) |", f"| memory | {memk / (1 << 20):.1f} GiB |",
            f"| weightfs | `{ctx.build}/weightfs STORE MNT -f{extra}` (default) and "
            f"`... -o nosync` (row 1); stores under {ctx.work} |",
            f"| native dir | {ctx.native_dir} (on "
            f"{sh(['findmnt', '-n', '-o', 'SOURCE,FSTYPE,OPTIONS', '-T', ctx.native_dir]) or '?'}) |",
            f"| rounds | {ctx.rounds} (sides interleaved, order alternating) |", ""]
    out.append("Ratios are weightfs / native of a speed (higher is better) unless marked; each is the "
               "median of the per-round ratios, next to the medians of the absolute numbers.")
    out.append("")

    def line(label, key, unit, goal, fmt="{:.3f}", chart_label=None, speed=True):
        w, n = series(results, f"{key}/wfs"), series(results, f"{key}/native")
        if not w:
            return None
        rs = ratios(results, f"{key}/wfs", f"{key}/native") if speed else \
            ratios(results, f"{key}/native", f"{key}/wfs")
        rm = med(rs)
        if chart_label:
            chart[chart_label] = (rm, goal, False)
        g = f"≥ {goal}" if goal else "—"
        rf = "{:.0f}" if "," in fmt else "{:.2f}"
        return (f"| {label} | {fmt.format(med(w))} | {fmt.format(med(n))} | **{rm:.2f}** | {g} |",
                f"{label}: weightfs {f2(w, rf)}; native {f2(n, rf)}; ratio {f2(rs)}")

    def table(title, head, rows, note=None):
        rows = [x for x in rows if x]
        if not rows:
            return
        out.extend([f"### {title}", "", head, "|---|---|---|---|---|"])
        out.extend(x[0] for x in rows)
        out.append("")
        out.append("Rounds — " + "; ".join(x[1] for x in rows) + ".")
        if note:
            out.extend(["", note])
        out.append("")

    if 1 in ctx.rows:
        table(f"1. Large tensor: {human(ctx.size)} from memory, `weightfs.offload(claim=False)` vs "
              f"write + close (GB/s)",
              "| durability | weightfs | native | ratio | goal |",
              [line("no fsync: `-o nosync` vs write + close", "ingest-nosync", "GB/s", 0.9,
                    chart_label="ingest, nosync"),
               line("durable: default mount, both sides write + fdatasync + close", "ingest-sync", "GB/s", 0.9,
                    chart_label="ingest, durable")],
              hash_floor(ctx, results))
    if 2 in ctx.rows:
        rows = [line(f"aggregate GB/s, 4 × {human(ctx.writer_size)} at once", "writers", "GB/s", 0.9,
                     chart_label="4 writers"),
                line("the same, `-o nosync` (equal durability: neither side syncs)", "writers-nosync",
                     "GB/s", None),
                line("the same, every writer fdatasyncs before close (equal durability: durable at "
                     "close)", "writers-durable", "GB/s", None)]
        for k, label, goal in (("probe-med", "probe: open + mmap, median (ms)", "< 10 ms (weightfs)"),
                               ("probe-max", "probe: open + mmap, worst (ms)", "< 10 ms (weightfs)"),
                               ("probe-whole-med", "probe with its page read, munmap, close: median (ms)", "—"),
                               ("probe-whole-max", "probe with its page read, munmap, close: worst (ms)", "—")):
            w, n = series(results, f"{k}/wfs"), series(results, f"{k}/native")
            if w:
                rows.append((f"| {label} | {med(w):.2f} | {med(n):.2f} | — | {goal} |",
                             f"{label}: weightfs {f2(w)}; native {f2(n)}"))
        pn = series(results, "probe-n/wfs"), series(results, "probe-n/native")
        table("2. Four writers at once (default mount vs native without fsync), and an mmap probe",
              "| | weightfs | native | ratio | goal |", rows,
              f"The probe: a fifth process opens an {human(PROBE_SIZE)} file sealed before, mmaps it, "
              f"reads one byte of one page, munmaps and closes it, every {PROBE_EVERY * 1e3:.0f} ms "
              f"while the writers run (probes per round: weightfs {f2(pn[0], '{:.0f}')}, native "
              f"{f2(pn[1], '{:.0f}')}). The goal is on open + mmap; the page read is the disk's "
              f"(after row 4's drop_caches the page is not cached, and the read queues behind the "
              f"writers' writeback), given for context. " + lock_note(results))
    if 3 in ctx.rows:
        tot = sum(ctx.sizes)
        rows = [line("write: temp name, close, rename", "small-write", "s", None, "{:.2f}", speed=False),
                line("read: open, mmap, 1 byte / page, close", "small-read", "s", None, "{:.2f}",
                     speed=False),
                line("**total**", "small", "s", 0.5, "{:.2f}", chart_label="small tensors", speed=False),
                line(f"write, {SMALL_RANKS} rank processes at once (each its own directory)", "small-ranks",
                     "s", None, "{:.2f}", speed=False)]
        table(f"3. Small tensors: {len(ctx.sizes):,} of 4 KiB–1 MiB, {tot / 1e9:.2f} GB per side "
              "(seconds; ratio = native s / weightfs s)",
              "| phase | weightfs (s) | native (s) | ratio | goal |", rows,
              "Sizes: log2(size) is the minimum of two uniform draws in [12, 20] (fixed seed, the same "
              "sizes on both sides): 4 KiB–1 MiB with small tensors more common, which keeps 20,000 "
              "tensors at ~1.3 GB per side (log-uniform sizes would be ~3.8 GB). The read phase runs "
              "right after the writes (warm). The many-writer line: the same tensors written by "
              f"{SMALL_RANKS} rank processes at once, each its slice into its own directory (rankN/), "
              "timed from a common start to the last rank's end (a node's ranks offloading through "
              "one mount). " +
              (requests_note(results, [("write (per tensor)", "req/small-write"),
                                       ("read (per tensor)", "req/small-read")]) or ""))
    if 4 in ctx.rows:
        table(f"4. Metadata: {ctx.files:,} empty files (files/s)",
              "| operation | weightfs | native | ratio | goal |",
              [line("create (O_CREAT\\|O_EXCL, close), after drop_caches", "create", "files/s", 0.5,
                    "{:,.0f}", chart_label="create"),
               line("`ls -l DIR > /dev/null`, warm (right after the creates)", "ls", "files/s", 0.5,
                    "{:,.0f}", chart_label="ls -l"),
               line("stat of every file (warm)", "stat", "files/s", None, "{:,.0f}", chart_label="stat"),
               line("unlink of every file", "unlink", "files/s", 0.5, "{:,.0f}", chart_label="unlink")],
              fuse_floor(results))
    if 5 in ctx.rows:
        out.append(f"### 5. Restart with claims: {ctx.claims:,} tensors of 4 KiB–1 MiB through "
                   "`weightfs.FrozenOffload` (seconds)")
        out.append("")
        if ctx.torch_py is None:
            out.append("**Skipped: no python3 with torch was found** ($WFS_PYTHON, this interpreter, "
                       "/usr/bin/python3; Debian: python3-torch).")
            out.append("")
        elif series(results, "first/wfs"):
            fw, aw = series(results, "first/wfs"), series(results, "again/wfs")
            fn, an = series(results, "first/native"), series(results, "again/native")
            rw, rn = ratios(results, "again/wfs", "first/wfs"), ratios(results, "again/native", "first/native")
            chart["restart (lower is better)"] = (med(rw), 0.1, True)
            nbytes = med(series(results, "restart-bytes"))
            out += ["| | weightfs | native (context) |", "|---|---|---|",
                    f"| first offload into rank0/ (s) | {med(fw):.2f} | {med(fn):.2f} |",
                    f"| after a restart, the same tensors into rank1/ (s) | {med(aw):.2f} | {med(an):.2f} |",
                    f"| **re-offload ÷ first** (lower is better; goal ≤ 0.1 on weightfs) | **{med(rw):.3f}** "
                    f"| {med(rn):.3f} |",
                    f"| first offload, native s ÷ weightfs s | {med(ratios(results, 'first/native', 'first/wfs')):.2f} | |",
                    "",
                    f"Rounds — weightfs first {f2(fw)}, again {f2(aw)}, ratio {f2(rw, '{:.3f}')}; native "
                    f"first {f2(fn)}, again {f2(an)}, ratio {f2(rn, '{:.3f}')}.", "",
                    f"{nbytes / 1e6:.0f} MB of float32 tensors (log-uniform sizes, fixed seed), default "
                    "mount, a fresh store each round; the weightfs restart is an unmount and a new "
                    "daemon on the same store, and the second pass claims every tensor by digest (no "
                    "bytes written). Native: the same two passes into a plain directory (each writes every "
                    "byte; no fsync). Times are OffloadSummary.seconds, each pass in a new process "
                    f"({ctx.torch_py}).", ""]
    if 6 in ctx.rows and series(results, "sparse-change/wfs"):
        cw, cn = series(results, "sparse-change/wfs"), series(results, "sparse-change/native")
        ww, wn = series(results, "sparse-write/wfs"), series(results, "sparse-write/native")
        dw, dn = series(results, "sparse-disk/wfs"), series(results, "sparse-disk/native")
        sw = series(results, "sparse-store/wfs")
        out += [f"### 6. Sparse in-place change: a {human(ctx.sparse_size)} sparse file, 1 byte "
                "rewritten at offset 4096", "",
                "| | weightfs | native |", "|---|---|---|",
                f"| write the sparse file + close (ms) | {med(ww):.2f} | {med(wn):.2f} |",
                f"| **the change**: open O_WRONLY, 1 byte at 4096, close (ms) | **{med(cw):.2f}** | "
                f"**{med(cn):.2f}** |",
                f"| **bytes on disk after** (weightfs: STORE/objects; native: the file) | **{med(dw):,.0f}** | "
                f"**{med(dn):,.0f}** |",
                f"| whole store (catalog included), bytes on disk | {med(sw):,.0f} | |", "",
                f"Rounds — change ms: weightfs {f2(cw)}, native {f2(cn)}; bytes on "
                f"disk: weightfs {' '.join(f'{x:,}' for x in dw)}, native {' '.join(f'{x:,}' for x in dn)}. "
                "A fresh store each round, default mount; sync before the bytes are counted "
                "(st_blocks × 512).", ""]
    return "\n".join(out).rstrip("\n"), chart


def draw_chart(ctx, chart, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"bench_write: matplotlib is not installed for {sys.executable} (Debian: apt-get install "
              "python3-matplotlib, for /usr/bin/python3): no chart drawn", file=sys.stderr)
        return False
    hi = [(k, v) for k, v in chart.items() if not v[2]]
    lo = [(k, v) for k, v in chart.items() if v[2]]
    if not hi and not lo:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [max(len(hi), 1), 1.6]})
    for ax, items, title in ((axes[0], hi, "weightfs / native (higher is better)"),
                             (axes[1], lo, "re-offload ÷ first\n(lower is better)")):
        ax.set_title(title, fontsize=10)
        if not items:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        xs = range(len(items))
        vals = [v[0] for _, v in items]
        lower = items[0][1][2]
        colors = []
        for _, (val, goal, lib) in items:
            met = goal is None or (val <= goal if lib else val >= goal)
            colors.append("#999999" if goal is None else ("#4c9a2a" if met else "#c0392b"))
        ax.bar(xs, vals, color=colors, width=0.6)
        for x, (_, (val, goal, _)) in zip(xs, items):
            ax.text(x, val, f"{val:.2f}" if not lower else f"{val:.3f}", ha="center", va="bottom", fontsize=8)
            if goal is not None:
                ax.hlines(goal, x - 0.42, x + 0.42, colors="black", linestyles="dashed", linewidth=1.2)
                ax.text(x + 0.44, goal, f"{goal}", fontsize=7, va="center")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([k.replace(" (lower is better)", "") for k, _ in items], rotation=30, ha="right",
                           fontsize=8)
        ax.set_ylim(0, max(max(vals), max((v[1] or 0) for _, v in items)) * 1.25)
        if not lower:
            ax.axhline(1.0, color="#555555", linewidth=0.6)
    from matplotlib.patches import Patch
    axes[0].legend(handles=[plt.Line2D([], [], color="black", linestyle="dashed", label="goal"),
                            Patch(color="#4c9a2a", label="goal met"), Patch(color="#c0392b", label="missed"),
                            Patch(color="#999999", label="no goal")], loc="upper right", fontsize=7)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    fig.suptitle(f"weightfs write side vs native, medians of {ctx.rounds} round(s), {when}"
                 + (" (--quick smoke run)" if ctx.quick else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"bench_write: chart written to {path}")
    return True


# ---- main ----------------------------------------------------------------------------------------

def round_line(r, rounds, res):
    parts = []
    for key, fmt in (("ingest-nosync", "{:.2f}"), ("ingest-sync", "{:.2f}"), ("writers", "{:.2f}"),
                     ("probe-max", "{:.1f}ms"), ("small", "{:.1f}s"), ("create", "{:.0f}"), ("ls", "{:.0f}"),
                     ("stat", "{:.0f}"), ("unlink", "{:.0f}"), ("first", "{:.2f}s"), ("again", "{:.2f}s"),
                     ("sparse-change", "{:.0f}ms"), ("sparse-disk", "{:.0f}B")):
        if f"{key}/wfs" in res:
            parts.append(f"{key} {fmt.format(res[key + '/wfs'])}/{fmt.format(res[key + '/native'])}")
    return f"round {r + 1}/{rounds} (weightfs/native): " + ", ".join(parts)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--offload-worker":
        return offload_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    ap = argparse.ArgumentParser(description="weightfs write side vs native, side by side (issue 10).")
    ap.add_argument("--build", required=True, help="build directory (weightfs, libweightfs.so)")
    ap.add_argument("--work", required=True, help="scratch directory (emptied; stores and native/ go here)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--tensors", type=int, help="row 3: small tensors (20,000; quick 500)")
    ap.add_argument("--files", type=int, help="row 4: files (20,000; quick 1,000)")
    ap.add_argument("--claims", type=int, help="row 5: tensors offloaded then claimed (2,000; quick 200)")
    ap.add_argument("--size", help="row 1: tensor size (1GiB; quick 64MiB)")
    ap.add_argument("--writer-size", help="row 2: each writer's tensor (512MiB; quick 64MiB)")
    ap.add_argument("--sparse-size", help="row 6: sparse file size (1GiB; quick 64MiB)")
    ap.add_argument("--rows", default="1,2,3,4,5,6", help="which rows to run (default all)")
    ap.add_argument("-o", action="append", default=[], help="mount option for every mount (repeatable)")
    ap.add_argument("--doc", help="markdown file whose bench-write block to rewrite")
    ap.add_argument("--chart", help="PNG to draw (default: bench-write.png next to --doc)")
    ap.add_argument("--no-chart", action="store_true")
    ap.add_argument("--chart-data", help="also write the chart's numbers here (JSON), to draw elsewhere")
    ap.add_argument("--chart-from", help="only draw --chart from numbers saved by --chart-data, and exit")
    ap.add_argument("--command", help="command line to record in the report")
    args = ap.parse_args()
    if args.chart_from:
        with open(args.chart_from) as f:
            saved = json.load(f)
        chart = {k: tuple(v) for k, v in saved["chart"].items()}
        where = argparse.Namespace(rounds=saved["rounds"], quick=saved["quick"])
        return 0 if draw_chart(where, chart, args.chart or "bench-write.png") else 1
    q = args.quick
    global BUILD
    BUILD = args.build
    ctx = argparse.Namespace(
        build=args.build, work=os.path.abspath(args.work), rounds=args.rounds, quick=q,
        size=parse_size(args.size or ("64MiB" if q else "1GiB")),
        writer_size=parse_size(args.writer_size or ("64MiB" if q else "512MiB")),
        sparse_size=parse_size(args.sparse_size or ("64MiB" if q else "1GiB")),
        files=args.files or (1000 if q else 20000), claims=args.claims or (200 if q else 2000),
        opts=[x for o in args.o for x in ("-o", o)], nonce=int.from_bytes(os.urandom(2), "little"),
        command=args.command or " ".join(["tests/bench/bench_write.py"] + sys.argv[1:]))
    ctx.sizes = small_sizes(args.tensors or (500 if q else 20000))
    try:
        ctx.rows = sorted({int(x) for x in args.rows.split(",") if x.strip()})
    except ValueError:
        ap.error("--rows: a comma-separated list of 1-6")
    if not set(ctx.rows) <= set(ROWS) or args.rounds < 1 or min(ctx.size, ctx.writer_size, ctx.files,
                                                                 ctx.claims, len(ctx.sizes)) < 1:
        ap.error("--rows must be within 1-6, counts and sizes positive")
    if ctx.sparse_size < 2 * PAGE:
        ap.error("--sparse-size must be at least 8 KiB")
    if os.geteuid() != 0:
        print("bench_write: run as root (FUSE mounts, drop_caches)", file=sys.stderr)
        return 1
    ctx.torch_py = torch_python() if 5 in ctx.rows else None
    if 5 in ctx.rows and ctx.torch_py is None:
        print("bench_write: row 5 (restart with claims) SKIPPED: no python3 with torch ($WFS_PYTHON, "
              f"{sys.executable}, /usr/bin/python3; Debian: python3-torch)", file=sys.stderr)

    for d in (os.path.join(ctx.work, "mnt-sync"), os.path.join(ctx.work, "mnt-nosync")):
        if os.path.ismount(d):
            unmount(d)
    rm_tree(ctx.work)
    ctx.native_dir = os.path.join(ctx.work, "native")
    os.makedirs(ctx.native_dir)
    mounts = [Mount(ctx.build, os.path.join(ctx.work, "store-sync"), os.path.join(ctx.work, "mnt-sync"),
                    ctx.opts),
              Mount(ctx.build, os.path.join(ctx.work, "store-nosync"), os.path.join(ctx.work, "mnt-nosync"),
                    ctx.opts + ["-o", "nosync"])]
    for m in mounts:
        if os.stat(m.store).st_dev != os.stat(ctx.native_dir).st_dev:
            print(f"bench_write: {m.store} and {ctx.native_dir} are on different filesystems; the "
                  "comparison would be meaningless", file=sys.stderr)
            return 1
    ctx.sync_dir = os.path.join(mounts[0].mnt, "bench")
    ctx.nosync_dir = os.path.join(mounts[1].mnt, "bench")
    print(f"bench_write: weightfs {ctx.work}/mnt-* vs native {ctx.native_dir}; {ctx.rounds} rounds, rows "
          f"{','.join(map(str, ctx.rows))}; {human(ctx.size)} tensor, 4 x {human(ctx.writer_size)} writers, "
          f"{len(ctx.sizes):,} small tensors ({sum(ctx.sizes) / 1e9:.2f} GB per side: log2 size = min of two "
          f"uniform draws in [12, 20]), {ctx.files:,} files, {ctx.claims:,} claims, "
          f"{human(ctx.sparse_size)} sparse file" + (" (--quick)" if q else ""), flush=True)
    results = []
    rc = 0
    try:
        drop_caches()
        for m in mounts:
            m.start()
            if os.stat(m.mnt).st_dev == os.stat(ctx.native_dir).st_dev:
                raise RuntimeError(f"{m.mnt} is not a separate mount")
        for d in (ctx.sync_dir, ctx.nosync_dir):
            os.makedirs(d)
        for d in (ctx.sync_dir, ctx.native_dir):  # row 2's probe file, sealed before the writers run
            write_tensor(os.path.join(d, "probe.bin"), tensor_bytes(PROBE_SIZE, ctx.nonce), False,
                         d != ctx.native_dir)
        for r in range(ctx.rounds):
            order = ["wfs", "native"] if r % 2 == 0 else ["native", "wfs"]
            res = {}
            for row in ctx.rows:
                if row == 5 and ctx.torch_py is None:
                    continue
                t0 = time.perf_counter()
                res.update(ROWS[row][1](ctx, r, order))
                print(f"  round {r + 1} row {row} ({ROWS[row][0]}): {time.perf_counter() - t0:.1f} s",
                      flush=True)
            results.append(res)
            print(round_line(r, ctx.rounds, res), flush=True)
    except Exception as e:  # report what failed, still unmount
        print(f"bench_write: {type(e).__name__}: {e}", file=sys.stderr)
        rc = 1
    finally:
        for m in mounts:
            mrc = m.stop()
            if mrc != 0:
                print(f"bench_write: the daemon of {m.mnt} exited with status {mrc} (log {m.log})",
                      file=sys.stderr)
                rc = 1
    if rc != 0:
        return rc
    block, chart = summarize(ctx, results)
    print()
    print(block)
    if args.chart_data:
        with open(args.chart_data, "w") as f:
            json.dump({"rounds": ctx.rounds, "quick": ctx.quick, "chart": chart}, f)
    if args.doc:
        if not args.no_chart:
            png = args.chart or os.path.join(os.path.dirname(os.path.abspath(args.doc)), "bench-write.png")
            draw_chart(ctx, chart, png)
        write_doc_block(args.doc, block, BEGIN, END, "bench_write")
    elif args.chart and not args.no_chart:
        draw_chart(ctx, chart, args.chart)
    if os.environ.get("WFS_BENCH_KEEP", "0") != "1":
        rm_tree(ctx.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
