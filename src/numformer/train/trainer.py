"""The training loop: batches, the step (train/step.py), clipping, optimizer, schedule; evaluation
(train/evaluation.py) and the run folder's files (train/run_writer.py) at their steps.

    trainer = Trainer(config, run_dir)        # validates the whole config first
    summary = trainer.train()

One update, as ``Trainer._train_step`` takes it (lr: the schedule's, by step or by a time budget's progress)::

    optimizer.set_lr(lr)
    losses = [loss_and_backward(model, b.inputs, b.targets, label_smoothing, grad_scale=1 / grad_accum)
              for b in grad_accum micro-batches of batch_size examples]   # gradients summed into p.grad
    loss = mean(losses)             # each a mean over its counted targets; the gradient is that of this mean
    clip_grad_norm(optimizer.params, grad_clip)
    optimizer.step(); optimizer.zero_grad()

It writes a run folder (train/run_writer.py: config.json, tokenizer.json, metrics.jsonl, checkpoint.safetensors,
model.safetensors, summary.json; a DPO run also reference_logps.safetensors; docs/reference/run-folder.md).
Resuming is exact: a run stopped at step N and resumed gives, bit for bit, the weights of an uninterrupted run
(model, optimizer moments, both random generators and every counter are restored; metrics lines after the
checkpoint, and the partial line of the stop (train/state.py LogWindow), are dropped and re-logged).
"""
from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path

import numpy as np

from ..optim import clip_grad_norm, train_schedule
from ..provenance import git_commit
from ..run_files import CHECKPOINT, load_checkpoint, rng_state, set_rng_state
from .budget import budget_for
from .build import build_trained_model, check_training_memory, describe_run, make_optimizer
from .dpo import check_objective, set_reference_logprobs
from .early_stopping import EarlyStopping
from .evaluation import Evaluation, describe
from .final import aborted_note, divergence_advice, ended_before, finish
from .parallel import share_text, usable_processes
from .progress import run_progress
from .run import config_and_task
from .run_writer import RunWriter
from .state import (DivergenceGuard, LogWindow, TrainingDiverged, check_state, commits_after_resume,
                    resumable_step)
from . import stop_signals
from .step import dpo_loss_and_backward
from .workers import Workers


