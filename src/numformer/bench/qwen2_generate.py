"""Generation with a Qwen2.5-0.5B-shaped Qwen2: numformer against transformers on the same random weights.

The model has Qwen2.5-0.5B's shape (24 layers, d_model 896, 14 query heads and 2 key/value heads, q/k/v
biases, SwiGLU d_ff 4864, vocabulary 151936, tied embeddings, RoPE θ 10⁶, 494M parameters) with random
float32 weights: a ``transformers.Qwen2ForCausalLM`` is saved with ``save_pretrained`` and imported by
``numformer.interop.hf`` (family "qwen2"), so both libraries run the same weights (nothing is downloaded).
Speed: ``hf_generate.measure`` (a prompt of 64 tokens continued by 64 greedy tokens at batch 1, best of
the runs, each numformer threading mode, PyTorch on as many threads). ``--quick``: a 2-layer d_model 64 Qwen2.
"""
from __future__ import annotations

import os

from .._runtime import get_num_threads
from .hf_generate import measure, random_models

PROMPT, NEW_TOKENS = 64, 64
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False)
QUICK_CONFIG = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    tie_word_embeddings=True, rope_theta=1e6)


def run(quick=False, log=print):
    import torch

    load = (lambda: os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    load_start = load()
    prompt, new = (16, 8) if quick else (PROMPT, NEW_TOKENS)
    threads = get_num_threads()
    model, tmodel = random_models("Qwen2Config", "Qwen2ForCausalLM", QUICK_CONFIG if quick else QWEN25_05B)
    row = measure(model, tmodel, 1, prompt, new, threads, 1 if quick else 2, log=log)
    return {"model": {"parameters": model.num_parameters(), "n_layers": model.n_layers, "d_model": model.d_model,
                      "n_heads": model.n_heads, "n_kv_heads": model.n_kv_heads, "d_ff": model.d_ff,
                      "vocab_size": model.vocab_size},
            "prompt_tokens": prompt, "new_tokens": new, "threads": threads, "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__, "row": row,
            "load_average": {"start": load_start, "end": load()}}


def markdown(result, fig_dir):
    m, r = result["model"], result["row"]
    t = r["numformer_tokens_per_s"]
    return "\n".join([
        "## qwen2_generate: Qwen2.5-0.5B-shaped generation, numformer vs transformers", "",
        f"A Qwen2 of {m['parameters'] / 1e6:.1f}M parameters ({m['n_layers']} layers, d_model {m['d_model']}, "
        f"{m['n_heads']} query heads, {m['n_kv_heads']} key/value heads, q/k/v biases, SwiGLU d_ff {m['d_ff']}, "
        f"vocabulary {m['vocab_size']}, tied embeddings), random float32 weights shared by both libraries; a "
        f"prompt of {result['prompt_tokens']} tokens continued by {result['new_tokens']} greedy tokens at batch 1, "
        f"best of the runs; transformers {result['transformers']} with PyTorch {result['torch']} eager on "
        f"{result['torch_threads']} threads, numformer on {result['threads']} threads.", "",
        "| numformer one_thread | numformer numformer | numformer blas | transformers | ratio (best) | same tokens |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {t.get('one_thread', 0):,.1f} | {t.get('numformer', 0):,.1f} | {t.get('blas', 0):,.1f} | "
        f"{r['transformers_tokens_per_s']:,.1f} | {r['ratio']:.2f}x ({r['best_mode']}) | "
        f"{100 * r['same_tokens_fraction']:.0f}% |", "",
        f"Load average at the start and the end: {result['load_average']['start'] or 0:.1f}, "
        f"{result['load_average']['end'] or 0:.1f} (on a shared machine these speeds are noisy; the ratio, measured "
        f"in one process, less so)."])
