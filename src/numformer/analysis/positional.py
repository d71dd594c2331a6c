"""Positional encodings: heatmaps, wavelengths, and similarity between positions.

The sinusoidal encoding (Vaswani et al. 2017, §3.5) gives dimension pair i the
wavelength λ_i = 2π · 10000^(2i/d_model), from 2π up to 10000·2π; a learned
table has no wavelengths by construction, but ``dominant_wavelengths`` reads
off the period of each dimension's strongest Fourier component, and
``position_similarity`` shows how alike the codes of two positions are.
"""
from __future__ import annotations

import numpy as np

from ..nn import LearnedPositionalEncoding, SinusoidalPositionalEncoding, sinusoidal_table
from ._common import new_figure, save_figure


def positional_tables(model, max_positions=None):
    """{module name: (kind, table (P, d_model) float64)} of every positional encoding of the model.

    kind is 'sinusoidal' or 'learned'; ``max_positions`` keeps the first rows only.
    """
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, SinusoidalPositionalEncoding):
            table, kind = m._table64, "sinusoidal"
        elif isinstance(m, LearnedPositionalEncoding):
            table, kind = m.weight.data, "learned"
        else:
            continue
        t = np.asarray(table, dtype=np.float64)
        out[name] = (kind, t if max_positions is None else t[:max_positions])
    return out


def sinusoidal_wavelengths(d_model, base=10000.0):
    """λ_i = 2π · base^(2i/d_model) for each dimension pair i = 0 … d_model/2 - 1 (in positions)."""
    return 2 * np.pi * base ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)


def dominant_wavelengths(table):
    """(d_model,) period in positions of each column's strongest non-constant Fourier component.

    For a sinusoidal table this recovers λ_i where the table is long enough to hold a period;
    longer wavelengths saturate near the table length. NaN for a constant column.
    """
    t = np.asarray(table, dtype=np.float64)
    P = t.shape[0]
    spec = np.abs(np.fft.rfft(t - t.mean(axis=0), axis=0))[1:]        # drop the constant term
    freq = np.fft.rfftfreq(P)[1:]
    k = np.argmax(spec, axis=0)
    out = 1.0 / freq[k]
    out[spec.max(axis=0) <= 1e-12 * max(np.abs(t).max(), 1e-300)] = np.nan
    return out


def position_similarity(table):
    """(P, P) cosine similarity between the encodings of every pair of positions."""
    t = np.asarray(table, dtype=np.float64)
    norm = np.linalg.norm(t, axis=1, keepdims=True)
    u = t / np.where(norm > 0, norm, 1.0)
    return u @ u.T


def plot_positional_encoding(table, title="positional encoding", path=None, dpi=100):
    """Heatmap of a positional table: positions (rows) × dimensions (columns)."""
    t = np.asarray(table, dtype=np.float64)
    P, d = t.shape
    fig = new_figure(float(np.clip(0.06 * d + 3.0, 5.0, 14.0)), float(np.clip(0.04 * P + 2.5, 4.0, 12.0)))
    ax = fig.subplots()
    lim = max(np.abs(t).max(), 1e-12)
    im = ax.imshow(t, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    return save_figure(fig, path, dpi)


def plot_wavelengths(d_model, base=10000.0, table=None, max_len=None, path=None, title=None, dpi=100):
    """Wavelength of each dimension pair of the sinusoidal encoding (log scale).

    table: optionally a (learned) table whose per-dimension dominant period is plotted too.
    max_len: draw the longest sequence length as a reference line.
    """
    fig = new_figure(7.0, 4.2)
    ax = fig.subplots()
    lam = sinusoidal_wavelengths(d_model, base)
    ax.semilogy(np.arange(len(lam)), lam, "o-", ms=3, label=r"sinusoidal $2\pi \cdot 10000^{2i/d}$")
    if table is not None:
        dom = dominant_wavelengths(table)
        ax.semilogy(np.arange(len(dom)) / 2.0, dom, ".", ms=5, alpha=0.7, color="#d62728",
                    label="learned table: dominant period of dimension 2i, 2i+1")
    if max_len is not None:
        ax.axhline(max_len, color="gray", ls="--", lw=1, label=f"max length {max_len}")
    ax.set_xlabel("dimension pair i (dimensions 2i, 2i+1)")
    ax.set_ylabel("wavelength (positions)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title or f"positional wavelengths (d_model={d_model})")
    return save_figure(fig, path, dpi)


def plot_position_similarity(table, title="cosine similarity between positions", path=None, dpi=100):
    """Heatmap of ``position_similarity``: position × position."""
    s = position_similarity(table)
    fig = new_figure(5.5, 4.8)
    ax = fig.subplots()
    im = ax.imshow(s, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xlabel("position")
    ax.set_ylabel("position")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    return save_figure(fig, path, dpi)


__all__ = ["positional_tables", "sinusoidal_wavelengths", "dominant_wavelengths", "position_similarity",
           "plot_positional_encoding", "plot_wavelengths", "plot_position_similarity", "sinusoidal_table"]
