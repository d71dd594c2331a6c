"""Language modelling on text: ``task = "text"`` (a text file, the user's files, or the built-in tiny Shakespeare)
and ``task = "imdb_lm"`` (the IMDB reviews).

Tokenizers. ``tokenizer = "char"`` (the default of ``text``): one id per character, the vocabulary built
from the whole text (as nanoGPT's prepare.py), the ids kept in memory. ``tokenizer = "bpe"``: byte-level
BPE (``ByteLevelBPE``, ``vocab_size`` tokens, the split ``pattern`` "gpt2", "gpt4" or a regex) learnt from
the training split only; every document ends with the end-of-text token ``<|endoftext|>``, and the
tokenized splits are token files on disk (``lm_corpus``, ``token_files``), read window by window, so a
corpus larger than memory trains in bounded memory. ``tokens_dir`` names a folder of such files made
elsewhere: train.bin and val.bin as nanoGPT's prepare scripts write them, with the tokenizer.json that
made them (``token_files.read_tokens_dir``).

Splits. ``text``: the first 90% (``1 - val_fraction``) of the characters for training, the rest for
validation, as nanoGPT, so that losses compare. ``imdb_lm``: the training reviews (and the unlabelled ones
where the data has them) for training, a seeded slice of ``val_size`` training reviews for validation; the
test reviews are never read (the fine-tuning that follows evaluates on them).

Batches are random windows of ``block_size + 1`` tokens; the validation loss is computed over every
non-overlapping window of the validation split (all of it, not a random sample), and a capped periodic
evaluation over a fixed sample of those windows spread over the whole split. Bits per byte (the loss of the
whole split in bits divided by its UTF-8 bytes) compare models with different tokenizers (``token_bytes``).
"""
from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

import numpy as np

from .base import Batch, Task, register_task, spread_sample
from .fetch import locate
from .files import expand_paths, read_text
from .lm_corpus import (Document, TextFiles, bpe_token_files, check_bpe_vocab_size, check_pattern, corpus_sequence,
                        file_identity)
from .text_datasets import find_imdb, imdb_review_files, load_imdb, load_imdb_unlabelled
from .text_tasks import _data_error, _split_train
from .token_files import read_tokens_dir
from .tokenizers import ByteLevelBPE, CharTokenizer, is_hf_document, tokenizer_from_dict

BUILTIN_CORPUS = "tinyshakespeare.txt"
LM_TOKENIZERS = ("char", "bpe")


def builtin_corpus_path():
    """The built-in tiny Shakespeare's file (public domain, 1,115,394 characters)."""
    return resources.files("numformer.data").joinpath("corpora", BUILTIN_CORPUS)


def corpus_files(path="", paths=()) -> list:
    """The files of ``path`` and ``paths`` (each a file, a folder or a glob pattern), or the built-in corpus; the
    user's files are counted in their order as one sequence of the run's data, and a run folder among them is
    refused (``lm_corpus.corpus_sequence``)."""
    if not path and not paths:
        return [builtin_corpus_path()]
    try:
        return corpus_sequence(expand_paths(path, paths), ", ".join(map(repr, filter(None, [path, *paths]))))
    except FileNotFoundError as e:
        raise ValueError(f"[data] path: {e} (leave path empty for the built-in tiny Shakespeare)") from None


def read_corpus(path="", encoding="utf-8", paths=()):
    """The text of ``path`` and ``paths``, or the built-in tiny Shakespeare when both are empty.

    Each of them may be a file, a folder (every file in it, recursively, in name order) or a glob
    pattern; several files are joined in that order, each ending with a line break. A file that is
    empty or not valid text in ``encoding`` is an error naming it (and the byte offset).
    """
    if not path and not paths:
        return builtin_corpus_path().read_text(encoding="utf-8")
    texts = [read_text(f, encoding) for f in corpus_files(path, paths)]
    if len(texts) == 1:
        return texts[0]
    return "".join(t if t.endswith("\n") else t + "\n" for t in texts)


