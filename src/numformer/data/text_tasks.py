"""Tasks on real text: IMDB and AG News classification, Multi30k translation.

Data locations: ``path`` (relative to the current working directory) when set;
otherwise each file is found by ``numformer.data.fetch``: in the data folder
named by ``NUMFORMER_DATA``, in the cache, or downloaded (checked against its
hash) from the official source. ``numformer data list`` shows where each is.

Splits of the classification tasks: "test" is the official test set; "val" is a
slice of the official training set held out with the run's seed (``val_size``
examples; 0 = a tenth), and "train" is the rest (optionally cut to ``n_train``
examples for quick runs). Multi30k uses its official train, val and test files.
Tokenizers are trained on the "train" part only.

Classification preprocessing (``encode_for_classifier``, shared by the tasks and
``numformer classify``): tokenize, prepend ``<cls>``, truncate to ``max_len``
tokens keeping the head, the tail, or both ends (``truncate``).
"""
from __future__ import annotations

import os

import numpy as np

from .._install import require
from .base import IGNORE, Batch, Task, register_task
from .batching import LengthBuckets, eval_mode, eval_order
from .fetch import locate
from .files import read_parallel
from .text_datasets import load_agnews, load_agnews_csv, load_imdb, load_parallel, read_class_names_file
from .tokenizers import BOS, EOS, build_tokenizer, restore_saved_tokenizer, special_tokens, token_labels, truncate

_VAL_SALT = 0xA11


def _split_train(n: int, val_size: int, n_train: int, seed: int, what: str, key: str = "val_size",
                 salt: int = _VAL_SALT):
    """(train indices, val indices): a seeded random slice of ``val_size`` for validation (0: a tenth of n)."""
    val_size = val_size or max(1, n // 10)
    if not 0 < val_size < n:
        raise ValueError(f"{what}: {key} must be between 1 and {n - 1} (the training set has {n}), got {val_size}")
    perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, salt]).permutation(n)
    val, train = perm[:val_size], perm[val_size:]
    if n_train < 0:
        raise ValueError(f"{what}: n_train must be >= 0 (0 = all), got {n_train}")
    if n_train:
        train = train[:n_train]
    return np.sort(train), np.sort(val)


def _data_error(e: Exception, key: str = "path") -> Exception:
    return type(e)(f"{e}. Set [data] {key} (relative paths are from the current directory, {os.getcwd()!r})")


def _restore_tokenizer(state: dict, kind: str, what: str):
    tok = restore_saved_tokenizer(state)
    if state.get("type") != kind:
        raise ValueError(f"{what}: the saved tokenizer is {state.get('type')!r} but [data] tokenizer = {kind!r}")
    return tok


TRUNCATIONS = ("head", "tail", "head_tail")


def _names(names, show: int = 8) -> str:
    """A list of class names for a message: the first ``show`` of them and how many there are."""
    names = list(names)
    listed = ", ".join(repr(str(x)[:30]) for x in names[:show])
    return f"[{listed}{', ...' if len(names) > show else ''}] ({len(names)})"


def encode_for_classifier(tokenizer, texts, max_len: int, cls_token: bool = True, keep: str = "head"):
    """Texts -> int64 id arrays as a classifier run sees them: ``<cls>`` (optional) + tokens, at most max_len.

    keep: "head" (the first max_len ids), "tail" (``<cls>`` + the last ones) or "head_tail"
    (``<cls>`` + the first half + the last half of the budget: the opening and the conclusion
    of a long review).
    """
    if keep not in TRUNCATIONS:
        raise ValueError(f"[data] truncate = {keep!r} is not supported; choose one of {list(TRUNCATIONS)}")
    out = []
    for ids in tokenizer.encode_batch(list(texts), add_cls=cls_token):
        if len(ids) > max_len and keep != "head":
            head, body = ids[:int(cls_token)], ids[int(cls_token):]
            room = max_len - len(head)
            if keep == "tail":
                ids = head + (body[len(body) - room:] if room else [])
            else:
                first = (room + 1) // 2
                ids = head + body[:first] + (body[len(body) - (room - first):] if room - first else [])
        out.append(np.asarray(truncate(ids, max_len), dtype=np.int64))
    return out


