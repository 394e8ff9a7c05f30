#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Round trips through weightfs's staging ring: through a host stager always, and through the GPU
when torch sees one (the GPU test machine: tests/gpu/device-run.sh). Prints what ran; an assertion
names what failed. Run from the repository: PYTHONPATH=lib/python python3 tests/gpu/stage_selftest.py
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib", "python"))
from weightfs import stage  # noqa: E402


def main():
    """Round trips through a host stager, and through the GPU when torch sees one. Prints what ran."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        run(d)


def run(tmpdir):
    import errno

    data = os.urandom(5 * (1 << 20) + 12345)
    src = os.path.join(tmpdir, "w.bin")
    with open(src, "wb") as f:
        f.write(data)
    with stage.Stager(host=True, buffers=3, buffer_mib=1, threads=2) as st:
        buf = ctypes.create_string_buffer(len(data))
        st.load(src, ctypes.addressof(buf), len(data))
        assert buf.raw == data, "host load: bytes differ"
        out = os.path.join(tmpdir, "out.bin")
        st.offload(ctypes.addressof(buf), len(data), out)
        with open(out, "rb") as f:
            assert f.read() == data, "host offload: bytes differ"
        try:
            st.load(src, ctypes.addressof(buf), len(data) + 1)
        except OSError as e:
            assert e.errno == errno.ENODATA and "w.bin: short file" in str(e), e
        else:
            raise AssertionError("short file not reported")
        assert st.stats()["ring_bytes"] == 3 << 20
    print("weightfs.stage selftest: host round trips ok")
    try:
        import torch
    except ImportError:
        print("weightfs.stage selftest: torch not installed; GPU part NOT RUN")
        return
    if not torch.cuda.is_available():
        print("weightfs.stage selftest: no CUDA device; GPU part NOT RUN")
        return
    n = len(data) // 2
    raw = data[: 2 * n]
    with open(src, "wb") as f:
        f.write(raw)
    t = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    stage.backload(src, t)
    assert t.cpu().view(torch.uint8).numpy().tobytes() == raw, "GPU backload: bytes differ"
    out = os.path.join(tmpdir, "gpu.out")
    stage.offload_tensor(t, out, fsync=True)
    with open(out, "rb") as f:
        assert f.read() == raw, "GPU offload: bytes differ"
    try:
        stage.backload(src, torch.empty(n + 1, dtype=torch.bfloat16, device="cuda"))
    except OSError as e:
        assert e.errno == errno.ENODATA and "short file" in str(e), e
    else:
        raise AssertionError("short file not reported")
    try:
        stage.backload(src, torch.empty(n - 1, dtype=torch.bfloat16, device="cuda"))
    except OSError as e:
        assert e.errno == errno.EMSGSIZE and "size mismatch" in str(e), e
    else:
        raise AssertionError("size mismatch not reported")
    try:
        stage.backload(src, torch.empty(n, dtype=torch.bfloat16))
    except ValueError:
        pass
    else:
        raise AssertionError("CPU tensor accepted")
    print("weightfs.stage selftest: GPU backload/offload ok on", torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
