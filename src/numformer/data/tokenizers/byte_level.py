"""What happens to text before byte-level BPE merges anything: normalization, the regex split, the byte trick.

Three steps, as GPT-2 introduced them and Hugging Face ``tokenizers`` describes them in a tokenizer.json
(``normalizer``, ``pre_tokenizer``):

1. **Normalization** (most byte-level tokenizers have none; Qwen2 applies NFC): ``NormalizerStep`` s.
2. **The regex split.** A regular expression cuts the text into pieces (words with their leading space,
   numbers, runs of punctuation, runs of white space), and BPE never merges across two pieces, so that
   "dog." and "dog!" share the token "dog". ``PATTERNS`` holds GPT-2's pattern and GPT-4's (cl100k, which
   splits numbers into groups of at most 3 digits and case-folds the contractions). ``\\p{L}`` (any letter)
   and ``\\p{N}`` (any number) need the ``regex`` package; Python's ``re`` has no Unicode properties.
3. **The byte trick.** Each piece is encoded as UTF-8 and each byte is written as one printable character
   (``bytes_to_unicode``): bytes that are printable Latin-1 characters stand for themselves ("a" is "a"),
   the others are moved to code points 256 and up (a space, byte 32, becomes "Ġ", U+0120). BPE then
   works on strings of 256 possible characters: any text can be encoded, none is unknown, and a token is
   a readable string that can be stored in JSON.

``PreTokenizer`` is steps 2 and 3 as a ``tokenizers`` pre-tokenizer: zero or more ``Split`` steps (a regex;
the matches and the text between them become pieces) followed by one ``ByteLevel`` step (optionally a space
in front of each piece that lacks one, optionally GPT-2's regex, then the byte trick).

Unicode versions: ``\\p{L}`` and ``\\p{N}`` follow the Unicode tables of the installed ``regex`` package;
``tokenizers`` (Oniguruma) may use older ones, so characters assigned by the newest Unicode versions can be
split differently by the two libraries. Every character assigned in Unicode 14 is split alike.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable

from ..._install import require

# GPT-2 (encoder.py): the contractions, then letters, numbers and other characters, each with an optional
# leading space, then white space (a run of spaces before a word leaves its last space to the word).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# GPT-4 (tiktoken's cl100k_base): case-insensitive contractions, a letter run may take one leading
# non-letter (" word", "_word"), numbers in groups of 1 to 3 digits, punctuation runs keep their line breaks.
GPT4_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
                r"""\s*[\r\n]|\s+(?!\S)|\s+""")
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}
END_OF_TEXT = "<|endoftext|>"        # GPT-2's document separator; numformer's language models use it too


@functools.lru_cache(maxsize=None)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte (0..255) to a printable character.

    The 188 bytes that are printable Latin-1 characters ("!".."~", "¡".."¬", "®".."ÿ") map to themselves;
    the other 68 (the controls, the space, the no-break space and the soft hyphen) map to chr(256),
    chr(257), ... in byte order. So every character of a byte-level token is printable and not white space.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    moved = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + moved)
            moved += 1
    return dict(sorted(mapping.items()))


@functools.lru_cache(maxsize=None)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of ``bytes_to_unicode``: byte character -> byte."""
    return {c: b for b, c in bytes_to_unicode().items()}


@functools.lru_cache(maxsize=None)
def _byte_translation() -> dict[int, str]:
    """``str.translate`` table taking a Latin-1 decoded byte string to its byte characters."""
    return {b: c for b, c in bytes_to_unicode().items()}


def to_byte_chars(text: str) -> str:
    """``text`` as UTF-8 bytes written with one byte character each: "héllo" -> "hÃ©llo", " a" -> "Ġa"."""
    return text.encode("utf-8").decode("latin-1").translate(_byte_translation())


def byte_alphabet() -> list[str]:
    """The 256 byte characters in code point order: the first 256 tokens of every vocabulary numformer
    trains (the order of GPT-2's vocabulary and of ``tokenizers``' BpeTrainer)."""
    return sorted(bytes_to_unicode().values())


def regex_module():
    """The ``regex`` package (Unicode properties such as ``\\p{L}``), or one clear MissingDependency."""
    require(("regex",), "byte-level BPE (its split patterns use \\p{L} and \\p{N})")
    import regex
    return regex


