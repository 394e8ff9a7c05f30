# SPDX-License-Identifier: Apache-2.0
"""Host page cache of weightfs names: evict, prefetch (on a NUMA node), residency (lib/cache.h).

    import weightfs
    weightfs.evict(["/data/frozen/rank0"])               # free the page cache of a rank's tree
    h = weightfs.prefetch(["/data/frozen/rank0"], numa_node=0)   # returns at once
    h.done(); h.progress(); h.wait()                     # poll, or block until read
    weightfs.residency(["/data/frozen/rank0"])           # resident bytes, per node

Under passthrough a mounted file's pages are the page cache of its object file (STORE/objects/..),
shared by every name with the same content: these act on the object files, which only root and the
mounting user can open (the store is 0700); anyone else gets PermissionError saying so. Pages that a
process has mapped are never dropped (the kernel's rule), and dropping one name of a shared object
drops the others' copy too (there is only one). Errors are OSError with the errno and a message that
names the path.
"""

import ctypes
import errno
import os
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Union

from . import _libweightfs
from ._types import PathLike

__all__ = ["EvictResult", "Prefetch", "evict", "prefetch", "residency"]

_MAX_NODES = 64
_SIZE_MAX = ctypes.c_size_t(-1).value


class _Residency(ctypes.Structure):
    # Mirrors struct wfs_cache_residency in lib/cache.h.
    _fields_ = [
        ("bytes", ctypes.c_uint64),
        ("resident_bytes", ctypes.c_uint64),
        ("node_bytes", ctypes.c_uint64 * _MAX_NODES),
        ("unknown_node_bytes", ctypes.c_uint64),
    ]


class _Group(ctypes.Structure):
    # Mirrors struct wfs_cache_group.
    _fields_ = [("path", ctypes.c_char_p), ("files", ctypes.c_uint64), ("unsealed", ctypes.c_uint64),
                ("objects", ctypes.c_uint64), ("unreadable", ctypes.c_uint64),
                ("unreadable_dirs", ctypes.c_uint64), ("damaged", ctypes.c_uint64)]


def _lib() -> ctypes.CDLL:
    P, S, U64, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int
    return _libweightfs.bind({
        "wfs_cache_set_new": ([ctypes.POINTER(P)], I),
        "wfs_cache_set_free": ([P], None),
        "wfs_cache_set_add": ([P, ctypes.c_char_p, ctypes.c_char_p, S], I),
        "wfs_cache_set_groups": ([P], S),
        "wfs_cache_set_group": ([P, S], ctypes.POINTER(_Group)),
        "wfs_cache_set_objects": ([P], S),
        "wfs_cache_status": ([P, S, ctypes.c_bool, ctypes.POINTER(_Residency)], I),
        "wfs_cache_drop": ([P, ctypes.POINTER(U64), ctypes.POINTER(U64)], I),
        "wfs_cache_load_start": ([P, I, I, ctypes.c_uint, ctypes.POINTER(P)], I),
        "wfs_cache_load_poll": ([P, ctypes.POINTER(U64), ctypes.POINTER(U64)], ctypes.c_bool),
        "wfs_cache_load_wait": ([P, ctypes.c_char_p, S], I),
        "wfs_cache_load_free": ([P], None),
        "wfs_cache_numa_node_of_device": ([I], I),
        "wfs_cache_max_node": ([], I),
    })


class _Set:
    """A wfs_cache_set of paths (each walked; objects opened once). Closed by close() or GC."""

    def __init__(self, paths: Union[PathLike, Iterable[PathLike]]) -> None:
        self._lib = _lib()
        self._p = ctypes.c_void_p()
        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = [paths]
        rc = self._lib.wfs_cache_set_new(ctypes.byref(self._p))
        if rc:
            raise OSError(-rc, os.strerror(-rc))
        err = ctypes.create_string_buffer(4096 + 256)
        for p in paths:
            rc = self._lib.wfs_cache_set_add(self._p, os.fsencode(os.fspath(p)), err, len(err))
            if rc:
                self.close()
                raise OSError(-rc, err.value.decode("utf-8", "replace") or os.strerror(-rc))

    def close(self) -> None:
        if self._p:
            self._lib.wfs_cache_set_free(self._p)
            self._p = ctypes.c_void_p()

    def __del__(self) -> None:
        self.close()


def _residency_dict(r: _Residency) -> Dict[str, Any]:
    nodes = {n: int(r.node_bytes[n]) for n in range(min(_lib().wfs_cache_max_node() + 1, _MAX_NODES))}
    return {"bytes": int(r.bytes), "resident_bytes": int(r.resident_bytes), "node_resident_bytes": nodes,
            "unknown_node_bytes": int(r.unknown_node_bytes)}


