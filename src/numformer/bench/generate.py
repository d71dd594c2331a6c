"""Inference latency per generated token, with and without the key/value cache, against context length.

The model is the MiniLLM configuration: GPT with 6 layers, 6 heads, d_model 384,
context 256, vocabulary 65 (nanoGPT's Shakespeare-char model), float32,
evaluation mode, batch 1, random weights (latency does not depend on them).

For a context of L tokens, the latency of the next token is

- *with the cache*: one forward of the single newest token through
  ``model(idx_new, kv_caches=caches)``, the caches already holding the L - 1
  earlier positions (the step appends one key/value row per layer and
  attends over L keys: O(L) work);
- *without the cache*: one forward of all L tokens, of which only the last
  position's logits are used (O(L²) attention and L times the matrix work).

Each figure is the best of several runs. ``generation`` also times producing a
whole sequence token by token (greedy) from a one-token prompt up to the full
context, the mean per token, both ways.

``--quantize int8`` (``--group-size G``) measures the same model with int8 weights
(``numformer.quantize.quantize_model``), written as its own section ``generate_int8``
beside the float32 one.
"""
from __future__ import annotations

import time

import numpy as np

from ..models import GPT
from ..quantize import quantize_model
from . import _measure
from .runner import image_link

CONFIG = {"vocab_size": 65, "block_size": 256, "n_layers": 6, "n_heads": 6, "d_model": 384}
LENGTHS = [8, 16, 32, 64, 128, 256]
QUICK_LENGTHS = [16, 64, 256]
TARGET_SPEEDUP = 5.0


def _is_minillm(config):
    """Whether a measured configuration is MiniLLM's (``CONFIG``; the result adds its derived keys)."""
    return all(config.get(k) == v for k, v in CONFIG.items())


def _model(config, seed=0):
    return GPT(**config, rng=np.random.default_rng(seed)).eval()


