"""Experiment configs: load a TOML file, apply ``--set`` overrides, check every key, fill in every default.

A config has three sections. ``[data]`` names a task and its options,
``[model]`` the model's constructor arguments (its ``type`` must be the
task's model family; arguments fixed by the data — vocabulary sizes, number
of classes, padding ids, context length — come from the task and must not be
repeated), and ``[train]`` the keys of ``TRAIN_DEFAULTS``.

Every key has a type and a range (a ``numformer.keys.Key``: ``_train_keys()`` here, ``numformer.models.model_keys()``,
``numformer.data.base.DATA_KEYS``),
checked before anything is written; a wrong key or value raises one
ValueError naming it, with the valid keys or the allowed range. A run's
``config.json`` goes through the same checks when it is read back.
"""
from __future__ import annotations

import copy
import inspect
import json
import os
import tomllib
from pathlib import Path

from .data import fingerprint
from .data.base import DATA_KEYS, check_data_section, find_task, import_builtin_tasks, make_task, task_module_of
from .interop.sources import FINE_TUNING_OPTIONS, read_source
from .lora import LORA_DEFAULTS, TARGET_MODULES, check_lora_options
from .keys import BOOL, FRACTION, NONNEG_FLOAT, NONNEG_INT, Key, check_section, did_you_mean, positive
from .models import (MODEL_TYPES, apply_preset, check_model_together, check_source_type, model_arguments,
                     model_keys)
from .optim import COOLDOWN_SHAPES, OPTIMIZERS, SCHEDULES
from .optim.schedules import check_decay
from .optim.optimizers import NO_DECAY_KINDS
from .run_files import check_run_dir, read_run_config
from ._limits import check_bounds

SECTIONS = ("model", "data", "train", "lora")      # [lora]: optional, LoRA adapters (numformer.lora)

TRAIN_DEFAULTS = {
    "max_steps": 1000,            # optimizer updates
    "batch_size": 32,
    "lr": 1e-3,                   # peak learning rate (for "noam": the factor of the paper's formula)
    "eval_every": 100,            # steps between evaluations on the validation split
    "checkpoint_every": 500,      # steps between checkpoints (also written at the end and on Ctrl-C)
    "seed": 1337,
    "optimizer": "adamw",         # adamw | adam | sgd | muon (Muon for the blocks' matrices, AdamW for the rest)
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "weight_decay": 0.0,
    "no_decay": ["bias", "norm"],  # parameter kinds without weight decay: bias, norm, embedding
    "momentum": 0.0,              # sgd only
    "nesterov": False,            # sgd only
    "muon_lr": 0.02,              # muon only: learning rate of the matrices (the schedule scales it like lr)
    "muon_momentum": 0.95,        # muon only
    "muon_nesterov": True,        # muon only
    "muon_ns_steps": 5,           # muon only: Newton-Schulz iterations
    "schedule": "constant",       # constant | linear | cosine | wsd | noam
    "cooldown": 0.2,              # wsd only: the fraction of the run (after warmup) spent decaying to min_lr
    "cooldown_shape": "linear",   # wsd only: linear | sqrt (1 - √ of the cooldown's progress)
    "warmup_steps": 0,
    "min_lr": 0.0,                # floor of the linear/cosine decay
    "decay_steps": 0,             # step where the decay reaches min_lr; 0 = max_steps
    "grad_clip": 1.0,             # global-norm clipping; 0 = off
    "grad_accum": 1,              # micro-batches per update
    "label_smoothing": 0.0,
    "eval_batches": 0,            # periodic evaluations on a fixed sample of eval_batches batches spread over the split; 0 = all
    "eval_batch_size": 0,         # 0 = batch_size
    "eval_metrics": True,         # also compute the task's metrics (accuracy, exact match ...) at each evaluation
    "early_stopping_patience": 0,  # evaluations without improvement before stopping; 0 = never stop early
    "early_stopping_min_delta": 0.0,
    "restore_best": True,         # keep the best-ranked weights when the whole split scores them better than the last
    "log_every": 10,
    "max_minutes": 0.0,           # stop (with a checkpoint) after this much training time; 0 = no limit
    "budget_minutes": 0.0,        # plan the run for this wall time, everything included; 0 = count steps
    "dtype": "float32",           # float32 | float64
    "processes": 0,               # data-parallel processes, each on a share of every batch; 0 = one per core, 1 = off
    "objective": "cross_entropy",  # cross_entropy | dpo (preference pairs: [data] task = "preference")
    "beta": 0.1,                  # dpo only: the strength of the pull toward the reference model
}
# Defaults that differ by objective. DPO keeps its last weights: its val_loss is the replies' cross-entropy,
# which preference tuning raises as it works (its own figures are reward_accuracy and logratio_margin), so the
# "best" weights by val_loss would be those of before the tuning.
OBJECTIVE_DEFAULTS = {"dpo": {"restore_best": False}}