class TextClassificationTask(Task):
    """Shared by IMDB and AG News: texts -> ``<cls>`` + token ids (truncated to max_len) -> EncoderClassifier.

    The classifier is the model: the label is one of C classes for the whole text.
    ``label_names`` are the names shown to users (saved with the tokenizer, so that
    ``numformer classify`` needs only the run folder).
    """

    model_type = "classifier"
    model_types = ("classifier",)
    report_test = True              # the trainer scores the saved weights on the test split at the end
    common_keys = {
        "path": "",                 # data location (relative to the current directory; "": data folder, cache, fetch)
        "tokenizer": "word",        # "word" (lowercased words and punctuation) or "bpe" (byte-level BPE)
        "vocab_size": 20000,        # word: the most frequent words, specials included; bpe: the target size
        "min_freq": 2,              # words / merges seen fewer times in the training split are dropped
        "lowercase": True,
        "max_len": 256,             # tokens per text, <cls> included
        "truncate": "head",         # which part of a longer text to keep: "head", "tail" or "head_tail"
        "cls_token": True,          # prepend <cls> (for pooling = "first"; harmless for mean pooling)
        "val_size": 1000,           # training examples held out as the "val" split (chosen with the seed; 0 = a tenth)
        "n_train": 0,               # use only this many training examples (0 = all the rest)
        "n_test": 0,                # evaluate on a seeded random subset of this many test texts (0 = all)
        "buckets": 1,               # > 1: batch texts of similar length together (less padding, faster)
        "token_dropout": 0.0,       # training batches only: each word becomes <unk> with this probability
        "eval_batch_size": 128,     # batch size inside evaluate()
    }
    data_keys = common_keys
    n_classes: int | None = None    # a dataset's fixed number of classes (None: counted in the data)

    def load(self) -> tuple:
        """(train LabeledTexts, test LabeledTexts)."""
        raise NotImplementedError

    def __init__(self, data_config: dict, seed: int = 0, tokenizer_state: dict | None = None):
        super().__init__(data_config, seed, tokenizer_state)
        c = self.config
        if c["max_len"] < 2:
            raise ValueError(f"{self.name}: max_len must be >= 2, got {c['max_len']}")
        if not 0.0 <= c["token_dropout"] < 1.0:
            raise ValueError(f"{self.name}: token_dropout must be in [0, 1), got {c['token_dropout']}")
        try:
            full_train, test = self.load()
        except (FileNotFoundError, NotADirectoryError) as e:
            raise _data_error(e) from None
        self.class_names = full_train.class_names
        self.train_rows = len(full_train)            # the whole training file, before val / n_train are taken
        self.train_source = f"{full_train.source or self.name} ({self.train_rows:,} rows)"
        tr, va = _split_train(len(full_train), c["val_size"], c["n_train"], seed, self.name)
        if c["n_test"] < 0:
            raise ValueError(f"{self.name}: n_test must be >= 0 (0 = all), got {c['n_test']}")
        if 0 < c["n_test"] < len(test):
            test = test.subset(np.sort(np.random.default_rng([int(seed) & 0xFFFFFFFF, _VAL_SALT + 1])
                                       .permutation(len(test))[:c["n_test"]]))
        self.data = {"train": full_train.subset(tr), "val": full_train.subset(va), "test": test}
        if tokenizer_state is not None:
            self._check_saved_labels(tokenizer_state.get("label_names"))
            self.tokenizer = _restore_tokenizer(tokenizer_state, c["tokenizer"], self.name)
        else:
            self.tokenizer = build_tokenizer(c["tokenizer"], self.data["train"].texts, c["vocab_size"],
                                             c["min_freq"], c["lowercase"], cls_token=c["cls_token"])
        self.ids = {s: self.encode_texts(d.texts) for s, d in self.data.items()}
        self.lengths = {s: np.array([len(x) for x in v]) for s, v in self.ids.items()}
        self.buckets = LengthBuckets(self.lengths["train"], c["buckets"])

    def _check_saved_labels(self, saved) -> None:
        """One ValueError when a saved run's ``label_names`` (its tokenizer.json, read back on --resume, eval or
        init_from) are not the names this data gives, in the same order: label id i would then be another class
        than the one the model learned as class i. A state without label_names (an older or an LM run's) passes."""
        if saved is None or list(saved) == self.label_names:
            return
        raise ValueError(f"{self.name}: the run's classes (label_names in its tokenizer.json) are "
                         f"{_names(saved)} but the data gives {_names(self.label_names)}: each label id would name "
                         f"another class than the model learned; give the run's data (as it was when it trained), "
                         f"or train a new run")

    @property
    def label_names(self) -> list[str]:
        """The class names shown to users (IMDB: negative / positive)."""
        return list(self.class_names)

    def encode_texts(self, texts) -> list[np.ndarray]:
        """This task's preprocessing of raw texts: the run's tokenizer, ``<cls>``, truncation to max_len."""
        c = self.config
        return encode_for_classifier(self.tokenizer, texts, c["max_len"], c["cls_token"], c["truncate"])

    def token_labels(self, ids) -> list[str]:
        """A readable label per token id (words, or BPE pieces), for figures."""
        return token_labels(self.tokenizer, ids)

    def analysis_example(self, split: str = "test") -> tuple[dict, dict]:
        """A short text of the split (the first of 12 to 40 tokens in length order), labelled with its words."""
        lengths = self.lengths[split]
        order = np.argsort(lengths, kind="stable")
        fits = order[(lengths[order] >= 12) & (lengths[order] <= 40)]
        i = int(fits[0]) if fits.size else int(order[0])
        ids = self.ids[split][i][None]
        return {"ids": ids}, {"ids": self.token_labels(ids[0])}

    def _batch(self, split, index) -> Batch:
        seqs = [self.ids[split][i] for i in index]
        T = max(1, max(len(s) for s in seqs))
        ids = np.zeros((len(seqs), T), dtype=np.int64)            # <pad> = 0
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = s
        return Batch({"ids": ids}, self.data[split].labels[index], extra={"index": np.asarray(index)})

    def train_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        """Uniform (or length-bucketed) training texts; with ``token_dropout`` p, each token (a word, or a
        BPE piece; not ``<cls>``, not padding) is replaced by ``<unk>`` with probability p (drawn from ``rng``): a
        regularizer that keeps the classifier from leaning on a few words."""
        batch = self._batch("train", self.buckets.sample(batch_size, rng))
        p = float(self.config["token_dropout"])
        if p > 0:
            ids = batch.inputs["ids"]
            drop = (rng.random(ids.shape) < p) & (ids != 0)
            if self.config["cls_token"]:
                drop[:, 0] = False
            ids[drop] = self.tokenizer.unk_id
        return batch

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

    @classmethod
    def sizes_from_config(cls, data_config: dict) -> dict | None:
        if cls.n_classes is None:
            return None
        c = {**cls.data_keys, **data_config}
        return {"vocab_size": c["vocab_size"], "n_classes": cls.n_classes, "pad_id": 0, "max_len": c["max_len"]}

    def tokenizer_state(self) -> dict:
        """The tokenizer's state plus ``label_names`` (read back by ``numformer classify``)."""
        return {**self.tokenizer.to_dict(), "label_names": self.label_names}

    def describe(self) -> str:
        n = {s: len(d) for s, d in self.data.items()}
        mean_len = float(np.mean(self.lengths["train"]))
        return (f"{self.name}: {len(self.class_names)} classes, {n['train']:,} train / {n['val']:,} val / "
                f"{n['test']:,} test texts; {self.config['tokenizer']} tokenizer, vocabulary "
                f"{self.tokenizer.vocab_size:,}; max_len {self.config['max_len']} (mean {mean_len:.0f} tokens); "
                f"training file {self.train_source}")


