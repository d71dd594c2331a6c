"""Scaled dot-product attention (Vaswani et al. 2017, eq. 1), the reference implementation:

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

with two options of later models: another ``scale`` than 1/√d_k (Gemma: query_pre_attn_scalar^-½), and
soft-capped scores c·tanh(S / c) before the mask (Gemma 2; ``ops.softcap``).

This is the file to read first: every line is the equation. Two faster
kernels compute the same thing and are tested against this one:
``kernels/fused_attention.py`` (the scores kept transposed, the softmax in place,
the batch split across threads; what the modules use) and
``kernels/flash_attention.py`` (block by block with an online softmax: memory
linear in the sequence length).

Mask convention of this *functional* op follows ``torch.nn.functional.
scaled_dot_product_attention``: a boolean mask is True where a query **may
attend** to a key; a float mask is added to the scores (use -inf to block).
The modules in ``numformer.nn`` use the ``torch.nn`` convention instead
(boolean True = masked out) and convert before calling an op.

A query row whose keys are all masked gets all-zero weights, hence a zero
output and zero gradients, never NaN.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .activations import softmax_forward
from .softcap import softcap_backward, softcap_forward


class AttentionCache(NamedTuple):
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    weights: np.ndarray        # softmax probabilities, before dropout: (..., Tq, Tk)
    dropout_mask: np.ndarray | None
    scale: float
    softcap: np.ndarray | None = None    # the soft-cap's cache t = tanh(S / c), S the scaled scores; None: no cap


def causal_mask(t_q, t_k=None):
    """Boolean (t_q, t_k) mask, True where query i may attend key j (j <= i), aligned top-left as in torch."""
    t_k = t_q if t_k is None else t_k
    return np.tril(np.ones((t_q, t_k), dtype=bool))


def check_qkv(q, k, v):
    """Raise a ValueError unless q (..., Tq, d_k), k (..., Tk, d_k), v (..., Tk, d_v) fit together
    (shared by every attention kernel)."""
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"q, k, v must have the same number of dimensions (>= 2), got shapes {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"q, k, v must share their leading (batch, head) axes, got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"queries and keys need the same feature size d_k, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"keys and values need the same length, got {k.shape[-2]} and {v.shape[-2]}")


def check_attn_mask(attn_mask, lead, t_q, t_k, may_add_axes=True):
    """A functional ``attn_mask`` as an array of at least 2 dimensions, checked to broadcast to the scores
    ``lead + (Tq, Tk)`` (shared by every attention kernel). ``may_add_axes=False``: the mask may not add
    leading axes to the scores (a kernel that cannot broadcast q, k, v)."""
    attn_mask = np.asarray(attn_mask)
    if attn_mask.ndim == 1:
        attn_mask = attn_mask[None, :]
    scores = tuple(lead) + (t_q, t_k)
    try:
        shape = np.broadcast_shapes(attn_mask.shape, scores)
        ok = shape[-2:] == (t_q, t_k) and (may_add_axes or shape == scores)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"attn_mask of shape {attn_mask.shape} does not broadcast to the scores {scores}")
    return attn_mask


def apply_mask(scores, attn_mask=None, is_causal=False):
    """Return scores with the masks applied (functional convention: bool True = may attend)."""
    t_q, t_k = scores.shape[-2:]
    if is_causal:
        scores = np.where(causal_mask(t_q, t_k), scores, -np.inf).astype(scores.dtype, copy=False)
    if attn_mask is not None:
        attn_mask = check_attn_mask(attn_mask, scores.shape[:-2], t_q, t_k)
        if attn_mask.dtype == bool:
            scores = np.where(attn_mask, scores, -np.inf).astype(scores.dtype, copy=False)
        else:
            scores = scores + attn_mask.astype(scores.dtype, copy=False)
    return scores


def scaled_dot_product_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                         dropout_p=0.0, rng=None, need_weights=False, softcap=None):
    """softmax(Q Kᵀ · scale + M) V, batched over all leading axes (batch, heads).

    q: (..., Tq, d_k)   k: (..., Tk, d_k)   v: (..., Tk, d_v)
    attn_mask: broadcastable to (..., Tq, Tk); bool (True = may attend) or float (added).
    is_causal: query i attends keys j <= i (top-left aligned, as torch).
    scale: defaults to 1/√d_k.  dropout_p > 0 drops attention weights (needs ``rng``).
    softcap: c > 0 caps the scaled scores to c·tanh(S / c) before the mask (Gemma 2); None: no cap.

    Returns (out, weights, cache): out (..., Tq, d_v); weights (..., Tq, Tk) if
    need_weights else None (after dropout, as torch returns them).
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = q @ np.swapaxes(k, -1, -2)                       # S = Q Kᵀ · scale + M
    scores *= scale
    capped = None
    if softcap is not None:                                   # S = c·tanh(S / c), before the mask
        scores, capped = softcap_forward(scores, softcap)
    scores = apply_mask(scores, attn_mask, is_causal)
    weights, _ = softmax_forward(scores, axis=-1)             # P = softmax(S) over the keys
    drop = None
    if dropout_p > 0.0:
        if rng is None:
            raise ValueError("attention dropout needs a random generator (rng)")
        keep = 1.0 - dropout_p
        drop = ((rng.random(weights.shape, dtype=np.float32) < keep) / keep).astype(weights.dtype)
    used = weights if drop is None else weights * drop
    out = used @ v                                            # O = P V
    cache = AttentionCache(q, k, v, weights, drop, scale, capped)
    return out, (used if need_weights else None), cache


def scaled_dot_product_attention_backward(dout, cache):
    """Gradients of out = P V with P = softmax(S), S = Q Kᵀ · scale.

    dV = Pᵀ dout      dP = dout Vᵀ      dS = P ⊙ (dP - rowsum(dP ⊙ P))
    dQ = dS K · scale      dK = dSᵀ Q · scale
    (with dropout, P is P ⊙ D in dV and dP is multiplied by D, D the kept mask / (1 - dropout_p);
    with a soft-cap, dS is multiplied by the cap's derivative 1 - tanh² before the scale: ``ops.softcap_backward``)

    dout: (..., Tq, d_v). Returns (dq, dk, dv) with the shapes of q, k, v.
    """
    q, k, v, p, drop, scale, capped = cache
    used = p if drop is None else p * drop
    dv = np.swapaxes(used, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    if drop is not None:
        dp *= drop
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    if capped is not None:
        ds = softcap_backward(ds, capped)
    ds *= scale
    dq = ds @ k
    dk = np.swapaxes(ds, -1, -2) @ q
    return dq, dk, dv