def _best(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def token_latency(model, L, repeats=5, seed=0):
    """(seconds with the cache, seconds without) for the token at position L - 1 given L - 1 earlier ones."""
    idx = np.random.default_rng(seed).integers(0, model.vocab_size, (1, L))
    caches = model.new_kv_caches()
    if L > 1:
        model(idx[:, :L - 1], kv_caches=caches)
    new = idx[:, L - 1:]

    def cached_step():
        for c in caches:
            c.length = L - 1                       # forget the row the previous repeat appended
        return model(new, kv_caches=caches)

    def full_forward():
        out = model(idx)
        model.clear_cache()                        # inference only: drop what forward kept for backward
        return out

    np.testing.assert_allclose(cached_step()[:, -1], full_forward()[:, -1], rtol=1e-3, atol=1e-4)
    return _best(cached_step, repeats), _best(full_forward, max(1, repeats // 2 + 1))


def generation_latency(model, n_tokens, use_cache, seed=0):
    """Mean seconds per token generating n_tokens greedily after a one-token prompt."""
    idx = np.random.default_rng(seed).integers(0, model.vocab_size, (1, 1))
    caches = model.new_kv_caches() if use_cache else None
    t0 = time.perf_counter()
    new = idx
    for _ in range(n_tokens):
        if use_cache:
            logits = model(new, kv_caches=caches)
        else:
            logits = model(idx)
            model.clear_cache()
        new = np.argmax(logits[:, -1], axis=-1)[:, None]
        idx = np.concatenate([idx, new], axis=1)
    return (time.perf_counter() - t0) / n_tokens, idx[0].tolist()


def run(quick=False, config=None, lengths=None, repeats=None, generation_tokens=None, log=None, quantize=None,
        group_size=None):
    if group_size is not None and quantize is None:
        raise ValueError(f"--group-size {group_size} is the int8 weights' group size: give it with --quantize int8 "
                         f"(or leave it out for float32)")
    config = dict(config or CONFIG)
    lengths = [L for L in (lengths or (QUICK_LENGTHS if quick else LENGTHS)) if L <= config["block_size"]]
    repeats = repeats or (3 if quick else 7)
    model = _model(config)
    quantized = None
    if quantize is not None:
        if quantize != "int8":
            raise ValueError(f"bench generate --quantize takes int8, got {quantize!r}")
        quantized = str(quantize_model(model, 8, group_size))
        if log:
            log(f"  {quantized}")
    with_cache, without = [], []
    for L in lengths:
        a, b = token_latency(model, L, repeats)
        with_cache.append(a)
        without.append(b)
        if log:
            log(f"  L={L:4d}: cache {1e3 * a:.2f} ms, no cache {1e3 * b:.2f} ms ({b / a:.1f}x)")
    result = {"config": {**config, "type": "gpt", "d_ff": 4 * config["d_model"]}, "dtype": "float32", "batch": 1,
              "blas_threads_env": _measure.blas_env(), "lengths": lengths,
              "seconds_with_cache": with_cache, "seconds_without_cache": without,
              "speedup": [b / a for a, b in zip(with_cache, without)],
              "time_exponent_with_cache": _measure.fit_exponent(lengths, with_cache),
              "time_exponent_without_cache": _measure.fit_exponent(lengths, without), "quantized": quantized}
    L = max(lengths)
    result["at_longest"] = {"L": L, "speedup": result["speedup"][-1],
                            "reached_target": result["speedup"][-1] >= TARGET_SPEEDUP, "target": TARGET_SPEEDUP}
    n = generation_tokens if generation_tokens is not None else (0 if quick else config["block_size"] - 1)
    if n:
        cached, toks_a = generation_latency(model, n, True)
        plain, toks_b = generation_latency(model, n, False)
        result["generation"] = {"tokens": n, "seconds_per_token_with_cache": cached,
                                "seconds_per_token_without_cache": plain, "speedup": plain / cached,
                                "same_tokens": toks_a == toks_b}
    return result


def cpu_row(result):
    """The figures bench.md keeps per CPU model (``runner.keep_cpu_rows``): the per-token latency with the cache,
    and the cache's speedup, at the longest context and over a whole greedy generation."""
    t, g = result["at_longest"], result.get("generation") or {}
    i = result["lengths"].index(t["L"])
    return {f"ms per token at L={t['L']} (cache)": 1e3 * result["seconds_with_cache"][i],
            f"cache speedup at L={t['L']}": t["speedup"], "cache speedup, whole generation": g.get("speedup")}


def markdown(result, fig_dir):
    from pathlib import Path

    plt = _measure.plt()
    Ls = result["lengths"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(Ls, [1e3 * s for s in result["seconds_with_cache"]], "o-", label="with KV cache")
    ax.loglog(Ls, [1e3 * s for s in result["seconds_without_cache"]], "o-", label="without (full recompute)")
    name = "MiniLLM" if _is_minillm(result["config"]) else f"{result['config']['n_layers']}-layer GPT"
    ax.set(xlabel="context length (tokens)", ylabel="ms per token", title=f"next-token latency ({name}, batch 1)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    int8 = result.get("quantized")
    path = Path(fig_dir) / ("generate_int8_latency.png" if int8 else "generate_latency.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    c = result["config"]
    lines = [f"## generate{'_int8' if int8 else ''}: per-token latency with and without the key/value cache"
             f"{' (int8 weights)' if int8 else ''}", "",
             f"{'MiniLLM configuration' if _is_minillm(c) else 'Configuration'}: GPT, {c['n_layers']} layers, "
             f"{c['n_heads']} heads, d_model {c['d_model']}, "
             f"context {c['block_size']}, vocabulary {c['vocab_size']}, {result['dtype']}, batch {result['batch']}, "
             + (f"weights quantized: {int8}; " if int8 else "") + "evaluation mode. Latency of the next token given a context of L tokens: with the cache one "
             "forward of the new token (the caches hold the L - 1 earlier positions); without it a forward of all "
             "L tokens. Best of several runs.", "",
             "| context L | with cache ms | without cache ms | speedup |", "|---:|---:|---:|---:|"]
    for L, a, b, s in zip(Ls, result["seconds_with_cache"], result["seconds_without_cache"], result["speedup"]):
        lines.append(f"| {L} | {1e3 * a:.2f} | {1e3 * b:.2f} | {s:.1f}x |")
    t = result["at_longest"]
    lines += ["", f"At context {t['L']} the cache is {t['speedup']:.1f}x faster per token "
                  f"(target: at least {t['target']:.0f}x at the longest context). Fitted exponents of latency "
                  f"against L: "
                  f"{result['time_exponent_with_cache']:.2f} with the cache, "
                  f"{result['time_exponent_without_cache']:.2f} without."]
    g = result.get("generation")
    if g:
        lines.append(f"Generating {g['tokens']} tokens greedily from a one-token prompt: "
                     f"{1e3 * g['seconds_per_token_with_cache']:.2f} ms per token with the cache, "
                     f"{1e3 * g['seconds_per_token_without_cache']:.2f} ms without ({g['speedup']:.1f}x); "
                     f"the tokens are {'the same' if g['same_tokens'] else 'NOT the same'} both ways.")
    lines += ["", image_link(path, "per-token latency with and without the KV cache", fig_dir)]
    return "\n".join(lines)
