#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Four trainer ranks offload one real model's frozen tensors to weightfs, map them back, restart.

    test_multirank.py --mnt MNT --store STORE --plain DIR --state FILE --phase first|restart
                      [--models a,b|all] [--ranks 4] [--package PKG]

Run by tests/python/test_python.sh BUILD multirank, which mounts STORE on MNT for --phase first, then
unmounts, mounts it again (a new daemon) and runs --phase restart. DIR is a plain directory on the
store's filesystem: the same trainer writing there is the baseline. Tensors: real TF.js weights
(tests/realweights/fetch-weights, tfjs.py); default models blazeface, blazeface-back (byte-identical
twins), nanodet (12 empty tensors), faceres-deep and movenet-thunder: 761 tensors, 35.1 MB per rank, 431
distinct contents.

Each rank is a process (fork) and offloads every tensor twice: through the package
(FrozenOffload(MNT/pkg, rank).offload: claim first, write on a miss) and through unchanged trainer code,
pattern (a): write MNT/a/rank{N}/<model>/<name>.bin if absent, then torch.from_file(shared=False,
uint8).view(dtype).view(shape).

Phase first, checks:
  offload     every rank's package offload and pattern-(a) writes succeed; the package reports each
              tensor written or claimed
  bytes       after `echo 1 > /proc/sys/vm/drop_caches`, every rank maps every tensor of both trees and
              compares every byte with the source
  objects     the set of object names in STORE/objects == the digests of the distinct contents (+ the
              one manifest object: the 4 ranks' manifests are identical), sum of object sizes ==
              distinct bytes + manifest bytes: one physical copy of everything
  page-cache  growth of page cache while the 4 ranks read everything: < 2x the distinct bytes rounded
              up to 4 KiB pages. Measured as the page cache charged to this test's memory cgroup when
              the kernel reports one (immune to other work on a shared machine), else /proc/meminfo
              Cached. Tolerance 2x: the catalog's pages, the manifests and the noise of a shared machine
              fit in it; 4 copies (one per rank) would not.
  plain       the same ranks doing the same to DIR (a plain directory): growth there is reported, and
              weightfs's growth must be below half of it (plain is ~8x: 4 ranks x 2 trees)
Phase restart (after the remount):
  skip        FrozenOffload(MNT/pkg, rank).offload again in 4 ranks: every tensor skipped (its file
              holds its digest), 0 bytes written
  claims      FrozenOffload(MNT/restart, rank).offload (names never used): every tensor (the
              empty ones too) claimed, 0 bytes written
  pattern-a   the write-if-absent code writes nothing
  objects     STORE/objects is exactly as it was at the end of phase first (names, sizes, mtimes)
  faster      the skip re-offload takes < 0.5x the wall time of the first offload, the claim
              re-offload < 1x (reported: both times and ratios). In the first offload ranks 1-3
              already claim most of what rank 0 wrote, and a claim, like a seal, commits the catalog
              with a sync: for these small tensors (46 KB on average) a claim costs about a quarter of
              a write (tests/bench/bench_offload.py measures one rank: first vs restart)
  bytes       rank 0 maps every tensor again and compares every byte
Prints one line per check and "python-multirank[PHASE]: N passed, N failed".
"""

import argparse
import json
import math
import multiprocessing
import os
import shutil
import sys
import time
import warnings

import wfstest
from wfstest import Tests

REAL = os.path.join(wfstest.REPO, "tests", "realweights")
sys.path.insert(0, REAL)
import frozen_offload  # noqa: E402  (tensor_paths: the same file names as the demo)
import tfjs  # noqa: E402

import torch  # noqa: E402

import weightfs  # noqa: E402

DEFAULT_MODELS = "blazeface,blazeface-back,nanodet,faceres-deep,movenet-thunder"
TORCH_DTYPES = {"float32": torch.float32, "int32": torch.int32, "uint8": torch.uint8,
                "int8": torch.int8, "int16": torch.int16, "float16": torch.float16, "bool": torch.bool,
                "uint16": torch.int16}  # uint16 (quantized) as int16: same bytes, torch 1.13 has no uint16

# Set before the ranks fork: [(rel path, param name, tensor)]; read-only in the ranks.
TENSORS = []


def to_tensor(t):
    dt = TORCH_DTYPES.get(t.dtype)
    if dt is None:  # complex64 and the like: their bytes, as uint8
        return torch.frombuffer(bytearray(t.data), dtype=torch.uint8) if t.data else torch.empty(0, dtype=torch.uint8)
    shape = tuple(t.shape)
    if len(t.data) == 0:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(t.data), dtype=dt).view(shape)


def load_tensors(package, models):
    tensors = list(tfjs.iter_package(package, models))
    rel = [r for r, _ in frozen_offload.tensor_paths(tensors)]
    return [(r, r, to_tensor(t)) for r, t in zip(rel, tensors)]


def flat_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


# ---- rank bodies (run in forked processes) ---------------------------------------------------

def rank_offload(rank, root, a_root, conn):
    """Package offload into root, then pattern (a) into a_root. Sends counts and seconds."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", weightfs.WeightfsWarning)  # the plain side warns once per rank
    out = {"ok": True}
    try:
        t0 = time.perf_counter()
        fo = weightfs.FrozenOffload(root, rank)
        s = fo.offload({name: t for _, name, t in TENSORS})
        out.update(pkg_seconds=time.perf_counter() - t0, tensors=s.tensors, written=s.written,
                   claimed=s.claimed, skipped=s.skipped, written_bytes=s.written_bytes, bytes=s.bytes)
        t0 = time.perf_counter()
        a_written = 0
        for rel, _, t in TENSORS:
            path = os.path.join(a_root, f"rank{rank}", rel + ".bin")
            if os.path.exists(path):  # pattern (a): write once if absent
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(memoryview(t.numpy()))  # the buffer protocol: no intermediate bytes object
            a_written += 1
        out.update(a_seconds=time.perf_counter() - t0, a_written=a_written)
    except Exception as e:  # reported, not raised: the parent counts it
        out = {"ok": False, "error": f"rank{rank}: {type(e).__name__}: {e}"}
    conn.send(out)
    conn.close()


