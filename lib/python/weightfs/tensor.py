# SPDX-License-Identifier: Apache-2.0
"""Tensors as sealed files: digest, offload (claim first, write on a miss), load (mmap), dtype names.

    import torch, weightfs
    r = weightfs.offload(w, "/data/skyrl/frozen-offload/rank0/layer0.w")  # CPU/CUDA tensor or ndarray
    r.digest, r.bytes, r.claimed          # '9f2c...' (32 hex), bytes in the file, True = no bytes moved
    t = weightfs.load(r.path)             # CPU tensor mapped from the file: dtype/shape from its xattrs
    weightfs.digest(b"abc")               # XXH3-128 hex, what `xxhsum -H2` and getfattr print

Identifier spaces: a *digest* is XXH3-128 in canonical form, spelled as 32 lower-case hex characters
(lib/digest.h); a *claim* sets `user.weightfs.claim` = that digest on a new empty file, and weightfs
seals the file with the stored object of that digest without any bytes being written (ENODATA: no such
object). The bytes of a tensor are its contiguous storage in native byte order: numel x element size.

Ownership: nothing here keeps a reference to a caller's tensor or buffer after returning. load()
returns a tensor (or numpy.memmap) that owns its own private read-only mapping of the file.

Errors: OSError and its subclasses (errno, a message naming the file, .filename) for everything the
filesystem or libweightfs reports; WeightfsError (an OSError) for conditions this package detects
(size mismatch EMSGSIZE, missing metadata ENODATA, a claim that sealed other bytes EIO); TypeError /
ValueError for arguments that cannot be offloaded. Conditions that have a fallback (claims not
supported by the filesystem, tensor xattrs not supported, a dtype without a safetensors name) emit one
WeightfsWarning per class per process, never one per tensor.

torch and numpy are optional: they are imported only when a tensor or an array is handled.
"""

import ctypes
import errno
import hashlib
import itertools
import operator
import os
import re
import stat
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _libweightfs
from . import direct as _direct
from .stage import library as _library
from .stage import offload_tensor as _offload_tensor
from .names import CLAIM_XATTR, CLAIMS_XATTR, DIGEST_XATTR, DTYPE_XATTR, PASSTHROUGH_WRITE_MIN, SHAPE_XATTR, TMP_PREFIX
from .names import FALLBACK_DTYPE_BYTES as DTYPE_BYTES
from .names import dtype_bytes as _dtype_bytes
from .names import parse_shape as _parse_shape

if TYPE_CHECKING:
    from .stage import Stager

PathLike = Union[str, "os.PathLike[str]"]

__all__ = [
    "CLAIM_XATTR", "DIGEST_XATTR", "DTYPE_XATTR", "SHAPE_XATTR", "OffloadResult", "WeightfsError",
    "WeightfsWarning", "digest", "digest_file", "dtype_name", "load", "offload", "remove_stale_tmp",
    "shape_text",
]


_DIGEST_BYTES = 16
_WRITE_CHUNK = 16 << 20  # bytes per write(2): FUSE splits it further; bounds one syscall's latency
_GPU_CHUNK = 64 << 20  # bytes of host buffer used to hash a CUDA tensor (one per device, reused)

# DTYPE_BYTES (safetensors dtype name -> bytes per element) is the copy of lib/dtype.c's table used
# without the library; the code asks _dtype_bytes(), which reads the library's when it loads.

# safetensors name -> torch dtype attribute name (the ones this torch lacks are skipped at lookup).
_TORCH_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
                "F8_E4M3": "float8_e4m3fn", "I16": "int16", "U16": "uint16", "F16": "float16",
                "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
                "U64": "uint64", "F64": "float64", "F8_E8M0": "float8_e8m0fnu", "C64": "complex64"}
# safetensors name -> numpy dtype name (numpy has no bfloat16 or float8).
_NUMPY_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
                "F16": "float16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
                "U64": "uint64", "F64": "float64", "C64": "complex64"}


class WeightfsError(OSError):
    """An error this package detects itself: errno, a one-line message, and .filename (the path)."""


class WeightfsWarning(UserWarning):
    """A fallback was taken (claims unsupported, xattrs unsupported, ...); emitted once per class."""


class OffloadResult(NamedTuple):
    """What offload() did for one tensor.

    path: the final file name. digest: XXH3-128, 32 hex characters. bytes: the file's size.
    claimed: True when the file was sealed from the stored object (no bytes written).
    skipped: True when an existing file already held these bytes and was left as it was
    (FrozenOffload only). Bytes written = 0 if claimed or skipped else bytes."""

    path: str
    digest: str
    bytes: int
    claimed: bool
    skipped: bool = False

    @property
    def written_bytes(self) -> int:
        return 0 if self.claimed or self.skipped else self.bytes


# ---- warnings: one per failure class -----------------------------------------------------------

_warned = set()
_warned_lock = threading.Lock()
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _warn_once(cls, message):
    with _warned_lock:
        if cls in _warned:
            return
        _warned.add(cls)
    # Point the warning at the first caller outside this package.
    level, f = 1, sys._getframe(0)
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE_DIR):
        f, level = f.f_back, level + 1
    warnings.warn(f"weightfs: {message}", WeightfsWarning, stacklevel=level)


