"""Atomic files and checkpoints.

Every file is written to a temporary name in the same folder, flushed to
disk, and renamed over the target (``os.replace`` is atomic on POSIX), so a
crash leaves either the old file or the new one, never half of one.

``checkpoint.safetensors`` holds all a resumed run needs in one file: the
model weights (``model/<name>``), the optimizer's moment buffers
(``optim/<index>.<buffer>``) and, in the metadata, the optimizer's counters,
the random generators' states and the trainer's state as JSON.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .._limits import bounded_json

CHECKPOINT = "checkpoint.safetensors"
MODEL = "model.safetensors"
FORMAT = "numformer-checkpoint-1"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path, data: bytes):
    """Write bytes to ``path`` atomically (temporary file + fsync + rename). The folder must exist: it is never
    created here, so that a run folder deleted under a running command is not silently made anew."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file 0600; give it a normal file's mode (os.fchmod: POSIX only)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path, obj):
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def _save_safetensors(path, tensors, metadata):
    from safetensors.numpy import save

    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    write_atomic(path, save(tensors, metadata={k: str(v) for k, v in metadata.items()}))


def _load_safetensors(path, what):
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises several types for a damaged file
        raise ValueError(f"{what} {path} is corrupt or truncated ({type(e).__name__}: {e}); "
                         f"it cannot be loaded — restore a copy or retrain") from None
    return tensors, meta


def load_metadata(path, what):
    """The metadata of a safetensors file (no tensor is read); ValueError naming a damaged file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return f.metadata() or {}
    except Exception as e:  # safetensors raises several types for a damaged file
        raise ValueError(f"{what} {path} is corrupt or truncated ({type(e).__name__}: {e}); "
                         f"it cannot be loaded — restore a copy or retrain") from None


def save_model(path, model, metadata=None):
    """The model's weights (deduplicated names of ``state_dict``) as safetensors, atomically."""
    _save_safetensors(path, dict(model.state_dict()), {"format": "numformer-model-1", **(metadata or {})})


def load_model_weights(path, model):
    """Load weights saved by save_model (or a checkpoint's model part) into ``model``."""
    tensors, meta = _load_safetensors(path, "model file")
    if meta.get("format") == FORMAT:
        tensors = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    model.load_state_dict(tensors)
    return meta


def save_checkpoint(path, model, optimizer, state, metadata=None):
    """Model, optimizer and trainer state (JSON-able dict) in one atomic file; ``metadata``: more string
    entries for the file's metadata."""
    tensors = {f"model/{k}": v for k, v in model.state_dict().items()}
    opt_arrays, opt_meta = optimizer.state_dict()
    tensors.update({f"optim/{k}": v for k, v in opt_arrays.items()})
    _save_safetensors(path, tensors, {**(metadata or {}), "format": FORMAT, "optimizer": json.dumps(opt_meta),
                                      "state": json.dumps(state)})


def load_checkpoint(path, model, optimizer):
    """Restore model and optimizer from a checkpoint; returns the trainer state dict."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path}: nothing to resume (the run saved none yet); "
                         f"start the run again without --resume")
    tensors, meta = _load_safetensors(path, "checkpoint")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a numformer checkpoint (format {meta.get('format')!r})")
    try:
        model.load_state_dict({k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")})
        optimizer.load_state_dict({k[len("optim/"):]: v for k, v in tensors.items() if k.startswith("optim/")},
                                  bounded_json(meta["optimizer"], "its optimizer metadata"))
        state = bounded_json(meta["state"], "its state metadata")
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        raise ValueError(f"checkpoint {path} is incomplete or damaged ({type(e).__name__}: {e}); it cannot be "
                         f"resumed") from None
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} is damaged (its state metadata is a JSON {type(state).__name__}, "
                         f"not an object); it cannot be resumed")
    return state


def rng_state(rng):
    """A JSON-able copy of a numpy Generator's state."""
    return rng.bit_generator.state


def set_rng_state(rng, state):
    rng.bit_generator.state = state