@register_task("imdb")
class IMDBTask(TextClassificationTask):
    """IMDB sentiment (positive = 1, negative = 0): 25,000 training and 25,000 test reviews.

    ``path``: ``aclImdb_v1.tar.gz`` (read in place), the extracted ``aclImdb``
    folder, or a folder holding either; empty: found or fetched by ``numformer.data.fetch``.
    ``<br />`` tags are removed by the tokenizer.
    """

    data_keys = {**TextClassificationTask.common_keys, "val_size": 2500}
    n_classes = 2

    def load(self):
        d = load_imdb(self.config["path"] or str(locate("imdb")["aclImdb_v1.tar.gz"]))
        return d["train"], d["test"]

    @property
    def label_names(self) -> list[str]:
        full = {"neg": "negative", "pos": "positive"}
        return [full.get(n, n) for n in self.class_names]


@register_task("agnews")
class AGNewsTask(TextClassificationTask):
    """AG News topics (World, Sports, Business, Sci/Tech): text = title + description.

    ``path``: the folder of the CSV release (``train.csv`` or ``train_subset_20k.csv``,
    ``test.csv``, ``classes.txt``); ``train_file`` names another training CSV in it.
    Empty ``path``: the full 120,000-row ``train.csv`` from the data folder or the cache,
    else the data folder's ``train_subset_20k.csv``, else downloaded (``numformer.data.fetch``).
    ``describe()`` names the training file used (as for every classification task).
    """

    data_keys = {**TextClassificationTask.common_keys, "max_len": 128, "train_file": ""}
    n_classes = 4

    def load(self):
        p = self.config["path"]
        if p:
            return load_agnews(p, "train", self.config["train_file"]), load_agnews(p, "test")
        if self.config["train_file"]:
            raise ValueError("agnews: train_file names a file in [data] path; set path to the folder holding it")
        files = locate("agnews")
        classes = str(files["ag_news_csv/classes.txt"])
        names = read_class_names_file(classes)
        return (load_agnews_csv(str(files["ag_news_csv/train.csv"]), names, classes),
                load_agnews_csv(str(files["ag_news_csv/test.csv"]), names, classes))


