"""Tasks: what the trainer needs from an experiment.

A Task turns the ``[data]`` section of a config into batches. The trainer is
generic: for every batch it calls ``logits = model(**batch.inputs)`` and
minimizes the cross-entropy of ``logits`` against ``batch.targets`` (targets
equal to ``IGNORE`` are left out), so one loop trains language models,
classifiers and encoder-decoders alike.

To add a task::

    @register_task("copy")
    class CopyTask(Task):
        model_type = "gpt"                       # the model family it trains
        data_keys = {"length": 16, "vocab": 10}  # [data] keys with their defaults (types are checked)
        ...

Tokenizers or vocabularies are part of the task state: ``tokenizer_state()``
returns JSON-able data saved as ``tokenizer.json`` in the run folder, and a
task rebuilt with that state maps text to the same ids.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..keys import FRACTION, NONNEG_FLOAT, NONNEG_INT, Key, check_section, did_you_mean, positive

IGNORE = -100   # target id left out of the loss (torch's default ignore_index)
EVAL_SAMPLE_KEY = 0x5A3E   # the stream of a run's seed that draws its evaluation sample (see spread_sample)


@dataclass
class Batch:
    """One batch: keyword arguments for ``model.forward`` and integer targets for cross-entropy.

    inputs:   e.g. {"idx": (B, T)} for GPT, {"ids": (B, T)} for EncoderClassifier,
              {"src": (B, S), "tgt": (B, T)} for Transformer (teacher forcing: tgt = targets shifted right).
    targets:  shape of logits[..., 0]: (B, T) for GPT/Transformer, (B,) for a classifier; IGNORE is skipped.
    n_tokens: tokens processed in this batch (for tokens/s); 0 (the default) counts the elements of every
              input array.
    extra:    anything a task's own metrics need (e.g. each row's index in the split).
    """

    inputs: dict
    targets: np.ndarray
    n_tokens: int = 0
    extra: dict = field(default_factory=dict)   # anything a task's own metrics need (e.g. raw text)

    def __post_init__(self):
        if not self.n_tokens:
            self.n_tokens = int(sum(np.size(v) for v in self.inputs.values()))


class Task:
    """Base class. Subclasses set ``name``, ``model_type`` and ``data_keys`` and implement the methods."""

    name: str = ""
    model_type: str = ""            # "gpt", "classifier" or "transformer"
    data_keys: dict = {}            # [data] keys -> default values (the type of the default is enforced)

    def __init__(self, data_config: dict, seed: int = 0, tokenizer_state: dict | None = None):
        """Read or generate the data. With ``tokenizer_state`` (from a saved run), reuse that vocabulary."""
        self.config = {**self.data_keys, **data_config}
        self.seed = seed

    def model_config(self) -> dict:
        """Model arguments that come from the data (vocab_size, n_classes, pad ids, ...)."""
        return {}

    @classmethod
    def sizes_from_config(cls, data_config: dict) -> dict | None:
        """What ``model_config`` will give, known from the [data] config alone (no data read), or None
        when only the data can tell. A vocabulary built from the data gets its configured cap (the one
        built can come out smaller). ``numformer params`` counts parameters with it."""
        return None

    @classmethod
    def check_written(cls, written: dict) -> None:
        """One ValueError for a [data] value the user wrote (``written``: the keys of their config and --set, not
        the defaults) that the task would not use with the others. ``config.resolve_config`` calls it before any
        data is read when the task's vocabulary is to be made from [data]: not with a saved tokenizer (a resumed
        run, whose config.json holds every default) nor an init_from model's."""

    def train_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        """A training batch drawn with ``rng`` (the trainer saves and restores its state on resume)."""
        raise NotImplementedError

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        """The fixed evaluation batches of a split ("val" or "test"); the same every call."""
        raise NotImplementedError

    def eval_size(self, split: str) -> int:
        """The number of evaluation examples (rows of ``eval_batches``) in a split."""
        return sum(len(b.targets) for b in self.eval_batches(split, 256))

    def eval_sample(self, split: str, batch_size: int, n_examples: int, seed: int = 0) -> Iterator[Batch]:
        """Batches of a fixed sample of ``n_examples`` of the split's evaluation examples (all of them when
        the split has no more), spread over the whole split by :func:`spread_sample`; the same sample for the
        same arguments, so that successive evaluations of a run compare like with like.

        This generic version takes the sampled rows out of ``eval_batches`` (one smaller batch per batch
        that holds any); tasks whose examples can be built directly by index override it.
        """
        batches = list(self.eval_batches(split, batch_size))
        keep = spread_sample(sum(len(b.targets) for b in batches), n_examples, seed)
        start = 0
        for batch in batches:
            n = len(batch.targets)
            rows = keep[(keep >= start) & (keep < start + n)] - start
            start += n
            if rows.size == n:
                yield batch
            elif rows.size:
                yield Batch({k: v[rows] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == n else v
                             for k, v in batch.inputs.items()}, batch.targets[rows])

    def evaluate(self, model, split: str) -> dict:
        """Task metrics on a split (accuracy, exact match, BLEU ...); {} when the loss says it all."""
        return {}

    def analysis_example(self, split: str = "test") -> tuple[dict, dict]:
        """One example (batch of 1) to draw attention maps of: (model inputs, token labels).

        Labels map each input name to one string per position, e.g. {"idx": ["3", "7", ...]}
        or {"src": [...], "tgt": [...]}. The default labels are the token ids.
        """
        batch = next(iter(self.eval_batches(split, 1)))
        inputs = {k: np.asarray(v)[:1] for k, v in batch.inputs.items()}
        return inputs, {k: [str(t) for t in v[0]] for k, v in inputs.items()}

    def tokenizer_state(self) -> dict | None:
        """JSON-able vocabulary/tokenizer, saved as tokenizer.json in the run folder."""
        return None

    def token_bytes(self):
        """For language models: the UTF-8 bytes each target id stands for, (vocab_size,) (0 for special tokens),
        so that the trainer reports bits per byte; None for the tasks where that means nothing."""
        return None

    def describe(self) -> str:
        """One line for logs: what the data is and how big."""
        return self.name


