"""Tasks on real text: IMDB and AG News classification, Multi30k translation.

Data locations: the ``path`` key, relative to the current working directory,
defaults to the shared data folder seen from the project root
(``../shared/data/...``); point it at your own download otherwise.

Splits: "test" is the official test set; "val" is a slice of the official
training set held out with the run's seed (``val_size`` examples), and
"train" is the rest (optionally cut to ``n_train`` examples for quick runs).
Tokenizers are trained on that "train" part only.
"""
from __future__ import annotations

import os

import numpy as np

from .base import IGNORE, Batch, Task, register_task
from .batching import LengthBuckets, eval_mode, eval_order
from .text_datasets import load_agnews, load_imdb, load_parallel
from .tokenizers import BOS, EOS, build_tokenizer, tokenizer_from_dict, truncate

_VAL_SALT = 0xA11


def _split_train(n: int, val_size: int, n_train: int, seed: int, what: str):
    """(train indices, val indices): a seeded random slice of ``val_size`` for validation."""
    if not 0 < val_size < n:
        raise ValueError(f"{what}: val_size must be between 1 and {n - 1} (the training set has {n}), got {val_size}")
    perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, _VAL_SALT]).permutation(n)
    val, train = perm[:val_size], perm[val_size:]
    if n_train < 0:
        raise ValueError(f"{what}: n_train must be >= 0 (0 = all), got {n_train}")
    if n_train:
        train = train[:n_train]
    return np.sort(train), np.sort(val)


def _data_error(e: Exception, key: str = "path") -> Exception:
    return type(e)(f"{e}. Set [data] {key} (relative paths are from the current directory, {os.getcwd()!r})")


def _restore_tokenizer(state: dict, kind: str, what: str):
    tok = tokenizer_from_dict(state)
    if state.get("type") != kind:
        raise ValueError(f"{what}: the saved tokenizer is {state.get('type')!r} but [data] tokenizer = {kind!r}")
    return tok


