"""The simple tokenizers: the synthetic tasks' symbols, characters, and words."""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from .base import (BOS, CLS, EOS, OPTIONAL_SPECIALS, PAD, UNK, SpecialsTokenizer, Tokenizer, normalize_text,
                   special_tokens, split_words)


class SymbolTokenizer(Tokenizer):
    """The vocabulary of the synthetic tasks ({"type": "symbols", "tokens": [...]}) as a tokenizer.

    encode: whitespace separates tokens; inside a chunk the longest vocabulary entry is taken first,
    so ``"0123<sep>3210"`` and ``"12 7 99"`` both work. Every entry is a special id (``special_id("<sep>")``).
    """

    _build_hint = ""

    def __init__(self, tokens: Sequence[str]):
        self.tokens = list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.tokens)}
        self.special_ids = self.stoi
        self.longest = max(len(t) for t in self.tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        ids = []
        for chunk in text.split():
            i = 0
            while i < len(chunk):
                for n in range(min(self.longest, len(chunk) - i), 0, -1):
                    if chunk[i:i + n] in self.stoi:
                        ids.append(self.stoi[chunk[i:i + n]])
                        i += n
                        break
                else:
                    shown = ", ".join(self.tokens[:20]) + (" ..." if len(self.tokens) > 20 else "")
                    raise ValueError(f"{chunk[i:]!r} is not in the run's vocabulary ({shown}); write the input "
                                     f"with these tokens, separated by spaces if needed")
        return ids

    def decode(self, ids) -> str:
        return " ".join(self.tokens[int(i)] for i in np.asarray(ids).reshape(-1))

    def to_dict(self) -> dict:
        return {"type": "symbols", "tokens": self.tokens}

    @classmethod
    def from_dict(cls, d: dict) -> "SymbolTokenizer":
        tokens = d["tokens"]
        if not (isinstance(tokens, list) and tokens and all(isinstance(t, str) and t for t in tokens)):
            raise ValueError("a symbols vocabulary is a non-empty list of non-empty strings")
        return cls(tokens)


def _code_points(text: str) -> np.ndarray:
    """The code point of each character of ``text``, (len(text),) uint32 (lone surrogates included)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


# ---------------------------------------------------------------------------------------------------------------
class UnknownCharacters(ValueError):
    """Text holding characters outside a character vocabulary: ``characters`` (sorted), ``vocab_size``."""

    def __init__(self, characters, vocab_size):
        self.characters, self.vocab_size = characters, vocab_size
        super().__init__(f"{len(characters)} character(s) not in the vocabulary of {vocab_size}: "
                         f"{''.join(characters)[:50]!r}; remove them (a trained model's vocabulary is fixed: "
                         "new characters need a tokenizer built from a text that holds them, and a model trained "
                         "with it)")


class CharTokenizer(Tokenizer):
    """One id per character. ``CharTokenizer.from_text(corpus)`` uses the sorted distinct characters.

    Encoding a character outside the vocabulary raises a ValueError that lists them.
    """

    def __init__(self, chars: Sequence[str]):
        chars = list(chars)
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer needs distinct single characters")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        if not text:
            raise ValueError("cannot build a character vocabulary from empty text")
        code_points = _code_points(text)
        return cls([chr(c) for c in np.flatnonzero(np.bincount(code_points))])    # = sorted(set(text)), faster

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            raise UnknownCharacters(sorted(set(text) - set(self.stoi)), self.vocab_size) from None

    def encode_array(self, text: str) -> np.ndarray:
        """``encode`` as an int64 array, vectorized: a table from code point to id (-1 outside the
        vocabulary), so that a corpus of a million characters takes milliseconds."""
        code_points = _code_points(text)
        vocab = np.array([ord(c) for c in self.chars], dtype=np.intp)
        table = np.full(int(vocab.max()) + 2, -1, dtype=np.int64)      # the last entry: beyond the vocabulary
        table[vocab] = np.arange(len(vocab))
        ids = table.take(np.minimum(code_points, len(table) - 1).astype(np.intp))
        if ids.size and ids.min() < 0:
            self.encode(text)                       # raises the ValueError naming the unknown characters
        return ids

    def token_bytes(self) -> np.ndarray:
        """The UTF-8 length of each character (1 for ASCII), for bits per byte."""
        return np.array([len(c.encode("utf-8")) for c in self.chars], dtype=np.int64)

    def decode(self, ids) -> str:
        n = self.vocab_size
        out = []
        for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            if not 0 <= i < n:
                raise ValueError(f"id {i} is outside the vocabulary [0, {n})")
            out.append(self.chars[i])
        return "".join(out)

    def to_dict(self) -> dict:
        return {"type": "char", "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        return cls(list(d["chars"]))


# ---------------------------------------------------------------------------------------------------------------
class WordTokenizer(SpecialsTokenizer):
    """Words and punctuation of normalized text (``normalize_text``: lowercased unless ``lowercase=False``);
    a vocabulary of the most frequent training words.

    Build with ``WordTokenizer.build(train_texts, min_freq=1, max_size=0, bos=False, eos=False,
    cls_token=False, lowercase=True)`` (the defaults): words seen fewer than ``min_freq`` times are
    dropped, then the most frequent are kept so that the vocabulary (special tokens included) has at
    most ``max_size`` entries (0 = no limit). Ties are broken alphabetically, so the vocabulary is a
    function of the texts alone. Unknown words map to ``<unk>`` (1).
    """

    def __init__(self, tokens: Sequence[str], lowercase: bool = True):
        tokens = list(tokens)
        if tokens[:2] != [PAD, UNK]:
            raise ValueError(f"a word vocabulary starts with {PAD!r}, {UNK!r}; got {tokens[:2]}")
        if len(set(tokens)) != len(tokens):
            raise ValueError("the word vocabulary has duplicate entries")
        self.tokens = tokens
        self.lowercase = lowercase
        self.stoi = {t: i for i, t in enumerate(tokens)}
        self.special_ids = {t: self.stoi[t] for t in (PAD, UNK) + OPTIONAL_SPECIALS if t in self.stoi}

    @classmethod
    def build(cls, texts: Iterable[str], min_freq: int = 1, max_size: int = 0, bos: bool = False,
              eos: bool = False, cls_token: bool = False, lowercase: bool = True) -> "WordTokenizer":
        specials = special_tokens(bos, eos, cls_token)
        if max_size and max_size <= len(specials):
            raise ValueError(f"max_size={max_size} leaves no room for words after the {len(specials)} special tokens")
        counts = Counter()
        for t in texts:
            counts.update(split_words(normalize_text(t, lowercase)))
        for s in specials:
            counts.pop(s, None)
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size:
            words = words[:max_size - len(specials)]
        return cls(specials + words, lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def tokenize(self, text: str) -> list[str]:
        return split_words(normalize_text(text, self.lowercase))

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, add_cls: bool = False) -> list[int]:
        get, unk = self.stoi.get, self.unk_id
        return self._wrap([get(w, unk) for w in self.tokenize(text)], add_bos, add_eos, add_cls)

    def decode(self, ids, skip_special: bool = True) -> str:
        """Tokens joined by spaces (word tokenization is lossy: case and spacing are not restored); with
        ``skip_special`` (the default) ``<pad>``, ``<bos>``, ``<eos>`` and ``<cls>`` are left out (``<unk>``
        is kept)."""
        n, out = self.vocab_size, []
        for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            if not 0 <= i < n:
                raise ValueError(f"id {i} is outside the vocabulary [0, {n})")
            tok = self.tokens[i]
            if skip_special and tok in (PAD, BOS, EOS, CLS):
                continue
            out.append(tok)
        return " ".join(out)

    def to_dict(self) -> dict:
        return {"type": "word", "lowercase": self.lowercase, "tokens": self.tokens}

    @classmethod
    def from_dict(cls, d: dict) -> "WordTokenizer":
        return cls(d["tokens"], d.get("lowercase", True))