@functools.lru_cache(maxsize=64)
def compile_pattern(pattern: str):
    """``pattern`` (a name of ``PATTERNS`` or a regular expression) compiled with ``regex``; one ValueError
    for a bad expression."""
    regex = regex_module()
    try:
        return regex.compile(PATTERNS.get(pattern, pattern))
    except regex.error as e:
        raise ValueError(f"split pattern {pattern!r} is not a valid regular expression ({e}); use \"gpt2\", "
                         f"\"gpt4\" or a regex the `regex` package accepts") from None


def isolated(rx, text: str) -> list[str]:
    """``text`` cut by the regex ``rx``: every match, and every stretch between two matches, is a piece
    (``tokenizers``' Split with behavior "Isolated"); the pieces concatenate to ``text``."""
    pieces = rx.findall(text)
    if sum(map(len, pieces)) == len(text):       # the usual case: the pattern matches every character
        return pieces
    pieces, end = [], 0
    for m in rx.finditer(text):
        if m.start() > end:
            pieces.append(text[end:m.start()])
        if m.end() > m.start():
            pieces.append(m.group())
        end = m.end()
    if end < len(text):
        pieces.append(text[end:])
    return pieces


# -- normalizers -----------------------------------------------------------------------------------------
UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


@dataclass(frozen=True)
class NormalizerStep:
    """One step of a tokenizer.json normalizer: a Unicode normal form, "Lowercase", "Replace" (``pattern``
    a string, or a regex when ``is_regex``, replaced by ``content``) or "Prepend" (``content`` in front)."""

    kind: str
    pattern: str = ""
    content: str = ""
    is_regex: bool = False

    def __call__(self, text: str) -> str:
        if self.kind in UNICODE_FORMS:
            return unicodedata.normalize(self.kind, text)
        if self.kind == "Lowercase":        # character by character, as tokenizers does (no final-sigma rule)
            return "".join(c.lower() for c in text)
        if self.kind == "Replace":
            if self.is_regex:
                return compile_pattern(self.pattern).sub(self.content.replace("\\", "\\\\"), text)
            return text.replace(self.pattern, self.content)
        if self.kind == "Prepend":
            return self.content + text if text else text
        raise AssertionError(self.kind)

    def to_hf(self) -> dict:
        if self.kind in UNICODE_FORMS or self.kind == "Lowercase":
            return {"type": self.kind}
        if self.kind == "Replace":
            return {"type": "Replace", "pattern": {"Regex" if self.is_regex else "String": self.pattern},
                    "content": self.content}
        return {"type": "Prepend", "prepend": self.content}


def normalizer_from_hf(d) -> list[NormalizerStep]:
    """The steps of a tokenizer.json ``normalizer`` (null, one normalizer or a Sequence of them)."""
    if d is None:
        return []
    kind = d.get("type")
    if kind == "Sequence":
        return [s for n in d["normalizers"] for s in normalizer_from_hf(n)]
    if kind in UNICODE_FORMS or kind == "Lowercase":
        return [NormalizerStep(kind)]
    if kind == "Replace":
        (how, pattern), = d["pattern"].items()
        return [NormalizerStep("Replace", pattern, d["content"], is_regex=how == "Regex")]
    if kind == "Prepend":
        return [NormalizerStep("Prepend", content=d["prepend"])]
    raise ValueError(f"normalizer {kind!r} is not one numformer's ByteLevelBPE implements (it knows NFC, NFD, "
                     f"NFKC, NFKD, Lowercase, Replace, Prepend and Sequence)")


def normalizer_to_hf(steps) -> dict | None:
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0].to_hf()
    return {"type": "Sequence", "normalizers": [s.to_hf() for s in steps]}


# -- the pre-tokenizer -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """Cut each piece by a regex; matches and the stretches between them are pieces ("Isolated")."""

    pattern: str

    def to_hf(self) -> dict:
        return {"type": "Split", "pattern": {"Regex": self.pattern}, "behavior": "Isolated", "invert": False}


@dataclass(frozen=True)
class ByteLevel:
    """The last step: a space in front of each piece that lacks one (``add_prefix_space``), GPT-2's regex
    split (``use_regex``), then the byte trick."""

    add_prefix_space: bool = False
    use_regex: bool = True

    def to_hf(self) -> dict:
        return {"type": "ByteLevel", "add_prefix_space": self.add_prefix_space, "trim_offsets": True,
                "use_regex": self.use_regex}


