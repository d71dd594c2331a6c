"""The training step: forward, loss, backward, as a reader of nanoGPT's train.py looks for it.

    loss = loss_and_backward(model, batch.inputs, batch.targets)   # gradients now in p.grad
    clip_grad_norm(optimizer.params, 1.0)
    optimizer.step(); optimizer.zero_grad()

The trainer calls ``loss_and_backward`` on each micro-batch (``grad_accum`` of them per update, with
grad_scale = 1 / grad_accum) when it trains in one process; data parallelism (``train/parallel.py``) calls it
on each process's share of a micro-batch, scaling each share's gradient so that the shares add up to the
gradient of the whole micro-batch's mean loss.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..data.base import IGNORE


def loss_and_backward(model, inputs, targets, label_smoothing=0.0, grad_scale=1.0):
    """Forward, cross-entropy and backward of one batch; returns the loss (a float).

    inputs:  the model's keyword arguments, e.g. {"idx": (B, T)} for a GPT.
    targets: integer ids of the shape of ``logits[..., 0]``; positions equal to IGNORE are left out.

    loss = mean over the counted targets of -log softmax(logits)[target] (with label smoothing ε:
    (1 - ε) times that plus ε times the mean over classes of -log softmax). The backward pass starts
    from dloss = grad_scale and accumulates into every parameter's ``.grad`` (grad_scale = 1 / grad_accum
    when gradients of several micro-batches are summed).
    """
    # overflow is not warned about: the trainer checks the loss and the gradient norm and stops with one line
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        logits = model(**inputs)
        loss, cache = ops.cross_entropy_forward(logits, targets, ignore_index=IGNORE,
                                                label_smoothing=label_smoothing)
        model.backward(ops.cross_entropy_backward(cache, grad_scale))
    return float(loss)


def dpo_loss_and_backward(model, batch, beta, grad_scale=1.0):
    """Forward, DPO loss and backward of a batch of N preference pairs; returns the loss (a float).

    batch: 2N rows (the chosen replies, then the rejected ones; targets -100 outside the replies) and
    ``batch.extra["reference"]``, the reference model's log-probability of each row (computed once).

    log π(y|x) = Σ over the reply's tokens of log softmax(logits)[token] (``ops.sequence_logprob_forward``);
    loss = mean over pairs of -log σ(β [(log π(y_w|x) - log π_ref(y_w|x)) - (log π(y_l|x) - log π_ref(y_l|x))])
    (``ops.dpo_loss_forward``); its gradient flows back through the policy's log-probabilities only.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        logits = model(**batch.inputs)
        logp, lp_cache = ops.sequence_logprob_forward(logits, batch.targets, ignore_index=IGNORE)
        n, ref = len(logp) // 2, batch.extra["reference"]
        loss, cache = ops.dpo_loss_forward(logp[:n], logp[n:], ref[:n], ref[n:], beta)
        d_chosen, d_rejected = ops.dpo_loss_backward(cache, grad_scale)
        dlogits = ops.sequence_logprob_backward(np.concatenate([d_chosen, d_rejected]), lp_cache)
        model.backward(dlogits.astype(logits.dtype, copy=False))
    return float(loss)
