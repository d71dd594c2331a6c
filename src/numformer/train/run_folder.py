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

Identity: the lock is taken on the folder that exists when the command starts; its identity (``st_dev``,
``st_ino``) is recorded, and a writer checks it before each write (``RunLock.check``): a folder deleted or
replaced meanwhile (``rm -rf RUN``, perhaps followed by another command making a new RUN; ``mv RUN RUN2``; a
link to another run put at RUN) stops the writer with one line saying what became of the folder (deleted, or
where it is now, to resume there), and the writer never recreates it. Every file is written through the
descriptor of the folder that was locked (``run_files.LOCKED_FOLDERS``), never by resolving the path again, so
even a swap between the check and the write cannot put this run's file into another folder.

Leftovers: a process killed while writing leaves ``write_atomic``'s temporary file (``.NAME.PID.RANDOM.tmp``);
``--resume`` and a new run delete those of the run files, while holding the exclusive lock.

Links: the files numformer writes in a run folder are regular files it created. A symbolic link among them
(even a dangling one) is refused before anything is written, so that no write can land outside the folder.

Overwriting: ``start_new_run(path, overwrite=True)`` deletes the old run's
files, weights first and config last, before the new run writes anything, so
at every instant the folder holds the old run, part of the old run without its
weights, nothing, or the new run; never a mix of the two.
"""
from __future__ import annotations

import collections
import errno
import hashlib
import json
import os
from pathlib import Path

from .._limits import bounded_json
from .. import _platform
from .._results import remove_report
from ..run_files import (CHECKPOINT, DATA_FILES, LOCKED_FOLDERS, MODEL, RUN_ONLY_FILES, read_in_folder,
                         remove_in_folder, remove_temp_files)

# Every file of a run, in the order an overwrite deletes them: the weights first, the config last.
REFERENCE = "reference_logps.safetensors"     # a DPO run's reference log-probabilities, computed once
# model.safetensors of the selection the last checkpoint records, copied aside when a later selection replaced it
# (train/run_writer.py: a resume from that checkpoint puts it back); removed by the next checkpoint
KEPT_SELECTION = ".checkpoint-selection.safetensors"
RUN_FILES = (CHECKPOINT, MODEL, KEPT_SELECTION, REFERENCE, "summary.json", "metrics.jsonl", "tokenizer.json",
             DATA_FILES, "config.json")

# real path -> [fd, exclusive, count, identity, spellings] for the folders this process holds (spellings: the
# absolute paths, unresolved, it was locked by, one per holder; each is a key of LOCKED_FOLDERS)
_HELD: dict[str, list] = {}


def _forget_locks_in_child():
    """A forked child (a data-parallel worker) drops its copies of the lock descriptors without unlocking: the
    lock stays with the parent and goes when the parent ends, even if the parent is killed first."""
    LOCKED_FOLDERS.clear()
    for fd, *_ in _HELD.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):          # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_forget_locks_in_child)


class RunFolderBusy(ValueError):
    """Another process holds the run folder."""


class RunFolderGone(ValueError):
    """The locked run folder was deleted or replaced by another folder of the same name."""


def folder_identity(path):
    """(st_dev, st_ino) of a folder: the same folder keeps it, a folder made anew under the same name gets
    another (both fields exist on Linux, macOS and Windows); None when ``path`` does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _lock_folder(path, exclusive):
    """Open ``path``'s lock (``numformer._platform``: flock on POSIX, byte ranges of a lock file on Windows) and
    take it exclusively or shared without waiting; returns the descriptor, or raises BlockingIOError when
    another process holds a conflicting lock."""
    fd = _platform.open_lock(path)
    try:
        _relock_folder(fd, exclusive)
    except BaseException:
        _platform.close_lock(fd)
        raise
    return fd


def _relock_folder(fd, exclusive):
    """Change the lock held on ``fd`` (shared -> exclusive) without waiting; BlockingIOError if refused."""
    if not _platform.try_lock(fd, exclusive):
        raise BlockingIOError(errno.EAGAIN, "the folder is locked by another process")


def _unlock_folder(fd):
    """Release the lock on ``fd`` and close it."""
    try:
        _platform.unlock(fd)
    finally:
        _platform.close_lock(fd)


