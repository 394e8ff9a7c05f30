#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Side-by-side benchmark: the same work on weightfs and on the backing filesystem directly.

    bench.py --wfs DIR --native DIR [--daemon-pid PID] [--rounds 5] [--size 2GiB]
             [--cache-size 512MiB] [--no-mount] [--doc docs/benchmarks.md] [--command CMD]

--wfs is a directory on the weightfs mount, --native a plain directory on the filesystem that holds the
store. Every round runs each benchmark on both sides (the side that goes first alternates), and the
report gives, per benchmark, the median of the per-round ratios (weightfs / native) and the medians
of the absolute numbers. Disks here are noisy, hence interleaving and medians.

Benchmarks (the method is identical on both sides):
  ingest      write --size bytes in 16 MiB chunks (each chunk stamped with round and index, so no two
              chunks or rounds have the same content) and close. Native: write + fdatasync + close, the
              same durability as weightfs, whose close fdatasyncs and publishes the object. GB/s from
              open to the return of close.
  cold mmap   sync + drop_caches, then open, mmap(PROT_READ), read, munmap, close the file just
              ingested. Two read methods: "touch" reads one byte per 4 KiB page (mmap extended slicing
              m[i:i+16MiB:4096], a C loop: page faults and I/O, like the design's "mmap touch");
              "copy" copies every byte into a 16 MiB buffer (buf[:] = memoryview(m)[i:i+16MiB]).
  warm mmap   the same right after the cold pass (which is the warm-up, with the same method), so
              the pages are in the page cache but each timed pass maps the file afresh; the round's
              value is the median of 3 timed passes (a warm pass of 2 GiB takes tens of ms).
  page cache  the same --cache-size content under 4 names on each side (written once); each round:
              sync + drop_caches, touch all 4 names fully through mmap, and report the growth of
              `Cached:` in /proc/meminfo as a multiple of the content size. Native gives ~4x; weightfs
              with passthrough ~1x (one object, one page-cache copy).
  daemon RSS  VmRSS and VmHWM of the daemon (--daemon-pid) after the bench.

--no-mount compares a plain directory with a plain directory (ratios ~1): a test of this script.
drop_caches needs root; when it fails the script says so and stops (--no-drop skips the cold and
page-cache benchmarks instead). --doc rewrites the block between <!-- bench:begin --> and
<!-- bench:end --> in that file (created when missing); text around the block is kept.
"""

import argparse
import datetime
import mmap
import os
import platform
import statistics
import subprocess
import sys
import time

CHUNK = 16 << 20
PAGE = 4096
WARM_PASSES = 3
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"


def parse_size(s):
    s = s.strip()
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    low = s.lower().removesuffix("ib").removesuffix("b")
    if low and low[-1] in units:
        return int(float(low[:-1]) * units[low[-1]])
    return int(low)


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} bytes"


def write_doc_block(doc, block, begin, end, who):
    """Replace the text between the markers @begin and @end in markdown file @doc with @block (the
    file and the markers are created when missing; the text around them is kept). Written to a
    temporary file and renamed over @doc. Shared by every benchmark script here."""
    try:
        with open(doc) as f:
            text = f.read()
    except FileNotFoundError:
        text = "# weightfs benchmarks\n"
    if begin in text and end in text and text.index(begin) < text.index(end):
        head = text[: text.index(begin)]
        tail = text[text.index(end) + len(end):]
    else:
        head, tail = text.rstrip("\n") + "\n\n", "\n"
    tmp = doc + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{head}{begin}\n{block}\n{end}{tail}")
    os.replace(tmp, doc)
    print(f"\n{who}: wrote the results into {doc}")


class DropError(Exception):
    pass


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        raise DropError(f"cannot drop the page cache (echo 3 > /proc/sys/vm/drop_caches: "
                        f"{e.strerror}); run as root, or pass --no-drop") from None


def meminfo_kib(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def proc_status(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def write_file(path, size, stamp, durable):
    """Write size bytes in CHUNK pieces; fdatasync before close when durable. Returns seconds."""
    buf = bytearray(os.urandom(CHUNK)) if not hasattr(write_file, "buf") else write_file.buf
    write_file.buf = buf
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        off = 0
        i = 0
        while off < size:
            n = min(CHUNK, size - off)
            buf[0:16] = stamp.to_bytes(8, "little") + i.to_bytes(8, "little")
            view = memoryview(buf)[:n]
            while view:
                w = os.write(fd, view)
                view = view[w:]
            off += n
            i += 1
        if durable:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def mmap_read(path, method):
    """open + mmap + read every page (touch) or every byte (copy) + munmap + close. Returns seconds."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                if method == "touch":
                    for i in range(0, size, CHUNK):
                        m[i:i + CHUNK:PAGE]
                else:
                    buf = bytearray(CHUNK)
                    mv = memoryview(m)
                    try:
                        for i in range(0, size, CHUNK):
                            n = min(CHUNK, size - i)
                            buf[:n] = mv[i:i + n]
                    finally:
                        mv.release()
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def cache_growth(paths, content_bytes):
    """Drop caches, touch every page of every path; return growth of Cached as a multiple."""
    drop_caches()
    before = meminfo_kib("Cached")
    for p in paths:
        mmap_read(p, "touch")
    after = meminfo_kib("Cached")
    return (after - before) * 1024 / content_bytes


def sh(argv):
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def machine_facts(dirs):
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "kernel": platform.release(),
        "cpu": f"{cpu} ({os.cpu_count()} CPUs)",
        "memory": f"{meminfo_kib('MemTotal') / (1 << 20):.1f} GiB",
    }
    for label, d in dirs:
        facts[f"{label} dir"] = f"{d} (on {sh(['findmnt', '-n', '-o', 'SOURCE,FSTYPE', '-T', d]) or '?'})"
    return facts


