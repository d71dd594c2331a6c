"""Floating-point operations of a model per token, for model FLOPs utilization (MFU).

A product of a (1, n) row by an (n, m) matrix is 2·n·m operations (a multiply and an add each). Per token,
the forward pass of a decoder costs

    2 · (n_in · n_out)   for every linear layer (the attention projections, the feed-forward, the output head)
    2 · T · d_attn       for the scores q·kᵀ of each attention layer, and as much for the weighted sum of v

with T the context length and d_attn = n_heads · d_head. Training costs three forward passes (the backward
pass computes two products per forward product: the gradient of the input and of the weight). This is the
convention of the PaLM paper (appendix B) and nanoGPT's ``estimate_mfu``: attention counts the full T × T
square, masked half included, as the kernels compute it; embedding lookups, norms, activations and the
optimizer count nothing.
"""
from __future__ import annotations


def forward_flops_per_token(model, context):
    """Operations of one token's forward pass through ``model`` with ``context`` tokens of attention span: what
    each of its modules answers (``Module.flops_per_token``: a linear layer its product, an attention layer
    its scores and weighted sum)."""
    return sum(module.flops_per_token(context) for _, module in model.named_modules())


def training_flops_per_token(model, context):
    """Operations of one token's training step (forward and backward): 3 × the forward pass."""
    return 3 * forward_flops_per_token(model, context)
