"""The run folder: which files make a run, a lock so that one command writes it at a time, and overwrites
that never pair one run's config with another run's weights.

Locking: a command that writes a run folder holds an exclusive lock on the folder
(``_platform``: ``flock`` on POSIX, ``msvcrt`` on Windows) for as long as it works (``train``); commands that read it
(``eval``, ``generate``, ``analyze`` ...) hold a shared one. A second writer,
or a reader while a writer works, gets one error naming the folder and the
process that holds it. Locks are per process and re-entrant: the same process
may lock a folder again (a Trainer made while another of the same process
holds it), and the lock goes when the last holder releases it or the process
ends (a killed process leaves no stale lock behind).

Overwriting: ``start_new_run(path, overwrite=True)`` deletes the old run's
files, weights first and config last, before the new run writes anything, so
at every instant the folder holds the old run, part of the old run without its
weights, nothing, or the new run; never a mix of the two.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import _platform
from .checkpoint import CHECKPOINT, MODEL

# Every file of a run, in the order an overwrite deletes them: the weights first, the config last.
RUN_FILES = (CHECKPOINT, MODEL, "summary.json", "metrics.jsonl", "tokenizer.json", "config.json")

_HELD: dict[str, list] = {}       # real path -> [fd, exclusive, count] for the folders this process holds


def _forget_locks_in_child():
    """A forked child (a data-parallel worker) drops its copies of the lock descriptors without unlocking: the
    lock stays with the parent and goes when the parent ends, even if the parent is killed first."""
    for fd, _, _ in _HELD.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):          # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_forget_locks_in_child)


class RunFolderBusy(ValueError):
    """Another process holds the run folder."""


class RunLock:
    """An ``flock`` on a run folder, exclusive (writing) or shared (reading); a context manager.

    ``RunLock(path, exclusive=True)`` raises RunFolderBusy at once when another
    process holds a conflicting lock (it never waits).
    """

    def __init__(self, path, exclusive=True, what="write"):
        self.path = Path(path)
        self.key = os.path.realpath(self.path)
        self.exclusive = exclusive
        held = _HELD.get(self.key)
        if held is not None:                      # this process holds it already
            if exclusive and not held[1]:
                _flock(held[0], True, self.path, what)
                held[1] = True
            held[2] += 1
        else:
            fd = _platform.open_lock(self.path)
            try:
                _flock(fd, exclusive, self.path, what)
            except BaseException:
                _platform.close_lock(fd)
                raise
            _HELD[self.key] = [fd, exclusive, 1]
        self._released = False

    def release(self):
        if self._released:
            return
        self._released = True
        held = _HELD.get(self.key)
        if held is None:
            return
        held[2] -= 1
        if held[2] == 0:
            del _HELD[self.key]
            try:
                _platform.unlock(held[0])
            finally:
                _platform.close_lock(held[0])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:     # interpreter shutdown
            pass


def _flock(fd, exclusive, path, what):
    if not _platform.try_lock(fd, exclusive):
        raise RunFolderBusy(f"{path} is in use by another process ({_holder(fd)}); cannot {what} it until that "
                            f"process ends") from None


def _holder(fd):
    """'pid N: its command line' of a process holding an flock on fd's file (Linux /proc), else a plain word."""
    try:
        st = os.fstat(fd)
        dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if "FLOCK" in fields and fields[-3] == dev:
                    pid = int(fields[-4])
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    except OSError:
                        cmd = ""
                    return f"pid {pid}" + (f": {_short(cmd)}" if cmd else "")
    except (OSError, ValueError, IndexError, AttributeError):     # AttributeError: no os.major (Windows)
        pass
    return "another numformer command"


def _short(cmd, limit=120):
    return cmd if len(cmd) <= limit else cmd[:limit - 3] + "..."


def run_files(path):
    """The run files present in ``path`` (in RUN_FILES order)."""
    path = Path(path)
    return [name for name in RUN_FILES if (path / name).exists()]


def check_out_folder(path):
    """A folder a run can be written to: an error naming the problem when ``path`` is a file or under one."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise ValueError(f"--out {path}: {p} is a file, not a folder; choose another --out")
        if p.exists():
            break


def lock_for_writing(path):
    """Create ``path`` (and its parents) if needed and lock it exclusively; returns the RunLock."""
    path = Path(path)
    check_out_folder(path)
    path.mkdir(parents=True, exist_ok=True)
    return RunLock(path, exclusive=True, what="train into")


def lock_for_resuming(path):
    """Lock an existing run folder exclusively, to continue its run; returns the RunLock."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"cannot resume: {path / 'config.json'} does not exist ({path} is "
                         + ("a file, not a run folder)" if path.exists() else "no run folder)"))
    return RunLock(path, exclusive=True, what="resume")


def schedule_change(saved, train):
    """One line when a resumed run's new [train] values change its learning-rate schedule, else None."""
    keys = ("max_steps", "decay_steps") if train["schedule"] in ("linear", "cosine") else ()
    keys += ("schedule", "lr", "warmup_steps", "min_lr")
    changed = [k for k in keys if saved.get(k) != train[k] and not (k == "max_steps" and train["decay_steps"])]
    if not changed:
        return None
    return ("note: " + ", ".join(f"{k} {saved.get(k)} -> {train[k]}" for k in changed)
            + " changes the learning-rate schedule of the resumed run from this step on")


def start_new_run(path, overwrite=False):
    """Make ``path`` ready for a new run (the caller holds its lock): refuse a folder that holds any run file
    unless ``overwrite``, which deletes the old run's files (weights first, config last, leftovers of an
    interrupted write too)."""
    path = Path(path)
    present = run_files(path)
    if present and not overwrite:
        raise ValueError(f"{path} already holds a run; continue it with --resume, or start afresh with "
                         f"--overwrite (it has {', '.join(present)})")
    for name in present:
        (path / name).unlink(missing_ok=True)
    for tmp in path.glob(".*.tmp"):           # a write cut short (write_atomic's temporary files)
        if any(tmp.name.startswith(f".{name}.") for name in RUN_FILES):
            tmp.unlink(missing_ok=True)


def weights_metadata(config):
    """Metadata saved with a run's weights: the model section they were trained with (``check_weights``
    compares it with config.json when the weights are loaded)."""
    return {"model_config": json.dumps(config["model"], sort_keys=True), "dtype": config["train"]["dtype"]}


def check_weights(path, meta, config):
    """Weights saved with ``weights_metadata`` must match the run's config.json (an edited n_heads keeps every
    shape but changes the model)."""
    saved = meta.get("model_config")
    if saved is None:
        return
    saved = json.loads(saved)
    changed = sorted(k for k in set(saved) | set(config["model"]) if saved.get(k) != config["model"].get(k))
    if changed:
        diffs = ", ".join(f"{k} {saved.get(k)!r} -> {config['model'].get(k)!r}" for k in changed)
        raise ValueError(f"{path} was trained with another [model] config than config.json ({diffs}); "
                         f"restore config.json or retrain")
    if meta.get("dtype") not in (None, config["train"]["dtype"]):
        raise ValueError(f"{path} was trained in {meta['dtype']}, but config.json says dtype = "
                         f"{config['train']['dtype']!r}; restore config.json")
