"""What the parts timing a Hugging Face family against transformers share (``qwen2_generate``,
``qwen3_generate``, ``gemma3_generate``): the two models on the same random weights, their generation speed at
each batch size (``hf_generate.measure``), the model's description, and the markdown of the speed table.

``run_speed`` builds a ``transformers`` model from a config with random initialization, imports it into
numformer through a ``save_pretrained`` folder (``hf_generate.random_models``: the same float32 weights), and
times greedy generation: a random prompt continued by greedy tokens, tokens/s of the whole call (prefill
included), the best of the rounds, numformer in each threading mode against PyTorch eager on one thread and on
as many threads as numformer's (the ratio against the faster), with the fraction of numformer's tokens equal to
transformers' (on one thread).
"""
from __future__ import annotations

import os
import time

import numpy as np

from .._runtime import get_num_threads, single_threaded
from . import _measure
from .hf_generate import _load_text, measure, random_models
from .profile import Timers, timed_ops


def load_average():
    """The machine's 1-minute load average (None where the platform has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def describe(model):
    """The shape of a numformer GPT imported from a family: what the parts' pages print."""
    c, first = model.config, model.config.layers[0]
    windows = [b.sliding_window for b in c.layers]
    return {"parameters": model.num_parameters(), "n_layers": c.n_layers, "d_model": c.d_model,
            "n_heads": first.n_heads, "n_kv_heads": first.n_kv_heads, "head_dim": first.head_dim,
            "d_ff": first.d_ff, "vocab_size": c.vocab_size, "tied": c.tie_weights,
            "sliding_layers": sum(w is not None for w in windows),
            "window": next((w for w in windows if w is not None), None)}


def run_speed(config_class, model_class, hf_config, prompt, new_tokens, batches=(1,), repeats=2, log=print):
    """(numformer GPT, transformers model, result): the speed of greedy generation at each batch size in
    ``batches`` for ``transformers.<model_class>(<config_class>(**hf_config))`` with random weights; the
    result's "rows" are ``measure``'s rows by batch size ({"1": row, ...})."""
    import torch
    import transformers

    load_start = load_average()
    threads = get_num_threads()
    model, tmodel = random_models(config_class, model_class, hf_config)
    torch_threads = sorted({1, threads})       # transformers at its faster count: 1 thread wins on a loaded machine
    rows = {str(batch): measure(model, tmodel, batch, prompt, new_tokens, threads, repeats, log=log,
                                torch_threads=torch_threads)
            for batch in batches}                      # by batch size: the docs cite rows.1.ratio
    profile = decoding_profile(model)
    return model, tmodel, {
        "model": describe(model), "prompt_tokens": prompt, "new_tokens": new_tokens, "threads": threads,
        "torch_threads": torch_threads, "torch": torch.__version__,
        "transformers": transformers.__version__, "rows": rows, "profile": profile,
        "load_average": {"start": load_start, "end": load_average()}}


def decoding_profile(model, prompt=64, steps=8):
    """Where one batch-1 decoding step's time goes in numformer, its kernels and the BLAS on one thread: seconds
    per step by op family (``bench.profile``'s families, every op of ``nn.dispatch.OPS`` and the attention
    kernels timed; "other" is the rest: the modules' own arithmetic and Python), the mean of ``steps`` steps
    after a prompt of ``prompt`` tokens, and the output head's product over the vocabulary alone, timed apart."""
    timers = Timers()
    idx = np.random.default_rng(0).integers(0, model.vocab_size, (1, prompt))
    with single_threaded(), timed_ops(timers):
        caches = model.new_kv_caches()
        model(idx, kv_caches=caches, logits_to_keep=1)
        timers.seconds.clear()
        start = time.perf_counter()
        for t in range(steps):
            model(idx[:, t:t + 1], kv_caches=caches, logits_to_keep=1)
        step = (time.perf_counter() - start) / steps
        families = {k: v / steps for k, v in timers.seconds.items()}
        hidden = np.ones((1, 1, model.d_model), model.dtype)
        head = _measure.best_time(lambda: model.lm_head(hidden), min_total=0.2, max_repeats=steps)
    families["other"] = max(0.0, step - sum(families.values()))
    return {"step_seconds": step, "unembedding_seconds": head, "prompt_tokens": prompt,
            "families": dict(sorted(families.items(), key=lambda kv: -kv[1]))}


def profile_text(profile, vocab_size):
    """One paragraph: the step's time by op family, in percent."""
    step = profile["step_seconds"]
    parts = ", ".join(f"{name} {100 * s / step:.0f}%" for name, s in profile["families"].items()
                      if s >= 0.005 * step)
    return (f"Where a batch-1 decoding step's time goes in numformer (one thread, after {profile['prompt_tokens']} "
            f"positions, {1000 * step:.1f} ms a step here): {parts}; the output head's product over the "
            f"{vocab_size:,} tokens of the vocabulary alone takes {1000 * profile['unembedding_seconds']:.1f} ms "
            f"({100 * profile['unembedding_seconds'] / step:.0f}% of the step, timed apart).")


def setting_text(result):
    """One sentence: what was generated and on how many threads by which versions."""
    return (f"A prompt of {result['prompt_tokens']} random tokens continued by {result['new_tokens']} greedy "
            f"tokens; tokens/s = generated tokens / wall time of the whole call (prefill included), best of the "
            f"rounds, each round timing every contender in turn; transformers {result['transformers']} with "
            f"PyTorch {result['torch']} eager on {' and '.join(map(str, result['torch_threads']))} threads (the "
            f"ratio is against the faster), numformer on {result['threads']} threads in each threading mode "
            f"(one_thread: everything on the calling thread; numformer: OpenBLAS on one thread, products split "
            f"by numformer; blas: OpenBLAS's own threads).")


def speed_table(rows):
    """Markdown lines of ``rows`` ({batch: row}): one line per batch size, numformer's modes, transformers on each
    thread count, the ratio of the fastest of each, the same tokens."""
    counts = list(next(iter(rows.values()))["transformers_tokens_per_s_by_threads"])
    lines = ["| batch | numformer one_thread | numformer numformer | numformer blas | "
             + " | ".join(f"transformers {c} thread{'s' * (c != '1')}" for c in counts)
             + " | ratio (best) | same tokens |", "|---:" * (6 + len(counts)) + "|"]
    for r in rows.values():
        t, theirs = r["numformer_tokens_per_s"], r["transformers_tokens_per_s_by_threads"]
        lines.append(f"| {r['batch']} | {t.get('one_thread', 0):,.2f} | {t.get('numformer', 0):,.2f} | "
                     f"{t.get('blas', 0):,.2f} | " + " | ".join(f"{theirs[c]:,.2f}" for c in counts)
                     + f" | {r['ratio']:.2f}x ({r['best_mode']}) | {100 * r['same_tokens_fraction']:.0f}% |")
    return lines


def page(heading, model_text, result, more=()):
    """A part's markdown section: its heading, the model (``model_text``), the setting, the speed table, the lines
    ``more`` and the load averages."""
    return "\n".join([f"## {heading}", "", f"{model_text} {setting_text(result)}", "", *speed_table(result["rows"]),
                      "", profile_text(result["profile"], result["model"]["vocab_size"]), "", *more,
                      *([""] if more else []), _load_text(result)])
