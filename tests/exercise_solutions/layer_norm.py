import numpy as np


def layer_norm_forward(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    r = 1 / np.sqrt(var + eps)
    xhat = (x - mean) * r
    y = xhat * gamma
    if beta is not None:
        y = y + beta
    return y, (xhat, r, gamma)


def layer_norm_backward(dy, cache):
    xhat, r, gamma = cache
    d = xhat.shape[-1]
    dgamma = (dy * xhat).reshape(-1, d).sum(axis=0)
    dbeta = dy.reshape(-1, d).sum(axis=0)
    g = dy * gamma
    dx = r * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta
