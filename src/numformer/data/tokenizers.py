"""Tokenizers: characters, words, and byte-level BPE; padding and truncation helpers.

All share one small interface (the ``Tokenizer`` base class)::

    tok.encode(text) -> list[int]          tok.decode(ids) -> str
    tok.encode_batch(texts)                tok.vocab_size
    tok.to_dict() -> JSON-able dict        tokenizer_from_dict(d) -> the same tokenizer

``WordTokenizer`` and ``BPETokenizer`` reserve the same special ids: ``<pad>`` = 0
and ``<unk>`` = 1, then the optional ``<bos>``, ``<eos>``, ``<cls>`` in that
order; their vocabularies are built from the training split only (the caller
passes only training texts). Both normalize text the same way first
(``normalize_text``): IMDB's ``<br />`` tags become spaces and, by default,
text is lowercased.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Sequence

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
    """The special tokens at the start of a built vocabulary, in id order (<pad> = 0, <unk> = 1, ...)."""
    return [PAD, UNK] + [s for s, on in zip(OPTIONAL_SPECIALS, (bos, eos, cls)) if on]


class Tokenizer:
    """What every tokenizer shares. A subclass defines ``encode(text)``, ``decode(ids)``, ``vocab_size``
    and ``to_dict()``, and ``special_ids`` ({token: id}) when its vocabulary has special tokens."""

    special_ids: dict = {}
    _build_hint = "; build it with that option"

    def encode_batch(self, texts: Iterable[str], **kw) -> list[list[int]]:
        return [self.encode(t, **kw) for t in texts]

    def special_id(self, token: str) -> int:
        """The id of a special token (``<bos>``, ``<eos>``, ``<cls>`` ...); a clear error if the vocabulary
        has none."""
        if token not in self.special_ids:
            raise ValueError(f"this vocabulary has no {token} token{self._build_hint}")
        return self.special_ids[token]


class SpecialsTokenizer(Tokenizer):
    """A vocabulary that starts with ``<pad>`` = 0 and ``<unk>`` = 1, then the optional ``<bos>``, ``<eos>``,
    ``<cls>`` (``WordTokenizer`` and ``BPETokenizer``)."""

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
    if hasattr(tokenizer, "hf"):
        labels = []
        for i in ids:
            piece = tokenizer.hf.id_to_token(i) or "?"
            if piece.startswith("<") and piece.endswith(">"):
                labels.append(piece)
                continue
            text = tokenizer.hf.decode([i], skip_special_tokens=False)
            labels.append(text.strip() if piece.startswith("\u0120") else "##" + text.strip())
        return labels
    if hasattr(tokenizer, "tokens"):
        return [tokenizer.tokens[i] for i in ids]
    if hasattr(tokenizer, "chars"):
        return [tokenizer.chars[i] for i in ids]
    return [tokenizer.decode([i]) for i in ids]


class SymbolTokenizer(Tokenizer):
    """The vocabulary of the synthetic tasks ({"type": "symbols", "tokens": [...]}) as a tokenizer.

    encode: whitespace separates tokens; inside a chunk the longest vocabulary entry is taken first,
    so "0123<sep>3210" and "12 7 99" both work. Every entry is a special id (``special_id("<sep>")``).
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


