# SPDX-License-Identifier: Apache-2.0
"""The direct path: the object file behind a name under a weightfs mount (lib/direct.h, docs/direct.md).

    fd = weightfs.open_object("/data/skyrl/frozen-offload/rank0/layer0.w")   # a plain O_RDONLY fd
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ); os.close(fd)

The descriptor reads the store's object file: every name and every process with that content share
one page cache, at the store filesystem's speed, with or without kernel FUSE passthrough. The file is
opened through the mount first (its permissions apply), and the daemon hands out the object only for
that open descriptor. The returned descriptor is the caller's and stays valid after unmount.

load() and backload() use it when they can and otherwise read the mounted file, with one
WeightfsWarning per reason (an older daemon, a file being written, a refused socket), none for files
that are not on weightfs. WEIGHTFS_DIRECT=0 in the environment turns it off.
"""

import ctypes
import errno
import os
import stat
from typing import Optional

from . import _libweightfs
from ._types import PathLike

__all__ = ["open_object"]

_PROC_FD = "/proc/self/fd"


def _lib():
    return _libweightfs.bind({"wfs_direct_open_fd": ([ctypes.c_int], ctypes.c_int)})


def _object_of(fd: int) -> int:
    """wfs_direct_open_fd(): an object descriptor, or -errno (lib/direct.h lists them)."""
    try:
        lib = _lib()
    except (OSError, AttributeError):  # no libweightfs, or one without the direct path
        return -errno.ENOTSUP
    return lib.wfs_direct_open_fd(fd)


def _open_regular(path: str) -> int:
    """path opened O_RDONLY, or OSError: a FIFO is opened without waiting for a writer and refused
    (only regular files have objects), like a directory or a device."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        e = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
        raise OSError(e, f"direct path: not a regular file ({os.strerror(e)})", path)
    os.set_blocking(fd, True)
    return fd


def open_object(path: PathLike) -> int:
    """A read-only descriptor of the object file behind path, a sealed file under a weightfs mount.

    Opens path O_RDONLY first (so its mode, owner and the mount's allow_other apply). Returns a new
    descriptor (O_CLOEXEC) the caller closes. Raises OSError naming path: the open's own error
    (ENOENT, EACCES, EIO for a damaged object, ...); ENOTSUP not a weightfs file; ENOPROTOOPT a
    daemon without the direct path; EBUSY the file is being written; EIO damaged object; or the
    socket's error (ECONNREFUSED, ...); EISDIR/EINVAL not a regular file (a FIFO is not waited on)."""
    path = os.fspath(path)
    fd = _open_regular(path)
    try:
        rc = _object_of(fd)
    finally:
        os.close(fd)
    if rc < 0:
        raise OSError(-rc, f"direct path: {os.strerror(-rc)}", path)
    return rc


_REASONS = {
    errno.ENOPROTOOPT: ("direct-unsupported", "the daemon has no direct path (an older weightfs)"),
    errno.EBUSY: ("direct-busy", "the file is being written"),
}


def object_fd(path: str) -> Optional[int]:
    """For load()/backload(): the object descriptor behind path, or None to read path itself.
    Raises OSError for what reading path would fail with too (the open's error, EIO)."""
    from .errors import _warn_once

    if not os.path.isdir(_PROC_FD):
        return None  # callers reach the object through /proc/self/fd/N
    fd = _open_regular(path)
    try:
        rc = _object_of(fd)
    finally:
        os.close(fd)
    if rc >= 0:
        return rc
    code = -rc
    if code == errno.EIO:
        raise OSError(code, f"{path}: {os.strerror(code)} (damaged object: see the daemon's log)", path)
    if code == errno.ENOTSUP:
        return None
    cls, why = _REASONS.get(code, ("direct-refused", f"the daemon's socket: {os.strerror(code)}"))
    _warn_once(cls, f"direct path unavailable for {path} ({why}): reading the mounted file")
    return None


def fd_path(fd: int) -> str:
    """A path that opens descriptor fd's file again (torch.from_file and the stager take paths)."""
    return f"{_PROC_FD}/{fd}"
