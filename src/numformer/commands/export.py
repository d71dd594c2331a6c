"""numformer export RUN_DIR --format hf --out DIR: a trained GPT as a Hugging Face folder, GPT-2 or (for a RoPE
model) Llama (config.json, model.safetensors, and tokenizer.json when the run's tokenizer has a Hugging Face
form), which ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` loads with the same logits.

A LoRA run (a [lora] section) is written as PEFT writes it: the adapter in DIR (adapter_config.json,
adapter_model.safetensors) and its base model in DIR/base, for
``peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("DIR/base"), "DIR")``; with ``--merge``
the adapters are merged into the weights and DIR is a plain Hugging Face model."""
from __future__ import annotations

import os
from pathlib import Path

FORMATS = ("hf",)


def run(args):
    from ..interop.hf import export_hf
    from ..interop.peft import save_adapter
    from ..lora import merge_lora, unload_lora
    from ..train import load_config_json, load_model, load_tokenizer_state, run_folder
    from ..interop.sources import tokenizer_from_state

    config = load_config_json(args.run_dir)
    out = Path(args.out)
    run_folder.check_out_folder(out)
    if out.exists() and os.path.samefile(out, args.run_dir):
        raise ValueError(f"--out {out} is the run folder being exported; exporting into it would replace the "
                         f"run's config.json and weights: choose another --out")
    model = load_model(args.run_dir, config)
    state = load_tokenizer_state(args.run_dir)
    tokenizer = tokenizer_from_state(state, args.run_dir) if state else None
    out.mkdir(parents=True, exist_ok=True)
    with run_folder.RunLock(out, exclusive=True, what="export into"):   # no training writes it meanwhile
        if run_folder.holds_run(out):
            raise ValueError(f"--out {out} holds a numformer run; exporting into it would destroy that run: "
                             f"choose another --out")
        if any(out.iterdir()) and not args.overwrite:
            raise ValueError(f"{out} is not empty; choose another --out or pass --overwrite")
        if getattr(model, "lora_config", None) and not args.merge:
            save_adapter(model, out, base_model_name_or_path=str((out / "base").resolve()))
            export_hf(unload_lora(model), out / "base", tokenizer)
        else:
            export_hf(merge_lora(model) if getattr(model, "lora_config", None) else model, out, tokenizer)
    files = sorted(p.name for p in out.iterdir())
    how = (f"peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(out / 'base')!r}), "
           f"{str(out)!r})" if (out / "adapter_config.json").is_file() else
           f"transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    print(f"wrote {out}: {', '.join(files)}; load it with {how}")


def register(sub):
    p = sub.add_parser("export", help="write a trained GPT as a Hugging Face folder (config.json + "
                                      "model.safetensors): GPT-2, or Llama for a RoPE model")
    p.add_argument("run_dir", help="a run folder (from `numformer train` or `numformer import-hf`)")
    p.add_argument("--format", default="hf", choices=FORMATS, help="hf: Hugging Face transformers (GPT2LMHeadModel, or LlamaForCausalLM for a RoPE model; the default)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    p.add_argument("--merge", action="store_true",
                   help="a LoRA run: merge the adapters into the weights and write one model (default: the "
                        "adapter in PEFT's format, its base model in DIR/base)")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty folder")
    p.set_defaults(func=run)
