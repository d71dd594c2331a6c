"""Positional encodings: fixed sinusoids (Vaswani et al. 2017, §3.5) or a learned table (GPT, BERT).

Both are modules that add the encoding of positions offset … offset+T-1 to
their input: forward(x (B, T, d), offset=0) -> x + P[offset:offset+T]; or, with
``positions`` (B, T) ints (each row its own positions, as in a left-padded batch),
x + P[positions].
"""
from __future__ import annotations

import numpy as np

from . import init
from .module import Module, Parameter


def sinusoidal_table(max_len, d_model, base=10000.0):
    """PE(p, 2i) = sin(p / base^(2i/d)),  PE(p, 2i+1) = cos(p / base^(2i/d));  shape (max_len, d_model).

    Wavelengths 2π·base^(2i/d) grow geometrically along the dimension pairs i = 0 … d/2 − 1, from 2π to
    2π·base^((d−2)/d) (just under 2π·base).
    """
    positions = np.arange(max_len, dtype=np.float64)[:, None]
    inv_freq = base ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    angles = positions * inv_freq
    table = np.zeros((max_len, d_model))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return table


def _check_length(T, offset, max_len, positions=None):
    if positions is not None:
        positions = np.asarray(positions)
        if positions.shape[1:] != (T,) or not np.issubdtype(positions.dtype, np.integer):
            raise ValueError(f"positions must be integers of shape (batch, {T}), got {positions.dtype} "
                             f"{positions.shape}")
        T, offset = (int(positions.max()) + 1 if positions.size else 0), 0
    if offset + T > max_len:
        raise ValueError(f"sequence positions up to {offset + T} exceed the positional table of length {max_len}; "
                         f"shorten the input or build the model with a larger max_len / block_size")


class SinusoidalPositionalEncoding(Module):
    """x + PE[offset:offset+T]; no parameters, so it can be evaluated at any length up to max_len."""

    def __init__(self, d_model, max_len=5000, dtype=np.float32):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self._table64 = sinusoidal_table(max_len, d_model)
        self.table = self._table64.astype(dtype)

    def _on_dtype_change(self, dtype):
        self.table = self._table64.astype(dtype)

    def forward(self, x, offset=0, positions=None):
        _check_length(x.shape[1], offset, self.max_len, positions)
        if positions is not None:
            return x + self.table[positions]
        return x + self.table[offset:offset + x.shape[1]]

    def backward(self, dy):
        """dx = dy: the fixed table has no gradient."""
        return dy

    def extra_repr(self):
        return f"d_model={self.d_model}, max_len={self.max_len}"


class LearnedPositionalEncoding(Module):
    """x + P[offset:offset+T] with P: (max_len, d_model) learned, initialized N(0, std²)."""

    def __init__(self, d_model, max_len, rng=None, dtype=np.float32, std=0.02):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.weight = Parameter(init.normal(init.default_rng(rng), (max_len, d_model), std, dtype))
        self._cache = None

    def forward(self, x, offset=0, positions=None):
        T = x.shape[1]
        _check_length(T, offset, self.max_len, positions)
        self._cache = (offset, T, positions)
        if positions is not None:
            return x + self.weight.data[positions]
        return x + self.weight.data[offset:offset + T]

    parameter_kind = "embedding"

    def backward(self, dy):
        """dy (B, T, d_model) -> dx = dy (the add passes it on unchanged), and ∂L/∂P accumulated into
        ``weight.grad``: row offset + t gains Σ_b dy[b, t], or with ``positions`` row positions[b, t] gains
        dy[b, t] (a scatter-add: a repeated position sums); rows no position used gain nothing. A frozen
        table (``requires_grad`` False) only passes dy on."""
        offset, T, positions = self._cache
        if not self.weight.requires_grad:
            self._cache = None
            return dy
        if self.weight.grad is None:
            self.weight.grad = np.zeros_like(self.weight.data)
        if positions is not None:
            np.add.at(self.weight.grad, np.asarray(positions).reshape(-1), dy.reshape(-1, self.d_model))
        else:
            self.weight.grad[offset:offset + T] += dy.reshape(-1, T, self.d_model).sum(axis=0)
        self._cache = None
        return dy

    def extra_repr(self):
        return f"d_model={self.d_model}, max_len={self.max_len}"


class PositionsInAttention(Module):
    """Leaves the token vectors unchanged: positions enter inside attention instead
    ('rope': rotary embeddings of queries and keys; 'alibi': linear biases on the scores).
    No table, so no maximum length of its own."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x, offset=0, positions=None):
        return x

    def backward(self, dy):
        return dy

    def extra_repr(self):
        return self.kind


POSITIONAL_KINDS = ("learned", "sinusoidal", "rope", "alibi")


def make_positional(kind, d_model, max_len, rng=None, dtype=np.float32):
    """'sinusoidal' or 'learned' (added to the embeddings), or 'rope' / 'alibi' (applied in attention)."""
    if kind in ("rope", "alibi"):
        return PositionsInAttention(kind)
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len, dtype)
    if kind == "learned":
        return LearnedPositionalEncoding(d_model, max_len, rng, dtype)
    raise ValueError(f"unknown positional encoding {kind!r}; choose one of {list(POSITIONAL_KINDS)}")
