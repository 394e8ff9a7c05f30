"""weightfs: Python helpers around libweightfs (ctypes, no build step beyond the C library)."""

from .stage import Stager, backload, offload_tensor

__all__ = ["Stager", "backload", "offload_tensor"]
