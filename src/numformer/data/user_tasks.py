"""Tasks on the user's own files: text classification from a table, translation from parallel text.

``task = "classification"``: texts and labels from a CSV, TSV or JSON-lines file
(``path``), with an optional separate test file (``test_path``). The label names
are the distinct values of the label column in the training data (numbers in
numeric order, other labels alphabetically; one value spelled two ways, such as
"1" and "1.0", is refused). Splits as IMDB's: "val" is a seeded
slice of the training rows (``val_size``, 0 = a tenth); without ``test_path`` the
test set is another seeded slice (``test_size``, 0 = a tenth). Everything else
(tokenizers, truncation, ``numformer classify``) is the IMDB / AG News pipeline.

``task = "translation"``: ``train``, ``val`` and ``test`` each name two
line-aligned files (source, target; a line empty on one side only is refused) or
one TSV of ``source<TAB>target`` pairs.
A missing ``val`` or ``test`` is held out of ``train`` with the seed
(``val_size`` / ``test_size``, 0 = a tenth). Everything else (tokenizers, BLEU,
beam search, ``numformer translate``) is the Multi30k pipeline.
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np

from .base import register_task
from .files import read_labeled, read_pairs, read_parallel
from .text_datasets import LabeledTexts
from .text_tasks import _VAL_SALT, Multi30kTask, TextClassificationTask, _data_error, _split_train

_TEST_SALT = _VAL_SALT + 2


def _label_value(label: str) -> float | None:
    """The number a label spells (booleans: 1 and 0, in any case), or None (NaN is no value: it equals nothing)."""
    if label.lower() in ("true", "false"):
        return float(label.lower() == "true")
    try:
        value = float(label)
    except ValueError:
        return None
    return None if value != value else value


def label_order(labels, lines=(), where="the label column") -> list[str]:
    """The distinct labels in a total order that does not depend on hashing: numerically when every label is a
    number (``float`` reads it, NaN aside), else by their text.

    Two labels that spell one value ("1" and "1.0", "0" and "false", "True" and "true") are a ValueError naming
    ``where`` and the first line of each (``lines``: the line number of each label): they would be two classes.
    """
    distinct = sorted(set(labels))
    first_line = {}
    for label, line in zip(labels, lines):
        first_line.setdefault(label, line)
    values = {}
    for label in distinct:
        value = _label_value(label)
        if value is not None and value in values:
            other = values[value]
            at = (lambda x: f" (line {first_line[x]})" if x in first_line else "")  # noqa: E731
            raise ValueError(f"{where} holds {other!r}{at(other)} and {label!r}{at(label)}, one value spelled two "
                             f"ways, which would be two classes: write every label the same way (e.g. all {other!r})")
        if value is not None:
            values[value] = label
    if all(_label_value(x) is not None and x.lower() not in ("true", "false") for x in distinct):
        return sorted(distinct, key=lambda x: (float(x), x))
    return distinct


@register_task("classification")
class ClassificationTask(TextClassificationTask):
    """Text classification on a CSV / TSV / JSONL file of the user's (see the module docstring)."""

    data_keys = {
        **TextClassificationTask.common_keys,
        "path": "",                 # the training file (.csv, .tsv, .jsonl; .gz allowed)
        "test_path": "",            # a test file in the same format ("": hold out test_size rows of path)
        "format": "",               # "csv", "tsv" or "jsonl" ("": from the file extension)
        "header": True,             # CSV/TSV: the first row names the columns (false: columns "0", "1", ...)
        "text_column": "text",      # the column holding the text
        "text_columns": [],         # several text columns, joined by a space (replaces text_column)
        "label_column": "label",
        "val_size": 0,              # training rows held out for validation (0 = a tenth)
        "test_size": 0,             # without test_path: rows held out for the test (0 = a tenth)
    }

    def load(self):
        c = self.config
        if not c["path"]:
            raise FileNotFoundError("classification: set [data] path to your training file (CSV, TSV or JSONL)")
        if c["text_columns"] and c["text_column"] != self.data_keys["text_column"]:
            raise ValueError("classification: set text_column or text_columns, not both")
        columns = [str(x) for x in c["text_columns"]] or [c["text_column"]]
        read = lambda p: read_labeled(p, columns, c["label_column"], c["format"], c["header"])  # noqa: E731
        if c["test_path"] and os.path.realpath(c["test_path"]) == os.path.realpath(c["path"]):
            raise ValueError(f"classification: [data] test_path names the training file {c['path']!r}: the test would "
                             f"score the rows the model trained on; give a separate test file, or remove test_path "
                             f"(test_size rows of path are then held out)")
        texts, labels, lines = read(c["path"])
        names = label_order(labels, lines, f"{c['path']}: the label column {c['label_column']!r}")
        _check_classes(c["path"], c["label_column"], labels, names)
        full = LabeledTexts(texts, self._label_ids(labels, names, lines, c["path"]), [], names, c["path"])
        if c["test_path"]:
            try:
                t_texts, t_labels, t_lines = read(c["test_path"])
            except (FileNotFoundError, NotADirectoryError) as e:    # not the caller's "Set [data] path"
                raise ValueError(str(_data_error(e, "test_path"))) from None
            test = LabeledTexts(t_texts, self._label_ids(t_labels, names, t_lines, c["test_path"], c["path"]),
                                [], names, c["test_path"])
            return full, test
        rest, held = _split_train(len(full), c["test_size"], 0, self.seed, self.name, "test_size", _TEST_SALT)
        return full.subset(rest), full.subset(held)

    @staticmethod
    def _label_ids(labels, names, lines, path, train_path=None) -> np.ndarray:
        index = {name: i for i, name in enumerate(names)}
        for label, line in zip(labels, lines):
            if label not in index:
                raise ValueError(f"{path}, line {line}: label {label!r} does not occur in the training data "
                                 f"{train_path} (its labels: {', '.join(map(repr, names))}); a classifier can only "
                                 f"predict labels it was trained on")
        return np.array([index[x] for x in labels], dtype=np.int64)