class Trainer:
    """Train a model described by a config into ``run_dir``.

    config: the raw config dict (sections model/data/train, optional lora), checked whole first; ignored with
    ``resume``, which continues run_dir's run from its checkpoint and config.json. overrides: "section.key=value"
    items (--set) applied to the config; overwrite: replace a run already in run_dir; quiet: no progress bar or
    messages. world: the MPI world (``train.mpi.init_world()``) when this process is one of several ranks: every
    rank trains its share of each batch, rank 0 alone writes the run folder and prints. The run folder's lock
    (run_folder.RunLock; a new run's once its config is valid) is held until ``close()`` or the process ends.
    """

    def __init__(self, config, run_dir, resume=False, overwrite=False, overrides=None, quiet=False, world=None):
        clock_start = time.perf_counter()       # a time budget counts the setup too
        self.commits = [git_commit()]   # the code this process loaded, read at the start; a resume adds earlier ones
        self.run_dir, self.world, self.resumed = Path(run_dir), world, resume
        self._writer = world is None or world.is_writer         # the one process that writes the run folder
        self.quiet = quiet or not self._writer
        self._bar = None                # the progress of a running train() call (none when quiet)
        # under MPI rank 0 alone holds the folder; a new run's folder is touched only once the config is valid
        self.folder = (RunWriter.for_resuming(self.run_dir) if resume and self._writer
                       else RunWriter.silent(self.run_dir))
        self.config, self.task, notes, self.data_files = config_and_task(self.run_dir, config, overrides, resume,
                                                                          self.quiet)
        t = self.train_cfg = self.config["train"]
        self.dtype = np.dtype(t["dtype"])
        seeds = np.random.SeedSequence(t["seed"]).spawn(2)
        self.model_rng = np.random.default_rng(seeds[0])   # initialization, then dropout masks
        self.data_rng = np.random.default_rng(seeds[1])    # training batches
        self.model = build_trained_model(self.config, self.model_rng, self.dtype, resume)
        self.optimizer = check_training_memory(self.run_dir, make_optimizer(self.model, t))   # nothing written yet
        d_model = self.config["model"]["d_model"]           # the noam schedule scales by d_model^-0.5
        self.schedule = train_schedule(t, d_model)
        self.budget = budget_for(t, world, clock_start)   # the time budget's clock, else None: steps are counted
        self.evaluation = Evaluation(self.model, self.task, t, self.budget, world)
        self.early = EarlyStopping(t["early_stopping_patience"], t["early_stopping_min_delta"])
        self.divergence = DivergenceGuard()
        self.step, self.tokens_seen, self.train_seconds = 0, 0, 0.0
        self._window = LogWindow()      # the training losses since the last metrics line
        self._checkpoint_step = None    # the step of checkpoint.safetensors
        ranks = 1 if world is None else world.size
        self.dpo = check_objective(t["objective"], self.task, world)
        self.processes = usable_processes(self.model, max(1, t["batch_size"] // ranks),
                                          1 if self.dpo else t["processes"])
        self.workers = Workers(self.model, self.processes, t["seed"], world)   # data-parallel processes
        self._stop_requested, self._phase = False, "steps"     # the phase: steps, scoring, final (the saves)
        self._evaluate_end = False      # a resumed run at its max_steps still to evaluate: final.ended_before
        self.stop_signal = signal.SIGINT   # what stopped the run early (Ctrl-C, SIGTERM ...)
        self.last_summary = None        # what the last train() call returned
        if resume:
            self._restore()
        elif self._writer:               # the whole config is valid: only now is the folder touched
            self.folder = RunWriter.for_new_run(self.run_dir, overwrite)
        if self.dpo:
            set_reference_logprobs(self.model, self.task, self.run_dir, self.resumed, self._writer)
        for note in notes:      # each change --set makes to a resumed run, once every check above accepted it
            self._print(note)

    def close(self):
        """Release the run folder's lock (also done when the process ends)."""
        self.folder.close()

    # -- the training state in checkpoint.safetensors ------------------------------------------
    def _state(self):
        state = {"step": self.step, "tokens_seen": self.tokens_seen, "train_seconds": self.train_seconds,
                 "budget": None if self.budget is None else {"used": self.budget.used(),
                                                             "warmup_end": self.budget.warmup_end},
                 "model_rng": rng_state(self.model_rng), "data_rng": rng_state(self.data_rng),
                 "worker_rngs": None, "early_stopping": self.early.state_dict(),
                 "divergence": self.divergence.state_dict(), "log_window": self._window.state_dict(),
                 "metrics_step": self.folder.logged_step, "commits": self.commits}
        state.update(self.workers.state())      # collective under MPI: every rank's generators, on rank 0
        return state

    def _restore(self):
        path = self.run_dir / CHECKPOINT
        state = load_checkpoint(path, self.model, self.optimizer)
        try:
            check_state(state)
            self.step, self.tokens_seen = state["step"], state["tokens_seen"]
            self.train_seconds = state["train_seconds"]
            set_rng_state(self.model_rng, state["model_rng"])
            set_rng_state(self.data_rng, state["data_rng"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
            raise ValueError(f"checkpoint {path} is damaged (its state metadata: {type(e).__name__}: {e}); it "
                             f"cannot be resumed: restore it or train again") from None
        self.early.load_state_dict(state["early_stopping"])
        self.commits = commits_after_resume(state.get("commits"), self.commits[-1], self.step, self._print)
        self.folder.resumed_from(state, self.evaluation.selected_on())
        self.workers.restore(state)
        d, w = state.get("divergence"), state.get("log_window")
        self.divergence = DivergenceGuard(d["first_loss"], d["steps_above"]) if d else self.divergence
        self._window = LogWindow(w["losses"], w["tokens"]) if w else self._window   # the same steps as unstopped
        self._checkpoint_step = resumable_step(self.step, self.train_cfg["max_steps"], self.run_dir)
        if self.budget is not None and state.get("budget"):    # a resumed run goes on spending the same budget
            self.budget.used_before = state["budget"]["used"]
            self.budget.warmup_end = state["budget"]["warmup_end"]
        self._window.partial_step = self.folder.truncate_metrics(self.step)     # a stop's line, kept: LogWindow

    def save_checkpoint(self):
        """checkpoint.safetensors: model, optimizer and trainer state of this step (under MPI: call on every rank)."""
        started = time.perf_counter()
        state = self._state()           # collective under MPI: every rank calls it
        if self._writer:
            self.folder.save_checkpoint(self.model, self.optimizer, state, self.config)
            self._checkpoint_step = self.step
        if self.budget is not None:
            self.budget.timed_save(time.perf_counter() - started)

    def evaluate(self, split="val", full=False, metrics=None):
        """The loss and the task's metrics on a split: ``Evaluation.__call__`` (train/evaluation.py)."""
        return self.evaluation(split, full, metrics)

    def _print(self, message):
        if self.quiet:
            return
        if self._bar is not None:       # above the progress bar, which stays at the bottom
            self._bar.write(message)
        else:
            print(message, file=sys.stderr, flush=True)

    # -- the step -----------------------------------------------------------------------------
    def _train_step(self):
        """One optimizer update (grad_accum micro-batches); returns (mean loss, grad norm before clipping, tokens)."""
        t, started = self.train_cfg, time.perf_counter()
        self._lr = self._planned_lr()
        self.optimizer.set_lr(self._lr)
        losses, tokens = [], 0
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # non-finite values are checked here
            for _ in range(t["grad_accum"]):
                batch = self.task.train_batch(t["batch_size"], self.data_rng)
                losses.append(dpo_loss_and_backward(self.model, batch, t["beta"], 1.0 / t["grad_accum"]) if self.dpo
                              else self.workers.loss_and_backward(batch, t["label_smoothing"], 1.0 / t["grad_accum"]))
                tokens += batch.n_tokens
            loss = float(np.mean(losses))
            if self.world is not None:      # the step's one Allreduce, with every rank's reasons to stop
                loss = self.workers.combine(loss, self._stop_requested, self._time_up(started))
            if not math.isfinite(loss):
                raise TrainingDiverged(f"the training loss became {loss} at step {self.step + 1}")
            norm = clip_grad_norm(self.optimizer.params, t["grad_clip"])
            if not math.isfinite(norm):
                raise TrainingDiverged(f"the gradient norm became {norm} at step {self.step + 1}")
            self.optimizer.step()       # weights an lr made non-finite: the next step's loss says so
        self.optimizer.zero_grad()
        self.divergence.check(loss, self.step + 1)      # the combined loss: the same on every rank
        return loss, norm, tokens

    def _planned_lr(self):
        """The schedule's learning rate for the update about to be taken: by step, or under a time budget by
        the fraction of the budget's training time spent (Budget.progress)."""
        if self.budget is None:
            return self.schedule(self.step)
        return self.schedule.at(self.step, self.budget.progress(self.step, self.train_cfg["warmup_steps"]))

    def _time_up(self, started):
        """Whether the time limit (max_minutes of training) is reached by the step begun at ``started``."""
        limit = 60 * self.train_cfg["max_minutes"]
        return bool(limit) and self.train_seconds + time.perf_counter() - started >= limit

    def _on_stop_signal(self, signum):
        if self._stop_requested:          # a second Ctrl-C (or SIGTERM ...): stop now, saying what is kept
            self._print(aborted_note(stop_signals.name(signum), self.step, self.run_dir, self._checkpoint_step))
            raise stop_signals.Aborted(signum)
        self._stop_requested, self.stop_signal = True, signum
        again = "press it again" if signum == signal.SIGINT else "send it again"
        doing = ("finishing this step and writing a checkpoint" if self._phase == "steps"
                 else "stopping the final scoring and writing summary.json")
        self._print(f"\n{stop_signals.name(signum)}: {doing} ({again} to abort)...")
        if self._phase == "scoring":     # its saves are atomic, so it is abandoned at once
            raise stop_signals.FinalPhaseStopped

    @property
    def stop_requested(self):
        """Whether a stop signal came during the last train() call (its exit code is then 128 + its number)."""
        return self._stop_requested

    # -- the loop -----------------------------------------------------------------------------
    def train(self, stop_after=None):
        """Train to max_steps (or ``stop_after`` more steps, for tests); returns the summary dict (summary.json).

        Each step that fits the time budget: an update, then (when due) a log line, an evaluation, a checkpoint and
        the stopping rules (time limit, early stopping, Ctrl-C); then the final phase (``_finish``), during
        which the stop signals are handled too (under MPI, Ctrl-C alike on every rank: final.final_scoring).
        A divergence: summary.json, then TrainingDiverged."""
        wall_start = time.perf_counter()        # summary.json's wall_seconds: the whole call
        self._stop_requested, self._phase = False, "steps"
        stop = {"stopped_early": False, "interrupted": False, "time_limit": False, "budget": False, "diverged": None}
        ended = ended_before(self, stop, stop_after)
        if isinstance(ended, dict):             # a resumed run that had ended: once ended, its files stay
            return ended
        self.folder.restore_selection(self.model, self.config)      # a resumed run: its checkpoint's selection
        n_params = self._start_run()
        restore_signals = stop_signals.install(self._on_stop_signal, stop_signals.ALONE if self.world is None
                                               else stop_signals.UNDER_MPI)
        try:
            if ended and self._evaluate_end:
                self._evaluate_last_step(stop)
            t = self.train_cfg
            last_step = t["max_steps"] if stop_after is None else min(t["max_steps"], self.step + stop_after)
            self._take_steps(self.step if ended else last_step, stop)
            self._window.log_stop(self.folder, self.step, self.train_seconds)     # a line for the last step taken
            summary = self._finish(stop, n_params, wall_start)
        finally:
            restore_signals()
        if stop["diverged"]:
            raise TrainingDiverged(stop["diverged"])
        return summary

    def _finish(self, stop, n_params, wall_start):
        return finish(self, stop, n_params, wall_start)      # final.finish: scoring, summary.json, the last line

    def _evaluate_last_step(self, stop):
        """An interrupted run resumed at its max_steps: what an uninterrupted run does at that step, its
        training line (the stop's partial line made a regular one: the same steps), its evaluation and a
        checkpoint that records them."""
        if self.folder.complete_partial(self.step):
            self._window = LogWindow()
        stop["stopped_early"] = self._evaluate_step()
        self.save_checkpoint()

    def _take_steps(self, last_step, stop):
        """The steps up to ``last_step``, until a stopping rule (recorded in ``stop``) or a divergence (its line
        in ``stop["diverged"]``)."""
        t = self.train_cfg
        bar = self._bar = None if self.quiet else run_progress(self.world, self.budget, last_step, self.step)
        self._window.restart_clock()
        try:
            self.workers.start()
            self._plan_budget()
            while self.step < last_step and not self._out_of_budget(stop):
                started = time.perf_counter()
                loss, norm, tokens = self._train_step()
                self.step += 1
                self.tokens_seen += tokens
                self.train_seconds += time.perf_counter() - started
                if self.budget is not None:
                    self.budget.step_seconds.append(time.perf_counter() - started)
                self._window.add(loss, tokens, self._lr, norm)
                self._log_step(loss, bar)
                if self._evaluates(self.step):
                    stop["stopped_early"] = self._evaluate_step()
                # no periodic checkpoint while the loss is above the divergence threshold (one from before is kept)
                periodic = self.step % t["checkpoint_every"] == 0 and not self.divergence.steps_above
                if periodic or self.step == last_step or stop["stopped_early"]:
                    self.save_checkpoint()
                if self._should_stop(last_step, stop):
                    break
        except TrainingDiverged as e:
            advice = divergence_advice(self.run_dir, self._checkpoint_step, t["grad_clip"])
            stop["diverged"] = f"{e}. Training stopped; {advice}"
        finally:
            if bar is not None:
                bar.close()
                self._bar = None
            self.workers.close()

    def _evaluates(self, step):
        """Whether a periodic evaluation follows update ``step`` (every eval_every steps, and at max_steps)."""
        return step % self.train_cfg["eval_every"] == 0 or step == self.train_cfg["max_steps"]

    def _plan_budget(self):
        """Before the first step under a time budget: measure what the end costs (Budget.plan)."""
        if self.budget is not None:
            moments = 3 if self.train_cfg["optimizer"] in ("adam", "adamw", "muon") else 2
            self.budget.plan(self.evaluation, self.train_cfg["restore_best"],
                             self.model.num_parameters() * self.dtype.itemsize * moments)

    def _out_of_budget(self, stop):
        """Under a time budget, whether the next step (with the evaluation and checkpoint due after it) no longer
        fits; then the run ends here, with a checkpoint (recorded in ``stop``)."""
        if self.budget is None:
            return False
        step = self.step + 1
        if self.budget.fits(self.budget.after_step(self._evaluates(step), self.evaluation.examples("val"),
                                                   step % self.train_cfg["checkpoint_every"] == 0)):
            return False
        stop["budget"] = True
        self._print(f"time budget of {self.train_cfg['budget_minutes']:g} minutes: training ends at step "
                    f"{self.step}, {self.budget.remaining():.1f} s left for the final evaluation and saves")
        if self._checkpoint_step != self.step:
            self.save_checkpoint()
        return True

    def _start_run(self):
        """Write config.json and tokenizer.json (the folder holds no other run: run_folder.start_new_run) and
        say what trains; returns the number of parameters. Under MPI, rank 0 alone does this."""
        n_params = self.model.num_parameters()
        if not self._writer:
            return n_params
        self.folder.start(self.config, self.task.tokenizer_state(), self.data_files)
        self._print(describe_run(self.model, n_params, self.task, self.config))
        if self.world is not None:
            self._print(f"{self.world.describe()}; each rank computes "
                        f"{share_text(self.train_cfg['batch_size'], self.world.size)}"
                        + (f", split over {self.processes} processes" if self.processes > 1 else ""))
        elif self.processes > 1:
            self._print(f"data-parallel on {self.processes} processes: each computes "
                        f"{share_text(self.train_cfg['batch_size'], self.processes)} ([train] processes)")
        if self.resumed:
            self._print(f"resuming {self.run_dir} at step {self.step}")
        return n_params

    def _log_step(self, loss, bar):
        """Every log_every steps, at step 1 and at max_steps: a training line in metrics.jsonl (LogWindow.line: the
        mean loss and the tokens/s since the previous line; at a stop between two, LogWindow.log_stop writes one);
        every step: the progress bar's figures (this step's loss)."""
        self._window.drop_partial(self.folder)      # the first step after a stop: its line goes
        if self.step % self.train_cfg["log_every"] == 0 or self.step in (1, self.train_cfg["max_steps"]):
            record = self._window.line(self.step, self.train_seconds)
            self.folder.log(record)
            if bar is not None:
                bar.set_postfix(lr=f"{record['lr']:.2e}", tok_s=f"{record['tokens_per_s']:,.0f}")
            self._window = LogWindow()
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}")
            bar.update(1)

    def _evaluate_step(self):
        """A periodic evaluation (Evaluation.periodic): log it, save the weights to model.safetensors when the
        validation loss (on the same yardstick at every evaluation: the whole split or the fixed sample)
        improved, show it in the next progress line, and return whether early stopping says to stop."""
        result, key = self.evaluation.periodic(self.step)
        self.folder.log({"step": self.step, **result})
        improved = self.early.update(result[key], self.step)     # every rank takes the same decision
        if improved:
            self.folder.save_weights(self.model, self.config, step=self.step, **{key: result[key]})
        if self._bar is not None:       # one progress line per interval, not one per evaluation
            self._bar.evaluation(self.step, describe(result, key, improved))
        if self.early.should_stop:
            self._print(f"early stopping: no improvement for {self.early.patience} evaluations")
        return self.early.should_stop

    def _should_stop(self, last_step, stop):
        """After a step's checkpoint: stop at the time limit, on early stopping, or on Ctrl-C (recorded in
        ``stop``); a checkpoint is written first where the step's own rule did not write one."""
        t = self.train_cfg
        agreed = self.workers.agreed if self.world is not None else None   # under MPI: what every rank agreed
        time_up = agreed["time_up"] if agreed else self.train_seconds >= 60 * t["max_minutes"]
        if t["max_minutes"] and time_up and self.step < last_step:
            self._print(f"time limit of {t['max_minutes']} minutes reached at step {self.step}")
            self.save_checkpoint()
            stop["time_limit"] = True
            return True
        if stop["stopped_early"]:
            return True
        if agreed["stop"] if agreed else self._stop_requested:
            self.save_checkpoint()
            stop["interrupted"] = True
            return True
        return False
