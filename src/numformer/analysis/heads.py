"""What each attention head of a GPT does, scored on repeated random tokens (Olsson et al. 2022).

    scores = head_scores(model, seq_len=50, batch=8, rng=0)
    scores.induction            # (L, H): attention from a token's second occurrence to the token after its first
    scores.plot(path="heads.png")

A sequence of ``seq_len`` random tokens (distinct where the vocabulary allows) followed by the same tokens
again, x = [r, r]: in the second half the token at position i appeared before at i - seq_len, and only there.
Each score is an average attention weight, 0 to 1, over the batch and the query positions:

- previous-token: from every position i ≥ 1 to i - 1 (the first half and the second);
- duplicate-token: from i in the second half to i - seq_len (the earlier copy of the same token);
- induction (prefix matching): from i in the second half to i - seq_len + 1 (the token that followed the
  earlier copy: what an induction head attends to, to predict it comes next again).

Random tokens carry no meaning the model could use otherwise, so a head that attends there does it by
matching tokens, or by position alone: the repeat comes at the fixed distance ``seq_len``, so a head that
attends ``seq_len - 1`` back scores high on induction without matching anything (a model trained on such
repeats learns that shortcut). ``in_context_score`` is Olsson et al.'s measure of in-context learning on
real text, turned so that positive is good: the loss at an early position minus the mean loss at late
positions (nats).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from ._common import eval_mode
from .lens import plot_layer_head
from ..models import GPT

SCORES = ("previous_token", "duplicate_token", "induction")


def repeated_random_tokens(vocab_size, seq_len, batch=1, rng=None, low=0):
    """(batch, 2·seq_len) int64: random tokens in [low, vocab_size), then the same tokens again.

    Each row's seq_len tokens are distinct when the vocabulary has that many (drawn without replacement), so
    every token of the second half has exactly one earlier occurrence: with a small vocabulary (characters)
    tokens drawn with replacement would repeat inside the first half, and a perfect induction head would
    split its attention among the tokens after each earlier occurrence (a score near 0.6, not 1, for 40
    tokens of 65)."""
    rng = np.random.default_rng(rng)
    if seq_len <= vocab_size - low:
        first = np.stack([rng.permutation(np.arange(low, vocab_size))[:seq_len] for _ in range(batch)])
    else:
        first = rng.integers(low, vocab_size, (batch, seq_len))
    return np.concatenate([first, first], axis=1)


@dataclass
class HeadScores:
    """previous_token, duplicate_token, induction: (L, H) each, mean attention weights in [0, 1]."""
    previous_token: np.ndarray
    duplicate_token: np.ndarray
    induction: np.ndarray

    def as_dict(self):
        """{score name: (L, H)} in the order of ``SCORES``."""
        return {name: getattr(self, name) for name in SCORES}

    def top(self, score="induction", k=3):
        """The k (layer, head) pairs with the highest ``score``, best first."""
        v = getattr(self, _score_name(score))
        order = np.argsort(-v, axis=None, kind="stable")[:k]
        return [tuple(int(i) for i in np.unravel_index(j, v.shape)) for j in order]

    def plot(self, score="induction", path=None, title=None, dpi=100):
        """Layer × head heatmap of one score (0 to 1); returns the Figure (a PNG at ``path`` when given)."""
        return plot_layer_head(getattr(self, _score_name(score)), f"{score.replace('_', '-')} score", path,
                               title or f"{score.replace('_', '-')} score of each head", dpi, vmin=0.0, vmax=1.0)


def _score_name(score):
    """``score`` if it is one of ``SCORES``; one ValueError naming them otherwise."""
    if score not in SCORES:
        close = difflib.get_close_matches(str(score), SCORES, n=1)
        raise ValueError(f"no head score {score!r}; the scores are {', '.join(SCORES)}"
                         + (f" (did you mean {close[0]!r}?)" if close else ""))
    return score


def scores_from_patterns(patterns, seq_len):
    """``HeadScores`` from attention patterns (L, B, H, 2·seq_len, 2·seq_len) on repeated tokens [r, r]."""
    p = np.asarray(patterns, dtype=np.float64)
    if p.shape[-1] != 2 * seq_len or p.shape[-2] != 2 * seq_len:
        raise ValueError(f"patterns over 2 x seq_len = {2 * seq_len} positions expected, got shape {p.shape}")

    def mean_diagonal(offset, rows):          # mean of p[..., i, i - offset] over the query positions ``rows``
        return p[..., rows, rows - offset].mean(axis=(1, 3))

    second = np.arange(seq_len, 2 * seq_len)
    return HeadScores(previous_token=mean_diagonal(1, np.arange(1, 2 * seq_len)),
                      duplicate_token=mean_diagonal(seq_len, second),
                      induction=mean_diagonal(seq_len - 1, second))


def head_scores(model, seq_len=50, batch=8, rng=0, low=0):
    """The ``HeadScores`` of a GPT on ``batch`` sequences of ``seq_len`` repeated random tokens in
    [low, vocab_size) (``low`` skips special tokens at the start of the vocabulary; ``rng``: a seed or a
    Generator), in eval mode. A model with a position table must hold 2·seq_len positions."""
    if not isinstance(model, GPT):
        raise ValueError(f"head scores read a decoder's attention on repeated tokens; got a {type(model).__name__}")
    if getattr(model, "pos_emb", None) is not None and 2 * seq_len > model.block_size:
        raise ValueError(f"head_scores runs 2 x seq_len = {2 * seq_len} tokens but the model's position table "
                         f"holds {model.block_size}; pass seq_len <= {model.block_size // 2}")
    for what, value, least in (("seq_len", seq_len, 2), ("batch", batch, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{what} must be an integer >= {least}, got {value!r}" + (
                " (with one token repeated, the induction target is the current position itself)"
                if what == "seq_len" and value == 1 else ""))
    ids = repeated_random_tokens(model.vocab_size, seq_len, batch, rng, low)
    with eval_mode(model):
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n.endswith("attn.hook_pattern"))
        model.clear_cache()
    return scores_from_patterns(np.stack([cache["pattern", layer] for layer in range(model.n_layers)]), seq_len)


def per_window_loss(model, ids, batch_size=16):
    """(B, T - 1) cross-entropy (nats, float64) of predicting ids[:, t + 1] at each position t of each row of
    ids (B, T), computed in batches of ``batch_size`` rows."""
    ids = np.asarray(ids)
    rows = []
    with eval_mode(model):
        for start in range(0, len(ids), batch_size):
            x = ids[start:start + batch_size]
            logits = np.asarray(model(x[:, :-1]), dtype=np.float64)
            model.clear_cache()
            top = logits.max(axis=-1, keepdims=True)
            log_z = top[..., 0] + np.log(np.exp(logits - top).sum(axis=-1))
            rows.append(log_z - np.take_along_axis(logits, x[:, 1:, None], axis=-1)[..., 0])
    return np.concatenate(rows) if rows else np.zeros((0, ids.shape[1] - 1))


def per_position_loss(model, ids, batch_size=16):
    """(T - 1,) mean cross-entropy (nats) of predicting ids[:, t + 1] at each position t, over the rows of ids
    (B, T): ``per_window_loss`` averaged over the rows."""
    return per_window_loss(model, ids, batch_size).mean(axis=0)


def in_context_score(losses, early=50, late=(200, 256)):
    """The mean loss at the early positions minus the mean loss over positions [late[0], late[1]) (nats;
    positive when the context helps); the negative of Olsson et al.'s in-context learning score.

    losses: (T - 1,) per-position losses (``per_position_loss``), or (B, T - 1) of B windows
    (``per_window_loss``: a score per window, whose mean is the score of the mean losses and whose spread
    gives its standard error). early: a position, or a range (start, stop) of positions.
    """
    losses = np.asarray(losses)
    start, stop = (early, early + 1) if np.ndim(early) == 0 else early
    if late[1] > losses.shape[-1]:
        raise ValueError(f"late positions up to {late[1]} need a context of at least {late[1] + 1} tokens, "
                         f"got losses for {losses.shape[-1]} positions")
    if not 0 <= start < stop <= late[0]:
        raise ValueError(f"the early positions [{start}, {stop}) must come before the late ones from {late[0]}")
    score = losses[..., start:stop].mean(axis=-1) - losses[..., late[0]:late[1]].mean(axis=-1)
    return float(score) if np.ndim(score) == 0 else score


__all__ = ["HeadScores", "SCORES", "head_scores", "repeated_random_tokens", "scores_from_patterns",
           "per_position_loss", "per_window_loss", "in_context_score"]
