import math

import numpy as np


def scaled_dot_product_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                         dropout_p=0.0, rng=None, need_weights=False, softcap=None):
    if scale is None:
        scale = 1 / math.sqrt(q.shape[-1])
    kt = np.swapaxes(k, -1, -2)
    s = (q @ kt) * scale
    capped = None
    if softcap is not None:
        capped = np.tanh(s / softcap)
        s = softcap * capped
    t_q, t_k = s.shape[-2:]
    if is_causal:
        s = np.where(np.tril(np.ones((t_q, t_k), dtype=bool)), s, -np.inf)
    if attn_mask is not None:
        if attn_mask.dtype == bool:
            s = np.where(attn_mask, s, -np.inf)
        else:
            s = s + attn_mask
    m = s.max(axis=-1, keepdims=True)
    m[~np.isfinite(m)] = 0
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total == 0, 1, total)
    keep = None
    if dropout_p > 0:
        keep = (rng.random(p.shape) >= dropout_p) / (1 - dropout_p)
        p_used = p * keep
    else:
        p_used = p
    out = p_used @ v
    return out, (p_used if need_weights else None), (q, k, v, p, keep, scale, capped)


def scaled_dot_product_attention_backward(dout, cache):
    q, k, v, p, keep, scale, capped = cache
    p_used = p if keep is None else p * keep
    dv = np.swapaxes(p_used, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    if keep is not None:
        dp = dp * keep
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    if capped is not None:
        ds = ds * (1 - capped ** 2)
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, dv
