"""What the explorer page shows, computed by numformer and written as JSON-ready Python values.

    ids, n_prompt = prompt_ids(model, tokenizer, "ROMEO:", max_new_tokens=20, seed=0)   # prompt + generated
    analysis = analyse(model, tokenizer, ids)        # attention, logits, logit lens of a token sequence
    data = page_data(model, tokenizer, ids, n_prompt, "runs/x", "static")   # the page's whole data

Every number comes from numformer: one ``model.run_with_cache`` gives the logits and every layer's attention
pattern (``blocks.{l}.attn.hook_pattern``), and ``numformer.analysis.logit_lens`` reads the cached residual
streams through the final norm and the unembedding. The page itself only draws them and applies the sampler's
filters (temperature, top-k, top-p) to the logits, in JavaScript that repeats ``numformer.sampling``.

A GPT is causal, so the analysis of a whole sequence holds that of each of its prefixes: position t's
attention and logits do not depend on the tokens after t. A page with generated tokens therefore carries one
analysis, and stepping through the tokens only shows more of it.

Precision (what the page's JSON keeps): logits exactly (9 significant digits identify a float32 value), attention
weights and lens probabilities rounded to 5 decimals (absolute error at most 5e-6).
"""
from __future__ import annotations

import numpy as np

from ..analysis import logit_lens
from ..analysis._common import eval_mode
from ..decoding import generate
from ..models import GPT

FORMAT = 1                 # the version of the data's layout; a page checks it
LENS_TOP = 5               # tokens per layer in the logit lens
NEXT_TOP = 20              # tokens the next-token list shows
INLINE_LOGITS = 200_000    # at most this many logits (positions × vocabulary) travel with an analysis


def check_model(model):
    """The explorer reads a GPT's attention and residual stream; anything else is one clear error."""
    if not isinstance(model, GPT):
        raise ValueError(f"the explorer shows a GPT (a decoder-only language model); got a {type(model).__name__}")


