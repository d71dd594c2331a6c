"""The run folder's files: their names, how each is written (atomically) and read back with its checks.

``config.json`` (the resolved config) and ``tokenizer.json`` (the tokenizer's
state) are JSON; ``model.safetensors`` (the selected weights) and
``checkpoint.safetensors`` are safetensors. This module sits below the models,
the configs, the interop layer and training (it imports nothing of numformer's
but the bounded readers and the safetensors reader and writer): all of them read
and write a run folder through it.
The checks of what a config.json says are ``numformer.config``'s
(``load_config_json``); this module reads the bytes.

Every file is written to a temporary name in the same folder, flushed to
disk, and renamed over the target (``os.replace`` is atomic on POSIX), so a
crash leaves either the old file or the new one, never half of one.

``checkpoint.safetensors`` holds all a resumed run needs in one file: the
model weights (``model/<name>``), the optimizer's moment buffers
(``optim/<index>.<buffer>``) and, in the metadata, the optimizer's counters,
the random generators' states, the trainer's state as JSON, the names of
the frozen parameters (``requires_grad = False``), which must be the same when
the run resumes, and the resolved config the run trained with (``config``), which
``--resume`` compares with config.json (``numformer.train.run.resumed_config``).
"""
from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np

from ._limits import bounded_json
from .safetensors_reader import stored_tensors
from .safetensors_writer import safetensors_pieces

CHECKPOINT = "checkpoint.safetensors"
MODEL = "model.safetensors"
FORMAT = "numformer-checkpoint-1"


# The folders this process holds locked (train.run_folder registers them): the folder's absolute path as the lock
# was taken (not resolved: a link put at that path later must not redirect a write) -> an open descriptor of the
# folder itself. A file of such a folder is created relative to that descriptor, so it lands in the folder that
# was locked whatever the path names now (deleted and made anew, replaced by a link to another run, moved); the
# writer's next check (RunLock.check) then stops it. Where the platform has no such descriptors (Windows), by path,
# after that check.
LOCKED_FOLDERS: dict[str, int] = {}


def _locked_folder_fd(path):
    """The descriptor of ``path``'s folder when this process holds that folder locked (and the platform can
    open files relative to it), else None. The path is made absolute but never resolved."""
    folder_fd = LOCKED_FOLDERS.get(os.path.abspath(Path(path).parent))
    return folder_fd if folder_fd is not None and os.open in os.supports_dir_fd else None


def open_in_folder(path, flags, mode=0o666):
    """``os.open(path, flags)``, relative to the locked folder's descriptor where ``path``'s folder is locked:
    a folder deleted meanwhile (Linux refuses new files in it) is one ValueError, and a folder made anew under
    the same name (or a link put there) never receives the file."""
    return _open_at(_locked_folder_fd(path), Path(path), flags, mode)


def read_in_folder(path):
    """The bytes of file ``path``, read through the locked folder's descriptor where ``path``'s folder is locked
    (see ``open_in_folder``): a writer reads its own folder's file even if another was put at the same path
    since its last check. FileNotFoundError when the file is not there."""
    with _open_for_reading(path) as f:
        return f.read()


COPY_CHUNK = 1 << 20        # bytes ``copy_in_folder`` holds at a time


def copy_in_folder(source, target):
    """Copy file ``source`` to ``target`` (``write_atomic``: a crash leaves the old target or the whole copy),
    ``COPY_CHUNK`` bytes at a time, so that a large file is never whole in memory; ``source`` is read as
    ``read_in_folder`` reads it. FileNotFoundError when it is not there."""
    with _open_for_reading(source) as f:
        write_atomic(target, iter(lambda: f.read(COPY_CHUNK), b""))


def _open_for_reading(path):
    """File ``path`` open for reading in binary, through the locked folder's descriptor where it is locked."""
    folder_fd = _locked_folder_fd(path)
    fd = os.open(Path(path) if folder_fd is None else Path(path).name, os.O_RDONLY | getattr(os, "O_BINARY", 0),
                 dir_fd=folder_fd)
    return os.fdopen(fd, "rb")


