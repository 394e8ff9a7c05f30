# SPDX-License-Identifier: Apache-2.0
"""load(): a sealed tensor file mapped as a CPU tensor or numpy array; tensor_info(): its dtype and shape.

    t = weightfs.load(path)               # CPU tensor mapped from the file: dtype/shape from its xattrs

load() returns a tensor (or numpy.memmap) that owns its own private read-only mapping of the file.
"""

import errno
import os
import stat
import sys
from typing import Any, Optional, Sequence, Tuple

from . import direct as _direct
from ._types import PathLike
from .dtypes import _NUMPY_NAMES, _torch_dtype, dtype_name, shape_text
from .errors import WeightfsError, _reraise
from .names import DTYPE_XATTR, SHAPE_XATTR
from .names import dtype_bytes as _dtype_bytes
from .names import parse_shape as _parse_shape

__all__ = ["load", "tensor_info"]


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


def _foreign_byte_order(dtype):
    """Is dtype a numpy dtype (or spelling, '>f4') whose byte order is not this machine's?"""
    if type(dtype).__module__ == "torch" or (isinstance(dtype, str) and dtype.upper() in _dtype_bytes()):
        return False
    try:
        import numpy
        return not numpy.dtype(dtype).isnative
    except (ImportError, TypeError):
        return False


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
    size is not elements x element size ("...: size mismatch: ..."); TypeError for a shape given as
    a string; ValueError for a dtype torch or numpy cannot represent (BF16 with numpy=True) and for
    a numpy dtype of the other byte order ('>f4' here: files hold native bytes); ImportError when torch (or numpy) is missing."""
    path = os.fspath(path)
    if isinstance(shape, (str, bytes)):  # "1024" would be the shape [1, 0, 2, 4]
        raise TypeError(f"load: shape must be a sequence of ints, not {type(shape).__name__} {shape!r}")
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
    if dtype is not None and _foreign_byte_order(dtype):
        raise ValueError(f"load: {dtype!r} is not in this machine's byte order: tensor files hold "
                         f"{sys.byteorder}-endian {name} (offload converts); load {name} and "
                         f"byteswap() if another order is wanted")
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
