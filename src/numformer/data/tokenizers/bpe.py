"""Byte-level BPE written out: ``ByteLevelBPE``, the tokenizer of GPT-2, Llama 3 and Qwen2, and of numformer's
language models.

Encoding a text takes four steps, each a few lines below:

1. added tokens (``<|endoftext|>`` ...) are cut out of the text first and become their own ids
   (``allowed_special`` decides which special ones may appear in the text);
2. each stretch between them is normalized (most byte-level tokenizers do nothing here) and split into pieces
   by a regex (``PreTokenizer``: words with their leading space, numbers, punctuation, white space).
   As in ``tokenizers``, step 1 matches only the added tokens marked ``normalized=False``; those marked
   ``normalized=True`` are matched after the normalizer, in the normalized stretch, as normalized themselves
   (with a Lowercase normalizer ``"<EXTRA>"`` matches ``"<extra>"`` too);
3. each piece is written as bytes, one printable character per byte (``to_byte_chars``);
4. each piece's characters are merged by the merge rules, lowest rank first (``bpe``): among the adjacent
   pairs of the piece the one whose merge was learnt earliest is merged, everywhere in the piece, and again
   until no adjacent pair has a merge. This is GPT-2's rule, and ``tokenizers``' BPE model gives the same
   ids. Each piece's ids are remembered (a cache), so a word seen before costs one dictionary lookup.

Decoding joins the tokens' bytes and reads them as UTF-8 (a token may hold part of a character; an
incomplete character becomes U+FFFD), so ``decode(encode(text)) == text`` for every text when the
tokenizer has no normalizer and adds no prefix space (``add_prefix_space``: the added space is decoded).

A ``ByteLevelBPE`` is written and read as a Hugging Face ``tokenizer.json`` (``save``, ``from_file``;
``to_dict`` / ``from_dict`` for the same document as a dict), which ``tokenizers.Tokenizer.from_file`` and
transformers' ``PreTrainedTokenizerFast(tokenizer_file=...)`` load with the same ids; GPT-2's original
``vocab.json`` + ``merges.txt`` are read by ``from_vocab_merges``. ``ByteLevelBPE.train`` learns one
(``numformer.data.tokenizers.bpe_train``).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .base import Tokenizer, word_piece_label
from .bpe_train import train_bpe
from .byte_level import END_OF_TEXT, PreTokenizer, hold_back, to_byte_chars, unicode_to_bytes
from .hf_json import AddedToken, document, parse_document, read_json_file, read_vocab_merges

CACHE_SIZE = 1 << 18                 # pieces remembered by the encoder before the cache starts over
NO_MERGE = (float("inf"), -1)
ALLOWED = ("all", "none", "none_raise")


class ByteLevelBPE(Tokenizer):
    """A byte-level BPE tokenizer (see the module docstring).

    vocab:        {token: id}, every token written with byte characters ("Ġthe" is " the").
    merges:       [(left, right), ...] in rank order: merging left and right makes the token left + right.
    added_tokens: ``AddedToken`` s, matched in the raw text (``normalized=False``) or in the normalized text
                  (``normalized=True``) before the split.
    pre_tokenizer: the regex split (``PreTokenizer``); GPT-2's by default.
    normalizer:   ``NormalizerStep`` s applied to the text between added tokens (none by default).
    ignore_merges: a piece that is itself a token is that token, without merging (Llama 3's option).
    unk_token:    the token of a byte character missing from the vocabulary (None by default: such a byte
                  is a ValueError).
    eos_token / bos_token: the end-of-text and start tokens (``eos_id``, ``bos_id``, also given by
                  ``special_id("<eos>")`` and ``special_id("<bos>")``); by default ``<|endoftext|>`` when it
                  is one of the added tokens, and none.
    hf_fields:    other tokenizer.json entries written back unchanged (``post_processor``, ``decoder``, ...).
    """

    def __init__(self, vocab: dict, merges, added_tokens=(), pre_tokenizer: PreTokenizer | None = None,
                 normalizer=(), ignore_merges: bool = False, unk_token: str | None = None,
                 eos_token: str | None = None, bos_token: str | None = None, hf_fields: dict | None = None):
        self.vocab = dict(vocab)
        self.merges = [tuple(m) for m in merges]
        self.added_tokens = sorted(added_tokens, key=lambda t: t.id)
        self.pre_tokenizer = pre_tokenizer or PreTokenizer.from_pattern("gpt2")
        self.normalizer = tuple(normalizer)
        self.ignore_merges, self.unk_token = ignore_merges, unk_token
        self.hf_fields = dict(hf_fields or {})
        self._build_tables()
        eos_token = eos_token if eos_token is not None else (END_OF_TEXT if END_OF_TEXT in self._added else None)
        self.eos_id = self._token_id(eos_token, "eos_token")
        self.bos_id = self._token_id(bos_token, "bos_token")
        self.special_ids = {t.content: t.id for t in self.added_tokens if t.special}
        self.special_ids.update({name: i for name, i in (("<eos>", self.eos_id), ("<bos>", self.bos_id))
                                 if i is not None and name not in self.special_ids})

    # -- the tables ---------------------------------------------------------------------------------------
    def _build_tables(self):
        """id -> token, (left id, right id) -> (rank, merged id), each token's bytes, the added-token matcher."""
        added = {t.content: t for t in self.added_tokens}
        size = 1 + max([*self.vocab.values(), *(t.id for t in self.added_tokens)], default=-1)
        self.id_to_token = [None] * size
        for token, i in self.vocab.items():
            self.id_to_token[i] = token
        for t in self.added_tokens:
            self.id_to_token[t.id] = t.content
        self.merge_ranks = {}
        for rank, (left, right) in enumerate(self.merges):
            ids = [self.vocab.get(t) for t in (left, right, left + right)]
            if None in ids:
                missing = [t for t, i in zip((left, right, left + right), ids) if i is None][0]
                raise ValueError(f"merge {rank} ({left!r} {right!r}) uses {missing!r}, which is not in the "
                                 f"vocabulary")
            self.merge_ranks[ids[0], ids[1]] = (rank, ids[2])
        self._added = added
        self._build_added_matchers()
        # an added token with normalized=True is decoded as its normalized form, the text it matches (as
        # tokenizers >= 0.23 decodes it); every other token as itself
        decoded = [self._normalized_forms.get(i, t) for i, t in enumerate(self.id_to_token)]
        byte_of = unicode_to_bytes()
        self._bytes = [b"" if t is None else (bytes(byte_of[c] for c in t) if all(c in byte_of for c in t)
                                              else t.encode("utf-8")) for t in decoded]
        self._cache = {}

    def _build_added_matchers(self):
        """The added tokens matched in the raw text and those matched in the normalized text, each as
        {text matched: AddedToken} and one regex (``_split_on_added``)."""
        self._raw_added = {t.content: t for t in self.added_tokens if not t.normalized}
        self._normalized_forms = {t.id: self._normalize(t.content) for t in self.added_tokens if t.normalized}
        self._normalized_added = {}
        for t in self.added_tokens:     # in id order: of two that normalize alike, the later wins (as tokenizers)
            pattern = self._normalized_forms.get(t.id)
            if pattern:                 # None: matched in the raw text; "": erased by the normalizer, never matched
                self._normalized_added[pattern] = t
        self._raw_added_rx = _alternation(self._raw_added)
        self._normalized_added_rx = _alternation(self._normalized_added)
        self._longest_added = max(map(len, [*self._raw_added, *self._normalized_added]), default=1)

    def _token_id(self, token, what):
        if token is None:
            return None
        if token not in self._added and token not in self.vocab:
            raise ValueError(f"{what} {token!r} is not in the vocabulary")
        return self._added[token].id if token in self._added else self.vocab[token]

    @property
    def vocab_size(self) -> int:
        """One more than the largest id (the model's output size)."""
        return len(self.id_to_token)

    # -- encoding ---------------------------------------------------------------------------------------------
    def encode(self, text: str, allowed_special="all") -> list[int]:
        """The ids of ``text``.

        allowed_special: which special tokens written in the text become their ids: "all" (as
        ``tokenizers`` and transformers do), "none" (their text is encoded like any other text),
        "none_raise" (a special token in the text is an error, as tiktoken's default), or a set of them.
        Added tokens that are not special are always matched.
        """
        ids = []
        for segment, token_id in self._segments(text, allowed_special):
            if token_id is not None:
                ids.append(token_id)
            else:
                self._encode_pieces(self.pre_tokenizer.pieces(segment), ids)
        return ids

    def encode_batch(self, texts: Iterable[str], allowed_special="all") -> list[list[int]]:
        return [self.encode(t, allowed_special) for t in texts]

    def encode_chunks(self, chunks: Iterable[str], allowed_special="all") -> Iterator[list[int]]:
        """The ids of the concatenation of ``chunks`` (a long text read part by part), chunk by chunk:
        ``sum(encode_chunks(chunks), [])`` equals ``encode("".join(chunks))`` (``hold_back`` says why)."""
        if self.pre_tokenizer.byte_level.add_prefix_space:
            raise ValueError("a tokenizer that adds a prefix space cannot encode a text in chunks; encode it whole")
        carry = ""
        for chunk in chunks:
            segments = list(self._segments(carry + chunk, allowed_special))
            ids, carry = [], ""
            for k, (segment, token_id) in enumerate(segments):
                if token_id is not None:
                    ids.append(token_id)
                    continue
                pieces = self.pre_tokenizer.pieces(segment)
                if k == len(segments) - 1:          # the end of the chunk: split again with the next one
                    pieces, carry = hold_back(pieces, self._longest_added - 1)
                self._encode_pieces(pieces, ids)
            yield ids
        if carry:
            yield self.encode(carry, allowed_special)

    def _segments(self, text, allowed_special):
        """(normalized text, None) for each stretch between added tokens and (content, id) for each added token
        that counts as one here. As ``tokenizers`` does: the tokens with normalized=False are cut out of the raw
        text, each stretch between them is normalized, then the tokens with normalized=True are cut out of it."""
        allowed = self._allowed(allowed_special) if self.added_tokens else set()
        for raw, token_id in self._split_on_added(text, self._raw_added_rx, self._raw_added, allowed,
                                                  allowed_special):
            if token_id is not None:
                yield raw, token_id
            else:
                yield from self._split_on_added(self._normalize(raw), self._normalized_added_rx,
                                                self._normalized_added, allowed, allowed_special)

    @staticmethod
    def _split_on_added(text, matcher, added, allowed, allowed_special):
        """(text, None) for each stretch of ``text`` between the matches of ``matcher`` and (content, id) for
        each match that counts as an added token here (``added``: {text matched: AddedToken})."""
        start = 0
        for m in matcher.finditer(text) if matcher is not None else ():
            token = added[m.group()]
            if token.special and token.content not in allowed:
                if allowed_special == "none_raise":
                    raise ValueError(f"the text holds the special token {token.content!r}; encode it with "
                                     f"allowed_special=\"all\" (or a set naming it), or \"none\" to encode it as "
                                     f"ordinary text")
                continue
            if m.start() > start:
                yield text[start:m.start()], None
            yield token.content, token.id
            start = m.end()
        if start < len(text):
            yield text[start:], None

    def _allowed(self, allowed_special) -> set:
        if isinstance(allowed_special, str):
            if allowed_special not in ALLOWED:
                raise ValueError(f"allowed_special = {allowed_special!r}; use one of {list(ALLOWED)} or a set of "
                                 f"special tokens")
            return set(self.special_ids) if allowed_special == "all" else set()
        allowed = set(allowed_special)
        unknown = allowed - {t.content for t in self.added_tokens}
        if unknown:
            raise ValueError(f"allowed_special names {sorted(unknown)}, which are not special tokens of this "
                             f"tokenizer ({sorted(self.special_ids)})")
        return allowed

    def _normalize(self, text: str) -> str:
        for step in self.normalizer:
            text = step(text)
        return text

    def _encode_pieces(self, pieces, out: list):
        """Append the ids of each piece to ``out``: from the cache, or merged (``bpe``) and remembered."""
        cache = self._cache
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                ids = self.bpe(to_byte_chars(piece))
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)

    def bpe(self, word: str) -> list[int]:
        """The ids of one piece written with byte characters: start from one id per byte, then merge the
        adjacent pair of lowest rank, at every place it occurs (left to right), until no pair has a merge."""
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        ids = [self._char_id(c) for c in word]
        while len(ids) >= 2:
            rank, pair = min((self.merge_ranks.get(p, NO_MERGE)[0], p) for p in zip(ids, ids[1:]))
            if pair not in self.merge_ranks:
                break
            merged, out, i = self.merge_ranks[pair][1], [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
                    out.append(merged)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            ids = out
        return ids

    def _char_id(self, c: str) -> int:
        i = self.vocab.get(c)
        if i is not None:
            return i
        if self.unk_token is not None:
            return self.vocab[self.unk_token]
        raise ValueError(f"the byte {unicode_to_bytes().get(c, c)!r} (character {c!r}) is not in this byte-level "
                         f"vocabulary and it has no unk_token; the tokenizer file is incomplete")

    # -- decoding ----------------------------------------------------------------------------------------------
    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of ``ids``: the tokens' bytes joined and read as UTF-8 (an incomplete character becomes
        U+FFFD); with ``skip_special`` the special tokens are left out."""
        ids = self._check_ids(ids)
        special = set(self.special_ids.values()) if skip_special else ()
        missing = [i for i in ids if self.id_to_token[i] is None]
        if missing:
            raise ValueError(f"id {missing[0]} has no token in this vocabulary")
        return b"".join(self._bytes[i] for i in ids if i not in special).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes per id, 0 for special tokens (their text is not part of the corpus)."""
        out = np.array([len(b) for b in self._bytes], dtype=np.int64)
        out[[t.id for t in self.added_tokens if t.special]] = 0
        return out

    def piece_label(self, i: int) -> str:
        """A readable label of token ``i`` (``token_labels``)."""
        token = self.id_to_token[i] or "?"
        if token in self.special_ids:
            return token
        return word_piece_label(token, self._bytes[i].decode("utf-8", errors="replace"))

    # -- files --------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The Hugging Face tokenizer.json document (a plain dict; ``tokenizers`` reads nothing else)."""
        return document(self)

    def to_hf_json(self) -> str:
        """The tokenizer.json document as text (``numformer export`` writes it)."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    def token(self, i: int) -> str:
        """The token of id ``i``, as the vocabulary writes it (byte characters: "Ġthe")."""
        return self.id_to_token[i]

    @classmethod
    def from_dict(cls, d: dict, eos_token=None, bos_token=None) -> "ByteLevelBPE":
        """A tokenizer.json document of any byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2 ...); what it
        cannot implement is one ValueError naming it. eos_token / bos_token: as the constructor's (the
        document does not name them)."""
        try:
            return cls(**parse_document(d), eos_token=eos_token, bos_token=bos_token)
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            raise ValueError(f"not a valid tokenizer.json ({type(e).__name__}: {e})") from None

    def save(self, path) -> Path:
        """Write tokenizer.json (UTF-8)."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_file(cls, path, eos_token=None, bos_token=None) -> "ByteLevelBPE":
        """Read a tokenizer.json (``from_dict``; eos_token / bos_token as there)."""
        return cls.from_dict(read_json_file(path), eos_token, bos_token)

    @classmethod
    def from_vocab_merges(cls, vocab_path, merges_path, special_tokens=(END_OF_TEXT,)) -> "ByteLevelBPE":
        """GPT-2's original files: ``vocab.json`` ({token: id}) and ``merges.txt`` ("#version" line, then one
        "left right" merge per line), with GPT-2's split; ``special_tokens`` found in the vocabulary are
        special (GPT-2's ``<|endoftext|>``)."""
        vocab, merges = read_vocab_merges(vocab_path, merges_path)
        added = [AddedToken(t, vocab[t], special=True) for t in special_tokens if t in vocab]
        return cls(vocab, merges, added)

    @classmethod
    def train(cls, texts, vocab_size: int, pattern: str = "gpt2", special_tokens=(END_OF_TEXT,),
              min_frequency: int = 0, trainer: str = "fast", add_prefix_space: bool = False) -> "ByteLevelBPE":
        """Learn a tokenizer of at most ``vocab_size`` tokens (special tokens and the 256 bytes included) from
        ``texts``: a str, or an iterable of documents, each a str or an iterable of str chunks
        (``bpe_train.train_bpe``).

        pattern: the split, "gpt2" (default), "gpt4" or a regex; special_tokens: the added special tokens,
        ids 0, 1, ... (default ``<|endoftext|>``); min_frequency (default 0): merging stops when the most
        frequent pair occurs fewer than max(1, min_frequency) times; trainer: "fast" (default) or
        "reference" (the same merges); add_prefix_space: a space in front of each piece that lacks one
        (off by default).
        """
        return train_bpe(cls, texts, vocab_size, pattern, special_tokens, min_frequency, trainer, add_prefix_space)


def _alternation(texts):
    """A regex matching any of ``texts``, the longest where several start at one place (the leftmost-longest
    match of ``tokenizers``' Aho-Corasick automaton), or None for no texts."""
    if not texts:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))