def _open_at(folder_fd, path, flags, mode=0o666):
    if folder_fd is None:
        return os.open(path, flags, mode)
    try:
        return os.open(path.name, flags, mode, dir_fd=folder_fd)
    except FileNotFoundError:
        what = "replaced by another folder" if os.path.lexists(path.parent) else "deleted"
        raise ValueError(f"{path.parent} was {what} while this command was writing it; stopped without writing "
                         f"{path.name} (nothing is recreated)") from None


def remove_in_folder(path):
    """Delete the file ``path`` if it exists, relative to the locked folder's descriptor where ``path``'s folder
    is locked (see ``open_in_folder``): never a file of another folder put at the same path."""
    folder_fd = _locked_folder_fd(path)
    try:
        if folder_fd is None:
            os.unlink(path)
        else:
            os.unlink(Path(path).name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass


def replace_in_folder(source, target):
    """``os.replace(source, target)`` for two files of one folder, relative to its descriptor where it is locked
    (see ``open_in_folder``)."""
    folder_fd = _locked_folder_fd(target)
    if folder_fd is None:
        os.replace(source, target)
    else:
        os.replace(Path(source).name, Path(target).name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)


TEMP_SUFFIX = ".tmp"
_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)    # never through a link


def temp_name(name):
    """The temporary name ``write_atomic`` writes ``name`` under: ``.NAME.PID.RANDOM.tmp``."""
    return f".{name}.{os.getpid()}.{os.urandom(4).hex()}{TEMP_SUFFIX}"


def is_temp_of(file_name, name):
    """Whether ``file_name`` is one of ``write_atomic``'s temporary names for ``name`` (``temp_name``)."""
    prefix = f".{name}."
    if not (file_name.startswith(prefix) and file_name.endswith(TEMP_SUFFIX)):
        return False
    pid, _, rand = file_name[len(prefix):-len(TEMP_SUFFIX)].partition(".")
    return pid.isdigit() and len(rand) == 8 and all(c in "0123456789abcdef" for c in rand)


def write_atomic(path, data):
    """Write ``data`` (bytes, or an iterable of bytes-like pieces written one after another: a large file need
    not be whole in memory) to ``path`` atomically (temporary file + fsync + rename). The folder must exist:
    it is never created here, so that a run folder deleted under a running command is not silently made anew.
    In a locked folder, the file goes into the folder that was locked (``LOCKED_FOLDERS``), whatever the path
    names now: the temporary file, the rename and any clean-up all go through the one descriptor looked up
    here."""
    path = Path(path)
    tmp = path.with_name(temp_name(path.name))
    folder_fd = _locked_folder_fd(path)
    try:
        fd = _open_at(folder_fd, tmp, _CREATE_NEW)
    except OSError as e:
        raise _about(e, path) from None
    tmp_name, name = (tmp, path) if folder_fd is None else (tmp.name, path.name)
    at = {} if folder_fd is None else {"dir_fd": folder_fd}
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, name, **({} if folder_fd is None else {"src_dir_fd": folder_fd,
                                                                     "dst_dir_fd": folder_fd}))
    except BaseException as e:
        try:
            os.unlink(tmp_name, **at)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _about(e, path) from None
        raise


def _about(error, path):
    """An OSError of ``write_atomic`` (about its temporary file, named ``.NAME.PID.RANDOM.tmp``) as one about the
    file it writes, ``path``: what the user asked for, and in the folder they chose."""
    if error.errno is None:
        return error
    return type(error)(error.errno, error.strerror, str(path))


def remove_temp_files(folder, names):
    """Delete ``write_atomic``'s temporary files of ``names`` left in ``folder`` by a write cut short (a killed
    process); through the locked folder's descriptor where it is locked. The caller holds the folder's exclusive
    lock, so no other numformer command is writing them. Returns the names removed."""
    folder_fd = _locked_folder_fd(Path(folder) / "x")
    listing = os.listdir(folder_fd if folder_fd is not None and os.listdir in os.supports_fd else folder)
    removed = sorted(f for f in listing if any(is_temp_of(f, name) for name in names))
    for f in removed:
        try:
            os.unlink(f, dir_fd=folder_fd) if folder_fd is not None else os.unlink(Path(folder) / f)
        except FileNotFoundError:
            pass
    return removed


