"""Cross-entropy over logits, fused with the softmax (log-sum-exp, stable)."""
from __future__ import annotations

import numpy as np

from ._checks import with_features


def cross_entropy_forward(logits, targets, ignore_index=-100, label_smoothing=0.0):
    """Mean cross-entropy of ``logits`` against integer ``targets``, with torch's semantics.

    logits: (..., C)   targets: (...) integers in [0, C) or ``ignore_index``   ->   (loss, cache), loss a float

    loss_n = (1 - ε) · (-log p_n[y_n]) + ε · mean_c(-log p_n[c])     (ε = label_smoothing)
    loss   = Σ_n loss_n / N_valid, over the positions whose target is not ignore_index.

    When every target is ignored the loss is 0 with zero gradient (torch gives NaN).
    """
    logits = with_features(logits, "cross_entropy_forward", "(..., C)")
    z = logits.reshape(-1, logits.shape[-1])                   # (N, C), N = all leading positions
    t = _checked_targets(logits, targets, ignore_index, label_smoothing)    # (N,)
    valid = t != ignore_index                                   # (N,) the positions that count
    t_safe = np.where(valid, t, 0)
    m = z.max(axis=1, keepdims=True)                            # (N, 1)
    e = np.exp(z - m)                                           # (N, C)
    s = e.sum(axis=1, keepdims=True)                            # (N, 1)
    lse = (np.log(s) + m)[:, 0]                                 # (N,) log Σ_c exp z_c
    loss_n = lse - z[np.arange(z.shape[0]), t_safe]             # -log p_n[y_n]
    if label_smoothing > 0.0:
        loss_n = (1.0 - label_smoothing) * loss_n + label_smoothing * (lse - z.mean(axis=1))
    n_valid = int(valid.sum())
    loss = float(np.sum(loss_n, where=valid, dtype=np.float64) / max(n_valid, 1))
    probs = e / s                                               # (N, C) softmax(z), for backward
    return loss, (probs, t_safe, valid, n_valid, label_smoothing, logits.shape)


def _checked_targets(logits, targets, ignore_index, label_smoothing):
    """The targets as a flat integer array (N,), after one clear ValueError for each kind of bad input."""
    C = logits.shape[-1]
    if logits.shape[:-1] != np.shape(targets):
        raise ValueError(f"targets of shape {np.shape(targets)} do not match logits {logits.shape} (..., C)")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    t = np.asarray(targets).reshape(-1)
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"targets must be integer class ids, got dtype {t.dtype}")
    bad = (t != ignore_index) & ((t < 0) | (t >= C))
    if bad.any():
        raise ValueError(f"target ids must be in [0, {C}) or equal ignore_index={ignore_index}; "
                         f"found {np.unique(t[bad])[:10].tolist()}")
    return t


def cross_entropy_backward(cache, dloss=1.0):
    """dlogits = dloss · (softmax(z) - q) / N_valid, with q = (1-ε) onehot(y) + ε / C; zero on ignored rows.

    cache first, then dloss (the gradient of the scalar loss, default 1)   ->   dlogits: (..., C), as the logits
    """
    probs, t, valid, n_valid, eps, shape = cache
    C = probs.shape[1]
    g = probs.copy()                                            # (N, C)
    g[np.arange(g.shape[0]), t] -= 1.0 - eps
    if eps > 0.0:
        g -= eps / C
    g *= (valid * (dloss / max(n_valid, 1)))[:, None].astype(g.dtype)
    return g.reshape(shape)
