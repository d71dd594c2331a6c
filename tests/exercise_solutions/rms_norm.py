import numpy as np


def rms_norm_forward(x, gamma, eps=1e-6):
    r = 1 / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = x * r
    return xhat * gamma, (xhat, r, gamma)


def rms_norm_backward(dy, cache):
    xhat, r, gamma = cache
    d = xhat.shape[-1]
    dgamma = (dy * xhat).reshape(-1, d).sum(axis=0)
    g = dy * gamma
    dx = r * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma
