"""Training throughput of numformer against the PyTorch reference, alternating in one session.

``numformer bench throughput [--quick]``

For each configuration, both frameworks train the same architecture from the
same weights on the same batches: forward, cross-entropy, backward and an
AdamW step (nanoGPT's hyperparameters: lr 1e-3, betas (0.9, 0.99), weight decay
0.1 on matrices and embeddings, none on biases and norms). After a warm-up,
``rounds`` rounds each time ``steps`` steps of numformer and ``steps`` steps of
PyTorch, alternating which goes first, so that both see the same machine
state; the ratio of the two throughputs is taken per round and its median is
reported. Model FLOP utilisation (MFU) = the model's matrix-multiply FLOPs per
second over the machine's float32 matrix-multiply peak measured in the same run:
the fastest of a large ``np.matmul`` on all of numformer's threads (before and
after the measurements) and the same product in ``torch``.

Both use every core they are given, each in the way it trains by default:
PyTorch its intra-op threads (every op split across the cores), numformer data
parallelism across processes (``numformer.train.parallel``, what ``numformer
train`` does with ``[train] processes = 0``): one process per core, each
computing its share of every batch on one thread. Each round also times
numformer in one process with its thread pool splitting the ops
(``numformer.set_num_threads``, after ``numformer.set_fast_runtime()``), and a
second comparison runs both frameworks on one thread, timed by CPU time
(per-core efficiency, hardly disturbed by other load on the machine).
"""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import time

import numpy as np

from .._runtime import fast_runtime_status, get_num_threads, set_fast_runtime, single_threaded
from ..models import EncoderClassifier, GPT
from ..optim import AdamW, param_groups
from ..train.parallel import ClosesOnExit, DataParallel, usable_processes
from .profile import matmul_peak
from .runner import image_link

REQUIRES = ("torch",)     # the reference it measures against: the runner refuses the part without it

OPTIM = {"lr": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.1}

# name -> title, model kind, model arguments, batch size, sequence length
CONFIGS = {
    "nanogpt": dict(title="nanoGPT CPU (shakespeare_char)", kind="gpt", batch=12, seq=64,
                    model={"vocab_size": 65, "block_size": 64, "n_layers": 4, "n_heads": 4, "d_model": 128,
                           "dropout": 0.0, "bias": False}),
    "minillm": dict(title="MiniLLM", kind="gpt", batch=8, seq=256,
                    model={"vocab_size": 100, "block_size": 256, "n_layers": 6, "n_heads": 6, "d_model": 384,
                           "dropout": 0.0, "bias": False}),
    "classifier": dict(title="minimal classifier", kind="classifier", batch=32, seq=128,
                       model={"vocab_size": 10000, "n_classes": 2, "max_len": 128, "d_model": 64, "n_heads": 1,
                              "n_layers": 1, "dropout": 0.0, "pooling": "mean", "pad_id": 0}),
}

# (warm-up steps, rounds, steps per round) for each configuration
PLAN = {"nanogpt": (5, 7, 20), "minillm": (2, 5, 3), "classifier": (5, 7, 15)}
QUICK_PLAN = {"nanogpt": (2, 3, 3), "minillm": (1, 2, 1), "classifier": (2, 3, 3)}


# -- FLOPs ------------------------------------------------------------------------------------------------

def model_flops_per_step(cfg):
    """Matrix-multiply FLOPs of one training step (forward + backward = 3x forward), attention included.

    Per token and layer, forward: 2·(3d² + d² + 2·d·d_ff) for the projections and
    2·2·T·d for QKᵀ and PV over the full T×T score matrix (what both frameworks
    compute, causal or not); plus 2·d·V for a language-model head (a classifier's head, applied once per
    sequence: 2·d·n_classes / T per token).
    """
    m = cfg["model"]
    d = m["d_model"]
    d_ff = m.get("d_ff") or 4 * d
    T = cfg["seq"]
    per_token = m["n_layers"] * (2 * (4 * d * d + 2 * d * d_ff) + 4 * T * d)
    if cfg["kind"] == "gpt":
        per_token += 2 * d * m["vocab_size"]
    else:
        per_token += 2 * d * m["n_classes"] / T
    return 3.0 * per_token * cfg["batch"] * T


