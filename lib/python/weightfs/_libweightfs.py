# SPDX-License-Identifier: Apache-2.0
"""libweightfs through ctypes: the one place the package finds, loads and declares the C library.

load() finds libweightfs.so, in order: $WEIGHTFS_LIB (a path); the build/ directory of the repository
this package sits in (lib/python/weightfs); PREFIX/lib for a package installed under PREFIX
(PREFIX/lib/pythonX.Y/site-packages/weightfs, where `make install PREFIX=...` puts the library);
sys.prefix/lib, /usr/local/lib and /usr/lib (found before ldconfig has run); then the dynamic
loader's own search. It loads it once per process and raises OSError naming every place it tried.

bind(sigs) declares functions of it, {name: ([argtypes], restype)}, each once (a module binds the
functions it calls, where it calls them), and returns the library. AttributeError means the library
found is older than a function asked for.
"""

import ctypes
import os
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

__all__ = ["load", "bind"]

Signatures = Dict[str, Tuple[List[Any], Any]]

_lib: Optional[ctypes.CDLL] = None
_bound: Set[str] = set()
_lock = threading.Lock()


def _candidates() -> Iterator[str]:
    env = os.environ.get("WEIGHTFS_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
    yield os.path.join(repo, "build", "libweightfs.so")
    seen = set()
    d = here
    while os.path.dirname(d) != d:
        d = os.path.dirname(d)
        if os.path.basename(d) == "lib":
            cand = os.path.join(d, "libweightfs.so")
            seen.add(cand)
            yield cand
    for prefix in (sys.prefix, "/usr/local", "/usr"):
        cand = os.path.join(prefix, "lib", "libweightfs.so")
        if cand not in seen:
            seen.add(cand)
            yield cand
    yield "libweightfs.so"


def _load_locked() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    errors = []
    for cand in _candidates():
        if os.sep in cand and not os.path.exists(cand):
            errors.append(f"{cand}: not found")
            continue
        try:
            _lib = ctypes.CDLL(cand)
            return _lib
        except OSError as e:
            errors.append(str(e))
    raise OSError("cannot load libweightfs.so (set WEIGHTFS_LIB): " + "; ".join(errors))


def load() -> ctypes.CDLL:
    """The loaded libweightfs (ctypes.CDLL), loading it on first use. Raises OSError."""
    with _lock:
        return _load_locked()


def bind(sigs: Signatures) -> ctypes.CDLL:
    """libweightfs with the functions of sigs declared ({name: ([argtypes], restype)}). Raises
    OSError (no library) or AttributeError (a library without one of the functions)."""
    with _lock:
        lib = _load_locked()
        for name, (args, res) in sigs.items():
            if name in _bound:
                continue
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = res
            _bound.add(name)
        return lib
