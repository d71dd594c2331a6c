"""Experiment configs: load a TOML file, apply ``--set`` overrides, check every key, fill in every default.

A config has three sections. ``[data]`` names a task and its options,
``[model]`` the model's constructor arguments (its ``type`` must be the
task's model family; arguments fixed by the data — vocabulary sizes, number
of classes, padding ids, context length — come from the task and must not be
repeated), and ``[train]`` the keys of ``TRAIN_DEFAULTS``.

Every key has a type and a range (a ``Key``: ``_train_keys()``, ``_model_keys()``, ``DATA_KEYS``),
checked before anything is written; a wrong key or value raises one
ValueError naming it, with the valid keys or the allowed range. A run's
``config.json`` goes through the same checks when it is read back.
"""
from __future__ import annotations

import copy
import inspect
import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

SECTIONS = ("model", "data", "train")

TRAIN_DEFAULTS = {
    "max_steps": 1000,            # optimizer updates
    "batch_size": 32,
    "lr": 1e-3,                   # peak learning rate (for "noam": the factor of the paper's formula)
    "eval_every": 100,            # steps between evaluations on the validation split
    "checkpoint_every": 500,      # steps between checkpoints (also written at the end and on Ctrl-C)
    "seed": 1337,
    "optimizer": "adamw",         # adamw | adam | sgd
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "weight_decay": 0.0,
    "no_decay": ["bias", "norm"],  # parameter kinds without weight decay: bias, norm, embedding
    "momentum": 0.0,              # sgd only
    "nesterov": False,            # sgd only
    "schedule": "constant",       # constant | linear | cosine | noam
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
    "dtype": "float32",           # float32 | float64
    "processes": 0,               # data-parallel processes, each on a share of every batch; 0 = one per core, 1 = off
}


# -- loading ------------------------------------------------------------------------------------------------
def load_config(path):
    """Read a TOML config into a dict of sections; a clear error for a missing or malformed file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"config file {path} is a directory; give a .toml file")
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {path} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"config file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def parse_value(text):
    """A --set value in TOML syntax (1e-3, true, "gelu", [1, 2]); a bare word is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


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


# -- the type and range of every key --------------------------------------------------------------------------
@dataclass(frozen=True)
class Key:
    """What a config value may be: ``kind`` (int, float, bool, str, list), ``lo``/``hi`` bounds (``open``
    makes them strict), ``choices`` for a string or the entries of a list, ``none`` when null is allowed."""

    kind: type
    lo: float | None = None
    hi: float | None = None
    open: tuple = (False, False)
    choices: tuple | None = None
    none: bool = False
    item: type | None = None      # the type of a list's entries

    def describe(self):
        if self.kind is str and self.choices is not None:
            return f"one of {list(self.choices)}"
        what = {int: "an integer", float: "a number", bool: "a boolean", str: "a string",
                list: "a list"}[self.kind]
        if self.item is not None:
            what += {int: " of integers", str: " of strings"}[self.item]
        parts = []
        if self.lo is not None and self.hi is not None:
            interval = f"{'(' if self.open[0] else '['}{self.lo:g}, {self.hi:g}{')' if self.open[1] else ']'}"
            return f"in {interval}" if self.kind is float else f"{what} in {interval}"
        if self.lo is not None:
            parts.append(f"{'>' if self.open[0] else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"{'<' if self.open[1] else '<='} {self.hi:g}")
        if self.choices is not None:
            parts.append(f"with entries among {list(self.choices)}")
        return what + (" " + " and ".join(parts) if parts else "") + (" (or null)" if self.none else "")

    def check(self, where, key, value):
        """``value`` converted (an int where a float is expected); ValueError naming ``[where] key``."""
        if value is None and self.none:
            return None
        if not _has_kind(value, self.kind) or (self.item and not all(_has_kind(v, self.item) for v in value)):
            raise ValueError(f"[{where}] {key} = {value!r} should be {self.describe()}")
        if self.kind is float:
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"[{where}] {key} = {value!r} should be a finite number")
        if not self._in_range(value):
            problem = "is not allowed" if self.choices is not None else "is out of range"
            raise ValueError(f"[{where}] {key} = {value!r} {problem}; {key} must be {self.describe()}")
        return list(value) if self.kind is list else value

    def _in_range(self, v):
        if self.choices is not None:
            return (set(v) <= set(self.choices)) if self.kind is list else v in self.choices
        if self.lo is not None and (v <= self.lo if self.open[0] else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.open[1] else v <= self.hi)


