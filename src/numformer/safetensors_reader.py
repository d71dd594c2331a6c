"""A strict reader of safetensors files: every check before any tensor is read.

A safetensors file is

    [8 bytes: N, little-endian u64] [N bytes: JSON header] [data: the tensors' bytes]

with the header ``{name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}``,
offsets counted from the start of the data. ``read_safetensors_file`` accepts a file only when

    8 <= 8 + N <= file size, the header is one JSON object with no repeated names,
    every dtype is one NumPy holds and every shape a list of non-negative integers,
    end - begin = prod(shape) · itemsize(dtype) for every tensor,
    the tensors sorted by begin tile the data exactly: the first begins at 0, each begins where the
    previous ends (no gap, no overlap, no two tensors on the same bytes), the last ends at the file's end
    (no trailing bytes).

Anything else raises one ValueError naming the file and what is wrong: a dtype safetensors defines but NumPy
lacks (``UNREAD_DTYPES``: FP8, FP6, FP4, complex) as not supported, naming it; others as damage. bfloat16
(NumPy has none) is read as float32 exactly (a bfloat16 is the upper half of a float32); every other dtype is kept.

Sharded checkpoints (``model.safetensors.index.json``): ``shard_files`` returns the index's ``weight_map``
and the shards it names, each a plain file name inside the folder (no absolute path, no ``..``).
"""
from __future__ import annotations

import json
import math
import zlib
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np

from ._limits import bounded_json, check_bounds

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16,
          "U8": np.uint8, "BOOL": np.bool_}
# safetensors dtypes numformer does not read (NumPy has no such types): named as unsupported, not as damage
UNREAD_DTYPES = {"F8_E4M3": "an 8-bit float", "F8_E4M3FNUZ": "an 8-bit float", "F8_E5M2": "an 8-bit float",
                 "F8_E5M2FNUZ": "an 8-bit float", "F8_E8M0": "an 8-bit float", "F6_E2M3": "a 6-bit float",
                 "F6_E3M2": "a 6-bit float", "F4": "a 4-bit float", "C64": "a complex number"}
MAX_HEADER_BYTES = 100 * 1024 * 1024          # the safetensors library's own limit
CHUNK_BYTES = 16 * 1024 * 1024                # StoredTensor.read_into reads a tensor this many bytes at a time


def _bad(path, what):
    return ValueError(f"{path} is damaged: {what}; download it again")


def _unsupported(path, name, dtype):
    return ValueError(f"{path}: tensor {name!r} has dtype {dtype!r} ({UNREAD_DTYPES[dtype]}), which numformer does "
                      f"not support: it reads F32, F64, F16 and BF16 weights; use the model's release in one of "
                      f"those, or convert the file (transformers: from_pretrained(folder, "
                      f"dtype=torch.bfloat16).save_pretrained(new_folder))")


def _unique_object(pairs):
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise KeyError(f"the header names {repeated} more than once")
    return dict(pairs)


