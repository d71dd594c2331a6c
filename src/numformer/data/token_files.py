"""Token files: a tokenized corpus kept on disk, as nanoGPT's train.bin and val.bin.

A token file is the ids of a split, one after the other, as little-endian ``uint16`` (vocabularies of up to
65,536 tokens) or ``uint32``, with nothing else in it: ``np.fromfile("train.bin", np.uint16)`` reads it, as
does nanoGPT. ``TokenFile`` reads it through a memory map made anew for every read (nanoGPT's advice, against
the pages of one long-lived map piling up in memory), so training on a corpus larger than memory reads only
the windows of each batch and the memory a run uses stays bounded.

A folder of token files (``train.bin``, ``val.bin``, ``tokenizer.json`` and ``meta.json``: the dtype and the
number of tokens of each split, and what they were made from) is what ``[data] tokens_dir`` names; numformer
writes such folders in its cache (``token_cache``), one per corpus, split and tokenizer.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .._limits import read_json_file
from .fetch import cache_dir
from .fingerprint import note

SPLIT_FILES = {"train": "train.bin", "val": "val.bin"}
WRITE_BATCH = 1 << 20          # ids gathered in memory before they are appended to the file


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65,536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


class TokenFile:
    """The ids of a token file, indexed like a 1-D array: ``f[i]``, ``f[a:b]``, ``f[index_array]`` return int64
    arrays read from the file, which is memory-mapped only for that read."""

    ndim = 1

    def __init__(self, path, dtype):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        note(self.path)                 # read window by window later: a run's data all the same (fingerprint)
        size = self.path.stat().st_size
        if size % self.dtype.itemsize:
            raise ValueError(f"{self.path} holds {size} bytes, not a whole number of {self.dtype.name} ids; "
                             f"the file is damaged or its dtype is not {self.dtype.name}")
        self.n = size // self.dtype.itemsize

    def __len__(self):
        return self.n

    @property
    def shape(self):
        return (self.n,)

    def __getitem__(self, index):
        if self.n == 0:
            return np.zeros(0, dtype=np.int64)[index]
        data = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n,))
        try:
            return np.array(data[index], dtype=np.int64)
        finally:
            del data                   # the map is closed with its last reference: nothing of the file stays

    def __array__(self, dtype=None, copy=None):
        return self[:] if dtype is None else self[:].astype(dtype)


def write_token_file(path, id_lists, dtype) -> int:
    """Write the ids of ``id_lists`` (an iterable of lists or arrays of ids) to ``path``, batch by batch, atomically
    (a temporary file renamed at the end); returns the number of ids."""
    path = Path(path)
    dtype = np.dtype(dtype)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    n, pending = 0, []
    try:
        with open(tmp, "wb") as f:
            for ids in id_lists:
                if isinstance(ids, np.ndarray):       # an array goes to the file as it is
                    n += _append(f, pending, dtype) + _append(f, ids, dtype)
                    pending = []
                    continue
                pending.extend(ids)
                if len(pending) >= WRITE_BATCH:
                    n += _append(f, pending, dtype)
                    pending = []
            n += _append(f, pending, dtype)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


def _append(f, ids, dtype):
    a = np.asarray(ids, dtype=np.int64)
    if a.size and (a.min() < 0 or a.max() > np.iinfo(dtype).max):
        raise ValueError(f"an id ({a.max()}) does not fit a {dtype.name} token file")
    f.write(a.astype(dtype).tobytes())
    return a.size


# -- folders of token files ------------------------------------------------------------------------------------
def read_tokens_dir(folder) -> tuple[dict, dict]:
    """({"train": TokenFile, "val": TokenFile}, the tokenizer.json document) of a tokens folder.

    The dtype is meta.json's, else uint16 or uint32 from the tokenizer's vocabulary size (as nanoGPT's
    prepare.py writes GPT-2's ids as uint16)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"[data] tokens_dir = {str(folder)!r} is not a folder; it holds train.bin, val.bin and "
                         f"tokenizer.json")
    missing = [n for n in (*SPLIT_FILES.values(), "tokenizer.json") if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"[data] tokens_dir {folder} has no {', '.join(missing)}; it needs train.bin and val.bin "
                         f"(the ids, uint16 or uint32) and the tokenizer.json that made them")
    meta = _read_json(folder / "meta.json") if (folder / "meta.json").is_file() else {}
    document = _read_json(folder / "tokenizer.json")
    if not isinstance(document, dict):
        raise ValueError(f"{folder / 'tokenizer.json'} holds a JSON {type(document).__name__}, not a tokenizer "
                         f"(an object); restore it")
    dtype = _meta_dtype(folder, meta)
    if dtype is None:
        dtype = _dtype_of(document)
        for name in SPLIT_FILES.values():
            _check_not_wider(folder / name, dtype)
    files = {split: TokenFile(folder / name, dtype) for split, name in SPLIT_FILES.items()}
    counts = meta.get("tokens") if isinstance(meta, dict) else None
    for split, f in files.items():
        n = counts.get(split) if isinstance(counts, dict) else None
        if n is not None and n != len(f):
            raise ValueError(f"{f.path} holds {len(f):,} {f.dtype.name} ids but {folder / 'meta.json'} says "
                             f"{n!r}: the file is damaged or was written with another dtype; write the folder "
                             f"again")
    return files, document


