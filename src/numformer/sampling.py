"""Sampling the next token: logits processors and ``sample_next``.

Logits processors (on (..., V) logits, NumPy), with the semantics of Hugging Face
transformers' ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``,
applied in that order (temperature, then top-k, then top-p)::

    apply_temperature(logits, T)     logits / T                                     (T > 0)
    top_k_filter(logits, k)          keep the k largest logits; ties with the k-th are kept too
    top_p_filter(logits, p)          keep the smallest set of most probable tokens whose probability
                                     reaches p (at least one token, ties with the last kept one too);
                                     the rest become -inf
    warp_logits(logits, T, k, p)     the three in that order, in float64
    next_token_probabilities(logits, T, k, p)   softmax of the warped logits: what sample_next draws from
                                     (computed from (logits - max) / T: see "probabilities" below)
    sample_next(logits, rng=None, temperature=1.0, top_k=None, top_p=None, greedy=False) -> token ids

The equations, for one row z = (z_1 … z_V) of a processor's input (V: the vocabulary size; each processor
takes the previous one's output), with π = softmax(z)::

    temperature T        z_i / T  for T > 0; T = 0 is greedy: argmax_i z_i (the first index among ties)
    top-k, k >= 1        z_i kept if z_i >= z_(k), the k-th largest logit, else -inf (k >= V keeps all)
    top-p, 0 < p <= 1    sort the tokens by decreasing π (ties: lower id first); the token of rank r is
                         removed when π_(1) + … + π_(r-1) >= p - TOP_P_TOL (rank 1 is always kept);
                         then every token whose logit equals the smallest kept logit is kept too
                         (p = 1 keeps all)
    sampling             one draw from softmax(z'), z' the logits after temperature, top-k and top-p
    probabilities        next_token_probabilities scales z as (z - max_j z_j) / T before top-k, top-p and the
                         softmax: the same distribution as from z / T, since a constant added to a row changes
                         neither the filters nor the softmax, but every exponent is <= 0, so exp cannot overflow;
                         as T -> 0 it tends to the one-hot of the argmax (tied maxima share it equally) instead
                         of z / T overflowing to inf and inf / inf = NaN
    infinite logits      a +inf logit is certain: the +inf logits of a row share its probability equally and
                         every other token gets 0 (torch's softmax gives NaN there); a -inf logit has
                         probability 0 and is never sampled. NaN logits are a ValueError (``sample_next``,
                         ``next_token_probabilities``), and so is a row entirely -inf in ``sample_next``
    length penalty       beam search (``numformer.decoding.beam_search``) scores a finished hypothesis
                         y_1 … y_L of a source x as (Σ_t log p(y_t | y_<t, x)) / L ** α, where
                         α = length_penalty and L counts the generated tokens, eos included (bos not)

The decoders that use them are in ``numformer.decoding``.
"""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter", "warp_logits", "next_token_probabilities",
           "sample_next", "TOP_P_TOL"]

# Top-p compares cumulative probabilities (float64) with p; a set whose mass equals p up to this
# rounding error counts as reaching p, so the boundary case "cumulative probability == p" is exact.
TOP_P_TOL = 1e-12


# -- argument checks ---------------------------------------------------------------
def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_temperature(temperature):
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool) or not temperature >= 0 \
            or not np.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")


def _check_top_k(top_k):
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None (no top-k filtering), got {top_k!r}")


