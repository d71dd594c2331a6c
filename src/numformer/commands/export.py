"""numformer export RUN_DIR [--format hf] [--model-type TYPE] --out DIR [--merge] [--overwrite]: a trained GPT
as a Hugging Face folder, GPT-2 or (for a RoPE model) Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 or
Arcee (config.json, model.safetensors, and tokenizer.json with tokenizer_config.json when the run's tokenizer has a
Hugging Face form), which ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` loads with the same logits.

The family is the one ``default_export_type`` picks from the model's options; ``--model-type`` chooses another
that can express the model (a Llama-like model is also a Mistral or Qwen2 one). A family that cannot is refused
with one line naming what it lacks and the types this model can be written as, before anything is written.

``--out`` must be new or empty; ``--overwrite`` replaces an earlier export there: the files an export writes
(``EXPORT_FILES``, and additional chat templates in their folder) are removed first (the weights first,
config.json last), so the folder then holds only the new export's files (an earlier export's tokenizer.json
never stays beside a model without one). A folder holding any other file is refused, even with
``--overwrite``: numformer deletes only what it writes. The line printed at the end names every file written.

A LoRA run (a [lora] section) is written as PEFT writes it: the adapter in DIR (adapter_config.json,
adapter_model.safetensors) and its base model in DIR/base, for
``peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("DIR/base"), "DIR")``; with ``--merge``
the adapters are merged into the weights and DIR is a plain Hugging Face model."""
from __future__ import annotations

import os
from pathlib import Path

from .._platform import LOCK_FILE
from ..data.tokenizers.pretrained import SIDE_FILES, TEMPLATES_DIR, is_side_file
from ..interop.hf.checkpoints import CONFIG, TOKENIZER, WEIGHTS
from ..interop.hf.families import FAMILIES
from ..interop.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from ..run_files import TEMP_SUFFIX

FORMATS = ("hf",)
MODEL_TYPES = tuple(FAMILIES)       # the model_types ``interop.hf.export_hf`` writes
# Every file an export writes, named by the constants its writers use (``interop.hf.export_hf``: the weights,
# tokenizer.json and the model's side files, config.json; ``interop.peft.save_adapter``: the adapter), in the
# order an overwrite removes them: the weights first and config.json last, so that a folder cut short never
# pairs a config with other weights. Additional chat templates go in TEMPLATES_DIR (``is_side_file``).
EXPORT_FILES = (WEIGHTS, ADAPTER_WEIGHTS, TOKENIZER, *SIDE_FILES, ADAPTER_CONFIG, CONFIG)
BASE_DIR = "base"                   # a LoRA run's base model, beside its adapter


def run(args):
    from ..interop.hf import export_hf
    from ..interop.hf.checkpoints import hf_export_config
    from ..interop.hf import default_export_type
    from ..interop.peft import save_adapter, savable_adapter_keys
    from ..lora import merge_lora, unload_lora
    from ..data.run_tokenizer import load_tokenizer_json
    from ..train import load_config_json, load_model, run_folder
    from ..interop.sources import tokenizer_from_state

    config = load_config_json(args.run_dir, hf_advice=(
        "it is already in the Hugging Face format, and transformers loads it as it is; to write it as another "
        f"family (--model-type), import it first with `numformer import-hf {args.run_dir} --out RUN_DIR` and "
        "export that run"))
    kind = config["model"].get("type")
    if kind != "gpt":
        raise ValueError(f"{args.run_dir} holds a {kind} model; `numformer export` writes GPT runs (a Hugging Face "
                         f"causal language model)")
    out = Path(args.out)
    run_folder.check_out_folder(out)
    if out.exists() and os.path.samefile(out, args.run_dir):
        raise ValueError(f"--out {out} is the run folder being exported; exporting into it would replace the "
                         f"run's config.json and weights: choose another --out")
    model = load_model(args.run_dir, config)
    if args.model_type is not None:                 # refused before any folder or file is made
        try:
            hf_export_config(model.config, args.model_type)
        except ValueError as e:
            raise ValueError(f"--model-type {args.model_type}: {e}") from None
    if getattr(model, "lora_config", None) and not args.merge:      # so is an adapter PEFT cannot be given
        savable_adapter_keys(model, args.model_type or default_export_type(model.config))
    state = load_tokenizer_json(args.run_dir, config["data"])     # a run whose task keeps one: it must be there
    tokenizer = tokenizer_from_state(state, args.run_dir) if state else None
    made = [p for p in (out, *out.parents) if not p.exists()]       # the folders mkdir makes, deepest first
    out.mkdir(parents=True, exist_ok=True)
    try:
        with run_folder.RunLock(out, exclusive=True, what="export into"):   # no training writes it meanwhile
            if run_folder.holds_run(out):
                raise ValueError(f"--out {out} holds a numformer run; exporting into it would destroy that run: "
                                 f"choose another --out")
            clear_export_folder(out, args.overwrite)
            if getattr(model, "lora_config", None) and not args.merge:
                save_adapter(model, out, base_model_name_or_path=str((out / BASE_DIR).resolve()),
                             model_type=args.model_type)
                export_hf(unload_lora(model), out / BASE_DIR, tokenizer, model_type=args.model_type)
            else:
                export_hf(merge_lora(model) if getattr(model, "lora_config", None) else model, out, tokenizer,
                          model_type=args.model_type)
    except BaseException:
        _remove_if_empty(made)          # a refused export leaves no folder of its own making behind
        raise
    how = (f"peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(out / BASE_DIR)!r}), "
           f"{str(out)!r})" if (out / ADAPTER_CONFIG).is_file() else
           f"transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    print(f"wrote {out}: {', '.join(written_files(out))}; load it with {how}")


def written_files(out):
    """The files in the export folder ``out`` (paths in it, / between folders; sorted): after an export, what it
    wrote, as ``clear_export_folder`` left the folder empty (but for the lock file of platforms that need one)."""
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != LOCK_FILE)


