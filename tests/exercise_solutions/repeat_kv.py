import numpy as np


def repeat_kv_forward(x, n_rep):
    return np.repeat(x, n_rep, axis=1), n_rep


def repeat_kv_backward(dy, cache):
    n_rep = cache
    B, H, T, d = dy.shape
    return dy.reshape(B, H // n_rep, n_rep, T, d).sum(axis=2)