def write_json_atomic(path, obj):
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


CHECKSUM = "crc32"          # metadata key: the CRC-32 of every tensor's bytes (safetensors itself checks only sizes)


def _checksum(tensors):
    """CRC-32 (hex) of the tensors' bytes, in the order of their names: a file whose bytes changed on disk (a bad
    sector, a partial copy, a stray write) no longer matches the value written with it."""
    crc = 0
    for name in sorted(tensors):
        crc = zlib.crc32(np.ascontiguousarray(tensors[name]).reshape(-1).view(np.uint8), crc)
    return f"{crc:08x}"


def _save_safetensors(path, tensors, metadata):
    """``tensors`` and ``metadata`` (with the tensors' checksum) as a safetensors file, atomically, written a
    tensor at a time from the arrays themselves (``safetensors_pieces``): no copy of the file in memory."""
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    metadata = {**{k: str(v) for k, v in metadata.items()}, CHECKSUM: _checksum(tensors)}
    write_atomic(path, safetensors_pieces(tensors, metadata))


def _checked_tensors(path, what):
    """({name: StoredTensor}, metadata) of a safetensors file numformer wrote, its tensors' bytes checked against
    the checksum written with them, a piece of the file at a time (no tensor is held: read each when it is
    used); ValueError naming a damaged file (unreadable, or no longer matching the checksum; files written
    before checksums were recorded are read unchecked)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    meta = load_metadata(path, what)
    stored = _stored_tensors(path, what)
    if CHECKSUM in meta:
        crc = 0
        for name in sorted(stored):
            crc = _reading(lambda: stored[name].crc32(crc), path, what)
        if meta[CHECKSUM] != f"{crc:08x}":
            raise _changed(path, what, meta[CHECKSUM])
    return stored, meta


def _load_safetensors(path, what):
    """(tensors, metadata) of a safetensors file numformer wrote, every tensor read (``_checked_tensors``)."""
    stored, meta = _checked_tensors(path, what)
    return {name: _reading(t.read, path, what) for name, t in stored.items()}, meta


def _reading(read, path, what):
    """``read()``, a ValueError naming the file when it is cut short or unreadable."""
    try:
        return read()
    except (OSError, ValueError) as e:
        raise ValueError(f"{what} {path} is corrupt or truncated ({e}); it cannot be loaded — restore a copy or "
                         f"retrain") from None


def _changed(path, what, recorded):
    return ValueError(f"{what} {path} is corrupt: its tensors' bytes changed since numformer wrote it (their "
                      f"CRC-32 is not the {recorded} written with them); restore a copy or retrain")


def verify_file(path, what):
    """Check every tensor of a safetensors file numformer wrote against its checksum, a piece at a time;
    ValueError naming a damaged file (``_checked_tensors``)."""
    _checked_tensors(path, what)


def load_metadata(path, what):
    """The metadata of a safetensors file (no tensor is read); ValueError naming a damaged file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return f.metadata() or {}
    except Exception as e:  # safetensors raises several types for a damaged file
        raise ValueError(f"{what} {path} is corrupt or truncated ({type(e).__name__}: {e}); "
                         f"it cannot be loaded — restore a copy or retrain") from None


def weights_step(path):
    """The step a weights file (model.safetensors) records in its metadata, or None (no file, or no step)."""
    path = Path(path)
    if not path.exists():
        return None
    step = load_metadata(path, "model file").get("step")
    return int(step) if step is not None and step.isdigit() else None


def save_model(path, model, metadata=None):
    """The model's weights (deduplicated names of ``state_dict``) as safetensors, atomically."""
    _save_safetensors(path, dict(model.state_dict()), {"format": "numformer-model-1", **(metadata or {})})


def no_saved_weights(run_dir):
    """The ValueError for a run folder with neither weights file: its run ended (stopped, crashed or diverged)
    before it saved any, so nothing can read it and --resume cannot continue it."""
    return ValueError(f"{run_dir} has no saved weights ({MODEL} or {CHECKPOINT}): its training ended before its "
                      f"first evaluation or checkpoint saved any, so --resume cannot continue it either; train it "
                      f"again with `numformer train CONFIG --out {run_dir} --overwrite`")


