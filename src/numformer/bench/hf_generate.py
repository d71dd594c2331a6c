"""Generation speed of GPT-2 small: numformer against Hugging Face transformers' ``generate`` (PyTorch eager).

The model has GPT-2 small's shape (124M parameters: 12 layers, 12 heads, d_model 768, vocabulary
50257, context 1024) with random weights: a ``transformers.GPT2LMHeadModel`` built from
``GPT2Config()`` is saved with ``save_pretrained`` and imported by ``numformer.interop.hf``, so both
libraries run the same float32 weights (nothing is downloaded). Each run continues a random prompt of
64 tokens by 128 tokens, greedily (``do_sample=False``, no end token), at batch 1 and 8, in the same
process, PyTorch with ``torch.set_num_threads`` equal to the core count numformer uses. tokens/s counts
generated tokens (batch × 128) over the whole call, prefill included; each figure is the best of the runs.

numformer runs under each per-op threading mode of ``numformer._runtime`` (the measurement that chose the
BLAS's own threads for ``numformer generate`` and ``numformer chat``: ``cli.py`` calls
``set_fast_runtime(blas="native")`` for them):

- ``one_thread``: numformer's kernels and the BLAS on the calling thread;
- ``numformer``: OpenBLAS on one thread, numformer splitting large products by rows across its threads
  (``set_fast_runtime()``, what the ``numformer`` command sets up for training);
- ``blas``: the BLAS's own threads (``set_fast_runtime(blas="native")``).

The memory-bandwidth bound: a decoding step reads every weight once (the batch shares the read), so
no implementation can exceed batch × bandwidth ÷ weight bytes tokens/s. Bandwidth is measured here as the
best of a float32 matrix-vector product over a 256 MiB matrix (the access pattern of a decoding step)
and a copy of a 256 MiB array (read + write).
"""
from __future__ import annotations

import functools
import os
import tempfile

import numpy as np

from .. import _runtime
from .._runtime import get_num_threads
from ..interop.hf import load_pretrained
from . import _measure

REQUIRES = ("torch", "transformers")     # the reference it measures against: the runner refuses the part without it

PROMPT, NEW_TOKENS, BATCHES = 64, 128, (1, 8)
MODES = ("one_thread", "numformer", "blas")
QUICK_CONFIG = {"vocab_size": 1000, "n_positions": 128, "n_embd": 128, "n_layer": 2, "n_head": 4}


def _models(hf_config):
    """(numformer GPT, transformers GPT2LMHeadModel) with the same random weights, float32, evaluation mode."""
    return random_models("GPT2Config", "GPT2LMHeadModel", hf_config)


def random_models(config_class, model_class, hf_config):
    """(numformer GPT, transformers ``model_class``) with the same random float32 weights (seed 0), evaluation
    mode: the transformers model is saved and imported as a user's checkpoint would be."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**hf_config, bos_token_id=0, eos_token_id=0)
    tmodel = getattr(transformers, model_class)(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        tmodel.save_pretrained(folder)
        model, _ = load_pretrained(folder)
    return model, tmodel


def memory_bandwidth(mib=256, repeats=5):
    """Bytes per second: the best of a float32 matrix-vector product over a ``mib`` MiB matrix (in the current
    threading mode) and a copy of a ``mib`` MiB array (read + write)."""
    n = int(np.sqrt(mib * 2 ** 20 / 4))
    W = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    x = np.ones(n, np.float32)
    gemv = W.nbytes / _measure.best_time(lambda: W @ x, min_total=0.5, max_repeats=repeats)
    dst = np.empty_like(W)
    copy = 2 * W.nbytes / _measure.best_time(lambda: np.copyto(dst, W), min_total=0.5, max_repeats=repeats)
    return {"matvec_bytes_per_s": gemv, "copy_bytes_per_s": copy, "bytes_per_s": max(gemv, copy)}


class _mode:
    """Context manager: numformer's threading mode ``name`` (see the module docstring), restored afterwards."""

    def __init__(self, name, threads):
        self.name, self.threads = name, threads

    def __enter__(self):
        self._saved = (_runtime.fast_runtime_status(), _runtime.get_num_threads(), _runtime.owns_blas())
        if self.name == "one_thread":
            self._ctx = _runtime.single_threaded().__enter__()
        else:
            self._ctx = None
            _runtime.set_num_threads(self.threads)
            _runtime.set_fast_runtime(blas="numformer" if self.name == "numformer" else "native")
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        _runtime.set_num_threads(self._saved[1])
        _runtime.set_fast_runtime(blas="numformer" if self._saved[2] else "native")
        return False


