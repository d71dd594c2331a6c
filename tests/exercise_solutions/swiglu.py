import numpy as np


def _lin(x, W, b):
    y = x @ W.T
    return y if b is None else y + b


def swiglu_forward(x, w_gate, w_up, w_down, b_gate=None, b_up=None, b_down=None):
    a = _lin(x, w_gate, b_gate)
    b = _lin(x, w_up, b_up)
    s = 1 / (1 + np.exp(-a))
    h = a * s * b
    y = _lin(h, w_down, b_down)
    return y, (x, w_gate, w_up, w_down, a, b, s, h, b_gate is not None, b_up is not None, b_down is not None)


def swiglu_backward(dy, cache):
    x, w_gate, w_up, w_down, a, b, s, h, has_bg, has_bu, has_bd = cache
    d_model, d_ff = w_down.shape
    rows = lambda z, n: z.reshape(-1, n)
    dh = dy @ w_down
    dw_down = rows(dy, d_model).T @ rows(h, d_ff)
    da = dh * b * (s + a * s * (1 - s))
    db = dh * a * s
    dx = da @ w_gate + db @ w_up
    dw_gate = rows(da, d_ff).T @ rows(x, d_model)
    dw_up = rows(db, d_ff).T @ rows(x, d_model)
    return (dx, dw_gate, dw_up, dw_down,
            rows(da, d_ff).sum(0) if has_bg else None,
            rows(db, d_ff).sum(0) if has_bu else None,
            rows(dy, d_model).sum(0) if has_bd else None)