# ---------------------------------------------------------------------------------------------------------------
@register_task("multi30k")
class Multi30kTask(Task):
    """Multi30k translation (default German -> English) for the encoder-decoder Transformer.

    Teacher forcing: inputs ``{"src": x, "tgt": <bos> y}``, targets ``y <eos>``
    (padding = IGNORE; the model masks padding from ``src_pad_id`` / ``tgt_pad_id`` = 0).
    Tokenizers are trained on the training split: one per language, or one
    joint vocabulary (``joint_vocab``, which lets the model share embeddings).
    Training batches draw a length bucket, then sentence pairs within it, to
    limit padding.

    BLEU (``evaluate``): the split's sources are translated (batched, sorted by
    length) with greedy decoding and with beam search (``beam_size``,
    ``length_penalty``), the target ids are detokenized by the target tokenizer
    and scored with sacrebleu's ``corpus_bleu`` (default settings: 13a
    tokenization, mixed case) against the raw reference lines; with
    ``lowercase`` (the tokenizers lowercase the text, so the output is lowercase) the score ignores
    case (sacrebleu's ``lowercase=True``), so that like is compared with like. On "test" this
    gives ``bleu_greedy`` and ``bleu_beam``; on "val" (the trainer's periodic
    evaluations) only greedy BLEU on the first ``val_bleu_pairs`` pairs, and
    nothing when that is 0 (the default: validation loss only).
    ``last_translations`` keeps the hypotheses of the latest evaluation.
    """

    model_type = "transformer"
    model_types = ("transformer",)
    report_test = True              # the trainer scores the saved weights on the test split (BLEU) at the end
    data_keys = {
        "path": "",                          # folder with {train,val,test_2016_flickr}.{de,en}.gz ("": fetch)
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
        "eval_batch_size": 128,              # sentences per decoding batch in evaluate()
        "n_eval": 0,                         # use only the first n val and test pairs (0 = all; for quick runs)
        "beam_size": 4,                      # beam search width for the test BLEU (1: greedy only)
        "length_penalty": 1.0,               # beam score = log-prob / length ** length_penalty
        "val_bleu_pairs": 0,                 # periodic evaluations: greedy BLEU on the first n val pairs (0: none)
    }

    def __init__(self, data_config: dict, seed: int = 0, tokenizer_state: dict | None = None):
        super().__init__(data_config, seed, tokenizer_state)
        require(("sacrebleu",), f"the {self.name} task (its test BLEU)")   # before training, not at its end
        c = self.config
        if c["max_len"] < 2:
            raise ValueError(f"{self.name}: max_len must be >= 2, got {c['max_len']}")
        for key in ("n_eval", "val_bleu_pairs"):
            if c[key] < 0:
                raise ValueError(f"{self.name}: {key} must be >= 0 (0 = all / none), got {c[key]}")
        if c["beam_size"] < 1:
            raise ValueError(f"{self.name}: beam_size must be >= 1 (1 = greedy only), got {c['beam_size']}")
        try:
            self.text = self.load_text()
        except (FileNotFoundError, NotADirectoryError) as e:
            raise _data_error(e) from None
        if c["n_train"] < 0:
            raise ValueError(f"{self.name}: n_train must be >= 0 (0 = all), got {c['n_train']}")
        if c["n_train"]:
            src, tgt = self.text["train"]
            self.text["train"] = (src[:c["n_train"]], tgt[:c["n_train"]])
        if c["n_eval"]:
            for s in ("val", "test"):
                src, tgt = self.text[s]
                self.text[s] = (src[:c["n_eval"]], tgt[:c["n_eval"]])
        self.last_translations = {}
        kind = c["tokenizer"]
        if tokenizer_state is not None:
            if bool(tokenizer_state.get("joint")) != c["joint_vocab"]:
                raise ValueError(f"{self.name}: the saved tokenizer's joint_vocab differs from [data] joint_vocab")
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

    def load_text(self) -> dict:
        """{"train"|"val"|"test": (sources, targets)} from ``path``, else the data folder, cache or a download."""
        c = self.config
        if c["src_lang"] == c["tgt_lang"]:
            raise ValueError(f"multi30k: src_lang and tgt_lang are both {c['src_lang']!r}")
        stems = {"train": "train", "val": "val", "test": c["test_name"]}
        if c["path"]:
            return {s: load_parallel(c["path"], f, c["src_lang"], c["tgt_lang"]) for s, f in stems.items()}
        langs = (c["src_lang"], c["tgt_lang"])
        wanted = [f"multi30k/{stem}.{lang}.gz" for stem in stems.values() for lang in langs]
        if set(langs) != {"de", "en"} or c["test_name"] != "test_2016_flickr":
            raise FileNotFoundError(f"the download registry holds Multi30k's train, val and test_2016_flickr in de "
                                    f"and en only, not {', '.join(wanted)}: download those files and point "
                                    f"[data] path at their folder")
        files = locate("multi30k", wanted)
        return {s: read_parallel(files[f"multi30k/{stem}.{langs[0]}.gz"], files[f"multi30k/{stem}.{langs[1]}.gz"])
                for s, stem in stems.items()}

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
        """Target ids -> text, stopping at the first ``<eos>``."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        stop = np.flatnonzero(ids == self.eos_id)
        return self.tgt_tokenizer.decode(ids[:stop[0]] if stop.size else ids)

    def translate(self, model, texts: list[str], beam_size: int = 1, length_penalty: float | None = None,
                  max_length: int | None = None) -> list[str]:
        """Translate source sentences with ``model`` (greedy for beam_size 1, else beam search)."""
        lp = self.config["length_penalty"] if length_penalty is None else length_penalty
        return translate_texts(model, self.src_tokenizer, self.tgt_tokenizer, texts, beam_size=beam_size,
                               length_penalty=lp, max_length=max_length, max_src_len=self.config["max_len"],
                               batch_size=int(self.config["eval_batch_size"]))

    def time_metrics(self, model, split: str, examples: int = 8) -> float:
        """Seconds per pair of ``evaluate``'s decoding on ``split`` (greedy, and beam search on "test") at its
        slowest, what a time budget plans the end's test BLEU with: ``examples`` sources spread over the split are
        decoded as one batch, and each decoding's time is scaled from the steps it took to the model's
        ``max_len``, which no translation exceeds (whatever the weights, now or after training)."""
        import time

        sources = self.sources(split)
        sources = [sources[i] for i in np.linspace(0, len(sources) - 1, min(examples, len(sources)), dtype=int)]
        ids = [truncate(x, self.config["max_len"]) or [0] for x in self.src_tokenizer.encode_batch(sources)]
        src = np.zeros((len(ids), max(map(len, ids))), dtype=np.int64)
        for row, x in enumerate(ids):
            src[row, :len(x)] = x
        limit = min(model.max_len, int(1.5 * src.shape[1]) + 10)
        beams = [1] + ([int(self.config["beam_size"])] if split == "test" and self.config["beam_size"] > 1 else [])
        seconds = 0.0
        for k in beams:
            started = time.perf_counter()
            hyps = model.generate(src, max_length=limit, bos_id=self.bos_id, eos_id=self.eos_id,
                                  **({"greedy": True} if k == 1 else {"beam_size": k}))
            steps = min(limit, max(map(len, hyps)) + 1)
            seconds += (time.perf_counter() - started) * model.max_len / steps
        return seconds / len(ids)

    def evaluate(self, model, split: str) -> dict:
        """Corpus BLEU (sacrebleu defaults) of the split's translations; see the class docstring."""
        import time

        if split not in ("val", "test"):
            raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        sources, refs = self.sources(split), self.references(split)
        if split == "val":
            n = int(self.config["val_bleu_pairs"])
            if not n:
                return {}
            sources, refs = sources[:n], refs[:n]
        self.last_translations = {"split": split, "sources": sources, "references": refs}
        out = {}
        beams = [1] + ([int(self.config["beam_size"])] if split == "test" and self.config["beam_size"] > 1 else [])
        for k in beams:
            name = "greedy" if k == 1 else "beam"
            started = time.perf_counter()
            hyps = self.translate(model, sources, beam_size=k)
            seconds = time.perf_counter() - started
            self.last_translations[name] = hyps
            self.last_translations[f"{name}_seconds"] = seconds
            out[f"bleu_{name}"] = corpus_bleu(hyps, refs, lowercase=self.config["lowercase"])
            if split == "test":
                out[f"decode_{name}_s"] = round(seconds, 2)
        return out

    def token_labels(self, ids, side: str = "src") -> list[str]:
        """A readable label per token id (for attention maps): words, subwords as ``##piece``, specials as is."""
        tok = self.src_tokenizer if side == "src" else self.tgt_tokenizer
        return token_labels(tok, ids)

    def analysis_example(self, split: str = "test") -> tuple[dict, dict]:
        """A test pair of moderate length (teacher forcing: tgt = ``<bos>`` + reference), labelled with its tokens."""
        xs, ys = self.ids[split]
        lengths = np.array([len(x) for x in xs])
        fits = np.flatnonzero((lengths >= 8) & (lengths <= 14))
        i = int(fits[0]) if fits.size else 0
        src = xs[i][None]
        tgt = np.concatenate([[self.bos_id], ys[i]]).astype(np.int64)[None]
        return {"src": src, "tgt": tgt}, {"src": self.token_labels(src[0], "src"),
                                          "tgt": self.token_labels(tgt[0], "tgt")}

    def model_config(self) -> dict:
        return {"src_vocab_size": self.src_tokenizer.vocab_size, "tgt_vocab_size": self.tgt_tokenizer.vocab_size,
                "src_pad_id": 0, "tgt_pad_id": 0, "bos_id": int(self.bos_id), "eos_id": int(self.eos_id),
                "max_len": int(self.config["max_len"])}

    @classmethod
    def sizes_from_config(cls, data_config: dict) -> dict | None:
        c = {**cls.data_keys, **data_config}
        bos, eos = (special_tokens(bos=True, eos=True, cls=False).index(t) for t in (BOS, EOS))
        return {"src_vocab_size": c["vocab_size"], "tgt_vocab_size": c["vocab_size"], "src_pad_id": 0,
                "tgt_pad_id": 0, "bos_id": bos, "eos_id": eos, "max_len": c["max_len"]}

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