def torch_matmul_peak(n=2048, repeats=5):
    import torch

    a = torch.randn(n, n)
    b = torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


# -- the two training steps -------------------------------------------------------------------------------

def build_models(cfg, seed=0):
    """(numformer model, PyTorch reference with the same weights)."""
    from .torch_reference import from_numformer  # imports torch (optional) at its top

    rng = np.random.default_rng(seed)
    if cfg["kind"] == "gpt":
        model = GPT(**cfg["model"], rng=rng)
    elif cfg["kind"] == "classifier":
        model = EncoderClassifier(**cfg["model"], rng=rng)
    else:
        raise ValueError(f"unknown model kind {cfg['kind']!r}")
    return model, from_numformer(model)


def make_batches(cfg, n=4, seed=1):
    """n (inputs, targets) batches of random token ids (ids >= 1 so that no position is padding)."""
    rng = np.random.default_rng(seed)
    m = cfg["model"]
    B, T = cfg["batch"], cfg["seq"]
    batches = []
    for _ in range(n):
        x = rng.integers(1, m["vocab_size"], (B, T))
        y = rng.integers(0, m["vocab_size"], (B, T)) if cfg["kind"] == "gpt" else rng.integers(0, m["n_classes"], B)
        batches.append((x, y))
    return batches


class NumformerTrainer(ClosesOnExit):
    """step(x, y) -> loss: forward, cross-entropy, backward, AdamW, as the Trainer does it.

    processes > 1 splits every batch over that many processes (``DataParallel``); call ``close()`` (or use
    ``with``) to stop them."""

    def __init__(self, model, cfg, processes=1):
        self.opt = AdamW(param_groups(model, OPTIM["weight_decay"]), lr=OPTIM["lr"], betas=OPTIM["betas"])
        self.dp = DataParallel(model, processes)
        self.input_name = "idx" if cfg["kind"] == "gpt" else "ids"

    def __call__(self, x, y):
        self.opt.zero_grad()
        loss, _ = self.dp.forward_backward({self.input_name: x}, y)
        self.opt.step()
        return loss

    def close(self):
        self.dp.close()