def _has_kind(value, kind):
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, (list, tuple))
    return isinstance(value, kind)


def _pos(kind=int, none=False):
    return Key(kind, 0, open=(True, False), none=none) if kind is float else Key(kind, 1, none=none)


NONNEG_INT, NONNEG_FLOAT, FRACTION, BOOL, STR = Key(int, 0), Key(float, 0), Key(float, 0, 1), Key(bool), Key(str)


def _train_keys():
    from .optim import OPTIMIZERS, SCHEDULES
    from .optim.optimizers import NO_DECAY_KINDS

    return {
        "max_steps": _pos(), "batch_size": _pos(), "lr": NONNEG_FLOAT, "eval_every": _pos(),
        "checkpoint_every": _pos(), "seed": NONNEG_INT,
        "optimizer": Key(str, choices=tuple(sorted(OPTIMIZERS))),
        "beta1": Key(float, 0, 1, open=(False, True)), "beta2": Key(float, 0, 1, open=(False, True)),
        "eps": _pos(float), "weight_decay": NONNEG_FLOAT,
        "no_decay": Key(list, choices=tuple(NO_DECAY_KINDS), item=str),
        "momentum": Key(float, 0, 1, open=(False, True)), "nesterov": BOOL,
        "schedule": Key(str, choices=tuple(SCHEDULES)), "warmup_steps": NONNEG_INT, "min_lr": NONNEG_FLOAT,
        "decay_steps": NONNEG_INT, "grad_clip": NONNEG_FLOAT, "grad_accum": _pos(), "label_smoothing": FRACTION,
        "eval_batches": NONNEG_INT, "eval_batch_size": NONNEG_INT, "eval_metrics": BOOL,
        "early_stopping_patience": NONNEG_INT, "early_stopping_min_delta": NONNEG_FLOAT, "restore_best": BOOL,
        "log_every": _pos(), "max_minutes": NONNEG_FLOAT, "dtype": Key(str, choices=("float32", "float64")),
        "processes": Key(int, 0, max(64, 4 * (os.cpu_count() or 1))),
    }


def _model_keys():
    from .models.classifier import POOLINGS
    from .nn.attention import MultiHeadAttention
    from .nn.layers import FEED_FORWARD_ACTIVATIONS, NORMS
    from .nn.positional import POSITIONAL_KINDS

    ids = Key(int, 0, none=True)
    return {
        "vocab_size": _pos(), "src_vocab_size": _pos(), "tgt_vocab_size": _pos(), "n_classes": _pos(),
        "block_size": _pos(), "max_len": _pos(), "n_layers": _pos(), "n_heads": _pos(), "d_model": _pos(),
        "d_ff": _pos(none=True), "n_encoder_layers": _pos(none=True), "n_decoder_layers": _pos(none=True),
        "dropout": Key(float, 0, 1, open=(False, True)), "layer_norm_eps": _pos(float),
        "positional": Key(str, choices=POSITIONAL_KINDS), "n_kv_heads": _pos(none=True), "rope_theta": _pos(float),
        "activation": Key(str, choices=FEED_FORWARD_ACTIVATIONS),
        "norm": Key(str, choices=tuple(NORMS)), "attention": Key(str, choices=MultiHeadAttention.ATTENTION_KINDS),
        "pooling": Key(str, choices=POOLINGS), "norm_first": BOOL, "tie_weights": BOOL, "bias": BOOL,
        "scale_embeddings": BOOL, "share_embeddings": BOOL, "tie_output": BOOL, "gradient_checkpointing": BOOL,
        "final_norm": Key(bool, none=True), "attn_bias": Key(bool, none=True),
        "qkv_bias": Key(bool, none=True), "sliding_window": _pos(none=True), "padding_idx": ids,
        "pad_id": ids, "src_pad_id": ids, "tgt_pad_id": ids, "bos_id": ids, "eos_id": ids,
    }


# [data] keys shared by name across tasks; any other key has the type of its default (ints >= 0).
DATA_KEYS = {
    "length": _pos(), "min_length": NONNEG_INT, "full_length_fraction": FRACTION,
    "test_lengths": Key(list, item=int), "n_val": _pos(), "n_test": NONNEG_INT, "eval_batch_size": _pos(),
    "vocab": Key(int, 2), "n_values": Key(int, 2), "block_size": _pos(), "val_fraction": Key(float, 0, 1, (True, True)),
    "max_len": Key(int, 2), "vocab_size": _pos(), "min_freq": _pos(), "val_size": NONNEG_INT, "buckets": _pos(),
    "token_dropout": Key(float, 0, 1, open=(False, True)), "beam_size": _pos(), "length_penalty": NONNEG_FLOAT,
    "tokenizer": Key(str, choices=("word", "bpe")), "truncate": Key(str, choices=("head", "tail", "head_tail")),
}