def measure(model, tmodel, batch, prompt_len, new_tokens, threads, repeats, modes=MODES, log=None,
            torch_threads=None):
    """tokens/s of numformer (each mode) and transformers (on each count of ``torch_threads``, default
    (``threads``,)) for one batch size, the best of ``repeats`` rounds; each round times every contender once,
    so a load that changes during the run weighs on all of them. Whether numformer's tokens equal transformers'."""
    import torch

    idx = np.random.default_rng(batch).integers(0, model.vocab_size, (batch, prompt_len))
    t_ids = torch.from_numpy(idx)

    def theirs(count, tokens):
        torch.set_num_threads(count)
        with torch.inference_mode():
            return tmodel.generate(t_ids, attention_mask=torch.ones_like(t_ids), do_sample=False,
                                   max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0,
                                   eos_token_id=None).numpy()

    def ours(mode, tokens):
        with _mode(mode, threads):
            return model.generate(idx, tokens, greedy=True)

    counts = tuple(torch_threads or (threads,))
    runs = {**{("transformers", c): functools.partial(theirs, c) for c in counts},
            **{("numformer", m): functools.partial(ours, m) for m in modes}}
    for fn in runs.values():                    # warm-up: first calls pay for allocations and lazy set-up
        fn(2)
    seconds, out = dict.fromkeys(runs, float("inf")), {}
    for _ in range(repeats):
        for key, fn in runs.items():
            s, out[key] = _measure.best_of(functools.partial(fn, new_tokens))
            seconds[key] = min(seconds[key], s)
    torch.set_num_threads(threads)
    n = batch * new_tokens
    ref = out[("transformers", counts[0])][:, prompt_len:]
    row = {"batch": batch, "numformer_tokens_per_s": {m: n / seconds[("numformer", m)] for m in modes},
           "transformers_tokens_per_s_by_threads": {str(c): n / seconds[("transformers", c)] for c in counts},
           "same_tokens_fraction": min(float((out[("numformer", m)][:, prompt_len:] == ref).mean()) for m in modes)}
    row["transformers_tokens_per_s"] = max(row["transformers_tokens_per_s_by_threads"].values())
    row["best_mode"] = max(row["numformer_tokens_per_s"], key=row["numformer_tokens_per_s"].get)
    row["ratio"] = row["numformer_tokens_per_s"][row["best_mode"]] / row["transformers_tokens_per_s"]
    if log:
        log(f"  batch {batch}: " + ", ".join(f"{lib} {how} {n / seconds[(lib, how)]:,.2f}" for lib, how in runs)
            + " tokens/s")
    return row


