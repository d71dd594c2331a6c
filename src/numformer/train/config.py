"""Resolving and validating an experiment config before any work starts.

A config has three sections. ``[data]`` names a task and its options,
``[model]`` the model's constructor arguments (its ``type`` must be the
task's model family; arguments fixed by the data — vocabulary sizes, number
of classes, padding ids, context length — come from the task and must not be
repeated), and ``[train]`` the keys of ``TRAIN_DEFAULTS``. Every unknown key
or value of the wrong type is reported in one error that lists the valid keys.
"""
from __future__ import annotations

import copy

from ..data import make_task
from ..data.base import TASKS, _import_builtin_tasks
from ..models import MODEL_TYPES, model_arguments

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
    "eval_batches": 0,            # cap on validation batches per periodic evaluation (the final one uses all); 0 = all
    "eval_batch_size": 0,         # 0 = batch_size
    "eval_metrics": True,         # also compute the task's metrics (accuracy, exact match ...) at each evaluation
    "early_stopping_patience": 0,  # evaluations without improvement before stopping; 0 = never stop early
    "early_stopping_min_delta": 0.0,
    "restore_best": True,         # end with the weights of the best validation loss
    "log_every": 10,
    "max_minutes": 0.0,           # stop (with a checkpoint) after this much training time; 0 = no limit
    "dtype": "float32",           # float32 | float64
    "processes": 0,               # data-parallel processes, each on a share of every batch; 0 = one per core, 1 = off
}

SECTIONS = ("model", "data", "train")


def _type_name(v):
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}.get(
        type(v), type(v).__name__)


def _check_type(section, key, value, default):
    """Values must have the type of the default (an int is accepted where a float is expected)."""
    if default is None:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ValueError(f"[{section}] {key} = {value!r} should be {_type_name(default)} "
                         f"(like the default, {default!r})")
    return value


def _validate_section(section, values, defaults, extra_allowed=()):
    unknown = sorted(set(values) - set(defaults) - set(extra_allowed))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in [{section}]; valid keys: {sorted(defaults)}")
    return {k: _check_type(section, k, v, defaults.get(k)) for k, v in values.items()}


def resolve_config(config, tokenizer_state=None):
    """Validate a raw config and fill in every default; returns (resolved config, task).

    The task is built here because the data decides part of the model
    (vocabulary sizes ...); ``tokenizer_state`` (from a saved run) makes it reuse
    that vocabulary. Raises ValueError naming the first problem found.
    """
    config = copy.deepcopy(config)
    unknown = sorted(set(config) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; a config has [model], [data] and [train]")
    train = {**TRAIN_DEFAULTS, **_validate_section("train", config.get("train", {}), TRAIN_DEFAULTS)}
    _check_train_values(train)

    data = dict(config.get("data", {}))
    if "task" not in data:
        _import_builtin_tasks()
        raise ValueError(f"[data] needs a task; one of {sorted(TASKS)}")
    _import_builtin_tasks()
    if data["task"] not in TASKS:
        raise ValueError(f"[data] task = {data['task']!r} is not a known task; choose one of {sorted(TASKS)}")
    task_cls = TASKS[data["task"]]
    task_values = _validate_section("data", {k: v for k, v in data.items() if k != "task"}, task_cls.data_keys)
    data = {"task": data["task"], **task_cls.data_keys, **task_values}

    model = dict(config.get("model", {}))
    init_from = model.pop("init_from", None)           # fine-tuning: architecture and tokenizer from the source
    if init_from is not None:
        from ..interop.hf import pretrained_source
        source_model, source_tokenizer = pretrained_source(init_from)
        tokenizer_state = tokenizer_state or source_tokenizer
        model.setdefault("type", source_model["type"])
    # Tasks that can feed several model families take the chosen one as [data] model_type; it follows [model] type.
    data_kind = task_values.get("model_type")             # only a value the user wrote
    kind = model.pop("type", data_kind or data.get("model_type", task_cls.model_type))
    if data_kind is not None and data_kind != kind:
        raise ValueError(f"[data] model_type = {data_kind!r} contradicts [model] type = {kind!r}; "
                         f"remove [data] model_type (it follows [model] type)")
    if "model_type" in task_cls.data_keys:
        data["model_type"] = kind
    if kind not in MODEL_TYPES:
        raise ValueError(f"[model] type = {kind!r} is not a model type; choose one of {sorted(MODEL_TYPES)}")
    allowed_types = getattr(task_cls, "model_types", (task_cls.model_type,))
    if kind not in allowed_types:
        raise ValueError(f"task {data['task']!r} trains a {' or '.join(allowed_types)} model, "
                         f"but [model] type = {kind!r}")
    valid = model_arguments(kind)
    model = _validate_section("model", model, {k: (None if d is _EMPTY else d) for k, d in valid.items()})

    task = make_task(data, seed=train["seed"], tokenizer_state=tokenizer_state)
    from_data = task.model_config()
    if init_from is not None:
        from ..interop.hf import merge_init_from
        model, from_data = merge_init_from(init_from, model, source_model, from_data), {}
    clash = sorted(k for k in from_data if k in model and model[k] != from_data[k])
    if clash:
        raise ValueError(f"[model] {clash} are set by the data ({ {k: from_data[k] for k in clash} }); "
                         f"remove them from [model]")
    model.update(from_data)
    missing = sorted(k for k, d in valid.items() if d is _EMPTY and k not in model)
    if missing:
        raise ValueError(f"[model] needs {missing}")
    full_model = {"type": kind, **{k: (None if d is _EMPTY else d) for k, d in valid.items()}, **model,
                  **({"init_from": init_from} if init_from is not None else {})}
    return {"model": full_model, "data": data, "train": train}, task


_EMPTY = __import__("inspect").Parameter.empty


def _check_train_values(t):
    from ..optim import OPTIMIZERS, SCHEDULES
    from ..optim.optimizers import NO_DECAY_KINDS

    checks = [
        (t["optimizer"] in OPTIMIZERS, f"optimizer must be one of {sorted(OPTIMIZERS)}"),
        (t["schedule"] in SCHEDULES, f"schedule must be one of {list(SCHEDULES)}"),
        (t["dtype"] in ("float32", "float64"), "dtype must be 'float32' or 'float64'"),
        (t["max_steps"] > 0, "max_steps must be > 0"),
        (t["batch_size"] > 0, "batch_size must be > 0"),
        (t["grad_accum"] >= 1, "grad_accum must be >= 1"),
        (t["eval_every"] > 0, "eval_every must be > 0"),
        (t["checkpoint_every"] > 0, "checkpoint_every must be > 0"),
        (t["lr"] >= 0, "lr must be >= 0"),
        (0.0 <= t["label_smoothing"] <= 1.0, "label_smoothing must be in [0, 1]"),
        (set(t["no_decay"]) <= set(NO_DECAY_KINDS), f"no_decay entries must be among {list(NO_DECAY_KINDS)}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"[train] {message}")
