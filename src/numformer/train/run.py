"""Loading a finished (or running) run folder for evaluation, generation and analysis, and the config of a run
to resume.

Every file is checked as it is read: a missing folder or file, bad JSON, a
config.json that fails the config checks (``numformer.config``) or weights
saved with another model config each give one ValueError naming the file. A
run whose task keeps a tokenizer needs its tokenizer.json: it is never built
again from the data (``data.run_tokenizer.load_tokenizer_json``). A run to
resume needs a config.json that agrees with its checkpoint (``check_against_checkpoint``).
Whatever builds a run's task again reads data that must still be the run's: the files it reads are compared
with the run's data_files.json (``data_files_before`` and ``data_files_after``; ``numformer.data.fingerprint``).
"""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from ..config import (apply_overrides, check_config_json_against_checkpoint, check_saved_config, load_config_json,
                      NotRecorded, resolve_config, resume_changes, resume_section_changes)
from .._limits import read_json_file
from ..data import fingerprint
from ..data.base import make_task
from ..data.notices import quiet_data
from ..data.run_tokenizer import load_tokenizer_json
from ..data.token_files import token_cache_root
from ..interop.sources import load_run_model, tokenizer_from_state
from ..models import model_arguments
from ..optim import OPTIMIZERS
from ..run_files import CHECKPOINT, DATA_FILES, TOKENIZER, checkpoint_config, require_checkpoint
from .dpo import read_reference
from .run_folder import REFERENCE


def load_model(run_dir, config=None):
    """The run's model with its saved weights (model.safetensors, else the checkpoint), in eval mode."""
    config = load_config_json(run_dir) if config is None else config
    return load_run_model(run_dir, config["model"], config["train"]["dtype"], config.get("lora"))


def load_tokenizer(run_dir, config=None):
    """The run's tokenizer (tokenizer.json), or None when the run's task keeps none."""
    config = load_config_json(run_dir) if config is None else config
    state = load_tokenizer_json(run_dir, config["data"])
    return None if state is None else tokenizer_from_state(state, run_dir)


def load_task(run_dir, config=None, against_checkpoint=True):
    """The run's task, rebuilt from its [data] config with the saved vocabulary; config.json must agree with the
    run's checkpoint on what --resume cannot change ([data], the seed that drew its splits, ...:
    ``check_against_checkpoint``), or the data would not be the run's. ``against_checkpoint=False``: no
    comparison (a checkpoint too damaged to tell, whose reader has said so)."""
    config = load_config_json(run_dir) if config is None else config
    if against_checkpoint:
        check_against_checkpoint(run_dir, config, resuming=False)
    state = load_tokenizer_json(run_dir, config["data"])
    recorded, gone = data_files_before(run_dir, resuming=False, source=config["model"].get("init_from"))
    try:
        with fingerprint.reading() as read:
            task = make_task(config["data"], config["train"]["seed"], state)
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        if state is None:
            raise
        raise ValueError(f"tokenizer file {Path(run_dir) / TOKENIZER} does not fit the run's [data] "
                         f"({type(e).__name__}: {e}); restore it or retrain") from None
    data_files_after(run_dir, recorded, gone, read, resuming=False)
    reference = Path(run_dir) / REFERENCE
    if hasattr(task, "set_reference") and reference.is_file():     # a DPO run: its metrics need the reference
        task.set_reference(read_reference(reference, len(task.examples)))
    return task


def config_and_task(run_dir, config, overrides, resume, quiet=False):
    """(resolved config, task, notes, data files) of a run: ``resumed_config`` when it resumes, else ``config``
    with ``overrides`` (no notes) and the fingerprint of the files its task read, for data_files.json. The task is
    built here, its download and BPE lines silenced by ``quiet``."""
    with quiet_data(quiet):
        if resume:
            return resumed_config(run_dir, overrides)
        config = apply_overrides(config, overrides)
        check_out_outside_data(run_dir, config.get("data"))
        with fingerprint.reading() as read:
            config, task = resolve_config(config)
        return config, task, (), data_fingerprint(run_dir, read)


def check_out_outside_data(run_dir, data):
    """One ValueError when the run folder would be inside a folder named by ``data``'s ``path`` or ``paths`` (a
    new run's [data] section): the run writes its checkpoint and logs there, which the next run, --resume or eval
    would read as data (a corpus folder's files are all read)."""
    data = data if isinstance(data, dict) else {}
    paths = data.get("paths") if isinstance(data.get("paths"), list) else []
    out = Path(run_dir).resolve()
    for key, given in [("path", data.get("path")), *(("paths", p) for p in paths)]:
        if isinstance(given, str) and given and Path(given).is_dir() and out.is_relative_to(Path(given).resolve()):
            raise ValueError(f"--out {run_dir} is inside the data folder [data] {key} = {given!r}: the run's files "
                             f"(checkpoint, logs) would be read as data by the next run, --resume and eval; give "
                             f"--out a folder outside {given}")


