# SPDX-License-Identifier: Apache-2.0
"""XXH3-128 digests of bytes, files and tensors, through libweightfs (lib/digest.h).

    weightfs.digest(b"abc")               # XXH3-128 hex, what `xxhsum -H2` and getfattr print
    weightfs.digest_file(path)            # the same of a whole file, read from its bytes

A *digest* is XXH3-128 in canonical form, spelled as 32 lower-case hex characters (lib/digest.h): the
name of a stored object on weightfs (user.weightfs.digest). The bytes of a tensor are its contiguous
storage in native byte order: numel x element size (memory.py finds them).
"""

import ctypes
import os
import threading
from typing import Any

from . import _libweightfs
from ._types import PathLike
from .errors import _err
from .memory import _contiguous_array, _gpu_chunks, _HostBytes, _is_torch_tensor, _tensor_values, _torch_host

__all__ = ["digest", "digest_file"]

_DIGEST_BYTES = 16


class _Hasher(ctypes.Structure):
    # Mirrors struct wfs_hasher in lib/digest.h.
    _fields_ = [("state", ctypes.c_void_p), ("bytes", ctypes.c_uint64)]


_Digest = ctypes.c_uint8 * _DIGEST_BYTES
def _digest_lib():
    P, S = ctypes.c_void_p, ctypes.c_size_t
    H, D = ctypes.POINTER(_Hasher), ctypes.POINTER(_Digest)
    return _libweightfs.bind({
        "wfs_digest_buf": ([P, S, D], None),
        "wfs_digest_fd": ([ctypes.c_int, D, ctypes.POINTER(ctypes.c_uint64)], ctypes.c_int),
        "wfs_hasher_init": ([H], ctypes.c_int),
        "wfs_hasher_update": ([H, P, S], None),
        "wfs_hasher_digest": ([H, D], None),
        "wfs_hasher_release": ([H], None),
    })


def _hex(d):
    """The digest's canonical bytes (big-endian, lib/digest.h) as 32 lower-case hex digits."""
    return bytes(d).hex()


def _digest_address(address, nbytes):
    """XXH3-128 hex of nbytes bytes of host memory at address (the GIL is released while hashing)."""
    lib = _digest_lib()
    d = _Digest()
    lib.wfs_digest_buf(address or None, nbytes, ctypes.byref(d))
    return _hex(d)


def _gpu_digest(t):
    lib = _digest_lib()
    h = _Hasher()
    if lib.wfs_hasher_init(ctypes.byref(h)) < 0:
        raise MemoryError("weightfs: cannot allocate an XXH3 state")
    try:
        for address, n in _gpu_chunks(t):
            lib.wfs_hasher_update(ctypes.byref(h), address, n)
        d = _Digest()
        lib.wfs_hasher_digest(ctypes.byref(h), ctypes.byref(d))
        return _hex(d)
    finally:
        lib.wfs_hasher_release(ctypes.byref(h))


# ---- digest ----------------------------------------------------------------------------------

def digest(data: Any) -> str:
    """XXH3-128 of data's bytes as 32 lower-case hex characters: what `xxhsum -H2` prints for a file
    holding those bytes, and what `getfattr -n user.weightfs.digest` prints on weightfs.

    data: bytes, bytearray, memoryview, mmap, array.array, a numpy array (any dtype), or a torch
    tensor (CPU or CUDA, any dtype). The bytes are the values in C order and native byte order
    (numel x element size): a non-contiguous torch tensor or numpy array, a conjugate or negative
    torch view and a numpy array of the other byte order are hashed as such a copy (one temporary
    copy; memory.py), a CUDA tensor through a bounded host
    buffer (64 MiB per device, pinned when CUDA allows). Host memory is hashed in place, without a copy,
    with the GIL released.

    Raises TypeError for an object without bytes (a numpy array of Python objects, a quantized
    tensor), OSError
    when libweightfs.so cannot be loaded."""
    if _is_torch_tensor(data):
        if data.device.type == "cuda":
            return _gpu_digest(_tensor_values(data))
        if data.device.type != "cpu":
            raise ValueError(f"digest: tensor on {data.device} (only CPU and CUDA tensors)")
        t, address, nbytes = _torch_host(data)
        return _digest_address(address, nbytes)
    data = _contiguous_array(data)
    try:
        host = _HostBytes(data)
    except TypeError:
        raise TypeError(f"digest: {type(data).__name__} has no bytes (expected a buffer, numpy "
                        "array or torch tensor)") from None
    with host:
        return _digest_address(host.address, host.nbytes)

def digest_file(path: PathLike) -> str:
    """XXH3-128 hex of the whole file at path, read from its bytes (never from an xattr).

    Raises OSError (errno from open or read: ENOENT, EACCES, EIO, ...) naming path."""
    lib = _digest_lib()
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        d = _Digest()
        n = ctypes.c_uint64()
        rc = lib.wfs_digest_fd(fd, ctypes.byref(d), ctypes.byref(n))
        if rc < 0:
            raise _err(-rc, path, f"reading {path} to digest it: {os.strerror(-rc)}")
        return _hex(d)
    finally:
        os.close(fd)


class _DigestThread(threading.Thread):
    """XXH3-128 of nbytes of host memory at address, on a thread of its own, while the caller
    writes the same bytes (the hash releases the GIL): the digest costs no time of its own when
    the write is the slower of the two. The memory must stay as it is until digest() or join()."""

    def __init__(self, address, nbytes):
        super().__init__(name="weightfs-digest", daemon=True)
        self._args = (address, nbytes)
        self._result = self._error = None
        self.start()

    def run(self):
        try:
            self._result = _digest_address(*self._args)
        except BaseException as e:  # handed to digest()
            self._error = e

    def digest(self):
        self.join()
        if self._error is not None:
            raise self._error
        return self._result