TASKS: dict[str, type[Task]] = {}


def register_task(name):
    """Class decorator: make a Task available as ``[data] task = name``."""

    def wrap(cls):
        cls.name = name
        TASKS[name] = cls
        return cls

    return wrap


# [data] keys shared by name across tasks; any other key has the type of its default (ints >= 0).
DATA_KEYS = {
    "length": positive(), "min_length": NONNEG_INT, "full_length_fraction": FRACTION,
    "test_lengths": Key(list, item=int), "n_val": positive(), "n_test": NONNEG_INT, "eval_batch_size": positive(),
    "vocab": Key(int, 2), "n_values": Key(int, 2), "block_size": positive(),
    "val_fraction": Key(float, 0, 1, (True, True)), "max_len": Key(int, 2), "vocab_size": positive(),
    "min_freq": positive(), "val_size": NONNEG_INT, "buckets": positive(),
    "token_dropout": Key(float, 0, 1, open=(False, True)), "beam_size": positive(), "length_penalty": NONNEG_FLOAT,
    "train_on": Key(str, choices=("assistant", "all")),
    "tokenizer": Key(str, choices=("char", "word", "bpe")), "truncate": Key(str, choices=("head", "tail", "head_tail")),
}


def check_data_section(data, task_cls):
    """A task's [data] keys (without ``task``) against its ``data_keys``; returns the converted values."""
    return check_section("data", data, DATA_KEYS, task_cls.data_keys)


def make_task(data_config: dict, seed: int = 0, tokenizer_state: dict | None = None) -> Task:
    """Build the task named by ``data_config["task"]`` (found as ``find_task`` finds it)."""
    data_config = dict(data_config)
    task_cls = find_task(data_config.pop("task", None), data_config.pop("task_module", None))
    return task_cls(check_data_section(data_config, task_cls), seed, tokenizer_state)