def _reset_warnings():
    """Forget which warning classes were emitted (tests)."""
    with _warned_lock:
        _warned.clear()


def _err(code, path, what):
    """OSError (the errno's subclass, e.g. FileNotFoundError) with '<what>' and .filename = path."""
    return OSError(code, what, path)


def _reraise(e, path, what):
    """Re-raise OSError e as the same errno with a message saying what was being done, on path."""
    code = e.errno if e.errno is not None else errno.EIO
    return _err(code, path, f"{what}: {e.strerror or os.strerror(code)}")


# ---- the C library ---------------------------------------------------------------------------

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


# ---- host memory behind tensors, arrays and buffers ---------------------------------------------

class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer; obj is a borrowed-then-released reference, kept opaque.
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_PyBUF_C_CONTIGUOUS = 0x0020 | 0x0010 | 0x0008  # PyBUF_C_CONTIGUOUS: any C-contiguous exporter


class _HostBytes:
    """The bytes of a C-contiguous host buffer, by address, held (not copied) until close()."""

    def __init__(self, obj):
        self._view = _PyBuffer()
        try:
            _get_buffer(obj, ctypes.byref(self._view), _PyBUF_C_CONTIGUOUS)
        except BufferError as e:
            raise ValueError(f"not a C-contiguous buffer ({e}); pass a contiguous copy") from None
        self.address, self.nbytes = self._view.buf, self._view.len

    def close(self):
        if self._view is not None:
            _release_buffer(ctypes.byref(self._view))
            self._view = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported: never import it
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_host(t):
    """(contiguous detached tensor, address, nbytes) for a CPU tensor; the tensor keeps the memory.
    A non-contiguous tensor is copied once (.contiguous())."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t, (t.data_ptr() if t.numel() else 0), t.numel() * t.element_size()


def _address_view(address, nbytes):
    """A writable-or-not memoryview of nbytes at address ('B' format), no copy; the owner must live."""
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * nbytes).from_address(address)).cast("B")


# ---- CUDA tensors: hashed through a bounded host buffer -----------------------------------------

_gpu_buffers = {}
_gpu_lock = threading.Lock()


def _gpu_buffer(torch, device):
    """A (pinned when possible) host buffer of _GPU_CHUNK bytes for device, with its lock."""
    with _gpu_lock:
        if device not in _gpu_buffers:
            try:
                buf = torch.empty(_GPU_CHUNK, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:
                buf = torch.empty(_GPU_CHUNK, dtype=torch.uint8)
            _gpu_buffers[device] = (buf, threading.Lock())
        return _gpu_buffers[device]


def _gpu_chunks(t):
    """Yield (address, nbytes) of successive host copies of a contiguous CUDA tensor's bytes; each
    chunk is valid until the next one is requested. Host memory: one _GPU_CHUNK buffer per device."""
    import torch

    flat = t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)
    buf, lock = _gpu_buffer(torch, t.device.index if t.device.index is not None else
                            torch.cuda.current_device())
    with lock:
        for off in range(0, flat.numel(), _GPU_CHUNK):
            n = min(_GPU_CHUNK, flat.numel() - off)
            buf[:n].copy_(flat[off:off + n])  # synchronous D2H into the host buffer
            yield buf.data_ptr(), n


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
    tensor (CPU or CUDA, any dtype). The bytes are the C-contiguous storage in native byte order
    (numel x element size): a non-contiguous torch tensor or numpy array is hashed as its
    .contiguous() / ascontiguousarray() copy (one temporary copy), a CUDA tensor through a bounded host
    buffer (64 MiB per device, pinned when CUDA allows). Host memory is hashed in place, without a copy,
    with the GIL released.

    Raises TypeError for an object without bytes (a numpy array of Python objects included), OSError
    when libweightfs.so cannot be loaded."""
    if _is_torch_tensor(data):
        if data.device.type == "cuda":
            t = data.detach()
            return _gpu_digest(t if t.is_contiguous() else t.contiguous())
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


def _contiguous_array(data):
    """numpy arrays that are not C-contiguous -> a contiguous copy; anything else as given.

    Raises TypeError for a numpy array whose dtype holds Python objects (dtype=object, or a structured
    dtype with such a field): its bytes are the objects' addresses in this process, not data."""
    if type(data).__module__.startswith("numpy") and hasattr(data, "flags"):
        if getattr(getattr(data, "dtype", None), "hasobject", False):
            raise TypeError(f"numpy array of dtype {data.dtype} holds Python objects, whose bytes are "
                            "their addresses in this process, not tensor data")
        if not data.flags["C_CONTIGUOUS"]:
            import numpy

            return numpy.ascontiguousarray(data)
    return data


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


# ---- dtype names -------------------------------------------------------------------------------

_torch_dtype_names: Dict[Any, Optional[str]] = {}  # torch dtype -> its safetensors name or None, as found (one per dtype)