class RunLock:
    """The lock on a run folder (``numformer._platform``: flock on POSIX, msvcrt on Windows), exclusive (writing)
    or shared (reading); a context manager.

    ``RunLock(path, exclusive=True, what="write")`` raises RunFolderBusy at once when another process holds a
    conflicting lock (it never waits; ``what``: the verb its message uses, e.g. "train into"), and RunFolderGone
    when this process holds ``path`` but the folder there was deleted or replaced since.
    """

    def __init__(self, path, exclusive=True, what="write"):
        self.path = Path(path)
        self.key = os.path.realpath(self.path)
        self.spelling = os.path.abspath(self.path)      # the LOCKED_FOLDERS key: the path as given, not resolved
        self.exclusive = exclusive
        self._released = True
        held = _HELD.get(self.key)
        if held is not None:                      # this process holds it already
            if folder_identity(self.path) != held[3]:
                raise RunFolderGone(f"{self.path} was deleted or replaced while this process held it; "
                                    f"run the command again in a new process")
            if exclusive and not held[1]:
                _busy_if_blocked(lambda: _relock_folder(held[0], True), self.path, what)
                held[1] = True
            held[2] += 1
        else:
            fd = _busy_if_blocked(lambda: _lock_folder(self.path, exclusive), self.path, what)
            _HELD[self.key] = [fd, exclusive, 1, folder_identity(self.path), []]
        fd, *_, spellings = _HELD[self.key]
        if _platform.lock_target(self.path) == os.fspath(self.path):     # the descriptor is the folder's
            spellings.append(self.spelling)
            LOCKED_FOLDERS[self.spelling] = fd
        self.identity = _HELD[self.key][3]
        self._released = False

    def check(self):
        """Raise RunFolderGone unless ``path`` is still the folder this lock holds (called before each write):
        the line says what became of it (deleted, moved to where, replaced by another folder or a link)."""
        now = folder_identity(self.path)
        if now == self.identity:
            return
        if now is None:
            what = "deleted" if self._where() == "" else "moved or renamed"
        elif self.path.is_symlink():
            what = f"replaced by a link (to {os.readlink(self.path)})"
        else:
            what = "replaced by another folder"
        raise RunFolderGone(f"{self.path} was {what} while this command was writing it; stopped without writing "
                            f"more (nothing is recreated at {self.path}). {self._what_became_of_the_files()}")

    def _where(self):
        """Where the locked folder is now (``_platform.locked_folder_now``): a path, "" (deleted) or None."""
        held = _HELD.get(self.key)
        return None if held is None else _platform.locked_folder_now(held[0])

    def _what_became_of_the_files(self):
        where = self._where()
        if where == "":
            return "The files it held are gone."
        if where is None:
            return ("Its files are wherever the folder was moved, if it was: continue there with "
                    "`numformer train --resume --out FOLDER`.")
        return (f"Every file it held is now in {where} (the folder was moved there): continue there with "
                f"`numformer train --resume --out {where}`.")

    def release(self):
        if self._released:
            return
        self._released = True
        held = _HELD.get(self.key)
        if held is None:
            return
        held[2] -= 1
        if self.spelling in held[4]:
            held[4].remove(self.spelling)
            if self.spelling not in held[4]:
                LOCKED_FOLDERS.pop(self.spelling, None)
        if held[2] == 0:
            del _HELD[self.key]
            for spelling in held[4]:
                LOCKED_FOLDERS.pop(spelling, None)
            _unlock_folder(held[0])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:     # interpreter shutdown
            pass


def _busy_if_blocked(lock, path, what):
    """Run ``lock()``; a lock held by another process becomes RunFolderBusy naming that process."""
    try:
        return lock()
    except BlockingIOError:
        raise RunFolderBusy(f"{path} is in use by another process ({_holder(path)}); cannot {what} it until that "
                            f"process ends") from None


def _holder(path):
    """'pid N: its command line' of a process holding an flock on the folder (Linux /proc), else a plain word."""
    try:
        st = os.stat(path)
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
    """The run files present in ``path`` (in RUN_FILES order); a link counts, even a dangling one."""
    path = Path(path)
    return [name for name in RUN_FILES if os.path.lexists(path / name)]


def refuse_links(path):
    """ValueError naming the first run file of ``path`` that is not a regular file (a symbolic link, dangling
    or not, or a folder): numformer writes only regular files it created, never through a link."""
    path = Path(path)
    for name in RUN_FILES:
        f = path / name
        if f.is_symlink():
            raise ValueError(f"{f} is a symbolic link (to {os.readlink(f)}); numformer writes only regular files "
                             f"in a run folder: remove the link, or choose another --out")
        if f.exists() and not f.is_file():
            raise ValueError(f"{f} is not a regular file; remove it, or choose another --out")


def holds_run(path):
    """Whether ``path`` holds a numformer run (not merely a Hugging Face folder written by ``export``): a file
    only a run writes (``RUN_ONLY_FILES``: a checkpoint, metrics, summary ...), or a config.json that is not a
    Hugging Face config (one with model_type)."""
    path = Path(path)
    if any(os.path.lexists(path / name) for name in RUN_ONLY_FILES):
        return True
    config = path / "config.json"
    if not os.path.lexists(config):
        return False
    try:
        if config.stat().st_size > 1 << 20:
            return True
        return "model_type" not in json.loads(config.read_bytes())
    except (OSError, ValueError, TypeError, RecursionError):
        return True           # unreadable: it is not one of export's folders, so it may be a damaged run


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
    return _exclusive_lock(path, "train into")


