#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Frozen-weight offload as N data-parallel trainer ranks do it, on real TF.js weights.

Each rank is its own process. Write phase: every rank writes every tensor of the selected models as
ROOT/rank{N}/<model>/<tensor name> the way trainers do: write a temporary name in the same directory
(`.<name>.tmp.<pid>`), close it, then os.rename() it to the final name. Verify phase (after all ranks
have written): every rank opens each tensor by name, mmaps it read-only and compares it with the
source bytes; an empty tensor is not mapped (mmap of length 0 fails), its size must be 0.

Tensor names contain '/': they become subdirectories. Names are used as they are; only what cannot be
a path is changed: an empty, '.' or '..' component gets a '_' prefix, a NUL byte becomes '_', a
component longer than 200 bytes is cut to 180 bytes plus '~' and 16 hex digits of its sha256 (room for
the temporary name within NAME_MAX), and a name that is also the directory of another name gets a
'~file' suffix. Two tensors that still map to one path are an error. The human-models package needs
none of these.

Then it prints the logical tensors and bytes written, the wall time and GB/s of each phase (logical
bytes of all ranks / wall time from the first rank's start to the last rank's end), `ls -l` of a few
names, `du -sh` of ROOT and of STORE/objects, and the dedup ratio: logical bytes / physical bytes of
STORE/objects, computed by walking the objects directory both by allocated blocks (st_blocks * 512)
and by file sizes (st_size). Without --store the same is computed for ROOT itself (the baseline: no
dedup). Exit status: 0 when every byte matched, 1 on a mismatch or an error (the first mismatching
name and byte offset are printed), 2 on bad usage.
"""

import argparse
import hashlib
import json
import mmap
import multiprocessing
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tfjs  # noqa: E402

NAME_MAX_COMPONENT = 200

# Set in the parent before the ranks fork, so every rank sees the tensors without a copy:
# a list of (relative path, source bytes).
TENSORS = []


def _component(c):
    c = c.replace("\0", "_")
    if c in ("", ".", ".."):
        return "_" + c
    b = c.encode("utf-8", "surrogateescape")
    if len(b) > NAME_MAX_COMPONENT:
        h = hashlib.sha256(b).hexdigest()[:16]
        c = b[:180].decode("utf-8", "ignore") + "~" + h
    return c


def tensor_paths(tensors):
    """Map [Tensor] to [(relative path 'model/name', data)], sanitizing only what must be."""
    rel = ["/".join(_component(c) for c in [t.model] + t.name.split("/")) for t in tensors]
    dirs = set()
    for r in rel:
        parts = r.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    rel = [r + "~file" if r in dirs else r for r in rel]
    seen = {}
    for r, t in zip(rel, tensors):
        if r in seen:
            raise tfjs.ModelError(
                f"{t.model}: tensors {seen[r]!r} and {t.name!r} map to the same path {r!r}"
            )
        seen[r] = t.name
    return [(r, t.data) for r, t in zip(rel, tensors)]


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def rank_write(rank, root, fsync, conn):
    """Write every tensor under root/rank{rank}; send {'ok', 'error', 'seconds'}."""
    t0 = time.perf_counter()
    base = os.path.join(root, f"rank{rank}")
    made = set()
    path = base
    try:
        for rel, data in TENSORS:
            path = os.path.join(base, rel)
            d, name = os.path.split(path)
            if d not in made:
                os.makedirs(d, exist_ok=True)
                made.add(d)
            tmp = os.path.join(d, f".{name}.tmp.{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                _write_all(fd, data)
                if fsync:
                    os.fdatasync(fd)
            finally:
                # On weightfs the close seals the file and returns the error of that work.
                os.close(fd)
            os.rename(tmp, path)
        conn.send({"ok": True, "seconds": time.perf_counter() - t0})
    except OSError as e:
        conn.send({"ok": False, "error": f"rank{rank}: writing {path}: {e.strerror or e}"})
    conn.close()


def _first_diff(a, b):
    n = min(len(a), len(b))
    step = 1 << 16
    for off in range(0, n, step):
        if a[off:off + step] != b[off:off + step]:
            for i in range(off, min(off + step, n)):
                if a[i] != b[i]:
                    return i
    return n


def rank_verify(rank, root, conn):
    """mmap every tensor of root/rank{rank} by name and compare it with the source bytes."""
    t0 = time.perf_counter()
    base = os.path.join(root, f"rank{rank}")
    path = base
    mismatches = 0
    first = None
    try:
        for rel, data in TENSORS:
            path = os.path.join(base, rel)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    got = b""
                else:
                    with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                        got = m[:]
            finally:
                os.close(fd)
            if got != data:
                mismatches += 1
                if first is None:
                    first = {"path": path, "offset": _first_diff(got, data),
                             "size": len(got), "expected_size": len(data)}
        conn.send({"ok": True, "seconds": time.perf_counter() - t0,
                   "mismatches": mismatches, "first": first})
    except OSError as e:
        conn.send({"ok": False, "error": f"rank{rank}: reading {path}: {e.strerror or e}"})
    conn.close()


def run_phase(ctx, target, ranks, args):
    """Run target(rank, *args, conn) in `ranks` processes; return (wall seconds, [result])."""
    procs = []
    t0 = time.perf_counter()
    for r in range(ranks):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=target, args=(r, *args, child))
        p.start()
        child.close()
        procs.append((p, parent))
    results = []
    for r, (p, conn) in enumerate(procs):
        try:
            results.append(conn.recv())
        except EOFError:
            results.append(None)
        p.join()
        if results[-1] is None:
            results[-1] = {"ok": False, "error": f"rank{r}: process died (exit {p.exitcode})"}
    return time.perf_counter() - t0, results


def walk_physical(top):
    """Return (files, sum of st_blocks * 512, sum of st_size) of the regular files under top."""
    files = blocks = size = 0
    for dirpath, _, filenames in os.walk(top):
        for fn in filenames:
            st = os.lstat(os.path.join(dirpath, fn))
            if not (st.st_mode & 0o170000 == 0o100000):
                continue
            files += 1
            blocks += st.st_blocks * 512
            size += st.st_size
    return files, blocks, size


def run_cmd(argv, out, cwd=None):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    print(f"$ {'cd ' + cwd + ' && ' if cwd else ''}" + " ".join(argv), file=out)
    print(r.stdout.rstrip("\n"), file=out)


def default_package():
    r = subprocess.run([os.path.join(HERE, "fetch-weights")], stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(1)
    return r.stdout.strip()


def main():
    ap = argparse.ArgumentParser(
        description="Offload real frozen weights as N trainer ranks, then mmap and verify them.")
    ap.add_argument("--root", required=True, help="directory the ranks write under (created)")
    ap.add_argument("--store", help="weightfs store behind ROOT's mount (for du and dedup ratio)")
    ap.add_argument("--ranks", type=int, default=4, help="number of rank processes (default 4)")
    ap.add_argument("--models", help="comma-separated subset of model names (default: all)")
    ap.add_argument("--package", help="unpacked package dir (default: fetch-weights' default)")
    ap.add_argument("--fsync", action="store_true",
                    help="fdatasync each file before close (native durability like weightfs)")
    ap.add_argument("--json", action="store_true",
                    help="print a JSON summary on stdout (the report goes to stderr)")
    args = ap.parse_args()
    if args.ranks < 1:
        ap.error("--ranks must be at least 1")
    out = sys.stderr if args.json else sys.stdout
    package = args.package or default_package()
    models = args.models.split(",") if args.models else None

    global TENSORS
    try:
        tensors = list(tfjs.iter_package(package, models))
        TENSORS = tensor_paths(tensors)
    except (tfjs.ModelError, OSError) as e:
        print(f"frozen_offload: {e}", file=sys.stderr)
        return 1
    n_models = len({t.model for t in tensors})
    per_rank = sum(len(d) for _, d in TENSORS)
    distinct = {}
    for _, d in TENSORS:
        distinct.setdefault(hashlib.sha256(d).digest(), len(d))
    del tensors
    logical = per_rank * args.ranks
    n_tensors = len(TENSORS) * args.ranks
    root = os.path.abspath(args.root)
    os.makedirs(root, exist_ok=True)

    print(f"package {package}", file=out)
    print(f"{args.ranks} ranks x {n_models} models, {len(TENSORS):,} tensors, "
          f"{per_rank / 1e6:.1f} MB per rank; {len(distinct):,} distinct contents "
          f"({sum(distinct.values()) / 1e6:.1f} MB)", file=out)

    ctx = multiprocessing.get_context("fork")
    summary = {"root": root, "store": args.store, "ranks": args.ranks, "models": n_models,
               "tensors": n_tensors, "logical_bytes": logical, "distinct_contents": len(distinct),
               "distinct_bytes": sum(distinct.values())}

    w_wall, w_res = run_phase(ctx, rank_write, args.ranks, (root, args.fsync))
    errors = [r["error"] for r in w_res if not r["ok"]]
    summary["write_seconds"] = w_wall
    summary["write_gbps"] = logical / w_wall / 1e9
    print(f"write:  {n_tensors:,} tensors, {logical / 1e6:.1f} MB in {w_wall:.2f} s "
          f"= {logical / w_wall / 1e9:.3f} GB/s", file=out)
    if errors:
        for e in errors:
            print(f"frozen_offload: {e}", file=sys.stderr)
        summary["ok"] = False
        summary["error"] = errors[0]
        if args.json:
            print(json.dumps(summary))
        return 1

    v_wall, v_res = run_phase(ctx, rank_verify, args.ranks, (root,))
    errors = [r["error"] for r in v_res if not r["ok"]]
    mismatches = sum(r.get("mismatches", 0) for r in v_res if r["ok"])
    first = next((r["first"] for r in v_res if r["ok"] and r["first"]), None)
    summary["verify_seconds"] = v_wall
    summary["verify_gbps"] = logical / v_wall / 1e9
    summary["mismatches"] = mismatches
    print(f"verify: mmap + compare {logical / 1e6:.1f} MB in {v_wall:.2f} s "
          f"= {logical / v_wall / 1e9:.3f} GB/s, {mismatches} mismatching tensors", file=out)

    some = sorted(TENSORS, key=lambda x: -len(x[1]))[:1] + TENSORS[:2]
    names = [os.path.join(f"rank{r}", rel) for rel, _ in some for r in sorted({0, args.ranks - 1})]
    run_cmd(["ls", "-l", "--"] + names, out, cwd=root)
    run_cmd(["du", "-sh", root], out)

    if args.store:
        objects = os.path.join(args.store, "objects")
        run_cmd(["du", "-sh", objects], out)
        what = f"{objects}"
    else:
        objects = root
        what = f"{root} (no store: the files themselves)"
    files, blocks, size = walk_physical(objects)
    summary.update({"physical_files": files, "physical_blocks_bytes": blocks,
                    "physical_size_bytes": size})
    r_blocks = logical / blocks if blocks else None
    r_size = logical / size if size else None
    summary["dedup_ratio_blocks"] = r_blocks
    summary["dedup_ratio_size"] = r_size
    print(f"physical: {what}: {files:,} files, {blocks / 1e6:.1f} MB allocated "
          f"(st_blocks*512), {size / 1e6:.1f} MB by st_size", file=out)

    def ratio(r):
        return f"{r:.2f}x" if r is not None else "n/a (0 bytes)"

    print(f"dedup ratio (logical / physical): {ratio(r_blocks)} by allocated blocks, "
          f"{ratio(r_size)} by st_size (ideal {logical / max(1, sum(distinct.values())):.2f}x "
          f"by st_size)", file=out)

    ok = not errors and mismatches == 0
    summary["ok"] = ok
    for e in errors:
        print(f"frozen_offload: {e}", file=sys.stderr)
    if first:
        summary["first_mismatch"] = first
        print(f"frozen_offload: MISMATCH {first['path']} at byte offset {first['offset']} "
              f"(size {first['size']}, expected {first['expected_size']}); "
              f"{mismatches} tensors differ", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    print("frozen_offload: " + ("all bytes match" if ok else "FAILED"), file=out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