def dtype_name(dtype: Any) -> Optional[str]:
    """The safetensors name (BF16, F16, F32, F64, I8, U8, I16, I32, I64, BOOL, ...) of a torch dtype,
    a numpy dtype (or anything numpy.dtype() takes) or a safetensors name; None when it has none
    (complex, quantized, ...)."""
    if isinstance(dtype, str) and dtype.upper() in _dtype_bytes():
        return dtype.upper()
    if type(dtype).__module__ == "torch":
        try:
            return _torch_dtype_names[dtype]
        except KeyError:
            pass
        name = str(dtype).removeprefix("torch.")
        found = None
        for st, tn in _TORCH_NAMES.items():
            if tn == name:
                found = st
                break
        _torch_dtype_names[dtype] = found
        return found
    try:
        import numpy
    except ImportError:
        return None
    try:
        name = numpy.dtype(dtype).name
    except TypeError:
        return None
    for st, nn in _NUMPY_NAMES.items():
        if nn == name:
            return st
    return None


def _torch_dtype(name):
    import torch

    attr = _TORCH_NAMES.get(name)
    dt = getattr(torch, attr, None) if attr else None
    if dt is None:
        raise ValueError(f"dtype {name} has no torch dtype in torch {torch.__version__}")
    return dt


def shape_text(shape: Sequence[int]) -> str:
    """The user.weightfs.shape spelling of a shape: '[4096,1024]', '[]' for a scalar."""
    return "[" + ",".join([str(operator.index(d)) for d in shape]) + "]"  # 64.0: TypeError


_HEX32 = re.compile(r"[0-9a-fA-F]{32}")

# The most bytes one setxattr(2) value may hold (XATTR_SIZE_MAX, linux/limits.h).
_XATTR_SIZE_MAX = 65536
# Lines per claims request at most (a 64 KiB request holds about 900): weightfs makes one request's
# files while the caller hashes the next request's tensors, so the first request's hashing and the
# last request's claims are the time not overlapped; 256 keeps both short at a few milliseconds.
_CLAIMS_PER_REQUEST = 256


def claim_files(directory: PathLike, entries: Iterable[Tuple[str, str, Optional[str], Optional[Sequence[int]]]]
                ) -> set:
    """Make many new sealed files by digest in one weightfs directory, hundreds per request.

    entries: (file name, digest as 32 hex digits, safetensors dtype name or None, shape or None),
    for names meant to be new in directory; any iterable, consumed once: a generator that computes
    the digests as it goes overlaps that work with weightfs making the previous request's files
    (each request is sent from a second thread while the next one is built). Sends
    user.weightfs.claims on the directory (lines of "DIGEST\tDTYPE\tSHAPE\tNAME", at most 256
    lines and under 64 KiB per request): weightfs makes each name that does not exist yet and whose
    content is stored intact as a sealed file (mode 0644, the caller's), with user.weightfs.dtype
    and .shape, and passes over the rest. Returns the set of names made: those of entries that were
    absent before and are listed after (the directory is read twice). Names that are not file names
    (empty, ".", "..", with "/", NUL or a newline, over 255 bytes) are left out, and a directory
    that is not on weightfs makes nothing (set()): write those. A name another process creates
    meanwhile would be counted as made; FrozenOffload's rank directories have one writer. Raises OSError (EPERM: only the mounting user
    or root may claim; ENOSPC, EIO with the directory), WeightfsError(EINVAL) when weightfs rejects
    the request's format, TypeError for a shape that is a string or has a non-integer dimension,
    ValueError for a digest that is not 32 hex digits or a dtype that is not a safetensors dtype
    name; an error from entries itself is raised once the request in flight has been answered.
    Requests sent before an error stay done."""
    directory = os.fspath(directory)
    if fs_type(directory) != "fuse.weightfs":
        return set()
    before = None  # the directory's names, read at the first entry
    wanted = set()

    def send(value, count):
        try:
            os.setxattr(directory, CLAIMS_XATTR, value)
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise WeightfsError(errno.EINVAL, f"{directory}: weightfs rejected a batch claim's "
                                    f"format (its log names the line)", directory) from None
            raise _reraise(e, directory, f"claiming {count} files in {directory}") from None

    inflight = None  # (thread, [exception]) of the request being answered

    def wait():
        nonlocal inflight
        if inflight:
            th, err = inflight
            th.join()
            inflight = None
            if err:
                raise err[0]

    def start(batch):
        nonlocal inflight
        wait()
        err = []

        def run(value=b"".join(batch), count=len(batch)):
            try:
                send(value, count)
            except BaseException as e:  # raised in the caller by wait()
                err.append(e)

        th = threading.Thread(target=run, name="weightfs-claims", daemon=True)
        th.start()
        inflight = (th, err)

    batch: List[bytes] = []
    size = 0
    try:
        for name, hexdigest, dtype, shape in entries:
            if isinstance(shape, (str, bytes)):
                raise TypeError(f"claim_files: shape of {name!r} must be a sequence of ints, not {shape!r}")
            if not isinstance(hexdigest, str) or not _HEX32.fullmatch(hexdigest):
                raise ValueError(f"claim_files: digest of {name!r} must be 32 hex digits, not {hexdigest!r}")
            if dtype is not None and (not isinstance(dtype, str) or dtype not in _dtype_bytes()):
                raise ValueError(f"claim_files: dtype of {name!r} must be a safetensors dtype name "
                                 f"('BF16', 'F32', ...), not {dtype!r}")
            raw = name.encode("utf-8", "surrogateescape")
            if before is None:
                before = set(os.listdir(directory))
            if (name in before or name in wanted or not raw or len(raw) > 255 or name in (".", "..")
                    or any(c in name for c in "\n/\0")):
                continue  # not a file name weightfs would make: the caller writes it
            wanted.add(name)
            line = (f"{hexdigest}\t{dtype or ''}\t{shape_text(shape) if shape is not None else ''}\t"
                    .encode("ascii") + raw + b"\n")
            if batch and (size + len(line) > _XATTR_SIZE_MAX or len(batch) == _CLAIMS_PER_REQUEST):
                start(batch)
                batch, size = [], 0
            batch.append(line)
            size += len(line)
        if batch:
            start(batch)
    finally:
        wait()  # also when entries raised: the request in flight is answered first
    return wanted & set(os.listdir(directory)) if wanted else set()


