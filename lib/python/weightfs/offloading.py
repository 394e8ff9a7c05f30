# SPDX-License-Identifier: Apache-2.0
"""offload(): a tensor's bytes as a new sealed file, claimed by digest first, written on a miss.

    import torch, weightfs
    r = weightfs.offload(w, "/data/skyrl/frozen-offload/rank0/layer0.w")  # CPU/CUDA tensor or ndarray
    r.digest, r.bytes, r.claimed          # '9f2c...' (32 hex), bytes in the file, True = no bytes moved

The file is built under a temporary name (names.TMP_PREFIX) in the same directory, sealed and
renamed over the final name; remove_stale_tmp() removes those a killed process left. Nothing here
keeps a reference to a caller's tensor or buffer after returning. Errors: errors.py.
"""

import errno
import hashlib
import itertools
import os
import re
import stat
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Set

from ._types import PathLike
from .claims import _dev_of, _try_claim
from .digests import _digest_address, _DigestThread, _gpu_digest
from .dtypes import dtype_name, shape_text
from .errors import _reraise, _warn_once
from .memory import _address_view, _contiguous_array, _gpu_chunks, _HostBytes, _is_torch_tensor, _tensor_values, _torch_host
from .mountinfo import _is_weightfs
from .names import DIGEST_XATTR, DTYPE_XATTR, PASSTHROUGH_WRITE_MIN, SHAPE_XATTR, TMP_PREFIX
from .stage import _have_cuda
from .stage import offload_tensor as _offload_tensor

if TYPE_CHECKING:
    from .stage import Stager

__all__ = ["OffloadResult", "offload", "remove_stale_tmp"]

_WRITE_CHUNK = 16 << 20  # bytes per write(2): FUSE splits it further; bounds one syscall's latency


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
_made_dirs: Set[str] = set()  # directories this process created or found: no mkdir round trip per tensor


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
        if obj.device.type not in ("cpu", "cuda"):
            raise ValueError(f"offload: tensor on {obj.device} (only CPU and CUDA tensors)")
        t = _tensor_values(obj)
        return t.device.type, t, dtype_name(t.dtype), tuple(t.shape)
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

    data: a torch tensor on the CPU or a CUDA device (any dtype but quantized ones, TypeError;
    non-contiguous ones, and conjugate or negative views, are copied once into the values they read
    as), a numpy array (non-C-contiguous ones, and those not in native byte order, copied once), or
    any C-contiguous buffer
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

    It never skips: a path that already holds these bytes gets a new file, claimed or written, all
    the same (FrozenOffload.offload is what skips by digest).

    Returns OffloadResult(path, digest, bytes, claimed; skipped is always False). On any error the temporary file is removed and
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


def _check_target(path, d):
    """Raise before any byte moves what the final rename would: ENAMETOOLONG for a name longer than
    the directory takes, EISDIR for a directory in the way (a symlink is replaced, as rename does)."""
    base = os.fsencode(os.path.basename(path))
    try:
        name_max = os.pathconf(d, "PC_NAME_MAX")
    except OSError:
        name_max = 255  # the directory is made below; NAME_MAX of Linux filesystems
    if len(base) > name_max:
        raise OSError(errno.ENAMETOOLONG, f"offload: the name {os.path.basename(path)!r} is longer "
                      f"than the {name_max} bytes a file name may have here", path)
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise IsADirectoryError(errno.EISDIR, f"offload: {path} is a directory", path)
    except (FileNotFoundError, NotADirectoryError):
        pass


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
    _check_target(path, d)
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
            staged = kind == "cuda" and _have_cuda()
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