def _check_top_p(top_p):
    if top_p is not None and (not isinstance(top_p, numbers.Real) or isinstance(top_p, bool)
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None (no nucleus filtering), got {top_p!r}")


def _check_sampling(temperature, top_k, top_p):
    _check_temperature(temperature)
    _check_top_k(top_k)
    _check_top_p(top_p)


def _as_rng(rng):
    if rng is None or _is_int(rng):
        return np.random.default_rng(rng)
    if isinstance(rng, np.random.Generator):
        return rng
    raise ValueError(f"rng must be a numpy.random.Generator, an integer seed or None, got {type(rng).__name__}")


def _check_logits(logits):
    logits = np.asarray(logits)
    if logits.ndim < 1 or logits.shape[-1] == 0 or not np.issubdtype(logits.dtype, np.floating):
        raise ValueError(f"logits must be a float array of shape (..., vocab_size), got {logits.dtype} "
                         f"{logits.shape}")
    return logits


# -- logits processors -----------------------------------------------------------------
def apply_temperature(logits, temperature):
    """logits / temperature (HF ``TemperatureLogitsWarper``), in the logits' dtype; temperature must be > 0
    (0 is a ValueError here; ``sample_next`` and ``next_token_probabilities`` treat 0 as greedy: argmax).
    """
    logits = _check_logits(logits)
    _check_temperature(temperature)
    if temperature == 0:
        raise ValueError("temperature 0 cannot scale logits; use greedy=True (argmax) or sample_next(temperature=0)")
    return logits / np.asarray(temperature, logits.dtype)


def top_k_filter(logits, k, filter_value=-np.inf, min_tokens_to_keep=1):
    """Keep the k largest logits of each row and set the others to ``filter_value`` (default -inf; HF
    ``TopKLogitsWarper``). Returns a new array of the logits' shape and dtype.

    k None or larger than the vocabulary keeps everything; k is raised to ``min_tokens_to_keep``
    (default 1). As HF, a token is removed only if its logit is strictly below the k-th largest,
    so tokens tied with the k-th are all kept (exactly k survive when the logits are distinct).
    """
    logits = _check_logits(logits)
    _check_top_k(k)
    if k is None:
        return logits.copy()
    V = logits.shape[-1]
    k = min(max(int(k), int(min_tokens_to_keep)), V)
    kth = np.partition(logits, V - k, axis=-1)[..., V - k:V - k + 1]
    return np.where(logits < kth, np.asarray(filter_value, logits.dtype), logits)


def _minus_max(x):
    """z - max_j z_j over the last axis, in float64: each row's largest logit becomes 0 and the others are
    negative, so exp cannot overflow, and the softmax is unchanged. Infinite logits (module docstring): in a row
    holding +inf, the +inf logits become 0 and all others -inf (+inf is certain, ties share); -inf stays -inf,
    and a row entirely -inf stays so (no token is possible)."""
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(over="ignore"):            # a difference below -1.8e308 is -inf: probability 0, its limit
        shifted = x - np.where(np.isfinite(m), m, 0.0)
    return np.where(m == np.inf, np.where(x == np.inf, 0.0, -np.inf), shifted)


def _softmax64(x):
    """Stable softmax in float64 over the last axis, exp(z - max z) / Σ exp(z - max z); +inf logits share the
    probability equally, an all -inf row gives zeros."""
    e = np.exp(_minus_max(x))
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def _log_softmax64(x):
    z = _minus_max(x)
    with np.errstate(divide="ignore"):
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _scaled_logits(logits, temperature):
    """(z - max z) / T in float64 (temperature T > 0): logits / T up to a constant per row, hence the same
    softmax, but never +inf or NaN however small T is: see "probabilities" in the module docstring."""
    with np.errstate(over="ignore"):            # below -1.8e308 is -inf: probability 0, the limit as T -> 0
        return _minus_max(logits) / temperature


def top_p_filter(logits, p, filter_value=-np.inf, min_tokens_to_keep=1):
    """Nucleus filtering (HF ``TopPLogitsWarper``): keep the smallest set of most probable tokens
    whose cumulative probability reaches p; set the others to ``filter_value`` (default -inf).
    Returns a new array of the logits' shape and dtype.

    Sorted by decreasing probability, token i is removed when the tokens before it already
    hold probability >= p (so a set summing to exactly p is complete; probabilities are
    computed in float64 and compared with a tolerance of ``TOP_P_TOL``). At least
    ``min_tokens_to_keep`` (default 1) tokens are kept, so a top token with probability
    of p or more is kept alone (with the tokens tied with it). p None or 1 keeps every token
    (HF's generate skips the warper then).
    Ties: a token whose logit equals the smallest kept logit is kept too (HF leaves the choice
    among tied tokens to its sort order; keeping all of them makes the result independent of
    token order, as HF's top-k is).
    """
    logits = _check_logits(logits)
    _check_top_p(p)
    if p is None or p == 1:
        return logits.copy()
    x = logits.astype(np.float64)
    order = np.argsort(-x, axis=-1, kind="stable")
    sorted_x = np.take_along_axis(x, order, axis=-1)
    probs = _softmax64(sorted_x)
    cum_before = np.zeros_like(probs)                               # probability of the tokens before i
    np.cumsum(probs[..., :-1], axis=-1, out=cum_before[..., 1:])
    remove = cum_before >= p - TOP_P_TOL
    remove[..., :int(min_tokens_to_keep)] = False
    n_keep = (~remove).sum(axis=-1, keepdims=True)
    threshold = np.take_along_axis(sorted_x, n_keep - 1, axis=-1)   # smallest kept logit
    return np.where(x < threshold, np.asarray(filter_value, logits.dtype), logits)


def _top_k_top_p(x, top_k, top_p):
    if top_k is not None:
        x = top_k_filter(x, top_k)
    if top_p is not None:
        x = top_p_filter(x, top_p)
    return x


def warp_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """Temperature, then top-k, then top-p: float64 logits (..., V), -inf where a token is filtered out, the
    values Hugging Face's warpers give; the softmax of the result is the distribution ``sample_next`` samples
    from (for a temperature so small that logits / T overflows, only ``next_token_probabilities`` computes it).
    Defaults: temperature 1, no top-k, no top-p. temperature must be > 0 here (0, greedy, is a ValueError: see
    ``sample_next``)."""
    _check_sampling(temperature, top_k, top_p)
    x = _check_logits(logits).astype(np.float64)
    if temperature != 1:
        x = apply_temperature(x, temperature)
    return _top_k_top_p(x, top_k, top_p)


def _check_no_nan(logits):
    if np.isnan(logits).any():
        raise ValueError("the logits hold NaN: the model's output is broken (a diverged run?); no token can be "
                         "chosen")


def next_token_probabilities(logits, temperature=1.0, top_k=None, top_p=None):
    """The distribution ``sample_next`` draws from, float64 (..., V): softmax(warp_logits(logits, temperature,
    top_k, top_p)), computed as the softmax of (logits - max) / T after top-k and top-p (the same distribution,
    without overflow for any T > 0; +inf logits share the probability: see the module docstring). Temperature 0
    (greedy) puts all the mass on the argmax (the first index among ties). NaN logits are a ValueError; a row
    entirely -inf gives zeros."""
    logits = _check_logits(logits)
    _check_sampling(temperature, top_k, top_p)
    _check_no_nan(logits)
    if temperature == 0:
        return (np.arange(logits.shape[-1]) == np.argmax(logits, axis=-1)[..., None]).astype(np.float64)
    return _softmax64(_top_k_top_p(_scaled_logits(logits, temperature), top_k, top_p))


def sample_next(logits, rng=None, temperature=1.0, top_k=None, top_p=None, greedy=False):
    """Next token ids from logits (..., V) -> int64 array (...) (a NumPy int64 scalar for 1-D logits).

    greedy=True or temperature=0: argmax (the first index among ties). Otherwise one draw
    from softmax(warp_logits(logits, temperature, top_k, top_p)) per row, by inverse CDF with
    one ``rng.random()`` number per row, so a fixed seed repeats the same tokens.
    rng: a numpy.random.Generator (or an integer seed; None, the default, draws fresh entropy).
    A -inf logit is never drawn; a +inf logit is certain (several share the probability equally); a temperature
    near 0 gives the argmax (module docstring). Logits holding NaN, or a row that is entirely -inf, are a ValueError.
    """
    logits = _check_logits(logits)
    _check_sampling(temperature, top_k, top_p)
    _check_no_nan(logits)
    if (logits == -np.inf).all(axis=-1).any():
        raise ValueError("a row of logits is entirely -inf: every token is excluded, so none can be chosen")
    if greedy or temperature == 0:
        return np.argmax(logits, axis=-1).astype(np.int64)
    rng = _as_rng(rng)
    probs = next_token_probabilities(logits, temperature, top_k, top_p)
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(cdf.shape[:-1]) * cdf[..., -1]
    # the first index whose cdf exceeds u: never a zero-probability token
    idx = (cdf <= u[..., None]).sum(axis=-1)
    return np.minimum(idx, logits.shape[-1] - 1).astype(np.int64)