# ---- the filesystem's answer to claims, per device ---------------------------------------------

# st_dev -> True (claims work there) or False (not supported: write the bytes).
_claims: Dict[int, bool] = {}
_claims_lock = threading.Lock()


def _claim_state(dev):
    with _claims_lock:
        return _claims.get(dev)


def _set_claim_state(dev, state):
    with _claims_lock:
        _claims[dev] = state


def _reset_claim_state():
    """Forget what was learnt about claim support (tests; a remount with another daemon)."""
    with _claims_lock:
        _claims.clear()
    _dir_devs.clear()


def _claims_refused(e, dev, directory):
    """Is OSError e a claim's "not here" (EPERM: not the mounting user; ENOTSUP: no claims on this
    filesystem)? Then claims are off for device dev, with one warning naming directory: the caller
    writes the bytes."""
    if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
        _set_claim_state(dev, False)
        _warn_once("claim-unsupported", f"claims are not supported on the filesystem of {directory} "
                   f"({e.strerror}); writing the bytes of every tensor there")
        return True
    if e.errno == errno.EPERM:
        _set_claim_state(dev, False)
        _warn_once("claim-eperm", f"claims refused on {directory} (EPERM: this process is not the "
                   "mounting user); writing the bytes of every tensor there")
        return True
    return False


def _try_claim(fd, tmp, dev, hexdigest, nbytes):
    """Claim hexdigest on the new empty file open at fd. True when the file is now sealed with those
    nbytes; False when the bytes must be written (no such object, or claims unsupported here)."""
    state = _claim_state(dev)
    if state is False:
        return False
    try:
        os.setxattr(fd, CLAIM_XATTR, hexdigest.encode("ascii"))
    except OSError as e:
        if e.errno == errno.ENODATA:
            _set_claim_state(dev, True)  # only weightfs answers "no such object"
            return False
        if _claims_refused(e, dev, os.path.dirname(tmp)):
            return False
        raise _reraise(e, tmp, f"claiming {hexdigest} on {tmp}")
    # setxattr succeeded: on weightfs with claims the file is now sealed; a filesystem that merely
    # stores user.* xattrs (ext4, a weightfs without claims) says yes too and the file is still empty.
    # The digest tells which: equal to the one claimed, the file holds the nbytes hashed to it (no
    # size to ask for: one request less per claim); otherwise the size says what happened.
    try:
        got = os.getxattr(fd, DIGEST_XATTR).decode("ascii", "replace")
    except OSError:
        got = None
    if got == hexdigest:
        _set_claim_state(dev, True)
        return True
    size = os.fstat(fd).st_size
    if size != 0 or got is not None:  # sealed, but not with the bytes claimed: never keep that file
        raise WeightfsError(errno.EIO, f"claim of {hexdigest} on {tmp} reported success but the file "
                            f"has {size} bytes and digest {got} (expected {nbytes} bytes)", tmp)
    # Still empty and unsealed: the attribute was merely stored. (Also after a remount that reused
    # the device number of a claim-capable mount: what was learnt about it is replaced.)
    try:
        os.removexattr(fd, CLAIM_XATTR)  # do not leave a stray attribute behind
    except OSError:
        pass
    _set_claim_state(dev, False)
    _warn_once("claim-unsupported", f"claims are not supported on the filesystem of "
               f"{os.path.dirname(tmp)} (setxattr stored an ordinary attribute); writing the bytes of "
               "every tensor there")
    return False


def _set_tensor_xattrs(fd, path, name, shape):
    """Set user.weightfs.dtype and .shape on open file fd (path: for messages); one warning when the
    filesystem has no user xattrs. Set before the bytes are written, so that weightfs holds the seal
    (and a claim) to them."""
    if name is None:
        return
    try:
        os.setxattr(fd, DTYPE_XATTR, name.encode("ascii"))
        os.setxattr(fd, SHAPE_XATTR, shape_text(shape).encode("ascii"))
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            _warn_once("xattr-unsupported", f"user xattrs are not supported on the filesystem of "
                       f"{path}; {DTYPE_XATTR} and {SHAPE_XATTR} are not set")
            return
        raise _reraise(e, path, f"setting {DTYPE_XATTR}={name} {SHAPE_XATTR}={shape_text(shape)}")


