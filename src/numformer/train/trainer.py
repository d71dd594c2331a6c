"""The training loop: batches, the step (train/step.py), clipping, optimizer, schedule, evaluation, checkpoints.

    trainer = Trainer(config, run_dir)        # validates the whole config first
    summary = trainer.train()

Run folder::

    config.json             the fully resolved config (every default filled in)
    tokenizer.json          the task's vocabulary / tokenizer
    metrics.jsonl           one JSON object per line: training lines (step, train_loss, lr,
                            grad_norm, tokens_per_s, elapsed_s) and evaluation lines (step, val_loss or
                            val_loss_estimate when eval_batches caps it, val_tokens, the task's metrics)
    checkpoint.safetensors  the latest training state, for --resume (model, optimizer, RNGs, counters)
    model.safetensors       the weights to use: of the step selected by the periodic evaluations (restore_best)
                            or of the last step, whichever has the lower loss on the whole validation split
    summary.json            figures of the finished run

Resuming is exact: a run stopped at step N and resumed gives, bit for bit, the
weights of an uninterrupted run (model, optimizer moments, both random
generators and every counter are restored; metrics lines after the checkpoint
are dropped and re-logged).
"""
from __future__ import annotations

import errno
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from .. import ops
from .._limits import bounded_json
from ..data.base import IGNORE
from ..interop.sources import load_weights
from ..models import build_model
from ..nn import MultiHeadAttention
from ..optim import OPTIMIZERS, AdamW, Muon, clip_grad_norm, hidden_matrices, make_schedule, param_groups
from ..provenance import git_commit
from ..run_files import (CHECKPOINT, MODEL, load_checkpoint, load_metadata, load_model_weights, load_tokenizer_state,
                         open_in_folder, rng_state, save_checkpoint, save_model, set_rng_state, write_atomic,
                         write_json_atomic)
from ..config import apply_overrides, load_config_json, resolve_config
from . import run_folder
from .budget import Budget
from .early_stopping import EarlyStopping
from .mpi import MPIDataParallel
from .parallel import DataParallel, usable_processes
from .progress import progress
from .step import loss_and_backward

DIVERGENCE_FACTOR = 3.0     # the training loss above this multiple of its first value ...
DIVERGENCE_STEPS = 20       # ... for this many steps in a row stops the run as diverged


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN or infinite, or the loss stayed far above its start."""


def make_optimizer(model, train):
    """The [train] optimizer over the model's parameter groups (``param_groups``). "muon": Muon over the
    hidden layers' matrices (``hidden_matrices``) with the run's weight_decay, and an AdamW with lr, betas
    and eps over every other parameter, in its groups."""
    groups = param_groups(model, train["weight_decay"], tuple(train["no_decay"]))
    name = train["optimizer"]
    if name == "muon":
        matrices = hidden_matrices(model)
        if not matrices:
            raise ValueError("[train] optimizer = \"muon\" needs Linear layers inside Transformer blocks, and "
                             "this model has none; use optimizer = \"adamw\"")
        taken = {id(p) for p in matrices}
        rest = [{**g, "params": [p for p in g["params"] if id(p) not in taken]} for g in groups]
        rest = [g for g in rest if g["params"]]
        adamw = AdamW(rest, lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"]) if rest else None
        return Muon(matrices, adamw, lr=train["muon_lr"], momentum=train["muon_momentum"],
                    nesterov=train["muon_nesterov"], ns_steps=train["muon_ns_steps"],
                    weight_decay=train["weight_decay"])
    if name == "sgd":
        return OPTIMIZERS[name](groups, lr=train["lr"], momentum=train["momentum"], nesterov=train["nesterov"])
    return OPTIMIZERS[name](groups, lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["eps"])


def mean_loss(model, batches):
    """Token-weighted mean cross-entropy of ``model`` (in eval mode) over ``batches``: (loss, counted targets);
    the loss is NaN when no target is counted. A diverged model's overflows give an infinite or NaN loss,
    without NumPy's warnings."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in batches:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                logits = model(**batch.inputs)
                loss, cache = ops.cross_entropy_forward(logits, batch.targets, ignore_index=IGNORE)
            n = cache[3]
            total += loss * n
            count += n
            model.clear_cache()
    finally:
        model.train(was_training)
    return (total / count if count else math.nan), int(count)


def split_loss(model, task, split, batch_size, sample=0, seed=0):
    """(loss, counted targets) over a split: all of its evaluation batches, or with ``sample`` a fixed sample of
    that many examples spread over the whole split (``Task.eval_sample``, drawn with ``seed``; the same at
    every call)."""
    batches = (task.eval_sample(split, batch_size, sample, seed) if sample
               else task.eval_batches(split, batch_size))
    loss, count = mean_loss(model, batches)
    if count == 0:
        raise ValueError(f"the {split} split has no evaluation targets")
    return loss, count


def evaluate_loss(model, task, split, batch_size, max_batches=0, seed=0):
    """Token-weighted mean cross-entropy over a split: all of it, or with ``max_batches`` a fixed sample of
    max_batches × batch_size examples spread over the whole split (see ``split_loss``)."""
    return split_loss(model, task, split, batch_size, max_batches * batch_size, seed)[0]