def residency(paths: Union[PathLike, Iterable[PathLike]]) -> Dict[str, Any]:
    """Resident page cache of paths (files or directories on a weightfs mount). Returns
    {"paths": [{"path", "files", "unsealed_files" (being written: skipped), "unreadable_files" (this
    user cannot read them: skipped), "unreadable_dirs" (directories this user cannot list or search:
    skipped with what they hold), "damaged_files" (they read EIO: their content failed its check,
    write them again: skipped), "objects", "bytes", "resident_bytes", "node_resident_bytes":
    {node: bytes}, ...} per path], "total": {... over distinct objects: shared content counts once}}.
    Raises OSError (PermissionError when the store is not readable by this user, or when its objects
    cannot be measured by this user: the kernel reports another user's files as all resident; EREMOTE
    when the mount's store is not visible from this mount namespace, as evict() says)."""
    s = _Set(paths)
    try:
        out: List[Dict[str, Any]] = []
        r = _Residency()
        for i in range(s._lib.wfs_cache_set_groups(s._p)):
            g = s._lib.wfs_cache_set_group(s._p, i).contents
            rc = s._lib.wfs_cache_status(s._p, i, True, ctypes.byref(r))
            if rc == -errno.EACCES:
                raise PermissionError(errno.EACCES, "residency cannot be measured as this user (the kernel "
                                      "reports another user's files as all resident)", g.path.decode())
            d = _residency_dict(r)
            d.update(path=g.path.decode(), files=int(g.files), unsealed_files=int(g.unsealed),
                     unreadable_files=int(g.unreadable), unreadable_dirs=int(g.unreadable_dirs),
                     damaged_files=int(g.damaged),
                     objects=int(g.objects))
            out.append(d)
        s._lib.wfs_cache_status(s._p, _SIZE_MAX, True, ctypes.byref(r))
        total = _residency_dict(r)
        total["objects"] = int(s._lib.wfs_cache_set_objects(s._p))
        return {"paths": out, "total": total}
    finally:
        s.close()


class EvictResult(NamedTuple):
    objects: int                 # distinct objects below the paths
    resident_bytes_before: Optional[int]  # None: not measurable as this user (another user's objects)
    resident_bytes_after: Optional[int]   # what stayed: pages some process has mapped; None as above


def evict(paths: Union[PathLike, Iterable[PathLike]]) -> EvictResult:
    """Free the page cache of every object below paths (files or directories on a weightfs mount):
    posix_fadvise(DONTNEED) on the object files. Mapped pages stay (resident_bytes_after counts them);
    other names of the same content lose their cached copy too. Raises OSError (PermissionError: the
    store is private to the mounting user; ENOENT; EMEDIUMTYPE: not on a weightfs mount; EREMOTE: the
    mount's store is not visible from this mount namespace, as in a container given the mount only:
    bind-mount the store into it at the same path)."""
    s = _Set(paths)
    try:
        before, after = ctypes.c_uint64(), ctypes.c_uint64()
        rc = s._lib.wfs_cache_drop(s._p, ctypes.byref(before), ctypes.byref(after))
        if rc:
            raise OSError(-rc, "evict: posix_fadvise: " + os.strerror(-rc))
        unknown = (1 << 64) - 1  # WFS_CACHE_UNKNOWN
        return EvictResult(int(s._lib.wfs_cache_set_objects(s._p)),
                           None if before.value == unknown else before.value,
                           None if after.value == unknown else after.value)
    finally:
        s.close()


class Prefetch:
    """A running prefetch: done() polls, progress() gives (bytes read, bytes in all), wait() blocks
    until every object is read and raises OSError for the first read error. Reading runs on C
    threads (the GIL is not held)."""

    def __init__(self, s: _Set, node: int, bind: bool, threads: int) -> None:
        self._set = s
        self.numa_node = node
        self._h = ctypes.c_void_p()
        rc = s._lib.wfs_cache_load_start(s._p, node, 1 if bind else 0, threads, ctypes.byref(self._h))
        if rc:
            s.close()
            what = {22: f"NUMA node {node} does not exist", 38: "NUMA is not available here"}
            raise OSError(-rc, "prefetch: " + what.get(-rc, os.strerror(-rc)))
        self._result: Optional[OSError] = None
        self._waited = False

    def progress(self):
        done, total = ctypes.c_uint64(), ctypes.c_uint64()
        if self._waited:
            return self._final
        self._set._lib.wfs_cache_load_poll(self._h, ctypes.byref(done), ctypes.byref(total))
        return done.value, total.value

    def done(self) -> bool:
        return self._waited or bool(self._set._lib.wfs_cache_load_poll(self._h, None, None))

    def wait(self) -> int:
        """Block until the prefetch ends; returns the bytes read. Raises OSError on a read error."""
        if not self._waited:
            err = ctypes.create_string_buffer(512)
            rc = self._set._lib.wfs_cache_load_wait(self._h, err, len(err))
            self._final = self.progress()
            self._set._lib.wfs_cache_load_free(self._h)
            self._set.close()
            self._waited = True
            if rc:
                self._result = OSError(-rc, "prefetch: object " + err.value.decode("utf-8", "replace"))
        if self._result:
            raise self._result
        return self._final[0]

    def __del__(self) -> None:
        try:
            if not self._waited and self._h:
                self.wait()
        except Exception:
            pass


def prefetch(paths: Union[PathLike, Iterable[PathLike]], numa_node: Optional[int] = None, *,
             device: Optional[int] = None, bind: bool = False, threads: int = 0) -> Prefetch:
    """Start reading every object below paths into the page cache; returns a Prefetch at once.
    numa_node: the node whose memory the pages go to (reader threads run there, memory policy
    preferred, bind=True: that node only); default: the node of CUDA device `device` (its PCI bus id,
    as the staging ring finds it) when given, else unbound. Pages already cached stay where they are
    (evict first to move them). Raises OSError (as evict; EINVAL: no such node; ENODEV: no such
    device)."""
    lib = _lib()
    node = -1 if numa_node is None else int(numa_node)
    if numa_node is None and device is not None:
        node = lib.wfs_cache_numa_node_of_device(int(device))
        if node == -19:
            raise OSError(19, f"prefetch: CUDA device {device}: no such device (or built without CUDA)")
    return Prefetch(_Set(paths), node, bind, threads)
