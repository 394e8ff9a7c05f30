# SPDX-License-Identifier: Apache-2.0
"""weightfs.tensor: the names this module defined before it was split by concept, re-exported so that
`weightfs.tensor.X` keeps working. Each is defined in the module named after its concept:

    errors.py      WeightfsError, WeightfsWarning (and the one-warning-per-class rule)
    digests.py     digest, digest_file (XXH3-128 through libweightfs)
    dtypes.py      dtype_name, shape_text (torch/numpy dtypes <-> safetensors names)
    claims.py      claim_files (and single claims, per device)
    offloading.py  offload, OffloadResult, remove_stale_tmp (the offload protocol)
    mountinfo.py   fs_type (/proc/self/mountinfo)
    loading.py     load, tensor_info (mmap a sealed tensor file)

New code imports from `weightfs` (the same names) or from those modules.
"""

from ._types import PathLike
from .claims import claim_files
from .digests import digest, digest_file
from .dtypes import dtype_name, shape_text
from .errors import WeightfsError, WeightfsWarning
from .loading import load, tensor_info
from .mountinfo import fs_type
from .names import CLAIM_XATTR, CLAIMS_XATTR, DIGEST_XATTR, DTYPE_XATTR, PASSTHROUGH_WRITE_MIN, SHAPE_XATTR, TMP_PREFIX
from .names import FALLBACK_DTYPE_BYTES as DTYPE_BYTES
from .offloading import SEAL_WAIT_SECONDS, STALE_TMP_SECONDS, OffloadResult, offload, remove_stale_tmp

__all__ = [
    "CLAIM_XATTR", "CLAIMS_XATTR", "DIGEST_XATTR", "DTYPE_BYTES", "DTYPE_XATTR", "PASSTHROUGH_WRITE_MIN",
    "SEAL_WAIT_SECONDS", "SHAPE_XATTR", "STALE_TMP_SECONDS", "TMP_PREFIX", "OffloadResult", "PathLike",
    "WeightfsError", "WeightfsWarning", "claim_files", "digest", "digest_file", "dtype_name", "fs_type",
    "load", "offload", "remove_stale_tmp", "shape_text", "tensor_info",
]
