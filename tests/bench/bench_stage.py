#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark: torch's naive backload vs weightfs.backload, same file, same run, interleaved.

    PYTHONPATH=lib/python python3 tests/bench/bench_stage.py FILE [PASSES]

Prints medians of: pinned host-to-device copy (the peak), torch.from_file(...).to('cuda') with
shared=False and shared=True, and weightfs.backload; the ratios; whether the device bytes equal the
file's; and the stager's ring size (the pinned memory it holds). Needs torch and a CUDA device.
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib", "python"))
import weightfs  # noqa: E402

def main(argv):
    path = argv[1]
    reps = int(argv[2]) if len(argv) > 2 else 5
    n = os.path.getsize(path)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()

    def naive():
        t0 = time.perf_counter()
        x = torch.from_file(path, shared=False, size=n, dtype=torch.uint8).to("cuda")
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        del x
        return n / dt / 1e9

    def naive_shared():
        t0 = time.perf_counter()
        x = torch.from_file(path, shared=True, size=n, dtype=torch.uint8).to("cuda")
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        del x
        return n / dt / 1e9

    def helper():
        t0 = time.perf_counter()
        weightfs.backload(path, dev)
        dt = time.perf_counter() - t0
        return n / dt / 1e9

    def pinned_peak():
        h = torch.empty(min(n, 1 << 30), dtype=torch.uint8).pin_memory()
        d = torch.empty_like(h, device="cuda")
        d.copy_(h); torch.cuda.synchronize()
        t0 = time.perf_counter(); d.copy_(h); torch.cuda.synchronize(); dt = time.perf_counter() - t0
        return h.numel() / dt / 1e9

    helper(); naive()  # warm up context, page cache, stager
    res = {"pinned peak (torch copy_)": [], "torch.from_file(shared=False).to(cuda)": [],
           "weightfs.backload (Python)": [], "torch.from_file(shared=True).to(cuda)": []}
    for _ in range(reps):
        res["pinned peak (torch copy_)"].append(pinned_peak())
        res["torch.from_file(shared=False).to(cuda)"].append(naive())
        res["weightfs.backload (Python)"].append(helper())
    # shared=True opens the file read-write. On weightfs a writable open is served by the daemon and
    # switches the inode out of passthrough until it closes, so it runs last, apart.
    for _ in range(reps):
        res["torch.from_file(shared=True).to(cuda)"].append(naive_shared())
    med = {k: statistics.median(v) for k, v in res.items()}
    for k, v in res.items():
        print(f"  {k:42s} median {med[k]:7.2f} GB/s  runs {' '.join(f'{x:.2f}' for x in v)}")
    h = med["weightfs.backload (Python)"]
    print(f"  helper / torch pinned peak = {h / med['pinned peak (torch copy_)']:.2f}")
    print(f"  helper / torch.from_file(shared=False).to = {h / med['torch.from_file(shared=False).to(cuda)']:.2f}x")
    print(f"  helper / torch.from_file(shared=True).to  = {h / med['torch.from_file(shared=True).to(cuda)']:.2f}x")
    # correctness of the last backload, on the device
    ref = torch.from_file(path, shared=True, size=n, dtype=torch.uint8).to("cuda")
    print("  device bytes equal file bytes:", bool(torch.equal(ref, dev)))
    st = weightfs.stage._default[torch.cuda.current_device()].stats()
    print("  stager:", {k: st[k] for k in ("ring_bytes", "pinned", "numa_node", "buffers", "buffer_bytes", "threads", "buffers_in_use_peak", "bytes_loaded", "pci_bus_id")})
    for line in open("/proc/self/status"):
        if line.startswith(("VmLck", "VmPin", "VmRSS")):
            print("  " + line.strip())


if __name__ == "__main__":
    main(sys.argv)