def _meta_dtype(folder, meta):
    """meta.json's dtype ("uint16" or "uint32"), None when it gives none; a ValueError naming the file otherwise."""
    dtype = meta.get("dtype") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or dtype not in (None, "uint16", "uint32"):
        given = f"dtype {dtype!r}" if isinstance(meta, dict) else f"a JSON {type(meta).__name__}"
        raise ValueError(f"{folder / 'meta.json'} must be an object whose \"dtype\" is \"uint16\" or \"uint32\" "
                         f"(the type of the ids in the token files), not {given}; restore it, or delete it to take "
                         f"the dtype from the vocabulary's size")
    return None if dtype is None else np.dtype(dtype).newbyteorder("<")


def _check_not_wider(path, dtype, sample=1 << 16):
    """One ValueError naming ``path`` when it is read as uint16 ids (no meta.json, a vocabulary of up to 65,536
    tokens) but holds uint32 ids: its size is a whole number of uint32, and every second uint16 of its start (the
    high halves of little-endian uint32 ids under 65,536) is 0 while the others are not all 0. Read as uint16,
    every other token would be id 0."""
    if dtype != np.dtype("<u2"):
        return
    size = path.stat().st_size
    if size % 4 or size < 64:               # fewer than 16 ids: too few to tell
        return
    with open(path, "rb") as f:
        head = np.frombuffer(f.read(min(size, sample * 4)), dtype="<u2")
    if not head[1::2].any() and head[0::2].any():
        raise ValueError(f"{path} holds uint32 ids (every second uint16 of it is 0), but without a meta.json "
                         f"saying so its tokenizer's vocabulary means uint16; write {path.parent / 'meta.json'} "
                         f"with {{\"dtype\": \"uint32\"}}, or write the ids as uint16")


def _dtype_of(document):
    """The dtype of the ids of the tokenizer ``document`` (its largest id); the tokenizer itself is checked where
    it is parsed, so a malformed part counts no id here."""
    model, added = document.get("model"), document.get("added_tokens")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids = [*(vocab.values() if isinstance(vocab, dict) else ()),
           *(t.get("id") for t in (added if isinstance(added, list) else ()) if isinstance(t, dict))]
    return token_dtype(max((i for i in ids if isinstance(i, int) and not isinstance(i, bool)), default=0) + 1)


def _read_json(path):
    return read_json_file(path, "file")


def token_cache_root() -> Path:
    """The folder of numformer's tokenized corpora: NUMFORMER_CACHE, else the per-user cache
    (``~/.cache/numformer``), then ``tokens``."""
    return (cache_dir() or Path.home() / ".cache" / "numformer") / "tokens"


def token_cache(*parts) -> Path:
    """The cache folder for a tokenized corpus described by ``parts`` (JSON-able): ``token_cache_root()`` /
    ``<hash of the parts>``."""
    key = hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=True).encode()).hexdigest()[:20]
    return token_cache_root() / key


def write_tokens_dir(folder, splits: dict, tokenizer_document: dict, dtype, source: dict) -> dict:
    """Write a tokens folder: each split's token file (``splits``: {split: iterable of id lists}), the
    tokenizer and meta.json (last, so that a folder with meta.json is complete). Returns the meta."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    counts = {split: write_token_file(folder / SPLIT_FILES[split], ids, dtype) for split, ids in splits.items()}
    _write_json(folder / "tokenizer.json", tokenizer_document)
    meta = {"dtype": np.dtype(dtype).name, "tokens": counts, "source": source}
    _write_json(folder / "meta.json", meta)
    return meta


def _write_json(path, obj):
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
