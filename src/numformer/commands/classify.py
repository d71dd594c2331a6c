"""numformer classify RUN_DIR "some text" [more texts ...] [--json] [-v]: the predicted label and its probability.

The texts go through exactly the preprocessing of the run: its saved tokenizer
(tokenizer.json), ``<cls>`` if the run used it, truncation to its ``max_len``
the way its ``[data] truncate`` says. Only the run folder is read (not the dataset).
"""
from __future__ import annotations

import json
import sys


def run(args):
    from ..train.inference import classify_texts

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
    p = sub.add_parser("classify", help="classify texts with a trained text classifier run (imdb, agnews or "
                                        "your own classification data): predicted label and its probability")
    p.add_argument("run_dir", help="a classifier run folder (e.g. runs/imdb after `numformer reproduce imdb`)")
    p.add_argument("texts", nargs="+", metavar="TEXT", help="one or more texts (quote each)")
    p.add_argument("--json", action="store_true", help="one JSON object per text (all class probabilities)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also print every class probability, the token count and whether the text was truncated")
    p.set_defaults(func=run)