def import_builtin_tasks():
    """The registry ``TASKS`` with numformer's own tasks: ``numformer.data`` imports every task module, and
    Python imports that package before any of its modules, so they are registered by the time this runs."""
    return TASKS


def find_task(name, module=None):
    """The task class registered as ``name``: one of numformer's, or one registered (``@register_task``) by
    ``module``, the ``[data] task_module`` of a config, which is always imported here (once per process).
    The module is looked for on ``sys.path`` and then in the current folder (as ``python -m`` would; the
    ``numformer`` command does not put that folder on its path). One ValueError naming the problem and its fix."""
    if module is not None and not (isinstance(module, str) and all(p.isidentifier() for p in module.split("."))):
        raise ValueError(f"[data] task_module = {module!r} should be a module name such as \"my_tasks\" or "
                         f"\"package.tasks\"")
    if module is not None:          # even for a built-in task: a module that cannot be imported is an error
        _import_task_module(module)
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    if module is not None:
        raise ValueError(f"[data] task = {name!r}: the module {module!r} ([data] task_module) registers no task of "
                         f"that name; known tasks: {sorted(TASKS)}")
    raise ValueError(f"[data] task = {name!r} is not a known task{did_you_mean(name, TASKS)}; choose one of "
                     f"{sorted(TASKS)}, or name the module that registers your own task (@register_task) in "
                     f"[data] task_module")


def _import_task_module(module):
    try:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
                raise                             # the module was found; something it imports is missing
            with _current_folder_on_path():
                importlib.import_module(module)
    except Exception as e:          # the user's module: any error it raises while imported
        raise ValueError(f"[data] task_module = {module!r} cannot be imported ({type(e).__name__}: {e}); run "
                         f"numformer in the folder that holds it, or add that folder to PYTHONPATH") from None


@contextlib.contextmanager
def _current_folder_on_path():
    """The current folder at the end of ``sys.path`` for the duration (after every installed package)."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.append(here)
    try:
        yield
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


def task_module_of(task_cls):
    """The module to record as ``[data] task_module`` for ``task_cls``: its own module when it is not one of
    numformer's (so that ``eval`` and ``generate`` can import it), else None. A task defined in a script run as
    ``__main__`` cannot be imported by name: None, and reading the run needs ``task_module`` set by hand."""
    module = task_cls.__module__
    return None if module.split(".")[0] == "numformer" or module == "__main__" else module


def spread_sample(n: int, k: int, seed: int = 0) -> np.ndarray:
    """``k`` sorted indices out of range(n), spread over all of it: range(n) is cut into k consecutive stretches
    of (nearly) equal length and one index is drawn at random from each, with a generator seeded by ``seed``
    alone (the same indices at every call). All of range(n) when k >= n.

    Each example is drawn with probability 1/(the length of its stretch), k/n up to the rounding of the
    stretches' lengths, so the mean over the sample estimates the mean over the split (without bias when k
    divides n), and no part of the split is left out (as the first k would leave out the rest).
    """
    if k >= n:
        return np.arange(n)
    bounds = np.arange(k + 1) * n // k
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(EVAL_SAMPLE_KEY,)))
    return rng.integers(bounds[:-1], bounds[1:])


def pad_sequences(seqs, pad_id, length=None, dtype=np.int64):
    """Right-pad a list of id sequences with ``pad_id`` into a (len(seqs), length) array of ``dtype`` (int64 by
    default); length: the longest by default; longer sequences are cut to ``length``."""
    length = max((len(s) for s in seqs), default=0) if length is None else length
    out = np.full((len(seqs), length), pad_id, dtype=dtype)
    for i, s in enumerate(seqs):
        s = s[:length]
        out[i, :len(s)] = s
    return out
