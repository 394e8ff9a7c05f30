#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An unmodified trainer's offload through weightfs, side by side with a plain directory (issue 33).

The pattern is SkyRL's _offload_frozen_param_to_file, unchanged: open a temporary name 'wb' and write
the tensor's bytes, os.replace() it over the parameter's name, open that and map it (MAP_PRIVATE, as
torch.from_file(shared=False) does) and touch every page. No dtype/shape attributes are set.

Workloads (each rank a process, every rank's content distinct, as tensor-parallel shards are):
  large   RANKS x 8 tensors of 64 MiB
  layers  RANKS x the tensors of 4 Llama-shaped layers (hidden 768: 0.1 to 9 MiB)
  small   1 rank x 2,000 tensors of 4 KiB

Each round runs the native directory and every mount variant (-o options given with --variant) in
an order that rotates from round to round, after a sync and a drop of the page cache; the ratio of
a round is native seconds / variant seconds. Prints one line per workload and variant with the median
ratio and the rounds' ratios, and the FUSE requests a tensor sent in the first round, by opcode
(weightfsctl stat --json before and after; RELEASE and FORGET, which nothing waits for, apart).
Needs root (mounts, drop_caches).

  bench_plain.py --build build --work /var/tmp/wfs-plain [--rounds 5] [--ranks 4]
                 [--variant default=] [--variant all=passthrough_writes=all] [--only large,small]
                 [--doc docs/benchmarks.md --command "how it was run"]

--doc rewrites the block between <!-- bench-plain:begin --> and <!-- bench-plain:end --> with a table
of the medians (tests/bench/run-bench passes it; WFS_BENCH_PLAIN=0 skips this benchmark there).
"""
import argparse
import json
import mmap
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import write_doc_block  # noqa: E402

BEGIN = "<!-- bench-plain:begin -->"
END = "<!-- bench-plain:end -->"
GOALS = {"large": 0.9, "small": 0.5}  # issue 33: native time / weightfs time, at least


def layers(n=4, hidden=768, vocab=32000):
    inter, kv = hidden * 4, hidden // 6
    out = [("embed", vocab * hidden * 2)]
    for i in range(n):
        out += [("l%d.norm" % i, hidden * 2), ("l%d.q" % i, hidden * hidden * 2),
                ("l%d.k" % i, kv * hidden * 2), ("l%d.v" % i, kv * hidden * 2),
                ("l%d.o" % i, hidden * hidden * 2), ("l%d.up" % i, inter * hidden * 2),
                ("l%d.down" % i, inter * hidden * 2)]
    return out


WORKLOADS = {
    "large": (None, [("t%d" % i, 64 << 20) for i in range(8)]),
    "layers": (None, layers()),
    "small": (1, [("s%d" % i, 4096) for i in range(2000)]),
}


def offload(d, rank, tensors, stamp, q):
    src = bytearray(os.urandom(max(n for _, n in tensors)))
    os.makedirs(d, exist_ok=True)
    t = time.perf_counter()
    total = 0
    for i, (name, n) in enumerate(tensors):
        buf = memoryview(src)[:n]
        buf[0:16] = (stamp * 1000003 + rank * 7919 + i).to_bytes(16, "little")[:n]
        path = os.path.join(d, name)
        tmp = "%s.tmp%d" % (path, os.getpid())
        with open(tmp, "wb") as f:
            f.write(buf)
        os.replace(tmp, path)
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
            for off in range(0, len(m), 4096):
                total += m[off]
            m.close()
    q.put(time.perf_counter() - t)


def side(root, ranks, tensors, stamp):
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    q = mp.Queue()
    ps = [mp.Process(target=offload, args=(os.path.join(root, "r%d" % r), r, tensors, stamp, q))
          for r in range(ranks)]
    t = time.perf_counter()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    return time.perf_counter() - t


def requests(build, mnt):
    """The FUSE requests the daemon of @mnt has answered since its mount, by opcode."""
    out = subprocess.run([os.path.join(build, "weightfsctl"), "stat", "--json", mnt],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["daemon"]["since_mount"]["requests"]


def per_tensor(before, after, n):
    """'GETATTR 3.0, LOOKUP 2.0, ...': the requests one tensor sent, most first (RELEASE and FORGET
    apart: the kernel sends them without waiting for the answer)."""
    got = {op: (after.get(op, 0) - before.get(op, 0)) / n for op in after}
    waited = sorted(((c, op) for op, c in got.items() if c >= 0.05 and op not in ("RELEASE", "FORGET")),
                    reverse=True)
    total = sum(c for c, _ in waited)
    return "%.1f waited: %s" % (total, ", ".join("%s %.1f" % (op, c) for c, op in waited))


def mount(build, store, mnt, opts):
    os.makedirs(store, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    argv = [os.path.join(build, "weightfs"), store, mnt] + (["-o", opts] if opts else [])
    subprocess.run(argv, check=True)
    for _ in range(100):
        if os.path.ismount(mnt):
            return
        time.sleep(0.05)
    sys.exit("bench_plain: %s did not mount" % mnt)


def unmount(mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied); native/ and stores go here")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OPTS",
                    help="a mount to compare (default: default=, the default options)")
    ap.add_argument("--only", default="", help="comma-separated workloads (large, layers, small)")
    ap.add_argument("--doc", help="markdown file whose bench-plain block to rewrite")
    ap.add_argument("--command", default="", help="how this run was started, for the doc block")
    a = ap.parse_args()
    rows = []
    variants = [v.split("=", 1) for v in (a.variant or ["default="])]
    build = os.path.abspath(a.build)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    mnts = {}
    for name, opts in variants:
        mnts[name] = os.path.join(a.work, name, "mnt")
        mount(build, os.path.join(a.work, name, "store"), mnts[name], opts)
    try:
        for wl, (ranks, tensors) in WORKLOADS.items():
            if a.only and wl not in a.only.split(","):
                continue
            ranks = ranks or a.ranks
            ratios = {name: [] for name, _ in variants}
            sent = {}  # the first round's FUSE requests a tensor, per variant
            sides = [("native", os.path.join(a.work, "native"))] + [(n, mnts[n]) for n, _ in variants]
            for k in range(a.rounds):
                order = sides[k % len(sides):] + sides[:k % len(sides)]
                secs = {}
                for j, (name, root) in enumerate(order):
                    before = requests(build, root) if k == 0 and name != "native" else None
                    secs[name] = side(os.path.join(root, wl), ranks, tensors, k * 10 + j)
                    if before is not None:
                        sent[name] = per_tensor(before, requests(build, root), ranks * len(tensors))
                for name, _ in variants:
                    ratios[name].append(secs["native"] / secs[name])
            for name, opts in variants:
                med = statistics.median(ratios[name])
                rounds = " ".join("%.2f" % r for r in ratios[name])
                print("%-7s %d rank(s) x %4d tensors  %-8s (-o %s)  %.2f x native  (rounds %s)"
                      % (wl, ranks, len(tensors), name, opts or "defaults", med, rounds), flush=True)
                print("        FUSE requests a tensor: %s" % sent[name], flush=True)
                goal = GOALS.get(wl)
                rows.append("| %s | %d x %d | %s | **%.2f** | %s | %s | %s |"
                            % (wl, ranks, len(tensors), opts or "defaults", med, rounds,
                               "%.1f (%s)" % (goal, "met" if med >= goal else "missed") if goal else "-",
                               sent[name]))
    finally:
        for m in mnts.values():
            unmount(m)
    if a.doc and rows:
        block = "\n".join([
            "Generated by `%s` on %s, %s, kernel %s (%d CPUs): native seconds / weightfs seconds per round,"
            % (a.command or "tests/bench/bench_plain.py", time.strftime("%Y-%m-%d"), os.uname().nodename,
               os.uname().release, os.cpu_count() or 0),
            "median of %d rounds (higher is better; 1.0 is native speed)." % a.rounds, "",
            "| workload | ranks x tensors | -o | median | rounds | goal | FUSE requests a tensor (round 1) |",
            "|---|---|---|---|---|---|---|"] + rows)
        write_doc_block(a.doc, block, BEGIN, END, "bench_plain")


if __name__ == "__main__":
    main()
