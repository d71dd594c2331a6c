"""Decoding: GPT generation, and encoder-decoder greedy / sampling / beam search.

Decoder-only (GPT)::

    generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, greedy=False,
             rng=None, use_cache=True, stream=None, shift=None, return_logits=False, attention_mask=None,
             stop_tokens=None)

incremental decoding with the key/value cache; past the context length the window slides
(see ``generate``), identically with and without the cache.

Encoder-decoder (Transformer)::

    greedy_decode(model, src, max_length, bos_id, eos_id, use_cache=True, return_logits=False)
    sample_decode(model, src, max_length, bos_id, eos_id, temperature=1.0, top_k=None, top_p=None,
                  greedy=False, rng=None, use_cache=True, return_logits=False)
    beam_search(model, src, beam_size=4, max_length=50, bos_id=None, eos_id=None, length_penalty=1.0,
                early_stopping=False, n_best=1, use_cache=True, return_scores=False)

all with the decoder's key/value caches (``use_cache=False`` recomputes every step, for checks).
They return token-id lists without bos and eos (bos_id and eos_id are required). ``greedy_decode``
and ``sample_decode`` choose each next token with ``numformer.sampling.sample_next``; ``beam_search``
ranks candidates by summed log-probability (its length penalty: see ``beam_search``).

Everything runs with the model in eval mode (dropout off); the previous mode is restored.
"""
from __future__ import annotations

import contextlib
import numbers

import numpy as np

from .sampling import _as_rng, _check_sampling, _is_int, _log_softmax64, sample_next

__all__ = ["generate", "greedy_decode", "sample_decode", "beam_search"]


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
    try:
        arr = np.asarray(ids)
    except ValueError:      # NumPy: "inhomogeneous shape" for rows of different lengths
        raise ValueError(f"{name} rows have different lengths; give one prompt of shape (seq,), or a batch of "
                         f"equal-length rows (left-pad shorter ones and pass attention_mask)") from None
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
             use_cache=True, stream=None, shift=None, return_logits=False, attention_mask=None, stop_tokens=None):
    """Continue ``idx`` by ``max_new_tokens`` tokens with a decoder-only model (``GPT``).

    idx: (T,) or (B, T) token ids (a non-empty prompt). Returns the prompt followed by the new tokens,
    (T + n,) or (B, T + n) int64, n = max_new_tokens unless ``stream`` or ``stop_tokens`` ended generation
    earlier; with ``return_logits=True`` also the raw logits of every step, (B, n, V) in the model's dtype
    (before temperature/top-k/top-p; B = 1 for a 1-D prompt).

    Sampling: see ``sample_next`` (greedy, temperature, top-k, top-p; rng a Generator or seed).
    stream: called after each step with the new token id (an int when B = 1, a (B,) array
    otherwise), e.g. to print characters as they come; returning True stops.
    stop_tokens: an id or ids (Hugging Face's ``eos_token_id``): a row that produces one is
    finished (the stop token kept, then repeated); generation ends when every row is.

    Context window. The model sees at most ``model.block_size`` tokens, at positions
    0 … block_size-1 counted from the start of its window. When the window is full and a
    token must be added, its ``shift`` oldest tokens are dropped (default
    ``max(1, block_size // 2)``): the cache is rebuilt by one forward pass over the
    block_size - shift + 1 most recent tokens (positions restart at 0), then decoding
    continues one token per step until the window is full again. ``shift=1`` is nanoGPT's
    crop to the last block_size tokens at every step (a full re-prefill per token,
    O(block_size²)); a larger shift amortizes the rebuild over ``shift`` steps at the price
    of a shorter context just after it. A longer prompt is cropped to its last block_size
    tokens, as nanoGPT does. ``use_cache=False`` recomputes the whole window at every step, with
    the same window schedule, so both paths give the same logits (to rounding).

    Prompts of different lengths: left-pad them to one length and pass ``attention_mask``
    (B, T), 1 for real tokens and 0 for padding, as Hugging Face does; padding is never
    attended to and positions count from each row's first real token, so every row continues
    as its prompt alone would (the padded length counts against block_size).
    """
    block_size = int(model.block_size)
    seq0, was_1d = _as_batch(idx, "prompt", model.vocab_size)
    shift = _check_generate_args(block_size, max_new_tokens, temperature, top_k, top_p, shift, stream)
    stop = None if stop_tokens is None else _as_batch(np.atleast_1d(stop_tokens), "stop_tokens", model.vocab_size)[0]
    rng = None if greedy or temperature == 0 else _as_rng(rng)
    B, T0 = seq0.shape
    seq = _output_buffer(seq0, max_new_tokens)
    mask = None if attention_mask is None else _left_padding_mask(attention_mask, seq0.shape, max_new_tokens)
    trace = np.empty((B, max_new_tokens, model.vocab_size), dtype=model.dtype) if return_logits else None
    n, start = T0, max(0, T0 - block_size)      # seq[:, :n] is generated so far; the window is seq[:, start:n]
    cache = {} if use_cache else None
    finished = np.zeros(B, dtype=bool)
    with _inference(model):
        for step in range(max_new_tokens):
            if n - start > block_size:
                start = max(start + shift, n - block_size)
            logits = _next_logits(model, seq, start, n, mask, cache)
            if return_logits:
                trace[:, step] = logits
            tok = _finished_rows_repeat(sample_next(logits, rng, temperature, top_k, top_p, greedy), seq[:, n - 1],
                                        stop, finished)
            seq[:, n] = tok
            n += 1
            halt = stream is not None and stream(int(tok[0]) if B == 1 else tok.copy()) is True
            if halt or finished.all():
                break
    out = seq[0, :n] if was_1d else seq[:, :n]
    return (out, trace[:, :n - T0]) if return_logits else out