def weights_path(run_dir):
    """The file a run folder's weights are read from: model.safetensors, else checkpoint.safetensors (a run
    stopped before an evaluation saved weights). ValueError when the folder has neither, or when either name is
    taken by something other than a file (a folder, say: read as missing, it would hide the weights)."""
    run_dir = Path(run_dir)
    for path in (run_dir / MODEL, run_dir / CHECKPOINT):
        if path.exists() and not path.is_file():
            raise ValueError(f"{path} is not a file; numformer saves a run's weights as a file of that name: "
                             f"remove what is there, or put back the file")
    for path in (run_dir / MODEL, run_dir / CHECKPOINT):
        if path.is_file():
            return path
    raise no_saved_weights(run_dir)


def run_weights(run_dir):
    """The file a run folder's weights are read from (``weights_path``); checkpoint.safetensors is named on
    stderr by one line, with its step, since its weights are the last ones rather than the selected ones."""
    path = weights_path(run_dir)
    if path.name == MODEL:
        return path
    try:
        step = f" (step {int(bounded_json(load_metadata(path, 'checkpoint')['state'], 'its state')['step'])})"
    except (KeyError, TypeError, ValueError):       # a damaged checkpoint is named when it is loaded
        step = ""
    print(f"note: {path.parent} has no {MODEL}; using the last weights, those of {path}{step}", file=sys.stderr,
          flush=True)
    return path


def load_model_weights(path, model, written=None):
    """Load weights saved by save_model (or a checkpoint's model part) into ``model``; returns the file's metadata.

    Names and shapes are checked first (``Module.check_state_dict``: one error, nothing written); then the
    file's tensors are read one at a time, in the order of their names, each straight into its parameter a
    piece at a time (``StoredTensor.read_into``) and added to the checksum, so loading needs the model's own
    memory, not twice it. A checkpoint's optimizer tensors are read for the checksum only. A file whose
    checksum no longer matches raises ValueError once it has been read, when ``model`` holds some of its
    tensors: load into a model you can discard, as ``interop.sources.load`` does. ``written(name)``: called
    once parameter ``name`` holds its weights (no reference to it is kept after:
    ``numformer.quantize.LayerQuantizer.written`` may release it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    meta = load_metadata(path, "model file")
    stored = _stored_tensors(path, "model file")
    names = _parameter_names(stored, meta)
    model.check_state_dict({names[k]: stored[k] for k in names})
    params, crc = dict(model.named_parameters()), 0
    for key in sorted(stored):                                                        # as _checksum
        if key in names:
            out = params.pop(names[key]).data
            crc = _reading(lambda: stored[key].read_into(out, crc), path, "model file")
            if written is not None:
                written(names[key])
        else:
            crc = _reading(lambda: stored[key].crc32(crc), path, "model file")
    if CHECKSUM in meta and meta[CHECKSUM] != f"{crc:08x}":
        raise _changed(path, "model file", meta[CHECKSUM])
    return meta



def model_tensors(path):
    """{parameter name: StoredTensor} of the model a weights file holds (model.safetensors, or a checkpoint's
    model part), from its header alone (no tensor read); ValueError naming a damaged file."""
    stored = _stored_tensors(path, "model file")
    return {name: stored[key] for key, name in _parameter_names(stored, load_metadata(path, "model file")).items()}


def _stored_tensors(path, what):
    """``stored_tensors(path)`` (the header checked, no tensor read), a ValueError naming a damaged file."""
    return _reading(lambda: stored_tensors(path), path, what)


def _parameter_names(stored, meta):
    """{name in the file: parameter name} of the model's tensors (a checkpoint's are under ``model/``)."""
    prefix = "model/" if meta.get("format") == FORMAT else ""
    return {k: k[len(prefix):] for k in stored if k.startswith(prefix)}


def frozen_parameters(model):
    """The names of the model's frozen parameters (``requires_grad`` False), in model order."""
    return [name for name, p in model.named_parameters() if not p.requires_grad]