def read_header(path):
    """(header without __metadata__, data start in bytes, data length) of ``path``, every check of the module
    docstring applied. Entries: {name: (dtype string, shape tuple, begin, end)}."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(path, f"{size} bytes, shorter than the 8-byte header length")
        n = int.from_bytes(head, "little")
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise _bad(path, f"the header length {n} exceeds the {size - 8} bytes after it")
        raw = f.read(n)
    try:
        check_bounds(raw.decode("utf-8"), f"{path}'s header", hint="download it again")
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_object)
    except KeyError as e:
        raise _bad(path, e.args[0]) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"the header is not JSON ({e})") from None
    except ValueError as e:                  # nested deeper than numformer reads
        raise _bad(path, str(e)) from None
    if not isinstance(header, dict):
        raise _bad(path, "the header is not a JSON object")
    header.pop("__metadata__", None)
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise _bad(path, f"tensor {name!r} is not described by exactly dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if isinstance(dtype, str) and dtype in UNREAD_DTYPES:
            raise _unsupported(path, name, dtype)
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise _bad(path, f"tensor {name!r} has dtype {dtype!r}; numformer reads {sorted(DTYPES)}")
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise _bad(path, f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise _bad(path, f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end")
        need = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
        if offsets[1] - offsets[0] != need:
            raise _bad(path, f"tensor {name!r} ({dtype}, shape {shape}) needs {need} bytes but data_offsets "
                             f"{offsets} hold {offsets[1] - offsets[0]}")
        entries[name] = (dtype, tuple(shape), offsets[0], offsets[1])
    data_len = size - 8 - n
    at, previous = 0, None
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda e: (e[1][2], e[1][3])):
        if begin < at:
            raise _bad(path, f"tensor {name!r} (bytes {begin}..{end}) overlaps tensor {previous!r} (ends at {at})")
        if begin > at:
            raise _bad(path, f"a gap of {begin - at} bytes before tensor {name!r} (bytes {begin}..{end})")
        at, previous = end, name
    if at > data_len:
        raise _bad(path, f"tensor {previous!r} ends at byte {at} but the file holds {data_len} bytes of data")
    if at < data_len:
        raise _bad(path, f"{data_len - at} trailing bytes after the last tensor")
    return entries, 8 + n, data_len


def _decoded(raw, dtype, shape):
    """The array of a tensor's little-endian bytes ``raw`` (a uint8 buffer) in native byte order, a copy;
    bfloat16 widened to float32 exactly."""
    a = np.frombuffer(raw, dtype=np.dtype(DTYPES[dtype]).newbyteorder("<")).reshape(shape)
    if dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return np.array(a, dtype=a.dtype.newbyteorder("="))


def read_safetensors_file(path, select=None):
    """{name: array} of one safetensors file, checked by ``read_header`` before any tensor is read;
    ``select(name)`` -> bool reads only some tensors."""
    entries, start, data_len = read_header(path)
    if select is not None:
        entries = {k: v for k, v in entries.items() if select(k)}
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=(data_len,)) if data_len else \
        np.zeros(0, np.uint8)
    out = {name: _decoded(data[begin:end], dtype, shape) for name, (dtype, shape, begin, end) in entries.items()}
    del data
    return out


class StoredTensor:
    """One tensor of a checked safetensors file (``stored_tensors``): its ``shape`` and ``dtype`` (as read:
    bfloat16 as float32) from the header, its data read from the file only when it is used as an array
    (``np.asarray``), each time: a whole checkpoint can be copied into a model one tensor at a time."""

    def __init__(self, path, dtype, shape, offset, nbytes):
        self.path, self.stored_dtype, self.shape, self.offset, self.nbytes = path, dtype, shape, offset, nbytes

    @property
    def dtype(self):
        return np.dtype(np.float32 if self.stored_dtype == "BF16" else DTYPES[self.stored_dtype])

    @property
    def ndim(self):
        return len(self.shape)

    def read(self):
        """The tensor's array, read from the file now."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            raw = f.read(self.nbytes)
        if len(raw) != self.nbytes:
            raise _bad(self.path, "it ended while a tensor was read (was it changed while numformer read it?)")
        return _decoded(raw, self.stored_dtype, self.shape)

    def read_into(self, out, crc=0):
        """Write the tensor into ``out`` (a C-contiguous array of its shape, of any dtype: the values are cast),
        ``CHUNK_BYTES`` of the file at a time, so no whole copy of it is ever made; returns the CRC-32 of its
        bytes, continued from ``crc`` (as ``zlib.crc32``)."""
        if tuple(out.shape) != tuple(self.shape) or not out.flags.c_contiguous:
            raise ValueError(f"read_into needs a C-contiguous array of shape {self.shape}, got {out.shape}")
        flat, at = out.reshape(-1), 0
        for raw in self._chunks():
            values = _decoded(raw, self.stored_dtype, (-1,))
            flat[at:at + values.size] = values
            at += values.size
            crc = zlib.crc32(raw, crc)
        return crc

    def crc32(self, crc=0):
        """The CRC-32 of the tensor's bytes, continued from ``crc``, read ``CHUNK_BYTES`` at a time."""
        for raw in self._chunks():
            crc = zlib.crc32(raw, crc)
        return crc

    def _chunks(self):
        """The tensor's bytes in pieces of at most ``CHUNK_BYTES``, each a whole number of its items."""
        itemsize = np.dtype(DTYPES[self.stored_dtype]).itemsize
        step = max(1, CHUNK_BYTES // itemsize) * itemsize
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            for begin in range(0, self.nbytes, step):
                raw = f.read(min(step, self.nbytes - begin))
                if len(raw) != min(step, self.nbytes - begin):
                    raise _bad(self.path, "it ended while a tensor was read (was it changed while numformer read "
                                          "it?)")
                yield raw

    def __array__(self, dtype=None, copy=None):
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self):
        return f"StoredTensor({str(self.path)!r}, {self.stored_dtype}, shape={self.shape})"


def stored_tensors(path):
    """{name: StoredTensor} of one safetensors file, checked by ``read_header`` (no tensor read yet)."""
    entries, start, _ = read_header(path)
    return {name: StoredTensor(Path(path), dtype, shape, start + begin, end - begin)
            for name, (dtype, shape, begin, end) in entries.items()}


def shard_files(folder, index_path):
    """(weight_map {tensor name: shard file name}, [shard paths, sorted]) of a ``model.safetensors.index.json``;
    each shard must be a plain relative name inside ``folder`` (one ValueError naming the index and the
    offending name otherwise)."""
    folder, index_path = Path(folder), Path(index_path)
    index = bounded_json(index_path.read_bytes(), str(index_path))
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_path} has no weight_map {{tensor name: shard file}}; download it again")
    for name in sorted(set(weight_map.values())):
        parts = PurePosixPath(name).parts
        if (not name or PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()
                or PureWindowsPath(name).drive or ".." in parts or "\\" in name):
            raise ValueError(f"{index_path} names the shard {name!r}, outside the folder {folder}; a shard must be "
                             f"a file inside the model folder")
    return weight_map, [folder / name for name in sorted(set(weight_map.values()))]
