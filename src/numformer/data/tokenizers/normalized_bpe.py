"""``NormalizedBPE``: the byte-level BPE of the classifiers and translators (IMDB, AG News, Multi30k, and the
user's own classification and translation files).

It is ``ByteLevelBPE`` (one algorithm, one file format) used the way those tasks use every tokenizer:

- the text is normalized first, exactly as for ``WordTokenizer`` (``normalize_text``: ``<br />`` tags
  become spaces and, by default, everything is lowercased), so encoding is lossy by design;
- numformer's special ids come first: ``<pad>`` = 0, ``<unk>`` = 1, then ``<bos>``, ``<eos>``, ``<cls>`` when
  asked for, and ``encode`` adds them on request (``add_bos``, ``add_eos``, ``add_cls``) and only then: a
  special token written in the text ("<pad>" in a review) is encoded as ordinary text, as ``WordTokenizer``
  does, so raw text never yields the padding id the classifier masks out;
- a space is put in front of the text (``add_prefix_space``), so a text's first word is encoded as it is
  inside a sentence, and ``decode`` drops the special tokens and strips the spaces around the text.

A language model needs none of this and uses ``ByteLevelBPE`` directly: exact round trips, no lowercasing.
The saved state is ``{"type": "bpe", "lowercase": ..., "hf_json": the tokenizer.json document as a string}``.
"""
from __future__ import annotations

import json
from typing import Iterable

from ..._limits import bounded_json
from .base import OPTIONAL_SPECIALS, PAD, UNK, SpecialsTokenizer, normalize_text, special_tokens
from .bpe import ByteLevelBPE


class NormalizedBPE(SpecialsTokenizer):
    """Byte-level BPE on normalized text, with numformer's special ids (see the module docstring).

    ``NormalizedBPE.build(train_texts, vocab_size=8000, min_freq=2, ...)`` learns the merges from the
    training texts only (``ByteLevelBPE.train``; the same merges as ``tokenizers``' BpeTrainer).
    """

    def __init__(self, bpe: ByteLevelBPE, lowercase: bool = True):
        self.bpe = bpe
        self.lowercase = lowercase
        self.special_ids = {s: bpe.special_ids[s] for s in (PAD, UNK) + OPTIONAL_SPECIALS if s in bpe.special_ids}
        if self.special_ids.get(PAD) != 0 or self.special_ids.get(UNK) != 1:
            raise ValueError(f"a classifier's BPE vocabulary must have {PAD!r} = 0 and {UNK!r} = 1")

    @classmethod
    def build(cls, texts: Iterable[str], vocab_size: int = 8000, min_freq: int = 2, bos: bool = False,
              eos: bool = False, cls_token: bool = False, lowercase: bool = True) -> "NormalizedBPE":
        specials = special_tokens(bos, eos, cls_token)
        bpe = ByteLevelBPE.train((normalize_text(t, lowercase) for t in texts), max(vocab_size, 256 + len(specials)),
                                 special_tokens=specials, min_frequency=min_freq, add_prefix_space=True)
        return cls(bpe, lowercase)

    @property
    def vocab_size(self) -> int:
        return self.bpe.vocab_size

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, add_cls: bool = False) -> list[int]:
        # allowed_special="none": "<pad>", "<unk>", "<bos>" ... in the text are text, never their ids
        ids = self.bpe.encode(normalize_text(text, self.lowercase), allowed_special="none")
        return self._wrap(ids, add_bos, add_eos, add_cls)

    def encode_batch(self, texts: Iterable[str], add_bos=False, add_eos=False, add_cls=False) -> list[list[int]]:
        return [self.encode(t, add_bos, add_eos, add_cls) for t in texts]

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.bpe.decode(ids, skip_special).strip()

    def piece_label(self, i: int) -> str:
        return self.bpe.piece_label(i)

    def to_dict(self) -> dict:
        return {"type": "bpe", "lowercase": self.lowercase, "hf_json": json.dumps(self.bpe.to_dict(),
                                                                                   ensure_ascii=False)}

    @classmethod
    def from_dict(cls, d: dict) -> "NormalizedBPE":
        hf_json = d["hf_json"]
        if not isinstance(hf_json, str):
            raise TypeError(f"hf_json is a {type(hf_json).__name__}, not a string")
        document = bounded_json(hf_json, "hf_json (the BPE's Hugging Face tokenizer.json)")
        if not isinstance(document, dict):
            raise ValueError(f"hf_json holds a JSON {type(document).__name__}, not a Hugging Face tokenizer.json")
        return cls(ByteLevelBPE.from_dict(document), d.get("lowercase", True))
