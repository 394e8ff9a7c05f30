# SPDX-License-Identifier: Apache-2.0
"""Claims: new sealed files made by digest, without their bytes moving.

A *claim* sets user.weightfs.claim = a digest (32 hex digits) on a new empty file, and weightfs seals
the file with the stored object of that digest without any bytes being written (ENODATA: no such
object). claim_files() makes many files of one directory at once (user.weightfs.claims). What a
filesystem answered is remembered per device: one that only stores the attribute, or refuses it,
gets the bytes written from then on, with one warning.
"""

import errno
import os
import re
import threading
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ._types import PathLike
from .dtypes import shape_text
from .errors import WeightfsError, _reraise, _warn_once
from .mountinfo import fs_type
from .names import CLAIM_XATTR, CLAIMS_XATTR, DIGEST_XATTR
from .names import dtype_bytes as _dtype_bytes

__all__ = ["claim_files"]


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
    user.weightfs.claims on the directory (lines of four fields separated by one tab each, not
    spaces: DIGEST, DTYPE, SHAPE, NAME; at most 256
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


_dir_devs: Dict[str, int] = {}  # directory -> st_dev of the files created in it: no GETATTR of each new file


def _dev_of(d, fd):
    """st_dev of the new file fd in directory d (the same filesystem: it was created there). Kept per
    directory: a fstat of a file being written is a round trip to weightfs each time. A stale entry
    after a remount only picks another device's claim state; the claim is verified either way."""
    dev = _dir_devs.get(d)
    if dev is None:
        dev = _dir_devs[d] = os.fstat(fd).st_dev
    return dev