# ---- offload ----------------------------------------------------------------------------------

_tmp_counter = itertools.count()
_made_dirs = set()  # directories this process created or found: no mkdir round trip per tensor


_dir_devs: Dict[str, int] = {}  # directory -> st_dev of the files created in it: no GETATTR of each new file


def _dev_of(d, fd):
    """st_dev of the new file fd in directory d (the same filesystem: it was created there). Kept per
    directory: a fstat of a file being written is a round trip to weightfs each time. A stale entry
    after a remount only picks another device's claim state; the claim is verified either way."""
    dev = _dir_devs.get(d)
    if dev is None:
        dev = _dir_devs[d] = os.fstat(fd).st_dev
    return dev


def _create(tmp, d):
    """Create the new file tmp (O_EXCL) in directory d, making d first when it is missing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    if d not in _made_dirs:
        try:
            os.makedirs(d, exist_ok=True)
        except FileExistsError:  # d, or a directory above it, is a file
            raise NotADirectoryError(errno.ENOTDIR, f"{d}: a component of the path is not a directory",
                                     d) from None
        _made_dirs.add(d)
    try:
        return os.open(tmp, flags, 0o644)
    except FileNotFoundError:  # removed since: make it again, once
        os.makedirs(d, exist_ok=True)
        try:
            return os.open(tmp, flags, 0o644)
        except OSError as e:
            raise _reraise(e, tmp, f"creating {tmp}") from None
    except OSError as e:
        raise _reraise(e, tmp, f"creating {tmp}") from None


SEAL_WAIT_SECONDS = 30.0  # how long _await_seal waits for a passthrough-written tensor's seal


def _await_seal(tmp, hexdigest):
    """Wait for weightfs to seal tmp (written through passthrough: sealed at its release, moments
    after close), reading its user.weightfs.digest, which waits for that seal; then the tensor is
    an object before anyone opens it, and the daemon's digest is checked against the host's
    (OSError EIO when they differ). The digest answered is the last seal's: when the release is
    slow to reach the daemon (its request threads busy, or waiting on the catalog while the disk
    is flooded with writeback), that can still be the empty file's seal from before the bytes, so
    another digest is asked again, with backoff, for up to SEAL_WAIT_SECONDS before it counts as a
    mismatch. Elsewhere (no such attribute) this is one failed getxattr."""
    deadline, delay = None, 0.001
    while True:
        try:
            got = os.getxattr(tmp, DIGEST_XATTR).decode("ascii", "replace").strip()
        except OSError:
            return
        if not hexdigest or got == hexdigest:
            return
        now = time.monotonic()
        if deadline is None:
            deadline = now + SEAL_WAIT_SECONDS
        elif now >= deadline:
            raise OSError(errno.EIO, f"weightfs: {tmp}: sealed as {got}, but the tensor's bytes hash "
                          f"to {hexdigest}: the file does not hold what was written", tmp)
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def _reopen_to_write(fd, tmp):
    """Close fd (tmp, just created, its xattrs set) and open tmp again to write it: weightfs writes
    a tensor of PASSTHROUGH_WRITE_MIN bytes or more through kernel passthrough when it is opened
    after its attributes are set (lib/weightfs.h); elsewhere this costs one close and one open."""
    os.close(fd)
    try:
        return os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as e:
        raise _reraise(e, tmp, f"opening {tmp} to write") from None


def _tmp_name(path):
    d, base = os.path.split(path)
    tag = hashlib.sha1(base.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return os.path.join(d, f"{TMP_PREFIX}{os.getpid()}-{next(_tmp_counter)}-{tag}")


STALE_TMP_SECONDS = 3600  # a temporary name this old whose process is gone is a leftover


def remove_stale_tmp(directory: PathLike, *, min_age: float = STALE_TMP_SECONDS) -> int:
    """Remove temporary names offload() left in directory (not recursive) when its process was
    killed between creating and renaming them: `.wfs-tmp-<pid>-*` whose pid is not a live process
    here and whose mtime is at least min_age seconds old (a process in another PID namespace sharing
    the mount may look dead; the age guards its names). Returns the number removed; errors other than
    a name vanishing meanwhile are raised as OSError."""
    removed = 0
    now = time.time()
    with os.scandir(directory) as it:
        for e in it:
            m = re.match(re.escape(TMP_PREFIX) + r"(\d+)-", e.name)
            if not m or not e.is_file(follow_symlinks=False):
                continue
            try:
                os.kill(int(m.group(1)), 0)
                continue  # alive
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # alive, another user's
            try:
                if now - e.stat(follow_symlinks=False).st_mtime < min_age:
                    continue
                os.unlink(e.path)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def _write_all(fd, view, path):
    off = 0
    n = len(view)
    try:
        while off < n:
            off += os.write(fd, view[off:off + _WRITE_CHUNK])
    except OSError as e:
        raise _reraise(e, path, f"writing {path} at byte {off} of {n}") from None


def _describe(obj):
    """(kind, keeper, dtype name or None, shape) where kind is 'cpu', 'cuda' or 'buffer'."""
    if _is_torch_tensor(obj):
        t = obj.detach()
        if t.device.type == "cuda":
            return "cuda", (t if t.is_contiguous() else t.contiguous()), dtype_name(t.dtype), tuple(t.shape)
        if t.device.type != "cpu":
            raise ValueError(f"offload: tensor on {t.device} (only CPU and CUDA tensors)")
        return "cpu", (t if t.is_contiguous() else t.contiguous()), dtype_name(t.dtype), tuple(t.shape)
    if type(obj).__module__.startswith("numpy") and hasattr(obj, "dtype") and hasattr(obj, "shape"):
        a = _contiguous_array(obj)
        return "buffer", a, dtype_name(a.dtype), tuple(a.shape)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"offload: {type(obj).__name__} is not a tensor, array or buffer") from None
    if not mv.c_contiguous:
        raise ValueError("offload: buffer is not C-contiguous")
    return "buffer", obj, "U8", (mv.nbytes,)


def offload(data: Any, path: PathLike, *, claim: bool = True, xattrs: bool = True, fsync: bool = False,
            stager: Optional["Stager"] = None, _digest: Optional[str] = None) -> OffloadResult:
    """Write a tensor's bytes as a new sealed file at path: hash on the host, claim, write on a miss.

    data: a torch tensor on the CPU or a CUDA device (any dtype; non-contiguous ones are copied once
    with .contiguous()), a numpy array (non-C-contiguous ones copied once), or any C-contiguous buffer
    (bytes, memoryview, mmap; dtype U8, shape [nbytes]). path: the final name; its directory is
    created. The file is built under a temporary name in the same directory (.wfs-tmp-PID-N-HASH),
    sealed, given its xattrs and renamed over path, so readers of path see the old file or the new one,
    never a partial one (this is also what avoids ETXTBSY on weightfs while path is mapped).

    Steps: (1) digest on the host (CPU memory in place; a CUDA tensor through a 64 MiB host buffer,
    one D2H pass); with claim false, host memory of PASSTHROUGH_WRITE_MIN bytes or more is hashed
    on a second thread while (3) writes it. (2) When claim is true and the file system has not shown it lacks claims, set
    user.weightfs.claim on the new empty file: on a hit weightfs seals it with the stored object and no
    bytes move. The result is checked (size and user.weightfs.digest), so a filesystem that only
    stores the attribute (ext4, or a weightfs without claims) is detected: one warning, then bytes are
    written there from then on. (3) On a miss, write the bytes: CPU memory is written straight from the
    tensor/array (no copy); a CUDA tensor goes through the staging ring (offload_tensor: pinned
    128 MiB ring, a second D2H pass, never a full host copy) when libweightfs has CUDA, else through
    the 64 MiB host buffer chunk by chunk. A miss on a CUDA tensor therefore moves the bytes
    device-to-host twice (about 2 x bytes / 20+ GB/s, small next to the write itself); a hit once.
    (4) close(2) seals the file (weightfs reports ENOSPC/EIO there); a tensor written through
    passthrough is first given its digest (setxattr user.weightfs.digest on the open file), which
    weightfs takes instead of reading the bytes again to hash them; fsync=True fdatasyncs first, so
    that the seal is durable when close returns (weightfs's default -o sync=group makes it durable
    within 1 s otherwise). (5) With xattrs true, set
    user.weightfs.dtype (safetensors name) and user.weightfs.shape ('[d0,d1]') when the dtype has a
    name (else one warning). (6) rename over path.

    The tensor must not change until offload returns. One written through passthrough is sealed on
    the digest taken before (or while) it was written, and weightfs checks its bytes right after: a
    change meanwhile makes the file fail with EIO from then on, found by that check, not by this
    call (FrozenOffload.offload waits for those checks at its end and raises).

    Returns OffloadResult(path, digest, bytes, claimed). On any error the temporary file is removed and
    path is left as it was. Raises OSError (ENOSPC, EIO, EACCES, ... with the path and what failed),
    WeightfsError(EIO) when a claim reported success but the file does not hold the claimed bytes,
    TypeError/ValueError for data that cannot be offloaded. Thread-safe for distinct paths."""
    kind, keep, name, shape = _describe(data)
    host = None
    # _digest: the caller (FrozenOffload) already hashed these exact bytes. Without a claim to make,
    # host memory written through passthrough is hashed while it is written (_DigestThread).
    if kind == "cuda":
        nbytes = keep.numel() * keep.element_size()
        hexdigest = _digest or _gpu_digest(keep)
    elif kind == "cpu":
        keep, address, nbytes = _torch_host(keep)
    else:
        host = _HostBytes(keep)
        address, nbytes = host.address, host.nbytes
    try:
        if kind != "cuda":
            parallel = not claim and not _digest and nbytes >= PASSTHROUGH_WRITE_MIN
            hexdigest = _digest or (None if parallel else _digest_address(address, nbytes))
        return _offload_bytes(kind, keep, name, shape, path, claim, xattrs, fsync, stager, hexdigest,
                              nbytes, None if kind == "cuda" else address)
    finally:
        if host is not None:
            host.close()


def _offload_bytes(kind, keep, name, shape, path, claim, xattrs, fsync, stager, hexdigest, nbytes,
                   address):
    """offload() once the bytes are located: hexdigest None means hash host memory at address
    while it is written."""
    if name is None:
        _warn_once("dtype-unnamed", f"dtype of {path} has no safetensors name; {DTYPE_XATTR} and "
                   f"{SHAPE_XATTR} are not set on such tensors")
    path = os.fspath(path)
    if path.endswith(os.sep) or os.path.basename(path) in (".", ".."):
        raise IsADirectoryError(errno.EISDIR, f"offload: {path} names a directory, not a file", path)
    d = os.path.dirname(os.path.abspath(path))
    tmp = _tmp_name(os.path.join(d, os.path.basename(path)))
    claimed = False
    sealed_later = False  # written through passthrough: weightfs seals it at the release
    fd = -1
    hasher = None
    declare = False  # written through passthrough on weightfs: the digest goes with the bytes
    try:
        fd = _create(tmp, d)
        if xattrs:
            _set_tensor_xattrs(fd, tmp, name, shape)
        # Empty content is claimed too: a claim seals at once, while an empty file that is only
        # created and closed is sealed by weightfs at release, after close(2) has returned.
        if claim:
            claimed = _try_claim(fd, tmp, _dev_of(d, fd), hexdigest, nbytes)
        if not claimed and nbytes > 0:
            staged = kind == "cuda" and _stage_has_cuda()
            through_kernel = xattrs and name is not None and nbytes >= PASSTHROUGH_WRITE_MIN
            sealed_later = through_kernel
            declare = through_kernel and _is_weightfs(_dev_of(d, fd))
            if through_kernel and staged:
                # The stager opens the file again itself (O_TRUNC): with this descriptor closed
                # first, weightfs writes the tensor through kernel passthrough (lib/weightfs.h).
                cfd, fd = fd, -1
                os.close(cfd)
            elif through_kernel:
                cfd, fd = fd, -1
                fd = _reopen_to_write(cfd, tmp)
            if hexdigest is None:
                hasher = _DigestThread(address, nbytes)
            if staged:
                # The stager writes through a descriptor of its own (O_TRUNC). A small tensor's
                # descriptor stays open so that nothing is sealed before the bytes are in: the seal
                # is at its close below; a large one's was closed above (an empty file is sealed
                # empty, then written), and the stager's close is the seal.
                _offload_tensor(keep, tmp, fsync=fsync, stager=stager,
                                digest=hexdigest if declare else None)
            elif kind == "cuda":
                for address, n in _gpu_chunks(keep):
                    _write_all(fd, _address_view(address, n), tmp)
            elif kind == "cpu":
                _write_all(fd, _address_view(address, nbytes), tmp)
            else:
                mv = memoryview(keep)
                try:
                    _write_all(fd, mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, tmp)
                finally:
                    mv.release()
        if hasher is not None:
            hexdigest, hasher = hasher.digest(), None
        if fd >= 0:
            if sealed_later and not claimed and declare:
                _declare(fd, tmp, hexdigest)
            if fsync and not claimed:
                os.fdatasync(fd)
            cfd, fd = fd, -1
            try:
                os.close(cfd)  # weightfs seals here: ENOSPC/EIO of the seal come back now
            except OSError as e:
                raise _reraise(e, tmp, f"closing (sealing) {tmp}") from None
        if sealed_later:
            _await_seal(tmp, hexdigest)
        try:
            os.rename(tmp, path)
        except OSError as e:
            raise _reraise(e, path, f"renaming {tmp} to {path}") from None
    except BaseException:
        if hasher is not None:
            hasher.join()  # it reads the caller's memory: done before the caller may free it
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return OffloadResult(path, hexdigest, nbytes, claimed)


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


def _mounts():
    """(major:minor, mount point, filesystem type) of each mount, from /proc/self/mountinfo (mount
    points unescaped); [] when it cannot be read."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                out.append((fields[2], mnt, right.split()[0]))
    except OSError:
        pass
    return out


