"""Truncation and padding of id sequences into batches."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def truncate(ids: Sequence[int], max_len: int, keep: str = "head") -> list[int]:
    """At most ``max_len`` ids, as a new list: the first ones (keep="head", the default) or the last ones
    (keep="tail"); max_len <= 0 keeps them all."""
    ids = list(ids)
    if max_len <= 0 or len(ids) <= max_len:
        return ids
    if keep == "head":
        return ids[:max_len]
    if keep == "tail":
        return ids[-max_len:]
    raise ValueError(f"keep must be 'head' or 'tail', got {keep!r}")


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None,
              max_len: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id sequences into (ids (B, T), key_padding_mask (B, T)).

    T is ``length`` if given, else the longest sequence (after truncation to ``max_len``
    when > 0, keeping the head); a sequence longer than ``length`` is a ValueError. ids are
    int64, padded with ``pad_id`` (default 0); the mask is bool, True at padding positions
    (torch.nn's convention: True = masked out), so padding never receives attention; the
    models derive the same mask from ``pad_id`` when none is passed.
    """
    if max_len > 0:
        seqs = [truncate(s, max_len) for s in seqs]
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    T = int(lens.max(initial=0)) if length is None else length
    if (lens > T).any():
        raise ValueError(f"a sequence of length {int(lens.max())} does not fit length={T}; truncate first")
    ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    mask = np.arange(T)[None, :] >= lens[:, None]
    return ids, mask
