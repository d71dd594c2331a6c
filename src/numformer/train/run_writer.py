"""The writing of a run folder while it trains: config.json and tokenizer.json at the start, metrics.jsonl
lines, checkpoint.safetensors, model.safetensors and summary.json (``numformer/run_files.py`` writes each file
atomically, ``train/run_folder.py`` locks the folder).

    folder = RunWriter.for_new_run(run_dir, overwrite)    # or RunWriter.for_resuming(run_dir)
    folder.log({"step": 1, "train_loss": 2.5})
    folder.save_checkpoint(model, optimizer, state, config)

Before each write the folder is checked (``RunLock.check``): one deleted, moved or replaced since it was locked
stops the run with one line, and nothing is recreated. Under MPI only rank 0 writes: the other ranks hold a
``RunWriter.silent(run_dir)``, whose writes do nothing.
"""
from __future__ import annotations

import errno
import json
import os
import weakref

from . import run_folder
from ..run_files import (CHECKPOINT, DATA_FILES, MODEL, copy_in_folder, open_in_folder, remove_in_folder,
                         replace_in_folder, save_checkpoint, save_model, verify_file, weights_step, write_atomic,
                         write_json_atomic)

METRICS = "metrics.jsonl"
# The last writer this process made of each run folder (its real path -> a weak reference: a writer's lock goes
# with it): locks are re-entrant within a process, so a second Trainer may take a folder an earlier one of the
# same process still holds; the earlier one then stops.
_LATEST = {}