class LanguageModelTask(Task):
    """Next-token prediction with a GPT on ``self.splits`` ({"train", "val"}: arrays of ids, in memory or a
    ``TokenFile``) with ``self.tokenizer``; ``model_config`` gives vocab_size and block_size."""

    model_type = "gpt"
    unit = "token"
    has_test_split = False      # "test" evaluates the validation split (there is no third split)

    def _check_splits(self):
        for name, data in self.splits.items():
            if len(data) <= self.config["block_size"]:
                raise ValueError(f"the {name} split has {len(data)} {self.unit}s, not more than block_size = "
                                 f"{self.config['block_size']}; use a longer text or a smaller block_size")

    def model_config(self):
        return {"vocab_size": self.tokenizer.vocab_size, "block_size": self.config["block_size"]}

    def train_batch(self, batch_size, rng):
        data, T = self.splits["train"], self.config["block_size"]
        starts = rng.integers(0, len(data) - T, size=batch_size)
        windows = data[starts[:, None] + np.arange(T + 1)]
        return Batch({"idx": windows[:, :-1]}, windows[:, 1:])

    def eval_batches(self, split, batch_size):
        """Every non-overlapping window of the split ("test" is the validation split: there is no third one)."""
        return self._windows(split, batch_size, np.arange(self.eval_size(split)))

    def eval_size(self, split):
        """The number of non-overlapping windows of block_size + 1 tokens (one shared) in the split."""
        return (len(self.splits["val" if split == "test" else split]) - 1) // self.config["block_size"]

    def eval_sample(self, split, batch_size, n_examples, seed=0):
        """``n_examples`` of the split's windows, spread over the whole split (``spread_sample``)."""
        return self._windows(split, batch_size, spread_sample(self.eval_size(split), n_examples, seed))

    def _windows(self, split, batch_size, windows):
        """Batches of the given windows (window i starts at token i × block_size)."""
        data, T = self.splits["val" if split == "test" else split], self.config["block_size"]
        starts = windows * T
        for i in range(0, len(starts), batch_size):
            ids = data[starts[i:i + batch_size, None] + np.arange(T + 1)]
            yield Batch({"idx": ids[:, :-1]}, ids[:, 1:])

    def token_bytes(self):
        """UTF-8 bytes per id (0 for special tokens), for bits per byte; None when the tokenizer cannot tell."""
        return self.tokenizer.token_bytes()

    def tokenizer_state(self):
        return self.tokenizer.to_dict()

    def _describe_splits(self, source):
        bpe = isinstance(self.tokenizer, ByteLevelBPE)
        kind = "byte-level BPE" if bpe else ("character" if self.unit == "character" else "pretrained")
        return (f"{source}: {len(self.splits['train']):,} training and {len(self.splits['val']):,} validation "
                f"{self.unit}s, {kind} vocabulary of {self.tokenizer.vocab_size:,}"
                + (" (token files on disk)" if bpe else ""))


@register_task("text")
class TextTask(LanguageModelTask):
    """A language model of a text file, the user's files, or the built-in tiny Shakespeare (module docstring)."""

    unit = "character"
    data_keys = {"path": "", "paths": [], "block_size": 64, "val_fraction": 0.1, "encoding": "utf-8",
                 "tokenizer": "char", "vocab_size": 4096, "pattern": "gpt2", "tokens_dir": ""}

    def __init__(self, data_config, seed=0, tokenizer_state=None):
        super().__init__(data_config, seed, tokenizer_state)
        c = self.config
        if not 0.0 < c["val_fraction"] < 1.0:
            raise ValueError(f"[data] val_fraction must be in (0, 1), got {c['val_fraction']}")
        if c["tokenizer"] not in LM_TOKENIZERS:
            raise ValueError(f"[data] tokenizer = {c['tokenizer']!r}: a language model's text is tokenized by "
                             f"\"char\" (characters) or \"bpe\" (byte-level BPE)")
        self.source = ", ".join(filter(None, [c["path"], *c["paths"]])) or "tiny Shakespeare (built in)"
        bpe = (is_hf_document(tokenizer_state) if tokenizer_state
               else c["tokenizer"] == "bpe" or bool(c["tokens_dir"]))
        if bpe:
            self._bpe_splits(tokenizer_state)
        else:
            self._in_memory_splits(tokenizer_state)
        self._check_splits()

    @classmethod
    def check_written(cls, written):
        """``vocab_size`` and ``pattern`` make a BPE: written with the char tokenizer, whose vocabulary is the
        corpus's characters, a value other than the default would be ignored (``tokens_dir``'s token files bring
        their own tokenizer). The default itself passes: a resolved config (every key written) is read again."""
        c = {**cls.data_keys, **written}
        for key in ("vocab_size", "pattern"):
            if (key in written and written[key] != cls.data_keys[key] and c["tokenizer"] == "char"
                    and not c["tokens_dir"]):
                value = f'"{written[key]}"' if isinstance(written[key], str) else written[key]
                raise ValueError(f"[data] {key} = {value} is only used by tokenizer = \"bpe\" (the char "
                                 f"tokenizer's vocabulary is the corpus's characters); remove it or set "
                                 f"tokenizer = \"bpe\"")

    def _in_memory_splits(self, tokenizer_state):
        """Characters (or a pretrained model's tokenizer, GPT-2's when fine-tuning it) over the whole text."""
        c = self.config
        text = read_corpus(c["path"], c["encoding"], c["paths"])
        self.tokenizer = (tokenizer_from_dict(tokenizer_state) if tokenizer_state
                          else CharTokenizer.from_text(text))
        self.unit = "character" if isinstance(self.tokenizer, CharTokenizer) else "token"
        ids = self.tokenizer.encode_array(text)
        n_train = int(len(ids) * (1.0 - c["val_fraction"]))
        self.splits = {"train": ids[:n_train], "val": ids[n_train:]}

    def _bpe_splits(self, tokenizer_state):
        """Byte-level BPE token files: from ``tokens_dir``, or made from the corpus (and cached)."""
        c, self.unit = self.config, "token"
        check_pattern(c["pattern"])
        if tokenizer_state is None and not c["tokens_dir"]:
            check_bpe_vocab_size(c["vocab_size"])
        if c["tokens_dir"]:
            self.splits, document = read_tokens_dir(c["tokens_dir"])
            if tokenizer_state is not None and tokenizer_state != document:
                raise ValueError(f"the tokenizer.json of [data] tokens_dir {c['tokens_dir']} is not the one this "
                                 f"run was trained with; point tokens_dir at the run's token files")
            try:
                self.tokenizer = ByteLevelBPE.from_dict(document)
            except ValueError as e:
                raise ValueError(f"{Path(c['tokens_dir']) / 'tokenizer.json'}: {e}; restore it") from None
            self.source = f"token files in {c['tokens_dir']}"
            self._document = document
            return
        corpus = TextFiles(corpus_files(c["path"], c["paths"]), c["encoding"], c["val_fraction"])
        try:
            source = {"task": "text", **corpus.identity()}
        except OSError as e:
            raise ValueError(f"[data] path: {e}") from None
        self.tokenizer, self.splits = bpe_token_files(source, corpus.documents, c["vocab_size"], c["pattern"],
                                                      tokenizer_state)

    def tokenizer_state(self):
        return getattr(self, "_document", None) or self.tokenizer.to_dict()

    @classmethod
    def sizes_from_config(cls, data_config):
        """The built-in corpus's characters are known, and a BPE vocabulary's configured size; a text file's
        characters are counted only by reading it."""
        c = {**cls.data_keys, **data_config}
        if c["tokens_dir"]:
            return None
        if c["tokenizer"] == "bpe":
            return {"vocab_size": c["vocab_size"], "block_size": c["block_size"]}
        if c["path"] or c["paths"]:
            return None
        return {"vocab_size": CharTokenizer.from_text(read_corpus()).vocab_size, "block_size": c["block_size"]}

    def describe(self):
        return self._describe_splits(self.source)