class TextClassificationTask(Task):
    """Shared by IMDB and AG News: texts -> <cls> + token ids (truncated to max_len) -> EncoderClassifier.

    The classifier is the model: the label is one of C classes for the whole text.
    """

    model_type = "classifier"
    model_types = ("classifier",)
    common_keys = {
        "path": "",                 # data location (relative to the current directory)
        "tokenizer": "word",        # "word" (lowercased words and punctuation) or "bpe" (byte-level BPE)
        "vocab_size": 20000,        # word: the most frequent words, specials included; bpe: the target size
        "min_freq": 2,              # words / merges seen fewer times in the training split are dropped
        "lowercase": True,
        "max_len": 256,             # tokens per text, <cls> included; longer texts keep their beginning
        "cls_token": True,          # prepend <cls> (for pooling = "first"; harmless for mean pooling)
        "val_size": 1000,           # training examples held out as the "val" split (chosen with the seed)
        "n_train": 0,               # use only this many training examples (0 = all the rest)
        "buckets": 1,               # > 1: batch texts of similar length together (less padding, faster)
        "eval_batch_size": 128,     # batch size inside evaluate()
    }
    data_keys = common_keys

    def load(self) -> tuple:
        """(train LabeledTexts, test LabeledTexts)."""
        raise NotImplementedError

    def __init__(self, data_config: dict, seed: int = 0, tokenizer_state: dict | None = None):
        super().__init__(data_config, seed, tokenizer_state)
        unknown = sorted(set(data_config) - set(self.data_keys))
        if unknown:
            raise ValueError(f"unknown [data] key(s) {unknown} for task {self.name!r}; valid keys: "
                             f"{sorted(self.data_keys)}")
        c = self.config
        if c["max_len"] < 2:
            raise ValueError(f"{self.name}: max_len must be >= 2, got {c['max_len']}")
        try:
            full_train, test = self.load()
        except (FileNotFoundError, NotADirectoryError) as e:
            raise _data_error(e) from None
        self.class_names = full_train.class_names
        tr, va = _split_train(len(full_train), c["val_size"], c["n_train"], seed, self.name)
        self.data = {"train": full_train.subset(tr), "val": full_train.subset(va), "test": test}
        if tokenizer_state is not None:
            self.tokenizer = _restore_tokenizer(tokenizer_state, c["tokenizer"], self.name)
        else:
            self.tokenizer = build_tokenizer(c["tokenizer"], self.data["train"].texts, c["vocab_size"],
                                             c["min_freq"], c["lowercase"], cls_token=c["cls_token"])
        self.ids = {s: [np.asarray(truncate(x, c["max_len"]), dtype=np.int64) for x in
                        self.tokenizer.encode_batch(d.texts, add_cls=c["cls_token"])]
                    for s, d in self.data.items()}
        self.lengths = {s: np.array([len(x) for x in v]) for s, v in self.ids.items()}
        self.buckets = LengthBuckets(self.lengths["train"], c["buckets"])

    def _batch(self, split, index) -> Batch:
        seqs = [self.ids[split][i] for i in index]
        T = max(1, max(len(s) for s in seqs))
        ids = np.zeros((len(seqs), T), dtype=np.int64)            # <pad> = 0
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = s
        return Batch({"ids": ids}, self.data[split].labels[index], extra={"index": np.asarray(index)})

    def train_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        return self._batch("train", self.buckets.sample(batch_size, rng))

    def eval_batches(self, split: str, batch_size: int):
        if split not in ("val", "test"):
            raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        for index in eval_order(self.lengths[split], batch_size):
            yield self._batch(split, index)

    def evaluate(self, model, split: str) -> dict:
        hits = total = 0
        with eval_mode(model):
            for batch in self.eval_batches(split, int(self.config["eval_batch_size"])):
                pred = np.asarray(model(**batch.inputs)).argmax(axis=-1)
                if hasattr(model, "clear_cache"):
                    model.clear_cache()
                hits += int(np.sum(pred == batch.targets))
                total += len(batch.targets)
        return {"accuracy": hits / total}

    def model_config(self) -> dict:
        return {"vocab_size": self.tokenizer.vocab_size, "n_classes": len(self.class_names), "pad_id": 0,
                "max_len": int(self.config["max_len"])}

    def tokenizer_state(self) -> dict:
        return self.tokenizer.to_dict()

    def describe(self) -> str:
        n = {s: len(d) for s, d in self.data.items()}
        mean_len = float(np.mean(self.lengths["train"]))
        return (f"{self.name}: {len(self.class_names)} classes, {n['train']:,} train / {n['val']:,} val / "
                f"{n['test']:,} test texts; {self.config['tokenizer']} tokenizer, vocabulary "
                f"{self.tokenizer.vocab_size:,}; max_len {self.config['max_len']} (mean {mean_len:.0f} tokens)")


@register_task("imdb")
class IMDBTask(TextClassificationTask):
    """IMDB sentiment (positive = 1, negative = 0): 25,000 training and 25,000 test reviews.

    ``path``: ``aclImdb_v1.tar.gz`` (read in place), the extracted ``aclImdb``
    folder, or a folder holding either. ``<br />`` tags are removed by the tokenizer.
    """

    data_keys = {**TextClassificationTask.common_keys, "path": "../shared/data/aclImdb_v1.tar.gz",
                 "val_size": 2500}

    def load(self):
        d = load_imdb(self.config["path"])
        return d["train"], d["test"]


@register_task("agnews")
class AGNewsTask(TextClassificationTask):
    """AG News topics (World, Sports, Business, Sci/Tech): text = title + description.

    ``path``: the folder of the CSV release (``train.csv`` or ``train_subset_20k.csv``,
    ``test.csv``, ``classes.txt``); ``train_file`` names another training CSV in it.
    """

    data_keys = {**TextClassificationTask.common_keys, "path": "../shared/data/ag_news_csv", "max_len": 128,
                 "train_file": ""}

    def load(self):
        p = self.config["path"]
        return load_agnews(p, "train", self.config["train_file"]), load_agnews(p, "test")


