import numpy as np


def softmax_forward(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    total = e.sum(axis=axis, keepdims=True)
    y = e / np.where(total == 0, 1.0, total)
    return y, (y, axis)


def softmax_backward(dy, cache):
    y, axis = cache
    return y * dy - y * np.sum(y * dy, axis=axis, keepdims=True)
