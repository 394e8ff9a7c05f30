# SPDX-License-Identifier: Apache-2.0
"""GPU staging: files to CUDA tensors and back through libweightfs's pinned ring (lib/stage.h).

    import torch, weightfs
    w = torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda")
    weightfs.backload("/data/frozen/rank0/layer0.w", w)     # file bytes -> w's storage
    weightfs.offload_tensor(w, "/data/frozen/rank0/layer0.w")  # w's storage -> a new file

The C library is found as _libweightfs.py says ($WEIGHTFS_LIB, the repository's build/, PREFIX/lib
after `make install`, the usual library directories). torch is imported only by the
tensor functions. Errors are OSError with the errno and the C library's one-line message, which names
the file (for example "rank0/w.bin: short file: 1000 bytes, expected 4096", errno ENODATA).
"""

import ctypes
import os
import threading
from typing import Any, Dict, Optional

from . import _libweightfs
from ._types import PathLike

__all__ = ["Stager", "backload", "offload_tensor", "library"]

MEM_DEVICE, MEM_HOST = 0, 1
_OFFLOAD, _EXACT, _FSYNC = 1 << 0, 1 << 1, 1 << 2
_MSG_MAX = 512


class _Opts(ctypes.Structure):
    # Mirrors struct wfs_stage_opts in lib/stage.h; keep the two in step.
    _fields_ = [
        ("mem", ctypes.c_int),
        ("device", ctypes.c_int),
        ("numa_node", ctypes.c_int),
        ("buffers", ctypes.c_uint),
        ("buffer_bytes", ctypes.c_size_t),
        ("threads", ctypes.c_uint),
        ("io_fault", ctypes.c_void_p),
        ("io_fault_arg", ctypes.c_void_p),
    ]


class _Stats(ctypes.Structure):
    # Mirrors struct wfs_stage_stats.
    _fields_ = [
        ("ring_bytes", ctypes.c_uint64),
        ("host_bytes_peak", ctypes.c_uint64),
        ("pinned", ctypes.c_bool),
        ("numa_node", ctypes.c_int),
        ("buffers", ctypes.c_uint),
        ("buffer_bytes", ctypes.c_size_t),
        ("threads", ctypes.c_uint),
        ("buffers_in_use_peak", ctypes.c_uint),
        ("bytes_loaded", ctypes.c_uint64),
        ("bytes_offloaded", ctypes.c_uint64),
        ("pci_bus_id", ctypes.c_char * 32),
    ]


def _signatures() -> _libweightfs.Signatures:
    P, S, U64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    return {
        "wfs_stage_opts_init": ([ctypes.POINTER(_Opts)], None),
        "wfs_stage_new": ([ctypes.POINTER(_Opts), ctypes.POINTER(P), ctypes.c_char_p, S], ctypes.c_int),
        "wfs_stage_free": ([P], None),
        "wfs_stage_load": ([P, ctypes.c_char_p, U64, U64, P, ctypes.c_uint, ctypes.c_char_p, S], ctypes.c_int),
        "wfs_stage_offload": ([P, P, U64, ctypes.c_char_p, ctypes.c_uint, ctypes.c_char_p, ctypes.c_char_p, S],
                              ctypes.c_int),
        "wfs_stage_stats": ([P, ctypes.POINTER(_Stats)], None),
        "wfs_stage_have_cuda": ([], ctypes.c_bool),
    }


_cuda: Optional[bool] = None


def _have_cuda() -> bool:
    """True when libweightfs was built with CUDA (wfs_stage_have_cuda: GPU staging compiled in; the
    CUDA runtime itself is loaded by the first GPU stager). Asked once. Raises OSError when the
    library cannot be loaded."""
    global _cuda
    if _cuda is None:
        _cuda = bool(library().wfs_stage_have_cuda())
    return _cuda


def library() -> ctypes.CDLL:
    """The loaded libweightfs (ctypes.CDLL) with the staging functions declared (_libweightfs.py says
    where it is looked for). Raises OSError when it cannot be loaded."""
    return _libweightfs.bind(_signatures())


def _error(rc, buf):
    msg = buf.value.decode("utf-8", "replace") or os.strerror(-rc)
    return OSError(-rc, msg)