# ------------------------------------------------------------------------------------------------ translation
def translate_texts(model, src_tokenizer, tgt_tokenizer, texts, beam_size: int = 1, length_penalty: float = 1.0,
                    max_length: int | None = None, max_src_len: int | None = None, batch_size: int = 64):
    """Translate ``texts`` with an encoder-decoder ``model``; returns one detokenized string per text.

    Sources are encoded by ``src_tokenizer`` (unknown words map to ``<unk>``;
    truncated to ``max_src_len`` tokens), sorted by length and decoded in batches
    of ``batch_size``, with the decoder's key/value cache: greedy decoding for
    ``beam_size`` 1, else beam search with ``length_penalty``. A batch generates
    at most ``max_length`` tokens per sentence (default: 1.5 × its longest source
    + 10, within the model's ``max_len``). Target ids are detokenized by
    ``tgt_tokenizer`` (for byte-level BPE this restores the original spacing).
    An empty sentence raises a ValueError naming it.
    """
    texts = list(texts)
    if not texts:
        return []
    bos, eos = tgt_tokenizer.special_id(BOS), tgt_tokenizer.special_id(EOS)
    ids = [truncate(x, max_src_len or 0) for x in src_tokenizer.encode_batch(texts)]
    for i, (t, x) in enumerate(zip(texts, ids)):
        if not x:
            where = "" if len(texts) == 1 else f" (number {i + 1} of {len(texts)})"
            raise ValueError(f"empty source sentence{where}: {t!r} has no tokens; give some text to translate")
    if max_length is not None and not 1 <= max_length <= model.max_len:
        raise ValueError(f"max_length must be between 1 and the model's max_len {model.max_len}, got {max_length}")
    out = [""] * len(texts)
    for index in eval_order([len(x) for x in ids], max(1, int(batch_size))):
        S = max(len(ids[i]) for i in index)
        src = np.zeros((len(index), S), dtype=np.int64)       # <pad> = 0, masked by the model
        for b, i in enumerate(index):
            src[b, :len(ids[i])] = ids[i]
        n = max_length or min(model.max_len, int(1.5 * S) + 10)
        if beam_size > 1:
            hyps = model.generate(src, max_length=n, beam_size=int(beam_size), length_penalty=length_penalty,
                                  bos_id=bos, eos_id=eos)
        else:
            hyps = model.generate(src, max_length=n, greedy=True, bos_id=bos, eos_id=eos)
        for i, h in zip(index, hyps):
            out[i] = tgt_tokenizer.decode(h)
    return out


def corpus_bleu(hypotheses, references, lowercase=False) -> float:
    """sacrebleu's corpus BLEU with its default settings (13a tokenization, mixed case), one reference each;
    ``lowercase=True`` ignores case (for a lowercased model output).

    Both sides are detokenized text: the hypotheses as the target tokenizer decodes
    them, the references as the raw lines of the corpus.
    """
    require(("sacrebleu",), "BLEU")
    import sacrebleu
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    return float(sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase).score)


def bleu_signature(hypotheses, references, lowercase=False) -> str:
    """sacrebleu's signature of ``corpus_bleu``'s settings (nrefs, case, tokenization, version), for reports."""
    import sacrebleu

    bleu = sacrebleu.BLEU(lowercase=lowercase)
    bleu.corpus_score(list(hypotheses), [list(references)])
    return str(bleu.get_signature())
