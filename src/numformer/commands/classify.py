"""numformer classify RUN_DIR "some text" [more texts ...]: the predicted label and its probability.

The texts go through exactly the preprocessing of the run: its saved tokenizer
(tokenizer.json), ``<cls>`` if the run used it, truncation to its ``max_len``
the way its ``[data] truncate`` says. Only the run folder is read (not the dataset).
"""
from __future__ import annotations

import json
import sys


def load_classifier(run_dir):
    """(model, tokenizer, label names, [data] config) of a classifier run folder; clear errors otherwise."""
    from pathlib import Path

    import numpy as np

    from ..data.tokenizers import tokenizer_from_dict
    from ..train import load_config_json, load_model, load_tokenizer_state

    if not Path(run_dir).is_dir():
        raise ValueError(f"{run_dir} is not a folder; give a run folder written by `numformer train` or "
                         f"`numformer reproduce imdb|agnews` (e.g. runs/imdb)")
    config = load_config_json(run_dir)
    kind = config.get("model", {}).get("type")
    if kind != "classifier":
        raise ValueError(f"{run_dir} holds a {kind!r} model (task {config.get('data', {}).get('task')!r}); "
                         f"numformer classify needs a text classifier run (imdb, agnews); "
                         f"use `numformer generate` for language models")
    state = load_tokenizer_state(run_dir)
    if state is None:
        raise ValueError(f"{run_dir} has no tokenizer.json, so its texts cannot be tokenized as in training")
    tokenizer = tokenizer_from_dict(state)
    model = load_model(run_dir, config)
    names = state.get("label_names") or _default_label_names(config["data"].get("task"), model.n_classes)
    if len(names) != model.n_classes:
        raise ValueError(f"{run_dir}: {len(names)} label names for a model with {model.n_classes} classes")
    if not hasattr(tokenizer, "encode_batch"):
        raise ValueError(f"{run_dir}: the saved tokenizer cannot encode text")
    return model, tokenizer, list(names), config["data"]


def _default_label_names(task, n):
    from ..data.text_datasets import AGNEWS_CLASSES

    known = {"imdb": ["negative", "positive"], "agnews": list(AGNEWS_CLASSES)}.get(task)
    return known if known and len(known) == n else [str(i) for i in range(n)]


def classify_texts(run_dir, texts):
    """[{text, label, probability, probabilities {name: p}, tokens, truncated}] for each text."""
    import numpy as np

    from ..data.text_tasks import encode_for_classifier
    from ..ops import softmax_forward

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


def run(args):
    results = classify_texts(args.run_dir, args.texts)
    if args.json:
        for r in results:
            print(json.dumps(r))
        return
    for r in results:
        snippet = r["text"] if len(r["text"]) <= 60 else r["text"][:57] + "..."
        line = f"{r['label']}\t{r['probability']:.4f}"
        if len(results) > 1 or args.verbose:
            line += f"\t{snippet}"
        print(line)
        if args.verbose:
            print("  " + ", ".join(f"{k} {v:.4f}" for k, v in r["probabilities"].items())
                  + f"; {r['tokens']} tokens" + (" (truncated)" if r["truncated"] else ""))
    if any(r["truncated"] for r in results) and not args.verbose:
        print("(some texts were longer than the run's max_len and were truncated as in training)", file=sys.stderr)


def register(sub):
    p = sub.add_parser("classify", help="classify texts with a trained text classifier run (imdb, agnews): "
                                        "predicted label and its probability")
    p.add_argument("run_dir", help="a classifier run folder (e.g. runs/imdb after `numformer reproduce imdb`)")
    p.add_argument("texts", nargs="+", metavar="TEXT", help="one or more texts (quote each)")
    p.add_argument("--json", action="store_true", help="one JSON object per text (all class probabilities)")
    p.add_argument("-v", "--verbose", action="store_true", help="also print every class probability")
    p.set_defaults(func=run)
