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

from . import run_folder
from ..run_files import CHECKPOINT, MODEL, open_in_folder, save_checkpoint, save_model, write_atomic, write_json_atomic

METRICS = "metrics.jsonl"


class RunWriter:
    """The one writer of ``run_dir`` (holding ``lock``, a ``run_folder.RunLock``); ``writes=False``: a rank
    that does not write."""

    def __init__(self, run_dir, lock=None, writes=True):
        self.run_dir, self.lock, self.writes = run_dir, lock, writes

    @classmethod
    def for_new_run(cls, run_dir, overwrite=False):
        """Lock ``run_dir`` (made if needed) for a new run: refused when it holds a run, unless ``overwrite``."""
        lock = run_folder.lock_for_writing(run_dir)
        try:
            run_folder.start_new_run(run_dir, overwrite)
        except BaseException:
            lock.release()
            raise
        return cls(run_dir, lock)

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
        """Stop with one line when the run folder was deleted, moved or replaced since it was locked."""
        if self.lock is not None:
            self.lock.check()

    def start(self, config, tokenizer_state):
        """config.json (the resolved config) and tokenizer.json (when the task has a tokenizer)."""
        if not self.writes:
            return
        self.check()
        write_json_atomic(self.run_dir / "config.json", config)
        if tokenizer_state is not None:
            write_json_atomic(self.run_dir / "tokenizer.json", tokenizer_state)

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
        return step if any(r["step"] == step and r.get("partial") is True for _, r in keep) else None

    def save_checkpoint(self, model, optimizer, state, config):
        """checkpoint.safetensors: the model, the optimizer and the trainer's ``state``."""
        if self.writes:
            self.check()
            save_checkpoint(self.run_dir / CHECKPOINT, model, optimizer, state, run_folder.weights_metadata(config))

    def save_weights(self, model, config, **figures):
        """model.safetensors: the weights to use, with their ``figures`` (step, loss) in the metadata."""
        if self.writes:
            self.check()
            save_model(self.run_dir / MODEL, model, {**figures, **run_folder.weights_metadata(config)})

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
