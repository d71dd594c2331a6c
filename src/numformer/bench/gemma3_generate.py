"""Generation with a Gemma-3-1B-shaped Gemma 3: numformer against transformers on the same random weights, and
the KV cache of the sliding-window layers against the full-attention ones.

The model has Gemma 3 1B's text shape (google/gemma-3-1b's config.json: 26 layers, hidden 1152, 4 query heads
and 1 key/value head of head_dim 256, query_pre_attn_scalar 256, q/k norms, tanh GeGLU d_ff 6912, vocabulary
262144, tied embeddings scaled by √1152, every sixth layer full attention and the others a window of 512,
RoPE bases 10⁶ (full) and 10⁴ (sliding); 1.0B parameters) with random float32 weights: a
``transformers.Gemma3ForCausalLM`` is saved with ``save_pretrained`` and imported by ``numformer.interop.hf``
(family "gemma3_text"), so both libraries run the same weights (nothing is downloaded).

Speed: ``_family.run_speed`` (a prompt of 64 tokens continued by 64 greedy tokens at batch 1 and 8, best of
the rounds, each numformer threading mode, PyTorch on one thread and on as many threads, the ratio against the
faster).

KV cache: a prompt of three windows (1,536 tokens) continued by 64 greedy tokens at batch 1, numformer one
position per call through its KV caches (as ``generate`` decodes), transformers by ``generate``; after each
call the bytes of numformer's cache arrays are read per layer (``KVCache.k``, ``.v``: the arrays allocated, and
the positions they hold), and transformers' cache (``past_key_values``) at the end, the bytes of its tensors'
storage. A sliding layer keeps what its next queries can reach (its window), a full layer every position.
``--quick``: a 2-layer hidden-64 Gemma 3 (one sliding layer with a window of 8, one full layer); speed: a
prompt of 16 tokens continued by 8; KV cache: a prompt of 24 tokens (three windows) continued by 8.
"""
from __future__ import annotations

import numpy as np

from . import _family
from .hf_generate import cpu_row  # noqa: F401  (bench.md's row per CPU model: the ratio at each batch size)

REQUIRES = ("torch", "transformers")     # the reference it measures against: the runner refuses the part without it

PROMPT, NEW_TOKENS, BATCHES = 64, 64, (1, 8)
CACHE_WINDOWS, CACHE_NEW_TOKENS = 3, 64      # the KV-cache run: a prompt of 3 windows, then 64 tokens
GEMMA3_1B = dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                 num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                 max_position_embeddings=32768, sliding_window=512, sliding_window_pattern=6, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, rope_parameters={"full_attention": {"rope_type": "default",
                                                                               "rope_theta": 1e6},
                                                            "sliding_attention": {"rope_type": "default",
                                                                                  "rope_theta": 1e4}})
QUICK_CONFIG = dict(GEMMA3_1B, vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
                    max_position_embeddings=256, sliding_window=8, sliding_window_pattern=2)


def numformer_cache_steps(model, prompt, new_tokens):
    """Greedy decoding of ``new_tokens`` after ``prompt`` (1, P), one position per call through the KV caches;
    returns (the new tokens, the caches' bytes after the prompt and after each call: ``cache_bytes``)."""
    caches = model.new_kv_caches()
    logits = model(prompt, kv_caches=caches, logits_to_keep=1)
    steps, tokens = [cache_bytes(model, caches)], []
    for step in range(new_tokens):
        token = logits[:, -1].argmax(axis=-1)
        tokens.append(int(token[0]))
        if step < new_tokens - 1:           # as generate: the last token is not fed (P + new - 1 positions)
            logits = model(token[:, None], kv_caches=caches, logits_to_keep=1)
            steps.append(cache_bytes(model, caches))
    return tokens, steps


def cache_bytes(model, caches):
    """{"positions": positions processed, "sliding"/"full": {"array": bytes allocated, "held": bytes of the
    positions held} of the largest layer of that kind, "total_array"/"total_held": the same over every layer}."""
    out = {"positions": caches[0].length, "total_array": sum(c.k.nbytes + c.v.nbytes for c in caches),
           "total_held": sum(2 * c.k[:, :, :c.stored].nbytes for c in caches)}
    for kind in ("sliding", "full"):
        layers = [c for c, b in zip(caches, model.config.layers) if (b.sliding_window is not None) == (kind == "sliding")]
        out[kind] = {"array": max((c.k.nbytes + c.v.nbytes for c in layers), default=0),
                     "held": max((2 * c.k[:, :, :c.stored].nbytes for c in layers), default=0)}
    return out


def transformers_cache(tmodel, prompt, new_tokens):
    """(transformers' greedy tokens after ``prompt`` (1, P), {"sliding"/"full": {"array": bytes of the largest
    such layer's key and value storage, "held": bytes of its key and value tensors}}) after ``generate``."""
    import torch

    ids = torch.from_numpy(prompt)
    with torch.inference_mode():
        out = tmodel.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None,
                              return_dict_in_generate=True)
    sizes = {}
    for kind in ("sliding", "full"):          # keys and values have the same size: twice the keys
        keys = [layer.keys for layer in out.past_key_values.layers
                if getattr(layer, "is_sliding", False) == (kind == "sliding")]
        sizes[kind] = {"array": 2 * max((k.untyped_storage().nbytes() for k in keys), default=0),
                       "held": 2 * max((k.nelement() * k.element_size() for k in keys), default=0)}
    return out.sequences[0, prompt.shape[1]:].tolist(), sizes


