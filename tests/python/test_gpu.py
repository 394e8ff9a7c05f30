#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The package's CUDA paths, on a machine with a GPU (not part of `make check`: CI has no GPU).

    test_gpu.py --plain DIR [--mnt MNT]

DIR: a plain directory (claims unsupported there: the bytes are written through the staging ring).
MNT: a weightfs mount (claims hit there). Checks: digest of CUDA tensors (bf16 larger than the 64 MiB
hashing buffer, non-contiguous) equals the CPU copy's and the file's; offload of CUDA tensors (written,
then claimed) and load/backload of the bytes; FrozenOffload of a CUDA model with free=True (device
memory released) and restore (backload), restart skip; the stager's pinned memory stays one ring.
Without a usable GPU every check fails (none is counted as passed). Prints "python-gpu: N passed,
N failed".
"""

import argparse
import json
import os
import sys
import warnings

import wfstest
from wfstest import Tests

import torch

import weightfs


def raw_cpu(t):
    t = t.detach().contiguous().cpu()
    return bytes(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plain", required=True)
    ap.add_argument("--mnt")
    a = ap.parse_args()
    T = Tests("python-gpu")
    warnings.simplefilter("ignore", weightfs.WeightfsWarning)
    if not torch.cuda.is_available():
        T.fail("cuda", "torch sees no CUDA device")
        return T.finish()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(5)
    big = torch.randn((9000, 4096), generator=g, device=dev).to(torch.bfloat16)  # 70.3 MiB > 64 MiB
    nc = torch.randn((512, 768), generator=g, device=dev).t()  # non-contiguous fp32

    @T.check("digest: CUDA bf16 73.7 MB (2 chunks) and a non-contiguous fp32 equal the CPU copies'")
    def _():
        assert weightfs.digest(big) == weightfs.digest(raw_cpu(big))
        assert weightfs.digest(nc) == weightfs.digest(raw_cpu(nc))

    roots = [("plain", a.plain)] + ([("weightfs", a.mnt)] if a.mnt else [])
    for label, root in roots:
        def case(root=root, label=label):
            def declared():  # None: no passthrough, where nothing is declared
                s = json.loads(os.getxattr(root, "user.weightfs.stats"))
                return s["since_mount"]["seals_declared"] if s["passthrough"] else None
            before = declared() if label == "weightfs" else None
            r1 = weightfs.offload(big, os.path.join(root, "gpu", "rank0", "big"))
            if before is not None:  # staged through the ring, its digest declared: not read back
                assert declared() == before + 1, (before, declared())
            r2 = weightfs.offload(big, os.path.join(root, "gpu", "rank1", "big"))
            r3 = weightfs.offload(nc, os.path.join(root, "gpu", "rank0", "nc"))
            assert not r1.claimed and r1.bytes == big.numel() * 2
            assert r2.claimed == (label == "weightfs"), r2
            assert "user.weightfs.digest" not in os.listxattr(r1.path), os.listxattr(r1.path)
            assert r1.digest == weightfs.digest_file(r1.path) == weightfs.digest_file(r2.path)
            assert wfstest.xxhsum(r1.path) == r1.digest
            for r, t in ((r1, big), (r2, big), (r3, nc)):
                x = weightfs.load(r.path)
                assert x.dtype == t.dtype and tuple(x.shape) == tuple(t.shape)
                assert raw_cpu(x) == raw_cpu(t), r.path
                y = torch.empty(t.shape, dtype=t.dtype, device=dev)
                weightfs.backload(r.path, y)
                assert torch.equal(y.view(torch.uint8) if y.dtype == torch.bool else y, t.contiguous())
        T.run(f"offload CUDA tensors to {label}: written{', then claimed' if label == 'weightfs' else ''}; "
              "load and backload give the bytes back", case)

        def frozen(root=root):
            torch.manual_seed(1)
            m = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 16)).to(dev)
            m[0].to(torch.bfloat16)
            m[0].requires_grad_(False)
            want = {n: raw_cpu(p) for n, p in m.named_parameters()}
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            fo = weightfs.FrozenOffload(os.path.join(root, "frozen"), 0)
            s = fo.offload(m, free=True)
            assert s.tensors == 2, s[1:]
            freed = before - torch.cuda.memory_allocated()
            assert freed >= 4096 * 4096 * 2, f"only {freed} bytes of device memory released"
            assert m[0].weight.numel() == 0 and m[1].weight.numel() == 4096 * 16
            assert fo.restore(m) == 2
            for n, p in m.named_parameters():
                assert p.device.type == "cuda" and raw_cpu(p) == want[n], n
            s2 = weightfs.FrozenOffload(os.path.join(root, "frozen"), 0).offload(m)
            assert s2.skipped == 2 and s2.written_bytes == 0, s2[1:]
        T.run(f"FrozenOffload on {label}: CUDA model, free=True releases device memory, restore backloads, "
              "restart skips", frozen)

    @T.check("stager: pinned memory is one ring (128 MiB) after all of it")
    def _():
        st = weightfs.stage._stager_for(big, None).stats()
        assert st["ring_bytes"] == 128 << 20, st
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
