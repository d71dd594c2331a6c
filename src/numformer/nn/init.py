"""Weight initializations (the same distributions torch uses).

``skipped()`` turns them off for a model about to be overwritten (a checkpoint loaded into it).
"""
from __future__ import annotations

import contextlib
import math
import threading

import numpy as np

_skipping = threading.local()


@contextlib.contextmanager
def skipped():
    """Inside the block, ``uniform`` and ``normal`` (every initialization below) return zeros (``np.zeros``:
    memory the system hands out zeroed, not written now) and draw nothing: for a model whose every parameter is
    written next, as when a checkpoint is loaded (torch's ``skip_init``). Drawing a billion weights only to
    overwrite them takes most of the loading time. Per thread."""
    before = getattr(_skipping, "on", False)
    _skipping.on = True
    try:
        yield
    finally:
        _skipping.on = before


def default_rng(rng):
    """The generator to use: the Generator given, a new one seeded with an integer, else a fresh unseeded one."""
    if rng is None or isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(rng)
    if isinstance(rng, np.random.Generator):
        return rng
    raise ValueError(f"rng must be a numpy.random.Generator, an integer seed or None, got {type(rng).__name__}")


def uniform(rng, shape, bound, dtype):
    """An array of ``shape`` drawn uniformly from [-bound, bound) by ``rng``, in ``dtype``."""
    if getattr(_skipping, "on", False):
        return np.zeros(shape, dtype)
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def normal(rng, shape, std, dtype):
    """An array of ``shape`` drawn from N(0, std²) by ``rng``, in ``dtype``."""
    if getattr(_skipping, "on", False):
        return np.zeros(shape, dtype)
    return (rng.standard_normal(size=shape) * std).astype(dtype)


def xavier_uniform(rng, shape, dtype, fan_in=None, fan_out=None):
    """Glorot & Bengio (2010): U(-a, a), a = √(6 / (fan_in + fan_out)); shape is (fan_out, fan_in)."""
    fan_out = shape[0] if fan_out is None else fan_out
    fan_in = shape[1] if fan_in is None else fan_in
    return uniform(rng, shape, math.sqrt(6.0 / (fan_in + fan_out)), dtype)


def linear_default(rng, shape, dtype):
    """torch.nn.Linear's default: U(-1/√fan_in, 1/√fan_in) (kaiming_uniform with a=√5)."""
    return uniform(rng, shape, 1.0 / math.sqrt(shape[-1]), dtype)
