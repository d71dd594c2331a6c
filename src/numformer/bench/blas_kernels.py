"""Generation speed against OpenBLAS's kernel family: GPT-2 small's shape under each ``OPENBLAS_CORETYPE``.

NumPy's OpenBLAS picks one family of kernels for the CPU when it loads (Haswell's AVX2 kernels, SkylakeX's
and Cooperlake's AVX-512 ones, Zen's, ...), and the small products of decoding run at different speeds with
each. The choice is fixed once the library is loaded, so each family runs in a fresh process with
``OPENBLAS_CORETYPE`` set ("default": OpenBLAS's own choice, named in the table); only the families whose
instructions this CPU has are tried. Each process generates greedily as ``numformer generate`` does (the
BLAS's own threads) with GPT-2 small's shape (124M parameters, random weights, seed 0): a 64-token prompt
continued by 128 tokens at batch 1 and 8, tokens/s = generated tokens / wall time of the whole call, the best
of the runs, as in ``hf_generate``, and the best of ``ROUNDS`` alternating rounds of fresh processes.
"""
from __future__ import annotations

import time

import numpy as np

from ..models import GPT
from .._runtime import openblas_core, set_fast_runtime
from . import _measure

GPT2_SMALL = {"vocab_size": 50257, "block_size": 1024, "d_model": 768, "n_layers": 12, "n_heads": 12}
QUICK_CONFIG = {"vocab_size": 1000, "block_size": 128, "d_model": 128, "n_layers": 2, "n_heads": 4}
# family -> the CPU flag (from /proc/cpuinfo) its kernels need
FAMILIES = {"default": None, "Haswell": "avx2", "Zen": "avx2", "SkylakeX": "avx512f", "Cooperlake": "avx512_bf16"}
PROMPT, NEW_TOKENS, BATCHES = 64, 128, (1, 8)
ROUNDS = 3


def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def measure_family(config, prompt, new_tokens, batches, repeats):
    """In this (fresh) process: OpenBLAS's kernel family and numformer's greedy tokens/s at each batch size."""
    set_fast_runtime(blas="native")                     # as `numformer generate`
    model = GPT(**config, activation="gelu_tanh", bias=True, tie_weights=True, dropout=0.0, rng=0)
    speeds = {}
    for batch in batches:
        idx = np.random.default_rng(batch).integers(0, config["vocab_size"], (batch, prompt))
        model.generate(idx, 2, greedy=True)             # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.generate(idx, new_tokens, greedy=True)
            best = min(best, time.perf_counter() - t0)
        speeds[str(batch)] = batch * new_tokens / best
    return {"core": openblas_core(), "tokens_per_s": speeds}


def run(quick=False, log=print, rounds=None):
    """Every family in ``rounds`` alternating rounds (a fresh process each time: where the weights land in
    memory differs between processes, and batch 1, bound by memory, moves with it); each family's figure is its
    best round, and the table shows the range over rounds."""
    flags = cpu_flags()
    config = QUICK_CONFIG if quick else GPT2_SMALL
    prompt, new = (16, 8) if quick else (PROMPT, NEW_TOKENS)
    families = [f for f, flag in FAMILIES.items() if flag is None or flag in flags]
    rounds = rounds or (1 if quick else ROUNDS)
    runs = {f: [] for f in families}
    for _ in range(rounds):
        for family in families:
            env = {} if family == "default" else {"OPENBLAS_CORETYPE": family}
            runs[family].append(_measure.run_child(
                "blas_kernels", "measure_family", {"config": config, "prompt": prompt, "new_tokens": new,
                                                   "batches": list(BATCHES), "repeats": 1 if quick else 2}, env=env))
            if log:
                speeds = ", ".join(f"batch {b}: {v:,.1f}" for b, v in runs[family][-1]["tokens_per_s"].items())
                log(f"  {family} ({runs[family][-1]['core']} kernels): {speeds} tokens/s")
    rows = {f: {"core": r[0]["core"],
                "tokens_per_s": {str(b): max(x["tokens_per_s"][str(b)] for x in r) for b in BATCHES},
                "range": {str(b): [min(x["tokens_per_s"][str(b)] for x in r), max(x["tokens_per_s"][str(b)] for x in r)]
                          for b in BATCHES}} for f, r in runs.items()}
    return {"config": config, "prompt_tokens": prompt, "new_tokens": new, "batches": list(BATCHES),
            "rounds": rounds, "rows": rows, "blas_threads_env": _measure.blas_env()}


def markdown(result, fig_dir):
    rows, batches = result["rows"], [str(b) for b in result["batches"]]
    default = rows.get("default", {}).get("tokens_per_s", {})
    lines = ["## blas_kernels: generation speed with each of OpenBLAS's kernel families", "",
             f"numformer's greedy generation (the BLAS's own threads, as `numformer generate`) with a "
             f"{result['config']['n_layers']}-layer d_model {result['config']['d_model']} GPT (vocabulary "
             f"{result['config']['vocab_size']}): a {result['prompt_tokens']}-token prompt continued by "
             f"{result['new_tokens']} tokens, each kernel family in a fresh process with `OPENBLAS_CORETYPE` set "
             f"(default: OpenBLAS's own choice for this CPU). Families whose instructions the CPU lacks are left "
             f"out.", "",
             "| OPENBLAS_CORETYPE | kernels | " + " | ".join(f"batch {b} tokens/s | vs default" for b in batches)
             + " |", "|---|---|" + "---:|---:|" * len(batches)]
    for family, r in rows.items():
        cells = []
        for b in batches:
            v, (lo, hi) = r["tokens_per_s"][b], r.get("range", {}).get(b, (None, None))
            spread = f" ({lo:,.1f}–{hi:,.1f})" if lo is not None and result.get("rounds", 1) > 1 else ""
            cells.append(f"{v:,.1f}{spread} | " + (f"{v / default[b]:.2f}x" if default.get(b) else "—"))
        lines.append(f"| {family} | {r['core']} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", f"Each figure is the best of {result.get('rounds', 1)} rounds, a fresh process "
                                   f"each (the range over rounds in brackets)."])
