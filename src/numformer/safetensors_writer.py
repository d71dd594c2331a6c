"""Writing a safetensors file a piece at a time: the header, then each tensor's bytes straight from its array,
so the file is never whole in memory. (``safetensors.numpy.save`` builds the whole file as one bytes object:
saving a model of N bytes peaked at about 3N.)

The layout is the format's (``numformer.safetensors_reader`` reads and checks it):

    [8 bytes: N, little-endian u64] [N bytes: JSON header, padded with spaces to a multiple of 8] [data]

with the tensors' little-endian bytes in the order of their names, each right after the previous, and the
header ``{"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}}``.
"""
from __future__ import annotations

import json

import numpy as np

__all__ = ["safetensors_pieces", "DTYPE_NAMES"]

# NumPy dtype (native byte order) -> the format's name (bfloat16 has no NumPy dtype: numformer never writes it)
DTYPE_NAMES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
               np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
               np.dtype(np.int8): "I8", np.dtype(np.uint64): "U64", np.dtype(np.uint32): "U32",
               np.dtype(np.uint16): "U16", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}


def safetensors_pieces(tensors, metadata=None):
    """The bytes of a safetensors file of ``tensors`` ({name: array}) and ``metadata`` ({str: str}) as pieces
    to write one after another (``run_files.write_atomic`` takes them): the header, then each tensor's data
    as a view of its array (a copy only of an array that is not C-contiguous or not little-endian)."""
    arrays = {}
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        a = a if a.flags.c_contiguous else np.ascontiguousarray(a)         # (ascontiguousarray makes 0-d 1-d)
        kind = DTYPE_NAMES.get(a.dtype.newbyteorder("="))
        if kind is None:
            raise ValueError(f"tensor {name!r} has dtype {a.dtype}, which safetensors cannot hold; convert it to one "
                             f"of {sorted({str(d) for d in DTYPE_NAMES})}")
        arrays[name] = a.astype(a.dtype.newbyteorder("<"), copy=False)
    header, at = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in arrays.items():
        header[name] = {"dtype": DTYPE_NAMES[a.dtype.newbyteorder("=")], "shape": list(a.shape),
                        "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)                              # the data starts on an 8-byte boundary
    yield len(raw).to_bytes(8, "little") + raw
    for a in arrays.values():
        if a.nbytes:
            yield memoryview(a.reshape(-1).view(np.uint8))
