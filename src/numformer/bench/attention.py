"""Attention scaling: time and peak memory of one attention layer's forward + backward against sequence length.

One ``MultiHeadAttention`` layer (d_model 64, 4 heads, batch 1, float32, no
mask: full attention, the worst case) is trained one step — forward, then
backward of a random output gradient, parameter gradients included — at
sequence lengths 128, 256, …, 16,384, with the plain kernel (which builds the
(heads, T, T) score, weight and gradient matrices) and the memory-efficient
kernel (``attention="flash"``: block-wise online softmax, recomputation in
backward). Each point runs in a fresh process (see ``_measure``): the time is
the best of a few runs after a warm-up (``_measure.best_time``: a point whose
warm-up takes over half a second is timed by that one run), the peak memory is
tracemalloc's high-water mark of the arrays allocated during the step, and the
process's peak RSS is reported too. The plain kernel is skipped where its
peak, extrapolated as T² from the longest length measured so far, would exceed
``PLAIN_BUDGET`` (3 GiB; the first length, before any measurement, uses
``plain_estimate``).
The exponent of each curve is the least-squares slope of log y on log T, over
all points and over the three longest (the asymptotic regime: at short lengths
fixed costs — block buffers, the layer's own arrays — flatten the curves).
"""
from __future__ import annotations

from ..nn import MultiHeadAttention
from . import _measure
from .runner import image_link

D_MODEL, N_HEADS, BATCH = 64, 4, 1
LENGTHS = [128 * 2 ** i for i in range(8)]                 # 128 … 16,384
QUICK_LENGTHS = [128, 256, 512, 1024, 2048]
PLAIN_BUDGET = 3 * 2 ** 30                                  # bytes of arrays the plain kernel may use at one point
TARGET_LENGTH, TARGET_BYTES = 16_384, 2 * 10 ** 9           # the figure to reach: flash at 16,384, peak RSS <= 2 GB
KERNELS = ("plain", "flash")


def plain_estimate(T, heads=N_HEADS, batch=BATCH, itemsize=4):
    """Pessimistic a-priori peak of the plain kernel: scores, weights and their gradients, 6 (B, H, T, T) arrays."""
    return 6 * batch * heads * T * T * itemsize


def linear_fit(xs, ys):
    """Least-squares y ≈ a + b·x: intercept a, slope b, and the largest residual relative to y."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    return {"intercept_bytes": a, "bytes_per_token": b,
            "max_relative_residual": max(abs(a + b * x - y) / y for x, y in zip(xs, ys))}


def measure_point(kernel, T, d_model=D_MODEL, n_heads=N_HEADS, batch=BATCH, causal=False, block=None, seed=0):
    """One training step of one attention layer; runs in a child process. Returns a JSON-able dict."""
    import numpy as np

    rss_start = _measure.rss_bytes()
    rng = np.random.default_rng(seed)
    layer = MultiHeadAttention(d_model, n_heads, rng=rng, attention=kernel)
    if block:
        layer.flash_block_q = layer.flash_block_k = int(block)
    x = rng.standard_normal((batch, T, d_model)).astype(np.float32)
    dout = rng.standard_normal((batch, T, d_model)).astype(np.float32)

    def step():
        layer.zero_grad()
        layer(x, is_causal=causal)
        dx = layer.backward(dout)
        return float(np.abs(dx).sum())

    seconds = _measure.best_time(step, min_total=0.5, max_repeats=5)
    rss_before = _measure.rss_bytes()
    check, peak, _ = _measure.traced_peak(step)
    return {"kernel": kernel, "T": T, "seconds": seconds, "peak_bytes": peak, "max_rss_bytes": _measure.max_rss_bytes(),
            "rss_before_bytes": rss_before, "rss_start_bytes": rss_start, "finite": bool(np.isfinite(check))}


def baseline_rss():
    """RSS of a child that imports numformer and builds the layer but runs nothing (the fixed cost)."""
    import numpy as np

    MultiHeadAttention(D_MODEL, N_HEADS, rng=np.random.default_rng(0))
    return {"max_rss_bytes": _measure.max_rss_bytes()}


def run(quick=False, lengths=None, kernels=KERNELS, plain_budget=PLAIN_BUDGET, log=None):
    lengths = list(lengths or (QUICK_LENGTHS if quick else LENGTHS))
    points, skipped, predicted = _measure_points(lengths, kernels, plain_budget, log)
    result = {"setup": {"d_model": D_MODEL, "n_heads": N_HEADS, "batch": BATCH, "dtype": "float32", "mask": "none",
                        "step": "forward + backward (input and parameter gradients)",
                        "flash_block": [256, 256], "plain_budget_bytes": plain_budget,
                        "blas_threads_env": _measure.blas_env()},
              "lengths": lengths, "baseline_rss_bytes": _measure.run_child("attention", "baseline_rss", {})[
                  "max_rss_bytes"]}
    for kernel in kernels:
        result[kernel] = _kernel_summary(points[kernel], skipped[kernel])
    if "plain" in kernels:
        result["plain"]["skipped_predicted_peak_bytes"] = [predicted[T] for T in skipped["plain"]]
    if "flash" in kernels:
        _flash_findings(result, points["flash"])
    if "plain" in kernels and "flash" in kernels:
        _compare_at_largest_common(result)
    return result


def _measure_points(lengths, kernels, plain_budget, log):
    """Each kernel at each length, in a fresh process; the plain kernel is skipped where its peak, extrapolated
    as T² from its last point, would exceed ``plain_budget``. Returns (points, skipped lengths, predictions)."""
    points = {k: [] for k in kernels}
    skipped = {k: [] for k in kernels}
    predicted = {}
    for T in lengths:
        for kernel in kernels:
            if kernel == "plain":
                last = points["plain"][-1] if points["plain"] else None
                predicted[T] = plain_estimate(T) if last is None else last["peak_bytes"] * (T / last["T"]) ** 2
                if predicted[T] > plain_budget:
                    skipped[kernel].append(T)
                    continue
            p = _measure.run_child("attention", "measure_point", {"kernel": kernel, "T": T})
            points[kernel].append(p)
            if log:
                log(f"  {kernel:5s} T={T:6d}: {p['seconds']:.3f} s, peak {p['peak_bytes'] / 2 ** 20:.1f} MiB")
    return points, skipped, predicted


def _kernel_summary(pts, skipped):
    """A kernel's series and its fitted exponents, over every length and over the three longest."""
    Ts = [p["T"] for p in pts]
    tail = pts[-3:]
    return {
        "T": Ts,
        "seconds": [p["seconds"] for p in pts],
        "peak_bytes": [p["peak_bytes"] for p in pts],
        "max_rss_bytes": [p["max_rss_bytes"] for p in pts],
        "skipped_T": skipped,
        "time_exponent": _measure.fit_exponent(Ts, [p["seconds"] for p in pts]),
        "memory_exponent": _measure.fit_exponent(Ts, [p["peak_bytes"] for p in pts]),
        "tail_T": [p["T"] for p in tail],
        "time_exponent_tail": _measure.fit_exponent([p["T"] for p in tail], [p["seconds"] for p in tail]),
        "memory_exponent_tail": _measure.fit_exponent([p["T"] for p in tail], [p["peak_bytes"] for p in tail]),
    }


