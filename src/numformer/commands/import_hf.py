"""numformer import-hf SOURCE --out RUN_DIR [--data TEXT_FILE] [--block-size N] [--dtype float32|float64]
[--overwrite]: a run folder from a Hugging Face GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 or Arcee model (a
folder or a hub id such as gpt2), used by every command: generate, eval (on --data, by default the built-in tiny
Shakespeare), analyze, export, and fine-tuning with ``[model] init_from = "RUN_DIR"``."""
from __future__ import annotations

from pathlib import Path

# The default evaluation window of an imported run (eval, analyze), in tokens: the model's context when shorter.
# A window of a Llama 3.2's whole context (131,072 tokens) is longer than the built-in text's validation split.
EVAL_WINDOW = 1024


def import_run(source, out, data_path="", block_size=None, dtype="float32", overwrite=False):
    """Write the run folder: config.json (resolved as by `numformer train`), tokenizer.json, model.safetensors.
    ``block_size``: the evaluation window, from 1 to the model's context (a ValueError naming --block-size
    otherwise); None: the context, at most ``EVAL_WINDOW``."""
    import numpy as np

    from ..interop.sources import check_load_memory, load_weights, read_source
    from ..models import build_model
    from ..nn import init
    from ..config import resolve_config
    from ..train import run_folder
    from ..run_files import MODEL, save_model, write_json_atomic

    src = read_source(source)
    source_model, tokenizer_state = src.model, src.tokenizer_state
    if tokenizer_state is None:
        raise ValueError(f"{source} has no tokenizer (tokenizer.json or vocab.json + merges.txt); without one "
                         f"text cannot be encoded: add the tokenizer files to the folder")
    context = source_model["block_size"]
    if block_size is not None and not 1 <= block_size <= context:      # --block-size 0 is no default either
        raise ValueError(f"--block-size {block_size}: the evaluation window must be from 1 to the model's context "
                         f"of {context} tokens; leave it out for the default ({min(context, EVAL_WINDOW)})")
    data = {"task": "text", "path": data_path,
            "block_size": min(context, EVAL_WINDOW) if block_size is None else block_size}
    config, task = resolve_config({"model": {"init_from": str(source)}, "data": data, "train": {"dtype": dtype}})
    config["model"].pop("init_from")          # the weights are in the run folder itself
    model_cfg = {k: v for k, v in config["model"].items() if v is not None}
    check_load_memory(source, dtype)                # before the model takes its memory
    with init.skipped():                            # every weight is the source's: none is drawn first
        model = build_model(model_cfg, rng=np.random.default_rng(0), dtype=np.dtype(dtype))
    load_weights(model, source)
    out = Path(out)
    with run_folder.lock_for_writing(out):
        run_folder.start_new_run(out, overwrite, resumable=False)       # import-hf has no --resume
        write_json_atomic(out / "tokenizer.json", task.tokenizer_state())
        save_model(out / MODEL, model, {"source": str(source), **run_folder.weights_metadata(config)})
        write_json_atomic(out / "config.json", config)      # last: a folder with config.json is complete
    return out, model, task


def run(args):
    out, model, task = import_run(args.source, Path(args.out), args.data, args.block_size, args.dtype,
                                  args.overwrite)
    print(f"imported {args.source} ({model.num_parameters():,} parameters) into {out}; data: {task.describe()}. "
          f"Try: numformer generate {out} --prompt \"Hello, I'm a language model,\" --max-new-tokens 40")


def register(sub):
    what = ("make a run folder from a Hugging Face GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 or Arcee "
            "model (folder or hub id)")
    p = sub.add_parser("import-hf", help=what, description=what[0].upper() + what[1:] + ".")
    p.add_argument("source", help="a Hugging Face model folder (config.json + model.safetensors) or a hub id "
                                  "such as gpt2 or HuggingFaceTB/SmolLM-135M (also written hf:gpt2)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder to write")
    p.add_argument("--data", default="", metavar="TEXT_FILE",
                   help="text file for `numformer eval` and `analyze` (default: the built-in tiny Shakespeare)")
    p.add_argument("--block-size", type=int, default=None, help=f"evaluation window in tokens (default: the "
                                                                 f"model's context, at most {EVAL_WINDOW}; the "
                                                                 f"model keeps its whole context)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="weights' dtype (default float32)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in RUN_DIR")
    p.set_defaults(func=run)
