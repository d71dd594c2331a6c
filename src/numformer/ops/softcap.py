"""Logit soft-capping (Gemma 2; Bello et al. 2016 used it on pointer logits):

    softcap(x) = c · tanh(x / c)

A smooth clamp into (-c, c): close to the identity for |x| ≪ c, flat beyond. Gemma 2 applies it to the
attention scores (after the 1/√d scale, before the mask: c = ``attn_logit_softcap``) and to the output
logits (c = ``final_logit_softcap``). With t = tanh(x / c) the derivative is 1 - t², so

    dx = dy ⊙ (1 - t²)
"""
from __future__ import annotations

import numpy as np


def softcap_forward(x, cap):
    """y = cap · tanh(x / cap), elementwise; x any shape, cap > 0. Returns (y, cache); the cache is t = y / cap.

    -inf (a masked score) maps to -cap; apply the mask after the cap, as Gemma 2 does.
    """
    c = np.asarray(cap, dtype=x.dtype)
    t = np.tanh(x / c)
    return c * t, t


def softcap_backward(dy, cache):
    """dx = dy ⊙ (1 - t²), t = tanh(x / cap) from the forward pass."""
    t = cache
    return dy * (1 - t * t)
