"""The data a run was made from: the files its task read, their size and SHA-256, and whether they still hold that.

A run folder's ``data_files.json`` (``fingerprint``'s document) records the files the run's task read when it
was built: a corpus, a dataset's tarball or extracted folder, a user task's own files. ``--resume``,
``numformer eval`` and everything else that builds the run's task again (``train.run``) compare the data they
read with it (``changes``), so that a file edited, replaced or removed since the run began is one line naming
it, where it would have been a resumed run trained on two datasets, or figures reported for other data than the
run's.

Which files: every regular file opened for reading while the task is built (``reading``: Python's audit event
"open", so numformer's loaders and a user task's own code alike), and the files a loader names without opening
them then (``note``: the corpus behind a cached tokenization, a token file read window by window during
training). Left out: Python's own files (modules, the interpreter's and the installed packages' folders), the
system's (/proc, /sys, /dev, /etc), the folders the caller excludes (the run folder; numformer's token
cache, made from files that are recorded), and what is read inside ``not_data`` (a fine-tuning source: the model
the run starts from, not its data).

How they are compared: before the task is built again, every recorded file still at its path must have the
same size and SHA-256 (``changed_in_place``: a changed corpus is named before the task trips over it, say on
characters its vocabulary lacks). One that is gone from its path is accepted when the task, once built, read a
file of the same content from another place (``changes``: the data moved, ``NUMFORMER_DATA`` points at another
copy).
A folder from which the task read every file, and at least ``FOLDER_FILES`` of them (an extracted dataset of
thousands of files), is one entry: its number of files, their bytes, and a SHA-256 of their names and digests.

Files joined into one text in an order (a corpus folder's files, in name order: ``note_sequence``) are also
one ``sequences`` entry: their number, bytes and a SHA-256 of their digests in that order. A file renamed so that
the files are joined in another order, or a copy of a file added, changes the text and its train/validation split
while every file's content is still one the run read: ``reordered`` names it. A data_files.json written before
sequences were recorded has none, and is checked as before.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import sysconfig
import threading
from pathlib import Path

VERSION = 1
FOLDER_FILES = 32                # a folder read whole with at least this many files is recorded as one entry
SKIPPED_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".so", ".pth")
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev", "/etc")

_lock = threading.Lock()
_recordings = []                 # the ``Recording`` s of the ``reading`` blocks open now (any thread)
_hook_installed = False
_not_data = 0                    # the ``not_data`` blocks open now (any thread)
_digests = {}                    # (path, device, inode, size, mtime, ctime) -> SHA-256: a file is hashed once


class Recording(set):
    """The paths of a ``reading`` block, and ``sequences``: the lists of files ``note_sequence`` d in it, in
    their order."""

    def __init__(self):
        super().__init__()
        self.sequences = []


def _on_audit(event, args):
    """Python's audit hook: a file opened for reading goes into every open recording. Never raises (an
    exception here would fail the open)."""
    if event != "open" or not _recordings:
        return
    try:
        path, mode, flags = args
        if isinstance(path, int):                                   # a descriptor, not a file name
            return
        writes = any(c in mode for c in "wax+") if mode is not None else (flags or 0) & 3 != os.O_RDONLY
        if not writes:
            note(path)
    except Exception:       # noqa: BLE001 - an audit hook must not break the call it watches
        pass


@contextlib.contextmanager
def reading():
    """The files opened for reading inside the ``with`` (any thread) and those ``note``d: a ``Recording`` (a set
    of the paths as given, filled in as they come, and the ``note_sequence`` d lists)."""
    global _hook_installed
    paths = Recording()
    with _lock:
        if not _hook_installed:         # once per process: an audit hook cannot be removed
            sys.addaudithook(_on_audit)
            _hook_installed = True
        _recordings.append(paths)
    try:
        yield paths
    finally:
        with _lock:
            _recordings[:] = [p for p in _recordings if p is not paths]


@contextlib.contextmanager
def not_data():
    """Inside the ``with``, files read are not counted as data, in any thread (a hub download reads in worker
    threads): a fine-tuning source's config, tokenizer and weights are the model the run starts from, not the
    data it trains on, and may change (a source run trained on) without the run's data changing."""
    global _not_data
    with _lock:
        _not_data += 1
    try:
        yield
    finally:
        with _lock:
            _not_data -= 1


def note(path):
    """Count ``path`` among the files of the ``reading`` blocks open now (a file a loader relies on without
    opening it then); nothing outside one, nor inside a ``not_data`` block."""
    if _recordings and not _not_data:
        with _lock:
            for paths in _recordings:
                paths.add(path)


