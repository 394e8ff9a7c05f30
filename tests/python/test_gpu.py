#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The package's CUDA paths, on a machine with a GPU (not part of `make check`: CI has no GPU).

    python3 -m pytest tests/python/test_gpu.py [-k NAME] [--plain DIR] [--mnt MNT]
    python3 tests/python/test_gpu.py --plain DIR --mnt MNT    (tests/gpu/device-run.sh: a skip fails)

DIR: a plain directory (claims unsupported there: the bytes are written through the staging ring;
default: a temporary directory). MNT: a weightfs mount (claims hit there; default: conftest.py mounts
a fresh store). Tests: digest of CUDA tensors (bf16 larger than the 64 MiB hashing buffer,
non-contiguous) equals the CPU copy's and the file's; offload of CUDA tensors (written, then claimed)
and load/backload of the bytes; FrozenOffload of a CUDA model with free=True (device memory released)
and restore (backload), restart skip; the stager's pinned memory stays one ring.

Without torch or a CUDA device every test is skipped, with the reason (never counted as passed).
Run as a script, as device-run.sh does on the GPU machine, it runs pytest on itself (label
python-gpu) and exits non-zero when a test failed or was skipped: there a skip means the GPU was not
usable.
"""

import json
import os
import sys
import warnings

import pytest

import wfstest

import weightfs

try:
    import torch
except ImportError:  # every test is skipped, with the reason
    torch = None
CUDA = torch is not None and torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device" if torch else "no torch here")
ROOTS = ["plain", "weightfs"]


def raw_cpu(t):
    t = t.detach().contiguous().cpu()
    return bytes(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


@pytest.fixture(scope="module", autouse=True)
def _no_fallback_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", weightfs.WeightfsWarning)
        yield


@pytest.fixture(scope="module")
def dev():
    return torch.device("cuda", 0)


@pytest.fixture(scope="module")
def tensors(dev):
    """(big, nc): bf16 9000 x 4096 (70.3 MiB > the 64 MiB hashing buffer), a non-contiguous fp32."""
    g = torch.Generator(device=dev).manual_seed(5)
    big = torch.randn((9000, 4096), generator=g, device=dev).to(torch.bfloat16)
    nc = torch.randn((512, 768), generator=g, device=dev).t()
    return big, nc


@pytest.fixture(params=ROOTS)
def root(request):
    """(label, directory): the plain directory, then the weightfs mount."""
    return request.param, request.getfixturevalue("plain" if request.param == "plain" else "mnt")


def test_digest_cuda_bf16_73_7_mb_and_a_non_contiguous_fp32_equal_the_cpu_copies(tensors, note):
    """digest: CUDA bf16 73.7 MB (2 chunks) and a non-contiguous fp32 equal the CPU copies'"""
    note(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    big, nc = tensors
    assert weightfs.digest(big) == weightfs.digest(raw_cpu(big))
    assert weightfs.digest(nc) == weightfs.digest(raw_cpu(nc))


def test_offload_cuda_tensors_written_then_claimed_load_and_backload_give_the_bytes(root, tensors, dev):
    """offload CUDA tensors to plain/weightfs: written, then claimed on weightfs; load and backload give
    the bytes back"""
    label, root = root
    big, nc = tensors

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


def test_frozenoffload_cuda_model_free_releases_device_memory_restore_restart_skips(root, dev):
    """FrozenOffload on plain/weightfs: CUDA model, free=True releases device memory, restore
    backloads, restart skips"""
    root = root[1]
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


def test_stager_pinned_memory_is_one_ring_128_mib_after_all_of_it(tensors):
    """stager: pinned memory is one ring (128 MiB) after all of it (the tests before it in this file;
    picked alone, it checks the stager its own look-up makes)"""
    st = weightfs.stage._stager_for(tensors[0], None).stats()
    assert st["ring_bytes"] == 128 << 20, st


class _SkipsFail:
    """Counts the skipped tests (device-run.sh: on the GPU machine a skip is a failure)."""

    def __init__(self):
        self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1


def main():
    """device-run.sh's `test_gpu.py --plain DIR --mnt MNT`: pytest on this file, label python-gpu;
    exit 0 only when every test ran and passed."""
    # OPTION=VALUE: pytest reads conftest.py's options only once it has found the file.
    args, argv = [], sys.argv[1:]
    while argv:
        a = argv.pop(0)
        args.append(f"{a}={argv.pop(0)}" if a in ("--plain", "--mnt", "--store", "--build") and argv else a)
    skips = _SkipsFail()
    rc = pytest.main([os.path.abspath(__file__), "-p", "no:cacheprovider", "-v", "-rfEs", "--tb=short",
                      "--label=python-gpu"] + args, plugins=[skips])
    if rc == 0 and skips.skipped:
        print(f"python-gpu: {skips.skipped} skipped: the GPU tests must run here", flush=True)
        return 1
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