def resumed_config(run_dir, overrides=None):
    """(resolved config, task, notes, data files) of a run to resume: its config.json with ``overrides`` (--set)
    applied, the task with the saved vocabulary (so that ids mean what they meant), a note line on each change the
    overrides make, and on each value edited by hand in config.json since the checkpoint (both compared with the
    checkpoint's config: ``config.resume_changes`` for [train], ``config.resume_section_changes`` for [model],
    [data] and [lora]; each refuses in one line a change that cannot be made), and the fingerprint of its data to write
    when the run folder has none (the data must be the run's: ``data_files_before``, ``data_files_after``). The
    checkpoint must be there; config.json must agree with it on what --resume cannot change
    (``check_against_checkpoint``), and tokenizer.json must be there when the run's task keeps one
    (``data.run_tokenizer.load_tokenizer_json``)."""
    saved = load_config_json(run_dir)
    require_checkpoint(Path(run_dir) / CHECKPOINT)      # before any note on what --set changes
    trained = check_against_checkpoint(run_dir, saved)
    tokenizer_state = load_tokenizer_json(run_dir, saved["data"])
    wanted = apply_overrides(saved, overrides)
    resume_section_changes(saved, wanted)       # a change refused by name before any data or source is read
    recorded, gone = data_files_before(run_dir, source=saved["model"].get("init_from"))
    try:
        with fingerprint.reading() as read:
            config, task = resolve_config(wanted, tokenizer_state, recorded_model=saved["model"])
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        if tokenizer_state is None:
            raise
        raise ValueError(f"tokenizer file {Path(run_dir) / TOKENIZER} is damaged or does not fit the run's "
                         f"[data] ({type(e).__name__}: {e}); restore it or retrain") from None
    data_files = data_files_after(run_dir, recorded, gone, read)
    return (config, task, resume_changes(_trained_train(trained, saved), config["train"])
            + resume_section_changes(trained or saved, config), data_files)


def _trained_train(trained, saved):
    """The [train] section the checkpoint's run trained with (config.json's for what it does not record)."""
    if trained is None:
        return saved["train"]
    return {k: saved["train"].get(k) if isinstance(v, NotRecorded) else v for k, v in trained["train"].items()}


def _excluded(run_dir):
    """The folders whose files are never a run's data: the run folder and numformer's token cache."""
    return run_dir, token_cache_root()


def data_fingerprint(run_dir, read):
    """The data_files.json document of the files in ``read`` (``fingerprint.reading``'s set), leaving out the
    run folder's own files and numformer's token cache."""
    return fingerprint.fingerprint(read, excluded=_excluded(run_dir))


def data_files_before(run_dir, resuming=True, source=None):
    """(the run's data_files.json document or None, the part of it to check once the task is built): before the
    run's task is built again, a recorded file or folder whose path holds other data now is one ValueError
    (``_refuse``). A run without data_files.json (written before numformer recorded its data) is not checked.
    The files of the run's fine-tuning ``source`` ([model] init_from) are not its data: a data_files.json
    written when they were counted has them left out (``_without_source``)."""
    path = Path(run_dir) / DATA_FILES
    if not path.exists():
        return None, None
    recorded = fingerprint.check_document(read_json_file(path, "data files"), path)
    if source is not None:
        recorded = _without_source(recorded, source)
    changed, gone = fingerprint.changed_in_place(recorded)
    _refuse(run_dir, changed, resuming)
    return recorded, gone


def _without_source(recorded, source):
    """``recorded`` (a data_files.json document) without the entries inside the fine-tuning source ``source``: a
    folder, or a hub id's folders in the Hugging Face cache (``models--OWNER--NAME``)."""
    folder = Path(source).expanduser()
    hub_folder = "models--" + source.removeprefix("hf:").replace("/", "--")

    def of_source(entry):
        path = Path(entry["path"])
        return (folder.is_absolute() and path.is_relative_to(folder)) or hub_folder in path.parts

    return {**recorded, **{key: [e for e in entries if not of_source(e)]
                           for key, entries in recorded.items() if isinstance(entries, list)}}


