"""Using a trained run folder: a text classifier (``load_classifier``, ``classify_texts``) or an
encoder-decoder translator (``load_translator``), loaded next to ``load_model`` with the run's own
tokenizers and preprocessing. The ``numformer classify`` and ``numformer translate`` commands call these.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data.text_datasets import AGNEWS_CLASSES
from ..data.text_tasks import encode_for_classifier
from ..ops import softmax_forward
from ..interop.sources import tokenizer_from_state
from .run import load_model
from ..config import load_config_json
from ..data.run_tokenizer import load_tokenizer_json

__all__ = ["load_classifier", "classify_texts", "load_translator", "unknown_words"]


def load_classifier(run_dir):
    """(model, tokenizer, label names, [data] config) of a classifier run folder; clear errors otherwise."""
    if not Path(run_dir).is_dir():
        raise ValueError(f"{run_dir} is not a folder; give a run folder written by `numformer train` or "
                         f"`numformer reproduce imdb|agnews` (e.g. runs/imdb)")
    config = load_config_json(run_dir)
    kind = config.get("model", {}).get("type")
    if kind != "classifier":
        raise ValueError(f"{run_dir} holds a {kind!r} model (task {config.get('data', {}).get('task')!r}); "
                         f"numformer classify needs a text classifier run (imdb, agnews); "
                         f"use `numformer generate` for language models")
    state = load_tokenizer_json(run_dir, config["data"])
    if state is None:
        raise ValueError(f"{run_dir} has no tokenizer.json, so its texts cannot be tokenized as in training")
    if state.get("type") == "symbols":            # a synthetic task's sequences (parity), made by the task itself
        raise ValueError(f"{run_dir} was trained on the {config['data'].get('task')!r} task's symbol sequences, "
                         f"not on texts; numformer classify labels texts (imdb, agnews): evaluate this run with "
                         f"numformer eval {run_dir}")
    tokenizer = tokenizer_from_state(state, run_dir)
    model = load_model(run_dir, config)
    names = state.get("label_names") or _default_label_names(config["data"].get("task"), model.n_classes)
    if len(names) != model.n_classes:
        raise ValueError(f"{run_dir}: {len(names)} label names for a model with {model.n_classes} classes")
    if not hasattr(tokenizer, "encode_batch"):
        raise ValueError(f"{run_dir}: the saved tokenizer cannot encode text")
    return model, tokenizer, list(names), config["data"]


def _default_label_names(task, n):
    known = {"imdb": ["negative", "positive"], "agnews": list(AGNEWS_CLASSES)}.get(task)
    return known if known and len(known) == n else [str(i) for i in range(n)]


def classify_texts(run_dir, texts):
    """[{text, label, probability, probabilities {name: p}, tokens, truncated}] for each text."""
    texts = list(texts)
    if not texts:
        raise ValueError("give at least one text to classify")
    for i, t in enumerate(texts):
        if not t.strip():
            where = "" if len(texts) == 1 else f" (number {i + 1} of {len(texts)})"
            raise ValueError(f"empty text{where}: give some words to classify")
    model, tokenizer, names, data = load_classifier(run_dir)
    max_len, cls_token = int(data.get("max_len", model.max_len)), bool(data.get("cls_token", True))
    ids = encode_for_classifier(tokenizer, texts, max_len, cls_token, data.get("truncate", "head"))
    full = [len(x) for x in tokenizer.encode_batch(texts, add_cls=cls_token)]
    out = []
    for text, x, n in zip(texts, ids, full):
        if len(x) == int(cls_token):
            raise ValueError(f"{text!r} has no tokens after tokenization; give some words to classify")
        logits = model(x[None])
        model.clear_cache()
        p = softmax_forward(np.asarray(logits, dtype=np.float64), axis=-1)[0][0]
        k = int(np.argmax(p))
        out.append({"text": text, "label": names[k], "probability": float(p[k]),
                    "probabilities": {name: float(v) for name, v in zip(names, p)},
                    "tokens": len(x), "truncated": n > len(x)})
    return out


def load_translator(run_dir):
    """(model, source tokenizer, target tokenizer, config) of a run folder that holds a Transformer."""
    config = load_config_json(run_dir)
    if config["model"]["type"] != "transformer":
        raise ValueError(f"{run_dir} holds a {config['model']['type']} model; `numformer translate` needs an "
                         f"encoder-decoder Transformer (train one with configs/multi30k.toml)")
    state = load_tokenizer_json(run_dir, config["data"])
    if not state or "src" not in state:
        raise ValueError(f"{run_dir} has no source/target tokenizer.json, so text cannot be encoded")
    src_tok = tokenizer_from_state(state["src"], run_dir)
    tgt_tok = src_tok if state.get("joint") else tokenizer_from_state(state.get("tgt"), run_dir)
    return load_model(run_dir, config), src_tok, tgt_tok, config


def unknown_words(tokenizer, text):
    """Words of ``text`` that a word-level tokenizer reads as ``<unk>`` (byte-level BPE has none)."""
    if not hasattr(tokenizer, "stoi") or not hasattr(tokenizer, "tokenize"):
        return []
    return [w for w in tokenizer.tokenize(text) if w not in tokenizer.stoi]