def note_sequence(paths):
    """Count the files ``paths`` among the files read (``note``) and as one sequence: files joined into one text
    in this order (a corpus), whose order is part of the data."""
    paths = [str(p) for p in paths]
    for path in paths:
        note(path)
    if _recordings and not _not_data:
        with _lock:
            for recording in _recordings:
                if isinstance(recording, Recording):
                    recording.sequences.append(paths)


def _python_folders():
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths = sysconfig.get_paths()
    folders.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)
    return [Path(f).resolve() for f in folders if f]


def _data_in_order(paths, excluded=()):
    """The regular files among ``paths`` that are data (see the module docstring), resolved, in their order."""
    skipped = [*_python_folders(), *(Path(f) for f in SYSTEM_FOLDERS), *(Path(f).resolve() for f in excluded)]
    found = []
    for raw in paths:
        try:
            path = Path(os.fsdecode(raw)).resolve()
            if not path.is_file():
                continue            # gone since (a download's temporary file), or not a regular file
        except (OSError, TypeError, ValueError):
            continue
        if path.suffix in SKIPPED_SUFFIXES or any(path.is_relative_to(folder) for folder in skipped):
            continue
        found.append(path)
    return found


def data_paths(paths, excluded=()):
    """The regular files among ``paths`` that are data (see the module docstring), resolved, sorted."""
    return sorted(set(_data_in_order(paths, excluded)))