def _flash_findings(result, points):
    """The memory-efficient kernel's linear memory fit (over its three longest lengths) and its result at
    TARGET_LENGTH: the process's peak RSS there against TARGET_BYTES."""
    if len(points) >= 2:
        tail = points[-3:]
        result["flash"]["memory_linear_fit"] = linear_fit([p["T"] for p in tail], [p["peak_bytes"] for p in tail])
    at = {p["T"]: p for p in points}.get(TARGET_LENGTH)
    result["target"] = {"T": TARGET_LENGTH, "budget_bytes": TARGET_BYTES, "measured": at is not None}
    if at is not None:
        result["target"].update({"peak_bytes": at["peak_bytes"], "max_rss_bytes": at["max_rss_bytes"],
                                 "seconds": at["seconds"], "within_budget": at["max_rss_bytes"] <= TARGET_BYTES})


def _compare_at_largest_common(result):
    common = sorted(set(result["plain"]["T"]) & set(result["flash"]["T"]))
    if common:
        T = common[-1]
        p = result["plain"]["T"].index(T)
        f = result["flash"]["T"].index(T)
        result["largest_common"] = {
            "T": T,
            "memory_ratio_plain_over_flash": result["plain"]["peak_bytes"][p] / result["flash"]["peak_bytes"][f],
            "time_ratio_plain_over_flash": result["plain"]["seconds"][p] / result["flash"]["seconds"][f]}


def _fmt_mib(b):
    return "—" if b is None else f"{b / 2 ** 20:,.1f}"


def _fmt_exp(e):
    return "—" if e is None else f"{e:.2f}"


def markdown(result, fig_dir):
    path = _plot(result, fig_dir)
    lines = _tables(result) + _findings(result)
    lines += ["", "Both kernels still do O(T²) work (time exponent ≈ 2: 4x the length, ~16x the time); only the "
              "memory differs: the plain kernel's grows as T² (exponent ≈ 2), the memory-efficient kernel's as T "
              "(its fixed per-block buffers dominate at small T, so the exponent over all points is below 1).",
              "", image_link(path, "attention time and memory against sequence length", fig_dir)]
    return "\n".join(lines)