def save_checkpoint(path, model, optimizer, state, metadata=None, config=None):
    """Model, optimizer and trainer state (JSON-able dict) in one atomic file; ``metadata``: more string
    entries for the file's metadata. The names of the frozen parameters are recorded (``frozen``), and
    ``config``, the resolved config the run trains with, as ``config`` (a resumed run checks config.json
    against it: ``checkpoint_config``)."""
    tensors = {f"model/{k}": v for k, v in model.state_dict().items()}
    opt_arrays, opt_meta = optimizer.state_dict()
    tensors.update({f"optim/{k}": v for k, v in opt_arrays.items()})
    recorded = {} if config is None else {"config": json.dumps(config)}
    _save_safetensors(path, tensors, {**(metadata or {}), **recorded, "format": FORMAT,
                                      "optimizer": json.dumps(opt_meta), "state": json.dumps(state),
                                      "frozen": json.dumps(frozen_parameters(model))})


def checkpoint_config(path):
    """What checkpoint ``path`` records of the config its run trained with: {"config": the resolved config, or
    None for a checkpoint written before it was recorded; "model": the [model] section (``model_config``, None
    before it was recorded); "dtype"; "optimizer": the optimizer's class name; "model_rng": the state of the
    generator the run's seed started}. None when there is no checkpoint or it is not a numformer one. An entry
    that is not what numformer writes counts as not recorded (``load_checkpoint`` names a damaged one), but for
    ``config``: ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        return None
    meta = load_metadata(path, "checkpoint")
    if meta.get("format") != FORMAT:
        return None

    def entry(key):
        try:
            value = bounded_json(meta[key], f"the {key} metadata of checkpoint {path}") if key in meta else None
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    config = entry("config")
    if "config" in meta and not (config and all(isinstance(v, dict) for v in config.values())):
        raise ValueError(f"checkpoint {path} is damaged (its config metadata is not the table of sections numformer "
                         f"writes); it cannot be resumed: restore it or train again")
    return {"config": config, "model": entry("model_config"), "dtype": meta.get("dtype"),
            "optimizer": (entry("optimizer") or {}).get("type"), "model_rng": (entry("state") or {}).get("model_rng")}


def require_checkpoint(path):
    """``path`` as a Path when a checkpoint file is there to resume from; else ValueError naming what to do."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path}: nothing to resume (the run wrote none, or it was removed); "
                         f"start the run afresh in that folder with --overwrite instead of --resume (it replaces "
                         f"the run's files), or give another --out")
    return path


