# SPDX-License-Identifier: Apache-2.0
"""dtype names: torch and numpy dtypes to and from safetensors names, and the shape's spelling.

    weightfs.dtype_name(torch.bfloat16)   # 'BF16'
    shape_text((4096, 1024))              # '[4096,1024]', as user.weightfs.shape holds it

The safetensors names and their sizes are lib/dtype.c's table (names.dtype_bytes()).
"""

import operator
from typing import Any, Dict, Optional, Sequence

from .names import dtype_bytes as _dtype_bytes

__all__ = ["dtype_name", "shape_text"]

# safetensors name -> torch dtype attribute name (the ones this torch lacks are skipped at lookup).
_TORCH_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
                "F8_E4M3": "float8_e4m3fn", "I16": "int16", "U16": "uint16", "F16": "float16",
                "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
                "U64": "uint64", "F64": "float64", "F8_E8M0": "float8_e8m0fnu", "C64": "complex64"}
# safetensors name -> numpy dtype name (numpy has no bfloat16 or float8).
_NUMPY_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
                "F16": "float16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
                "U64": "uint64", "F64": "float64", "C64": "complex64"}


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
