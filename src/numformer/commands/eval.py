"""numformer eval RUN_DIR [--split val|test] [--json]: loss (and perplexity, bits per token, bits per byte) and
the task's metrics. A checkpoint too damaged to read (truncated, its header overwritten) does not stop it when
model.safetensors is there: it evaluates that file, with a note (``model_and_task``)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def run(args):
    from ..train import load_config_json
    from ..train.bits_per_byte import byte_count
    from ..train.evaluation import split_loss

    config = load_config_json(args.run_dir)
    model, task = model_and_task(args.run_dir, config)
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


def model_and_task(run_dir, config):
    """(model, task) of a run folder. When its checkpoint cannot be read (``checkpoint_config`` refuses it, or
    the config it records fails the checks: ``train.run.trained_config``), the model is model.safetensors's,
    read first, then one note says so and the task is built without comparing config.json with the checkpoint;
    without a readable model.safetensors either, one ValueError naming both."""
    from ..run_files import CHECKPOINT, MODEL, checkpoint_config
    from ..train import load_model, load_task
    from ..train.run import trained_config

    try:
        recorded = checkpoint_config(Path(run_dir) / CHECKPOINT)
        if recorded is not None:
            trained_config(recorded, config, Path(run_dir) / CHECKPOINT)
    except ValueError as damaged:
        weights = Path(run_dir) / MODEL
        try:
            if not weights.is_file():
                raise ValueError(f"there is no {MODEL}")
            model = load_model(run_dir, config)
        except ValueError as e:
            raise ValueError(f"{run_dir} has no weights to evaluate: {_what(damaged)}, and {_what(e)}; restore a "
                             f"copy of either file, or retrain") from None
        print(f"note: {_what(damaged)}; evaluating {weights} instead (--resume needs the checkpoint restored)",
              file=sys.stderr, flush=True)
        return model, load_task(run_dir, config, against_checkpoint=False)
    task = load_task(run_dir, config)       # the data checked first: a model may take long to read
    return load_model(run_dir, config), task


def _what(error):
    """What is wrong, from a file reader's ValueError: its text without the advice after it (given once)."""
    return str(error).split("; it cannot be")[0]


def register(sub):
    p = sub.add_parser("eval", help="evaluate a trained run: loss, perplexity, bits per token and per byte, "
                                    "task metrics")
    p.add_argument("run_dir", help="a run folder written by `numformer train`")
    p.add_argument("--split", default="val", choices=["val", "test"],
                   help="which split (default val); a text task has no test split: test evaluates val, and says so")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