def _plot(result, fig_dir):
    """attention_scaling.png: time and peak memory against T, log-log, one line per kernel; returns its path."""
    from pathlib import Path

    plt = _measure.plt()
    kernels = [k for k in KERNELS if k in result]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for k in kernels:
        r = result[k]
        axes[0].loglog(r["T"], r["seconds"], "o-", label=f"{k} (slope {_fmt_exp(r['time_exponent'])})")
        axes[1].loglog(r["T"], [b / 2 ** 20 for b in r["peak_bytes"]], "o-",
                       label=f"{k} (slope {_fmt_exp(r['memory_exponent'])})")
    axes[1].axhline(2e9 / 2 ** 20, color="gray", ls="--", lw=1, label="2 GB")
    axes[0].set(xlabel="sequence length T", ylabel="seconds (forward + backward)", title="time")
    axes[1].set(xlabel="sequence length T", ylabel="peak MiB (tracemalloc)", title="peak memory")
    for ax in axes:
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(fig_dir) / "attention_scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tables(result):
    """The heading, the set-up, the per-length table and the fitted exponents."""
    kernels = [k for k in KERNELS if k in result]
    s = result["setup"]
    lines = ["## attention: time and memory against sequence length", "",
             f"One attention layer (d_model {s['d_model']}, {s['n_heads']} heads, batch {s['batch']}, {s['dtype']}, "
             f"no mask), one training step ({s['step']}), each point in a fresh process. Peak = tracemalloc's "
             f"high-water mark of the arrays allocated during the step (NumPy reports its buffers to tracemalloc); "
             f"RSS = the process's peak resident memory (interpreter and libraries included; a process that only "
             f"imports numformer and builds the layer peaks at {_fmt_mib(result.get('baseline_rss_bytes'))} MiB).",
             "", "| T | plain s | flash s | plain peak MiB | flash peak MiB | plain RSS MiB | flash RSS MiB |",
             "|---:|---:|---:|---:|---:|---:|---:|"]

    def at(k, key, T):
        r = result.get(k)
        if r is None or T not in r["T"]:
            return None
        return r[key][r["T"].index(T)]

    for T in result["lengths"]:
        ps, fs = at("plain", "seconds", T), at("flash", "seconds", T)
        lines.append(f"| {T:,} | {'skipped' if ps is None else f'{ps:.3f}'} | "
                     f"{'—' if fs is None else f'{fs:.3f}'} | {_fmt_mib(at('plain', 'peak_bytes', T))} | "
                     f"{_fmt_mib(at('flash', 'peak_bytes', T))} | {_fmt_mib(at('plain', 'max_rss_bytes', T))} | "
                     f"{_fmt_mib(at('flash', 'max_rss_bytes', T))} |")
    lines += ["", "| kernel | time exponent | memory exponent | over T = | time exponent | memory exponent |",
              "|---|---:|---:|---|---:|---:|"]
    for k in kernels:
        r = result[k]
        lines.append(f"| {k} | {_fmt_exp(r['time_exponent'])} | {_fmt_exp(r['memory_exponent'])} | "
                     f"{', '.join(f'{t:,}' for t in r['tail_T'])} | {_fmt_exp(r['time_exponent_tail'])} | "
                     f"{_fmt_exp(r['memory_exponent_tail'])} |")
    return lines + ["", "(first two columns: fitted over every length; last two: over the three longest of the kernel)",
                    ""]


def _findings(result):
    """One sentence each: the plain kernel's skipped lengths, the 2 GB target, the linear fit, the ratio."""
    lines = []
    if result.get("plain", {}).get("skipped_T"):
        sk = result["plain"]["skipped_T"]
        pred = result["plain"].get("skipped_predicted_peak_bytes") or [plain_estimate(t) for t in sk]
        lines.append(f"The plain kernel is skipped at T = {', '.join(f'{t:,}' for t in sk)}: extrapolating its peak "
                     f"as T², it would need about {pred[0] / 2 ** 30:.1f} GiB at {sk[0]:,}"
                     + (f" and {pred[-1] / 2 ** 30:.1f} GiB at {sk[-1]:,}" if len(sk) > 1 else "")
                     + f" (budget {result['setup']['plain_budget_bytes'] / 2 ** 30:.0f} GiB).")
    t = result.get("target")
    if t and t.get("measured"):
        lines.append(f"At T = {t['T']:,} the memory-efficient kernel trains the layer in {t['seconds']:.1f} s with a "
                     f"peak of {_fmt_mib(t['peak_bytes'])} MiB of arrays and {_fmt_mib(t['max_rss_bytes'])} MiB of "
                     f"process RSS: {'within' if t['within_budget'] else 'NOT within'} the 2 GB target.")
    fit = result.get("flash", {}).get("memory_linear_fit")
    if fit:
        lines.append(f"Over the three longest lengths the memory-efficient kernel's peak is "
                     f"{_fmt_mib(fit['intercept_bytes'])} MiB + {fit['bytes_per_token'] / 1024:.2f} KiB per token "
                     f"(largest residual {100 * fit['max_relative_residual']:.1f}%): linear in T.")
    lc = result.get("largest_common")
    if lc:
        lines.append(f"At T = {lc['T']:,}, the largest length both kernels ran, the plain kernel uses "
                     f"{lc['memory_ratio_plain_over_flash']:.0f}x the memory and "
                     f"{lc['time_ratio_plain_over_flash']:.1f}x the time of the memory-efficient one.")
    return lines
