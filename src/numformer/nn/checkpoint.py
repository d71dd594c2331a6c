"""Gradient (activation) checkpointing per block (Chen et al. 2016, "Training deep nets with sublinear memory").

A checkpointed block keeps only its inputs during the forward pass; its
backward pass runs the forward again (now keeping the caches) and then the
ordinary backward. Activation memory of an L-block stack drops from L blocks'
activations to L block inputs plus one block's activations, for about one
extra forward pass of compute.

Dropout: the blocks draw their masks from ``numpy.random.Generator``s. Before
the first forward the state of every generator the block uses is saved; the
recomputation replays it, so the masks (hence the gradients) are bit for bit
those of the ordinary path, and the generators are then put back in the
state they had, so later draws are unchanged too.

    out = checkpoint_forward(block, x, attn_mask=m)     # keeps x, m and the generator states only
    dx = checkpoint_backward(block, dout)               # recompute, then block.backward(dout)

``checkpoint_backward`` falls back to ``block.backward`` when the block was not
run through ``checkpoint_forward``, so a stack can call it unconditionally.

This trades compute for memory and changes no result: the reference is the
block's own ``forward`` / ``backward``, and tests/test_checkpointing.py checks
that the gradients are identical with and without it.
"""
from __future__ import annotations

import numpy as np

_STATE = "_checkpoint"


def generators(module):
    """The distinct ``numpy.random.Generator``s held by ``module`` and its sub-modules (dropout, attention)."""
    found = {}
    for m in module.modules():
        for value in vars(m).values():
            if isinstance(value, np.random.Generator):
                found.setdefault(id(value), value)
    return list(found.values())


def checkpoint_forward(module, *args, **kwargs):
    """Run ``module(*args, **kwargs)`` and drop its caches, keeping what is needed to recompute them."""
    gens = generators(module)
    states = [g.bit_generator.state for g in gens]
    out = module(*args, **kwargs)
    module.clear_cache()
    object.__setattr__(module, _STATE, (args, kwargs, gens, states))
    return out


def recompute(module):
    """Re-run the forward pass saved by ``checkpoint_forward`` with the same dropout masks (caches kept)."""
    saved = module.__dict__.get(_STATE)
    if saved is None:
        raise RuntimeError(f"{type(module).__name__}: nothing to recompute (run checkpoint_forward first)")
    args, kwargs, gens, states = saved
    after = [g.bit_generator.state for g in gens]
    try:
        for g, s in zip(gens, states):
            g.bit_generator.state = s
        module(*args, **kwargs)
    finally:
        for g, s in zip(gens, after):
            g.bit_generator.state = s
    object.__setattr__(module, _STATE, None)


def run(module, enabled, *args, **kwargs):
    """``checkpoint_forward`` if ``enabled``, else an ordinary call (forgetting any stale checkpoint)."""
    if enabled:
        return checkpoint_forward(module, *args, **kwargs)
    if module.__dict__.get(_STATE) is not None:
        object.__setattr__(module, _STATE, None)
    return module(*args, **kwargs)


def checkpoint_backward(module, dout):
    """Backward of a block run by ``checkpoint_forward`` (recomputes first); else plain ``module.backward``."""
    if module.__dict__.get(_STATE) is not None:
        recompute(module)
    return module.backward(dout)


def is_checkpointed(module):
    """True between checkpoint_forward and checkpoint_backward."""
    return module.__dict__.get(_STATE) is not None


__all__ = ["run", "checkpoint_forward", "checkpoint_backward", "recompute", "generators", "is_checkpointed"]