def _key_for(default):
    """The rule for a key known only by its default value."""
    if default is None or default is inspect.Parameter.empty:
        raise TypeError("a key without a default value of a known type needs a rule (a Key) in numformer.config")
    kind = next(k for k in (bool, int, float, str, list) if _has_kind(default, k))
    return {int: NONNEG_INT, float: Key(float)}.get(kind, Key(kind))


def check_section(where, values, rules, defaults=None):
    """Check one section's keys: none unknown, each of its type and range. Returns the converted values.

    ``rules``: {key: Key} for the keys with a known rule; ``defaults``: {key: default} for the valid keys
    (a key without a rule follows its default's type). Unknown keys raise one error listing the valid keys.
    """
    valid = rules if defaults is None else defaults
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in [{where}]; valid keys: {sorted(valid)}")
    out = {}
    for key, value in values.items():
        rule = rules.get(key) or _key_for(defaults[key])
        out[key] = rule.check(where, key, value)
    return out


def check_data_section(data, task_cls):
    """A task's [data] keys (without ``task``) against its ``data_keys``; returns the converted values."""
    return check_section("data", data, DATA_KEYS, task_cls.data_keys)


# -- resolving a whole config ---------------------------------------------------------------------------------
def resolve_config(config, tokenizer_state=None, build_task=True, sizes_only=False):
    """Validate a raw config and fill in every default; returns (resolved config, task).

    The task is built here because the data decides part of the model
    (vocabulary sizes ...); ``tokenizer_state`` (from a saved run) makes it reuse
    that vocabulary. With ``build_task=False`` (a saved config: its sizes are
    already filled in) no data is read and the task returned is None. With
    ``sizes_only=True`` (counting parameters) the data's sizes come from
    ``Task.sizes_from_config`` where the task can tell them without reading data
    (the task returned is then None), and from a built task otherwise. Raises
    ValueError naming the first problem found.
    """
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise ValueError("a config is a table of sections [model], [data] and [train]")
    unknown = sorted(set(config) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; a config has [model], [data] and [train]")
    train = {**TRAIN_DEFAULTS, **check_section("train", config.get("train", {}), _train_keys())}
    _check_train_together(train)
    data, task_cls, written = _resolve_data(dict(config.get("data", {})))
    model = dict(config.get("model", {}))
    init_from = model.pop("init_from", None)            # fine-tuning: architecture and tokenizer from the source
    if init_from is not None and (not isinstance(init_from, str) or not init_from):
        raise ValueError(f"[model] init_from = {init_from!r} must be a string: a run folder, a Hugging Face "
                         f"folder or a hub id")
    source_model = None
    if init_from is not None and build_task:
        from .interop.hf import pretrained_source

        source_model, source_tokenizer = pretrained_source(init_from)
        tokenizer_state = tokenizer_state or source_tokenizer
        model.setdefault("type", source_model["type"])
    kind, model = _resolve_model_kind(model, data, task_cls, written)
    valid = _model_defaults(kind)
    model = check_section("model", model, _model_keys(), valid)
    task = None
    if build_task:
        model, task = _add_data_sizes(model, data, task_cls, train["seed"], tokenizer_state, sizes_only,
                                      init_from, source_model)
    missing = sorted(k for k, d in valid.items() if d is inspect.Parameter.empty and k not in model)
    if missing:
        raise ValueError(f"[model] needs {missing}")
    full_model = {"type": kind, **{k: (None if d is inspect.Parameter.empty else d) for k, d in valid.items()},
                  **model, **({"init_from": init_from} if init_from is not None else {})}
    _check_model_together(full_model)
    return {"model": full_model, "data": data, "train": train}, task


def _add_data_sizes(model, data, task_cls, seed, tokenizer_state, sizes_only, init_from, source_model):
    """([model] with the sizes the data decides, the task or None): the task's ``model_config`` (the task is
    built, its data read), or with ``sizes_only`` its ``sizes_from_config`` where it can tell them; a
    fine-tuned model takes the source's architecture (``merge_init_from``)."""
    from .data import make_task

    task, from_data = None, None
    if sizes_only:
        from_data = {} if source_model is not None else task_cls.sizes_from_config(data)
    if from_data is None:
        task = make_task(data, seed=seed, tokenizer_state=tokenizer_state)
        from_data = task.model_config()
    if source_model is not None:
        from .interop.hf import merge_init_from

        model, from_data = merge_init_from(init_from, model, source_model, from_data), {}
    clash = sorted(k for k in from_data if k in model and model[k] != from_data[k])
    if clash:
        raise ValueError(f"[model] {clash} are set by the data ({ {k: from_data[k] for k in clash} }); "
                         f"remove them from [model]")
    return {**model, **from_data}, task


def _resolve_data(data):
    from .data.base import import_builtin_tasks

    tasks = import_builtin_tasks()
    if "task" not in data:
        raise ValueError(f"[data] needs a task; one of {sorted(tasks)}")
    name = data["task"]
    if not isinstance(name, str) or name not in tasks:
        raise ValueError(f"[data] task = {name!r} is not a known task; choose one of {sorted(tasks)}")
    task_cls = tasks[name]
    values = check_data_section({k: v for k, v in data.items() if k != "task"}, task_cls)
    if values.get("path"):        # read relative to where the config is used; stored resolved
        values["path"] = str(Path(values["path"]).expanduser().resolve())
    return {"task": name, **task_cls.data_keys, **values}, task_cls, values


def _resolve_model_kind(model, data, task_cls, written):
    """The model type ([model] type, else the task's; [data] model_type follows it). Returns (kind, model)."""
    from .models import MODEL_TYPES

    data_kind = written.get("model_type")                 # only a value the user wrote
    kind = model.pop("type", data_kind or data.get("model_type", task_cls.model_type))
    if not isinstance(kind, str) or kind not in MODEL_TYPES:
        raise ValueError(f"[model] type = {kind!r} is not a model type; choose one of {sorted(MODEL_TYPES)}")
    if data_kind is not None and data_kind != kind:
        raise ValueError(f"[data] model_type = {data_kind!r} contradicts [model] type = {kind!r}; "
                         f"remove [data] model_type (it follows [model] type)")
    if "model_type" in task_cls.data_keys:
        data["model_type"] = kind
    allowed = getattr(task_cls, "model_types", (task_cls.model_type,))
    if kind not in allowed:
        raise ValueError(f"task {data['task']!r} trains a {' or '.join(allowed)} model, but [model] type = {kind!r}")
    return kind, model


def check_model_section(model):
    """A [model] section on its own (no [data]: every size written in it), checked like a whole config's;
    returns it with every default filled in."""
    model = dict(model)
    from .models import MODEL_TYPES

    kind = model.pop("type", None)
    if not isinstance(kind, str) or kind not in MODEL_TYPES:
        raise ValueError(f"[model] type = {kind!r} is not a model type; choose one of {sorted(MODEL_TYPES)}")
    valid = _model_defaults(kind)
    model = check_section("model", model, _model_keys(), valid)
    missing = sorted(k for k, d in valid.items() if d is inspect.Parameter.empty and k not in model)
    if missing:
        raise ValueError(f"[model] needs {missing} (or a [data] section, which sets the sizes)")
    full = {"type": kind, **{k: d for k, d in valid.items() if d is not inspect.Parameter.empty}, **model}
    _check_model_together(full)
    return full


def _model_defaults(kind):
    from .models import model_arguments

    return model_arguments(kind)


def _check_train_together(t):
    """Rules between [train] keys."""
    if t["schedule"] in ("linear", "cosine") and t["min_lr"] > t["lr"]:
        raise ValueError(f"[train] min_lr = {t['min_lr']} is above lr = {t['lr']}; the decay goes down to min_lr")
    if t["schedule"] == "noam" and t["warmup_steps"] <= 0:
        raise ValueError("[train] warmup_steps must be > 0 for the noam schedule")
    if t["processes"] > t["batch_size"]:
        raise ValueError(f"[train] processes = {t['processes']} is more than batch_size = {t['batch_size']}: "
                         f"each process needs at least one example of a batch")


def _check_model_together(m):
    """Rules between [model] keys."""
    d_model, n_heads = m.get("d_model"), m.get("n_heads")
    if d_model and n_heads and d_model % n_heads:
        raise ValueError(f"[model] d_model = {d_model} must be divisible by n_heads = {n_heads}")


def check_saved_config(config, where):
    """A run's config.json, checked like a TOML config (without reading its data); returns it resolved.
    ``where`` names the file in the message."""
    try:
        resolved, _ = resolve_config(config, build_task=False)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where} is damaged ({type(e).__name__}: {e}); restore it or retrain") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return resolved