def _remove_if_empty(folders):
    """Remove each of ``folders`` (deepest first) that holds nothing (but the lock file of platforms that need
    one); stop at the first that holds something."""
    for folder in folders:
        try:
            if any(p.name != LOCK_FILE for p in folder.iterdir()):
                return
            (folder / LOCK_FILE).unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            return


def _written_by_export(name):
    """Whether ``name`` (a path in an export folder, / between folders) is a file an export writes: one of
    ``EXPORT_FILES`` or a side file (``is_side_file``: additional chat templates), in the folder or in
    ``BASE_DIR``; or the temporary file of such a write cut short (``.NAME.PID.RANDOM.tmp``)."""
    folder, _, file = name.removeprefix(f"{BASE_DIR}/").rpartition("/")
    if file.startswith(".") and file.endswith(TEMP_SUFFIX):
        file = file[1:-len(TEMP_SUFFIX)].rsplit(".", 2)[0]
    name = f"{folder}/{file}" if folder else file
    return name in EXPORT_FILES or is_side_file(name)


# The folders an export writes: a LoRA export's base model, and the additional chat templates (in either)
EXPORT_FOLDERS = (BASE_DIR, TEMPLATES_DIR, f"{BASE_DIR}/{TEMPLATES_DIR}")


def _earlier_export(folder, inside=""):
    """(files an export wrote, in removal order; names of anything else) in ``folder``, which is ``inside`` the
    export folder ("" for itself, else a path ending in /); the folders an export writes (``EXPORT_FOLDERS``)
    are looked into, their files listed before the folder itself."""
    files, foreign = [], []
    for p in sorted(folder.iterdir(), key=lambda p: EXPORT_FILES.index(p.name) if p.name in EXPORT_FILES else -1):
        name = inside + p.name
        if p.name == LOCK_FILE:
            continue
        if name in EXPORT_FOLDERS and p.is_dir() and not p.is_symlink():
            inner, other = _earlier_export(p, f"{name}/")
            files += inner + [p]
            foreign += other
        elif _written_by_export(name) and p.is_file() and not p.is_symlink():
            files.append(p)
        else:
            foreign.append(name)
    return files, foreign


def clear_export_folder(out, overwrite):
    """Make the locked folder ``out`` ready for an export: empty, or (``overwrite``) an earlier export whose files
    are removed here (the weights first, config.json last); a folder holding anything else is refused with one
    line naming what it holds, before anything is removed."""
    files, foreign = _earlier_export(out)
    if not files and not foreign:
        return
    if not overwrite:
        raise ValueError(f"{out} is not empty; choose another --out or pass --overwrite")
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(f"--out {out} holds what numformer's export does not write ({shown}); --overwrite "
                         f"replaces only an earlier export: remove those, or choose another --out")
    for path in files:
        path.rmdir() if path.is_dir() else path.unlink()


def register(sub):
    what = ("write a trained GPT as a Hugging Face folder (config.json + model.safetensors): GPT-2, or Llama, "
            "Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 or Arcee for a RoPE model")
    p = sub.add_parser("export", help=what, description=what[0].upper() + what[1:] + ".")
    p.add_argument("run_dir", help="a GPT run folder (from `numformer train` or `numformer import-hf`)")
    p.add_argument("--format", default="hf", choices=FORMATS, help="hf: Hugging Face transformers (GPT2LMHeadModel, "
                   "or for a RoPE model the Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 or Arcee its options need; "
                   "the default)")
    p.add_argument("--model-type", choices=MODEL_TYPES, metavar="TYPE",
                   help="the Hugging Face family (config.json model_type) to write, one of %(choices)s: one that "
                        "can express the model (a Llama-like model can also be written as mistral or qwen2; any "
                        "other is refused, naming the types this model can be). Default: the one its options pick")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder to write: new or empty (or an earlier export, with --overwrite)")
    p.add_argument("--merge", action="store_true",
                   help="a LoRA run: merge the adapters into the weights and write one model (default: the "
                        "adapter in PEFT's format, its base model in DIR/base); no effect on other runs")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in --out (its files are removed first; a folder holding other "
                        "files is refused)")
    p.set_defaults(func=run)
