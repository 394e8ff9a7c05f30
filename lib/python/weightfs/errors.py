# SPDX-License-Identifier: Apache-2.0
"""Errors and warnings of the package.

Errors: OSError and its subclasses (errno, a message naming the file, .filename) for everything the
filesystem or libweightfs reports; WeightfsError (an OSError) for conditions this package detects
(size mismatch EMSGSIZE, missing metadata ENODATA, a claim that sealed other bytes EIO); TypeError /
ValueError for arguments that cannot be offloaded. Conditions that have a fallback (claims not
supported by the filesystem, tensor xattrs not supported, a dtype without a safetensors name) emit one
WeightfsWarning per class per process, never one per tensor (_warn_once).
"""

import errno
import os
import sys
import threading
import warnings
from typing import Set

__all__ = ["WeightfsError", "WeightfsWarning"]


class WeightfsError(OSError):
    """An error this package detects itself: errno, a one-line message, and .filename (the path)."""


class WeightfsWarning(UserWarning):
    """A fallback was taken (claims unsupported, xattrs unsupported, ...); emitted once per class."""


# ---- warnings: one per failure class -----------------------------------------------------------

_warned: Set[str] = set()
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