def _check_trainable(model):
    """Settings a model accepts for inference but cannot train with, caught before the run folder is written."""
    for name, m in model.named_modules():
        if isinstance(m, MultiHeadAttention) and m.attention == "flash" and m.dropout_p > 0:
            raise ValueError(f"[model] attention = \"flash\" has no attention dropout, but {name} has dropout "
                             f"{m.dropout_p}; set [model] dropout = 0 or attention = \"plain\"")


class Trainer:
    """Train a model described by a config into ``run_dir``.

    config: the raw config dict (sections model/data/train) — ignored when
    resuming, where run_dir/config.json is used with ``overrides`` applied.
    The trainer holds the run folder's lock (run_folder.RunLock) from the
    moment the config is valid until ``close()`` or the process ends.
    world: the MPI world (``train.mpi.init_world()``) when this process is one of several ranks: every rank
    trains its share of each batch, rank 0 alone writes the run folder and prints.
    """

    def __init__(self, config, run_dir, resume=False, overwrite=False, overrides=None, quiet=False, world=None):
        clock_start = time.perf_counter()       # a time budget counts the setup too
        self.run_dir = Path(run_dir)
        self.world = world
        self._writer = world is None or world.is_writer         # the one process that writes the run folder
        self.quiet = quiet or not self._writer
        self._lock = None
        saved, tokenizer_state = None, None
        if resume:
            if self._writer:             # under MPI, rank 0 alone holds the folder
                self._lock = run_folder.lock_for_resuming(self.run_dir)
            saved = config = load_config_json(self.run_dir)
            tokenizer_state = load_tokenizer_state(self.run_dir)
        # A resumed run keeps its saved vocabulary, so that ids mean what they meant.
        try:
            self.config, self.task = resolve_config(apply_overrides(config, overrides), tokenizer_state)
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            if tokenizer_state is None:
                raise
            raise ValueError(f"tokenizer file {self.run_dir / 'tokenizer.json'} is damaged or does not fit the "
                             f"run's [data] ({type(e).__name__}: {e}); restore it or retrain") from None
        if resume and run_folder.schedule_change(saved["train"], self.config["train"]):
            self._print(run_folder.schedule_change(saved["train"], self.config["train"]))
        t = self.train_cfg = self.config["train"]
        self.dtype = np.dtype(t["dtype"])
        seeds = np.random.SeedSequence(t["seed"]).spawn(2)
        self.model_rng = np.random.default_rng(seeds[0])   # initialization, then dropout masks
        self.data_rng = np.random.default_rng(seeds[1])    # training batches
        model_cfg = {k: v for k, v in self.config["model"].items()}
        init_from = model_cfg.pop("init_from", None)
        self.model = build_model(model_cfg, rng=self.model_rng, dtype=self.dtype)
        if init_from is not None and not resume:         # fine-tuning starts from the source's weights
            load_weights(self.model, init_from)
        _check_trainable(self.model)
        self.optimizer = make_optimizer(self.model, t)
        d_model = self.config["model"]["d_model"]           # the noam schedule scales by d_model^-0.5
        self.schedule = make_schedule(t["schedule"], t["lr"], t["warmup_steps"], t["max_steps"], t["min_lr"],
                                      d_model=d_model, decay_steps=t["decay_steps"] or None, cooldown=t["cooldown"])
        self.budget = _budget(t, world, clock_start)   # the time budget's clock, else None: steps are counted
        self.early = EarlyStopping(t["early_stopping_patience"], t["early_stopping_min_delta"])
        self.step, self.tokens_seen, self.train_seconds = 0, 0, 0.0
        self.resumed = resume
        self._divergence = {"first_loss": None, "steps_above": 0}   # the divergence guard's state
        self._window = _LogWindow()     # the training losses since the last metrics line
        self._checkpoint_step = None    # the step of checkpoint.safetensors
        ranks = 1 if world is None else world.size
        self.processes = usable_processes(self.model, max(1, t["batch_size"] // ranks), t["processes"])
        self._dp = None                 # the DataParallel (MPIDataParallel under MPI) of a running train() call
        self._worker_rngs = None        # the data-parallel workers' generator states between train() calls
        self._rank_rngs = None          # under MPI: this rank's generator states between train() calls
        self._agreed = {"stop": False, "time_up": False}   # under MPI: what the ranks agreed at this step
        self._eval_sizes = {}           # split -> number of evaluation examples
        self._whole_losses = {}         # step -> whole-validation-split loss of that step's weights
        if resume:
            self._restore()
        elif self._writer:               # the whole config is valid: only now is the folder touched
            self._lock = run_folder.lock_for_writing(self.run_dir)
            run_folder.start_new_run(self.run_dir, overwrite)
        self._stop_requested = False
        self.last_summary = None        # what the last train() call returned

    def close(self):
        """Release the run folder's lock (also done when the process ends)."""
        if self._lock is not None:
            self._lock.release()

    # -- state ------------------------------------------------------------------------------
    def _state(self):
        state = {"step": self.step, "tokens_seen": self.tokens_seen, "train_seconds": self.train_seconds,
                 "budget": None if self.budget is None else {"used": self.budget.used(),
                                                             "warmup_end": self.budget.warmup_end},
                 "model_rng": rng_state(self.model_rng), "data_rng": rng_state(self.data_rng),
                 "worker_rngs": self._worker_rngs, "early_stopping": self.early.state_dict(),
                 "divergence": self._divergence,
                 "log_window": {"losses": list(self._window.losses), "tokens": self._window.tokens}}
        if self.world is not None:      # collective: every rank's dropout generators, gathered on rank 0
            local = self._dp.rng_states() if self._dp is not None else self._rank_rngs
            state["mpi_rngs"] = self.world.comm.gather(local, root=0)
            state["worker_rngs"] = local["workers"] if local else None
        elif self._dp is not None:
            state["worker_rngs"] = self._dp.rng_states()
        return state

    def _restore(self):
        path = self.run_dir / CHECKPOINT
        state = load_checkpoint(path, self.model, self.optimizer)
        try:
            _check_state(state)
            self.step, self.tokens_seen = state["step"], state["tokens_seen"]
            self.train_seconds = state["train_seconds"]
            set_rng_state(self.model_rng, state["model_rng"])
            set_rng_state(self.data_rng, state["data_rng"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise ValueError(f"checkpoint {path} is damaged (its state metadata: {type(e).__name__}: {e}); it "
                             f"cannot be resumed: restore it or train again") from None
        self.early.load_state_dict(state["early_stopping"])
        self._worker_rngs = state.get("worker_rngs")
        self._divergence = state.get("divergence", self._divergence)
        window = state.get("log_window")          # the next metrics line averages the same steps as without a stop
        if window is not None:
            self._window.losses, self._window.tokens = list(window["losses"]), window["tokens"]
        self._checkpoint_step = self.step
        if self.budget is not None and state.get("budget"):    # a resumed run goes on spending the same budget
            self.budget.used_before = state["budget"]["used"]
            self.budget.warmup_end = state["budget"]["warmup_end"]
        ranks = state.get("mpi_rngs") or []     # a rank beyond the checkpoint's ranks keeps its fresh seeds
        if self.world is not None and self.world.rank < len(ranks):
            self._rank_rngs = ranks[self.world.rank]
        if self._writer:
            self._truncate_metrics(self.step)

    def _check_folder(self):
        """Before each write: stop with one line when the run folder was deleted or replaced since it was locked
        (run_folder.RunLock.check); nothing is recreated."""
        if self._lock is not None:
            self._lock.check()

    def _truncate_metrics(self, step):
        """Drop metrics lines logged after the checkpoint: they are re-logged as the run continues."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return
        self._check_folder()
        keep = [line for line, record in run_folder.metrics_records(path) if record["step"] <= step]
        write_atomic(path, b"".join(k + b"\n" for k in keep))     # a full disk keeps the old file

    def save_checkpoint(self):
        started = time.perf_counter()
        state = self._state()           # collective under MPI: every rank calls it
        if self._writer:
            self._check_folder()
            save_checkpoint(self.run_dir / CHECKPOINT, self.model, self.optimizer, state,
                            run_folder.weights_metadata(self.config))
            self._checkpoint_step = self.step
        if self.budget is not None:
            self.budget.timed_save(time.perf_counter() - started)

    # -- logging ----------------------------------------------------------------------------
    def _log(self, record):
        if not self._writer:
            return
        self._check_folder()
        path = self.run_dir / "metrics.jsonl"
        try:          # never through a link placed there meanwhile (O_NOFOLLOW where the platform has it)
            fd = open_in_folder(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise ValueError(f"{path} is a symbolic link; numformer writes only regular files in a run folder: "
                             f"remove the link and continue with --resume") from None
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _print(self, message):
        if self.quiet:
            return
        if getattr(self, "_bar", None) is not None:     # above the progress bar, which stays at the bottom
            self._bar.write(message)
        else:
            print(message, file=sys.stderr, flush=True)

    # -- the loop ---------------------------------------------------------------------------
    def evaluate(self, split="val", full=False, metrics=None):
        """The loss and the task's metrics on a split (``metrics``: whether to compute them; None = the
        ``eval_metrics`` key).

        The loss is over the whole split (``val_loss``, with ``val_tokens`` counted targets) when ``full`` or
        when eval_batches = 0; otherwise over the run's fixed sample of eval_batches × eval_batch_size examples
        spread over the whole split (``val_loss_estimate``): the same sample at every evaluation of the run
        and after a resume (drawn with the run's seed), so that successive evaluations compare like with like.
        Other splits are prefixed with their name (``test_loss``, ``test_tokens``, ``test_accuracy``).
        """
        sample = 0 if full else self._eval_sample_size(split)
        loss, count = self._split_loss(split, sample)
        result = {f"{split}_loss_estimate" if sample else f"{split}_loss": loss, f"{split}_tokens": count}
        if self.train_cfg["eval_metrics"] if metrics is None else metrics:
            was_training = self.model.training
            self.model.eval()
            try:
                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # a diverging run's metrics
                    metrics = self.task.evaluate(self.model, split)
                result.update({f"{k}" if split == "val" else f"{split}_{k}": v for k, v in metrics.items()})
            finally:
                self.model.train(was_training)
                self.model.clear_cache()
        return result

    def _split_loss(self, split, sample=0):
        """(loss, counted targets) over the whole split, or over the run's fixed sample of ``sample`` examples."""
        t = self.train_cfg
        return split_loss(self.model, self.task, split, t["eval_batch_size"] or t["batch_size"], sample, t["seed"])

    def _eval_sample_size(self, split):
        """Examples in a capped evaluation's fixed sample (eval_batches × eval_batch_size), or 0 when the
        evaluation covers the whole split (eval_batches = 0, or a split no larger than the sample)."""
        t = self.train_cfg
        n = t["eval_batches"] * (t["eval_batch_size"] or t["batch_size"])
        if n and split not in self._eval_sizes:
            self._eval_sizes[split] = self.task.eval_size(split)
        return n if n and n < self._eval_sizes[split] else 0

    def _whole_val_loss(self, step):
        """The loss on the whole validation split of the model's current weights, which are those of ``step``:
        that step's periodic evaluation when it covered the whole split, else computed now."""
        if step not in self._whole_losses:
            self._whole_losses[step] = self._split_loss("val")[0]
        return self._whole_losses[step]

    def _train_step(self):
        """One optimizer update (grad_accum micro-batches); returns (mean loss, grad norm, tokens)."""
        t = self.train_cfg
        started = time.perf_counter()
        self._lr = self._planned_lr()
        self.optimizer.set_lr(self._lr)
        losses, tokens = [], 0
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # non-finite values are checked here
            for _ in range(t["grad_accum"]):
                batch = self.task.train_batch(t["batch_size"], self.data_rng)
                losses.append(self._loss_and_backward(batch, 1.0 / t["grad_accum"]))
                tokens += batch.n_tokens
            loss = self._combine_ranks(float(np.mean(losses)), started)
            if not math.isfinite(loss):
                raise TrainingDiverged(f"the training loss became {loss} at step {self.step + 1}")
            norm = clip_grad_norm(self.optimizer.params, t["grad_clip"])
        if not math.isfinite(norm):
            raise TrainingDiverged(f"the gradient norm became {norm} at step {self.step + 1}")
        self.optimizer.step()
        self.optimizer.zero_grad()
        self._check_divergence(loss)    # the combined loss: the same on every rank
        return loss, norm, tokens

    def _planned_lr(self):
        """The schedule's learning rate for the update about to be taken: by step, or under a time budget by
        the fraction of the budget's training time spent (Budget.progress)."""
        if self.budget is None:
            return self.schedule(self.step)
        return self.schedule.at(self.step, self.budget.progress(self.step, self.train_cfg["warmup_steps"]))

    def _combine_ranks(self, loss, started):
        """Under MPI, the step's one Allreduce: the ranks' gradients and losses are summed, and so are their stop
        requests (Ctrl-C, the time limit), so that every rank stops at the same step. Else ``loss`` as it is."""
        if self.world is None:
            return loss
        limit = 60 * self.train_cfg["max_minutes"]
        time_up = bool(limit) and self.train_seconds + time.perf_counter() - started >= limit
        # a Ctrl-C arriving after this point is seen at the next step, on every rank alike
        loss, (self._agreed["stop"], self._agreed["time_up"]) = self._dp.combine(loss, [self._stop_requested,
                                                                                       time_up])
        return loss

    def _check_divergence(self, loss):
        """Stop a run whose training loss stays above DIVERGENCE_FACTOR times its first value for
        DIVERGENCE_STEPS steps in a row (a learning rate far too high can explode the loss without a NaN)."""
        d = self._divergence
        if d["first_loss"] is None:
            d["first_loss"] = loss
        d["steps_above"] = d["steps_above"] + 1 if loss > DIVERGENCE_FACTOR * d["first_loss"] else 0
        if d["steps_above"] >= DIVERGENCE_STEPS:
            raise TrainingDiverged(f"the training loss diverged: {loss:.4g} at step {self.step + 1}, above "
                                   f"{DIVERGENCE_FACTOR:g} times its first value ({d['first_loss']:.4g}) for "
                                   f"{DIVERGENCE_STEPS} steps")

    def _loss_and_backward(self, batch, grad_scale):
        """Forward, cross-entropy and backward of one micro-batch: in this process (train/step.py), or split
        over the data-parallel processes, which each run the same step on their share."""
        t = self.train_cfg
        if self._dp is not None and self._dp.processes > 1:
            loss, _ = self._dp.forward_backward(batch.inputs, batch.targets, t["label_smoothing"], grad_scale)
            return loss
        return loss_and_backward(self.model, batch.inputs, batch.targets, t["label_smoothing"], grad_scale)

    def _on_sigint(self, signum, frame):
        if self._stop_requested:          # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self._stop_requested = True
        self._print("\nCtrl-C: finishing this step and writing a checkpoint (press again to abort)...")

    def train(self, stop_after=None):
        """Train to max_steps (or ``stop_after`` more steps, for tests). Returns the summary dict.

        Each step: an optimizer update, then (when due) a log line, an evaluation, a checkpoint, and the
        stopping rules (time limit, early stopping, Ctrl-C)."""
        t = self.train_cfg
        wall_start = time.perf_counter()
        n_params = self._start_run()
        previous = signal.signal(signal.SIGINT, self._on_sigint) if _is_main_thread() else None
        last_step = t["max_steps"] if stop_after is None else min(t["max_steps"], self.step + stop_after)
        bar = self._bar = self._progress_bar(last_step)
        self._window.start = time.perf_counter()
        stop = {"stopped_early": False, "interrupted": False, "time_limit": False, "budget": False,
                "diverged": None}
        try:
            self._start_data_parallel()
            self._plan_budget()
            while self.step < last_step:
                if self.budget is not None and not self.budget.fits(self._next_step_extra()):
                    stop["budget"] = True
                    self._print(f"time budget of {t['budget_minutes']:g} minutes: training ends at step {self.step}, "
                                f"{self.budget.remaining():.1f} s left for the final evaluation and saves")
                    if self._checkpoint_step != self.step:
                        self.save_checkpoint()
                    break
                started = time.perf_counter()
                loss, norm, tokens = self._train_step()
                self.step += 1
                self.tokens_seen += tokens
                self.train_seconds += time.perf_counter() - started
                if self.budget is not None:
                    self.budget.step_seconds.append(time.perf_counter() - started)
                self._window.add(loss, tokens)
                self._log_step(last_step, norm, bar)
                if self._evaluates(self.step):
                    stop["stopped_early"] = self._evaluate_step()
                # a periodic checkpoint is not written while the loss is above the divergence threshold: the one
                # kept when the run is stopped as diverged is from before the divergence began
                periodic = self.step % t["checkpoint_every"] == 0 and not self._divergence["steps_above"]
                if periodic or self.step == last_step or stop["stopped_early"]:
                    self.save_checkpoint()
                if self._should_stop(last_step, stop):
                    break
        except TrainingDiverged as e:
            stop["diverged"] = f"{e}. Training stopped; {self._divergence_advice()}"
        finally:
            if bar is not None:
                bar.close()
                self._bar = None
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            self._close_data_parallel()
        summary = self._finish(stop, n_params, time.perf_counter() - wall_start)
        if stop["diverged"]:
            raise TrainingDiverged(stop["diverged"])
        return summary

    def _evaluates(self, step):
        """Whether a periodic evaluation follows update ``step`` (every eval_every steps, and at max_steps)."""
        return step % self.train_cfg["eval_every"] == 0 or step == self.train_cfg["max_steps"]

    def _next_step_extra(self):
        """Under a time budget, the seconds the next step adds beyond its update: its evaluation and checkpoint
        when they are due."""
        t, step = self.train_cfg, self.step + 1
        extra = 0.0
        if self._evaluates(step):       # before the first: as many examples at the whole split's rate
            extra += (self.budget.periodic_eval_seconds
                      or self.budget.eval_seconds_per_example * self._eval_examples("val"))
        if step % t["checkpoint_every"] == 0:
            extra += self.budget.save_seconds
        return extra

    def _eval_examples(self, split):
        """The examples of a periodic evaluation: its fixed sample, or the whole split."""
        return self._eval_sample_size(split) or self._eval_sizes.setdefault(split, self.task.eval_size(split))

    def _plan_budget(self):
        """Before the first step under a time budget: measure what the end costs (the seconds per evaluation
        example, on one batch; a first guess of a save's time) so that the plan keeps time for it."""
        b = self.budget
        if b is None:
            return
        t = self.train_cfg
        b.val_examples = self._eval_sizes.setdefault("val", self.task.eval_size("val"))
        b.final_evaluations = 2 if t["restore_best"] else 1
        moments = 3 if t["optimizer"] in ("adam", "adamw", "muon") else 2
        b.guess_save_seconds(self.model.num_parameters() * self.dtype.itemsize * moments)
        batch = next(iter(self.task.eval_batches("val", t["eval_batch_size"] or t["batch_size"])))
        mean_loss(self.model, [batch])                  # the first call pays for allocations: not timed
        started = time.perf_counter()
        mean_loss(self.model, [batch])
        b.timed_evaluation(time.perf_counter() - started, len(batch.targets))

    def _divergence_advice(self):
        """What a diverged run keeps and how to continue: from the checkpoint written before the divergence
        began, with a lower learning rate; or, without one, a new run."""
        ckpt = self.run_dir / CHECKPOINT
        if self._checkpoint_step is None or not ckpt.exists():
            return ("no checkpoint had been written yet (checkpoint_every), so there is nothing to resume: train "
                    "again with a lower lr, more warmup_steps or a grad_clip")
        return (f"the checkpoint of step {self._checkpoint_step}, written before the loss began to diverge, is kept "
                f"in {ckpt}; continue from it with a lower learning rate: numformer train --out {self.run_dir} "
                f"--resume --set train.lr=... (or more warmup_steps, a grad_clip)")

    def _start_run(self):
        """Write config.json and tokenizer.json (the folder holds no other run: run_folder.start_new_run) and
        say what trains; returns the number of parameters. Under MPI, rank 0 alone does this."""
        n_params = self.model.num_parameters()
        if not self._writer:
            return n_params
        self._check_folder()
        write_json_atomic(self.run_dir / "config.json", self.config)
        tok = self.task.tokenizer_state()
        if tok is not None:
            write_json_atomic(self.run_dir / "tokenizer.json", tok)
        self._print(f"{type(self.model).__name__} with {n_params:,} parameters; data: {self.task.describe()}")
        if self.world is not None:
            self._print(f"{self.world.describe()}; each rank computes 1/{self.world.size} of every batch"
                        + (f", split over {self.processes} processes" if self.processes > 1 else ""))
        elif self.processes > 1:
            self._print(f"data-parallel on {self.processes} processes: each computes 1/{self.processes} of every "
                        f"batch ([train] processes)")
        if self.resumed:
            self._print(f"resuming {self.run_dir} at step {self.step}")
        return n_params

    def _start_data_parallel(self):
        """Fork the data-parallel workers (none for one process), restoring their generators on resume; under
        MPI, join the other ranks (MPIDataParallel, with this rank's workers inside)."""
        if self.world is not None:
            self._dp = MPIDataParallel(self.model, self.world, self.processes, seed=self.train_cfg["seed"])
            if self._rank_rngs is not None:
                self._dp.set_rng_states(self._rank_rngs)
            return
        self._dp = DataParallel(self.model, self.processes, seed=self.train_cfg["seed"])
        if self._worker_rngs is not None and len(self._worker_rngs) == self.processes - 1:
            self._dp.set_rng_states(self._worker_rngs)

    def _log_step(self, last_step, norm, bar):
        """Every log_every steps (and the first and last): a training line in metrics.jsonl (the mean loss and
        the tokens/s since the previous line) and the progress bar's figures."""
        if self.step % self.train_cfg["log_every"] == 0 or self.step == 1 or self.step == last_step:
            w = self._window
            record = {"step": self.step, "train_loss": float(np.mean(w.losses)),
                      "lr": self._lr, "grad_norm": norm,
                      "tokens_per_s": w.tokens / max(time.perf_counter() - w.start, 1e-9),
                      "elapsed_s": round(self.train_seconds, 3)}
            self._log(record)
            if bar is not None:
                bar.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{record['lr']:.2e}",
                                tok_s=f"{record['tokens_per_s']:,.0f}")
            self._window = _LogWindow()
        if bar is not None:
            bar.update(1)

    def _evaluate_step(self):
        """A periodic evaluation: log it, save the weights to model.safetensors when the validation loss (on the
        same yardstick at every evaluation: the whole split or the fixed sample) improved, and return whether
        early stopping says to stop."""
        # rank 0 evaluates (the whole split or the fixed sample, see evaluate); every rank takes the same decision
        started = time.perf_counter()
        result = self.evaluate("val") if self._writer else None
        if self.budget is not None:
            self.budget.timed_periodic_evaluation(time.perf_counter() - started)
        if self.world is not None:
            result = self.world.comm.bcast(result, root=0)
        key = "val_loss" if "val_loss" in result else "val_loss_estimate"
        self._log({"step": self.step, **result})
        if key == "val_loss":
            self._whole_losses[self.step] = result[key]
        improved = self.early.update(result[key], self.step)
        if improved and self._writer:
            self._check_folder()
            save_model(self.run_dir / MODEL, self.model, {"step": self.step, key: result[key],
                                                          **run_folder.weights_metadata(self.config)})
        self._print(f"step {self.step}: {key} {result[key]:.4f}"
                    + (f" ({result['val_tokens']:,} tokens)" if key != "val_loss" else "")
                    + "".join(f", {k} {v:.4f}" for k, v in result.items() if k != key and isinstance(v, float))
                    + (" (best)" if improved else ""))
        if self.early.should_stop:
            self._print(f"early stopping: no improvement for {self.early.patience} evaluations")
            return True
        return False

    def _should_stop(self, last_step, stop):
        """After a step's checkpoint: stop at the time limit, on early stopping, or on Ctrl-C (recorded in
        ``stop``); a checkpoint is written first where the step's own rule did not write one."""
        t = self.train_cfg
        mpi = self.world is not None      # under MPI, the decisions every rank agreed on in this step's Allreduce
        time_up = self._agreed["time_up"] if mpi else self.train_seconds >= 60 * t["max_minutes"]
        if t["max_minutes"] and time_up and self.step < last_step:
            self._print(f"time limit of {t['max_minutes']} minutes reached at step {self.step}")
            self.save_checkpoint()
            stop["time_limit"] = True
            return True
        if stop["stopped_early"]:
            return True
        if self._agreed["stop"] if mpi else self._stop_requested:
            self.save_checkpoint()
            stop["interrupted"] = True
            return True
        return False

    def _close_data_parallel(self):
        """Stop the workers (keeping their generator states for a later train() call)."""
        if self._dp is None:
            return
        if self.world is not None:            # no communication here: another rank may have failed
            self._rank_rngs = self._dp.rng_states()
            self._dp.close()
            self._dp = None
            return
        try:
            self._worker_rngs = self._dp.rng_states()
        except (OSError, EOFError):          # a worker died: its states are lost with it
            self._worker_rngs = None
        finally:
            self._dp.close()
            self._dp = None

    def _finish(self, stop, n_params, wall_seconds):
        t = self.train_cfg
        ranks = 1 if self.world is None else self.world.size
        summary = {
            "steps": self.step, "max_steps": t["max_steps"], "parameters": n_params,
            **self._weights_figures(stop), "train_seconds": round(self.train_seconds, 2),
            "tokens_seen": self.tokens_seen,
            "tokens_per_s": round(self.tokens_seen / max(self.train_seconds, 1e-9), 1),
            "wall_seconds": round(wall_seconds, 2), "processes": self.processes * ranks, "mpi_ranks": ranks,
            "stopped_early": stop["stopped_early"], "interrupted": stop["interrupted"],
            "time_limit_reached": stop["time_limit"], "stopped_by": _stopped_by(stop),
            "commit": git_commit(), "run_dir": str(self.run_dir),
        }
        if self.budget is not None:
            summary["budget_seconds"] = self.budget.seconds
        if stop["diverged"]:
            summary["error"] = stop["diverged"]
        elif self._reports_test(stop):
            summary["test"] = self.evaluate("test", full=True, metrics=True)
        if self.budget is not None:      # everything of the run but this summary's own write
            summary["budget_used_seconds"] = round(self.budget.used(), 2)
        if self._writer:
            self._check_folder()
            write_json_atomic(self.run_dir / "summary.json", summary)
        self.last_summary = summary
        if not stop["diverged"]:          # the caller reports a divergence
            self._print(self._summary_text(summary))
        return summary

    def _reports_test(self, stop):
        """Whether this finished run scores its saved weights on the test split: for the tasks that report a
        test figure (``report_test``: classification and translation), once training has ended (not after
        Ctrl-C or a partial ``train(stop_after=...)`` call); rank 0 alone under MPI."""
        ended = (self.step >= self.train_cfg["max_steps"] or stop["stopped_early"] or stop["time_limit"]
                 or stop["budget"])
        return (self._writer and ended and not stop["interrupted"] and getattr(self.task, "report_test", False)
                and self.step > 0)

    def _weights_figures(self, stop):
        """Keep the better weights (rank 0 under MPI, which tells the other ranks the figures); a diverged run's
        last weights are never kept."""
        resumable = stop["interrupted"] or stop["time_limit"]
        figures = self._keep_better_weights(stop["diverged"], resumable) if self._writer else None
        if self.world is not None:
            figures = self.world.comm.bcast(figures, root=0)
        return figures

    def _keep_better_weights(self, diverged=False, resumable=False):
        """Save the weights to use in model.safetensors (and leave them in ``self.model``); return their figures.

        The rule: the periodic evaluations select a step on one yardstick (the fixed sample, or the whole
        split); then the selected weights (restore_best) and the last weights are both scored on the whole
        validation split, and the better is kept. ``best_val_loss`` is always the whole-split loss of the
        weights in model.safetensors, ``best_step`` their step. After a divergence only the selected weights can
        be kept (else none: every figure is None). A run stopped so as to be resumed (Ctrl-C, the time limit)
        keeps the selected weights in model.safetensors whichever scores better, and ``self.model`` keeps the
        last weights: the resumed run selects from the same weights as an uninterrupted run would (its last
        weights are in the checkpoint); without a selection yet, the last weights are saved (never taken for
        a selection: model.safetensors is the selection only when its step is the evaluations' best step).
        """
        path = self.run_dir / MODEL
        if diverged:
            if not (self.train_cfg["restore_best"] and path.exists()):
                return {"best_val_loss": None, "best_step": None, "weights": None}
            step = int(load_model_weights(path, self.model)["step"])
            return {"best_val_loss": self._whole_val_loss(step), "best_step": step, "weights": "best"}
        last = (self.step, self._whole_val_loss(self.step))
        sample = self._eval_sample_size("val")
        figures = {"last_step": last[0], "last_val_loss": last[1],
                   "selected_on": "val_loss_estimate" if sample else "val_loss", "estimate_examples": sample or None}
        kept = last
        if self.train_cfg["restore_best"] and self._has_selection(path):
            last_weights = {k: np.array(v, copy=True) for k, v in self.model.state_dict().items()}
            step = int(load_model_weights(path, self.model)["step"])
            selected = (step, self._whole_val_loss(step))
            figures.update(selected_step=selected[0], selected_val_loss=selected[1])
            if resumable:
                self.model.load_state_dict(last_weights)
                return {"best_val_loss": selected[1], "best_step": selected[0], "weights": "best", **figures}
            if selected[1] < last[1]:
                kept = selected
            else:
                self.model.load_state_dict(last_weights)
        self._check_folder()
        save_model(path, self.model, {"step": kept[0], "val_loss": kept[1],
                                      **run_folder.weights_metadata(self.config)})
        return {"best_val_loss": kept[1], "best_step": kept[0], "weights": "last" if kept is last else "best",
                **figures}

    def _has_selection(self, path):
        """Whether model.safetensors holds the weights the periodic evaluations selected (its step is the best
        step), rather than the last weights of a stop or of an earlier finished run."""
        if self.early.best_step is None or not path.exists():
            return False
        step = load_metadata(path, "model file").get("step")
        return step is not None and step.isdigit() and int(step) == self.early.best_step

    def _summary_text(self, s):
        how = f"{s['steps']} steps" + ("" if s["stopped_by"] == "max_steps" else f" ({s['stopped_by']})")
        if s["best_val_loss"] is None:
            best = "No evaluation ran."
        else:
            best = (f"Validation loss {s['best_val_loss']:.4f} on the whole split with the weights of step "
                    f"{s['best_step']}")
            if s.get("selected_step") is not None and s["selected_step"] != s["last_step"]:
                best += (f" (whole split: step {s['selected_step']}, selected by {s['selected_on']}, "
                         f"{s['selected_val_loss']:.4f}; last step {s['last_step']}, {s['last_val_loss']:.4f})")
            best += "."
        if s.get("test"):
            test = ", ".join(f"{k[len('test_'):]} {v:.4f}" for k, v in s["test"].items()
                             if isinstance(v, float) and not k.startswith("test_decode"))
            best += f" Test split: {test}."
        steps_time = f"{s['train_seconds']:.1f} s of training steps"
        wall = f"{s['wall_seconds']:.1f} s wall time"
        if self.resumed:        # the step time counts every part of the run; the wall time, this call's
            steps_time += " (all parts of the resumed run)"
            wall += " of this part"
        return (f"\nTrained {type(self.model).__name__} ({s['parameters']:,} parameters): {how} in "
                f"{steps_time} ({s['tokens_per_s']:,.0f} tokens/s; "
                f"{wall} with evaluations and checkpoints). {best} "
                f"Saved to {self.run_dir}: {MODEL} ({s['weights']} weights), {CHECKPOINT} "
                f"(continue with --resume), metrics.jsonl, config.json.")

    def _progress_bar(self, last_step):
        """The progress of the run (none when quiet): a tqdm bar updated in place where stderr is a terminal
        (under MPI: rank 0's, where mpiexec runs in a terminal), else plain periodic lines (train/progress.py)."""
        if self.quiet:
            return None
        terminal = sys.stderr.isatty() or (self.world is not None and self.world.launched_from_terminal())
        if self.budget is not None:           # the steps are not known in advance: the bar counts the time left
            return progress(None, self.step, terminal, time_left=self.budget.remaining)
        return progress(last_step, self.step, terminal)


def _budget(t, world, clock_start):
    """The clock of a run planned for [train] budget_minutes, started at ``clock_start``; None without one."""
    if not t["budget_minutes"]:
        return None
    if world is not None:
        raise ValueError("[train] budget_minutes is not available under MPI (the ranks would have to agree on the "
                         "clock); use max_steps, or max_minutes for a time limit")
    budget = Budget(60 * t["budget_minutes"])
    budget.start = clock_start
    return budget


def _check_state(state):
    """A checkpoint's trainer state has the fields and types ``Trainer._state`` writes (TypeError or KeyError
    naming the first that does not)."""
    def number(v, none=False):
        return (v is None and none) or (isinstance(v, (int, float)) and not isinstance(v, bool))

    def count(v, none=False):
        return (v is None and none) or (type(v) is int and v >= 0)

    def rng_list(v):
        return v is None or (isinstance(v, list) and all(isinstance(s, (dict, list)) or s is None for s in v))

    early = state["early_stopping"]
    checks = {"step": count(state["step"]), "tokens_seen": count(state["tokens_seen"]),
              "train_seconds": number(state["train_seconds"]),
              "model_rng": isinstance(state["model_rng"], dict), "data_rng": isinstance(state["data_rng"], dict),
              "early_stopping": isinstance(early, dict) and number(early["best"], none=True)
              and count(early["best_step"], none=True) and count(early["bad_evals"]),
              "worker_rngs": rng_list(state.get("worker_rngs")), "mpi_rngs": rng_list(state.get("mpi_rngs"))}
    if "divergence" in state:
        d = state["divergence"]
        checks["divergence"] = isinstance(d, dict) and number(d["first_loss"], none=True) and count(d["steps_above"])
    if state.get("budget") is not None:
        b = state["budget"]
        checks["budget"] = (isinstance(b, dict) and number(b["used"]) and b["used"] >= 0
                            and number(b["warmup_end"], none=True))
    if "log_window" in state:
        w = state["log_window"]
        checks["log_window"] = (isinstance(w, dict) and isinstance(w["losses"], list)
                                and all(number(x) for x in w["losses"]) and count(w["tokens"]))
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise TypeError(f"{bad[0]} is not what a checkpoint holds")


def _stopped_by(stop):
    """Why a run stopped, for summary.json: diverged, interrupted, time limit, time budget, stopped early or
    max_steps."""
    for key, text in (("diverged", "diverged"), ("interrupted", "interrupted"), ("time_limit", "time limit"),
                      ("budget", "time budget"), ("stopped_early", "stopped early")):
        if stop[key]:
            return text
    return "max_steps"


class _LogWindow:
    """The training losses and tokens since the last log line, and when that line was written."""

    def __init__(self):
        self.losses, self.tokens, self.start = [], 0, time.perf_counter()

    def add(self, loss, tokens):
        self.losses.append(loss)
        self.tokens += tokens


def _is_main_thread():
    import threading

    return threading.current_thread() is threading.main_thread()
