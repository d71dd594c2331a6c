"""Sequence log-probabilities and the DPO loss (Rafailov et al. 2023, "Direct Preference Optimization").

DPO fine-tunes a policy π on pairs (x, y_w, y_l), y_w preferred to y_l, against a frozen reference π_ref
(the model before DPO), with no reward model: the implicit reward of a response is
r(x, y) = β (log π(y|x) - log π_ref(y|x)), and the loss is the logistic loss of the reward margin,

    z = β [(log π(y_w|x) - log π_ref(y_w|x)) - (log π(y_l|x) - log π_ref(y_l|x))]
    L = mean_pairs( -log σ(z) )

With dL/dz = -σ(-z) / N the gradients reach the policy's log-probabilities only (the reference is a
constant): dL/d log π(y_w|x) = -β σ(-z) / N and dL/d log π(y_l|x) = +β σ(-z) / N. A sequence's
log-probability is a sum over its response tokens, log π(y|x) = Σ_t log softmax(ℓ_t)[y_t] (ℓ_t the logits at
t), whose gradient with respect to the logits is onehot(y_t) - softmax(ℓ_t) on the counted positions.
"""
from __future__ import annotations

import numpy as np

from ._checks import with_features


def sequence_logprob_forward(logits, labels, ignore_index=-100):
    """Σ_t log softmax(logits[b, t])[labels[b, t]] over the positions whose label is not ``ignore_index``.

    logits: (B, T, V)   labels: (B, T) integers, already aligned with the logits (labels[b, t] is the token
    that logits[b, t] predicts)   ->   (logp, cache), logp (B,) one log-probability per sequence
    """
    logits = with_features(logits, "sequence_logprob", "(B, T, V)")
    if logits.ndim != 3:
        raise ValueError(f"sequence_logprob expects logits of shape (B, T, V), got shape {logits.shape}")
    labels = np.asarray(labels)
    if labels.shape != logits.shape[:2] or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"sequence_logprob expects integer labels of shape (B, T) = {logits.shape[:2]}, one per "
                         f"position of the logits, got {labels.dtype} labels of shape {labels.shape}")
    valid = labels != ignore_index                                      # (B, T)
    safe = np.where(valid, labels, 0)
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=-1, keepdims=True)
    logp = (logits - m - np.log(s))                                     # (B, T, V) log softmax
    token_logp = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]     # (B, T)
    return np.where(valid, token_logp, 0).sum(axis=1), (e / s, safe, valid)


def sequence_logprob_backward(dlogp, cache):
    """dlogits[b, t] = dlogp[b] · (onehot(labels[b, t]) - softmax(logits[b, t])) where counted, else 0.

    dlogp: (B,)   ->   dlogits: (B, T, V)
    """
    probs, safe, valid = cache
    g = -probs                                                          # (B, T, V)
    np.put_along_axis(g, safe[..., None], np.take_along_axis(g, safe[..., None], axis=-1) + 1, axis=-1)
    return g * (valid * dlogp[:, None])[..., None].astype(g.dtype)


def dpo_loss_forward(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
    """The DPO loss, mean over pairs, and the cache (z, β, N); z > 0 where the implicit reward prefers y_w.

    each argument: (N,) sequence log-probabilities   beta: float > 0   ->   scalar loss

    z = β [(π_w - ref_w) - (π_l - ref_l)]      L = mean(-log σ(z)) = mean(log(1 + e^{-z})), stably
    """
    policy_chosen, policy_rejected, reference_chosen, reference_rejected = (
        np.asarray(a) for a in (policy_chosen, policy_rejected, reference_chosen, reference_rejected))
    shapes = [a.shape for a in (policy_chosen, policy_rejected, reference_chosen, reference_rejected)]
    if any(len(shape) != 1 for shape in shapes) or len(set(shapes)) != 1:
        raise ValueError(f"dpo_loss expects four (N,) arrays of sequence log-probabilities, one per pair, got "
                         f"shapes {', '.join(map(str, shapes))}")
    z = beta * ((policy_chosen - reference_chosen) - (policy_rejected - reference_rejected))
    loss = float(np.mean(np.logaddexp(0.0, -z)))
    return loss, (z, beta, z.shape[0])


def dpo_loss_backward(cache, dloss=1.0):
    """(d policy_chosen, d policy_rejected) = (-β σ(-z), +β σ(-z)) · dloss / N, each (N,); the reference gets none.

    cache first, then dloss (the gradient of the scalar loss, default 1).
    """
    z, beta, n = cache
    dz = -dloss * _sigmoid(-z) / n
    return beta * dz, -beta * dz


def dpo_reward_accuracy(cache):
    """The share of pairs whose implicit reward prefers the chosen response (z > 0)."""
    return float(np.mean(cache[0] > 0))


def _sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))