def torch_trainer(ref, cfg):
    """The same step in PyTorch eager (torch.optim.AdamW with its defaults for CPU tensors)."""
    import torch

    from .torch_reference import adamw_param_groups  # imports torch (optional) at its top

    opt = torch.optim.AdamW(adamw_param_groups(ref, OPTIM["weight_decay"]), lr=OPTIM["lr"], betas=OPTIM["betas"])
    F = torch.nn.functional

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        logits = ref(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def _timed(step, batches, n):
    t0 = time.perf_counter()
    for i in range(n):
        step(*batches[i % len(batches)])
    return time.perf_counter() - t0


def measure_config(cfg, warmup, rounds, steps, seed=0, one_process_too=True):
    """Alternate numformer and PyTorch; returns per-round throughputs, the median ratio and the first losses.

    numformer trains as ``numformer train`` does by default: data-parallel on one process per core (at most
    one per example). With ``one_process_too`` each round also times numformer in one process whose thread
    pool splits the ops (after ``set_fast_runtime()``), reported separately.
    """
    import torch

    model, ref = build_models(cfg, seed)
    batches = make_batches(cfg)
    tbatches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    processes = usable_processes(model, cfg["batch"])
    with NumformerTrainer(model, cfg, processes) as nf_step, NumformerTrainer(model, cfg) as nf_one:
        pt_step = torch_trainer(ref, cfg)
        first = (float(nf_step(*batches[0])), float(pt_step(*tbatches[0])))     # same weights, same batch
        for _ in range(warmup):
            nf_step(*batches[0])
            pt_step(*tbatches[0])
            if one_process_too:
                nf_one(*batches[0])
        variants = [("nf", nf_step, batches), ("pt", pt_step, tbatches)]
        if one_process_too and processes > 1:
            variants.append(("nf_one", nf_one, batches))
        tokens = cfg["batch"] * cfg["seq"] * steps
        tps = {name: [] for name, *_ in variants}
        for r in range(rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]      # rotate who goes first
            for name, step, b in order:
                tps[name].append(tokens / _timed(step, b, steps))
    nf, pt = tps["nf"], tps["pt"]
    ratios = [a / b for a, b in zip(nf, pt)]
    flops = model_flops_per_step(cfg)
    tok_per_step = cfg["batch"] * cfg["seq"]
    extra = {}
    if "nf_one" in tps:
        one = tps["nf_one"]
        extra = {"numformer_one_process_tokens_per_s": one,
                 "numformer_one_process_median_tokens_per_s": statistics.median(one),
                 "one_process_median_ratio": statistics.median([a / b for a, b in zip(one, pt)])}
    return {
        "title": cfg["title"], "kind": cfg["kind"], "model": cfg["model"], "batch": cfg["batch"], "seq": cfg["seq"],
        "tokens_per_step": tok_per_step, "params": int(model.num_parameters()),
        "warmup": warmup, "rounds": rounds, "steps_per_round": steps, "numformer_processes": processes,
        "numformer_tokens_per_s": nf, "torch_tokens_per_s": pt, "ratios": ratios,
        "numformer_median_tokens_per_s": statistics.median(nf), "torch_median_tokens_per_s": statistics.median(pt),
        "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
        "numformer_ms_per_step": 1e3 * tok_per_step / statistics.median(nf),
        "torch_ms_per_step": 1e3 * tok_per_step / statistics.median(pt),
        **extra,
        "model_gflop_per_step": flops / 1e9,
        "first_loss": {"numformer": first[0], "torch": first[1]},
    }


@contextlib.contextmanager
def one_thread_each():
    """numformer's kernels, the BLAS and PyTorch's intra-op threads all on the calling thread, restored
    afterwards: the setting of the per-core comparisons. Yields the BLAS's setting (``.applied``: False where
    NumPy's BLAS could not be set)."""
    import torch

    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with single_threaded() as numformer_alone:
            yield numformer_alone.blas
    finally:
        torch.set_num_threads(torch_threads)


def measure_single_core(cfg, rounds, steps, seed=0):
    """Both frameworks on one thread (PyTorch intra-op threads, numformer's pool and the BLAS all set to 1),
    alternating, timed by the CPU time of the calling thread: a per-core efficiency comparison that other
    processes on the machine hardly disturb. Returns ms of CPU per step (best round) and their ratio, PyTorch's
    ms over numformer's (above 1: numformer is faster)."""
    import torch

    model, ref = build_models(cfg, seed)
    batches = make_batches(cfg)
    tbatches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    nf_step, pt_step = NumformerTrainer(model, cfg), torch_trainer(ref, cfg)      # one process
    nf, pt = [], []
    with one_thread_each() as blas:
        nf_step(*batches[0])
        pt_step(*tbatches[0])
        for r in range(rounds):
            order = (("nf", nf_step, batches), ("pt", pt_step, tbatches))
            for name, step, b in (order if r % 2 == 0 else order[::-1]):
                t0 = time.thread_time()
                for i in range(steps):
                    step(*b[i % len(b)])
                (nf if name == "nf" else pt).append(1e3 * (time.thread_time() - t0) / steps)
    return {"numformer_cpu_ms_per_step": min(nf), "torch_cpu_ms_per_step": min(pt),
            "ratio": min(pt) / min(nf), "blas_single_thread": blas.applied, "rounds": rounds, "steps": steps}


def environment():
    import torch

    return {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "numformer_threads": fast_runtime_status()["threads"], "malloc": fast_runtime_status()["malloc"],
            "numformer_blas": fast_runtime_status()["blas"],
            "blas_threads_env": os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
            or "default (all cores)"}


def run(quick=False, configs=None, plan=None):
    """Measure every configuration (``configs``/``plan`` override the defaults, for tests)."""
    set_fast_runtime()
    configs = CONFIGS if configs is None else configs
    plan = (QUICK_PLAN if quick else PLAN) if plan is None else plan
    n_peak = 1024 if quick else 2048
    # on all of numformer's threads (the machine's peak for MFU): under set_fast_runtime() OpenBLAS is
    # otherwise on one thread, which would measure one core's peak against a model that uses them all
    peak_of = {"n": n_peak, "threads": get_num_threads(), "min_seconds": 0.2 if quick else 0.5}
    peak = matmul_peak(**peak_of) / 1e9
    torch_peak = torch_matmul_peak(n_peak, 3)
    results = {}
    for name, cfg in configs.items():
        warmup, rounds, steps = plan[name]
        r = measure_config(cfg, warmup, rounds, steps)
        results[name] = r
    for name, cfg in configs.items():
        _, rounds, steps = plan[name]
        results[name]["single_core"] = measure_single_core(cfg, max(2, rounds // 2), max(1, steps // 2))
    peak_after = matmul_peak(**peak_of) / 1e9
    # MFU of both frameworks against the best product this machine ran (either library's)
    machine_peak = max(peak, peak_after, torch_peak)
    for r in results.values():
        for who in ("numformer", "torch"):
            r[f"{who}_mfu"] = (r["model_gflop_per_step"] * r[f"{who}_median_tokens_per_s"] / r["tokens_per_step"]
                               / machine_peak)
    return {"configs": results, "matmul_peak_gflops": max(peak, peak_after), "machine_peak_gflops": machine_peak,
            "matmul_peak_gflops_before_after": [peak, peak_after], "matmul_peak_n": n_peak,
            "torch_matmul_peak_gflops": torch_peak, "optimizer": dict(OPTIM),
            "environment": environment(), "quick": bool(quick)}


# -- report -----------------------------------------------------------------------------------------------

def _plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfgs = result["configs"]
    names = list(cfgs)
    x = np.arange(len(names))
    nf = [cfgs[n]["numformer_median_tokens_per_s"] for n in names]
    pt = [cfgs[n]["torch_median_tokens_per_s"] for n in names]
    one = [cfgs[n].get("numformer_one_process_median_tokens_per_s") for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    if all(v is not None for v in one):
        ax1.bar(x - 0.27, nf, 0.27, label="numformer")
        ax1.bar(x, one, 0.27, label="numformer, one process", color="C2")
        ax1.bar(x + 0.27, pt, 0.27, label="PyTorch eager", color="C1")
    else:
        ax1.bar(x - 0.2, nf, 0.4, label="numformer")
        ax1.bar(x + 0.2, pt, 0.4, label="PyTorch eager", color="C1")
    ax1.set_xticks(x, names)
    ax1.set_yscale("log")
    ax1.set_ylabel("training tokens / s (median round)")
    ax1.legend()
    ax1.set_title("Throughput")
    for i, n in enumerate(names):
        rs = cfgs[n]["ratios"]
        ax2.scatter([i] * len(rs), rs, color="gray", s=12, alpha=0.6)
        ax2.scatter([i], [cfgs[n]["median_ratio"]], color="C0", s=60, label="median" if i == 0 else None)
    ax2.axhline(1.0, color="k", lw=0.8, ls="--")
    ax2.set_xticks(x, names)
    ax2.set_xlim(-0.5, len(names) - 0.5)
    ax2.set_ylabel("numformer / PyTorch tokens/s")
    ax2.set_title("Ratio per round")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_row(result):
    """The figures bench.md keeps per CPU model (``runner.keep_cpu_rows``), for each configuration: numformer's
    training tokens/s over PyTorch's (median of the rounds), the same per core in CPU time, and the MFU of both."""
    row = {}
    for name, r in result["configs"].items():
        row[f"{name} ratio"] = r["median_ratio"]
        if "single_core" in r:
            row[f"{name} per-core ratio"] = r["single_core"]["ratio"]
        if "numformer_mfu" in r:
            row[f"{name} MFU numformer / PyTorch"] = [r["numformer_mfu"], r["torch_mfu"]]
    return row


def markdown(result, fig_dir):
    png = fig_dir / "throughput.png"
    _plot(result, png)
    env = result["environment"]
    lines = ["## Training throughput: numformer vs PyTorch", "",
             "Forward + cross-entropy + backward + AdamW step (lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on "
             "matrices and embeddings), float32, the same architecture and initial weights in both, each using "
             "every core the way it trains by default: PyTorch eager with its intra-op threads, numformer as "
             "`numformer train` does, data-parallel on one process per core (each computes its share of every "
             "batch on one thread; processes: " + ", ".join(
                 f"{n} {r.get('numformer_processes', 1)}" for n, r in result["configs"].items()) + "). "
             "numformer and PyTorch runs alternate in one session, and the ratio is the median over rounds of "
             "numformer tokens/s ÷ PyTorch tokens/s. MFU: model matrix-multiply FLOPs/s over the machine's "
             "float32 matrix-multiply peak, the faster of `np.matmul` and `torch.mm` on all threads in the same "
             f"run ({result.get('machine_peak_gflops', result['matmul_peak_gflops']):.0f} GFLOP/s; "
             f"{result['matmul_peak_n']}³ products: np.matmul {result['matmul_peak_gflops']:.0f}, "
             f"torch.mm {result['torch_matmul_peak_gflops']:.0f} GFLOP/s).", "",
             "| configuration | batch × context | numformer tokens/s | PyTorch tokens/s | ratio (median, range) "
             "| ms/step numformer / PyTorch | MFU numformer / PyTorch |",
             "|---|---|---:|---:|---|---|---|"]
    for name, r in result["configs"].items():
        m = r["model"]
        shape = f"{m.get('n_layers')}L {m.get('n_heads')}H d{m.get('d_model')}"
        lines.append(
            f"| {name}: {r['title']} ({shape}, {r['params'] / 1e6:.2f}M params) | {r['batch']} × {r['seq']} "
            f"| {r['numformer_median_tokens_per_s']:,.0f} | {r['torch_median_tokens_per_s']:,.0f} "
            f"| **{r['median_ratio']:.2f}** ({r['min_ratio']:.2f}–{r['max_ratio']:.2f}) "
            f"| {r['numformer_ms_per_step']:.1f} / {r['torch_ms_per_step']:.1f} "
            f"| {100 * r['numformer_mfu']:.1f}% / {100 * r['torch_mfu']:.1f}% |")
    one = [(n, r) for n, r in result["configs"].items() if "one_process_median_ratio" in r]
    if one:
        lines += ["", "numformer in one process instead, its thread pool splitting each op across the cores as "
                  "PyTorch does (timed in the same rounds): " + ", ".join(
                      f"{n} {r['numformer_one_process_median_tokens_per_s']:,.0f} tokens/s "
                      f"(ratio {r['one_process_median_ratio']:.2f})" for n, r in one) + "."]
    lines += ["", "Per-core efficiency (both frameworks on one thread, BLAS included; CPU time of the calling thread, "
              "best round, so that other load on the machine hardly matters):", "",
              "| configuration | numformer CPU ms/step | PyTorch CPU ms/step | ratio |", "|---|---:|---:|---:|"]
    for name, r in result["configs"].items():
        c = r.get("single_core")
        if c:
            lines.append(f"| {name} | {c['numformer_cpu_ms_per_step']:.1f} | {c['torch_cpu_ms_per_step']:.1f} "
                         f"| {c['ratio']:.2f} |")
    lines += ["", image_link(png, "throughput", fig_dir), "",
              f"Threads: PyTorch {env['torch_threads']} (torch {env['torch']}); numformer one thread per "
              f"process, and in one process {env['numformer_threads']} ({env.get('numformer_blas', '?')}); "
              f"allocator: {env['malloc']}. "
              "Rounds × steps per configuration: "
              + ", ".join(f"{n} {r['rounds']}×{r['steps_per_round']} (after {r['warmup']} warm-up)"
                          for n, r in result["configs"].items()) + ". First-step losses (same weights, same "
              "batch): " + ", ".join(f"{n} {r['first_loss']['numformer']:.5f} / {r['first_loss']['torch']:.5f}"
                                     for n, r in result["configs"].items()) + "."]
    return "\n".join(lines) + "\n"