# ---------------------------------------------------------------------------------------------------------------
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
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            unknown = sorted(set(text) - set(self.stoi))
            raise ValueError(f"{len(unknown)} character(s) not in the vocabulary of {self.vocab_size}: "
                             f"{''.join(unknown)[:50]!r}; remove them or rebuild the tokenizer "
                             "from a text that contains them") from None

    def encode_array(self, text: str) -> np.ndarray:
        """``encode`` as an int64 array (fast path for long corpora)."""
        return np.asarray(self.encode(text), dtype=np.int64)

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
    """Lowercased words and punctuation; a vocabulary of the most frequent training words.

    Build with ``WordTokenizer.build(train_texts, min_freq=2, max_size=20000, bos=.., eos=.., cls=..)``:
    words seen fewer than ``min_freq`` times are dropped, then the most frequent
    are kept so that the vocabulary (special tokens included) has at most
    ``max_size`` entries (0 = no limit). Ties are broken alphabetically, so the
    vocabulary is a function of the texts alone. Unknown words map to ``<unk>`` (1).
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
        """Tokens joined by spaces (word tokenization is lossy: case and spacing are not restored)."""
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


# ---------------------------------------------------------------------------------------------------------------
def _hf():
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the BPE tokenizer needs Hugging Face `tokenizers`: pip install 'numformer[nlp]' "
                          "(or pip install tokenizers), or use tokenizer = \"word\"") from e
    return tokenizers


class BPETokenizer(SpecialsTokenizer):
    """Byte-level BPE (GPT-2 style), a thin wrapper over Hugging Face ``tokenizers``.

    ``BPETokenizer.build(train_texts, vocab_size=8000, min_freq=2, ...)`` learns
    the merges from the training texts only. Byte-level means there are no
    unknown inputs: any text encodes, and ``decode`` gives the normalized text
    back. Special ids match WordTokenizer's (``<pad>`` = 0, ``<unk>`` = 1, then
    ``<bos>``, ``<eos>``, ``<cls>`` if asked for). ``to_dict`` stores the HF
    tokenizer's own JSON string.
    """

    def __init__(self, hf_tokenizer, lowercase: bool = True):
        self.hf = hf_tokenizer
        self.lowercase = lowercase
        self.special_ids = {s: self.hf.token_to_id(s) for s in (PAD, UNK) + OPTIONAL_SPECIALS
                            if self.hf.token_to_id(s) is not None}
        if self.special_ids.get(PAD) != 0 or self.special_ids.get(UNK) != 1:
            raise ValueError(f"a BPE vocabulary must have {PAD!r} = 0 and {UNK!r} = 1")

    @classmethod
    def build(cls, texts: Iterable[str], vocab_size: int = 8000, min_freq: int = 2, bos: bool = False,
              eos: bool = False, cls_token: bool = False, lowercase: bool = True) -> "BPETokenizer":
        hf = _hf()
        from tokenizers import decoders, models, pre_tokenizers, trainers

        specials = special_tokens(bos, eos, cls_token)
        tok = hf.Tokenizer(models.BPE(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_freq, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator((normalize_text(t, lowercase) for t in texts), trainer=trainer)
        return cls(tok, lowercase)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, add_cls: bool = False) -> list[int]:
        return self._wrap(self.hf.encode(normalize_text(text, self.lowercase), add_special_tokens=False).ids,
                          add_bos, add_eos, add_cls)

    def encode_batch(self, texts: Iterable[str], add_bos=False, add_eos=False, add_cls=False) -> list[list[int]]:
        encs = self.hf.encode_batch([normalize_text(t, self.lowercase) for t in texts], add_special_tokens=False)
        return [self._wrap(e.ids, add_bos, add_eos, add_cls) for e in encs]

    def decode(self, ids, skip_special: bool = True) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"id {bad[0]} is outside the vocabulary [0, {n})")
        return self.hf.decode(ids, skip_special_tokens=skip_special).strip()

    def to_dict(self) -> dict:
        return {"type": "bpe", "lowercase": self.lowercase, "hf_json": self.hf.to_str()}

    @classmethod
    def from_dict(cls, d: dict) -> "BPETokenizer":
        return cls(_hf_from_json(d["hf_json"]), d.get("lowercase", True))


class PretrainedTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer used exactly as its model was trained with it
    (GPT-2's byte-level BPE, ``numformer.interop.hf``): no normalization, no special ids of
    numformer's own. ``decode`` keeps every space, so ``decode(encode(text)) == text``.

    ``eos_id`` / ``bos_id``: the model's end / start token ids (GPT-2: 50256, ``<|endoftext|>``), or None;
    ``special_id("<eos>")`` / ``special_id("<bos>")`` give them too.
    """

    _build_hint = " (the model's config.json names no such id)"

    def __init__(self, hf_tokenizer, eos_id=None, bos_id=None):
        self.hf = hf_tokenizer
        self.eos_id, self.bos_id = eos_id, bos_id
        self.special_ids = {t: i for t, i in ((EOS, eos_id), (BOS, bos_id)) if i is not None}

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special: bool = False) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"id {bad[0]} is outside the tokenizer's vocabulary [0, {self.vocab_size})")
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    def to_dict(self) -> dict:
        return {"type": "hf", "hf_json": self.hf.to_str(), "eos_id": self.eos_id, "bos_id": self.bos_id}

    @classmethod
    def from_dict(cls, d: dict) -> "PretrainedTokenizer":
        return cls(_hf_from_json(d["hf_json"]), d.get("eos_id"), d.get("bos_id"))