def fs_type(path: PathLike) -> Optional[str]:
    """The filesystem type of the mount holding path ('fuse.weightfs', 'ext4', ...), or None when
    it cannot be told."""
    real = os.path.realpath(path)
    best, best_type = "", None
    for _, mnt, kind in _mounts():
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, best_type = mnt, kind
    return best_type


_weightfs_devs: Dict[int, bool] = {}  # st_dev -> is it a weightfs mount


def _is_weightfs(dev):
    """Is device dev (a file's st_dev) a weightfs mount? Asked of _mounts() once per device; False
    when it cannot be told."""
    known = _weightfs_devs.get(dev)
    if known is None:
        want = f"{os.major(dev)}:{os.minor(dev)}"
        known = any(dn == want and kind == "fuse.weightfs" for dn, _, kind in _mounts())
        _weightfs_devs[dev] = known
    return known


def _declare(fd, tmp, hexdigest):
    """Tell weightfs the digest of the bytes written to fd (a tensor written through passthrough,
    not closed yet): its seal then publishes them under it instead of reading them all again to
    hash them, and checks them soon after (docs/integrity.md). A weightfs that does not take
    declarations answers EPERM: the seal hashes, as before."""
    try:
        os.setxattr(fd, DIGEST_XATTR, hexdigest.encode("ascii"))
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise _reraise(e, tmp, f"declaring the digest {hexdigest} of {tmp}") from None


