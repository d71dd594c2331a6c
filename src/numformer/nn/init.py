"""Weight initializations (the same distributions torch uses).

``skipped()`` turns them off for a model about to be overwritten (a checkpoint loaded into it).
"""
from __future__ import annotations

import contextlib
import math
import mmap
import threading

import numpy as np

_skipping = threading.local()


@contextlib.contextmanager
def skipped():
    """Inside the block, ``uniform`` and ``normal`` (every initialization below) return zeros (``unmapped_zeros``:
    memory the system hands out zeroed when it is first written) and draw nothing: for a model whose every
    parameter is written next, as when a checkpoint is loaded (torch's ``skip_init``). Drawing a billion
    weights only to overwrite them takes most of the loading time, and a model built so takes no memory until
    its weights arrive. Per thread."""
    before = getattr(_skipping, "on", False)
    _skipping.on = True
    try:
        yield
    finally:
        _skipping.on = before


UNMAPPED_BYTES = 1 << 20            # arrays from this size up get a mapping of their own in ``unmapped_zeros``


def unmapped_zeros(shape, dtype):
    """Zeros that take no memory until written: from ``UNMAPPED_BYTES`` up, an anonymous mapping of their own
    (the operating system maps each page when it is first written, and unmaps them all when the array is
    freed); smaller, ``np.zeros``. ``np.zeros`` alone would not do: malloc takes arrays below its mmap
    threshold (32 MiB under ``numformer.set_fast_runtime``) from the heap, whose reused memory it clears, and
    keeps them there when freed."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes < UNMAPPED_BYTES:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)


def is_skipped():
    """True inside ``skipped()``: a module that writes its own initial values into a parameter after making it
    (a second initialization, a zero bias) skips that too, since writing even zeros makes the system hand out
    the memory now."""
    return getattr(_skipping, "on", False)


def default_rng(rng):
    """The generator to use: the Generator given, a new one seeded with an integer, else a fresh unseeded one."""
    if rng is None or isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(rng)
    if isinstance(rng, np.random.Generator):
        return rng
    raise ValueError(f"rng must be a numpy.random.Generator, an integer seed or None, got {type(rng).__name__}")


def uniform(rng, shape, bound, dtype):
    """An array of ``shape`` drawn uniformly from [-bound, bound) by ``rng``, in ``dtype``."""
    if is_skipped():
        return unmapped_zeros(shape, dtype)
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def normal(rng, shape, std, dtype):
    """An array of ``shape`` drawn from N(0, std²) by ``rng``, in ``dtype``."""
    if is_skipped():
        return unmapped_zeros(shape, dtype)
    return (rng.standard_normal(size=shape) * std).astype(dtype)


def xavier_uniform(rng, shape, dtype, fan_in=None, fan_out=None):
    """Glorot & Bengio (2010): U(-a, a), a = √(6 / (fan_in + fan_out)); shape is (fan_out, fan_in)."""
    fan_out = shape[0] if fan_out is None else fan_out
    fan_in = shape[1] if fan_in is None else fan_in
    return uniform(rng, shape, math.sqrt(6.0 / (fan_in + fan_out)), dtype)


def linear_default(rng, shape, dtype):
    """torch.nn.Linear's default: U(-1/√fan_in, 1/√fan_in) (kaiming_uniform with a=√5)."""
    return uniform(rng, shape, 1.0 / math.sqrt(shape[-1]), dtype)