def kv_cache_run(model, tmodel, windows, new_tokens, log=print):
    """The KV-cache measurement: a prompt of ``windows`` windows then ``new_tokens`` greedy tokens, in both
    libraries; numformer's bytes after every call, transformers' at the end, and whether the tokens agree."""
    window = _family.describe(model)["window"]
    prompt = np.random.default_rng(0).integers(0, model.vocab_size, (1, windows * window))
    ours, steps = numformer_cache_steps(model, prompt, new_tokens)
    theirs, sizes = transformers_cache(tmodel, prompt, new_tokens)
    c = model.config.layers[0]
    if log:
        log(f"  KV cache after {steps[-1]['positions']} positions: sliding layer {steps[-1]['sliding']}, full "
            f"layer {steps[-1]['full']}; transformers {sizes}")
    return {"window": window, "prompt_tokens": prompt.shape[1], "new_tokens": new_tokens,
            "bytes_per_position": 2 * c.n_kv_heads * c.head_dim * np.dtype(model.dtype).itemsize,
            "after_prompt": steps[0], "after_first_token": steps[1], "end": steps[-1],
            "sliding_array_max_while_decoding": max(s["sliding"]["array"] for s in steps[1:]),
            "sliding_held_max_while_decoding": max(s["sliding"]["held"] for s in steps[1:]),
            "transformers": sizes, "same_tokens_fraction": float(np.mean(np.equal(ours, theirs)))}


def run(quick=False, log=print):
    prompt, new = (16, 8) if quick else (PROMPT, NEW_TOKENS)
    model, tmodel, result = _family.run_speed("Gemma3TextConfig", "Gemma3ForCausalLM",
                                              QUICK_CONFIG if quick else GEMMA3_1B, prompt, new, BATCHES,
                                              1 if quick else 2, log=log)
    result["kv_cache"] = kv_cache_run(model, tmodel, CACHE_WINDOWS, 8 if quick else CACHE_NEW_TOKENS, log)
    result["load_average"]["end"] = _family.load_average()
    return result


def _cache_row(label, bytes_, per_position):
    return f"| {label} | {bytes_['held'] // per_position:,} | {bytes_['held']:,} | {bytes_['array']:,} |"


def cache_markdown(kv, model):
    """The KV-cache table and what it shows."""
    p, w = kv["bytes_per_position"], kv["window"]
    end, full, sliding = kv["end"], model["n_layers"] - model["sliding_layers"], model["sliding_layers"]
    lines = [f"KV cache: a prompt of {kv['prompt_tokens']:,} tokens ({kv['prompt_tokens'] // w} windows of {w}) "
             f"continued by {kv['new_tokens']} greedy tokens at batch 1 ({100 * kv['same_tokens_fraction']:.0f}% "
             f"the same tokens in both libraries), float32, {p:,} bytes per position per layer (keys and values "
             f"of {model['n_kv_heads']} head of {model['head_dim']}); bytes per layer read from the cache arrays "
             f"after the last token ({end['positions']:,} positions):", "",
             "| layer | positions held | bytes held | bytes allocated |", "|---|---:|---:|---:|",
             _cache_row(f"numformer sliding (×{sliding})", end["sliding"], p),
             _cache_row(f"numformer full (×{full})", end["full"], p),
             _cache_row(f"transformers sliding (×{sliding})", kv["transformers"]["sliding"], p),
             _cache_row(f"transformers full (×{full})", kv["transformers"]["full"], p), ""]
    lines.append(
        f"While decoding, a numformer sliding layer's arrays never exceeded {kv['sliding_array_max_while_decoding']:,} "
        f"bytes ({kv['sliding_array_max_while_decoding'] // p:,} positions: at most 2·(window + 1) = {2 * (w + 1):,} "
        f"whatever the length; they are compacted to the last window − 1 positions when full) and held at most "
        f"{kv['sliding_held_max_while_decoding'] // p:,} positions; right after the prompt they held all "
        f"{kv['after_prompt']['sliding']['held'] // p:,} of its positions (the prompt's own queries need them), "
        f"and the first decoding step brought them to {kv['after_first_token']['sliding']['array']:,} bytes. The "
        f"whole cache of numformer's {model['n_layers']} layers holds {end['total_held']:,} bytes (allocates "
        f"{end['total_array']:,}) and grows by {full * p:,} bytes per token (its full layers); with every layer "
        f"full it would hold {model['n_layers'] * end['full']['held']:,} and grow by {model['n_layers'] * p:,}.")
    return lines


def markdown(result, fig_dir):
    m = result["model"]
    return _family.page(
        "gemma3_generate: Gemma-3-1B-shaped generation, numformer vs transformers, and the sliding-window KV cache",
        f"A Gemma 3 of {m['parameters'] / 1e6:.1f}M parameters ({m['n_layers']} layers, {m['sliding_layers']} of "
        f"them with a window of {m['window']}; hidden {m['d_model']}, {m['n_heads']} query heads and "
        f"{m['n_kv_heads']} key/value head of head_dim {m['head_dim']}, q/k norms, tanh GeGLU d_ff {m['d_ff']}, "
        f"vocabulary {m['vocab_size']}, tied embeddings), random float32 weights shared by both libraries.",
        result, cache_markdown(result["kv_cache"], m))
