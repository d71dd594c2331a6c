import numpy as np


def linear_forward(x, W, b=None):
    y = np.matmul(x, W.T)
    if b is not None:
        y = y + b
    return y, (x, W, b is not None)


def linear_backward(dy, cache, weight_grad=True):
    x, W, has_bias = cache
    d_out, d_in = W.shape
    rows_x = x.reshape(-1, d_in)
    rows_dy = dy.reshape(-1, d_out)
    dx = np.matmul(dy, W)
    dW = rows_dy.T @ rows_x if weight_grad else None
    db = rows_dy.sum(axis=0) if has_bias else None
    return dx, dW, db