def _output_buffer(prompt, max_new_tokens):
    """(B, T + max_new_tokens) int64 ids with the prompt (B, T) written first."""
    seq = np.empty((prompt.shape[0], prompt.shape[1] + max_new_tokens), dtype=np.int64)
    seq[:, :prompt.shape[1]] = prompt
    return seq


def _finished_rows_repeat(tok, last, stop, finished):
    """The sampled tokens (B,), where a row that has produced a stop token repeats its last token; marks in
    ``finished`` (B,) the rows whose token is a stop token. ``stop`` None: no stop tokens."""
    if stop is None:
        return tok
    tok = np.where(finished, last, tok)
    finished |= np.isin(tok, stop)
    return tok


def _next_logits(model, seq, start, n, mask, cache):
    """The logits (B, V) of the token after seq[:, :n], seen through the window seq[:, start:n]. ``cache`` is
    None (recompute the window) or a dict of the KV caches, where their window starts and how far they are
    filled: a new window (the first step, or after a slide) is prefilled, then one token is added per call."""
    extra = {} if mask is None else {"attention_mask": mask[:, start:n]}
    if getattr(model, "supports_logits_to_keep", False):
        extra["logits_to_keep"] = 1               # only the last position's logits are needed
    if cache is None:
        return model(seq[:, start:n], **extra)[:, -1]
    if cache.get("start") != start:
        cache.update(caches=model.new_kv_caches(), start=start, filled=start)
    logits = model(seq[:, cache["filled"]:n], kv_caches=cache["caches"], **extra)[:, -1]
    cache["filled"] = n
    return logits


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


