"""What every tokenizer shares: the interface, numformer's special tokens, and text normalization.

Every tokenizer has ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``encode_batch(texts)``,
``vocab_size`` and ``to_dict()`` (JSON-able; ``tokenizer_from_dict`` rebuilds the same tokenizer).

``WordTokenizer`` and ``NormalizedBPE`` (the classifiers' and translators' tokenizers) reserve the same
special ids: ``<pad>`` = 0 and ``<unk>`` = 1, then the optional ``<bos>``, ``<eos>``, ``<cls>`` in that
order; their vocabularies are built from the training split only (the caller passes only training texts).
Both normalize text the same way first (``normalize_text``): IMDB's ``<br />`` tags become spaces and, by
default, text is lowercased.
"""
from __future__ import annotations

import re
from typing import Iterable

import numpy as np

PAD, UNK, BOS, EOS, CLS = "<pad>", "<unk>", "<bos>", "<eos>", "<cls>"
OPTIONAL_SPECIALS = (BOS, EOS, CLS)

_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
# A word is a run of letters/digits (any script), with inner apostrophes kept ("don't", "o'clock");
# every other non-space character (punctuation, symbols) is a token of its own.
_WORD = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def normalize_text(text: str, lowercase: bool = True) -> str:
    """Replace HTML line breaks (``<br />``, ``<br>``) with spaces and optionally lowercase."""
    text = _BR.sub(" ", text)
    return text.lower() if lowercase else text


def split_words(text: str) -> list[str]:
    """Split normalized text into words and single punctuation characters: "Great!!" -> ["Great", "!", "!"]."""
    return _WORD.findall(text)


def special_tokens(bos: bool, eos: bool, cls: bool) -> list[str]:
    """The special tokens at the start of a built vocabulary, in id order (``<pad>`` = 0, ``<unk>`` = 1, ...)."""
    return [PAD, UNK] + [s for s, on in zip(OPTIONAL_SPECIALS, (bos, eos, cls)) if on]


class Tokenizer:
    """What every tokenizer shares. A subclass defines ``encode(text)``, ``decode(ids)``, ``vocab_size``
    and ``to_dict()``, and ``special_ids`` ({token: id}) when its vocabulary has special tokens."""

    special_ids: dict = {}
    files: dict = {}        # a model's side files (PretrainedTokenizer.files), e.g. a fine-tuned run's chat template
    _build_hint = "; build it with that option"

    def encode_batch(self, texts: Iterable[str], **kw) -> list[list[int]]:
        return [self.encode(t, **kw) for t in texts]

    def encode_prompt(self, text: str) -> list[int]:
        """The ids of a prompt to continue (``numformer generate``, the explorer): ``encode``'s, to which a
        Hugging Face tokenizer adds the special tokens its models expect around a text."""
        return self.encode(text)

    def encode_array(self, text: str) -> np.ndarray:
        """``encode`` as an int64 array."""
        return np.asarray(self.encode(text), dtype=np.int64)

    def special_id(self, token: str) -> int:
        """The id of a special token (``<bos>``, ``<eos>``, ``<cls>`` ...); a clear error if the vocabulary
        has none."""
        if token not in self.special_ids:
            raise ValueError(f"this vocabulary has no {token} token{self._build_hint}")
        return self.special_ids[token]

    def token_bytes(self) -> np.ndarray | None:
        """The number of UTF-8 bytes of text each id stands for, (vocab_size,) int64 (0 for special tokens),
        for bits per byte; None when the tokenizer cannot tell."""
        return None

    def _check_ids(self, ids) -> list[int]:
        """ids as a flat list of Python ints; ValueError naming the first id outside the vocabulary."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"id {bad[0]} is outside the vocabulary [0, {n})")
        return ids


class SpecialsTokenizer(Tokenizer):
    """A vocabulary that starts with ``<pad>`` = 0 and ``<unk>`` = 1, then the optional ``<bos>``, ``<eos>``,
    ``<cls>`` (``WordTokenizer`` and ``NormalizedBPE``)."""

    pad_id = 0
    unk_id = 1

    def _wrap(self, ids, add_bos=False, add_eos=False, add_cls=False) -> list[int]:
        """ids with ``<cls>`` / ``<bos>`` in front and ``<eos>`` at the end, as asked."""
        ids = list(ids)
        if add_cls:
            ids.insert(0, self.special_id(CLS))
        if add_bos:
            ids.insert(0, self.special_id(BOS))
        if add_eos:
            ids.append(self.special_id(EOS))
        return ids


def token_labels(tokenizer, ids) -> list[str]:
    """One readable label per token id (for attention maps and saliency): the symbol, character or word;
    a BPE piece as text, written ``##piece`` when it continues a word (e.g. "unbeliev", "##able")."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if hasattr(tokenizer, "piece_label"):
        return [tokenizer.piece_label(i) for i in ids]
    if hasattr(tokenizer, "tokens"):
        return [tokenizer.tokens[i] for i in ids]
    if hasattr(tokenizer, "chars"):
        return [tokenizer.chars[i] for i in ids]
    return [tokenizer.decode([i]) for i in ids]


def word_piece_label(token: str, text: str) -> str:
    """The label of a BPE token: a special token as it is, else its text, marked ``##`` when it continues a
    word (a byte-level token that starts a word starts with a space)."""
    if token.startswith("<") and token.endswith(">"):
        return token
    return text.strip() if text.startswith(" ") else "##" + text.strip()
