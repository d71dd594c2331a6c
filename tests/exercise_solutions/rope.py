import numpy as np

from numformer.ops import rope_inverse_frequencies


def _rotate(x, sign):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([-sign * b, sign * a], axis=-1)


def rope_forward(x, offset=0, theta=10000.0, positions=None, scaling=None):
    T, d = x.shape[-2:]
    if positions is None:
        positions = np.arange(offset, offset + T)
    freqs, a = theta ** (-np.arange(0, d, 2) / d), 1.0
    if scaling is not None:
        freqs, a = rope_inverse_frequencies(d, theta, scaling, int(np.max(positions)) + 1)
    angles = np.asarray(positions, dtype=float)[..., None] * freqs
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = a * np.cos(angles), a * np.sin(angles)
    if cos.ndim == 3 and x.ndim == 4:
        cos, sin = cos[:, None], sin[:, None]
    return x * cos + _rotate(x, 1) * sin, (cos, sin)


def rope_backward(dy, cache):
    cos, sin = cache
    return dy * cos + _rotate(dy * sin, -1)