def digest(path) -> str:
    """The SHA-256 of a file's content (hex). Hashed once per process while the file's inode, size, modification
    and change times stay the same (a file replaced or edited, even keeping its size and modification time with
    ``cp -p``, gets a new change time, so is hashed again)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _digests:
        with open(path, "rb") as f:
            _digests[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _digests[key]


def file_entry(path):
    """{"path", "bytes", "sha256"} of a file; None when it is not there."""
    try:
        return {"path": str(path), "bytes": os.path.getsize(path), "sha256": digest(path)}
    except FileNotFoundError:
        return None


def _file_names(folder):
    """The names of the regular files directly in ``folder``, sorted (OSError when it cannot be listed)."""
    return sorted(e.name for e in os.scandir(folder) if e.is_file())


def folder_entry(folder, names=None):
    """{"path", "files", "bytes", "sha256"} of every regular file directly in ``folder`` (the digest of their
    names, sizes and digests; ``names``: the folder's ``_file_names`` when already listed); None when it is not
    a folder."""
    if names is None:
        try:
            names = _file_names(folder)
        except (FileNotFoundError, NotADirectoryError):
            return None
    summary, total, files = hashlib.sha256(), 0, 0
    for name in names:
        entry = file_entry(Path(folder) / name)
        if entry is None:                       # removed since the listing
            continue
        total, files = total + entry["bytes"], files + 1
        summary.update(f"{name}\0{entry['bytes']}\0{entry['sha256']}\n".encode("utf-8", "surrogateescape"))
    return {"path": str(folder), "files": files, "bytes": total, "sha256": summary.hexdigest()}


def sequence_entry(paths, excluded=()):
    """{"path", "files", "bytes", "sha256"} of files joined in the order of ``paths`` (those that are data): their
    common folder, number, bytes and the SHA-256 of their digests and sizes in that order (not their names: the
    same text read from another place is the same data); None when none of them is data."""
    summary, total, files = hashlib.sha256(), 0, []
    for path in _data_in_order(paths, excluded):
        entry = file_entry(path)
        if entry is None:
            continue
        total, files = total + entry["bytes"], files + [path]
        summary.update(f"{entry['sha256']}\0{entry['bytes']}\n".encode())
    if not files:
        return None
    return {"path": os.path.commonpath([str(p.parent) for p in files]), "files": len(files), "bytes": total,
            "sha256": summary.hexdigest()}


def sequences(recording, excluded=()):
    """The ``sequence_entry`` s of the sequences of ``recording`` (a ``reading``'s ``Recording``; none for a
    plain set of paths)."""
    entries = (sequence_entry(s, excluded) for s in getattr(recording, "sequences", ()))
    return [e for e in entries if e is not None]


def fingerprint(paths, excluded=()):
    """The document of data_files.json for the files ``paths`` (``reading``'s ``Recording``): {"version", "files":
    [file_entry ...], "folders": [folder_entry ...], "sequences": [sequence_entry ...]}; ``excluded``: folders
    whose files are left out."""
    by_folder = {}
    for path in data_paths(paths, excluded):
        by_folder.setdefault(path.parent, []).append(path)
    files, folders = [], []
    for folder, members in sorted(by_folder.items()):
        try:
            names = _file_names(folder) if len(members) >= FOLDER_FILES else None
        except OSError:
            names = None
        if names is not None and set(names) == {p.name for p in members}:      # the whole folder was read
            folders.append(folder_entry(folder, names))
        else:
            files += [e for e in map(file_entry, members) if e is not None]
    return {"version": VERSION, "files": files, "folders": [f for f in folders if f is not None],
            "sequences": sequences(paths, excluded)}


def check_document(doc, source):
    """``doc`` (data_files.json as read) if it has the shape ``fingerprint`` writes, else a ValueError naming
    ``source``."""
    def entries_ok(entries, keys):
        return isinstance(entries, list) and all(
            isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("sha256"), str)
            and all(type(e.get(k)) is int for k in keys) for e in entries)
    if not (isinstance(doc, dict) and doc.get("version") == VERSION and entries_ok(doc.get("files"), ("bytes",))
            and entries_ok(doc.get("folders"), ("files", "bytes"))
            and entries_ok(doc.get("sequences", []), ("files", "bytes"))):
        raise ValueError(f"{source} is damaged (expected {{\"version\": {VERSION}, \"files\": [...], \"folders\": "
                         f"[...]}} as numformer writes it); restore it from a copy of the run folder, or delete it "
                         f"to accept the data as they are now")
    return doc


def _what(entry):
    if "files" in entry:
        files = "1 file" if entry["files"] == 1 else f"{entry['files']:,} files"
        return f"{files}, {entry['bytes']:,} bytes, SHA-256 {entry['sha256'][:12]}"
    return f"{entry['bytes']:,} bytes, SHA-256 {entry['sha256'][:12]}"


def _kinds(doc):
    return (("file", doc["files"], file_entry), ("folder", doc["folders"], folder_entry))


def _changed(kind, old, current):
    if current is None:
        return f"data {kind} {old['path']} is gone (the run read {_what(old)})"
    if (current["sha256"], current["bytes"]) != (old["sha256"], old["bytes"]):
        return f"data {kind} {old['path']} has changed since the run read it (then {_what(old)}; now {_what(current)})"
    return None


def changed_in_place(recorded):
    """(one line per recorded file or folder whose path holds other data now, the document of those no longer
    there): what can be told before the task is built again (``changes`` tells the rest after)."""
    lines, gone = [], {"version": VERSION, "files": [], "folders": []}
    for kind, entries, measure in _kinds(recorded):
        for old in entries:
            current = measure(old["path"])
            if current is None:
                gone[kind + "s"].append(old)
            elif (line := _changed(kind, old, current)) is not None:
                lines.append(line)
    return lines, gone


def changes(recorded, now):
    """One line per recorded file or folder whose data differ now ([] when none): ``recorded`` and ``now``
    are ``fingerprint`` documents, of the run's start and of the files read again. A recorded path not read again
    counts as it is now on disk, or, when gone, as the same data if a file of its content was read elsewhere."""
    now_entries = {e["path"]: e for e in now["files"] + now["folders"]}
    now_contents = {(e["sha256"], e["bytes"]) for e in now_entries.values()}
    lines = []
    for kind, entries, measure in _kinds(recorded):
        for old in entries:
            current = now_entries.get(old["path"])
            if current is None:
                if (old["sha256"], old["bytes"]) in now_contents:
                    continue            # the same data, read from another place
                current = measure(old["path"])
            if (line := _changed(kind, old, current)) is not None:
                lines.append(line)
    return lines


def unrecorded(recorded, now):
    """One line per file or folder of ``now`` (the files read again) whose data are none of ``recorded``'s, at
    any path ([] when none): a [data] path pointed at other data (``--resume --set data.path=...``), where
    ``changes`` sees every recorded file still in its place."""
    known = {(e["sha256"], e["bytes"]) for e in recorded["files"] + recorded["folders"]}
    return [f"data {kind} {entry['path']} holds data the run did not read ({_what(entry)})"
            for kind, entries, _ in _kinds(now) for entry in entries if (entry["sha256"], entry["bytes"]) not in known]


def reordered(recorded, now):
    """One line per sequence of ``recorded`` (files joined in an order: ``note_sequence``) that is none of
    ``now``'s sequences ([] when none, or when ``recorded`` was written before sequences were recorded): a file
    renamed (the files joined in another order), a copy of a file added, or a file left out, where each file read
    is still one the run read."""
    if "sequences" not in recorded:
        return []
    remaining = [(e["sha256"], e["bytes"]) for e in now["sequences"]]
    lines = []
    for old in recorded["sequences"]:
        if (old["sha256"], old["bytes"]) in remaining:
            remaining.remove((old["sha256"], old["bytes"]))
            continue
        current = next((e for e in now["sequences"] if e["path"] == old["path"]), None)
        now_what = f"now {_what(current)}" if current is not None else "now not read as one"
        lines.append(f"the files of {old['path']} are not joined as the run joined them (then {_what(old)} in "
                     f"order; {now_what}): a file renamed (files are joined in name order), added as a copy or "
                     f"left out changes the text and its train/validation split")
    return lines