def run(quick=False, log=print):
    import torch

    hf_config = QUICK_CONFIG if quick else {}
    prompt, new = (16, 8) if quick else (PROMPT, NEW_TOKENS)
    threads = get_num_threads()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    model, tmodel = _models(hf_config)
    weight_bytes = sum(p.data.nbytes for p in model.parameters())
    bandwidth = memory_bandwidth(32 if quick else 256)
    rows = []
    for batch in BATCHES:
        row = measure(model, tmodel, batch, prompt, new, threads, 1 if quick else 2, log=log)
        row["bandwidth_bound_tokens_per_s"] = batch * bandwidth["bytes_per_s"] / weight_bytes
        rows.append(row)
    c = model.blocks[0]
    return {"model": {"parameters": model.num_parameters(), "n_layers": model.n_layers, "d_model": model.d_model,
                      "n_heads": model.n_heads, "vocab_size": model.vocab_size, "d_ff": c.d_ff},
            "prompt_tokens": prompt, "new_tokens": new, "threads": threads, "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__, "weight_bytes": weight_bytes, "bandwidth": bandwidth, "rows": rows,
            "load_average": {"start": load_start, "end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
            "blas_threads_env": _measure.blas_env()}


def cpu_row(result):
    """The figures bench.md keeps per CPU model (``runner.keep_cpu_rows``) for the parts timing numformer against
    transformers: the ratio of their tokens/s (numformer's fastest mode over transformers) at each batch size
    (``rows``: a list of rows, or rows by batch size; ``row``: one row)."""
    rows = result["rows"] if "rows" in result else [result["row"]]
    rows = rows.values() if isinstance(rows, dict) else rows
    return {f"ratio batch {r['batch']}": r["ratio"] for r in rows}


def _load_text(result):
    """The machine's 1-minute load average as ``result`` recorded it (a number: at the end; a dict: at start and
    end), read against the machine's cores: the average counts the benchmark's own threads, so only a load above
    the cores says that other work shared them."""
    load = result.get("load_average")
    if load is None:
        return ""
    cores = result.get("_run", {}).get("machine", {}).get("cores")
    if isinstance(load, dict):
        text = f"Load average {load.get('start') or 0:.1f} at the start and {load.get('end') or 0:.1f} at the end"
        busiest = max(load.get("start") or 0, load.get("end") or 0)
    else:
        text, busiest = f"Load average {load:.1f} at the end of the run", load
    if cores is None:
        return f"{text} (on a shared machine these figures are noisy)."
    if busiest <= cores + 0.5:
        return (f"{text}: it counts the benchmark's own threads, and stayed within this machine's {cores} cores "
                f"(no other work of note ran).")
    return f"{text}: above this machine's {cores} cores, other processes shared them (the figures are noisy)."


def markdown(result, fig_dir):
    m = result["model"]
    bw = result["bandwidth"]
    lines = ["## hf_generate: GPT-2 small generation, numformer vs transformers", "",
             f"GPT-2 small's shape ({m['parameters'] / 1e6:.0f}M parameters, {m['n_layers']} layers, d_model "
             f"{m['d_model']}, vocabulary {m['vocab_size']}), random float32 weights shared by both libraries; "
             f"a prompt of {result['prompt_tokens']} tokens continued by {result['new_tokens']} greedy tokens; "
             f"tokens/s = generated tokens / wall time of the whole call (prefill included), best of the runs. "
             f"transformers {result.get('transformers', '')} with PyTorch "
             f"{result['torch']} eager on {result['torch_threads']} threads; numformer on {result['threads']} "
             f"threads in each threading mode (one_thread: everything on the calling thread; numformer: OpenBLAS "
             f"on one thread, products split by numformer; blas: OpenBLAS's own threads).", "",
             "| batch | numformer one_thread | numformer numformer | numformer blas | transformers | ratio (best) "
             "| bandwidth bound | same tokens |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        t = r["numformer_tokens_per_s"]
        lines.append(f"| {r['batch']} | {t.get('one_thread', 0):,.1f} | {t.get('numformer', 0):,.1f} | "
                     f"{t.get('blas', 0):,.1f} | {r['transformers_tokens_per_s']:,.1f} | {r['ratio']:.2f}x "
                     f"({r['best_mode']}) | {r['bandwidth_bound_tokens_per_s']:,.0f} | "
                     f"{100 * r['same_tokens_fraction']:.0f}% |")
    lines += ["", f"Bandwidth bound = batch × measured bandwidth ({bw['bytes_per_s'] / 1e9:.1f} GB/s: best of a "
                  f"matrix-vector product, {bw['matvec_bytes_per_s'] / 1e9:.1f} GB/s, and a copy, "
                  f"{bw['copy_bytes_per_s'] / 1e9:.1f} GB/s) ÷ weight bytes read per step "
                  f"({result['weight_bytes'] / 1e6:.0f} MB). {_load_text(result)}"]
    return "\n".join(lines)