class Stager:
    """A stager bound to one CUDA device (or to host memory with host=True, for tests without a GPU).

    buffers x buffer_mib is all the host memory it ever pins; threads read files in parallel.
    Thread-safe: several threads may load and offload through one Stager at once.
    """

    def __init__(self, device: int = 0, buffers: Optional[int] = None, buffer_mib: Optional[int] = None,
                 threads: Optional[int] = None, numa_node: int = -1, host: bool = False) -> None:
        lib = library()
        o = _Opts()
        lib.wfs_stage_opts_init(ctypes.byref(o))
        o.mem = MEM_HOST if host else MEM_DEVICE
        o.device = int(device)
        o.numa_node = int(numa_node)
        if buffers is not None:
            o.buffers = int(buffers)
        if buffer_mib is not None:
            o.buffer_bytes = int(buffer_mib) << 20
        if threads is not None:
            o.threads = int(threads)
        err = ctypes.create_string_buffer(_MSG_MAX)
        handle = ctypes.c_void_p()
        rc = lib.wfs_stage_new(ctypes.byref(o), ctypes.byref(handle), err, _MSG_MAX)
        if rc < 0:
            raise _error(rc, err)
        self._lib, self.device, self.host = lib, int(device), bool(host)
        self._h: Optional[ctypes.c_void_p] = handle

    def close(self) -> None:
        if getattr(self, "_h", None):
            self._lib.wfs_stage_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _handle(self):
        if not self._h:
            raise ValueError("stager is closed")
        return self._h

    def load(self, path: PathLike, ptr: int, nbytes: int, offset: int = 0, exact: bool = True) -> None:
        """Copy nbytes bytes of the file at path, from byte offset, to memory address ptr (device memory
        of this stager's GPU, or host memory for a host stager). exact: the file must end right there."""
        err = ctypes.create_string_buffer(_MSG_MAX)
        rc = self._lib.wfs_stage_load(self._handle(), os.fsencode(path), offset, nbytes, ptr,
                                      _EXACT if exact else 0, err, _MSG_MAX)
        if rc < 0:
            raise _error(rc, err)

    def offload(self, ptr: int, nbytes: int, path: PathLike, fsync: bool = False,
                digest: Optional[str] = None) -> None:
        """Write nbytes bytes at memory address ptr into a new file at path (no partial file on error).
        digest: the bytes' XXH3-128 (32 hex digits), declared on a weightfs file before its close so
        that its seal does not read it back (only for a file on weightfs; lib/stage.h)."""
        err = ctypes.create_string_buffer(_MSG_MAX)
        rc = self._lib.wfs_stage_offload(self._handle(), ptr, nbytes, os.fsencode(path),
                                         _FSYNC if fsync else 0,
                                         digest.encode("ascii") if digest else None, err, _MSG_MAX)
        if rc < 0:
            raise _error(rc, err)

    def stats(self) -> Dict[str, Any]:
        s = _Stats()
        self._lib.wfs_stage_stats(self._handle(), ctypes.byref(s))
        out = {name: getattr(s, name) for name, _ in _Stats._fields_}
        out["pci_bus_id"] = s.pci_bus_id.decode()
        return out


_default = {}
_default_lock = threading.Lock()


def _stager_for(tensor, stager):
    if stager is not None:
        return stager
    dev = tensor.device.index
    if dev is None:
        import torch
        dev = torch.cuda.current_device()
    with _default_lock:
        if dev not in _default:
            _default[dev] = Stager(device=dev)
        return _default[dev]


def _check_tensor(tensor, what):
    import torch  # optional dependency: only these functions need it

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cuda":
        raise ValueError(f"{what}: tensor is on {tensor.device}, not a CUDA device")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: tensor is not contiguous")
    if (getattr(tensor, "is_conj", None) and tensor.is_conj()) or (getattr(tensor, "is_neg", None) and tensor.is_neg()):
        raise ValueError(f"{what}: tensor is a conjugate or negative view, whose storage holds other values "
                         "than it reads as: resolve_conj() / resolve_neg() it first")
    # Work queued on the tensor (on torch's streams) must finish before our streams touch it.
    torch.cuda.current_stream(tensor.device).synchronize()
    return tensor.numel() * tensor.element_size()


def backload(path: PathLike, tensor: Any, offset: int = 0, length: Optional[int] = None,
             stager: Optional[Stager] = None) -> Any:
    """Fill a contiguous CUDA tensor's storage with bytes from the file at path.

    The tensor's size in bytes (numel x dtype element size) must equal the file's size, or, when offset
    or length is given, the range [offset, offset + length) read from the file (length defaults to the
    tensor's size). Returns the tensor. Raises OSError (errno + the C message naming the file) on short
    files, size mismatches, read and CUDA errors; ValueError on a tensor that cannot take the bytes."""
    nbytes = _check_tensor(tensor, "backload")
    if length is not None and int(length) != nbytes:
        raise ValueError(f"backload: {path}: length {length} != tensor bytes {nbytes} "
                         f"({tensor.numel()} x {tensor.element_size()}-byte {tensor.dtype})")
    whole = offset == 0 and length is None
    from .direct import fd_path, object_fd

    # The object behind the name when the daemon hands it out (docs/direct.md), else the file.
    ofd = object_fd(os.fspath(path))
    try:
        src = fd_path(ofd) if ofd is not None else path
        _stager_for(tensor, stager).load(src, tensor.data_ptr(), nbytes, offset=int(offset), exact=whole)
    finally:
        if ofd is not None:
            os.close(ofd)
    return tensor


def offload_tensor(tensor: Any, path: PathLike, fsync: bool = False, stager: Optional[Stager] = None,
                   digest: Optional[str] = None) -> None:
    """Write a contiguous CUDA tensor's bytes into a new file at path, chunk by chunk through the ring
    (never a full host copy). On weightfs the file is sealed at close; a seal error (ENOSPC, EIO) is
    raised as OSError and the file is removed. digest: the tensor's XXH3-128, declared before the
    close (a file on weightfs only: Stager.offload)."""
    nbytes = _check_tensor(tensor, "offload_tensor")
    _stager_for(tensor, stager).offload(tensor.data_ptr(), nbytes, path, fsync=fsync, digest=digest)