def _hf_from_json(hf_json):
    """A Hugging Face ``tokenizers.Tokenizer`` from its saved JSON text (``to_str()``); ValueError for anything
    else (the library raises a bare Exception for bad JSON)."""
    if not isinstance(hf_json, str):
        raise TypeError(f"hf_json is a {type(hf_json).__name__}, not a string")
    try:
        return _hf().Tokenizer.from_str(hf_json)
    except Exception as e:   # noqa: BLE001 -- the tokenizers library raises a bare Exception for bad JSON
        raise ValueError(f"hf_json is not a Hugging Face tokenizer ({' '.join(str(e).split())})") from None


TOKENIZER_TYPES = {"char": CharTokenizer, "word": WordTokenizer, "bpe": BPETokenizer, "hf": PretrainedTokenizer,
                   "symbols": SymbolTokenizer}


def tokenizer_from_dict(d: dict):
    """Rebuild any tokenizer from its ``to_dict()``."""
    kind = d.get("type") if isinstance(d, dict) else None
    if not isinstance(kind, str) or kind not in TOKENIZER_TYPES:
        raise ValueError(f"unknown tokenizer type {kind!r} in the saved state; expected one of "
                         f"{sorted(TOKENIZER_TYPES)}")
    return TOKENIZER_TYPES[kind].from_dict(d)


def restore_saved_tokenizer(state: dict):
    """``tokenizer_from_dict`` of a run's saved state (its tokenizer.json): a damaged state is one ValueError
    naming that file, whatever the tokenizer's own parser raised."""
    try:
        return tokenizer_from_dict(state)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"the saved tokenizer (the run's tokenizer.json) is damaged ({type(e).__name__}: {e}); "
                         f"restore it or retrain") from None


def build_tokenizer(kind: str, texts: Sequence[str], vocab_size: int, min_freq: int, lowercase: bool = True,
                    bos: bool = False, eos: bool = False, cls_token: bool = False):
    """A "word" or "bpe" tokenizer trained on ``texts`` (the training split)."""
    if kind == "word":
        return WordTokenizer.build(texts, min_freq=min_freq, max_size=vocab_size, bos=bos, eos=eos,
                                   cls_token=cls_token, lowercase=lowercase)
    if kind == "bpe":
        return BPETokenizer.build(texts, vocab_size=vocab_size, min_freq=min_freq, bos=bos, eos=eos,
                                  cls_token=cls_token, lowercase=lowercase)
    raise ValueError(f"[data] tokenizer = {kind!r} is not supported; choose \"word\" or \"bpe\"")


# ---------------------------------------------------------------------------------------------------------------
def truncate(ids: Sequence[int], max_len: int, keep: str = "head") -> list[int]:
    """At most ``max_len`` ids: the first ones (keep="head") or the last ones (keep="tail")."""
    ids = list(ids)
    if max_len <= 0 or len(ids) <= max_len:
        return ids
    if keep == "head":
        return ids[:max_len]
    if keep == "tail":
        return ids[-max_len:]
    raise ValueError(f"keep must be 'head' or 'tail', got {keep!r}")


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None,
              max_len: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id sequences into (ids (B, T), key_padding_mask (B, T)).

    T is ``length`` if given, else the longest sequence (after truncation to
    ``max_len`` when > 0). The mask is True at padding positions (torch.nn's
    convention: True = masked out), so padding never receives attention; the
    models derive the same mask from ``pad_id`` when none is passed.
    """
    if max_len > 0:
        seqs = [truncate(s, max_len) for s in seqs]
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    T = int(lens.max(initial=0)) if length is None else length
    if (lens > T).any():
        raise ValueError(f"a sequence of length {int(lens.max())} does not fit length={T}; truncate first")
    ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    mask = np.arange(T)[None, :] >= lens[:, None]
    return ids, mask
