# SPDX-License-Identifier: Apache-2.0
"""The bytes behind tensors, arrays and buffers, by address, without copies where there can be none.

Host memory (a CPU tensor, a numpy array, any C-contiguous buffer) is reached in place through its
address; a CUDA tensor's bytes are copied to the host in chunks through one bounded buffer per device
(_GPU_CHUNK bytes, pinned when CUDA allows). Nothing here keeps a reference to a caller's object after
returning, except _HostBytes until it is closed. torch and numpy are imported only when such an
object is handled.
"""

import ctypes
import sys
import threading
from typing import Any, Dict, Tuple

_GPU_CHUNK = 64 << 20  # bytes of host buffer used to hash a CUDA tensor (one per device, reused)


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer; obj is a borrowed-then-released reference, kept opaque.
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_PyBUF_C_CONTIGUOUS = 0x0020 | 0x0010 | 0x0008  # PyBUF_C_CONTIGUOUS: any C-contiguous exporter


class _HostBytes:
    """The bytes of a C-contiguous host buffer, by address, held (not copied) until close()."""

    def __init__(self, obj):
        self._view = _PyBuffer()
        try:
            _get_buffer(obj, ctypes.byref(self._view), _PyBUF_C_CONTIGUOUS)
        except BufferError as e:
            raise ValueError(f"not a C-contiguous buffer ({e}); pass a contiguous copy") from None
        self.address, self.nbytes = self._view.buf, self._view.len

    def close(self):
        if self._view is not None:
            _release_buffer(ctypes.byref(self._view))
            self._view = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _is_torch_tensor(x):
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported: never import it
    return torch is not None and isinstance(x, torch.Tensor)


def _tensor_values(t):
    """t (CPU or CUDA) as a detached contiguous tensor whose storage holds the values it reads as.

    torch keeps a conjugate or negative view (x.conj() of a complex tensor, x._neg_view()) as a bit
    on the tensor over the unchanged storage: that storage is resolved into a copy, or its bytes
    would be the values before the conjugation or negation. A non-contiguous tensor is copied once
    (.contiguous()). Raises TypeError for a quantized tensor: its bytes are integers whose scale and
    zero point a tensor file has no place for."""
    t = t.detach()
    if t.is_quantized:
        raise TypeError(f"a quantized tensor ({t.dtype}) is its integers and a scale and zero point that "
                        "a tensor file cannot hold: offload t.dequantize(), or t.int_repr() and the "
                        "quantization parameters apart")
    if getattr(t, "is_conj", None) and t.is_conj():
        t = t.resolve_conj()
    if getattr(t, "is_neg", None) and t.is_neg():
        t = t.resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def _torch_host(t):
    """(tensor, address, nbytes) for a CPU tensor: _tensor_values(t) and its bytes; the tensor
    keeps the memory."""
    t = _tensor_values(t)
    return t, (t.data_ptr() if t.numel() else 0), t.numel() * t.element_size()


def _address_view(address, nbytes):
    """A writable-or-not memoryview of nbytes at address ('B' format), no copy; the owner must live."""
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * nbytes).from_address(address)).cast("B")


def _contiguous_array(data):
    """numpy arrays that are not C-contiguous, or not in native byte order (dtype '>i4' on this
    little-endian machine), -> a contiguous native-order copy; anything else as given. A tensor
    file's bytes are native (little-endian) values, as its dtype attribute (I32) says.

    Raises TypeError for a numpy array whose dtype holds Python objects (dtype=object, or a structured
    dtype with such a field): its bytes are the objects' addresses in this process, not data."""
    if type(data).__module__.startswith("numpy") and hasattr(data, "flags"):
        dtype = getattr(data, "dtype", None)
        if getattr(dtype, "hasobject", False):
            raise TypeError(f"numpy array of dtype {data.dtype} holds Python objects, whose bytes are "
                            "their addresses in this process, not tensor data")
        if dtype is not None and not dtype.isnative:
            import numpy

            return numpy.ascontiguousarray(data.astype(dtype.newbyteorder("=")))
        if not data.flags["C_CONTIGUOUS"]:
            import numpy

            return numpy.ascontiguousarray(data)
    return data


# ---- CUDA tensors: copied to the host through a bounded buffer -----------------------------------

_gpu_buffers: Dict[Any, Tuple[Any, threading.Lock]] = {}
_gpu_lock = threading.Lock()


def _gpu_buffer(torch, device):
    """A (pinned when possible) host buffer of _GPU_CHUNK bytes for device, with its lock."""
    with _gpu_lock:
        if device not in _gpu_buffers:
            try:
                buf = torch.empty(_GPU_CHUNK, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:
                buf = torch.empty(_GPU_CHUNK, dtype=torch.uint8)
            _gpu_buffers[device] = (buf, threading.Lock())
        return _gpu_buffers[device]


def _gpu_chunks(t):
    """Yield (address, nbytes) of successive host copies of a contiguous CUDA tensor's bytes; each
    chunk is valid until the next one is requested. Host memory: one _GPU_CHUNK buffer per device."""
    import torch

    flat = t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)
    buf, lock = _gpu_buffer(torch, t.device.index if t.device.index is not None else
                            torch.cuda.current_device())
    with lock:
        for off in range(0, flat.numel(), _GPU_CHUNK):
            n = min(_GPU_CHUNK, flat.numel() - off)
            buf[:n].copy_(flat[off:off + n])  # synchronous D2H into the host buffer
            yield buf.data_ptr(), n
