"""The speedrun's PyTorch anchor: a numformer recipe trained by PyTorch eager under the same time budget.

The same initial weights (numformer builds the model with the run's seed, as the trainer does, and the
weights are copied), the same batches (the task's generator seeded as the trainer's), the same AdamW, clipping
and time-planned schedule (optim/schedules.py ``Schedule.at`` with train/budget.py's ``Budget``), the same
periodic estimates and the same whole-validation evaluation. A RoPE recipe runs as the transformers class
``numformer.interop.hf.export_hf`` writes it as (``ArceeForCausalLM`` for the squared-ReLU recipe,
``LlamaForCausalLM`` for a SwiGLU one); a GPT-2-style one as numformer's
PyTorch reference of its GPT (``bench/torch_reference.py``, nanoGPT's architecture).

PyTorch and transformers are test and benchmark dependencies: this module is imported only by
``numformer reproduce shakespeare_speedrun_torch``.
"""
from __future__ import annotations

import contextlib
import io
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

from .._runtime import usable_cores
from ..bench.torch_reference import adamw_param_groups, from_numformer
from ..config import resolve_config
from ..data.base import IGNORE
from ..interop.hf import export_hf
from ..models import build_model
from ..optim import train_schedule
from ..train.budget import Budget


def _torch_model(model):
    """(PyTorch module returning logits, its class name) with the architecture and weights of ``model``."""
    if model.positional == "rope":
        from transformers import AutoModelForCausalLM

        with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stderr(io.StringIO()):
            export_hf(model, folder)      # (its note on generating past the context does not concern training)
            ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
        return (lambda idx: ref(input_ids=idx).logits), ref, type(ref).__name__
    ref = from_numformer(model)
    return ref, ref, type(ref).__name__


def _mean_loss(forward, batches):
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            logits = forward(torch.from_numpy(batch.inputs["idx"]))
            targets = torch.from_numpy(batch.targets.astype(np.int64))
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                   ignore_index=IGNORE, reduction="sum")
            total += float(loss)
            count += int((targets != IGNORE).sum())
    return total / count, count


def _time_evaluation(forward, module, task, batch_size, budget):
    """The seconds per example of the whole-split evaluation, on its first batch, as the trainer times it."""
    first = next(iter(task.eval_batches("val", batch_size)))
    module.eval()
    _mean_loss(forward, [first])                         # the first call pays for allocations: not timed
    started = time.perf_counter()
    _mean_loss(forward, [first])
    budget.timed_evaluation(time.perf_counter() - started, len(first.targets))
    module.train()


def budgeted_torch_run(raw_config, seed):
    """Train ``raw_config`` (its [train] budget_minutes) with PyTorch on every core; returns its figures."""
    torch.set_num_threads(usable_cores())
    config, task = resolve_config({**raw_config, "train": {**raw_config["train"], "seed": seed}})
    t = config["train"]
    if t["optimizer"] != "adamw":
        raise ValueError(f"the PyTorch anchor trains with AdamW; the recipe's optimizer is {t['optimizer']!r}")
    seeds = np.random.SeedSequence(t["seed"]).spawn(2)          # as the Trainer: initialization, then batches
    model_rng, data_rng = np.random.default_rng(seeds[0]), np.random.default_rng(seeds[1])
    model = build_model(dict(config["model"]), rng=model_rng, dtype=np.float32)
    forward, module, model_class = _torch_model(model)
    # the clock starts once PyTorch holds the weights (loading transformers is not counted against it)
    budget = Budget(60 * t["budget_minutes"])
    module.train()
    optimizer = torch.optim.AdamW(adamw_param_groups(module, t["weight_decay"]), lr=t["lr"],
                                  betas=(t["beta1"], t["beta2"]), eps=t["eps"])
    schedule = train_schedule(t)
    eval_bs = t["eval_batch_size"] or t["batch_size"]
    sample = t["eval_batches"] * eval_bs
    budget.val_examples = task.eval_size("val")
    _time_evaluation(forward, module, task, eval_bs, budget)
    params = [p for p in module.parameters() if p.requires_grad]
    step, tokens, train_seconds = 0, 0, 0.0
    while step < t["max_steps"]:
        evaluates = (step + 1) % t["eval_every"] == 0
        extra = (budget.periodic_eval_seconds or budget.eval_seconds_per_example * sample) if evaluates else 0.0
        if not budget.fits(extra):
            break
        started = time.perf_counter()
        lr = schedule.at(step, budget.progress(step, t["warmup_steps"]))
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = task.train_batch(t["batch_size"], data_rng)
        logits = forward(torch.from_numpy(batch.inputs["idx"]))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               torch.from_numpy(batch.targets.astype(np.int64)).reshape(-1), ignore_index=IGNORE)
        loss.backward()
        if t["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += batch.n_tokens
        took = time.perf_counter() - started
        train_seconds += took
        budget.step_seconds.append(took)
        if evaluates and sample:         # the periodic estimate numformer's trainer also pays for
            module.eval()
            started = time.perf_counter()
            _mean_loss(forward, task.eval_sample("val", eval_bs, sample, t["seed"]))
            budget.timed_periodic_evaluation(time.perf_counter() - started)
            module.train()
    module.eval()
    val_loss, _ = _mean_loss(forward, task.eval_batches("val", eval_bs))
    return {"seed": seed, "val_loss": val_loss, "steps": step, "tokens_seen": tokens,
            "tokens_per_s": tokens / max(train_seconds, 1e-9), "train_seconds": round(train_seconds, 2),
            "wall_seconds": round(budget.used(), 2), "budget_seconds": budget.seconds,
            "parameters": model.num_parameters(), "model_class": model_class, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "config": config}
