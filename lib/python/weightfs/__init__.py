# SPDX-License-Identifier: Apache-2.0
"""weightfs: Python helpers around libweightfs (ctypes, no build step beyond the C library).

    import weightfs
    weightfs.digest(buf)                        # XXH3-128 hex, = xxhsum -H2 = user.weightfs.digest
    r = weightfs.offload(tensor, path)          # claim by digest, write on a miss; r.claimed
    made = weightfs.claim_files(dir, entries)   # many new files by digest, hundreds per request
    t = weightfs.load(path)                     # mmapped CPU tensor (dtype/shape from xattrs)
    weightfs.backload(path, cuda_tensor)        # file -> GPU through the pinned staging ring
    fd = weightfs.open_object(path)             # read-only fd of the object behind the name
    fo = weightfs.FrozenOffload(root, rank)     # a rank's frozen parameters, manifest, restart skip
    weightfs.evict(paths); h = weightfs.prefetch(paths, numa_node=0); h.wait()   # host page cache

Importing needs neither torch, numpy, CUDA nor libweightfs.so: each is loaded on first use.
"""

import os as _os

from .direct import open_object
from .cache import EvictResult, Prefetch, evict, prefetch, residency
from .frozen import FrozenOffload, OffloadSummary
from .stage import Stager, backload, offload_tensor
from .claims import claim_files
from .digests import digest, digest_file
from .dtypes import dtype_name
from .errors import WeightfsError, WeightfsWarning
from .loading import load, tensor_info
from .offloading import OffloadResult, offload, remove_stale_tmp


def _read_version() -> str:
    # VERSION is the repository's (a link to it in the tree, a copy when installed): the C build reads
    # the same file, so weightfs --version, weightfsctl --version and this agree.
    with open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "VERSION"), encoding="ascii") as f:
        return f.read().strip()


__version__ = _read_version()

__all__ = ["EvictResult", "Prefetch", "evict", "prefetch", "residency", "FrozenOffload", "OffloadResult", "OffloadSummary", "Stager", "WeightfsError",
           "WeightfsWarning", "backload", "claim_files", "digest", "digest_file", "dtype_name", "load", "offload",
           "offload_tensor", "open_object", "remove_stale_tmp", "tensor_info"]