def rank_verify(rank, root, a_root, conn):
    """Map every tensor of both trees and compare every byte. Sends mismatch counts."""
    torch.set_num_threads(1)
    conn.send(verify(rank, root, a_root, TENSORS))
    conn.close()


def verify(rank, root, a_root, tensors):
    out = {"ok": True, "mismatches": 0, "first": None, "mapped": 0}
    try:
        fo = weightfs.FrozenOffload(root, rank)
        maps = []
        for rel, name, t in tensors:
            want = flat_bytes(t)
            x = fo.load(name)
            nbytes = t.numel() * t.element_size()
            y = torch.from_file(os.path.join(a_root, f"rank{rank}", rel + ".bin"), shared=False,
                                size=nbytes, dtype=torch.uint8).view(t.dtype).view(t.shape)
            for got, what in ((x, "package"), (y, "pattern a")):
                if got.dtype != t.dtype or tuple(got.shape) != tuple(t.shape) or \
                        not torch.equal(flat_bytes(got), want):
                    out["mismatches"] += 1
                    out["first"] = out["first"] or f"rank{rank} {what} {rel}"
            maps.append((x, y))
            out["mapped"] += 2
    except Exception as e:
        out = {"ok": False, "error": f"rank{rank}: {type(e).__name__}: {e}"}
    return out


def run_ranks(target, ranks, *args):
    ctx = multiprocessing.get_context("fork")
    procs = []
    t0 = time.perf_counter()
    for r in range(ranks):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=target, args=(r, *args, child))
        p.start()
        child.close()
        procs.append((p, parent))
    res = []
    for r, (p, conn) in enumerate(procs):
        try:
            res.append(conn.recv())
        except EOFError:
            res.append({"ok": False, "error": f"rank{r}: died"})
        p.join()
        if p.exitcode != 0 and res[-1].get("ok"):
            res[-1] = {"ok": False, "error": f"rank{r}: exit status {p.exitcode}"}
    return time.perf_counter() - t0, res


def errors_of(res):
    return [r["error"] for r in res if not r.get("ok")]