def check_ids(model, ids, what="the text"):
    """ids as a 1-D int64 array of at least one and at most block_size tokens, each inside the vocabulary."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ValueError(f"{what} is empty; give at least one token")
    if ids.size > model.block_size:
        raise ValueError(f"{what} has {ids.size} tokens but the model reads at most {model.block_size} "
                         f"(its block_size); give a shorter prompt or fewer new tokens")
    if ids.min() < 0 or ids.max() >= model.vocab_size:
        raise ValueError(f"token ids must be in [0, {model.vocab_size}); got {int(ids.min())}..{int(ids.max())}")
    return ids


def token_text(tokenizer, i):
    """The text of one token id as the tokenizer decodes it alone (a piece of a character shows as �)."""
    return tokenizer.decode([int(i)])


def _rounded(a, decimals=5):
    """Nested lists of floats rounded to ``decimals`` (JSON keeps them short)."""
    return np.round(np.asarray(a, dtype=np.float64), decimals).tolist()


def _exact(a):
    """Nested lists of floats that give back the values exactly: 9 significant digits identify a float32 value
    (the page rounds them to float32 with ``Math.fround``), 17 a float64 value."""
    a = np.asarray(a)
    if a.dtype != np.float32:
        return a.astype(np.float64).tolist()
    return np.vectorize(lambda v: float(f"{v:.9g}"), otypes=[object])(a).tolist()


def run(model, ids):
    """(logits (T, V), patterns [(H_l, T, T) per layer], cache) of one sequence, from ``run_with_cache``."""
    check_model(model)
    ids = check_ids(model, ids)
    wanted = ("hook_pattern", "hook_resid_pre", "hook_resid_post")
    with eval_mode(model):
        logits, cache = model.run_with_cache(ids[None], names_filter=lambda n: n.endswith(wanted))
    patterns = [cache["pattern", layer][0] for layer in range(model.n_layers)]
    return logits[0], patterns, cache


def analyse(model, tokenizer, ids, inline_logits=None):
    """The page's analysis of ``ids`` (T,): a dict of nested lists (shapes as NumPy would write them)

    - ``ids`` (T,), ``tokens`` (T,): each token's text;
    - ``attention`` (L, H, T, ragged): query t's weights over keys 0..t, one lower-triangular row each;
    - ``logits`` (T, V), or None when T·V > ``INLINE_LOGITS`` (unless ``inline_logits`` says otherwise): the
      server then sends one position's on request; ``logits_dtype``: "float32" tells the page to round the
      decimals to float32, which gives the model's values exactly;
    - ``next`` (T, NEXT_TOP): the ids of largest logit, in stable order;
    - ``lens``: ``stages`` (L + 1,), ``ids`` and ``probs`` (L + 1, T, LENS_TOP), ``actual`` (L + 1, T - 1): each
      stage's probability of the token that comes next;
    - ``vocab`` {id: text} of every id named.
    """
    ids = check_ids(model, ids)
    logits, patterns, cache = run(model, ids)
    T = len(ids)
    attention = [[[_rounded(p[h, q, :q + 1]) for q in range(T)] for h in range(len(p))] for p in patterns]
    with eval_mode(model):
        lens = logit_lens(model, ids, cache=cache)
    lens_ids, lens_probs = lens.top(LENS_TOP)
    nxt = np.argsort(-logits.astype(np.float64), axis=-1, kind="stable")[:, :NEXT_TOP]
    inline = T * model.vocab_size <= INLINE_LOGITS if inline_logits is None else inline_logits
    named = set(ids.tolist()) | set(lens_ids.reshape(-1).tolist()) | set(nxt.reshape(-1).tolist())
    return {
        "ids": ids.tolist(),
        "tokens": [token_text(tokenizer, i) for i in ids],
        "attention": attention,
        "logits": _exact(logits) if inline else None,
        "logits_dtype": "float32" if logits.dtype == np.float32 else "float64",
        "next": nxt.tolist(),
        "lens": {"stages": lens.stage_names, "ids": lens_ids[:, 0].tolist(), "probs": _rounded(lens_probs[:, 0]),
                 "actual": _rounded(lens.next_token_probability()[:, 0])},
        "vocab": {str(i): token_text(tokenizer, i) for i in sorted(named)},
    }


def position_logits(model, ids, position):
    """The logits of one position of ``ids`` (a list of V floats, exact as in ``analyse``), for a page whose
    analysis left the logits out; computed on ids[:position + 1]."""
    ids = check_ids(model, ids)
    if not 0 <= position < len(ids):
        raise ValueError(f"position must be in [0, {len(ids)}), got {position}")
    logits, _, _ = run(model, ids[:position + 1])
    return _exact(logits[-1])


def prompt_ids(model, tokenizer, prompt, max_new_tokens=0, seed=None, fit=False, **sampling):
    """(ids, n_prompt): the prompt's ids followed by ``max_new_tokens`` tokens from ``numformer.decoding.generate``
    (``sampling``: temperature, top_k, top_p, greedy), as ``numformer generate`` with the same seed continues it.
    With ``fit`` (a default number, not the user's), fewer where the model's context has no room for more;
    without it, a number that does not fit is a ValueError."""
    ids = check_ids(model, tokenizer.encode_prompt(prompt), "the prompt")
    n_prompt = len(ids)
    if max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be at least 0, got {max_new_tokens}")
    if fit:
        max_new_tokens = max(0, min(max_new_tokens, model.block_size - n_prompt))
    if n_prompt + max_new_tokens > model.block_size:
        raise ValueError(f"the prompt has {n_prompt} tokens and the model reads at most {model.block_size} (its "
                         f"block_size), so at most {model.block_size - n_prompt} new tokens fit; give fewer with "
                         f"--max-new-tokens")
    if max_new_tokens:
        with eval_mode(model):
            ids = generate(model, ids, max_new_tokens, rng=seed, **sampling)
    return np.asarray(ids, dtype=np.int64), n_prompt


def model_summary(model, source):
    """What the page's header says about the model."""
    return {"source": str(source), "n_layers": model.n_layers, "vocab_size": model.vocab_size,
            "block_size": model.block_size, "heads": [b.n_heads for b in model.config.layers],
            "parameters": int(model.num_parameters())}


def page_data(model, tokenizer, ids, n_prompt, source, mode, sampling=None, inline_logits=None):
    """The whole data of a page: {format, mode ("static" or "server"), model, sampling (the controls'
    starting values: temperature, top_k, top_p), n_prompt (how many of the ids are the prompt; the rest were
    generated and are stepped through), analysis (``analyse``) or None for a server page opened without a
    prompt}."""
    check_model(model)
    sampling = {"temperature": 1.0, "top_k": None, "top_p": None, **(sampling or {})}
    return {"format": FORMAT, "mode": mode, "model": model_summary(model, source), "sampling": sampling,
            "n_prompt": int(n_prompt),
            "analysis": None if ids is None else analyse(model, tokenizer, ids, inline_logits)}


__all__ = ["FORMAT", "analyse", "page_data", "position_logits", "prompt_ids", "model_summary", "check_ids", "run"]