def _check_generate_args(block_size, max_new_tokens, temperature, top_k, top_p, shift, stream):
    """Check ``generate``'s arguments; returns the window shift (default max(1, block_size // 2))."""
    _check_count(max_new_tokens, "max_new_tokens")
    _check_sampling(temperature, top_k, top_p)
    shift = max(1, block_size // 2) if shift is None else shift
    if not _is_int(shift) or not 1 <= shift <= block_size:
        raise ValueError(f"shift must be an integer in [1, block_size={block_size}], got {shift!r}")
    if stream is not None and not callable(stream):
        raise ValueError("stream must be a callable receiving each new token id, or None")
    return shift


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
    ``max_length`` tokens per row (eos included; max_length <= ``model.max_len``). Returns a list of
    token ids without bos/eos (a list of such lists for a batch); with ``return_logits=True``
    also the raw logits of every step, (B, steps, V) in the model's dtype (B = 1 for a 1-D src;
    a finished row keeps being fed eos; its logits are meaningless). ``use_cache=False``
    recomputes the whole target prefix at every step (the reference for the cached path).
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

    src: (S,) or (B, S) source ids, as for ``sample_decode``; bos_id and eos_id are required.
    Each source keeps ``beam_size`` live hypotheses; at each step every live hypothesis is
    extended by every token and the best ``2·beam_size`` candidates (by summed log-probability)
    are examined in order: a candidate ending in eos among the top ``beam_size`` becomes a
    finished hypothesis (one ranked lower is dropped), the others fill the next beams (whose
    self-attention caches are reordered along the batch axis). This is Hugging Face's beam
    search. ``use_cache=False`` recomputes the whole target prefix at every step.

    Length penalty, HF's convention: a finished hypothesis scores
    ``sum of token log-probabilities / length ** length_penalty``, where length counts the
    generated tokens including eos (not bos). 0 ranks by total log-probability; > 0 favours
    longer outputs, < 0 shorter ones. (GNMT's ((5 + length) / 6) ** alpha is not used.)

    Stopping (HF's ``early_stopping``), once a source has beam_size finished hypotheses:
    True stops at once; False (default) stops when the best live beam, normalized by its
    current length, cannot beat the worst finished one (a heuristic); "never" stops only when
    no live beam can beat it whatever its final length (exact). At max_length the live beams
    are finished without eos. With beam_size=1 and early_stopping True or False this is
    greedy decoding.

    Returns, for each source, the best hypothesis (token ids without bos/eos), or the
    ``n_best`` best as a list when n_best > 1; a 1-D src gives the result for that single
    source. ``return_scores=True`` also returns their scores (length-penalized, as above;
    Python floats) in the same structure.
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

    Each step extends the live beams (``_beam_step``), records the candidates that end in eos as
    finished hypotheses, and asks each source whether it may stop (``_beam_done``).
    Returns, per source, its finished hypotheses [(score, tokens), ...], best first.
    """
    scores = np.full((batch, K), -np.inf)
    scores[:, 0] = 0.0                       # all beams start equal: expand only the first
    tokens = np.zeros((batch, K, 0), dtype=np.int64)
    finished = [[] for _ in range(batch)]    # (score, tokens) per source, at most K, best first
    done = np.zeros(batch, dtype=bool)
    feed = np.full(batch * K, bos_id, dtype=np.int64)
    length = 0                               # tokens generated by the live beams
    for length in range(1, max_length + 1):
        new_scores, new_beam, new_tok, ended = _beam_step(scores, _log_softmax64(step(feed)), done, eos_id)
        for b, ends in enumerate(ended):
            for s, beam in ends:
                _add_finished(finished[b], K, _normalized(s, length, alpha), tokens[b, beam].tolist())
        reorder((np.arange(batch)[:, None] * K + new_beam).ravel())
        tokens = np.concatenate([np.take_along_axis(tokens, new_beam[:, :, None], axis=1), new_tok[:, :, None]],
                                axis=2)
        scores = new_scores
        feed = new_tok.ravel()
        for b in range(batch):
            if not done[b] and len(finished[b]) >= K:
                done[b] = _beam_done(scores[b].max(), finished[b][-1][0], length, max_length, alpha,
                                     early_stopping)
        if done.all():
            break
    for b in range(batch):                   # max_length reached: live beams finish without eos
        if not done[b]:
            for j in range(K):
                if scores[b, j] > -np.inf:
                    _add_finished(finished[b], K, _normalized(scores[b, j], length, alpha), tokens[b, j].tolist())
    return finished


def _normalized(total, n, alpha):
    """A finished hypothesis's score: its summed log-probability / length ** alpha (HF's length penalty)."""
    return total / n ** alpha if n > 0 else total


def _add_finished(hyps, K, score, toks):
    """Keep the K best finished hypotheses, best first (stable: earlier hypotheses win ties)."""
    if len(hyps) < K or score > hyps[-1][0]:
        hyps.append((float(score), toks))
        hyps.sort(key=lambda h: -h[0])
        del hyps[K:]


def _beam_step(scores, logp, done, eos_id):
    """The candidate step: every live beam (scores (batch, K)) extended by every token (logp (batch·K, V)).

    The best 2·K candidates of each source are examined in order (ties: lower beam, then lower token id,
    as argmax): a candidate ending in eos among the top K ends a hypothesis, the others fill the next K
    beams. Sources that are ``done`` are skipped. Returns (new_scores, new_beam, new_tok), each (batch, K),
    and per source the ended candidates [(score, beam), ...] in rank order.
    """
    batch, K = scores.shape
    V = logp.shape[-1]
    cand = (scores.reshape(batch * K, 1) + logp).reshape(batch, K * V)
    n_cand = min(2 * K, K * V)
    top = np.argpartition(-cand, n_cand - 1, axis=1)[:, :n_cand] if n_cand < K * V else \
        np.broadcast_to(np.arange(K * V), (batch, K * V))
    top_scores = np.take_along_axis(cand, top, axis=1)
    top = np.take_along_axis(top, np.lexsort((top, -top_scores), axis=1), axis=1)     # best first
    new_scores = np.full((batch, K), -np.inf)
    new_beam = np.tile(np.arange(K), (batch, 1))
    new_tok = np.full((batch, K), eos_id, dtype=np.int64)
    ended = [[] for _ in range(batch)]
    for b in np.flatnonzero(~done):
        j = 0
        for rank, c in enumerate(top[b]):
            s = cand[b, c]
            if s == -np.inf:
                break
            beam, tok = divmod(int(c), V)
            if tok == eos_id:
                if rank < K:
                    ended[b].append((s, beam))
                continue
            new_scores[b, j], new_beam[b, j], new_tok[b, j] = s, beam, tok
            j += 1
            if j == K:
                break
    return new_scores, new_beam, new_tok, ended


def _beam_done(best, worst_finished, length, max_length, alpha, early_stopping):
    """The stopping rule for a source that has K finished hypotheses (HF's ``early_stopping``).

    best: the best live beam's summed log-probability; worst_finished: the K-th finished score.
    True stops at once; False when the best live beam, normalized by its current length, cannot beat
    the worst finished one; "never" when no live beam can beat it whatever its final length.
    """
    if best == -np.inf or early_stopping is True:
        return True
    if early_stopping is False:
        bound = best / length ** alpha
    else:                                    # "never": the best any live beam can still reach
        bound = best / (max_length if alpha > 0 else length + 1) ** alpha
    return worst_finished >= bound