def page_cache_growth(target, ranks, *args):
    """Drop caches, run the verify ranks, return (results, meminfo growth, cgroup growth or None).
    The parent first runs the same code on a few tensors, so the pages of the code it runs (libtorch
    is hundreds of MB, and mapped pages survive drop_caches) are not counted as growth."""
    verify(0, *args, TENSORS[:8])
    wfstest.drop_caches()
    m0, c0 = wfstest.cached_bytes()
    _, res = run_ranks(target, ranks, *args)
    m1, c1 = wfstest.cached_bytes()
    return res, m1 - m0, (c1 - c0 if c0 is not None and c1 is not None else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mnt", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--plain", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--phase", choices=["first", "restart"], required=True)
    ap.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated, or 'all'")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--package", help="unpacked package (default: fetch-weights' default)")
    args = ap.parse_args()
    T = Tests(f"python-multirank[{args.phase}]")
    torch.set_num_threads(1)

    package = args.package
    if not package:
        import subprocess

        r = subprocess.run([os.path.join(REAL, "fetch-weights")], stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            T.fail("fetch", "the real weights are not available (tests/realweights/fetch-weights)")
            return T.finish()
        package = r.stdout.strip()
    global TENSORS
    TENSORS = load_tensors(package, None if args.models == "all" else args.models.split(","))
    distinct = {}
    for _, _, t in TENSORS:
        b = bytes(flat_bytes(t).numpy())
        distinct.setdefault(weightfs.digest(b), len(b))
    dbytes = sum(distinct.values())
    dpages = sum(math.ceil(n / 4096) * 4096 for n in distinct.values())
    per_rank = sum(t.numel() * t.element_size() for _, _, t in TENSORS)
    print(f"# {len(TENSORS):,} tensors, {per_rank / 1e6:.1f} MB per rank, {len(distinct):,} distinct "
          f"contents, {dbytes / 1e6:.1f} MB ({dpages / 1e6:.1f} MB in 4 KiB pages), {args.ranks} ranks",
          flush=True)
    root, a_root = os.path.join(args.mnt, "pkg"), os.path.join(args.mnt, "a")
    if args.phase == "first":
        first(T, args, root, a_root, distinct, dbytes, dpages)
    else:
        restart(T, args, root, a_root)
    return T.finish()


def first(T, args, root, a_root, distinct, dbytes, dpages):
    state = {}
    secs, res = run_ranks(rank_offload, args.ranks, root, a_root)
    errs = errors_of(res)
    state["first_seconds"] = secs
    n = len(TENSORS)
    if errs:
        T.fail("offload: 4 ranks, package + pattern a", errs[0])
        with open(args.state, "w") as f:
            json.dump(state, f)
        return
    wr = sum(r["written"] for r in res)
    cl = sum(r["claimed"] for r in res)

    @T.check(f"offload: {args.ranks} ranks x {n:,} tensors, package + pattern a, in {secs:.2f} s "
             f"(package: {wr:,} written, {cl:,} claimed)")
    def _():
        for r in res:
            assert r["tensors"] == n and r["written"] + r["claimed"] == n and r["skipped"] == 0, r
            assert r["a_written"] == n, r

    vres, grow_m, grow_c = page_cache_growth(rank_verify, args.ranks, root, a_root)

    @T.check(f"bytes: every rank maps all {n:,} tensors of both trees, every byte equal")
    def _():
        e = errors_of(vres)
        assert not e, e[0]
        bad = sum(r["mismatches"] for r in vres)
        assert bad == 0, f"{bad} mismatching tensors, first {next(r['first'] for r in vres if r['first'])}"
        assert sum(r["mapped"] for r in vres) == 2 * n * args.ranks

    manifest = os.path.join(root, "rank0", weightfs.frozen.MANIFEST)
    objs = wfstest.objects(args.store)

    @T.check(f"objects: one object per distinct content ({len(distinct):,}) + the ranks' one manifest; "
             f"{dbytes:,} bytes held once")
    def _():
        mdig = weightfs.digest_file(manifest)
        for r in range(1, args.ranks):
            other = os.path.join(root, f"rank{r}", weightfs.frozen.MANIFEST)
            assert weightfs.digest_file(other) == mdig, f"rank{r}'s manifest differs from rank0's"
        names = {k.replace("/", "") for k in objs}
        want = set(distinct) | {mdig}
        assert names == want, f"{len(names - want)} unexpected objects, {len(want - names)} missing"
        held = sum(v[0] for v in objs.values())
        assert held == dbytes + os.path.getsize(manifest), f"objects hold {held:,} bytes, expected " \
            f"{dbytes + os.path.getsize(manifest):,}"

    how = "cgroup page cache" if grow_c is not None else "meminfo Cached"
    grow = grow_c if grow_c is not None else grow_m
    print(f"# page cache after {args.ranks} ranks read everything: cgroup +{(grow_c or 0) / 1e6:.1f} MB, "
          f"meminfo Cached +{grow_m / 1e6:.1f} MB; distinct {dbytes / 1e6:.1f} MB "
          f"({dpages / 1e6:.1f} MB in pages)", flush=True)

    @T.check(f"page-cache: {args.ranks} ranks x 2 trees grew {how} by {grow / 1e6:.1f} MB = "
             f"{grow / dpages:.2f}x the distinct pages (< 2x)")
    def _():
        assert grow < 2 * dpages, f"{grow / dpages:.2f}x"

    # The same trainer on a plain directory.
    shutil.rmtree(args.plain, ignore_errors=True)
    proot, pa = os.path.join(args.plain, "pkg"), os.path.join(args.plain, "a")
    _, pres = run_ranks(rank_offload, args.ranks, proot, pa)
    pv, pgrow_m, pgrow_c = page_cache_growth(rank_verify, args.ranks, proot, pa)
    pgrow = pgrow_c if pgrow_c is not None else pgrow_m
    print(f"# plain directory: page cache +{pgrow / 1e6:.1f} MB ({how}) = {pgrow / dpages:.2f}x the "
          f"distinct pages; meminfo Cached +{pgrow_m / 1e6:.1f} MB", flush=True)

    @T.check(f"plain: same ranks on a plain directory grew {pgrow / 1e6:.1f} MB "
             f"({pgrow / dpages:.2f}x); weightfs {grow / dpages:.2f}x < half of that")
    def _():
        e = errors_of(pres) + errors_of(pv)
        assert not e, e[0]
        assert sum(r["mismatches"] for r in pv) == 0
        assert grow < pgrow / 2, f"weightfs {grow:,} vs plain {pgrow:,}"
    shutil.rmtree(args.plain, ignore_errors=True)

    state.update(objects=objs, pkg_seconds=max(r["pkg_seconds"] for r in res))
    with open(args.state, "w") as f:
        json.dump(state, f)


def restart(T, args, root, a_root):
    with open(args.state) as f:
        state = json.load(f)
    before = {k: tuple(v) for k, v in state.get("objects", {}).items()}
    first_secs = state.get("first_seconds")
    n = len(TENSORS)
    if first_secs is None or not before:
        T.fail("restart", "phase first did not complete")
        return

    skip_secs, res = run_ranks(rank_offload, args.ranks, root, a_root)

    @T.check(f"skip: {args.ranks} ranks re-offload into the same names: every tensor skipped, "
             f"0 bytes written, {skip_secs:.2f} s = {skip_secs / first_secs:.2f}x the first offload")
    def _():
        e = errors_of(res)
        assert not e, e[0]
        for r in res:
            assert r["skipped"] == n and r["written_bytes"] == 0, r
            assert r["a_written"] == 0, f"pattern a wrote {r['a_written']} files again"
        assert skip_secs < 0.5 * first_secs, f"{skip_secs / first_secs:.2f}x"

    # New names for the package (claims); pattern (a) runs against its existing files, as in a restart.
    claim_root = os.path.join(args.mnt, "restart")
    claim_secs, cres = run_ranks(rank_offload, args.ranks, claim_root, a_root)
    claimed = sum(r.get("claimed", 0) for r in cres)

    @T.check(f"claims: {args.ranks} ranks offload into new names after the restart: {claimed:,} "
             f"claimed, 0 bytes written, {claim_secs:.2f} s = {claim_secs / first_secs:.2f}x the first")
    def _():
        e = errors_of(cres)
        assert not e, e[0]
        for r in cres:
            assert r["claimed"] == n and r["written_bytes"] == 0, r
        assert claim_secs < first_secs, f"{claim_secs / first_secs:.2f}x"

    @T.check(f"objects: STORE/objects unchanged by the restart ({len(before):,} objects)")
    def _():
        now = wfstest.objects(args.store)
        assert now == before, f"{len(set(now) - set(before))} new, {len(set(before) - set(now))} gone, " \
            f"{sum(1 for k in now if k in before and now[k] != before[k])} changed"

    _, vres = run_ranks(rank_verify, 1, root, a_root)

    @T.check("bytes: after the restart rank 0 maps every tensor again, every byte equal")
    def _():
        e = errors_of(vres)
        assert not e, e[0]
        assert vres[0]["mismatches"] == 0, vres[0]["first"]


if __name__ == "__main__":
    sys.exit(main())