_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
_IMDB_VAL_SALT = 0x1DB


def clean_review(text: str) -> str:
    """An IMDB review as a document: its HTML line breaks (``<br />``) as line breaks."""
    return _BREAK.sub("\n", text)


def imdb_identity(path, unlabelled: bool) -> list:
    """``file_identity`` of the IMDB data at ``path``: the tarball or the aclImdb folder found there, and of a
    folder only the files imdb_lm reads (the training reviews, and the unlabelled ones with ``unlabelled``), so
    that the test reviews are none of its data."""
    found = find_imdb(path)
    if not os.path.isdir(found):
        return file_identity(found)
    return file_identity(found, imdb_review_files(found, splits=("train",), unlabelled=unlabelled))


@register_task("imdb_lm")
class ImdbLMTask(LanguageModelTask):
    """A byte-level BPE language model of the IMDB reviews (see the module docstring): the 25,000 training
    reviews, plus the 50,000 unlabelled ones when the data has them (``unlabelled``), less ``val_size``
    training reviews held out for validation with the seed. The test reviews are never read."""

    data_keys = {"path": "", "block_size": 256, "vocab_size": 8192, "pattern": "gpt2", "val_size": 1000,
                 "unlabelled": True, "tokenizer": "bpe"}

    def __init__(self, data_config, seed=0, tokenizer_state=None):
        super().__init__(data_config, seed, tokenizer_state)
        c = self.config
        if c["tokenizer"] != "bpe":
            raise ValueError(f"[data] tokenizer = {c['tokenizer']!r}: imdb_lm is tokenized by byte-level BPE "
                             f"(tokenizer = \"bpe\")")
        check_pattern(c["pattern"])
        if tokenizer_state is None:
            check_bpe_vocab_size(c["vocab_size"])
        try:
            self.data_path = c["path"] or str(locate("imdb")["aclImdb_v1.tar.gz"])
            source = {"task": "imdb_lm", "data": imdb_identity(self.data_path, c["unlabelled"]), "seed": int(seed),
                      "val_size": c["val_size"], "unlabelled": c["unlabelled"]}
        except (FileNotFoundError, NotADirectoryError) as e:
            raise _data_error(e) from None
        self._reviews = None
        self.tokenizer, self.splits = bpe_token_files(source, self._documents, c["vocab_size"], c["pattern"],
                                                      tokenizer_state)
        self._check_splits()

    def _documents(self, split):
        """The reviews of a split, read from the data on the first call (only when no token files exist)."""
        if self._reviews is None:
            try:
                train = load_imdb(self.data_path, splits=("train",))["train"].texts
                extra = load_imdb_unlabelled(self.data_path) if self.config["unlabelled"] else []
            except (FileNotFoundError, NotADirectoryError) as e:
                raise _data_error(e) from None
            rest, held = _split_train(len(train), self.config["val_size"], 0, self.seed, self.name,
                                      salt=_IMDB_VAL_SALT)
            self._reviews = {"train": [train[i] for i in rest] + extra, "val": [train[i] for i in held]}
        return (Document(clean_review(t)) for t in self._reviews[split])

    @classmethod
    def sizes_from_config(cls, data_config):
        c = {**cls.data_keys, **data_config}
        return {"vocab_size": c["vocab_size"], "block_size": c["block_size"]}

    def describe(self):
        return self._describe_splits(f"IMDB reviews ({self.data_path})")
