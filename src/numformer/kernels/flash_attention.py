"""Reference: ``numformer.ops.attention`` (``scaled_dot_product_attention_forward/backward``).

Memory-efficient attention: the FlashAttention algorithm (Dao et al. 2022; Dao 2023) in NumPy, the
memory-saving version of that reference's ``scaled_dot_product_attention_forward/backward``
(tested against it in tests/test_flash_attention.py): the same result,

    O = softmax(Q Kᵀ · scale + M) V,

but the (Tq, Tk) score matrix is never held for all queries at once. The
queries are cut into blocks of ``block_q`` rows and the keys into blocks of
``block_k`` columns; for one query block the softmax is computed over the key
blocks one after another with an *online* softmax: a running row maximum m, a
running sum ℓ = Σ exp(s - m) and a running un-normalized output A,

    m' = max(m, rowmax(S_j))       P_j = exp(S_j - m')       α = exp(m - m')
    ℓ' = α ℓ + rowsum(P_j)         A' = α A + P_j V_j

and O = A / ℓ at the end. Forward keeps only O and the per-row log-sum-exp
L = m + log ℓ (plus Q, K, V and the masks it was given, by reference). The
backward pass recomputes each block of probabilities from L,
P_ij = exp(Q_i K_jᵀ · scale + M_ij - L_i), and with D_i = rowsum(dO_i ⊙ O_i)

    dV_j += P_ijᵀ dO_i      dP_ij = dO_i V_jᵀ      dS_ij = P_ij ⊙ (dP_ij - D_i)
    dQ_i += dS_ij K_j · scale      dK_j += dS_ijᵀ Q_i · scale

so the memory of both passes is O((Tq + Tk)·d + block_q·block_k) per batch and
head: linear in the sequence length.

Masks (the functional convention, as ``torch.nn.functional``: a boolean True
means the query **may attend** the key; a float mask is added to the scores):

- ``is_causal``: query i attends key j only if j <= i + causal_offset (offset 0
  is top-left aligned, as torch; the offset is the number of earlier positions,
  e.g. cached keys). Key blocks entirely in the future are skipped, so causal
  attention costs about half; no (Tq, Tk) mask is built.
- ``key_mask``: (B, Tk), per batch element and key (e.g. padding: False at padding
  keys; (Tk,) for q without leading axes); applied as (B, 1, …, 1, Tk), sliced per key block.
- ``attn_mask``: any mask broadcastable to the scores (..., Tq, Tk) without adding
  leading axes to them, sliced per block (a (B, 1, 1, Tk) mask stays that small).
- ``alibi_slopes``: (H,) slopes of ALiBi (``numformer.ops.alibi``) for q of shape (..., H, Tq, d):
  the bias -m_h · |(i + causal_offset) - j| is computed per block, so it costs no
  (Tq, Tk) array either.

A query row whose keys are all masked gets a zero output and zero gradients,
never NaN. Attention dropout is not implemented here (``dropout_p > 0`` raises);
use the reference ``ops.scaled_dot_product_attention_forward`` for it.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..ops.alibi import alibi_distance
from ..ops.attention import check_attn_mask, check_qkv

# Default rows (queries) and columns (keys) of a score block, (..., block_q, block_k): the memory the kernel
# holds beyond Q, K, V and O, per batch item and head.
DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 256


class FlashAttentionCache(NamedTuple):
    q: np.ndarray                   # (..., Tq, d_k), already multiplied by the scale
    k: np.ndarray                   # (..., Tk, d_k)
    v: np.ndarray                   # (..., Tk, d_v)
    out: np.ndarray                 # (..., Tq, d_v)
    lse: np.ndarray                 # (..., Tq, 1) log-sum-exp of each score row (+inf for a fully masked row)
    attn_mask: np.ndarray | None
    key_mask: np.ndarray | None     # reshaped to (B, 1, …, 1, Tk)
    is_causal: bool
    causal_offset: int
    alibi_slopes: np.ndarray | None  # (H, 1, 1), or None
    scale: float
    block_q: int
    block_k: int


def _check(q, k, v, block_q, block_k, dropout_p):
    if dropout_p:
        raise ValueError(f"the memory-efficient (flash) attention kernel has no attention dropout "
                         f"(dropout_p={dropout_p}); use scaled_dot_product_attention_forward for dropout")
    check_qkv(q, k, v)
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if int(b) != b or b < 1:
            raise ValueError(f"{name} must be a positive integer, got {b!r}")


def _prepare_masks(q, t_k, attn_mask, key_mask):
    """Validate the masks (no copies of big arrays); key_mask becomes (B, 1, …, 1, Tk)."""
    lead, t_q = q.shape[:-2], q.shape[-2]
    if attn_mask is not None:
        attn_mask = check_attn_mask(attn_mask, lead, t_q, t_k, may_add_axes=False)
    if key_mask is not None:
        key_mask = np.asarray(key_mask)
        if len(lead) == 0:
            if key_mask.shape != (t_k,):
                raise ValueError(f"key_mask must have shape ({t_k},) for unbatched q, got {key_mask.shape}")
            key_mask = key_mask[None, :]
        else:
            if key_mask.shape != (lead[0], t_k):
                raise ValueError(f"key_mask must have shape (batch, Tk) = ({lead[0]}, {t_k}), got {key_mask.shape}")
            key_mask = key_mask.reshape((lead[0],) + (1,) * (len(lead) - 1) + (1, t_k))
    return attn_mask, key_mask


def _prepare_slopes(alibi_slopes, q, dtype):
    """ALiBi slopes (H,) as (H, 1, 1) in the scores' dtype, checked against q's head axis; None stays None."""
    if alibi_slopes is None:
        return None
    slopes = np.asarray(alibi_slopes, dtype=dtype)
    if q.ndim < 3 or slopes.shape != (q.shape[-3],):
        raise ValueError(f"alibi_slopes must have shape (heads,) matching q (..., heads, Tq, d) = {q.shape}, "
                         f"got {slopes.shape}")
    return slopes[:, None, None]


def _slice(mask, i0, i1, j0, j1):
    """The (..., i0:i1, j0:j1) block of a broadcastable mask (axes of size 1 stay size 1)."""
    rows = slice(None) if mask.shape[-2] == 1 else slice(i0, i1)
    cols = slice(None) if mask.shape[-1] == 1 else slice(j0, j1)
    return mask[..., rows, cols]


def _apply(s, mask):
    """In place: block scores s with a mask block (bool True = may attend; float added)."""
    if mask.dtype == bool:
        np.copyto(s, -np.inf, where=~mask)
    else:
        s += mask.astype(s.dtype, copy=False)


def _causal_kind(i0, i1, j0, j1, offset):
    """'skip' if every (i, j) of the block has j > i + offset, 'full' if every j <= i + offset, else 'part'."""
    if j0 > i1 - 1 + offset:
        return "skip"
    if j1 - 1 <= i0 + offset:
        return "full"
    return "part"


def _scores(q_i, k_j, i0, i1, j0, j1, attn_mask, key_mask, is_causal, causal_offset, kind, slopes=None):
    """S_ij = Q_i K_jᵀ (q pre-scaled) plus the ALiBi bias, with every mask applied to the block."""
    s = q_i @ np.swapaxes(k_j, -1, -2)
    if slopes is not None:
        s -= slopes * alibi_distance(i1 - i0, j1 - j0, causal_offset, s.dtype, i0, j0)
    if is_causal and kind == "part":
        blocked = (np.arange(j0, j1)[None, :] > np.arange(i0, i1)[:, None] + causal_offset)
        np.copyto(s, -np.inf, where=blocked)
    if attn_mask is not None:
        _apply(s, _slice(attn_mask, i0, i1, j0, j1))
    if key_mask is not None:
        _apply(s, key_mask[..., j0:j1])
    return s


def flash_attention_forward(q, k, v, attn_mask=None, is_causal=False, key_mask=None, scale=None,
                            causal_offset=0, block_q=DEFAULT_BLOCK_Q, block_k=DEFAULT_BLOCK_K, dropout_p=0.0,
                            alibi_slopes=None):
    """softmax(Q Kᵀ · scale + M) V block by block, batched over all leading axes (batch, heads).

    q: (..., Tq, d_k)   k: (..., Tk, d_k)   v: (..., Tk, d_v)
    attn_mask: broadcastable to the scores (..., Tq, Tk), adding no leading axes; bool (True = may attend)
    or float (added).
    is_causal: query i attends keys j <= i + causal_offset (offset 0: top-left aligned, as torch).
    key_mask: (B, Tk) with B = q.shape[0] ((Tk,) for q of shape (Tq, d_k)); bool (True = may attend) or
    float (added).
    scale: defaults to 1/√d_k.  block_q, block_k: rows / columns of a score block (default 256 each).
    dropout_p: must be 0 (no attention dropout in this kernel).
    alibi_slopes: (H,) with H = q.shape[-3]: adds the ALiBi bias -m_h |(i + causal_offset) - j| block by block.

    Returns (out, cache): out (..., Tq, d_v); the cache keeps O(T) memory.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    _check(q, k, v, block_q, block_k, dropout_p)
    block_q, block_k = int(block_q), int(block_k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    t_q, t_k = q.shape[-2], k.shape[-2]
    attn_mask, key_mask = _prepare_masks(q, t_k, attn_mask, key_mask)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    slopes = _prepare_slopes(alibi_slopes, q, dtype)
    qs = q * np.asarray(scale, dtype=q.dtype)
    lead = q.shape[:-2]
    out = np.zeros(lead + (t_q, v.shape[-1]), dtype=dtype)
    lse = np.empty(lead + (t_q, 1), dtype=dtype)
    for i0 in range(0, t_q, block_q):
        i1 = min(i0 + block_q, t_q)
        q_i = qs[..., i0:i1, :]
        m = np.full(lead + (i1 - i0, 1), -np.inf, dtype=dtype)     # running row maximum
        ell = np.zeros(lead + (i1 - i0, 1), dtype=dtype)           # running Σ exp(s - m)
        acc = out[..., i0:i1, :]                                   # running Σ exp(s - m) v (a view of out)
        for j0 in range(0, t_k, block_k):
            j1 = min(j0 + block_k, t_k)
            kind = _causal_kind(i0, i1, j0, j1, causal_offset) if is_causal else "full"
            if kind == "skip":
                break                                              # later key blocks are in the future too
            s = _scores(q_i, k[..., j0:j1, :], i0, i1, j0, j1, attn_mask, key_mask, is_causal, causal_offset, kind,
                        slopes)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            m_safe = np.where(np.isfinite(m_new), m_new, 0.0).astype(dtype, copy=False)   # all -inf so far
            s -= m_safe
            p = np.exp(s, out=s)
            alpha = np.exp(m - m_safe)
            ell *= alpha
            ell += p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += p @ v[..., j0:j1, :]
            m = m_new
        empty = ell == 0                                           # every key masked: output 0, lse = +inf
        acc /= np.where(empty, 1.0, ell).astype(dtype, copy=False)
        m_safe = np.where(np.isfinite(m), m, 0.0).astype(dtype, copy=False)
        with np.errstate(divide="ignore"):
            lse[..., i0:i1, :] = np.where(empty, np.inf, m_safe + np.log(ell))
    cache = FlashAttentionCache(qs, k, v, out, lse, attn_mask, key_mask, bool(is_causal), int(causal_offset),
                                slopes, scale, block_q, block_k)
    return out, cache


def flash_attention_backward(dout, cache):
    """Gradients (dq, dk, dv) of flash_attention_forward, recomputing the probabilities block by block.

    dout: (..., Tq, d_v)   ->   dq, dk, dv with the shapes of q, k, v (the equations of the module docstring).
    """
    qs, k, v, out, lse, attn_mask, key_mask, is_causal, offset, slopes, scale, block_q, block_k = cache
    t_q, t_k = qs.shape[-2], k.shape[-2]
    dtype = out.dtype
    dout = dout.astype(dtype, copy=False)
    delta = np.sum(dout * out, axis=-1, keepdims=True)            # D_i = rowsum(dO ⊙ O) = rowsum(dP ⊙ P)
    dq = np.zeros(qs.shape, dtype=dtype)
    dk = np.zeros(k.shape, dtype=dtype)
    dv = np.zeros(v.shape, dtype=dtype)
    for i0 in range(0, t_q, block_q):
        i1 = min(i0 + block_q, t_q)
        q_i, do_i = qs[..., i0:i1, :], dout[..., i0:i1, :]
        lse_i, d_i = lse[..., i0:i1, :], delta[..., i0:i1, :]
        dq_i = dq[..., i0:i1, :]
        for j0 in range(0, t_k, block_k):
            j1 = min(j0 + block_k, t_k)
            kind = _causal_kind(i0, i1, j0, j1, offset) if is_causal else "full"
            if kind == "skip":
                break
            k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]
            s = _scores(q_i, k_j, i0, i1, j0, j1, attn_mask, key_mask, is_causal, offset, kind, slopes)
            s -= lse_i
            p = np.exp(s, out=s)                                   # P_ij, exactly 0 where masked
            dv[..., j0:j1, :] += np.swapaxes(p, -1, -2) @ do_i
            dp = do_i @ np.swapaxes(v_j, -1, -2)
            dp -= d_i
            dp *= p                                                # dS_ij (without the scale)
            dq_i += dp @ k_j
            dk[..., j0:j1, :] += np.swapaxes(dp, -1, -2) @ q_i    # q_i carries the scale already
    dq *= np.asarray(scale, dtype=dtype)
    return dq, dk, dv


__all__ = ["flash_attention_forward", "flash_attention_backward", "FlashAttentionCache", "DEFAULT_BLOCK_Q",
           "DEFAULT_BLOCK_K"]
