"""Generation with a SmolLM-135M-shaped Llama: numformer against transformers, and the KV cache of
grouped-query attention against full multi-head attention.

The model has SmolLM-135M's shape (30 layers, d_model 576, 9 query heads and 3 key/value heads, SwiGLU
d_ff 1536, vocabulary 49152, tied embeddings, RoPE θ 10000) with random float32 weights: a
``transformers.LlamaForCausalLM`` is saved with ``save_pretrained`` and imported by
``numformer.interop.hf``, so both libraries run the same weights (nothing is downloaded). Speed:
``hf_generate.measure`` (a prompt of 64 tokens continued by 128 greedy tokens at batch 1, best of the
runs, each numformer threading mode, PyTorch on as many threads).

KV cache: after a prompt of 64 tokens and 128 generated ones (192 positions, batch 1), the bytes the
caches' arrays hold for those positions, summed over the layers, for the model as it is
(n_kv_heads = 3) and for the same shape with n_kv_heads = 9 (multi-head) and 1 (multi-query): the
arrays are measured, not computed from the formula 2 · layers · n_kv_heads · d_head · positions · 4 bytes
(which they must equal). ``--quick``: a 2-layer d_model 64 Llama.
"""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from .._runtime import get_num_threads
from ..models import GPT
from .hf_generate import measure, random_models
from .hf_generate import cpu_row  # noqa: F401  (bench.md's row per CPU model: the ratio at each batch size)

REQUIRES = ("torch", "transformers")     # the reference it measures against: the runner refuses the part without it

PROMPT, NEW_TOKENS = 64, 128
SMOLLM_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                   tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5)
QUICK_CONFIG = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    tie_word_embeddings=True, rope_theta=10000.0)


def _models(hf_config):
    """(numformer GPT, transformers LlamaForCausalLM) with the same random float32 weights."""
    return random_models("LlamaConfig", "LlamaForCausalLM", hf_config)


def kv_cache_bytes(model, n_kv_heads, positions, rng=0):
    """Bytes of the keys and values a prefill of ``positions`` tokens leaves in the caches (batch 1), for
    ``model``'s shape with ``n_kv_heads`` key/value heads (random weights: only the shapes matter)."""
    config = replace(model.config, layers=tuple(replace(b, n_kv_heads=n_kv_heads) for b in model.config.layers))
    other = GPT(config, rng=np.random.default_rng(rng)).eval()
    caches = other.new_kv_caches()
    other(np.zeros((1, positions), dtype=np.int64), kv_caches=caches, logits_to_keep=1)
    return sum(c.k[:, :, :c.stored].nbytes + c.v[:, :, :c.stored].nbytes for c in caches)


def run(quick=False, log=print):
    import torch

    load = (lambda: os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    load_start = load()
    prompt, new = (16, 8) if quick else (PROMPT, NEW_TOKENS)
    threads = get_num_threads()
    model, tmodel = _models(QUICK_CONFIG if quick else SMOLLM_135M)
    row = measure(model, tmodel, 1, prompt, new, threads, 1 if quick else 2, log=log)
    positions = prompt + new
    heads = model.n_heads
    cache = {str(kv): kv_cache_bytes(model, kv, positions) for kv in sorted({heads, model.n_kv_heads, 1})}
    return {"model": {"parameters": model.num_parameters(), "n_layers": model.n_layers, "d_model": model.d_model,
                      "n_heads": heads, "n_kv_heads": model.n_kv_heads, "d_ff": model.d_ff,
                      "vocab_size": model.vocab_size},
            "prompt_tokens": prompt, "new_tokens": new, "threads": threads, "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__, "row": row,
            "cache_positions": positions, "kv_cache_bytes": cache,
            "load_average": {"start": load_start, "end": load()}}


def markdown(result, fig_dir):
    m, r = result["model"], result["row"]
    t = r["numformer_tokens_per_s"]
    lines = ["## llama_generate: SmolLM-135M-shaped generation and the grouped-query KV cache", "",
             f"A Llama of {m['parameters'] / 1e6:.1f}M parameters ({m['n_layers']} layers, d_model "
             f"{m['d_model']}, {m['n_heads']} query heads, {m['n_kv_heads']} key/value heads, SwiGLU d_ff "
             f"{m['d_ff']}, vocabulary {m['vocab_size']}), random float32 weights shared by both libraries; a "
             f"prompt of {result['prompt_tokens']} tokens continued by {result['new_tokens']} greedy tokens at "
             f"batch 1, best of the runs; transformers {result['transformers']} with PyTorch {result['torch']} "
             f"eager on {result['torch_threads']} threads, numformer on {result['threads']} threads.", "",
             "| numformer one_thread | numformer numformer | numformer blas | transformers | ratio (best) "
             "| same tokens |", "|---:|---:|---:|---:|---:|---:|",
             f"| {t.get('one_thread', 0):,.1f} | {t.get('numformer', 0):,.1f} | {t.get('blas', 0):,.1f} | "
             f"{r['transformers_tokens_per_s']:,.1f} | {r['ratio']:.2f}x ({r['best_mode']}) | "
             f"{100 * r['same_tokens_fraction']:.0f}% |", "",
             f"Load average at the start and the end: {result['load_average']['start'] or 0:.1f}, "
             f"{result['load_average']['end'] or 0:.1f} (on a shared machine these speeds are noisy; the cache bytes "
             f"are not).", "",
             f"KV cache after {result['cache_positions']} positions (batch 1, float32), measured from the cache "
             f"arrays:", "", "| key/value heads | bytes | of multi-head |", "|---:|---:|---:|"]
    cache = result["kv_cache_bytes"]
    full = cache[str(m["n_heads"])]
    for kv in sorted(cache, key=int, reverse=True):
        lines.append(f"| {kv} | {cache[kv]:,} | {cache[kv] / full:.2f} |")
    return "\n".join(lines)
