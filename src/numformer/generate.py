"""Sampling and decoding: logits processors, GPT generation, encoder-decoder greedy/sampling/beam search.

Logits processors (on (..., V) logits, NumPy), with the semantics of Hugging Face
transformers' ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``,
applied in that order (temperature, then top-k, then top-p)::

    apply_temperature(logits, T)     logits / T                                     (T > 0)
    top_k_filter(logits, k)          keep the k largest logits; ties with the k-th are kept too
    top_p_filter(logits, p)          keep the smallest set of most probable tokens whose probability
                                     reaches p (at least one token); the rest become -inf
    sample_next(logits, rng, temperature=1.0, top_k=None, top_p=None, greedy=False) -> token ids

Decoder-only (GPT)::

    generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, greedy=False,
             rng=None, use_cache=True, stream=None, shift=None, return_logits=False, attention_mask=None)

incremental decoding with the key/value cache; past the context length the window slides
(see ``generate``), identically with and without the cache.

Encoder-decoder (Transformer)::

    greedy_decode(model, src, max_length, bos_id, eos_id)
    sample_decode(model, src, max_length, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None, rng=None)
    beam_search(model, src, beam_size, max_length, bos_id, eos_id, length_penalty=1.0, early_stopping=False)

all with the decoder's key/value caches (``use_cache=False`` recomputes every step, for checks).
They return token-id lists without bos and eos.

Everything runs with the model in eval mode (dropout off); the previous mode is restored.
"""
from __future__ import annotations

import contextlib
import numbers

import numpy as np

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter", "warp_logits", "sample_next", "generate",
           "greedy_decode", "sample_decode", "beam_search"]

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
    """logits / temperature (HF ``TemperatureLogitsWarper``); temperature must be > 0.

    (``sample_next`` treats temperature 0 as greedy: argmax.)
    """
    logits = _check_logits(logits)
    _check_temperature(temperature)
    if temperature == 0:
        raise ValueError("temperature 0 cannot scale logits; use greedy=True (argmax) or sample_next(temperature=0)")
    return logits / np.asarray(temperature, logits.dtype)


def top_k_filter(logits, k, filter_value=-np.inf, min_tokens_to_keep=1):
    """Keep the k largest logits of each row and set the others to ``filter_value`` (HF ``TopKLogitsWarper``).

    k larger than the vocabulary keeps everything. As HF, a token is removed only if its logit
    is strictly below the k-th largest, so tokens tied with the k-th are all kept (exactly k
    survive when the logits are distinct).
    """
    logits = _check_logits(logits)
    _check_top_k(k)
    if k is None:
        return logits.copy()
    V = logits.shape[-1]
    k = min(max(int(k), int(min_tokens_to_keep)), V)
    kth = np.partition(logits, V - k, axis=-1)[..., V - k:V - k + 1]
    return np.where(logits < kth, np.asarray(filter_value, logits.dtype), logits)


def _softmax64(x):
    """Stable softmax in float64 over the last axis; an all -inf row gives zeros."""
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def _log_softmax64(x):
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def top_p_filter(logits, p, filter_value=-np.inf, min_tokens_to_keep=1):
    """Nucleus filtering (HF ``TopPLogitsWarper``): keep the smallest set of most probable tokens
    whose cumulative probability reaches p; set the others to ``filter_value``.

    Sorted by decreasing probability, token i is removed when the tokens before it already
    hold probability >= p (so a set summing to exactly p is complete; probabilities are
    computed in float64 and compared with a tolerance of ``TOP_P_TOL``). At least
    ``min_tokens_to_keep`` (default 1) tokens are kept, so a top token with probability
    above p is kept alone. p = 1 keeps every token (HF's generate skips the warper then).
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


def warp_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """Temperature, then top-k, then top-p, in float64 (the distribution ``sample_next`` samples from)."""
    _check_sampling(temperature, top_k, top_p)
    x = _check_logits(logits).astype(np.float64)
    if temperature != 1:
        x = apply_temperature(x, temperature)
    if top_k is not None:
        x = top_k_filter(x, top_k)
    if top_p is not None:
        x = top_p_filter(x, top_p)
    return x


def sample_next(logits, rng=None, temperature=1.0, top_k=None, top_p=None, greedy=False):
    """Next token ids from logits (..., V) -> int64 array (...).

    greedy=True or temperature=0: argmax (the first index among ties). Otherwise one draw
    from softmax(warp_logits(logits, temperature, top_k, top_p)) per row, by inverse CDF with
    one ``rng.random()`` number per row, so a fixed seed repeats the same tokens.
    rng: a numpy.random.Generator (or an integer seed; None draws fresh entropy).
    """
    logits = _check_logits(logits)
    _check_sampling(temperature, top_k, top_p)
    if greedy or temperature == 0:
        return np.argmax(logits, axis=-1).astype(np.int64)
    rng = _as_rng(rng)
    probs = _softmax64(warp_logits(logits, temperature, top_k, top_p))
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(cdf.shape[:-1]) * cdf[..., -1]
    # the first index whose cdf exceeds u: never a zero-probability token
    idx = (cdf <= u[..., None]).sum(axis=-1)
    return np.minimum(idx, logits.shape[-1] - 1).astype(np.int64)


# -- helpers shared by the decoders ----------------------------------------------------
@contextlib.contextmanager
def _inference(model):
    """Eval mode (dropout off) during generation; restore each module's mode and drop stored activations."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            object.__setattr__(m, "training", mode)
        model.clear_cache()


