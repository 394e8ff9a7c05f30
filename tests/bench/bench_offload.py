#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Trainer offload benchmark: restart vs first offload, and 4 ranks against a plain directory.

    bench_offload.py --build BUILD --work DIR [--rounds 3] [--models all|a,b] [--synthetic 512MiB]
                     [--ranks 4] [-o MOUNT_OPTS] [--doc docs/benchmarks.md] [--command CMD]

Needs root (mounts, drop_caches), torch, and the real weights (tests/realweights/fetch-weights). Run by
tests/bench/run-bench after bench.py. Two models: "real" is the TF.js package's tensors (default all
41 models: 8,317 tensors, 166.6 MB, many small tensors); "synthetic" is --synthetic bytes of bf16
tensors of 16 MiB each (random normal values), the shape of an LLM's frozen layers.

Each round and model, in a fresh store on DIR's filesystem, with one rank (this process) unless said:
  first      FrozenOffload(MNT/train, 0).offload(model): nothing is stored yet; every distinct content
             is written (a tensor equal to an earlier one of the same model is claimed)
  restart    unmount, mount the same store again (a new daemon; the page cache stays warm, as when
             a trainer process restarts on the same node), then
             skip:  FrozenOffload(MNT/train, 0).offload(model) again: the files are there
             claim: FrozenOffload(MNT/train2, 0).offload(model): new names (a trainer that removed its
                    directory, or another job): every tensor claimed, no bytes written
             ratios restart / first (goal <= 0.1)
  4 ranks    --ranks processes offload the model (FrozenOffload(MNT/ranks, rank)) and the same code
             into a plain directory next to the store; then per side: sync, echo 1 > drop_caches,
             the ranks map every tensor (weightfs.load) and touch one byte per 4 KiB page; growth of
             page cache (this cgroup's when the kernel reports it, else meminfo Cached) and bytes on
             disk (st_blocks of STORE/objects vs of the plain directory), each as a multiple of the
             model's distinct bytes. Expected: ~1x on weightfs, ~ranks x on the plain directory.
Every number is the median over rounds; every round's value is listed. --doc rewrites the block
between <!-- bench-offload:begin --> and <!-- bench-offload:end --> in that file.
"""

import argparse
import datetime
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import test_multirank  # noqa: E402  (real weights as torch tensors)
import wfstest  # noqa: E402

import torch  # noqa: E402

import weightfs  # noqa: E402

BEGIN = "<!-- bench-offload:begin -->"
END = "<!-- bench-offload:end -->"
PARAMS = {}  # name -> tensor; set before the ranks fork


def parse_size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    low = s.strip().lower().removesuffix("ib").removesuffix("b")
    return int(float(low[:-1]) * units[low[-1]]) if low[-1] in units else int(low)


class Mount:
    """build/weightfs STORE MNT -f in the background; start() waits for the mount, stop() unmounts and
    returns the daemon's exit status."""

    def __init__(self, build, store, mnt, opts):
        self.argv = [os.path.join(build, "weightfs"), store, mnt, "-f"] + opts
        self.mnt, self.proc = mnt, None
        self.log = os.path.join(os.path.dirname(mnt), "weightfs.log")
        os.makedirs(store, exist_ok=True)
        os.makedirs(mnt, exist_ok=True)

    def start(self):
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"weightfs did not mount {self.mnt} (log {self.log})")
            time.sleep(0.05)
        return self

    def stop(self):
        if self.proc is None:
            return 0
        for _ in range(100):
            if not os.path.ismount(self.mnt):
                break
            if subprocess.run(["fusermount3", "-u", self.mnt], stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.1)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc


# ---- models ----------------------------------------------------------------------------------

