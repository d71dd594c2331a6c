import numpy as np


def lora_forward(x, A, B, scaling):
    u = x @ A.T
    y = scaling * (u @ B.T)
    return y, (x, u, A, B, scaling)


def lora_backward(dy, cache):
    x, u, A, B, s = cache
    r, d_in = A.shape
    rows_dy = dy.reshape(-1, B.shape[0])
    rows_u = u.reshape(-1, r)
    rows_x = x.reshape(-1, d_in)
    du = s * (rows_dy @ B)
    dB = s * (rows_dy.T @ rows_u)
    dA = du.T @ rows_x
    dx = (du @ A).reshape(x.shape)
    return dx, dA, dB