def data_files_after(run_dir, recorded, gone, read, resuming=True):
    """After the task was built again (``read``: the files it read): the recorded files no longer at their path
    must have been read from another place (``fingerprint.changes``), and every file read must hold data the run
    read (``fingerprint.unrecorded``: a [data] path now pointing at other data). Returns the fingerprint to write
    when a run to resume has no data_files.json, else None."""
    if recorded is None:
        return data_fingerprint(run_dir, read) if resuming else None
    now = _read_elsewhere(run_dir, recorded, read)
    if gone["files"] or gone["folders"]:
        _refuse(run_dir, fingerprint.changes(gone, now), resuming)
    _refuse(run_dir, fingerprint.unrecorded(recorded, now), resuming)
    _refuse(run_dir, fingerprint.reordered(recorded, {"sequences": fingerprint.sequences(read, _excluded(run_dir))}),
            resuming)
    return None


def _read_elsewhere(run_dir, recorded, read):
    """The fingerprint of the files read (``read``) that the run did not record at their path: those it did, in
    a file or a folder entry, were checked in place before the task was built (not hashed twice)."""
    files, folders = {e["path"] for e in recorded["files"]}, {e["path"] for e in recorded["folders"]}
    return data_fingerprint(run_dir, [p for p in fingerprint.data_paths(read)
                                      if str(p) not in files and str(p.parent) not in folders])


def _refuse(run_dir, changed, resuming):
    """One ValueError for the data that changed (``changed``: fingerprint's lines; nothing when empty): the first,
    how many more, what would follow (``resuming``) and the fix."""
    if not changed:
        return
    more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
    consequence = ("--resume would go on training it on other data than its steps so far" if resuming else
                   "the figures and examples drawn from them now would not be the run's")
    raise ValueError(f"{run_dir}: {changed[0]}{more}; {consequence}. Restore the data the run read, or train a new "
                     f"run on them (--out NEW_DIR, or --overwrite); to accept the data as they are now, delete "
                     f"{Path(run_dir) / DATA_FILES}")


def check_against_checkpoint(run_dir, saved, resuming=True):
    """config.json (``saved``, resolved) against the config the run's checkpoint was trained with: one ValueError
    naming each value edited by hand that ``--resume --set`` would refuse to change
    (``config.check_config_json_against_checkpoint``; ``resuming``: whose advice). Nothing to compare without a
    checkpoint (resuming says so). Returns the checkpoint's config (``trained_config``), or None."""
    path = Path(run_dir) / CHECKPOINT
    recorded = checkpoint_config(path)
    if recorded is None:
        return None
    trained = trained_config(recorded, saved, path)
    check_config_json_against_checkpoint(trained, saved, Path(run_dir) / "config.json", path, resuming)
    return trained


def trained_config(recorded, saved, path):
    """The resolved config a checkpoint's run trained with, as far as the checkpoint tells (``recorded``:
    ``run_files.checkpoint_config``). A recorded config is checked as config.json is, its defaults filled in (a key
    added to numformer since counts as its default); one that fails the checks is a damaged checkpoint. A
    checkpoint written before checkpoints recorded their config tells its [model] section (a key it lacks counts
    as its default, as ``interop.sources.check_weights`` has it), dtype and optimizer, and whether its seed is
    config.json's (``seeded_with``); config.json's values (``saved``) stand for the rest."""
    if recorded["config"] is not None:
        try:
            return check_saved_config(recorded["config"], "its config metadata")
        except ValueError as e:
            raise ValueError(f"checkpoint {path} is damaged ({e}); it cannot be resumed: restore it or train "
                             f"again") from None
    trained = {s: dict(v) for s, v in saved.items()}
    if recorded["model"] is not None:
        defaults = model_arguments(saved["model"]["type"])
        for k in saved["model"]:
            default = defaults.get(k, inspect.Parameter.empty)
            if k in recorded["model"] or default is not inspect.Parameter.empty:
                trained["model"][k] = recorded["model"].get(k, default)
    if recorded["dtype"] in ("float32", "float64"):
        trained["train"]["dtype"] = recorded["dtype"]
    name = {cls.__name__: name for name, cls in OPTIMIZERS.items()}.get(recorded["optimizer"])
    if name is not None:
        trained["train"]["optimizer"] = name
    if not seeded_with(recorded["model_rng"], saved["train"]["seed"]):
        trained["train"]["seed"] = NotRecorded(f"another seed (its random generators were not seeded with "
                                               f"{saved['train']['seed']})")
    return trained


def seeded_with(rng_state, seed):
    """Whether the saved state of a run's first random generator (the trainer's ``model_rng``, a PCG64 of
    ``SeedSequence(seed).spawn(2)[0]``) comes from ``seed``: a PCG64's increment is set by its seed and never
    changes as it draws. True when the state cannot tell."""
    try:
        inc = rng_state["state"]["inc"] if rng_state["bit_generator"] == "PCG64" else None
    except (KeyError, TypeError):
        return True
    if type(inc) is not int:            # another generator, or a damaged state (resuming names it)
        return True
    first = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[0])
    return inc == first.bit_generator.state["state"]["inc"]