class PreTokenizer:
    """The split of a text into pieces that BPE encodes separately, written with byte characters.

    ``PreTokenizer.from_pattern("gpt2")`` is GPT-2's (one ``ByteLevel`` step with its regex); any other
    pattern is a ``Split`` followed by a ``ByteLevel`` without regex (as Llama 3 and Qwen2 write theirs).
    """

    def __init__(self, splits: Iterable[Split] = (), byte_level: ByteLevel = ByteLevel()):
        self.splits = tuple(splits)
        self.byte_level = byte_level
        self._rx = [compile_pattern(s.pattern) for s in self.splits]
        if byte_level.use_regex:
            self._rx.append(compile_pattern(GPT2_PATTERN))

    @classmethod
    def from_pattern(cls, pattern: str = "gpt2", add_prefix_space: bool = False) -> "PreTokenizer":
        regex = PATTERNS.get(pattern, pattern)
        compile_pattern(regex)
        if regex == GPT2_PATTERN:
            return cls((), ByteLevel(add_prefix_space, use_regex=True))
        return cls([Split(regex)], ByteLevel(add_prefix_space, use_regex=False))

    @property
    def pattern(self) -> str:
        """The split regex (the last, when there are several)."""
        return GPT2_PATTERN if self.byte_level.use_regex else (self.splits[-1].pattern if self.splits else "")

    def pieces(self, text: str) -> list[str]:
        """``text`` cut into pieces (still plain text; ``to_byte_chars`` writes each with byte characters)."""
        pieces = [text] if text else []
        for s, rx in zip(self.splits, self._rx):
            pieces = [p for piece in pieces for p in isolated(rx, piece)]
        if self.byte_level.add_prefix_space:
            pieces = [p if p.startswith(" ") else " " + p for p in pieces]
        if self.byte_level.use_regex:
            pieces = [p for piece in pieces for p in isolated(self._rx[-1], piece)]
        return pieces

    def to_hf(self) -> dict:
        if not self.splits:
            return self.byte_level.to_hf()
        return {"type": "Sequence", "pretokenizers": [s.to_hf() for s in self.splits] + [self.byte_level.to_hf()]}

    @classmethod
    def from_hf(cls, d) -> "PreTokenizer":
        """From a tokenizer.json ``pre_tokenizer``: Split steps (regex or string, "Isolated", not inverted)
        and a final ByteLevel step; anything else is one ValueError naming it."""
        steps = d.get("pretokenizers", []) if d and d.get("type") == "Sequence" else [d]
        if not steps or steps[-1] is None or steps[-1].get("type") != "ByteLevel":
            raise ValueError("its pre_tokenizer does not end with a ByteLevel step, so it is not a byte-level BPE "
                             "tokenizer; load it with numformer.interop.hf (PretrainedTokenizer) instead")
        splits = []
        for s in steps[:-1]:
            if s.get("type") != "Split":
                raise ValueError(f"pre_tokenizer step {s.get('type')!r} is not one numformer's ByteLevelBPE "
                                 f"implements (it knows Split, then ByteLevel)")
            if s.get("behavior") != "Isolated" or s.get("invert"):
                raise ValueError(f"a Split pre-tokenizer with behavior {s.get('behavior')!r}"
                                 f"{' inverted' if s.get('invert') else ''} is not implemented (only \"Isolated\")")
            (how, pattern), = s["pattern"].items()
            splits.append(Split(pattern if how == "Regex" else re.escape(pattern)))
        last = steps[-1]
        return cls(splits, ByteLevel(bool(last.get("add_prefix_space", False)), bool(last.get("use_regex", True))))


# -- long texts in chunks ------------------------------------------------------------------------------------
def hold_back(pieces: list[str], min_chars: int = 0) -> tuple[list[str], str]:
    """(the pieces of a chunk that are final, the text to split again in front of the next chunk).

    A long text is read and split chunk by chunk. The split of a stretch of text depends only on that
    stretch and the character after it, so only the end of a chunk can be cut differently than in the whole
    text: its last two pieces (and at least its last ``min_chars`` characters) are held back.
    """
    keep = max(len(pieces) - 2, 0)
    held = sum(len(p) for p in pieces[keep:])
    while keep > 0 and held < min_chars:
        keep -= 1
        held += len(pieces[keep])
    return pieces[:keep], "".join(pieces[keep:])
