"""Character-level language modelling on a text file; tiny Shakespeare is built in.

The corpus is split as nanoGPT does — the first 90% for training, the last 10%
for validation — so that losses compare. The character vocabulary is built
from the whole text (as nanoGPT's prepare.py) and saved with the run.
Training batches are random windows of ``block_size + 1`` characters; the
validation loss is computed over every non-overlapping window of the
validation text (all of it, not a random sample), and a capped periodic
evaluation over a fixed sample of those windows spread over the whole text.
"""
from __future__ import annotations

from importlib import resources

import numpy as np

from .base import Batch, Task, register_task, spread_sample
from .files import expand_paths, read_text
from .tokenizers import CharTokenizer, restore_saved_tokenizer

BUILTIN_CORPUS = "tinyshakespeare.txt"


def read_corpus(path="", encoding="utf-8", paths=()):
    """The text of ``path`` and ``paths``, or the built-in tiny Shakespeare (public domain, 1,115,394 characters)
    when both are empty.

    Each of them may be a file, a folder (every file in it, recursively, in name order) or a glob
    pattern; several files are joined in that order, each ending with a line break. A file that is
    empty or not valid text in ``encoding`` is an error naming it (and the byte offset).
    """
    if not path and not paths:
        return resources.files("numformer.data").joinpath("corpora", BUILTIN_CORPUS).read_text(encoding="utf-8")
    try:
        files = expand_paths(path, paths)
    except FileNotFoundError as e:
        raise ValueError(f"[data] path: {e} (leave path empty for the built-in tiny Shakespeare)") from None
    texts = [read_text(f, encoding) for f in files]
    if len(texts) == 1:
        return texts[0]
    return "".join(t if t.endswith("\n") else t + "\n" for t in texts)


@register_task("text")
class TextTask(Task):
    """Next-character prediction with a GPT; ``model_config`` gives vocab_size and block_size."""

    model_type = "gpt"
    unit = "character"
    has_test_split = False      # "test" evaluates the validation text (there is no third split)
    data_keys = {"path": "", "paths": [], "block_size": 64, "val_fraction": 0.1, "encoding": "utf-8"}

    def __init__(self, data_config, seed=0, tokenizer_state=None):
        super().__init__(data_config, seed, tokenizer_state)
        c = self.config
        if not 0.0 < c["val_fraction"] < 1.0:
            raise ValueError(f"[data] val_fraction must be in (0, 1), got {c['val_fraction']}")
        if c["block_size"] < 1:
            raise ValueError(f"[data] block_size must be >= 1, got {c['block_size']}")
        text = read_corpus(c["path"], c["encoding"], c["paths"])
        self.source = ", ".join(filter(None, [c["path"], *c["paths"]])) or "tiny Shakespeare (built in)"
        # a saved or pretrained tokenizer (GPT-2's BPE when fine-tuning it), else the text's characters
        self.tokenizer = (restore_saved_tokenizer(tokenizer_state) if tokenizer_state
                          else CharTokenizer.from_text(text))
        self.unit = "character" if isinstance(self.tokenizer, CharTokenizer) else "token"
        ids = self.tokenizer.encode_array(text)
        n_train = int(len(ids) * (1.0 - c["val_fraction"]))
        self.splits = {"train": ids[:n_train], "val": ids[n_train:]}
        for name, data in self.splits.items():
            if len(data) <= c["block_size"]:
                raise ValueError(f"the {name} split has {len(data)} {self.unit}s, not more than block_size = "
                                 f"{c['block_size']}; use a longer text or a smaller block_size")

    def model_config(self):
        return {"vocab_size": self.tokenizer.vocab_size, "block_size": self.config["block_size"]}

    @classmethod
    def sizes_from_config(cls, data_config):
        """The built-in corpus's characters are known; a text file's are counted only by reading it."""
        c = {**cls.data_keys, **data_config}
        if c["path"] or c["paths"]:
            return None
        return {"vocab_size": CharTokenizer.from_text(read_corpus()).vocab_size, "block_size": c["block_size"]}

    def train_batch(self, batch_size, rng):
        data, T = self.splits["train"], self.config["block_size"]
        starts = rng.integers(0, len(data) - T, size=batch_size)
        windows = data[starts[:, None] + np.arange(T + 1)]
        return Batch({"idx": windows[:, :-1]}, windows[:, 1:])

    def eval_batches(self, split, batch_size):
        """Every non-overlapping window of the split ("test" is the validation text: there is no third split)."""
        return self._windows(split, batch_size, np.arange(self.eval_size(split)))

    def eval_size(self, split):
        """The number of non-overlapping windows of block_size + 1 characters (one shared) in the split."""
        return (len(self.splits["val" if split == "test" else split]) - 1) // self.config["block_size"]

    def eval_sample(self, split, batch_size, n_examples, seed=0):
        """``n_examples`` of the split's windows, spread over the whole split (``spread_sample``)."""
        return self._windows(split, batch_size, spread_sample(self.eval_size(split), n_examples, seed))

    def _windows(self, split, batch_size, windows):
        """Batches of the given windows (window i starts at character i × block_size)."""
        data, T = self.splits["val" if split == "test" else split], self.config["block_size"]
        starts = windows * T
        for i in range(0, len(starts), batch_size):
            chars = data[starts[i:i + batch_size, None] + np.arange(T + 1)]
            yield Batch({"idx": chars[:, :-1]}, chars[:, 1:])

    def tokenizer_state(self):
        return self.tokenizer.to_dict()

    def describe(self):
        return (f"{self.source}: {len(self.splits['train']):,} training and {len(self.splits['val']):,} validation "
                f"{self.unit}s, vocabulary of {self.tokenizer.vocab_size}")
