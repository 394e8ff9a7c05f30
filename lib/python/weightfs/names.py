# SPDX-License-Identifier: Apache-2.0
"""Names and tables the package shares with the C library, read from libweightfs.so when it loads.

    names.dtype_bytes()          # {"BOOL": 1, ..., "C64": 8}: lib/dtype.c's table (wfs_dtype_*)
    names.parse_shape("[4,2]")   # (4, 2): lib/dtype.c's grammar (wfs_shape_parse); ValueError if not
    names.TMP_PREFIX             # ".wfs-tmp-": lib/weightfs.h's WFS_TMP_PREFIX

The xattr names and the temporary-name prefix are lib/weightfs.h's strings, repeated here;
the dtype table and the shape grammar come from the library when it can be loaded ($WEIGHTFS_LIB,
the repository's build/, PREFIX/lib after `make install`: see _libweightfs.py) and otherwise from
the copies below. tests/python/test_names.py checks every copy against the library, entry by entry.
"""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Dict, Optional, Tuple

from . import _libweightfs

__all__ = ["CLAIM_XATTR", "CLAIMS_XATTR", "DIGEST_XATTR", "DTYPE_XATTR", "SHAPE_XATTR", "STATS_XATTR", "TMP_PREFIX",
           "PASSTHROUGH_WRITE_MIN", "FALLBACK_DTYPE_BYTES", "SHAPE_MAX_DIMS", "dtype_bytes", "parse_shape"]

# lib/weightfs.h
CLAIM_XATTR = "user.weightfs.claim"
CLAIMS_XATTR = "user.weightfs.claims"  # on a directory: many claims, each making a new file
DIGEST_XATTR = "user.weightfs.digest"
DTYPE_XATTR = "user.weightfs.dtype"
SHAPE_XATTR = "user.weightfs.shape"
STATS_XATTR = "user.weightfs.stats"
TMP_PREFIX = ".wfs-tmp-"  # WFS_TMP_PREFIX: a tensor file being written, PREFIX<pid>-<n>[-<tag>]
PASSTHROUGH_WRITE_MIN = 4 << 20  # WFS_PASSTHROUGH_WRITE_MIN, bytes: written after a reopen

# lib/dtype.c's table (the whole-byte dtypes, in the reference's order): used without the library.
FALLBACK_DTYPE_BYTES: Dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
    "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8}
SHAPE_MAX_DIMS = 32  # WFS_SHAPE_MAX_DIMS

_lock = threading.Lock()
_loaded = False
_lib: Optional[ctypes.CDLL] = None
_table: Optional[Dict[str, int]] = None


def _library() -> Optional[ctypes.CDLL]:
    """libweightfs with the name/table functions declared, or None when it cannot be loaded."""
    global _loaded, _lib
    with _lock:
        if _loaded:
            return _lib
        _loaded = True
        try:
            U64P, UP = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint)
            lib = _libweightfs.bind({
                "wfs_dtype_count": ([], ctypes.c_uint),
                "wfs_dtype_name": ([ctypes.c_uint], ctypes.c_char_p),
                "wfs_dtype_size_at": ([ctypes.c_uint], ctypes.c_int),
                "wfs_shape_parse": ([ctypes.c_char_p, ctypes.c_size_t, U64P, UP], ctypes.c_int),
                "wfs_tmp_prefix": ([], ctypes.c_char_p),
            })
        except (OSError, AttributeError):  # no library, or one older than these functions
            return None
        _lib = lib
        return lib


def library_dtype_bytes(lib: ctypes.CDLL) -> Dict[str, int]:
    """The dtype table of @lib, entry by entry (wfs_dtype_count/name/size_at)."""
    return {lib.wfs_dtype_name(i).decode(): lib.wfs_dtype_size_at(i) for i in range(lib.wfs_dtype_count())}


def dtype_bytes() -> Dict[str, int]:
    """safetensors dtype name -> bytes per element: the library's table, else FALLBACK_DTYPE_BYTES.
    The dict is shared: do not modify it."""
    global _table
    if _table is None:
        lib = _library()
        _table = library_dtype_bytes(lib) if lib is not None else FALLBACK_DTYPE_BYTES
    return _table


def library_parse_shape(lib: ctypes.CDLL, text: str) -> Tuple[int, ...]:
    """wfs_shape_parse() of @lib on @text; ValueError when it refuses."""
    raw = text.encode("utf-8", "surrogateescape")
    dims = (ctypes.c_uint64 * SHAPE_MAX_DIMS)()
    n = ctypes.c_uint()
    if lib.wfs_shape_parse(raw, len(raw), dims, ctypes.byref(n)) != 0:
        raise ValueError(f"not a shape: {text!r}")
    return tuple(dims[i] for i in range(n.value))


_SPACE = "[ \t\n\r]*"
_SHAPE_RE = re.compile(rf"{_SPACE}\[{_SPACE}(?:[0-9]+{_SPACE}(?:,{_SPACE}[0-9]+{_SPACE})*)?\]{_SPACE}",
                       re.ASCII)


def fallback_parse_shape(text: str) -> Tuple[int, ...]:
    """lib/dtype.c's shape grammar in Python: a JSON array of at most SHAPE_MAX_DIMS integers in
    [0, 2^64), digits only, whitespace (space, tab, CR, LF) between tokens. ValueError if not."""
    if not _SHAPE_RE.fullmatch(text):
        raise ValueError(f"not a shape: {text!r}")
    dims = tuple(int(d) for d in re.findall(r"[0-9]+", text, re.ASCII))
    if len(dims) > SHAPE_MAX_DIMS or any(d >= 1 << 64 for d in dims):
        raise ValueError(f"not a shape: {text!r}")
    return dims


def parse_shape(text: str) -> Tuple[int, ...]:
    """The dimensions of shape @text ("[4096,1024]" -> (4096, 1024); "[]" -> ()) by the grammar the
    daemon checks user.weightfs.shape with. Raises ValueError when @text is not a shape."""
    lib = _library()
    return library_parse_shape(lib, text) if lib is not None else fallback_parse_shape(text)
