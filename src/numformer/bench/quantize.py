"""int8 weight-only quantization: generation speed against float32, and what it costs in loss.

Speed (``speedup_b1``, ``speedup_b8``): a GPT of Qwen3-0.6B's kind and shape (hidden 1024, 28 layers, 16
query and 8 key/value heads, SwiGLU 3072, vocabulary 151936, RoPE θ 10⁶, RMSNorm, no biases, tied
embeddings) with random float32 weights, continuing a random prompt of 8 tokens by 16 greedy tokens at
batch 1 and 8. The same model object runs both ways: its float ``Linear`` layers and their
``QuantizedLinear`` replacements (``numformer.quantize.quantize_model``) are swapped in turn, the two
alternating round by round (best of the rounds), in each of numformer's threading modes
(``MODES``); the speedups compare each variant at its fastest mode. tokens/s = generated
tokens / wall time of the whole call, prefill included; the process's CPU time is recorded too (on one
thread it is what a machine loaded by other processes disturbs least: ``speedup_b1_one_thread_cpu``).
Its head size is Qwen3's 128 (queries 2048 wide, not hidden / heads = 64), with Qwen3's q/k RMSNorm.

Bytes per token: the bytes of every linear layer's weights (and scales), which one decoding step reads
once (the batch shares the read; norms, the one embedding row and the short KV cache are left out), and
the bandwidth bound batch × bandwidth / bytes, the bandwidth measured as in ``hf_generate`` in each mode.

Accuracy (``val_loss_increase``): the speedrun's model (configs/shakespeare_speedrun.toml), a run folder
given with ``--run-dir`` or trained here for the budget (``runs/bench_quantize_speedrun``); the loss on the
whole validation split, float32 and quantized at each bits × group size of the sweep; the headline is
int8 at the group size of the speed measurement. ``logits_error``: max |Δlogits| / max |logits| on the
first validation batch (and on the random-weight model's 64-token prompt, 16 with ``--quick``).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np

from .._runtime import get_num_threads
from ..config import find_config, load_config
from ..models import GPT
from ..nn import Linear
from ..quantize import QuantizedLinear, kernel, quantize_model, worker_processes
from ..train import Trainer, evaluate_loss, load_config_json, load_model, load_task
from . import _measure
from .hf_generate import _load_text, _mode, memory_bandwidth
from .runner import image_link

QWEN3_06B = {"vocab_size": 151936, "d_model": 1024, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8, "d_ff": 3072,
             "head_dim": 128}
QUICK_SHAPE = {"vocab_size": 2048, "d_model": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 768,
               "head_dim": 64}
PROMPT, NEW_TOKENS, BATCHES = 8, 16, (1, 8)
# numformer's threading modes measured (of ``hf_generate.MODES``): "blas" (OpenBLAS's own threads for float32)
# is left out: on a machine loaded by other processes its spinning threads made float32 five times slower than
# either mode here (results/bench.md, 2026-11-25), which measures the load, not int8. "processes" is "numformer"
# with the int8 products' rows shared with worker processes (``numformer.quantize.worker_processes``; float32
# runs as in "numformer"); measured only with more than one thread.
MODES = ("one_thread", "numformer", "processes")
SWEEP = [(8, None), (8, 128), (8, 64), (8, 32), (4, None), (4, 128), (4, 64), (4, 32), (3, None), (3, 64), (3, 32)]
QUICK_SWEEP = [(8, None), (8, 32), (4, 32)]
TARGETS = {"speedup_b1": 1.8, "val_loss_increase": 0.005}
RUN_DIR = Path("runs") / "bench_quantize_speedrun"


def build_model(shape, seed=0):
    """(GPT of Qwen3's kind at ``shape``, its head size): random float32 weights, evaluation mode."""
    model = GPT(vocab_size=shape["vocab_size"], block_size=PROMPT + NEW_TOKENS, n_layers=shape["n_layers"],
                n_heads=shape["n_heads"], n_kv_heads=shape["n_kv_heads"], d_model=shape["d_model"],
                d_ff=shape["d_ff"], head_dim=shape["head_dim"], qk_norm=True, positional="rope", rope_theta=1e6,
                activation="swiglu", norm="rms", bias=False, tie_weights=True, rng=np.random.default_rng(seed))
    return model.eval(), shape["head_dim"]


def bytes_per_token(model):
    """Bytes one decoding step reads from the weights: every linear layer's weights, scales and biases."""
    total = 0
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            total += m.nbytes
        elif isinstance(m, Linear):
            total += m.weight.data.nbytes + (0 if m.bias is None else m.bias.data.nbytes)
    return total


def _use(model, layers):
    for name, layer in layers.items():
        model.set_submodule(name, layer)


def logits_error(model, float_layers, int8_layers, ids):
    """(max |Δlogits| / max |logits|, fraction of positions whose top token agrees) of int8 against float32."""
    _use(model, float_layers)
    ref = model(ids)
    _use(model, int8_layers)
    got = model(ids)
    model.clear_cache()
    return (float(np.abs(got - ref).max() / np.abs(ref).max()),
            float((got.argmax(-1) == ref.argmax(-1)).mean()))


def generation_speed(model, variants, batch, new_tokens, rounds):
    """{variant: (wall seconds, process CPU seconds)} of greedy generation at ``batch``, each the best of
    ``rounds``, the variants ({name: layers}) alternating round by round; and the generated tokens."""
    prompt = np.random.default_rng(batch).integers(0, model.vocab_size, (batch, PROMPT))
    best, tokens = {name: (float("inf"), float("inf")) for name in variants}, {}
    for r in range(rounds):
        for name, layers in variants.items():
            _use(model, layers)
            if r == 0:
                model.generate(prompt, 2, greedy=True)                 # warm-up: allocations, thread pools
            wall, cpu = time.perf_counter(), _cpu_seconds_now()
            tokens[name] = model.generate(prompt, new_tokens, greedy=True)[:, PROMPT:]
            wall, cpu = time.perf_counter() - wall, _cpu_seconds_now() - cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best, tokens


def _cpu_seconds_now():
    """CPU seconds of this process and of the int8 worker processes, if any (their polling counts)."""
    pool = kernel._product_pool
    return time.process_time() + (pool.cpu_seconds() if pool is not None else 0.0)


def speed_row(model, variants, bytes_read, bandwidth, batch, new_tokens, rounds):
    """One row of the speed table: tokens/s (wall and per CPU second) of float32 and int8, their ratios, the
    bandwidth bounds, and the fraction of generated tokens int8 shares with float32."""
    best, tokens = generation_speed(model, variants, batch, new_tokens, rounds)
    n = batch * new_tokens
    row = {"batch": batch, "same_tokens_fraction": float((tokens["int8"] == tokens["float32"]).mean())}
    for name, (wall, cpu) in best.items():
        row[f"{name}_tokens_per_s"] = n / wall
        row[f"{name}_tokens_per_cpu_s"] = n / cpu
        row[f"{name}_bound_tokens_per_s"] = batch * bandwidth["bytes_per_s"] / bytes_read[name]
    row["speedup"] = row["int8_tokens_per_s"] / row["float32_tokens_per_s"]
    row["cpu_speedup"] = row["int8_tokens_per_cpu_s"] / row["float32_tokens_per_cpu_s"]
    return row


def speed(shape, group_size, quick, log):
    """The speed part (see the module docstring)."""
    model, head_dim = build_model(shape)
    float_layers = {n: m for n, m in model.named_modules() if isinstance(m, Linear)}
    bytes_read, parameters = {"float32": bytes_per_token(model)}, model.num_parameters()
    report = quantize_model(model, 8, group_size)
    int8_layers = {n: m for n, m in model.named_modules() if n in float_layers}
    bytes_read["int8"] = bytes_per_token(model)
    log(f"  {report}")
    ids = np.random.default_rng(7).integers(0, model.vocab_size, (1, 64 if not quick else 16))
    err, agree = logits_error(model, float_layers, int8_layers, ids)
    variants = {"float32": float_layers, "int8": int8_layers}
    costs = kernel_costs(model, float_layers, int8_layers, 2 if quick else 5, log)
    threads, rows, bandwidth = get_num_threads(), [], {}
    for mode in [m for m in MODES if m != "processes" or threads > 1]:
        with _mode("numformer" if mode == "processes" else mode, threads), _workers(mode, model, int8_layers):
            bandwidth[mode] = memory_bandwidth(32 if quick else 256)
            for batch in BATCHES:
                row = speed_row(model, variants, bytes_read, bandwidth[mode], batch, 4 if quick else NEW_TOKENS,
                                1 if quick else 3)
                rows.append({"mode": mode, **row})
                log(f"  {mode}, batch {batch}: float32 {row['float32_tokens_per_s']:,.2f} tokens/s, int8 "
                    f"{row['int8_tokens_per_s']:,.2f} ({row['speedup']:.2f}x; in CPU time {row['cpu_speedup']:.2f}x)")
    return {"shape": {**shape, "head_dim_used": head_dim}, "parameters": parameters,
            "group_size": group_size, "quantized": str(report), "layers_quantized": len(report.quantized),
            "layers_kept_float": len(report.kept_float), "bytes_per_token": bytes_read,
            "bandwidth": bandwidth, "threads": threads, "rows": rows, "best": best_of_modes(rows),
            "logits_error": {"max_relative": err, "top1_agreement": agree}, "kernel": costs}


def _workers(mode, model, int8_layers):
    """Worker processes over the int8 layers in mode "processes" (the model holds its int8 layers on entry and
    gets them back on exit, their weights private again), else nothing."""
    if mode != "processes":
        return contextlib.nullcontext()
    _use(model, int8_layers)
    return worker_processes(model)


def best_of_modes(rows):
    """Per batch: the fastest threading mode of float32 and of int8, and the ratio of the two."""
    best = []
    for batch in BATCHES:
        mine = [r for r in rows if r["batch"] == batch]
        f = max(mine, key=lambda r: r["float32_tokens_per_s"])
        q = max(mine, key=lambda r: r["int8_tokens_per_s"])
        best.append({"batch": batch, "float32_tokens_per_s": f["float32_tokens_per_s"], "float32_mode": f["mode"],
                     "int8_tokens_per_s": q["int8_tokens_per_s"], "int8_mode": q["mode"],
                     "speedup": q["int8_tokens_per_s"] / f["float32_tokens_per_s"]})
    return best


def kernel_costs(model, float_layers, int8_layers, rounds, log):
    """Nanoseconds of one-thread CPU time per weight of a batch-1 product through every linear layer of the
    model: float32 (``Linear``, the BLAS reading float32 from memory), int8 (``QuantizedLinear``: the kernel),
    and the two passes of the kernel apart: the int8 -> float conversion of each block alone, and the
    product of a float block already in the cache alone; then the int8 kernel at the block sizes L2 / 4, L2,
    ``kernel.BLOCK_BYTES`` (4 × L2) and 4 × that (L2: one core's, ``kernel.l2_cache_bytes``). Float32 and int8
    alternate round by round; best of the rounds."""
    weights = sum(m.weight.data.size for m in float_layers.values())
    xs = {K: np.random.default_rng(K).standard_normal((1, K)).astype(np.float32)
          for K in {m.in_features for m in float_layers.values()}}
    pairs = [(float_layers[n], int8_layers[n]) for n in float_layers]

    def conversion():
        for _, q in pairs:
            R = kernel._block_rows(q.in_features, 4)
            B = kernel._block(R, q.in_features, np.float32)
            for r0 in range(0, q.out_features, R):
                np.copyto(B[:min(R, q.out_features - r0)], q.qweight[r0:r0 + R], casting="unsafe")

    def product():
        for _, q in pairs:
            R = kernel._block_rows(q.in_features, 4)
            B, x = kernel._block(R, q.in_features, np.float32), xs[q.in_features][0]
            for r0 in range(0, q.out_features, R):
                np.matmul(B[:min(R, q.out_features - r0)], x)

    passes = {"float32": lambda: [f(xs[f.in_features]) for f, _ in pairs],
              "int8": lambda: [q(xs[q.in_features]) for _, q in pairs], "conversion": conversion, "product": product}
    chosen, l2 = kernel.BLOCK_BYTES, kernel.l2_cache_bytes()
    sizes = sorted({l2 // 4, l2, chosen, 4 * chosen})
    best = dict.fromkeys([*passes, *(f"int8 block {b >> 10} KiB" for b in sizes)], float("inf"))
    with _mode("one_thread", 1):
        for _ in range(rounds):
            for name, fn in passes.items():
                best[name] = min(best[name], _cpu_seconds(fn))
            for b in sizes:
                kernel.BLOCK_BYTES = b
                try:
                    best[f"int8 block {b >> 10} KiB"] = min(best[f"int8 block {b >> 10} KiB"],
                                                            _cpu_seconds(passes["int8"]))
                finally:
                    kernel.BLOCK_BYTES = chosen
    ns = {name: 1e9 * t / weights for name, t in best.items()}
    log("  ns per weight, one thread: " + ", ".join(f"{k} {v:.3f}" for k, v in ns.items()))
    return {"ns_per_weight": ns, "block_bytes": chosen, "l2_bytes": l2, "weights": weights,
            "speedup": ns["float32"] / ns["int8"]}


def _cpu_seconds(fn):
    t = time.process_time()
    fn()
    return time.process_time() - t


def check_training_folder(run_dir, overwrite):
    """Without ``--run-dir`` the part trains into ``RUN_DIR``: refused, before anything is measured, when that
    folder holds files and ``overwrite`` was not given (as every folder numformer writes)."""
    if run_dir is None and RUN_DIR.exists() and any(RUN_DIR.iterdir()) and not overwrite:
        raise ValueError(f"{RUN_DIR} already holds files: give --run-dir {RUN_DIR} to measure the run it holds, or "
                         f"--overwrite to train the speedrun's model there again")


def trained_run(run_dir, quick, log, overwrite=False):
    """(the speedrun's run folder to measure, whether it was trained here)."""
    if run_dir is not None:
        return Path(run_dir), False
    budget = 0.25 if quick else 10.0
    log(f"  training the speedrun's model for {budget} minutes into {RUN_DIR} (give --run-dir RUN_DIR to reuse one)")
    Trainer(load_config(find_config("shakespeare_speedrun")), RUN_DIR, overwrite=overwrite,
            overrides=[f"train.budget_minutes={budget}"], quiet=True).train()
    return RUN_DIR, True


def accuracy(run_dir, sweep, log, max_batches=0):
    """The whole-validation loss of the run's model in float32 and quantized at each (bits, group size)
    (``max_batches``: a fixed sample of that many batches instead, for a quick run)."""
    config = load_config_json(run_dir)
    task = load_task(run_dir, config)
    batch_size = config["train"]["eval_batch_size"] or config["train"]["batch_size"]
    model = load_model(run_dir, config).eval()
    base = evaluate_loss(model, task, "val", batch_size, max_batches)
    ids = next(iter(task.eval_batches("val", batch_size))).inputs["idx"]
    ref = model(ids)
    log(f"  float32: validation loss {base:.4f}")
    rows = []
    for bits, group_size in sweep:
        model = load_model(run_dir, config).eval()
        report = quantize_model(model, bits, group_size)
        loss = evaluate_loss(model, task, "val", batch_size, max_batches)
        err = float(np.abs(model(ids) - ref).max() / np.abs(ref).max())
        rows.append({"bits": bits, "group_size": group_size, "val_loss": loss, "increase": loss / base - 1,
                     "logits_error": err, "quantized": str(report)})
        log(f"  int{bits} group {group_size or 'row'}: {loss:.4f} ({100 * (loss / base - 1):+.3f}%)")
    return {"run_dir": str(run_dir), "model": {k: config["model"][k] for k in ("n_layers", "d_model", "n_heads")},
            "val_loss_float32": base, "rows": rows,
            "val_tokens": (max_batches * batch_size or task.eval_size("val")) * config["data"]["block_size"]}


def run(quick=False, run_dir=None, group_size=None, shape=None, sweep=None, log=print, overwrite=False):
    """The speed part at ``shape`` (default Qwen3-0.6B's) and the accuracy part on the run folder ``run_dir``
    (default: the speedrun's model trained here, into ``RUN_DIR``: new or empty, else ``overwrite``) over
    ``sweep`` ([(bits, group size)]); see the module docstring. ``group_size``: of the speed measurement and the
    headline ``val_loss_increase``."""
    check_training_folder(run_dir, overwrite)
    load = (lambda: os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    load_start = load()
    shape = shape or (QUICK_SHAPE if quick else QWEN3_06B)
    result = {"speed": speed(shape, group_size, quick, log)}
    folder, trained = trained_run(run_dir, quick, log, overwrite)
    sweep = list(sweep or (QUICK_SWEEP if quick else SWEEP))
    sweep = sweep if (8, group_size) in sweep else [(8, group_size), *sweep]
    result["accuracy"] = {**accuracy(folder, sweep, log, 2 if quick else 0), "trained_here": trained}
    headline = next(r for r in result["accuracy"]["rows"] if r["bits"] == 8 and r["group_size"] == group_size)
    best = {r["batch"]: r for r in result["speed"]["best"]}
    one_thread = {r["batch"]: r for r in result["speed"]["rows"] if r["mode"] == "one_thread"}
    result.update(speedup_b1=best[1]["speedup"], speedup_b8=best[8]["speedup"],
                  speedup_b1_one_thread_cpu=one_thread[1]["cpu_speedup"],
                  val_loss_increase=headline["increase"], logits_error=headline["logits_error"],
                  quantized=headline["quantized"], targets=TARGETS,
                  load_average={"start": load_start, "end": load()})
    return result


def cpu_row(result):
    """The figures bench.md keeps per CPU model (``runner.keep_cpu_rows``): int8's tokens/s over float32's at
    batch 1 and 8 (each at its fastest threading), and the validation loss's increase at 8 bits."""
    return {"int8 speedup batch 1": result["speedup_b1"], "int8 speedup batch 8": result.get("speedup_b8"),
            "val loss increase (8 bits)": result.get("val_loss_increase")}


def _group_label(group_size):
    return "row" if group_size is None else str(group_size)


def plot_loss_against_group_size(rows, path, title):
    """One panel per bit width: the relative increase of the loss (%) against the group size ("row": one
    scale per output channel). Returns ``path``."""
    plt = _measure.plt()
    widths = sorted({r["bits"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(widths), figsize=(4.2 * len(widths), 3.4), squeeze=False)
    for ax, bits in zip(axes[0], widths):
        mine = sorted((r for r in rows if r["bits"] == bits), key=lambda r: r["group_size"] or 1 << 30)
        labels = [_group_label(r["group_size"]) for r in mine]
        ax.plot(labels, [100 * r["increase"] for r in mine], "o-", color="#3b6fb6")
        ax.axhline(0, color="#999999", lw=0.8)
        ax.set(xlabel="group size (inputs per scale)", ylabel="validation loss increase (%)", title=f"int{bits}")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _speed_lines(s):
    sh = s["shape"]
    b = s["bytes_per_token"]
    groups = "per output channel" if s["group_size"] is None else f"groups of {s['group_size']}"
    lines = [f"A GPT of Qwen3-0.6B's kind ({s['parameters'] / 1e6:.0f}M parameters: hidden {sh['d_model']}, "
             f"{sh['n_layers']} layers, {sh['n_heads']} query and {sh['n_kv_heads']} key/value heads of "
             f"{sh['head_dim_used']} with q/k RMSNorm, SwiGLU {sh['d_ff']}, vocabulary {sh['vocab_size']:,}, tied "
             f"embeddings), random float32 weights, against the "
             f"same model with int8 weights ({groups}): a prompt of {PROMPT} tokens continued greedily, the two "
             f"alternating round by round (best of the rounds), in each of numformer's threading modes on "
             f"{s['threads']} threads (one_thread: everything on the calling thread; numformer: OpenBLAS on one "
             f"thread, numformer's threads split the float32 products and the int8 kernel's rows; processes: as "
             f"numformer, the int8 products' rows shared with worker processes instead, "
             f"`numformer.quantize.worker_processes`; OpenBLAS's own "
             f"threads are left out, their spinning measures the machine's load). CPU time: the process's "
             f"(and its worker processes', their polling included), "
             f"which other processes sharing the cores disturb less than the wall time (on one thread, where no "
             f"thread spins waiting for another). {s['quantized']}.", "",
             "| threading | batch | float32 tokens/s | int8 tokens/s | speedup | speedup in CPU time "
             "| float32 bound | int8 bound | int8 / its bound | same tokens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in s["rows"]:
        lines.append(f"| {r['mode']} | {r['batch']} | {r['float32_tokens_per_s']:,.2f} | "
                     f"{r['int8_tokens_per_s']:,.2f} | {r['speedup']:.2f}x | {r['cpu_speedup']:.2f}x | "
                     f"{r['float32_bound_tokens_per_s']:,.1f} | {r['int8_bound_tokens_per_s']:,.1f} | "
                     f"{100 * r['int8_tokens_per_s'] / r['int8_bound_tokens_per_s']:.0f}% | "
                     f"{100 * r['same_tokens_fraction']:.0f}% |")
    bw = ", ".join(f"{v['bytes_per_s'] / 1e9:.1f} GB/s in {k}" for k, v in s["bandwidth"].items())
    best = "; ".join(f"batch {r['batch']}: int8 {r['int8_tokens_per_s']:,.2f} tokens/s ({r['int8_mode']}) against "
                     f"float32 {r['float32_tokens_per_s']:,.2f} ({r['float32_mode']}), {r['speedup']:.2f}x"
                     for r in s["best"])
    lines += ["", f"Each at its fastest threading: {best}.", "",
              f"Bytes read per token: {b['float32'] / 1e6:,.0f} MB in float32, {b['int8'] / 1e6:,.0f} MB "
                  f"with int8 weights ({b['float32'] / b['int8']:.2f}x fewer); bound = batch × bandwidth / bytes "
                  f"per token, the bandwidth measured as the best of a matrix-vector product and a copy ({bw}). "
                  f"Logits of a random prompt, int8 against float32: max |Δ| / max |logits| = "
                  f"{s['logits_error']['max_relative']:.4f}, top token the same at "
                  f"{100 * s['logits_error']['top1_agreement']:.0f}% of the positions."]
    return lines + ["", *_kernel_lines(s["kernel"])]


def _kernel_lines(k):
    ns = k["ns_per_weight"]
    blocks = [name for name in ns if name.startswith("int8 block")]
    return [f"Where the time goes (one thread, process CPU time per weight of a batch-1 product through all "
            f"{k['weights'] / 1e6:,.0f}M linear weights; float32 and int8 alternating, best of the rounds): the "
            f"int8 kernel converts each block of {k['block_bytes'] >> 10} KiB of float (this CPU's L2: "
            f"{k['l2_bytes'] >> 10} KiB a core) and multiplies it; the conversion and the product are also timed "
            f"apart, and the kernel at other block sizes.", "",
            "| float32 (BLAS from memory) | int8 kernel | conversion alone | product from the cache alone | "
            + " | ".join(name.replace("int8 block", "int8, blocks of") for name in blocks) + " |",
            "|" + "---:|" * (4 + len(blocks)),
            "| " + " | ".join(f"{ns[name]:.3f} ns" for name in ("float32", "int8", "conversion", "product", *blocks))
            + " |", "",
            f"int8 over float32 in this table: {k['speedup']:.2f}x (one thread, CPU time)."]


def markdown(result, fig_dir):
    s, a, t = result["speed"], result["accuracy"], result["targets"]
    path = plot_loss_against_group_size(a["rows"], Path(fig_dir) / "quantize_group_size.png",
                                        f"speedrun model (float32 whole-validation loss {a['val_loss_float32']:.4f})")
    lines = ["## quantize: int8 weights for generation", "", *_speed_lines(s), "",
             f"Accuracy: the speedrun's model ({a['model']['n_layers']} layers, d_model {a['model']['d_model']}; "
             f"{'trained here' if a['trained_here'] else 'the run folder ' + a['run_dir']}), loss on the "
             f"validation split ({a['val_tokens']:,} characters): {a['val_loss_float32']:.4f} in float32. "
             f"{result['quantized']}.", "",
             "| bits | group size | validation loss | increase | logits error |", "|---:|---:|---:|---:|---:|"]
    for r in a["rows"]:
        lines.append(f"| {r['bits']} | {_group_label(r['group_size'])} | {r['val_loss']:.4f} | "
                     f"{100 * r['increase']:+.3f}% | {r['logits_error']:.4f} |")
    fast, close = result["speedup_b1"] >= t["speedup_b1"], result["val_loss_increase"] <= t["val_loss_increase"]
    lines += ["", f"`speedup_b1` = {result['speedup_b1']:.2f}x (target >= {t['speedup_b1']}x: "
                  f"{'met' if fast else 'NOT met'}), `speedup_b8` = {result['speedup_b8']:.2f}x (each at its fastest "
                  f"threading), `speedup_b1_one_thread_cpu` = {result['speedup_b1_one_thread_cpu']:.2f}x, "
                  f"`val_loss_increase` = {100 * result['val_loss_increase']:+.3f}% (target <= "
                  f"{100 * t['val_loss_increase']:.1f}%: {'met' if close else 'NOT met'}). "
                  f"{_load_text(result)}", "",
              image_link(path, "validation loss increase against group size at each bit width", fig_dir)]
    return "\n".join(lines)
