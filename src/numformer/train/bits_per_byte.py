"""Bits per byte: a validation figure that compares language models with different tokenizers.

A loss in nats per token depends on how much text a token holds: a character model's tokens are 1 byte, a
BPE model's about 4. Bits per byte (nanochat's ``bpb``) divides the code length of the text by its size:

    bpb = Σ_t nll_t / (ln 2 · Σ_t bytes_t)

over the validation targets t, where nll_t = -ln p(target_t) and bytes_t is the number of UTF-8 bytes the
target token stands for (``Task.token_bytes``). Special tokens (``<|endoftext|>``) stand for no text: their
bytes are 0 and their loss is left out, as nanochat does. For a character model of ASCII text, bpb is the
loss in bits per character.
"""
from __future__ import annotations

import math

import numpy as np


class ByteCount:
    """The sums of bits per byte over evaluation batches: ``add`` each batch's cross-entropy cache."""

    def __init__(self, token_bytes):
        self.token_bytes = np.asarray(token_bytes, dtype=np.int64)
        self.nats, self.bytes = 0.0, 0

    def add(self, cache):
        """One batch, from ``ops.cross_entropy_forward``'s cache (probabilities (N, C), targets (N,), which
        targets count (N,), ...)."""
        probs, targets, valid = cache[0], cache[1], cache[2]
        nbytes = np.where(valid, self.token_bytes[targets], 0)
        p = probs[np.arange(targets.shape[0]), targets].astype(np.float64)
        with np.errstate(divide="ignore"):
            nll = -np.log(p)                       # +inf where a diverged model gives a target probability 0
        self.nats += float(np.sum(nll, where=nbytes > 0))
        self.bytes += int(nbytes.sum())

    @property
    def bpb(self) -> float:
        return self.nats / (math.log(2) * self.bytes) if self.bytes else math.nan


def byte_count(task):
    """A ``ByteCount`` for the task's tokens, or None when the task cannot tell their bytes."""
    token_bytes = task.token_bytes()
    return None if token_bytes is None else ByteCount(token_bytes)