# ---------------------------------------------------------------------------------------------------------------
@register_task("multi30k")
class Multi30kTask(Task):
    """Multi30k translation (default German -> English) for the encoder-decoder Transformer.

    Teacher forcing: inputs ``{"src": x, "tgt": <bos> y}``, targets ``y <eos>``
    (padding = IGNORE; the model masks padding from ``src_pad_id`` / ``tgt_pad_id`` = 0).
    Tokenizers are trained on the training split: one per language, or one
    joint vocabulary (``joint_vocab``, which lets the model share embeddings).
    Training batches draw a length bucket, then sentence pairs within it, to
    limit padding. ``evaluate`` returns {} for now (BLEU needs decoding).
    """

    model_type = "transformer"
    model_types = ("transformer",)
    data_keys = {
        "path": "../shared/data/multi30k",   # folder with {train,val,test_2016_flickr}.{de,en}.gz
        "src_lang": "de",
        "tgt_lang": "en",
        "test_name": "test_2016_flickr",     # file stem of the "test" split
        "tokenizer": "word",                 # "word" or "bpe"
        "joint_vocab": False,                # one vocabulary for both languages
        "vocab_size": 10000,                 # per vocabulary (specials included)
        "min_freq": 2,
        "lowercase": True,
        "max_len": 64,                       # tokens per sentence: src, and <bos>+y / y+<eos> on the target side
        "n_train": 0,                        # use only the first n training pairs (0 = all)
        "buckets": 8,                        # length buckets for training batches (1 = uniform sampling)
        "eval_batch_size": 128,
    }

    def __init__(self, data_config: dict, seed: int = 0, tokenizer_state: dict | None = None):
        super().__init__(data_config, seed, tokenizer_state)
        unknown = sorted(set(data_config) - set(self.data_keys))
        if unknown:
            raise ValueError(f"unknown [data] key(s) {unknown} for task {self.name!r}; valid keys: "
                             f"{sorted(self.data_keys)}")
        c = self.config
        if c["max_len"] < 2:
            raise ValueError(f"multi30k: max_len must be >= 2, got {c['max_len']}")
        if c["src_lang"] == c["tgt_lang"]:
            raise ValueError(f"multi30k: src_lang and tgt_lang are both {c['src_lang']!r}")
        files = {"train": "train", "val": "val", "test": c["test_name"]}
        try:
            self.text = {s: load_parallel(c["path"], f, c["src_lang"], c["tgt_lang"]) for s, f in files.items()}
        except (FileNotFoundError, NotADirectoryError) as e:
            raise _data_error(e) from None
        if c["n_train"] < 0:
            raise ValueError(f"multi30k: n_train must be >= 0 (0 = all), got {c['n_train']}")
        if c["n_train"]:
            src, tgt = self.text["train"]
            self.text["train"] = (src[:c["n_train"]], tgt[:c["n_train"]])
        kind = c["tokenizer"]
        if tokenizer_state is not None:
            if bool(tokenizer_state.get("joint")) != c["joint_vocab"]:
                raise ValueError("multi30k: the saved tokenizer's joint_vocab differs from [data] joint_vocab")
            self.src_tokenizer = _restore_tokenizer(tokenizer_state["src"], kind, self.name)
            self.tgt_tokenizer = (self.src_tokenizer if c["joint_vocab"]
                                  else _restore_tokenizer(tokenizer_state["tgt"], kind, self.name))
        else:
            src, tgt = self.text["train"]
            args = (c["vocab_size"], c["min_freq"], c["lowercase"])
            if c["joint_vocab"]:
                self.src_tokenizer = self.tgt_tokenizer = build_tokenizer(kind, src + tgt, *args, bos=True, eos=True)
            else:
                self.src_tokenizer = build_tokenizer(kind, src, *args)
                self.tgt_tokenizer = build_tokenizer(kind, tgt, *args, bos=True, eos=True)
        self.bos_id, self.eos_id = self.tgt_tokenizer.special_id(BOS), self.tgt_tokenizer.special_id(EOS)
        L = c["max_len"]
        self.ids = {}
        for s, (src, tgt) in self.text.items():
            xs = [np.asarray(truncate(x, L), dtype=np.int64) for x in self.src_tokenizer.encode_batch(src)]
            ys = [np.asarray(truncate(y, L - 1), dtype=np.int64) for y in self.tgt_tokenizer.encode_batch(tgt)]
            self.ids[s] = (xs, ys)
        self.lengths = {s: np.array([len(x) + len(y) for x, y in zip(*v)]) for s, v in self.ids.items()}
        self.buckets = LengthBuckets(self.lengths["train"], c["buckets"])

    def _batch(self, split, index) -> Batch:
        xs, ys = self.ids[split]
        xs, ys = [xs[i] for i in index], [ys[i] for i in index]
        B, S, T = len(index), max(1, max(len(x) for x in xs)), max(len(y) for y in ys) + 1
        src = np.zeros((B, S), dtype=np.int64)
        tgt_in = np.zeros((B, T), dtype=np.int64)
        targets = np.full((B, T), IGNORE, dtype=np.int64)
        for b, (x, y) in enumerate(zip(xs, ys)):
            src[b, :len(x)] = x
            tgt_in[b, 0] = self.bos_id
            tgt_in[b, 1:len(y) + 1] = y
            targets[b, :len(y)] = y
            targets[b, len(y)] = self.eos_id
        return Batch({"src": src, "tgt": tgt_in}, targets, n_tokens=int(src.size + tgt_in.size),
                     extra={"index": np.asarray(index)})

    def train_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        return self._batch("train", self.buckets.sample(batch_size, rng))

    def eval_batches(self, split: str, batch_size: int):
        """Fixed batches sorted by length; ``batch.extra["index"]`` gives each row's line in the split."""
        if split not in ("val", "test"):
            raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        for index in eval_order(self.lengths[split], batch_size):
            yield self._batch(split, index)

    def sources(self, split: str) -> list[str]:
        return list(self.text[split][0])

    def references(self, split: str) -> list[str]:
        return list(self.text[split][1])

    def encode_source(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(truncate(x, self.config["max_len"]), dtype=np.int64)
                for x in self.src_tokenizer.encode_batch(texts)]

    def decode_target(self, ids) -> str:
        """Target ids -> text, stopping at the first <eos>."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        stop = np.flatnonzero(ids == self.eos_id)
        return self.tgt_tokenizer.decode(ids[:stop[0]] if stop.size else ids)

    def evaluate(self, model, split: str) -> dict:
        return {}

    def model_config(self) -> dict:
        return {"src_vocab_size": self.src_tokenizer.vocab_size, "tgt_vocab_size": self.tgt_tokenizer.vocab_size,
                "src_pad_id": 0, "tgt_pad_id": 0, "max_len": int(self.config["max_len"])}

    def tokenizer_state(self) -> dict:
        return {"joint": self.config["joint_vocab"], "src": self.src_tokenizer.to_dict(),
                "tgt": None if self.config["joint_vocab"] else self.tgt_tokenizer.to_dict()}

    def describe(self) -> str:
        c = self.config
        n = {s: len(v[0]) for s, v in self.text.items()}
        vocab = (f"joint vocabulary {self.src_tokenizer.vocab_size:,}" if c["joint_vocab"] else
                 f"vocabularies {self.src_tokenizer.vocab_size:,} / {self.tgt_tokenizer.vocab_size:,}")
        return (f"multi30k {c['src_lang']}->{c['tgt_lang']}: {n['train']:,} train / {n['val']:,} val / "
                f"{n['test']:,} test pairs; {c['tokenizer']} tokenizer, {vocab}")