def main():
    ap = argparse.ArgumentParser(description="weightfs vs the backing filesystem, side by side.")
    ap.add_argument("--wfs", required=True, help="directory on the weightfs mount (or plain, --no-mount)")
    ap.add_argument("--native", required=True, help="plain directory on the store's filesystem")
    ap.add_argument("--daemon-pid", type=int, help="weightfs daemon pid, for its RSS")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", default="2GiB", help="ingest / read file size (default 2GiB)")
    ap.add_argument("--cache-size", default="512MiB", help="page-cache content size (default 512MiB)")
    ap.add_argument("--no-mount", action="store_true", help="--wfs is a plain directory too")
    ap.add_argument("--no-drop", action="store_true",
                    help="skip the benchmarks that need drop_caches (cold reads, page cache)")
    ap.add_argument("--mount-opts", default="", help="daemon options, for the report")
    ap.add_argument("--doc", help="markdown file whose generated block to rewrite")
    ap.add_argument("--command", help="command line to record in the report")
    args = ap.parse_args()
    size = parse_size(args.size)
    csize = parse_size(args.cache_size)
    if args.rounds < 1 or size < 1 or csize < 1:
        ap.error("--rounds, --size and --cache-size must be positive")

    wname = "plain B" if args.no_mount else "weightfs"
    # weightfs's close fdatasyncs; a plain directory (native, or both with --no-mount) needs it.
    sides = [("wfs", wname, args.wfs, args.no_mount), ("native", "native", args.native, True)]
    for _, _, d, _ in sides:
        os.makedirs(d, exist_ok=True)
    if not args.no_drop:
        try:
            drop_caches()
        except DropError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 1

    # results[bench][side] = [per-round values]; higher is better except the page-cache multiple.
    benches = [("ingest", "ingest (write 16 MiB chunks + close; native also fdatasync)", "GB/s")]
    if not args.no_drop:
        benches += [("cold-touch", "cold mmap, touch 1 byte / 4 KiB page", "GB/s"),
                    ("cold-copy", "cold mmap, copy every byte (16 MiB chunks)", "GB/s")]
    benches += [("warm-touch", "warm mmap, touch 1 byte / 4 KiB page (median of 3 passes)", "GB/s"),
                ("warm-copy", "warm mmap, copy every byte (16 MiB chunks, median of 3)", "GB/s")]
    if not args.no_drop:
        benches += [("cache", f"page-cache growth, {human(csize)} under 4 names",
                     "x content")]
    results = {b: {"wfs": [], "native": []} for b, _, _ in benches}

    print(f"bench: {wname} {args.wfs} vs native {args.native}; {args.rounds} rounds, "
          f"{human(size)} file, {human(csize)} x 4 names", flush=True)
    if not args.no_drop:
        for key, _, d, durable in sides:
            for k in range(4):
                write_file(os.path.join(d, f"cache-{k}.bin"), csize, 0xCAC4E, durable)
    prev = {}
    for r in range(args.rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        line = []
        for key, label, d, durable in order:
            if key in prev:
                os.unlink(prev[key])
            path = os.path.join(d, f"ingest-r{r}.bin")
            prev[key] = path
            os.sync()
            s = write_file(path, size, (r << 1) | (key == "wfs"), durable)
            results["ingest"][key].append(size / s / 1e9)
        for method in ("touch", "copy"):
            for key, label, d, durable in order:
                # The cold pass is also the warm-up, so the page cache the warm passes find was
                # filled the same way on both sides (how pages were read decides their folio sizes,
                # and warm mmap speed with them).
                if args.no_drop:
                    mmap_read(prev[key], method)
                else:
                    drop_caches()
                    results[f"cold-{method}"][key].append(size / mmap_read(prev[key], method) / 1e9)
                secs = statistics.median(mmap_read(prev[key], method) for _ in range(WARM_PASSES))
                results[f"warm-{method}"][key].append(size / secs / 1e9)
        if not args.no_drop:
            for key, label, d, durable in order:
                paths = [os.path.join(d, f"cache-{k}.bin") for k in range(4)]
                results["cache"][key].append(cache_growth(paths, csize))
        for b, _, _ in benches:
            w, n = results[b]["wfs"][-1], results[b]["native"][-1]
            line.append(f"{b} {w:.2f}/{n:.2f}")
        print(f"round {r + 1}/{args.rounds} ({wname}/native): " + ", ".join(line), flush=True)

    rss = hwm = None
    if args.daemon_pid:
        rss = proc_status(args.daemon_pid, "VmRSS")
        hwm = proc_status(args.daemon_pid, "VmHWM")

    facts = machine_facts([(wname, args.wfs), ("native", args.native)])
    cmd = args.command or " ".join([sys.argv[0]] + sys.argv[1:])
    out = []
    out.append(f"Generated by `tests/bench/bench.py` on {facts['date']}.")
    out.append("")
    out.append(f"Command: `{cmd}`")
    out.append("")
    if args.no_mount:
        out.append("**--no-mount run: both sides are plain directories (a test of the script, "
                   "not a weightfs measurement); ratios should be ~1.**")
        out.append("")
    out.append("| machine | |")
    out.append("|---|---|")
    for k, v in facts.items():
        out.append(f"| {k} | {v} |")
    if args.mount_opts:
        out.append(f"| daemon options | `{args.mount_opts}` |")
    out.append(f"| rounds | {args.rounds} (sides interleaved, order alternating) |")
    out.append(f"| file size | {human(size)} ({size} bytes), page-cache content {human(csize)} |")
    out.append("")
    for b, title, unit in benches:
        w = results[b]["wfs"]
        n = results[b]["native"]
        ratios = [a / c if c else float("nan") for a, c in zip(w, n)]
        out.append(f"### {title}")
        out.append("")
        out.append(f"| | {wname} | native | ratio {wname} / native |")
        out.append("|---|---|---|---|")
        out.append(f"| median ({unit}) | {statistics.median(w):.3f} | {statistics.median(n):.3f} | "
                   f"**{statistics.median(ratios):.2f}** |")
        out.append(f"| rounds | {' '.join(f'{x:.2f}' for x in w)} | "
                   f"{' '.join(f'{x:.2f}' for x in n)} | {' '.join(f'{x:.2f}' for x in ratios)} |")
        out.append("")
    out.append("### daemon memory after the bench")
    out.append("")
    if args.daemon_pid and rss is not None:
        out.append(f"VmRSS {rss / 1024:.1f} MiB, VmHWM (peak) {hwm / 1024:.1f} MiB "
                   f"(pid {args.daemon_pid}).")
    elif args.daemon_pid:
        out.append(f"Not available: /proc/{args.daemon_pid}/status could not be read.")
    else:
        out.append("No daemon in this run.")
    if args.no_drop:
        out.append("")
        out.append("Cold-read and page-cache benchmarks skipped (--no-drop).")
    block = "\n".join(out)
    print()
    print(block)

    if args.doc:
        write_doc_block(args.doc, block, BEGIN, END, "bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