class RunWriter:
    """The one writer of ``run_dir`` (holding ``lock``, a ``run_folder.RunLock``); ``writes=False``: a rank
    that does not write."""

    def __init__(self, run_dir, lock=None, writes=True):
        self.run_dir, self.lock, self.writes = run_dir, lock, writes
        self._checkpoint_selection = None       # (step, selected step) of the last checkpoint written or resumed
        self._pending_selection = None          # a resumed run's: see restore_selection
        self.logged_step = None                 # the step of metrics.jsonl's last line (a checkpoint records it)
        self._history = None                    # run_folder.History of metrics.jsonl's lines; None: read the file

    @classmethod
    def for_new_run(cls, run_dir, overwrite=False):
        """Lock ``run_dir`` (made if needed) for a new run: refused when it holds a run, unless ``overwrite``."""
        lock = run_folder.lock_for_writing(run_dir)
        try:
            run_folder.start_new_run(run_dir, overwrite)
        except BaseException:
            lock.release()
            raise
        return cls(run_dir, lock)._take()

    def _take(self):
        """This writer is the folder's from now on: an earlier one of this process stops at its next write."""
        _LATEST[os.path.realpath(self.run_dir)] = weakref.ref(self)
        return self

    @classmethod
    def for_resuming(cls, run_dir):
        """Lock an existing run folder to continue its run (``lock_for_resuming``: leftovers of writes cut short
        are deleted)."""
        return cls(run_dir, run_folder.lock_for_resuming(run_dir))

    @classmethod
    def silent(cls, run_dir):
        """A writer of ``run_dir`` whose writes do nothing: an MPI rank other than 0's, or a new run's until its
        config is valid."""
        return cls(run_dir, writes=False)

    def close(self):
        """Release the folder's lock (also done when the process ends)."""
        if self.lock is not None:
            self.lock.release()

    def check(self):
        """Stop with one line when the run folder was deleted, moved or replaced since it was locked, or when a
        later writer of this process took it (a Trainer made with overwrite or resume on the same folder), so that
        two runs never write into one folder."""
        if self.lock is not None:
            self.lock.check()
            latest = _LATEST.get(os.path.realpath(self.run_dir), lambda: None)()
            if latest is not None and latest is not self:
                raise run_folder.RunFolderBusy(
                    f"{self.run_dir} was taken by another run of this process (a Trainer made later on the same "
                    f"folder, with overwrite=True or resume=True); this one stopped without writing more: train "
                    f"with the later Trainer, or give each run its own folder")

    def start(self, config, tokenizer_state, data_files=None):
        """config.json (the resolved config), tokenizer.json (when the task has a tokenizer) and data_files.json
        (``data_files``, when given: a new run's, or a resumed run's that had none). A resumed run's
        summary.json, of its earlier end, goes: it no longer describes the weights once the run trains on (a
        crash would leave it naming a step model.safetensors no longer holds); the run's end writes its own."""
        if not self.writes:
            return
        self.check()
        remove_in_folder(self.run_dir / "summary.json")
        write_json_atomic(self.run_dir / "config.json", config)
        if tokenizer_state is not None:
            write_json_atomic(self.run_dir / "tokenizer.json", tokenizer_state)
        if data_files is not None:
            write_json_atomic(self.run_dir / DATA_FILES, data_files)

    def log(self, record):
        """Append one line to metrics.jsonl, never through a link placed there meanwhile (O_NOFOLLOW where the
        platform has it)."""
        if not self.writes:
            return
        self.check()
        path = self.run_dir / METRICS
        try:
            fd = open_in_folder(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise ValueError(f"{path} is a symbolic link; numformer writes only regular files in a run folder: "
                             f"remove the link and continue with --resume") from None
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self.logged_step = record["step"]
        if self._history is not None and not self._history.add(record):
            self._history = None                # out of order: the next checkpoint reads the file

    def truncate_metrics(self, step, keep_partial=True):
        """Drop the metrics lines logged after ``step`` (the checkpoint's): a resumed run logs them again; with
        ``keep_partial=False`` also the partial training line of ``step`` (a stop's: ``LogWindow.log_stop``), which
        the next step's lines replace. Returns ``step`` when a partial line of it is kept, else None."""
        path = self.run_dir / METRICS
        if not self.writes or not path.exists():
            return None
        self.check()
        keep = [(line, record) for line, record in run_folder.metrics_records(path) if record["step"] < step
                or (record["step"] == step and (keep_partial or record.get("partial") is not True))]
        write_atomic(path, b"".join(line + b"\n" for line, _ in keep))     # a full disk keeps the old file
        self._history = None
        self.logged_step = max((r["step"] for _, r in keep), default=None)
        return step if any(r["step"] == step and r.get("partial") is True for _, r in keep) else None

    def evaluated(self, step):
        """Whether metrics.jsonl holds the periodic evaluation of ``step`` (a line with its validation loss)."""
        path = self.run_dir / METRICS
        return path.exists() and any(r["step"] == step and any(k.startswith("val_loss") for k in r)
                                     for _, r in run_folder.metrics_records(path))

    def complete_partial(self, step):
        """Make the partial training line of ``step`` (a stop's: ``LogWindow.log_stop``) a regular one, the
        line an uninterrupted run logs there over the same steps; returns whether there was one."""
        path = self.run_dir / METRICS
        if not self.writes or not path.exists():
            return False
        self.check()
        records = run_folder.metrics_records(path)
        lines = [json.dumps({k: v for k, v in r.items() if k != "partial"}).encode()
                 if r["step"] == step and r.get("partial") is True else line for line, r in records]
        if lines == [line for line, _ in records]:
            return False
        write_atomic(path, b"".join(line + b"\n" for line in lines))
        self._history = None
        return True

    def save_checkpoint(self, model, optimizer, state, config):
        """checkpoint.safetensors: the model, the optimizer and the trainer's ``state``."""
        if self.writes:
            self.check()
            self._sync_metrics()        # the lines the checkpoint counts (``logged_step``) outlast a system crash
            if self._history is None:               # read once: then each line logged is added as it is written
                self._history = run_folder.History.of_file(self.run_dir / METRICS)
            history = self._history.digest(state["step"])
            save_checkpoint(self.run_dir / CHECKPOINT, model, optimizer, {**state, "metrics_digest": history},
                            run_folder.weights_metadata(config), config=config)
            self._checkpoint_selection = (state["step"], state["early_stopping"]["best_step"])
            remove_in_folder(self.run_dir / run_folder.KEPT_SELECTION)      # this checkpoint's is in MODEL

    def _sync_metrics(self):
        path = self.run_dir / METRICS
        if path.is_file():
            fd = open_in_folder(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))   # Windows: writable
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def check_history(self, state):
        """ValueError when the checkpoint of ``state`` is not of the run metrics.jsonl records (a checkpoint copied
        in from another run, or a metrics.jsonl of another run or from an earlier point): its run had logged lines
        up to a step (``metrics_step``) that metrics.jsonl does not reach, or other lines before the checkpoint's
        step (``metrics_digest``: ``run_folder.History``). Checkpoints that do not record them pass."""
        logged, path = state.get("metrics_step"), self.run_dir / METRICS
        if not self.writes or logged is None:
            return
        if not path.is_file():
            raise ValueError(f"checkpoint {self.run_dir / CHECKPOINT} is at step {state['step']}, but {path} is "
                             f"missing (its run logged to step {logged}): put back this run's metrics.jsonl, or "
                             f"start afresh with --overwrite")
        end = max((r["step"] for _, r in run_folder.metrics_records(path)), default=0)
        if end < logged:
            raise ValueError(f"checkpoint {self.run_dir / CHECKPOINT} is at step {state['step']}, but {path} ends "
                             f"at step {end}: they are not of one run (its metrics went to step {logged}); put "
                             f"back this run's checkpoint or metrics.jsonl, or start afresh with --overwrite")
        recorded = state.get("metrics_digest")
        if recorded is not None and recorded != run_folder.History.of_file(path).digest(state["step"]):
            raise ValueError(f"checkpoint {self.run_dir / CHECKPOINT} is at step {state['step']}, but the lines of "
                             f"{path} before that step are not the ones its run logged: they are not of one run (a "
                             f"checkpoint or metrics.jsonl of another run, or lines edited by hand); put back this "
                             f"run's checkpoint or metrics.jsonl, or start afresh with --overwrite")

    def check_kept_weights(self):
        """ValueError when model.safetensors, the weights the run kept so far, is damaged: found before a resumed
        run trains (the final phase reads them; a damage found there came after the run had trained on, with its
        summary.json already replaced)."""
        path = self.run_dir / MODEL
        if self.writes and path.is_file():
            try:
                verify_file(path, "model file")
            except ValueError as e:
                raise ValueError(f"{e} (found before resuming: nothing was changed)") from None

    def save_weights(self, model, config, **figures):
        """model.safetensors: the weights to use, with their ``figures`` (step, loss) in the metadata.

        When it holds the selection the last checkpoint records, and that checkpoint's own weights are not it (a
        step selected before the checkpoint's), it is first copied aside (KEPT_SELECTION) until the next
        checkpoint: a run killed before then and resumed from that checkpoint finds the weights it selected
        (``restore_selection``), even if it then trains differently. A copy, not a rename, so that
        model.safetensors exists at every instant: a kill leaves the old file or the new one."""
        if self.writes:
            self.check()
            step, selected = self._checkpoint_selection or (None, None)
            if selected is not None and selected != step and weights_step(self.run_dir / MODEL) == selected:
                copy_in_folder(self.run_dir / MODEL, self.run_dir / run_folder.KEPT_SELECTION)
            save_model(self.run_dir / MODEL, model, {**figures, **run_folder.weights_metadata(config)})

    def resumed_from(self, state, selected_on):
        """The run resumes from the checkpoint of ``state``, whose periodic evaluations select on ``selected_on``
        (val_loss or val_loss_estimate): see ``restore_selection``. The checkpoint must be of the run metrics.jsonl
        records (``check_history``)."""
        self.check_history(state)
        self.check_kept_weights()
        self._take()
        self._checkpoint_selection = (state["step"], state["early_stopping"]["best_step"])
        self._pending_selection = {selected_on: state["early_stopping"]["best"]}

    def restore_selection(self, model, config):
        """Before a resumed run trains on (``model`` holding its checkpoint's weights): make model.safetensors hold
        the step that checkpoint selected, when a run killed after it saved a later selection there. The
        checkpoint's own weights when it selected its own step, else the weights copied aside for it
        (KEPT_SELECTION). Once per resume: a run with nothing more to do never gets here."""
        figure, self._pending_selection = self._pending_selection, None
        step, selected = self._checkpoint_selection or (None, None)
        kept = self.run_dir / run_folder.KEPT_SELECTION
        if not self.writes or figure is None or selected is None or weights_step(self.run_dir / MODEL) == selected:
            return
        if selected == step:
            self.save_weights(model, config, step=step, **figure)
        elif weights_step(kept) == selected:
            self.check()
            replace_in_folder(kept, self.run_dir / MODEL)

    def save_summary(self, summary):
        """summary.json: the ``summary`` dict of a train() call."""
        if self.writes:
            self.check()
            write_json_atomic(self.run_dir / "summary.json", summary)

    def saved_files(self, weights):
        """The run files the folder holds now, each with what it is for (a run stopped before its first step
        has no metrics.jsonl): 'model.safetensors (best weights), checkpoint.safetensors (...), ...'."""
        files = {MODEL: f"{MODEL} ({weights} weights)", CHECKPOINT: f"{CHECKPOINT} (continue with --resume)",
                 METRICS: METRICS, "config.json": "config.json"}
        return ", ".join(text for name, text in files.items() if (self.run_dir / name).is_file())