def load_checkpoint(path, model, optimizer):
    """Restore model and optimizer from a checkpoint; returns the trainer state dict. The optimizer takes the
    checkpoint's state (moments, step counts) and keeps the options it was built with (the resumed run's config,
    which ``--resume --set`` may have changed); the saved options are checked all the same."""
    path = require_checkpoint(path)
    tensors, meta = _checked_tensors(path, "checkpoint")        # read a tensor at a time as each is loaded
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a numformer checkpoint (format {meta.get('format')!r})")
    _check_frozen(path, meta, model)
    try:
        model.load_state_dict({k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")})
    except ValueError as e:         # names or shapes of another model than config.json's (resumed_config compares
        # the [model] section a checkpoint records before this; one written before it recorded any gets here)
        raise ValueError(f"checkpoint {path} holds weights of another model than config.json's [model] describes "
                         f"({e}); if config.json was edited, restore it from a copy; else the checkpoint is "
                         f"damaged: restore it or train again") from None
    try:
        optimizer.load_state_dict({k[len("optim/"):]: v for k, v in tensors.items() if k.startswith("optim/")},
                                  bounded_json(meta["optimizer"], "its optimizer metadata"), keep_options=True)
        state = bounded_json(meta["state"], "its state metadata")
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        raise ValueError(f"checkpoint {path} is incomplete or damaged ({type(e).__name__}: {e}); it cannot be "
                         f"resumed") from None
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} is damaged (its state metadata is a JSON {type(state).__name__}, "
                         f"not an object); it cannot be resumed")
    return state


def _check_frozen(path, meta, model):
    """The model must freeze what the checkpoint's run froze (a checkpoint from before frozen parameters
    existed froze nothing): the optimizer state belongs to the trainable parameters."""
    saved = bounded_json(meta.get("frozen", "[]"), f"the frozen-parameter list of {path}")
    now = frozen_parameters(model)
    if saved != now:
        raise ValueError(f"checkpoint {path} was trained with the parameters {saved or 'none'} frozen, but this "
                         f"model freezes {now or 'none'}; freeze the same parameters to resume it")


def rng_state(rng):
    """A JSON-able copy of a numpy Generator's state."""
    return rng.bit_generator.state


def set_rng_state(rng, state):
    rng.bit_generator.state = state


# -- reading a run folder's JSON files ----------------------------------------------------------------

MAKE_RUN = "`numformer train CONFIG --out RUN_DIR` or `numformer import-hf MODEL --out RUN_DIR` makes one"


def check_run_dir(run_dir):
    """A run folder's path must name a folder: one ValueError saying what is there instead and what to give."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ValueError(f"run folder {run_dir} does not exist; give the folder of a run ({MAKE_RUN})")
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir} is a file, not a run folder; {_instead_of_file(run_dir)}")


def _instead_of_file(path):
    """What to give instead of file ``path`` where a run folder is expected."""
    if path.suffix == ".toml":
        return (f"it looks like a config: train it with `numformer train {path} --out RUN_DIR`, then give "
                f"RUN_DIR")
    if path.suffix in (".safetensors", ".json", ".jsonl"):
        return f"give the folder that holds it ({path.parent})"
    return f"give the folder of a run ({MAKE_RUN})"


def read_json(path, what):
    """A JSON file's content; ValueError naming the file for unreadable, non-UTF-8 or malformed JSON."""
    path = Path(path)
    return bounded_json(path.read_bytes(), f"{what} {path}")


TOKENIZER = "tokenizer.json"
DATA_FILES = "data_files.json"      # the files the run's task read, and their SHA-256 (data.fingerprint)
NOT_REBUILT = ("it cannot be rebuilt safely: a vocabulary built again from the data as they are now may give the "
               "weights other ids")
# Files only a numformer run writes, never a Hugging Face folder: beside one of them, a config.json that holds no
# config (``{}``, a list ...) is a damaged run's, which ``read_run_config`` names, not a Hugging Face model's
RUN_ONLY_FILES = (CHECKPOINT, "summary.json", "metrics.jsonl", DATA_FILES)


def _holds_nothing(value):
    """What a JSON file holds that is not what numformer wrote there, in words: "an empty JSON object", "JSON
    null", "a JSON list" ..."""
    return ("an empty JSON object" if value == {} else "JSON null" if value is None
            else f"a JSON {type(value).__name__}")


def read_run_config(run_dir):
    """The run's config.json as read (``read_json``; its checks are ``numformer.config``'s). ValueError naming
    the file when it holds no config at all (``{}``, a list, null ...: a file emptied or overwritten), saying
    where the config is found again: a copy of the run folder, or the config its checkpoint records."""
    path = Path(run_dir) / "config.json"
    config = read_json(path, "config file")
    if isinstance(config, dict) and config:
        return config
    checkpoint = Path(run_dir) / CHECKPOINT
    try:
        recorded = (checkpoint_config(checkpoint) or {}).get("config")
    except ValueError:              # a damaged checkpoint: resuming names it
        recorded = None
    again = (f"from the config its checkpoint records (numformer.run_files.checkpoint_config({str(checkpoint)!r})"
             f"['config'], written as JSON)" if recorded else "train the run again")
    raise ValueError(f"config file {path} is damaged (it holds {_holds_nothing(config)}, not a run's config); "
                     f"restore it from a copy of the run folder, or {again}")


def load_tokenizer_state(run_dir):
    """The run's tokenizer.json (a non-empty JSON object), or None when the folder has none (whether the run
    should have one is for its config to say: ``numformer.data.run_tokenizer.load_tokenizer_json``).
    ValueError naming the file when it is not JSON or holds no tokenizer's state (``{}``, a list, null ...)."""
    path = Path(run_dir) / TOKENIZER
    if not path.is_file():
        return None
    state = read_json(path, "tokenizer file")
    if not isinstance(state, dict) or not state:
        raise ValueError(f"tokenizer file {path} is damaged (it holds {_holds_nothing(state)}, not a tokenizer's "
                         f"state); restore it from a copy of the run folder ({NOT_REBUILT})")
    return state
