"""The end of a training call: the weights kept in model.safetensors, and the summary (summary.json and the
closing line).

The rule for the weights: the periodic evaluations select a step on one yardstick (the fixed sample, or the
whole validation split); then the selected weights (``restore_best``) and the last weights are both scored on
the whole validation split, and the better is kept. ``best_val_loss`` is always the whole-split loss of the
weights in model.safetensors, ``best_step`` their step.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .._limits import read_json_file
from ..provenance import git_commit
from ..run_files import CHECKPOINT, MODEL, load_model_weights, weights_step
from . import stop_signals


def keep_better_weights(model, folder, evaluation, early, step, config, diverged=False, resumable=False):
    """``choose_weights`` (see there), with ``best_val_bpb``: the bits per byte of the kept weights on the whole
    validation split, for a language model (train/bits_per_byte.py)."""
    figures = choose_weights(model, folder, evaluation, early, step, config, diverged, resumable)
    bpb = evaluation.whole_bpb.get(figures["best_step"])
    return figures if bpb is None else {**figures, "best_val_bpb": bpb}


def choose_weights(model, folder, evaluation, early, step, config, diverged=False, resumable=False):
    """Save the weights to use in model.safetensors (``folder``: the run's RunWriter) and leave them in
    ``model``, whose weights are those of ``step``; return their figures. ``early``: the run's EarlyStopping
    (its best step is the evaluations' selection), ``config``: the run's resolved config.

    After a divergence only the selected weights can be kept (else none: every figure is None). A run stopped
    so as to be resumed (Ctrl-C, the time limit) keeps the selected weights in model.safetensors whichever
    scores better, and ``model`` keeps the last weights: the resumed run selects from the same weights as an
    uninterrupted run would (its last weights are in the checkpoint); without a selection yet, the last weights
    are saved (never taken for a selection: model.safetensors is the selection only when its step is the
    evaluations' best step).
    """
    path = folder.run_dir / MODEL
    restore_best = config["train"]["restore_best"]
    if diverged:
        if not (restore_best and path.exists()):
            return {"best_val_loss": None, "best_step": None, "weights": None}
        best = int(load_model_weights(path, model)["step"])
        return {"best_val_loss": evaluation.whole_val_loss(best), "best_step": best, "weights": "best"}
    last = (step, evaluation.whole_val_loss(step))
    sample = evaluation.sample_size("val")
    figures = {"last_step": last[0], "last_val_loss": last[1],
               "selected_on": "val_loss_estimate" if sample else "val_loss", "estimate_examples": sample or None}
    kept = last
    if restore_best and _holds_selection(path, early.best_step):
        last_weights = {k: np.array(v, copy=True) for k, v in model.state_dict().items()}
        best = int(load_model_weights(path, model)["step"])
        selected = (best, evaluation.whole_val_loss(best))
        figures.update(selected_step=selected[0], selected_val_loss=selected[1])
        if resumable:
            model.load_state_dict(last_weights)
            return {"best_val_loss": selected[1], "best_step": selected[0], "weights": "best", **figures}
        if selected[1] < last[1]:
            kept = selected
        else:
            model.load_state_dict(last_weights)
    folder.save_weights(model, config, step=kept[0], val_loss=kept[1])
    return {"best_val_loss": kept[1], "best_step": kept[0], "weights": "last" if kept is last else "best",
            **figures}


def kept_weights_figures(world, keep):
    """``keep()`` (``keep_better_weights``) on rank 0 alone under MPI, which tells the other ranks the figures."""
    figures = keep() if world is None or world.is_writer else None
    return figures if world is None else world.comm.bcast(figures, root=0)


def abandonable(trainer, work):
    """(False, ``work()``), or (True, None) when a first stop signal abandoned it: meanwhile
    ``trainer._phase`` is "scoring", in which its stop-signal handler raises ``FinalPhaseStopped``."""
    try:
        trainer._phase = "scoring"
        result = work()
        trainer._phase = "final"
        return False, result
    except stop_signals.FinalPhaseStopped:
        trainer._phase = "final"
        return True, None


def stop_agreed(trainer, stopped=False):
    """Whether this process, or under MPI any rank, was asked to stop (``trainer.stop_requested``) or
    abandoned its scoring (``stopped``); collective under MPI: every rank gets the same answer."""
    mine = bool(stopped or trainer.stop_requested)
    return mine if trainer.world is None else any(trainer.world.comm.allgather(mine))


def divergence_advice(run_dir, checkpoint_step, grad_clip=0.0):
    """What a diverged run keeps and how to continue: from the checkpoint written before the divergence began
    (of ``checkpoint_step``), with a lower learning rate; or, without one, a new run. ``grad_clip``: the run's
    (0 = off), so that the advice is a clip where there was none and a smaller one where there was."""
    clip = f"a smaller grad_clip (it was {grad_clip:g})" if grad_clip else "a grad_clip"
    ckpt = run_dir / CHECKPOINT
    if checkpoint_step is None or not ckpt.exists():
        return ("no checkpoint had been written yet (checkpoint_every), so there is nothing to resume: train "
                f"again with --overwrite (numformer train CONFIG --out {run_dir} --overwrite --set train.lr=...) "
                f"and a lower lr, more warmup_steps or {clip}")
    return (f"the checkpoint of step {checkpoint_step}, written before the loss began to diverge, is kept in "
            f"{ckpt}; continue from it with a lower learning rate: numformer train --out {run_dir} --resume "
            f"--set train.lr=... (or more warmup_steps, {clip})")


def aborted_note(signal_name, step, run_dir, checkpoint_step):
    """The line of a run aborted by a second stop signal after update ``step``: the checkpoint it can resume
    from (of ``checkpoint_step``), or that there is none."""
    if checkpoint_step is None:
        kept = "no checkpoint had been written yet, so there is nothing to resume"
    else:
        kept = (f"the checkpoint of step {checkpoint_step} is kept: numformer train --out {run_dir} --resume goes "
                f"on from it")
    return f"{signal_name} again: aborted after step {step}; {kept}"


def nothing_to_train(early, step, train, train_seconds, stop_after=None, ended=None, budget_seconds=None):
    """(stop, line) when a resumed run at ``step`` has ended and has nothing to train: ``stop``, the key of
    ``stopped_by``'s reason (stopped_early, max_steps, time_limit, budget), and one line saying so with what to
    change to train on; None when it has steps to take. ``early``: its EarlyStopping; ``train``: its [train]
    config; ``train_seconds``: the training time of its steps so far; ``ended``: its summary.json when it
    records an end at ``step`` (``ended_summary``), which alone tells that a time budget
    (``budget_seconds``, None without one) was spent."""
    minutes, budget = train["max_minutes"], (ended or {}).get("budget_seconds")
    if early.should_stop:
        return "stopped_early", (f"{early.stop_reason(step)}: nothing to train; raise "
                                 f"train.early_stopping_patience to train on")
    if stop_after is None and step >= train["max_steps"]:
        return "max_steps", (f"already trained to max_steps = {train['max_steps']}: nothing to train; raise it to "
                             f"train on (--set train.max_steps={2 * train['max_steps']})")
    if minutes and train_seconds >= 60 * minutes:
        return "time_limit", (f"the time limit of max_minutes = {minutes:g} is reached ({train_seconds / 60:.2f} "
                              f"minutes of training steps): nothing to train; raise it to train on (--set "
                              f"train.max_minutes={2 * minutes:g})")
    if (ended or {}).get("stopped_by") == "time budget" and budget_seconds is not None and budget is not None \
            and budget_seconds <= budget:
        return "budget", (f"the time budget of budget_minutes = {budget / 60:g} is spent: nothing to train; raise "
                          f"it to train on (--set train.budget_minutes={budget / 30:g})")
    return None


def unfinished_end(run_dir, step, evaluates):
    """The line of a resumed run at ``step`` that has ended but whose end was not recorded (interrupted at its
    last step, or killed before its summary.json): this call records it; ``evaluates``: the evaluation of
    ``step`` is still to be made."""
    what = f"the evaluation of step {step}, " if evaluates else ""
    return (f"{run_dir} ended at step {step} without recording its end: finishing it ({what}the final scoring of "
            f"the weights and summary.json)")


def ended_summary(run_dir, step):
    """The summary.json of a run that has already ended at ``step`` (a resumed run with nothing to train: its
    files stay as they are), or None when there is none for that end."""
    try:
        summary = read_json_file(Path(run_dir) / "summary.json", "summary")
    except ValueError:
        return None
    ended = isinstance(summary, dict) and summary.get("steps") == step and not summary.get("interrupted")
    return summary if ended and not summary.get("error") else None


def unscored_figures(path, best_step):
    """The figures of a train() call stopped by a signal before its final scoring: the step of the weights
    model.safetensors (``path``) holds, unscored (``best_step``: the evaluations' selection)."""
    step = weights_step(path)
    weights = None if step is None else "best" if step == best_step else "last"
    return {"best_val_loss": None, "best_step": step, "weights": weights}


def _holds_selection(path, best_step):
    """Whether model.safetensors holds the weights the periodic evaluations selected (its step is the best
    step), rather than the last weights of a stop or of an earlier finished run."""
    return best_step is not None and weights_step(path) == best_step


STOPS = (("diverged", "diverged"), ("interrupted", "interrupted"), ("time_limit", "time limit"),
         ("budget", "time budget"), ("stopped_early", "stopped early"))


def stopped_by(stop):
    """Why a run stopped, for summary.json: diverged, interrupted, time limit, time budget, stopped early or
    max_steps."""
    return next((text for key, text in STOPS if stop[key]), "max_steps")


def summary_text(s, model_name, folder, resumed):
    """The closing line of a training call, from its summary ``s``."""
    how = f"{s['steps']} steps" + ("" if s["stopped_by"] == "max_steps" else f" ({s['stopped_by']})")
    if s["best_val_loss"] is None and s["best_step"] is not None:     # stopped before its final scoring
        best = (f"The final scoring was stopped (--resume finishes it); {MODEL} holds the weights of step "
                f"{s['best_step']}.")
    elif s["best_val_loss"] is None:
        best = "No evaluation ran."
    else:
        best = (f"Validation loss {s['best_val_loss']:.4f}"
                + (f" ({s['best_val_bpb']:.4f} bits per byte)" if s.get("best_val_bpb") is not None else "")
                + f" on the whole split with the weights of step {s['best_step']}")
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
    if resumed:        # the step time counts every part of the run; the wall time, this call's
        steps_time += " (all parts of the resumed run)"
        wall += " of this part"
    return (f"\nTrained {model_name} ({s['parameters']:,} parameters): {how} in {steps_time} "
            f"({s['tokens_per_s']:,.0f} tokens/s; {wall} with evaluations and checkpoints). {best} "
            f"Saved to {folder.run_dir}: {folder.saved_files(s['weights'])}.")


def finish(trainer, stop, n_params, wall_start):
    """The end of ``trainer``'s train() call (a Trainer): the weights kept (``keep_better_weights``), the test
    split's figures of a finished run of a task that reports them, summary.json (its wall time: the call's,
    from ``wall_start``, this phase included) and the closing line; returns the summary. A first stop signal
    during the scoring abandons it: the call ends as an interrupted one (``final_scoring``)."""
    t, ranks = trainer.train_cfg, 1 if trainer.world is None else trainer.world.size
    figures, test = final_scoring(trainer, stop)
    summary = {
        "steps": trainer.step, "max_steps": t["max_steps"], "parameters": n_params, **figures,
        "train_seconds": round(trainer.train_seconds, 2), "tokens_seen": trainer.tokens_seen,
        "tokens_per_s": round(trainer.tokens_seen / max(trainer.train_seconds, 1e-9), 1),
        "wall_seconds": None, "processes": trainer.processes * ranks, "mpi_ranks": ranks,
        "stopped_early": stop["stopped_early"], "interrupted": stop["interrupted"],
        "time_limit_reached": stop["time_limit"], "stopped_by": stopped_by(stop),
        "commit": git_commit(), "run_dir": str(trainer.run_dir),
    }
    if len(set(trainer.commits)) > 1:           # resumed by other code: every version that trained it, in order
        summary["commits"] = trainer.commits
    if trainer.budget is not None:
        summary["budget_seconds"] = trainer.budget.seconds
    if stop["diverged"]:
        summary["error"] = stop["diverged"]
    elif test is not None:
        summary["test"] = test
    if trainer.budget is not None:      # everything of the run but this summary's own write
        summary["budget_used_seconds"] = round(trainer.budget.used(), 2)
    summary["wall_seconds"] = round(time.perf_counter() - wall_start, 2)     # the final phase included
    trainer.folder.save_summary(summary)
    trainer.last_summary = summary
    if not stop["diverged"]:          # the caller reports a divergence
        trainer._print(summary_text(summary, type(trainer.model).__name__, trainer.folder, trainer.resumed))
    return summary


def final_scoring(trainer, stop):
    """(figures of the weights kept, the test split's figures or None). A first stop signal during it (or
    since the last step's checkpoint) abandons it (its saves are atomic: each file is the old one or the new
    one): the weights are those saved, unscored (``unscored_figures``), and ``stop`` says interrupted. Under
    MPI rank 0 alone scores, and every rank agrees (``stop_agreed``) before and after it whether any rank was
    stopped: then it is abandoned on every rank alike, whichever rank the signal reached."""
    t, figures, test = trainer.train_cfg, None, None
    ended = trainer.step >= t["max_steps"] or stop["stopped_early"] or stop["time_limit"] or stop["budget"]
    resumable = stop["interrupted"] or stop["time_limit"]
    trainer._phase = "final"
    stopped = not stop["interrupted"] and stop_agreed(trainer)
    if not stopped:
        stopped, figures = kept_weights_figures(trainer.world, lambda: abandonable(trainer, lambda: (
            keep_better_weights(trainer.model, trainer.folder, trainer.evaluation, trainer.early, trainer.step,
                                trainer.config, stop["diverged"], resumable=resumable))))
    if (not stopped and trainer._writer and ended and not stop["interrupted"] and not stop["diverged"]
            and trainer.evaluation.reports_test and trainer.step):      # not after Ctrl-C or stop_after
        stopped = trainer.stop_requested        # a signal between the two scorings: this one is abandoned too
        if not stopped:
            stopped, test = abandonable(trainer, lambda: trainer.evaluation("test", full=True, metrics=True))
    if trainer.world is not None and not stop["interrupted"]:
        stopped = stop_agreed(trainer, stopped)
    if stopped:
        stop["interrupted"], figures, test = True, None, None
    return figures or unscored_figures(trainer.run_dir / MODEL, trainer.early.best_step), test


def ended_before(trainer, stop, stop_after):
    """Whether ``trainer``'s (resumed) run had ended before this call (``nothing_to_train``): its summary.json
    when it records that end, for that reason (then its files stay as they are), else True, the reason set in
    ``stop``, for this call to record the end; False when it has steps to take. A run interrupted at its
    max_steps before its evaluation there is to make it (``trainer._evaluate_end``), as an uninterrupted run
    did."""
    recorded = ended_summary(trainer.run_dir, trainer.step) if trainer._writer else None
    if trainer.world is not None:       # the folder is rank 0's: every rank takes the branch it takes
        recorded = trainer.world.comm.bcast(recorded, root=0)
    budget = None if trainer.budget is None else trainer.budget.seconds
    ended = nothing_to_train(trainer.early, trainer.step, trainer.train_cfg, trainer.train_seconds, stop_after,
                             recorded, budget)
    if ended is None:
        return False
    why = dict(STOPS).get(ended[0], "max_steps")
    if recorded is not None and recorded.get("stopped_by", why) == why:     # summaries before stopped_by: as said
        trainer._print(ended[1])
        return recorded
    if ended[0] != "max_steps":
        stop[ended[0]] = True
    trainer._evaluate_end = (trainer.world is None and ended[0] == "max_steps"
                             and not trainer.folder.evaluated(trainer.step))
    trainer._print(unfinished_end(trainer.run_dir, trainer.step, trainer._evaluate_end))
    return True
