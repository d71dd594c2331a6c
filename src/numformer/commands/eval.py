"""numformer eval RUN_DIR [--split val|test] [--json]: loss (and perplexity, bits per token, bits per byte) and
the task's metrics."""
from __future__ import annotations

import json
import math


def run(args):
    from ..train import load_config_json, load_model, load_task
    from ..train.bits_per_byte import byte_count
    from ..train.evaluation import split_loss

    config = load_config_json(args.run_dir)
    task = load_task(args.run_dir, config)
    model = load_model(args.run_dir, config)
    bs = config["train"]["eval_batch_size"] or config["train"]["batch_size"]
    bytes_seen = byte_count(task)
    loss = split_loss(model, task, args.split, bs, bytes_seen=bytes_seen)[0]
    split = args.split
    if split == "test" and not getattr(task, "has_test_split", True):
        split = "val"                 # say what was evaluated: a text task has two splits
    result = {"split": split, "loss": loss}
    if config["model"]["type"] in ("gpt", "transformer"):
        unit = getattr(task, "unit", "token")
        result["perplexity"] = math.exp(loss) if loss < math.log(float.fromhex("0x1p1023")) else math.inf
        result[f"bits_per_{unit}"] = loss / math.log(2)
        if bytes_seen is not None:      # comparable across tokenizers (train/bits_per_byte.py)
            result["bits_per_byte"] = bytes_seen.bpb
    result.update(task.evaluate(model, args.split))
    if args.json:
        print(json.dumps(result))
        return
    note = f" ({split} split)" if split == args.split else " (val split: a text task has no test split)"
    print(f"{args.run_dir}{note}")
    for k, v in result.items():
        if k != "split":
            print(f"  {k:<20} {v:.4f}" if isinstance(v, float) else f"  {k:<20} {v}")


def register(sub):
    p = sub.add_parser("eval", help="evaluate a trained run: loss, perplexity, bits per token and per byte, "
                                    "task metrics")
    p.add_argument("run_dir", help="a run folder written by `numformer train`")
    p.add_argument("--split", default="val", choices=["val", "test"],
                   help="which split (default val); a text task has no test split: test evaluates val, and says so")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
