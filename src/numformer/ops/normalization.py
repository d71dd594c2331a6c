"""Normalizations: layer norm, RMS norm, and a batch-statistics norm.

All three share the form  y = x̂ ⊙ γ + β  with a different x̂ (RMS norm has no β). These are the
references; the speed path of layer norm and RMS norm is ``numformer.kernels.normalization``.
"""
from __future__ import annotations

import numpy as np

from ._checks import with_features


def layer_norm_forward(x, gamma, beta, eps=1e-5):
    """LayerNorm(x) = (x - μ) / √(σ² + ε) ⊙ γ + β, statistics over the last axis.

    x: (..., d)   gamma, beta: (d,) (beta may be None)   ->   y: (..., d)
    μ and σ² (biased) are computed per position, as in the paper and torch.
    """
    x = with_features(x, "layer_norm_forward")
    mu = x.mean(axis=-1, keepdims=True)                         # (..., 1)
    xc = x - mu                                                 # (..., d)
    var = (xc * xc).mean(axis=-1, keepdims=True)                # (..., 1), biased
    rstd = 1.0 / np.sqrt(var + eps)                             # (..., 1) = 1/σ
    xhat = xc * rstd                                            # (..., d)
    y = xhat * gamma if beta is None else xhat * gamma + beta
    return y, (xhat, rstd, gamma)


def layer_norm_backward(dy, cache):
    """dx = (1/σ) (g - mean(g) - x̂ · mean(g ⊙ x̂)), with g = dy ⊙ γ, 1/σ = 1/√(σ² + ε) (the forward's
    ``rstd``) and the means over the last axis.

    dy: (..., d)   ->   dx: (..., d)   dgamma, dbeta: (d,)
    Returns (dx, dgamma, dbeta), the parameter gradients summed over all leading axes (dbeta = Σ dy even
    when the forward had no beta).
    """
    xhat, rstd, gamma = cache
    d = xhat.shape[-1]
    dgamma = (dy * xhat).reshape(-1, d).sum(axis=0)            # (d,)
    dbeta = dy.reshape(-1, d).sum(axis=0)                       # (d,)
    g = dy * gamma                                              # (..., d)
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


def rms_norm_forward(x, gamma, eps=1e-6):
    """RMSNorm(x) = x / √(mean(x²) + ε) ⊙ γ  (Zhang & Sennrich 2019), over the last axis.

    x: (..., d)   gamma: (d,)   ->   y: (..., d)
    """
    x = with_features(x, "rms_norm_forward")
    rrms = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * rrms
    return xhat * gamma, (xhat, rrms, gamma)


def rms_norm_backward(dy, cache):
    """dx = r (g - x̂ · mean(g ⊙ x̂)), with r = 1/√(mean(x²) + ε) and g = dy ⊙ γ. Returns (dx, dgamma).

    dy: (..., d)   ->   dx: (..., d)   dgamma: (d,), summed over all leading axes
    """
    xhat, rrms, gamma = cache
    d = xhat.shape[-1]
    dgamma = (dy * xhat).reshape(-1, d).sum(axis=0)            # (d,)
    g = dy * gamma
    dx = (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)) * rrms
    return dx, dgamma


def batch_norm_forward(x, gamma, beta, eps=1e-5):
    """Batch normalization in training mode: layer norm's form with one mean and variance per feature.

    Each feature is normalized with the mean and (biased) variance over all
    leading axes (batch and sequence), as ``torch.nn.functional.batch_norm``
    in training mode with no running statistics. The output of one position
    depends on the rest of the batch: offered for comparison only.

    x: (..., d)   gamma, beta: (d,)   ->   y: (..., d)
    """
    x = with_features(x, "batch_norm_forward")
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    mu = x2.mean(axis=0)
    xc = x2 - mu
    var = np.mean(xc * xc, axis=0)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    y = xhat * gamma + beta
    return y.reshape(x.shape), (xhat, rstd, gamma, x.shape)


def batch_norm_backward(dy, cache):
    """As layer_norm_backward, with the means taken over the rows (all leading positions) instead of the
    features: dx = (1/σ) (g - mean_rows(g) - x̂ · mean_rows(g ⊙ x̂)).
    Returns (dx, dgamma, dbeta): (..., d), (d,), (d,).
    """
    xhat, rstd, gamma, shape = cache
    dy2 = dy.reshape(-1, shape[-1])
    dgamma = (dy2 * xhat).sum(axis=0)
    dbeta = dy2.sum(axis=0)
    g = dy2 * gamma
    dx = (g - g.mean(axis=0) - xhat * np.mean(g * xhat, axis=0)) * rstd
    return dx.reshape(shape), dgamma, dbeta
