"""numformer export RUN_DIR --format hf --out DIR: a trained GPT as a Hugging Face folder, GPT-2 or (for a RoPE
model) Llama, Mistral or Qwen2 (config.json, model.safetensors, and tokenizer.json with tokenizer_config.json
when the run's tokenizer has a Hugging Face form), which ``transformers.AutoModelForCausalLM.from_pretrained(DIR)``
loads with the same logits.

``--out`` must be new or empty; ``--overwrite`` replaces an earlier export there: the files an export writes
(``EXPORT_FILES``) are removed first (the weights first, config.json last), so the folder then holds only the
new export's files (an earlier export's tokenizer.json never stays beside a model without one). A folder
holding any other file is refused, even with ``--overwrite``: numformer deletes only what it writes."""
from __future__ import annotations

import os
from pathlib import Path

FORMATS = ("hf",)
# Every file ``interop.hf.export_hf`` writes, in the order an overwrite removes them: the weights first and
# config.json last, so that a folder cut short never pairs a config with other weights.
EXPORT_FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json")


def run(args):
    from ..interop.hf import export_hf
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
        clear_export_folder(out, args.overwrite)
        export_hf(model, out, tokenizer)
    files = sorted(p.name for p in out.iterdir() if p.name in EXPORT_FILES)
    print(f"wrote {out}: {', '.join(files)}; load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")


def _written_by_export(name):
    """Whether ``name`` is a file an export writes, or the temporary file of such a write cut short."""
    return name in EXPORT_FILES or any(name.startswith(f".{f}.") and name.endswith(".tmp") for f in EXPORT_FILES)


def clear_export_folder(out, overwrite):
    """Make the locked folder ``out`` ready for an export: empty, or (``overwrite``) an earlier export whose files
    are removed here; a folder holding anything else is refused with one line naming what it holds."""
    from .._platform import LOCK_FILE

    present = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE)
    if not present:
        return
    if not overwrite:
        raise ValueError(f"{out} is not empty; choose another --out or pass --overwrite")
    foreign = [name for name in present if not _written_by_export(name) or not (out / name).is_file()
               or (out / name).is_symlink()]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(f"--out {out} holds what numformer's export does not write ({shown}); --overwrite "
                         f"replaces only an earlier export: remove those, or choose another --out")
    for name in sorted(present, key=lambda n: EXPORT_FILES.index(n) if n in EXPORT_FILES else -1):
        (out / name).unlink()


def register(sub):
    what = ("write a trained GPT as a Hugging Face folder (config.json + model.safetensors): GPT-2, or Llama, "
            "Mistral or Qwen2 for a RoPE model")
    p = sub.add_parser("export", help=what, description=what[0].upper() + what[1:] + ".")
    p.add_argument("run_dir", help="a run folder (from `numformer train` or `numformer import-hf`)")
    p.add_argument("--format", default="hf", choices=FORMATS, help="hf: Hugging Face transformers (GPT2LMHeadModel, "
                   "or LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM for a RoPE model; the default)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (new or empty)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in --out (its files are removed first; a folder holding other "
                        "files is refused)")
    p.set_defaults(func=run)
