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

from ..nn.attention import MultiHeadAttention
from ..nn.layers import Linear


def forward_flops_per_token(model, context):
    """Operations of one token's forward pass through ``model`` with ``context`` tokens of attention span."""
    total = 0
    for _, module in model.named_modules():
        if isinstance(module, Linear):
            n_out, n_in = module.weight.shape
            total += 2 * n_in * n_out
        elif isinstance(module, MultiHeadAttention):
            total += 2 * 2 * context * module.n_heads * module.d_head
    return total


def training_flops_per_token(model, context):
    """Operations of one token's training step (forward and backward): 3 × the forward pass."""
    return 3 * forward_flops_per_token(model, context)
