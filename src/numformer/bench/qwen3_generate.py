"""Generation with a Qwen3-0.6B-shaped Qwen3: numformer against transformers on the same random weights.

The model has Qwen3-0.6B's shape (Qwen/Qwen3-0.6B's config.json: 28 layers, hidden 1024, 16 query heads and 8
key/value heads of head_dim 128, so queries 2048 wide, RMSNorm of each query and key head before RoPE, no
biases, SwiGLU d_ff 3072, vocabulary 151936, tied embeddings, RoPE θ 10⁶; 596M parameters) with random float32
weights: a ``transformers.Qwen3ForCausalLM`` is saved with ``save_pretrained`` and imported by
``numformer.interop.hf`` (family "qwen3"), so both libraries run the same weights (nothing is downloaded).
Speed: ``_family.run_speed`` (a prompt of 64 tokens continued by 64 greedy tokens at batch 1 and 8, best of
the rounds, each numformer threading mode, PyTorch on one thread and on as many threads, the ratio against the
faster). ``--quick``: a 2-layer hidden-64 Qwen3 with head_dim 32 (queries 128 wide), a prompt of 16 tokens
continued by 8.
"""
from __future__ import annotations

from . import _family
from .hf_generate import cpu_row  # noqa: F401  (bench.md's row per CPU model: the ratio at each batch size)

REQUIRES = ("torch", "transformers")     # the reference it measures against: the runner refuses the part without it

PROMPT, NEW_TOKENS, BATCHES = 64, 64, (1, 8)
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                 tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False)
QUICK_CONFIG = dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                    tie_word_embeddings=True, rope_theta=1e6)


def run(quick=False, log=print):
    prompt, new = (16, 8) if quick else (PROMPT, NEW_TOKENS)
    _, _, result = _family.run_speed("Qwen3Config", "Qwen3ForCausalLM", QUICK_CONFIG if quick else QWEN3_06B,
                                     prompt, new, BATCHES, 1 if quick else 2, log=log)
    return result


def markdown(result, fig_dir):
    m = result["model"]
    return _family.page(
        "qwen3_generate: Qwen3-0.6B-shaped generation, numformer vs transformers",
        f"A Qwen3 of {m['parameters'] / 1e6:.1f}M parameters ({m['n_layers']} layers, hidden {m['d_model']}, "
        f"{m['n_heads']} query heads and {m['n_kv_heads']} key/value heads of head_dim {m['head_dim']}, q/k "
        f"RMSNorm, SwiGLU d_ff {m['d_ff']}, vocabulary {m['vocab_size']}, tied embeddings), random float32 "
        f"weights shared by both libraries.", result)
