"""Batching helpers shared by the tasks: length buckets, metrics from one forward pass, eval mode."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .base import IGNORE


class LengthBuckets:
    """Training examples grouped by length, to batch similar lengths together and limit padding.

    The examples are sorted by length and cut into ``n_buckets`` groups of
    (nearly) equal size. ``sample(batch_size, rng)`` draws a bucket with
    probability proportional to its size, then ``batch_size`` examples from it
    uniformly with replacement, so every example is equally likely overall and
    a batch depends only on ``rng``. ``n_buckets = 1`` is plain uniform sampling.
    """

    def __init__(self, lengths, n_buckets: int = 1):
        lengths = np.asarray(lengths)
        if lengths.size == 0:
            raise ValueError("no training examples to batch")
        n_buckets = max(1, min(int(n_buckets), lengths.size))
        order = np.argsort(lengths, kind="stable")
        self.buckets = [b for b in np.array_split(order, n_buckets) if b.size]
        sizes = np.array([b.size for b in self.buckets], dtype=np.float64)
        self.probs = sizes / sizes.sum()

    def sample(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        b = self.buckets[int(rng.choice(len(self.buckets), p=self.probs))] if len(self.buckets) > 1 else self.buckets[0]
        return b[rng.integers(0, b.size, size=batch_size)]


def eval_order(lengths, batch_size: int) -> list[np.ndarray]:
    """Fixed evaluation batches: indices sorted by length (stable), cut into consecutive chunks."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[i:i + batch_size] for i in range(0, order.size, batch_size)]


def sequence_metrics(logits, targets):
    """Per-example exact match and token counts from ONE teacher-forced forward pass.

    logits: (B, T, V); targets: (B, T) with IGNORE outside the answer.
    Returns (exact (B,) bool, n_correct_tokens, n_answer_tokens).

    exact[b] is True iff argmax(logits[b, t]) == targets[b, t] at every answer
    position t. This equals the exact match of greedy decoding: greedy decoding
    feeds back its own argmax, so if every teacher-forced argmax is right, each
    greedy step sees exactly the teacher-forced prefix and reproduces the target
    token by token; and at the first position where a teacher-forced argmax is
    wrong, greedy decoding (which saw the same correct prefix up to there) emits
    that same wrong token. So one forward pass gives the greedy exact match
    without a decoding loop.
    """
    pred = np.asarray(logits).argmax(axis=-1)
    targets = np.asarray(targets)
    answer = targets != IGNORE
    hit = pred == targets
    exact = np.all(hit | ~answer, axis=1)
    return exact, int(np.sum(hit & answer)), int(np.sum(answer))


@contextmanager
def eval_mode(model):
    """Put the model in eval mode (no dropout) and restore its mode and free its caches afterwards."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        yield model
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
        if hasattr(model, "clear_cache"):
            model.clear_cache()
