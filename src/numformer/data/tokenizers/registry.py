"""Tokenizers by name: rebuilding a saved one (``tokenizer_from_dict``) and building one from the training split
(``build_tokenizer``)."""
from __future__ import annotations

from typing import Sequence

from .bpe import ByteLevelBPE
from .normalized_bpe import NormalizedBPE
from .pretrained import PretrainedTokenizer, check_side_files
from .simple import CharTokenizer, SymbolTokenizer, WordTokenizer

# "type" of a saved state -> its class. A plain Hugging Face tokenizer.json (no "type" key, a "model") is a
# ByteLevelBPE.
TOKENIZER_TYPES = {"char": CharTokenizer, "word": WordTokenizer, "bpe": NormalizedBPE, "hf": PretrainedTokenizer,
                   "symbols": SymbolTokenizer}


def is_hf_document(d) -> bool:
    """Whether ``d`` is a Hugging Face tokenizer.json document (rather than one of numformer's states)."""
    return isinstance(d, dict) and "type" not in d and isinstance(d.get("model"), dict)


def tokenizer_from_dict(d: dict):
    """Rebuild any tokenizer from its ``to_dict()``: a ``ByteLevelBPE`` from a tokenizer.json document."""
    kind = d.get("type") if isinstance(d, dict) else None
    if is_hf_document(d):
        tokenizer = ByteLevelBPE.from_dict({k: v for k, v in d.items() if k != "files"})
    elif not isinstance(kind, str) or kind not in TOKENIZER_TYPES:
        raise ValueError(f"unknown tokenizer type {kind!r} in the saved state; expected one of "
                         f"{sorted(TOKENIZER_TYPES)} or a Hugging Face tokenizer.json")
    else:
        tokenizer = TOKENIZER_TYPES[kind].from_dict(d)
    files = d.get("files")
    if files is not None and not isinstance(tokenizer, PretrainedTokenizer):   # a fine-tuned run's chat template
        tokenizer.files = dict(check_side_files(files))
    return tokenizer


def restore_saved_tokenizer(state: dict):
    """``tokenizer_from_dict`` of a run's saved state (its tokenizer.json): a damaged state is one ValueError
    naming that file, whatever the tokenizer's own parser raised."""
    try:
        return tokenizer_from_dict(state)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise ValueError(f"the saved tokenizer (the run's tokenizer.json) is damaged ({type(e).__name__}: {e}); "
                         f"restore it or retrain") from None


def build_tokenizer(kind: str, texts: Sequence[str], vocab_size: int, min_freq: int, lowercase: bool = True,
                    bos: bool = False, eos: bool = False, cls_token: bool = False):
    """A classifier's or translator's "word" or "bpe" tokenizer trained on ``texts`` (the training split)."""
    if kind == "word":
        return WordTokenizer.build(texts, min_freq=min_freq, max_size=vocab_size, bos=bos, eos=eos,
                                   cls_token=cls_token, lowercase=lowercase)
    if kind == "bpe":
        return NormalizedBPE.build(texts, vocab_size=vocab_size, min_freq=min_freq, bos=bos, eos=eos,
                                   cls_token=cls_token, lowercase=lowercase)
    raise ValueError(f"[data] tokenizer = {kind!r} is not supported; choose \"word\" or \"bpe\"")
