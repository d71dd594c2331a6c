import math

import numpy as np

erf = np.vectorize(math.erf)


def gelu_forward(x, approximate="none"):
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x ** 3))
        y = 0.5 * x * (1 + t)
        dydx = 0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * c * (1 + 3 * 0.044715 * x ** 2)
    elif approximate == "none":
        cdf = 0.5 * (1 + erf(x / math.sqrt(2)))
        pdf = np.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi)
        y = x * cdf
        dydx = cdf + x * pdf
    else:
        raise ValueError(f"approximate is 'none' or 'tanh', not {approximate!r}")
    return y, dydx


def gelu_backward(dy, cache):
    return dy * cache