def lock_for_resuming(path):
    """Lock an existing run folder exclusively, to continue its run, and delete the temporary files of writes
    cut short there (a process killed while writing a checkpoint); returns the RunLock."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"cannot resume: {path / 'config.json'} does not exist ({path} is "
                         + ("a file, not a run folder)" if path.exists() else "no run folder)"))
    lock = _exclusive_lock(path, "resume")
    remove_temp_files(path, RUN_FILES)
    return lock


def _exclusive_lock(path, what):
    """The writer's lock on ``path``, taken only if no file numformer writes there is a link."""
    lock = RunLock(path, exclusive=True, what=what)
    try:
        refuse_links(path)
    except BaseException:
        lock.release()
        raise
    return lock


def metrics_records(path):
    """(line, record) for each line of a metrics.jsonl file, in order.

    Blank lines are skipped; a last line cut short (no newline after it: a run being written, or a crash) is
    dropped; any other line that is not a JSON object with an integer ``step``, a complete last line too,
    raises one ValueError naming the file and line."""
    path = Path(path)
    data = read_in_folder(path)             # a writer's own file, whatever was put at its path
    lines, cut_short = data.splitlines(), not data.endswith(b"\n")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = bounded_json(line, f"metrics file {path}, line {n},")
        except ValueError:
            if n == len(lines) and cut_short:
                break
            raise
        if not (isinstance(record, dict) and type(record.get("step")) is int):
            raise ValueError(f"metrics file {path}, line {n}: expected a JSON object with an integer step; "
                             f"remove the line (or restore the file)")
        records.append((line, record))
    return records


class History:
    """The SHA-256 of the regular lines of a metrics file before a step, each as its record with sorted keys:
    what a checkpoint of that step records of the run it belongs to (``RunWriter.check_history``). Those lines
    never change once the checkpoint is written (a resume rewrites or drops only lines of its step and after, and
    partial lines, which are left out); their timings differ from any other run's.

    Fed the records as they are logged (``add``, in the order of their steps), it hashes each line once:
    ``digest(step)`` folds in the lines before ``step`` and keeps the rest for later."""

    def __init__(self, records=()):
        self._hash, self._before, self._pending = hashlib.sha256(), 0, collections.deque()
        for record in records:
            self.add(record)

    @classmethod
    def of_file(cls, path):
        """The History of metrics file ``path`` read whole (no file: no lines)."""
        try:
            return cls(record for _, record in metrics_records(path))
        except FileNotFoundError:
            return cls()

    def add(self, record):
        """A line logged after those given so far; False (and nothing added) when its step comes before the last
        digest's, which has no place for it."""
        if record["step"] < self._before:
            return False
        if record.get("partial") is not True:
            self._pending.append((record["step"], json.dumps(record, sort_keys=True).encode() + b"\n"))
        return True

    def digest(self, step):
        """The hex SHA-256 of the regular lines before ``step`` (at least the step of the last digest)."""
        self._before = max(self._before, step)
        while self._pending and self._pending[0][0] < step:
            self._hash.update(self._pending.popleft()[1])
        return self._hash.hexdigest()


def start_new_run(path, overwrite=False, resumable=True):
    """Make ``path`` ready for a new run (the caller holds its lock): refuse a folder that holds any run file
    unless ``overwrite``, which deletes the old run's files (weights first, config last, leftovers of an
    interrupted write too) and analyze's default report of it (RUN/report); ``resumable``: whether the refusal
    may suggest --resume (not import-hf's). A DPO run's reference log-probabilities alone are no run (one
    stopped before it began: its config.json comes with the first step) and are replaced: the new run
    computes its own."""
    path = Path(path)
    present = run_files(path)
    holds_a_run = bool(present) and present != [REFERENCE]
    if holds_a_run and not overwrite:
        if not resumable:
            how = "replace it with --overwrite, or choose another --out"
        elif CHECKPOINT in present:
            how = "continue it with --resume, or start afresh with --overwrite"
        else:               # --resume needs the checkpoint: offer only what works
            how = ("it wrote no checkpoint, so --resume cannot continue it: start afresh with --overwrite, or "
                   "choose another --out")
        raise ValueError(f"{path} already holds a run; {how} (it has {', '.join(present)})")
    for name in present:
        remove_in_folder(path / name)
    remove_temp_files(path, RUN_FILES)          # writes cut short (write_atomic's temporary files)
    if holds_a_run:                             # analyze's default report describes the run just deleted
        remove_report(path / "report")


def weights_metadata(config):
    """Metadata saved with a run's weights: the model section they were trained with
    (``interop.sources.check_weights`` compares it with config.json when the weights are loaded)."""
    return {"model_config": json.dumps(config["model"], sort_keys=True), "dtype": config["train"]["dtype"]}