def _as_batch(ids, name, vocab_size):
    """ids (T,) or (B, T) ints -> ((B, T) int64, was_1d). Empty input or ids out of range: ValueError."""
    arr = np.asarray(ids)
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must be a sequence of token ids (seq,) or a batch (batch, seq), got shape "
                         f"{arr.shape}")
    if arr.size == 0:
        raise ValueError(f"empty {name}: give at least one token id (shape {arr.shape})")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} holds token ids outside [0, {vocab_size}): min {lo}, max {hi}")
    was_1d = arr.ndim == 1
    return (arr[None] if was_1d else arr).astype(np.int64), was_1d


def _check_count(value, name, minimum=0):
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


# -- decoder-only generation (GPT) ----------------------------------------------------
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, greedy=False, rng=None,
             use_cache=True, stream=None, shift=None, return_logits=False, attention_mask=None):
    """Continue ``idx`` by ``max_new_tokens`` tokens with a decoder-only model (``GPT``).

    idx: (T,) or (B, T) token ids (a non-empty prompt). Returns the prompt followed by the
    new tokens, (T + max_new_tokens,) or (B, T + max_new_tokens) int64; with
    ``return_logits=True`` also the raw logits of every step, (B, max_new_tokens, V)
    (before temperature/top-k/top-p; for a 1-D prompt B = 1 is kept).

    Sampling: see ``sample_next`` (greedy, temperature, top-k, top-p; rng a Generator or seed).
    stream: called after each step with the new token id (an int for a single sequence,
    a (B,) array for a batch), e.g. to print characters as they come.

    Context window. The model sees at most ``model.block_size`` tokens, at positions
    0 … block_size-1 counted from the start of its window. A prompt longer than that is
    cropped to its last block_size tokens. When the window is full and a token must be
    added, its ``shift`` oldest tokens are dropped (default ``max(1, block_size // 2)``):
    the cache is rebuilt by one forward pass over the block_size - shift + 1 most recent
    tokens (positions restart at 0), then decoding continues one token per step until the
    window is full again. ``shift=1`` is nanoGPT's crop to the last block_size tokens at
    every step (a full re-prefill per token, O(block_size²)); a larger shift amortizes the
    rebuild over ``shift`` steps at the price of a shorter context just after it.
    ``use_cache=False`` recomputes the whole window at every step, with the same window
    schedule, so both paths give the same logits (to rounding).

    Prompts of different lengths: left-pad them to one length and pass ``attention_mask``
    (B, T), 1 for real tokens and 0 for padding, as Hugging Face does; padding is never
    attended to and positions count from each row's first real token, so every row continues
    as its prompt alone would (the padded length counts against block_size).
    """
    block_size = int(model.block_size)
    seq0, was_1d = _as_batch(idx, "prompt", model.vocab_size)
    _check_count(max_new_tokens, "max_new_tokens")
    _check_sampling(temperature, top_k, top_p)
    shift = max(1, block_size // 2) if shift is None else shift
    if not _is_int(shift) or not 1 <= shift <= block_size:
        raise ValueError(f"shift must be an integer in [1, block_size={block_size}], got {shift!r}")
    if stream is not None and not callable(stream):
        raise ValueError("stream must be a callable receiving each new token id, or None")
    sampling = not (greedy or temperature == 0)
    rng = _as_rng(rng) if sampling else None

    B, T0 = seq0.shape
    seq = np.empty((B, T0 + max_new_tokens), dtype=np.int64)
    seq[:, :T0] = seq0
    mask = None if attention_mask is None else _left_padding_mask(attention_mask, seq0.shape, max_new_tokens)
    trace = None
    n, start = T0, 0                 # seq[:, :n] is generated so far; the window is seq[:, start:n]
    caches, cache_start, cached_to = None, None, 0
    with _inference(model):
        for step in range(max_new_tokens):
            if n - start > block_size:
                start = max(start + shift, n - block_size)
            padding = {} if mask is None else {"attention_mask": mask[:, start:n]}
            if not use_cache:
                logits = model(seq[:, start:n], **padding)[:, -1]
            else:
                if caches is None or cache_start != start:      # first step, or the window slid: re-prefill
                    caches, cache_start, cached_to = model.new_kv_caches(), start, start
                logits = model(seq[:, cached_to:n], kv_caches=caches, **padding)[:, -1]
                cached_to = n
            if return_logits:
                if trace is None:
                    trace = np.empty((B, max_new_tokens, logits.shape[-1]), dtype=logits.dtype)
                trace[:, step] = logits
            tok = sample_next(logits, rng, temperature, top_k, top_p, greedy)
            seq[:, n] = tok
            n += 1
            if stream is not None:
                stream(int(tok[0]) if B == 1 else tok.copy())
    out = seq[0] if was_1d else seq
    if not return_logits:
        return out
    if trace is None:
        trace = np.empty((B, 0, model.vocab_size), dtype=model.dtype)
    return out, trace


def _left_padding_mask(attention_mask, shape, max_new_tokens):
    """The (B, T + max_new_tokens) mask of a left-padded batch (new tokens are real); checks the padding
    is on the left and every row has a real token."""
    mask = np.asarray(attention_mask)
    if mask.shape != shape:
        raise ValueError(f"attention_mask must have the prompt's shape {shape}, got {mask.shape}")
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("attention_mask must hold 1 (real token) and 0 (padding) only")
    real = mask.astype(bool)
    if not real[:, -1].all() or (np.diff(real.astype(np.int8), axis=1) < 0).any():
        raise ValueError("generate needs left padding: each row of attention_mask is 0 … 0 1 … 1 (pad the "
                         "prompts on the left, as Hugging Face's tokenizer(padding_side='left'))")
    return np.concatenate([real, np.ones((shape[0], max_new_tokens), dtype=bool)], axis=1)


# -- encoder-decoder decoding (Transformer) -------------------------------------------
class _DecoderState:
    """The decoder of a Transformer run over a fixed memory, one token per row per step.

    step(tokens (N,)) feeds one token per row and returns the logits (N, V) of the next one:
    with caches, only the new token goes through the decoder; without, the whole target
    prefix is recomputed (the reference). reorder(indices) makes row i continue old row
    indices[i] (beam search); rows must keep their source sentence (the memory and the
    static cross-attention caches are not reordered).
    """

    def __init__(self, model, memory, memory_mask, use_cache):
        self.model, self.memory, self.memory_mask = model, memory, memory_mask
        self.caches = model.new_caches() if use_cache else None
        self.tokens = np.empty((memory.shape[0], 0), dtype=np.int64)

    def step(self, new_tokens):
        new_tokens = np.asarray(new_tokens, dtype=np.int64)[:, None]
        self.tokens = np.concatenate([self.tokens, new_tokens], axis=1)
        if self.caches is not None:
            logits = self.model.decode(new_tokens, self.memory, memory_key_padding_mask=self.memory_mask,
                                       caches=self.caches)
        else:
            # Generated tokens are never padding: no target padding mask (as the cached path).
            tgt_mask = None if self.model.tgt_pad_id is None else np.zeros(self.tokens.shape, dtype=bool)
            logits = self.model.decode(self.tokens, self.memory, memory_key_padding_mask=self.memory_mask,
                                       tgt_key_padding_mask=tgt_mask)
        return logits[:, -1]

    def reorder(self, indices):
        self.tokens = self.tokens[indices]
        if self.caches is not None:
            for self_cache, _cross in self.caches:
                self_cache.reorder(indices)


def _check_seq2seq_args(model, max_length, bos_id, eos_id):
    if bos_id is None or eos_id is None:
        raise ValueError("decoding needs bos_id and eos_id (the target start and end token ids): the model does "
                         "not know its tokenizer's special tokens; pass bos_id=..., eos_id=...")
    for name, v in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not _is_int(v) or not 0 <= v < model.tgt_vocab_size:
            raise ValueError(f"{name} must be a token id in [0, {model.tgt_vocab_size}), got {v!r}")
    _check_count(max_length, "max_length")
    if max_length > model.max_len:
        raise ValueError(f"max_length={max_length} exceeds the model's positional table (max_len={model.max_len}); "
                         f"use max_length <= {model.max_len}")


def _encode(model, src):
    src, was_1d = _as_batch(src, "src", model.src_vocab_size)
    mask = model.src_padding_mask(src)
    return model.encode(src, src_key_padding_mask=mask), mask, was_1d


def _strip_eos(row, eos_id):
    row = list(map(int, row))
    return row[:row.index(eos_id)] if eos_id in row else row


def sample_decode(model, src, max_length, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None, greedy=False,
                  rng=None, use_cache=True, return_logits=False):
    """Decode target sequences for ``src`` one token at a time, sampling each (see ``sample_next``).

    src: (S,) or (B, S) source ids (padding from ``model.src_pad_id`` is masked in the encoder
    and in cross-attention). Starts from bos_id, stops a row at eos_id, and generates at most
    ``max_length`` tokens per row (eos included). Returns a list of token ids without bos/eos
    (a list of such lists for a batch); with ``return_logits=True`` also the raw logits of
    every step, (B, steps, V) (a finished row keeps being fed eos; its logits are meaningless).
    """
    _check_seq2seq_args(model, max_length, bos_id, eos_id)
    _check_sampling(temperature, top_k, top_p)
    sampling = not (greedy or temperature == 0)
    rng = _as_rng(rng) if sampling else None
    with _inference(model):
        memory, mask, was_1d = _encode(model, src)
        B = memory.shape[0]
        state = _DecoderState(model, memory, mask, use_cache)
        out = np.full((B, max_length), eos_id, dtype=np.int64)
        finished = np.zeros(B, dtype=bool)
        tok = np.full(B, bos_id, dtype=np.int64)
        trace = []
        for t in range(max_length):
            logits = state.step(tok)
            if return_logits:
                trace.append(logits)
            tok = np.where(finished, eos_id, sample_next(logits, rng, temperature, top_k, top_p, greedy))
            out[:, t] = tok
            finished |= tok == eos_id
            if finished.all():
                break
    seqs = [_strip_eos(row, eos_id) for row in out]
    result = seqs[0] if was_1d else seqs
    if not return_logits:
        return result
    V = model.tgt_vocab_size
    return result, (np.stack(trace, axis=1) if trace else np.empty((B, 0, V), dtype=model.dtype))


def greedy_decode(model, src, max_length, bos_id, eos_id, use_cache=True, return_logits=False):
    """Greedy (argmax) decoding; see ``sample_decode`` for the arguments and the result."""
    return sample_decode(model, src, max_length, bos_id, eos_id, greedy=True, use_cache=use_cache,
                         return_logits=return_logits)


def beam_search(model, src, beam_size=4, max_length=50, bos_id=None, eos_id=None, length_penalty=1.0,
                early_stopping=False, n_best=1, use_cache=True, return_scores=False):
    """Beam search over the decoder, batched over sources × beams, with the decoder's key/value caches.

    Each source keeps ``beam_size`` live hypotheses; at each step every live hypothesis is
    extended by every token and the best ``2·beam_size`` candidates (by summed log-probability)
    are examined in order: a candidate ending in eos among the top ``beam_size`` becomes a
    finished hypothesis, the others fill the next beams (whose self-attention caches are
    reordered along the batch axis). This is Hugging Face's beam search.

    Length penalty, HF's convention: a finished hypothesis scores
    ``sum of token log-probabilities / length ** length_penalty``, where length counts the
    generated tokens including eos (not bos). 0 ranks by total log-probability; > 0 favours
    longer outputs. (GNMT's ((5 + length) / 6) ** alpha is not used.)

    Stopping (HF's ``early_stopping``), once a source has beam_size finished hypotheses:
    True stops at once; False (default) stops when the best live beam, normalized by its
    current length, cannot beat the worst finished one (a heuristic); "never" stops only when
    no live beam can beat it whatever its final length (exact). At max_length the live beams
    are finished without eos. With beam_size=1 and early_stopping True or False this is
    greedy decoding.

    Returns, for each source, the best hypothesis (token ids without bos/eos), or the
    ``n_best`` best as a list when n_best > 1; a 1-D src gives the result for that single
    source. ``return_scores=True`` also returns the scores in the same structure.
    """
    _check_seq2seq_args(model, max_length, bos_id, eos_id)
    _check_count(beam_size, "beam_size", 1)
    _check_count(n_best, "n_best", 1)
    if n_best > beam_size:
        raise ValueError(f"n_best={n_best} cannot exceed beam_size={beam_size}")
    if not isinstance(length_penalty, numbers.Real) or not np.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    with _inference(model):
        memory, mask, was_1d = _encode(model, src)
        B = memory.shape[0]
        memory = np.repeat(memory, beam_size, axis=0)
        mask = None if mask is None else np.repeat(mask, beam_size, axis=0)
        state = _DecoderState(model, memory, mask, use_cache)
        hyps = _beam_search(state.step, state.reorder, B, beam_size, max_length, bos_id, eos_id,
                            float(length_penalty), early_stopping)
    hyps = [hs or [(-np.inf, [])] for hs in hyps]          # only if the model gave every token -inf
    seqs = [[h[1] for h in hs[:n_best]] for hs in hyps]
    scores = [[h[0] for h in hs[:n_best]] for hs in hyps]
    if n_best == 1:
        seqs, scores = [s[0] for s in seqs], [s[0] for s in scores]
    if was_1d:
        seqs, scores = seqs[0], scores[0]
    return (seqs, scores) if return_scores else seqs


def _beam_search(step, reorder, batch, K, max_length, bos_id, eos_id, alpha, early_stopping):
    """The search itself, on any decoder: step(tokens (batch·K,)) -> next-token logits (batch·K, V);
    reorder(indices (batch·K,)) continues row i from old row indices[i].

    Returns, per source, its finished hypotheses [(score, tokens), ...], best first.
    """
    N = batch * K
    scores = np.full((batch, K), -np.inf)
    scores[:, 0] = 0.0                       # all beams start equal: expand only the first
    tokens = np.zeros((batch, K, 0), dtype=np.int64)
    finished = [[] for _ in range(batch)]    # (score, tokens) per source, at most K, best first
    done = np.zeros(batch, dtype=bool)
    feed = np.full(N, bos_id, dtype=np.int64)

    def normalized(total, n):
        return total / n ** alpha if n > 0 else total

    def add(b, score, toks):
        hs = finished[b]
        if len(hs) < K or score > hs[-1][0]:
            hs.append((float(score), toks))
            hs.sort(key=lambda h: -h[0])     # stable: earlier hypotheses win ties
            del hs[K:]

    length = 0                               # tokens generated by the live beams
    for length in range(1, max_length + 1):
        logp = _log_softmax64(step(feed))
        V = logp.shape[-1]
        cand = (scores.reshape(N, 1) + logp).reshape(batch, K * V)
        n_cand = min(2 * K, K * V)
        top = np.argpartition(-cand, n_cand - 1, axis=1)[:, :n_cand] if n_cand < K * V else \
            np.broadcast_to(np.arange(K * V), (batch, K * V))
        top_scores = np.take_along_axis(cand, top, axis=1)
        # best first; ties: lower beam, then lower token id (as argmax)
        order = np.lexsort((top, -top_scores), axis=1)
        top = np.take_along_axis(top, order, axis=1)
        new_scores = np.full((batch, K), -np.inf)
        new_beam = np.tile(np.arange(K), (batch, 1))
        new_tok = np.full((batch, K), eos_id, dtype=np.int64)
        for b in range(batch):
            if done[b]:
                continue
            j = 0
            for rank, c in enumerate(top[b]):
                s = cand[b, c]
                if s == -np.inf:
                    break
                beam, tok = divmod(int(c), V)
                if tok == eos_id:
                    if rank < K:
                        add(b, normalized(s, length), tokens[b, beam].tolist())
                    continue
                new_scores[b, j], new_beam[b, j], new_tok[b, j] = s, beam, tok
                j += 1
                if j == K:
                    break
        reorder((np.arange(batch)[:, None] * K + new_beam).ravel())
        tokens = np.concatenate([np.take_along_axis(tokens, new_beam[:, :, None], axis=1), new_tok[:, :, None]],
                                axis=2)
        scores = new_scores
        feed = new_tok.ravel()
        for b in range(batch):
            if done[b] or len(finished[b]) < K:
                continue
            best = scores[b].max()
            if best == -np.inf or early_stopping is True:
                done[b] = True
                continue
            if early_stopping is False:
                bound = best / length ** alpha
            else:                            # "never": the best any live beam can still reach
                bound = best / (max_length if alpha > 0 else length + 1) ** alpha
            done[b] = finished[b][-1][0] >= bound
        if done.all():
            break
    for b in range(batch):                   # max_length reached: live beams finish without eos
        if not done[b]:
            for j in range(K):
                if scores[b, j] > -np.inf:
                    add(b, normalized(scores[b, j], length), tokens[b, j].tolist())
    return finished