def real_model(models):
    package = subprocess.run([os.path.join(REPO, "tests", "realweights", "fetch-weights")],
                             stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    return {name: t for _, name, t in test_multirank.load_tensors(package, models)}


def synthetic_model(nbytes):
    g = torch.Generator().manual_seed(20261130)
    per = 16 << 20
    return {f"model.layers.{i}.mlp.weight": torch.randn((4096, per // 2 // 4096), generator=g)
            .to(torch.bfloat16) for i in range(max(1, nbytes // per))}


def distinct_bytes(params):
    seen = {}
    for t in params.values():
        seen.setdefault(weightfs.digest(t), t.numel() * t.element_size())
    return sum(seen.values()), sum(math.ceil(n / 4096) * 4096 for n in seen.values())


# ---- ranks -----------------------------------------------------------------------------------

def rank_offload(rank, root, conn):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", weightfs.WeightfsWarning)
    try:
        s = weightfs.FrozenOffload(root, rank).offload(PARAMS)
        conn.send({"ok": True, "written": s.written, "claimed": s.claimed, "seconds": s.seconds})
    except Exception as e:
        conn.send({"ok": False, "error": f"rank{rank}: {type(e).__name__}: {e}"})
    conn.close()


def rank_touch(rank, root, conn):
    torch.set_num_threads(1)
    try:
        fo = weightfs.FrozenOffload(root, rank)
        n = 0
        for name in fo.names():
            x = fo.load(name)
            if x.numel():
                n += int(x.reshape(-1).view(torch.uint8)[::4096].sum())
        conn.send({"ok": True, "sum": n})
    except Exception as e:
        conn.send({"ok": False, "error": f"rank{rank}: {type(e).__name__}: {e}"})
    conn.close()


def run_ranks(target, ranks, root):
    ctx = multiprocessing.get_context("fork")
    procs = []
    for r in range(ranks):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=target, args=(r, root, child))
        p.start()
        child.close()
        procs.append((p, parent))
    out = []
    for r, (p, conn) in enumerate(procs):
        try:
            out.append(conn.recv())
        except EOFError:
            out.append({"ok": False, "error": f"rank{r}: died"})
        p.join()
    bad = [x["error"] for x in out if not x["ok"]]
    if bad:
        raise RuntimeError(bad[0])
    return out


def cache_growth(ranks, root):
    rank_touch_warm(root)
    wfstest.drop_caches()
    m0, c0 = wfstest.cached_bytes()
    run_ranks(rank_touch, ranks, root)
    m1, c1 = wfstest.cached_bytes()
    return (c1 - c0) if c0 is not None and c1 is not None else (m1 - m0)


def rank_touch_warm(root):
    """Run the reader's code once in this process, so its code pages are mapped (and survive
    drop_caches) and are not counted as growth."""
    fo = weightfs.FrozenOffload(root, 0)
    for name in fo.names()[:4]:
        x = fo.load(name)
        if x.numel():
            int(x.reshape(-1).view(torch.uint8)[::4096].sum())


def disk_bytes(top):
    total = 0
    for d, _, files in os.walk(top):
        for f in files:
            total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


# ---- one round ---------------------------------------------------------------------------------

def one_round(args, label, params, dbytes, dpages, r):
    global PARAMS
    PARAMS = params
    base = os.path.join(args.work, f"r{r}-{label}")
    shutil.rmtree(base, ignore_errors=True)
    store, mnt, plain = (os.path.join(base, x) for x in ("store", "mnt", "plain"))
    os.makedirs(plain)
    m = Mount(args.build, store, mnt, args.o).start()
    res = {}
    try:
        s1 = weightfs.FrozenOffload(os.path.join(mnt, "train"), 0).offload(params)
        # Tensors of one model with equal bytes are claimed even in the first run.
        assert s1.skipped == 0 and s1.written > 0, s1[1:]
        res["first"] = s1.seconds
        if m.stop() != 0:
            raise RuntimeError("daemon exited non-zero at the restart")
        m.start()
        s2 = weightfs.FrozenOffload(os.path.join(mnt, "train"), 0).offload(params)
        assert s2.skipped == s2.tensors and s2.written_bytes == 0, s2[1:]
        s3 = weightfs.FrozenOffload(os.path.join(mnt, "train2"), 0).offload(params)
        assert s3.claimed == s3.tensors and s3.written_bytes == 0, s3[1:]
        res.update(skip=s2.seconds, claim=s3.seconds)

        run_ranks(rank_offload, args.ranks, os.path.join(mnt, "ranks"))
        run_ranks(rank_offload, args.ranks, os.path.join(plain, "ranks"))
        res["cache_wfs"] = cache_growth(args.ranks, os.path.join(mnt, "ranks")) / dpages
        res["cache_plain"] = cache_growth(args.ranks, os.path.join(plain, "ranks")) / dpages
        res["disk_wfs"] = disk_bytes(os.path.join(store, "objects")) / dpages
        res["disk_plain"] = disk_bytes(os.path.join(plain, "ranks")) / dpages
    finally:
        rc = m.stop()
        shutil.rmtree(base, ignore_errors=True)
    if rc != 0:
        raise RuntimeError(f"daemon exited with status {rc}")
    print(f"round {r + 1}/{args.rounds} {label}: first {res['first']:.2f} s, restart skip "
          f"{res['skip']:.2f} s ({res['skip'] / res['first']:.3f}x), claim {res['claim']:.2f} s "
          f"({res['claim'] / res['first']:.3f}x); {args.ranks} ranks page cache {res['cache_wfs']:.2f}x "
          f"vs plain {res['cache_plain']:.2f}x, disk {res['disk_wfs']:.2f}x vs {res['disk_plain']:.2f}x",
          flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (stores and plain dirs go here)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="all", help="real-weights models: 'all' or a,b,c")
    ap.add_argument("--synthetic", default="512MiB", help="bytes of the synthetic model (0: none)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("-o", action="append", default=[], help="mount options (repeatable)")
    ap.add_argument("--doc")
    ap.add_argument("--command")
    args = ap.parse_args()
    args.o = [x for o in args.o for x in ("-o", o)]
    torch.set_num_threads(1)  # the ranks fork; keep OpenMP's thread pool out of the parent
    os.makedirs(args.work, exist_ok=True)
    wfstest.drop_caches()  # fails early without root

    models = [("real", real_model(None if args.models == "all" else args.models.split(",")))]
    if parse_size(args.synthetic):
        models.append(("synthetic", synthetic_model(parse_size(args.synthetic))))
    results = {}
    facts = {}
    for label, params in models:
        dbytes, dpages = distinct_bytes(params)
        nbytes = sum(t.numel() * t.element_size() for t in params.values())
        facts[label] = (len(params), nbytes, dbytes, dpages)
        print(f"bench_offload: {label}: {len(params):,} tensors, {nbytes / 1e6:.1f} MB, distinct "
              f"{dbytes / 1e6:.1f} MB ({dpages / 1e6:.1f} MB in pages)", flush=True)
        results[label] = [one_round(args, label, params, dbytes, dpages, r) for r in range(args.rounds)]

    block = report(args, facts, results)
    print()
    print(block)
    if args.doc:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench import write_doc_block  # one copy, in bench.py

        write_doc_block(args.doc, block, BEGIN, END, "bench_offload")
    return 0


def report(args, facts, results):
    med = statistics.median
    out = [f"Generated by `tests/bench/bench_offload.py` on "
           f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, kernel "
           f"{platform.release()}, {os.cpu_count()} CPUs, torch {torch.__version__} (CPU tensors).", "",
           f"Command: `{args.command or ' '.join(sys.argv)}`" + (f"; mount options `{' '.join(args.o)}`"
                                                                  if args.o else "; default mount options"),
           "",
           "| model | tensors | bytes | distinct bytes |", "|---|---|---|---|"]
    for label, (n, nbytes, dbytes, _) in facts.items():
        out.append(f"| {label} | {n:,} | {nbytes:,} | {dbytes:,} |")
    out += ["", f"### Re-offload after a restart ÷ first offload (1 rank, goal ≤ 0.1; median of "
            f"{args.rounds} rounds)", "",
            "| model | first (s) | restart, files kept: skip (s) | ratio | restart, new names: claim (s) "
            "| ratio |", "|---|---|---|---|---|---|"]
    for label, rs in results.items():
        f, s, c = (med(x[k] for x in rs) for k in ("first", "skip", "claim"))
        out.append(f"| {label} | {f:.2f} | {s:.2f} | **{med(x['skip'] / x['first'] for x in rs):.3f}** | "
                   f"{c:.2f} | **{med(x['claim'] / x['first'] for x in rs):.3f}** |")
    out += ["", "Rounds (first / skip / claim, seconds): " + "; ".join(
        f"{label} " + ", ".join(f"{x['first']:.2f}/{x['skip']:.2f}/{x['claim']:.2f}" for x in rs)
        for label, rs in results.items()), "",
        f"### {args.ranks} ranks: page cache and disk, weightfs vs a plain directory (multiples of the "
        "distinct bytes in 4 KiB pages)", "",
        "| model | page cache, weightfs | page cache, plain | bytes on disk, weightfs (objects) | "
        "bytes on disk, plain |", "|---|---|---|---|---|"]
    for label, rs in results.items():
        out.append(f"| {label} | **{med(x['cache_wfs'] for x in rs):.2f}×** | "
                   f"{med(x['cache_plain'] for x in rs):.2f}× | **{med(x['disk_wfs'] for x in rs):.2f}×** | "
                   f"{med(x['disk_plain'] for x in rs):.2f}× |")
    out += ["", "Rounds (page cache weightfs/plain): " + "; ".join(
        f"{label} " + ", ".join(f"{x['cache_wfs']:.2f}/{x['cache_plain']:.2f}" for x in rs)
        for label, rs in results.items())]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