# -- loading ------------------------------------------------------------------------------------------------
MAX_CONFIG_BYTES = 1 << 20     # a config file or --set value larger than this is not a config


REPO_ROOT = Path(__file__).resolve().parents[2]     # the checkout holding src/ and configs/


def find_config(name):
    """configs/NAME.toml in the current folder, else in the numformer checkout."""
    for base in (Path.cwd(), REPO_ROOT):
        path = base / "configs" / f"{name}.toml"
        if path.is_file():
            return path
    raise ValueError(f"no configs/{name}.toml in {Path.cwd()} or {REPO_ROOT}")


def load_config(path):
    """Read a TOML config into a dict of sections; a clear error for a missing or malformed file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"config file {path} is a directory; give a .toml file")
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"config file {path} is {path.stat().st_size:,} bytes; a config is a few kB of TOML")
        text = path.read_bytes().decode("utf-8")
        check_bounds(text, f"config file {path}", toml=True, hint="a config nests a few tables and arrays")
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {path} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"config file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def parse_value(text):
    """A --set value in TOML syntax (1e-3, true, "gelu", [1, 2]); a bare word is a string."""
    check_bounds(text, f"--set value {_short(text)}", toml=True, max_bytes=MAX_CONFIG_BYTES,
                 hint="a config value is a number, a word, a string or a short list")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _short(text, limit=40):
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def apply_overrides(config, overrides):
    """Return a copy of config with each "section.key=value" applied."""
    config = copy.deepcopy(config)
    for item in overrides or ():
        if "=" not in item:
            raise ValueError(f"--set expects section.key=value, got {item!r}")
        dotted, value = item.split("=", 1)
        parts = dotted.strip().split(".")
        if len(parts) < 2:
            raise ValueError(f"--set expects section.key=value (for example train.lr=3e-4), got {item!r}")
        node = config
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {dotted}: {p} is not a section")
        node[parts[-1]] = parse_value(value.strip())
    return config


MINUTES = Key(float, 0, 1e6)    # a time limit or budget: at most a million minutes (about two years), so that its
                                # seconds stay a finite number in summary.json


def _train_keys():
    return {
        "max_steps": positive(), "batch_size": positive(), "lr": NONNEG_FLOAT, "eval_every": positive(),
        "checkpoint_every": positive(), "seed": NONNEG_INT,
        "optimizer": Key(str, choices=tuple(sorted(OPTIMIZERS))),
        "beta1": Key(float, 0, 1, open=(False, True)), "beta2": Key(float, 0, 1, open=(False, True)),
        "eps": positive(float), "weight_decay": NONNEG_FLOAT,
        "no_decay": Key(list, choices=tuple(NO_DECAY_KINDS), item=str),
        "momentum": Key(float, 0, 1, open=(False, True)), "nesterov": BOOL,
        "muon_lr": positive(float), "muon_momentum": Key(float, 0, 1, open=(False, True)), "muon_nesterov": BOOL,
        "muon_ns_steps": Key(int, 1, 100),
        "schedule": Key(str, choices=tuple(SCHEDULES)), "cooldown": Key(float, 0, 1, open=(True, False)),
        "cooldown_shape": Key(str, choices=COOLDOWN_SHAPES),
        "warmup_steps": NONNEG_INT, "min_lr": NONNEG_FLOAT,
        "decay_steps": NONNEG_INT, "grad_clip": NONNEG_FLOAT, "grad_accum": positive(), "label_smoothing": FRACTION,
        "eval_batches": NONNEG_INT, "eval_batch_size": NONNEG_INT, "eval_metrics": BOOL,
        "early_stopping_patience": NONNEG_INT, "early_stopping_min_delta": NONNEG_FLOAT, "restore_best": BOOL,
        "log_every": positive(), "max_minutes": MINUTES, "budget_minutes": MINUTES,
        "dtype": Key(str, choices=("float32", "float64")),
        "processes": Key(int, 0, max(64, 4 * (os.cpu_count() or 1))),
        "objective": Key(str, choices=("cross_entropy", "dpo")), "beta": positive(float),
    }


# -- what --resume may change ----------------------------------------------------------------------------------
# `--resume --set train.KEY=VALUE` on a [train] key: every key not listed here takes effect from the resumed step on
# (and is recorded in config.json); those listed are refused, for the reason given. budget_minutes may change, but
# not between 0 and a budget (a run counted in steps and one planned for a time budget are different plans).
# tests/test_resume_overrides.py sets every key on a resumed run and checks that it is in effect or refused.
RESUME_REFUSED = {
    "optimizer": "the checkpoint holds the moments of the run's optimizer",
    "no_decay": "it decides the parameter groups whose optimizer state the checkpoint holds",
    "dtype": "the checkpoint holds the weights and moments in the run's dtype",
    "seed": "the seed drew the run's held-out data and evaluation sample, and the random generators go on from "
            "the checkpoint",
    "objective": "the run's loss and its stored reference log-probabilities belong to it",
}
BUDGET_REFUSED = "a run counted in steps cannot become one planned for a time budget, nor the reverse"


def _refused_train(saved, train):
    """[(key, why)]: the changes from the [train] section ``saved`` to ``train`` that --resume cannot make."""
    changed = [k for k in train if saved.get(k) != train[k]]
    refused = [(k, RESUME_REFUSED[k]) for k in changed if k in RESUME_REFUSED]
    if "budget_minutes" in changed and not (saved.get("budget_minutes") and train["budget_minutes"]):
        refused.append(("budget_minutes", BUDGET_REFUSED))
    return refused


def resume_changes(saved, train):
    """The lines to print about a resumed run's changed [train] values (``saved``: config.json's section, ``train``:
    with the --set values): a note naming the changes that move the learning-rate schedule, and one naming the
    others; ValueError naming the keys that cannot change (``RESUME_REFUSED``)."""
    changed = [k for k in train if saved.get(k) != train[k]]
    refused = _refused_train(saved, train)
    if refused:
        reasons = "; ".join(f"{k} {saved.get(k)!r} -> {train[k]!r} ({why})" for k, why in refused)
        raise ValueError(f"--resume cannot change [train] {reasons}; remove the --set, or start a new run with "
                         f"`numformer train CONFIG --out NEW_DIR`")
    moving = _schedule_keys(saved) | _schedule_keys(train)
    notes = []
    for keys, effect in (([k for k in changed if k in moving], "changes the learning-rate schedule of the resumed "
                                                               "run from this step on"),
                         ([k for k in changed if k not in moving], "in effect from this step on")):
        if keys:
            notes.append("note: " + ", ".join(f"{k} {saved.get(k)} -> {train[k]}" for k in keys) + " " + effect)
    return notes


# `--resume --set` on the other sections: the keys listed here take effect from the resumed step on (and are
# recorded); any other change is refused, for the section's reason: the checkpoint and tokenizer.json were made
# with it. A [lora] section added to a run without one is refused with its keys.
RESUMABLE = {
    "model": FINE_TUNING_OPTIONS,                      # how the same weights compute (as when fine-tuning)
    "lora": ("alpha", "dropout", "use_rslora"),         # the adapters' scaling and dropout, not their shapes
    "data": ("path", "paths", "train_file", "test_path", "tokens_dir"),     # where the same data is now
}
RESUME_REFUSED_SECTIONS = {
    "model": "the checkpoint holds the weights of the run's architecture",
    "lora": "the checkpoint holds the adapters of the run's rank on its target modules",
    "data": "the run's vocabulary (tokenizer.json), held-out splits and examples were made with it",
}


def config_changes(a, b):
    """Every difference between two resolved configs, section by section and key by key in name order:
    [(name, value in a, value in b)], name "section.key", or "[section]" for a section that is not a table in
    both."""
    changes = []
    for section in sorted(set(a) | set(b)):
        x, y = a.get(section), b.get(section)
        if isinstance(x, dict) and isinstance(y, dict):
            changes += [(f"{section}.{k}", x.get(k), y.get(k)) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        elif x != y:
            changes.append((f"[{section}]", x, y))
    return changes


def _section_changes(saved, config):
    """Each difference of [model], [data] and [lora] from ``saved`` to ``config`` (both resolved), in the order
    of the messages: (section, key, old, new, why it may not change, whether --resume may make it: ``RESUMABLE``)."""
    changes = []
    for section, may in RESUMABLE.items():
        a, b = saved.get(section), config.get(section)
        if a is None and b is None:
            continue
        why = RESUME_REFUSED_SECTIONS[section] if a is not None else f"the run was trained without [{section}]"
        allowed = a is not None
        a, b = a or {}, b or {}
        for key in sorted(set(a) | set(b), key=lambda k: (k == "layers", k)):
            if a.get(key) != b.get(key):
                changes.append((section, key, a.get(key), b.get(key), why, allowed and key in may))
    return changes


def resume_section_changes(saved, config):
    """The note on a resumed run's changed [model], [data] and [lora] values (``saved``: config.json, resolved;
    ``config``: resolved with the --set values); ValueError naming every change ``RESUMABLE`` does not allow."""
    changes = _section_changes(saved, config)
    refused = [c for c in changes if not c[5]]
    if refused:
        reasons = "; ".join(f"[{s}] {k} {a!r} -> {b!r} ({why})" for s, k, a, b, why, _ in refused[:4])
        more = f" and {len(refused) - 4} more" if len(refused) > 4 else ""
        raise ValueError(f"--resume cannot change {reasons}{more}; remove the --set, or start a new run with "
                         f"`numformer train CONFIG --out NEW_DIR` (init_from = RUN_DIR starts it from this run's "
                         f"weights)")
    changed = [f"[{s}] {k} {a!r} -> {b!r}" for s, k, a, b, _, allowed in changes if allowed]
    return ["note: " + ", ".join(changed) + " in effect from this step on"] if changed else []


# -- config.json against the checkpoint -------------------------------------------------------------------------
# What --resume --set refuses to change, an edited config.json must not change either: the checkpoint records the
# config its run trained with (run_files.checkpoint_config; an older checkpoint its [model] section, dtype, optimizer
# and, in its generators, its seed), and train.run.resumed_config compares config.json with it by the rules above
# before any data is read.
class NotRecorded:
    """A value the checkpoint does not record but is known to differ from config.json's (the seed of a checkpoint
    written before checkpoints recorded their config: its random generators were seeded otherwise)."""

    def __init__(self, description):
        self.description = description

    def __repr__(self):
        return self.description


def edited_values(trained, saved):
    """The values of config.json (``saved``, resolved) that differ from those the checkpoint's run was trained with
    (``trained``: resolved, with config.json's values where the checkpoint does not record them) and that
    --resume --set could not have changed: [(section, key, config.json's value, the checkpoint's, why)]."""
    train = [("train", k, saved["train"].get(k), trained["train"].get(k), why)
             for k, why in _refused_train(trained["train"], saved["train"])]
    return train + [(s, k, new, old, why) for s, k, old, new, why, allowed in _section_changes(trained, saved)
                    if not allowed]


def check_config_json_against_checkpoint(trained, saved, config_path, checkpoint_path, resuming=True):
    """One ValueError naming each value of config.json (``saved``) that the checkpoint's run was not trained with
    and that --resume could not have set (``edited_values``): config.json was edited. ``resuming``: the advice
    is for resuming the run, else for reading it (eval and the other readers rebuild its data from config.json)."""
    edited = edited_values(trained, saved)
    if not edited:
        return
    items = "; ".join(f"[{s}] {k} {_json(now)}, " + (f"but the run's checkpoint {checkpoint_path} was trained with "
                                                     if n == 0 else "trained with ") + f"{_json(then)} ({why})"
                      for n, (s, k, now, then, why) in enumerate(edited[:4]))
    more = f" and {len(edited) - 4} more" if len(edited) > 4 else ""
    one = len(edited) == 1
    values = "value" if one else "values"
    if not resuming:
        raise ValueError(f"{config_path} was edited: it says {items}{more}; the run's data, splits and model are "
                         f"rebuilt from config.json, so its figures would not be the trained run's: put the "
                         f"checkpoint's {values} back in config.json (or restore it from a copy)")
    raise ValueError(f"{config_path} was edited: it says {items}{more}; --resume cannot change "
                     f"{'this' if one else 'these'}: put the checkpoint's {values} back in "
                     f"config.json (or restore it from a copy) to resume, or start a new run with "
                     f"`numformer train CONFIG --out NEW_DIR`")


def _json(value):
    """A config value as config.json writes it (a value the checkpoint does not record: its description)."""
    return repr(value) if isinstance(value, NotRecorded) else json.dumps(value)


def _schedule_keys(t):
    """The [train] keys the learning-rate schedule of the [train] section ``t`` depends on."""
    keys = {"schedule", "lr", "warmup_steps"}
    if t.get("schedule") in ("linear", "cosine", "wsd"):
        keys |= {"min_lr", "cooldown", "cooldown_shape"} if t["schedule"] == "wsd" else {"min_lr"}
        if t.get("budget_minutes"):
            keys.add("budget_minutes")          # a budget plans the decay over its time
        else:
            keys |= {"decay_steps"} if t.get("decay_steps") else {"decay_steps", "max_steps"}
    return keys


# -- resolving a whole config ---------------------------------------------------------------------------------
def resolve_config(config, tokenizer_state=None, build_task=True, sizes_only=False, recorded_model=None):
    """Validate a raw config and fill in every default; returns (resolved config, task).

    The task is built here because the data decides part of the model
    (vocabulary sizes ...); ``tokenizer_state`` (from a saved run) makes it reuse
    that vocabulary. With ``build_task=False`` (a saved config: its sizes are
    already filled in) no data is read and the task returned is None. With
    ``sizes_only=True`` (counting parameters) the data's sizes come from
    ``Task.sizes_from_config`` where the task can tell them without reading data
    (the task returned is then None), and from a built task otherwise. Raises
    ValueError naming the first problem found; when the task's vocabulary is
    made from [data] (no ``tokenizer_state``, no ``init_from``), that includes a
    [data] value written that the task would not use (``Task.check_written``).
    A fine-tuning source (``[model] init_from``) is read for its architecture and tokenizer, not as the run's
    data (``_init_from_source``); a resumed run gives its own resolved [model] as ``recorded_model`` and the
    source is not read again.
    """
    check_sections(config)
    check_homes("train", config.get("train", {}), TRAIN_DEFAULTS)
    given = check_section("train", config.get("train", {}), _train_keys())
    train = {**TRAIN_DEFAULTS, **OBJECTIVE_DEFAULTS.get(given.get("objective"), {}), **given}
    _check_train_together(train)
    data, task_cls, written = _resolve_data(dict(config.get("data", {})))
    model = dict(config.get("model", {}))
    init_from = model.pop("init_from", None)            # fine-tuning: architecture and tokenizer from the source
    if init_from is not None and (not isinstance(init_from, str) or not init_from):
        raise ValueError(f"[model] init_from = {init_from!r} must be a string: a run folder, a Hugging Face "
                         f"folder or a hub id")
    if init_from is not None and Path(init_from).expanduser().is_dir():    # a folder: stored resolved, as [data]
        init_from = str(Path(init_from).expanduser().resolve())           # path, so the run resumes from anywhere
    if build_task and tokenizer_state is None and init_from is None:     # a new vocabulary made from [data]
        task_cls.check_written(written)
    source_model = None
    if init_from is not None and build_task:
        source_model, tokenizer_state = _init_from_source(init_from, recorded_model, tokenizer_state)
        check_source_type(init_from, source_model["type"], model.get("type", written.get("model_type")),
                          data["task"], getattr(task_cls, "model_types", (task_cls.model_type,)))
        model.setdefault("type", source_model["type"])
    kind, model = _resolve_model_kind(model, data, task_cls, written)
    model = apply_preset(kind, model, fine_tuning=init_from is not None)
    valid = _model_defaults(kind)
    check_homes("model", model, valid)
    model = check_section("model", model, model_keys(), valid)
    task = None
    if build_task:
        model, task = _add_data_sizes(model, data, task_cls, train["seed"], tokenizer_state, sizes_only,
                                      init_from, source_model)
    missing = sorted(k for k, d in valid.items() if d is inspect.Parameter.empty and k not in model)
    if missing:
        raise ValueError(f"[model] needs {missing}")
    full_model = {"type": kind, **{k: (None if d is inspect.Parameter.empty else d) for k, d in valid.items()},
                  **model, **({"init_from": init_from} if init_from is not None else {})}
    check_model_together(full_model)
    resolved = {"model": full_model, "data": data, "train": train}
    if "lora" in config:
        resolved["lora"] = resolve_lora(config["lora"])
    return resolved, task


def _init_from_source(init_from, recorded_model, tokenizer_state):
    """(the init_from model's [model] section, the tokenizer state the task takes). A resumed run's own [model]
    (``recorded_model``) holds the source's architecture as the run began, and its tokenizer.json
    (``tokenizer_state``) the tokenizer, so resuming needs neither the source nor that it stayed the same (a
    source run trained on). Otherwise the source is read: a new run, or a run of a task of the user's that keeps
    no tokenizer.json (it took the source's tokenizer, and takes it again). The source's files are not the
    run's data (``fingerprint.not_data``)."""
    recorded = None if recorded_model is None else {k: v for k, v in recorded_model.items() if k != "init_from"}
    if recorded is not None and tokenizer_state is not None:
        return recorded, tokenizer_state
    with fingerprint.not_data():
        source = read_source(init_from)
    return source.model if recorded is None else recorded, tokenizer_state or source.tokenizer_state


def _lora_keys():
    return {"r": positive(), "alpha": positive(float), "dropout": Key(float, 0, 1, open=(False, True)),
            "target_modules": Key(list, choices=tuple(TARGET_MODULES), item=str), "use_rslora": BOOL}


def resolve_lora(section):
    """The [lora] section with its defaults (``numformer.lora.LORA_DEFAULTS``); one ValueError naming a bad
    key or value and the valid ones."""
    lora = {**LORA_DEFAULTS, **check_section("lora", section, _lora_keys())}
    lora["target_modules"] = check_lora_options(**lora)
    return lora


def _add_data_sizes(model, data, task_cls, seed, tokenizer_state, sizes_only, init_from, source_model):
    """([model] with the sizes the data decides, the task or None): the task's ``model_config`` (the task is
    built, its data read), or with ``sizes_only`` its ``sizes_from_config`` where it can tell them; a
    fine-tuned model takes the source's architecture (``merge_init_from``)."""
    task, from_data = None, None
    if sizes_only:
        from_data = {} if source_model is not None else task_cls.sizes_from_config(data)
    if from_data is None:
        task = make_task(data, seed=seed, tokenizer_state=tokenizer_state)
        from_data = task.model_config()
    if source_model is not None:
        model, from_data = merge_init_from(init_from, model, source_model, from_data, data), {}
    clash = sorted(k for k in from_data if k in model and model[k] != from_data[k])
    if clash:
        moved = "".join(f"; {k} is a [data] key: write it there (--set data.{k}={_toml_text(model[k])})"
                        for k in clash if k in data and k != "vocab_size")    # a vocabulary is the tokenizer's
        raise ValueError(f"[model] {clash} are set by the data ({ {k: from_data[k] for k in clash} }); "
                         f"remove them from [model]{moved}")
    return {**model, **from_data}, task


def _resolve_data(data):
    """([data] with every default filled in, the task class, the values written). A task of the user's own is
    recorded with ``task_module``, the module that registers it, so that reading the run imports it again."""
    if "task" not in data:
        raise ValueError(f"[data] needs a task; one of {sorted(import_builtin_tasks())}")
    name = data["task"]
    task_cls = find_task(name, data.get("task_module"))
    module = data.get("task_module") or task_module_of(task_cls)
    values = {k: v for k, v in data.items() if k not in ("task", "task_module")}
    check_homes("data", values, task_cls.data_keys)
    values = check_data_section(values, task_cls)
    if values.get("path"):        # read relative to where the config is used; stored resolved
        values["path"] = str(Path(values["path"]).expanduser().resolve())
    return ({"task": name, **({"task_module": module} if module else {}), **task_cls.data_keys, **values},
            task_cls, values)


def _resolve_model_kind(model, data, task_cls, written):
    """The model type ([model] type, else the task's; [data] model_type follows it). Returns (kind, model)."""
    data_kind = written.get("model_type")                 # only a value the user wrote
    kind = model.pop("type", data_kind or data.get("model_type", task_cls.model_type))
    if not isinstance(kind, str) or kind not in MODEL_TYPES:
        raise ValueError(f"[model] type = {kind!r} is not a model type{did_you_mean(kind, MODEL_TYPES)}; choose one "
                         f"of {sorted(MODEL_TYPES)}")
    if data_kind is not None and data_kind != kind:
        raise ValueError(f"[data] model_type = {data_kind!r} contradicts [model] type = {kind!r}; "
                         f"remove [data] model_type (it follows [model] type)")
    if "model_type" in task_cls.data_keys:
        data["model_type"] = kind
    allowed = getattr(task_cls, "model_types", (task_cls.model_type,))
    if kind not in allowed:
        raise ValueError(f"task {data['task']!r} trains a {' or '.join(allowed)} model, but [model] type = {kind!r}")
    return kind, model


def merge_init_from(source, model, source_model, from_data, data):
    """The [model] section of a run fine-tuned from ``source``: the source's architecture, with the
    ``FINE_TUNING_OPTIONS`` the user set; the data must fit it (vocabularies, block_size or max_len:
    ``_check_data_fits_source``, ``data`` being the run's [data] section; and a classifier's data the source's
    number of classes: its output layer has one row a class)."""
    changed = sorted(k for k, v in model.items() if k not in FINE_TUNING_OPTIONS and k != "type"
                     and source_model.get(k) != v)
    if changed:
        raise ValueError(f"[model] {changed} differ from the init_from model {source!r} "
                         f"({ {k: source_model.get(k) for k in changed} }); a fine-tuned model keeps its "
                         f"architecture: remove them (only {list(FINE_TUNING_OPTIONS)} may change)")
    if model.get("type", source_model["type"]) != source_model["type"]:
        raise ValueError(f"[model] type = {model['type']!r} but init_from {source!r} is a {source_model['type']!r}")
    _check_data_fits_source(source, source_model, from_data, data)
    classes, source_classes = from_data.get("n_classes"), source_model.get("n_classes")
    if classes is not None and source_classes is not None and classes != source_classes:
        raise ValueError(f"the data has {classes} classes but the init_from model {source!r} classifies into "
                         f"{source_classes} (n_classes, its output layer's rows): fine-tune it on data of its "
                         f"{source_classes} classes, the same labels in the same order, or train a new model "
                         f"on this data (without [model] init_from)")
    return {**{k: v for k, v in source_model.items() if k != "type"}, **model}


_NEW_MODEL = "or train a new model on this data (without [model] init_from)"
_SOURCE_LIMITS = {      # a size the data decides: (what it is, the fix), {n} the init_from model's figure
    "vocab_size": ("the tokenizer's vocabulary", "use the model's own tokenizer"),
    "block_size": ("[data] block_size", "set [data] block_size <= {n}"),
    "src_vocab_size": ("the source-language vocabulary", f"use the model's own tokenizers (its run's "
                                                         f"tokenizer.json), {_NEW_MODEL}"),
    "tgt_vocab_size": ("the target-language vocabulary", f"use the model's own tokenizers (its run's "
                                                         f"tokenizer.json), {_NEW_MODEL}"),
    "max_len": ("the data's max_len", f"its {{positional}} position table has {{n}} rows: {{shorter}}, {_NEW_MODEL}"),
}


def _shorter(data, n):
    """The fix for data longer than a source's ``n`` positions: [data] max_len where the task has that key, else
    shorter sequences (a synthetic task's max_len follows its longest length)."""
    if "max_len" in data:
        return f"set [data] max_len <= {n}"
    return "make the sequences shorter ([data] length and test_lengths: max_len follows the longest)"


def _check_data_fits_source(source, source_model, from_data, data):
    """One ValueError when a size the data decides exceeds the init_from model ``source``'s: a vocabulary
    (``vocab_size``, a Transformer's ``src_vocab_size`` / ``tgt_vocab_size``: ids past its embedding rows), a
    GPT's ``block_size``, or the ``max_len`` of a classifier or Transformer whose positions are a table of max_len
    rows (learned or sinusoidal). A smaller size fits: a shorter max_len reads the table's first rows, as a
    shorter block_size does; RoPE and ALiBi positions have no table, so their max_len is not compared. ``data``:
    the run's [data] section, for the advice (``_shorter``)."""
    for key, (what, fix) in _SOURCE_LIMITS.items():
        if key not in from_data or key not in source_model or from_data[key] <= source_model[key]:
            continue
        if key == "max_len" and source_model.get("positional") in ("rope", "alibi"):
            continue
        n, positional = source_model[key], source_model.get("positional")
        raise ValueError(f"{what} ({from_data[key]}) exceeds the {key} of the init_from model {source!r} "
                         f"({n}); {fix.format(n=n, positional=positional, shorter=_shorter(data, n))}")


def _model_defaults(kind):
    return model_arguments(kind)


def _check_train_together(t):
    """Rules between [train] keys."""
    if t["schedule"] in ("linear", "cosine", "wsd") and t["min_lr"] > t["lr"]:
        raise ValueError(f"[train] min_lr = {t['min_lr']} is above lr = {t['lr']}; the decay goes down to min_lr")
    if t["optimizer"] == "muon" and t["lr"] <= 0:
        raise ValueError(f"[train] optimizer = \"muon\" needs lr > 0, got {t['lr']}: the schedule scales "
                         f"muon_lr by its value over lr")
    if t["schedule"] == "noam" and t["warmup_steps"] <= 0:
        raise ValueError("[train] warmup_steps must be > 0 for the noam schedule")
    if not t["budget_minutes"]:         # a time budget plans the decay by time: decay_steps is not read
        check_decay(t["schedule"], t["warmup_steps"], t["decay_steps"], "[train] ")
    if t["objective"] == "dpo" and t["processes"] > 1:
        raise ValueError(f"[train] objective = \"dpo\" trains in one process; set [train] processes = 1 "
                         f"(got {t['processes']})")
    if t["processes"] > t["batch_size"]:
        raise ValueError(f"[train] processes = {t['processes']} is more than batch_size = {t['batch_size']}: "
                         f"each process needs at least one example of a batch")


def schedule_warning(t) -> str | None:
    """A warning line when the warmup of the resolved [train] section ``t`` outlasts the run (counted in
    steps): lr never reaches its peak. A warning, not an error: a quick run (``--quick``, a smoke test)
    cuts max_steps and keeps the config's warmup on purpose."""
    w, n = t["warmup_steps"], t["max_steps"]
    if t["schedule"] == "noam" or t["budget_minutes"] or not 0 < n <= w:
        return None
    last = t["lr"] * n / (w + 1)                # the warmup's lr at the last step, n - 1 (schedules.py)
    return (f"warning: [train] warmup_steps = {w} is not below max_steps = {n}: the run ends while warming "
            f"up, at lr {last:.3g} instead of lr = {t['lr']:g}; lower warmup_steps or raise max_steps")


def check_saved_config(config, where):
    """A run's config.json, checked like a TOML config (without reading its data); returns it resolved.
    ``where`` names the file in the message."""
    try:
        resolved, _ = resolve_config(config, build_task=False)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where} is damaged ({type(e).__name__}: {e}); restore it or retrain") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return resolved


def _homes(key):
    """The sections that have ``key`` (any model type's and any built-in task's): ["train"] for lr; [data] first,
    whose sizes (block_size, vocab_size, max_len) decide [model]'s."""
    data_keys = {"task", "task_module", *DATA_KEYS, *(k for t in import_builtin_tasks().values()
                                                     for k in t.data_keys)}
    return [name for name, keys in (("data", data_keys), ("train", TRAIN_DEFAULTS), ("model", model_keys()),
                                    ("lora", LORA_DEFAULTS)) if key in keys]


def _home_of(key) -> str:
    """Where a loose top-level ``key`` goes: "lr belongs in [train]" (or the sections that have it)."""
    homes = [f"[{name}]" for name in _homes(key)]
    return f"{key} belongs in {' or '.join(homes)}" if homes else f"{key} is no key of any section (a typo?)"


def check_homes(where, values, valid):
    """One ValueError for the first key of section ``where`` (``values``) that it does not have (``valid``) but
    another section does: the most likely slip, answered with where the key goes rather than a near name of
    this section ("block_size is a [data] key ..." where [train] would suggest batch_size)."""
    for key in sorted(k for k in values if k not in valid):
        homes = [h for h in _homes(key) if h != where]
        if homes:
            raise ValueError(f"{key} is a [{homes[0]}] key, not a [{where}] one: write it under [{homes[0]}] "
                             f"(on the command line: --set {homes[0]}.{key}={_toml_text(values[key])})")


def _toml_text(value):
    """``value`` as written after --set: TOML's true/false, quoted strings, numbers as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def check_sections(config):
    """A config is a table of the known sections: one ValueError naming an unknown one (and the closest), or
    the keys written above the first section (and the section each belongs in)."""
    loose = [k for k, v in config.items() if not isinstance(v, dict)] if isinstance(config, dict) else None
    if loose is None or set(loose) & set(SECTIONS):
        raise ValueError("a config is a table of sections [model], [data] and [train]")
    if loose:                       # a key written above the first [section] header of the TOML file
        raise ValueError(f"{', '.join(map(repr, loose))} above the first [section]: a config is a table of "
                         f"sections [model], [data] and [train]; {'; '.join(_home_of(k) for k in loose)}: "
                         f"move {'it' if len(loose) == 1 else 'each'} below its section's header")
    unknown = sorted(set(config) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}{did_you_mean(unknown, SECTIONS)}; a config has [model], "
                         f"[data] and [train], and [lora] for LoRA adapters")


def _runs_inside(folder, most=3):
    """The names of the first ``most`` folders in ``folder`` that hold a config.json (a folder of runs)."""
    try:
        return sorted(p.name for p in Path(folder).iterdir() if (p / "config.json").is_file())[:most]
    except OSError:                 # unreadable: nothing to suggest
        return []


def load_config_json(run_dir, hf_advice=None):
    """The run's config.json, checked like a TOML config (every key's type and range). A Hugging Face model's
    config.json (a ``model_type`` and no [model] section) is refused in one line saying so, with ``hf_advice``
    (what to do with such a folder) or else the advice to import it with ``numformer import-hf`` first."""
    check_run_dir(run_dir)
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        inside = _runs_inside(run_dir)
        if inside:                  # a folder of runs (runs/): name them, rather than train among them
            raise ValueError(f"{run_dir} is not a numformer run folder (no config.json) but holds run folders: "
                             f"give one of them, e.g. {', '.join(str(Path(run_dir) / n) for n in inside)}")
        raise ValueError(f"{run_dir} is not a numformer run folder (no config.json); train one with "
                         f"`numformer train CONFIG --out {run_dir}`")
    saved = read_run_config(run_dir)
    if isinstance(saved, dict) and "model" not in saved and isinstance(saved.get("model_type"), str):
        raise ValueError(f"{run_dir} is a Hugging Face model folder (its config.json has model_type "
                         f"{saved['model_type']!r}), not a numformer run folder: " +
                         (hf_advice or f"import it first with `numformer import-hf {run_dir} --out RUN_DIR`"))
    return check_saved_config(saved, path)