_have_cuda = None


def _stage_has_cuda():
    global _have_cuda
    if _have_cuda is None:
        _have_cuda = bool(_library().wfs_stage_have_cuda())
    return _have_cuda


# ---- load -------------------------------------------------------------------------------------

def _get_text_xattr(path, attr):
    try:
        return os.getxattr(path, attr).decode("utf-8", "replace")
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise _reraise(e, path, f"reading {attr} of {path}") from None


def tensor_info(path: PathLike) -> Tuple[Optional[str], Optional[Tuple[int, ...]]]:
    """(dtype name or None, shape tuple or None) from path's user.weightfs.dtype / .shape xattrs.
    Raises OSError (ENOENT, EACCES, ...) and WeightfsError(EINVAL) for an unparsable shape."""
    name = _get_text_xattr(path, DTYPE_XATTR)
    shape_s = _get_text_xattr(path, SHAPE_XATTR)
    shape = None
    if shape_s is not None:
        try:
            shape = _parse_shape(shape_s)
        except ValueError:
            raise WeightfsError(errno.EINVAL, f"{path}: {SHAPE_XATTR} is {shape_s!r}, not a shape "
                                "like [4096,1024]", path) from None
    return (name.upper() if name else None), shape


def load(path: PathLike, dtype: Any = None, shape: Optional[Sequence[int]] = None, *,
         numpy: bool = False) -> Any:
    """Map the file at path as a read-only CPU tensor: torch.from_file(path, shared=False) viewed as
    dtype and shape, or, with numpy=True, a numpy.memmap(mode='r').

    The mapping is private (MAP_PRIVATE) to the returned object and reads the file's page cache: on
    weightfs that is the object's page cache (through the direct path, open_object(), or kernel
    passthrough), shared by every name and every process mapping the same content, and
    reclaimable. Writes to the tensor (torch) stay private to the process (copy-on-write). The file
    is not read here; pages fault in on first touch.

    dtype: a torch dtype, numpy dtype or safetensors name; default user.weightfs.dtype of the file, else
    U8. shape: a sequence of ints; default user.weightfs.shape, else [bytes / element size].
    Returns a torch.Tensor (or numpy.memmap; an empty file gives an empty array).

    Raises OSError (ENOENT, EACCES, EIO, ...) naming path; WeightfsError(EMSGSIZE) when the file's
    size is not elements x element size ("...: size mismatch: ..."); ValueError for a dtype torch or
    numpy cannot represent (BF16 with numpy=True); ImportError when torch (or numpy) is missing."""
    path = os.fspath(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        # A directory on weightfs has st_size 0: without this an empty tensor would come back.
        code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
        raise OSError(code, "load: not a regular file" + (
            " (a directory)" if code == errno.EISDIR else ""), path)
    xname, xshape = (None, None) if dtype is not None and shape is not None else tensor_info(path)
    name = dtype_name(dtype) if dtype is not None else (xname or "U8")
    if name is None:
        raise ValueError(f"load: {dtype!r} has no safetensors name")
    table = _dtype_bytes()
    if name not in table:
        raise ValueError(f"load: {path}: unknown dtype {name}")
    esize = table[name]
    if shape is None:
        shape = xshape if xshape is not None else (st.st_size // esize,)
    shape = tuple(int(d) for d in shape)
    numel = 1
    for d_ in shape:
        numel *= d_
    if numel * esize != st.st_size:
        raise WeightfsError(errno.EMSGSIZE, f"{path}: size mismatch: {st.st_size} bytes, expected "
                            f"{numel * esize} ({shape_text(shape)} x {name}, {esize} bytes)", path)
    if numpy:
        import numpy as np

        if name not in _NUMPY_NAMES:
            raise ValueError(f"load: {path}: {name} has no numpy dtype; load it as torch, or as U8")
        if numel == 0:
            return np.empty(shape, dtype=_NUMPY_NAMES[name])
    else:
        import torch

        tdt = _torch_dtype(name)
    # The object behind the name when the daemon hands it out (one page-cache copy at native speed
    # without passthrough), else the mounted file. The mapping keeps the file; the descriptor goes.
    ofd = _direct.object_fd(path) if numel else None
    try:
        if ofd is not None and os.fstat(ofd).st_size != st.st_size:
            os.close(ofd)  # rewritten between the stat and the open: read the name as it is now
            ofd = None
        src = _direct.fd_path(ofd) if ofd is not None else path
        if numpy:
            m = np.memmap(src, dtype=_NUMPY_NAMES[name], mode="r", shape=shape)
            if ofd is not None:
                m.filename = path  # what the caller asked for, not /proc/self/fd/N
            return m
        try:
            t = torch.from_file(src, shared=False, size=numel, dtype=tdt)
        except RuntimeError as e:
            raise WeightfsError(errno.EIO, f"{path}: torch.from_file failed: {e}", path) from None
        return t.view(shape)
    finally:
        if ofd is not None:
            os.close(ofd)