def _check_classes(path, column, labels, names) -> None:
    """One ValueError when the label column cannot be a classifier's: fewer than 2 classes, or most rows with a
    label no other row has (the column of texts or ids, e.g. text and label columns swapped: 40 classes from 40
    rows). A class seen once is never both trained on and scored, so such a run learns nothing it can show."""
    if len(names) < 2:
        raise ValueError(f"{path}: the label column {column!r} holds {len(names)} class"
                         + (f" ({names[0]!r}) in all {len(labels)} rows" if names else "")
                         + "; a classifier needs at least 2 classes: check label_column, or add examples of "
                           "the other classes")
    counts = Counter(labels)
    once = [x for x in labels if counts[x] == 1]
    if 2 * len(once) > len(labels):
        raise ValueError(f"{path}: in the label column {column!r}, {len(once):,} of the {len(labels):,} rows have a "
                         f"label no other row has (e.g. {', '.join(repr(x[:30]) for x in once[:2])}): it holds "
                         f"texts or ids, not classes; check label_column and text_column (swapped?), or give "
                         f"each class several examples")


@register_task("translation")
class TranslationTask(Multi30kTask):
    """Translation between the user's parallel files (see the module docstring)."""

    data_keys = {
        **{k: v for k, v in Multi30kTask.data_keys.items() if k not in ("path", "src_lang", "tgt_lang", "test_name")},
        "train": [],                # [source file, target file] (line-aligned) or [TSV file of pairs]
        "val": [],                  # the same ([] = hold out val_size training pairs)
        "test": [],                 # the same ([] = hold out test_size training pairs)
        "val_size": 0,              # pairs held out for validation when val = [] (0 = a tenth)
        "test_size": 0,             # pairs held out for the test when test = [] (0 = a tenth)
    }

    def load_text(self) -> dict:
        c = self.config
        if not c["train"]:
            raise FileNotFoundError('translation: set [data] train = ["train.src", "train.tgt"] (two line-aligned '
                                    'files) or ["pairs.tsv"] (source<TAB>target per line)')
        text = {s: _read_split(c[s], s) for s in ("train", "val", "test") if c[s]}
        _check_not_train(c)
        src, tgt = text["train"]
        for split, key, salt in (("test", "test_size", _TEST_SALT), ("val", "val_size", _VAL_SALT)):
            if split not in text:
                rest, held = _split_train(len(src), c[key], 0, self.seed, self.name, key, salt)
                text[split] = ([src[i] for i in held], [tgt[i] for i in held])
                src, tgt = [src[i] for i in rest], [tgt[i] for i in rest]
        text["train"] = (src, tgt)
        self.files = {s: c[s] for s in ("train", "val", "test")}
        return text

    def describe(self) -> str:
        n = {s: len(v[0]) for s, v in self.text.items()}
        held = [s for s in ("val", "test") if not self.config[s]]
        return (f"translation from {', '.join(self.config['train'])}: {n['train']:,} train / {n['val']:,} val / "
                f"{n['test']:,} test pairs" + (f" ({' and '.join(held)} held out of train)" if held else "")
                + f"; {self.config['tokenizer']} tokenizer")


def _check_not_train(c) -> None:
    """One ValueError when [data] val or test names a file of train: it would score pairs the model trained on
    (or, paired with another file, misaligned ones)."""
    train_files = {os.path.realpath(str(f)) for f in c["train"]}
    for split in ("val", "test"):
        same = [str(f) for f in c[split] if os.path.realpath(str(f)) in train_files]
        if same:
            raise ValueError(f"translation: [data] {split} names the training file {same[0]!r}: it would score "
                             f"pairs the model trained on; give separate {split} files, or remove {split} "
                             f"({split}_size pairs of train are then held out)")


def _read_split(files, split):
    files = [str(f) for f in files]
    try:
        if len(files) == 2:
            return read_parallel(*files)
        if len(files) == 1:
            return read_pairs(files[0])
    except (FileNotFoundError, NotADirectoryError) as e:
        # a ValueError: Multi30kTask would otherwise add its own "Set [data] path", a key this task lacks
        raise ValueError(str(_data_error(e, split))) from None
    raise ValueError(f"translation: [data] {split} names {len(files)} files; give two line-aligned files "
                     f"(source, target) or one TSV file of pairs")
