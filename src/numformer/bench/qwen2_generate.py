"""Generation with a Qwen2.5-0.5B-shaped Qwen2: numformer against transformers on the same random weights.

The model has Qwen2.5-0.5B's shape (24 layers, d_model 896, 14 query heads and 2 key/value heads, q/k/v
biases, SwiGLU d_ff 4864, vocabulary 151936, tied embeddings, RoPE θ 10⁶, 494M parameters) with random
float32 weights: a ``transformers.Qwen2ForCausalLM`` is saved with ``save_pretrained`` and imported by
``numformer.interop.hf`` (family "qwen2"), so both libraries run the same weights (nothing is downloaded).
Speed: ``_family.run_speed`` (a prompt of 64 tokens continued by 64 greedy tokens at batch 1, best of
the rounds, each numformer threading mode, PyTorch on one thread and on as many threads, the ratio against the
faster). ``--quick``: a 2-layer d_model 64 Qwen2, a prompt of 16 tokens continued by 8.
"""
from __future__ import annotations

from . import _family
from .hf_generate import cpu_row  # noqa: F401  (bench.md's row per CPU model: the ratio at each batch size)

REQUIRES = ("torch", "transformers")     # the reference it measures against: the runner refuses the part without it

PROMPT, NEW_TOKENS = 64, 64
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False)
QUICK_CONFIG = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    tie_word_embeddings=True, rope_theta=1e6)


def run(quick=False, log=print):
    prompt, new = (16, 8) if quick else (PROMPT, NEW_TOKENS)
    _, _, result = _family.run_speed("Qwen2Config", "Qwen2ForCausalLM", QUICK_CONFIG if quick else QWEN25_05B,
                                     prompt, new, (1,), 1 if quick else 2, log=log)
    return result


def markdown(result, fig_dir):
    m = result["model"]
    return _family.page(
        "qwen2_generate: Qwen2.5-0.5B-shaped generation, numformer vs transformers",
        f"A Qwen2 of {m['parameters'] / 1e6:.1f}M parameters ({m['n_layers']} layers, d_model {m['d_model']}, "
        f"{m['n_heads']} query heads, {m['n_kv_heads']} key/value heads, q/k/v biases, SwiGLU d_ff {m['d_ff']}, "
        f"vocabulary {m['vocab_size']}, tied embeddings), random float32 weights shared by both libraries.", result)
