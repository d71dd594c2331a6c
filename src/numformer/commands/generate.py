"""numformer generate SOURCE [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
[--greedy] [--seed S] [--ignore-eos] [--adapter DIR] [--quantize int8 [--group-size G]]: continue a prompt with a
GPT, printing the text as it comes, until the model's end token (as transformers' ``generate`` stops; not with
--ignore-eos) or --max-new-tokens (with --quantize, from int8 weights: ``numformer.quantize.quantize_model``, the
products shared with worker processes: ``numformer.quantize.worker_processes``).

SOURCE: a run folder, or a Hugging Face model of a family numformer loads (GPT-2, Llama, Mistral, Qwen2, Qwen3,
Gemma 2, Gemma 3, Arcee): a folder, or a hub id written ``hf:NAME``."""
from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path


def load_generator(source, adapter=None, command="generate", quantize=None):
    """(GPT, tokenizer) from a run folder, a Hugging Face folder, or a hub id written ``hf:NAME``; ``adapter``:
    a PEFT LoRA adapter folder put on the model (``numformer.interop.peft.load_adapter``); ``command``: the
    command named in the errors (generate, chat, explore). ``quantize``: a ``numformer.quantize.LayerQuantizer``
    (``--quantize int8``, ``quantizer_for``), which quantizes each linear layer as soon as its weights are read
    (a LoRA model's once the load is done and its adapters merged); its report goes to stderr."""
    from ..interop.hf import read_hf_config
    from ..interop.peft import load_adapter
    from ..interop.sources import is_run_folder, load
    from ..train import load_config_json
    from ..train.run_folder import RUN_FILES

    if Path(source).is_dir() and not any(Path(source, name).exists() for name in ("config.json", *RUN_FILES)):
        read_hf_config(source)                     # one error: neither a run folder nor a Hugging Face one
    run = not str(source).startswith("hf:") and not (Path(source, "config.json").is_file()
                                                    and not is_run_folder(source))
    if run and not Path(source).exists():
        hub_like = str(source).count("/") == 1 and not Path(source).parent.exists()    # OWNER/NAME, not a folder
        raise ValueError(f"run folder {source} does not exist" + (f" (a Hugging Face hub id is written hf:{source}, "
                         f"read from the Hugging Face cache)" if hub_like else "") + "; give a run folder "
                         "(`numformer train CONFIG --out RUN_DIR` makes one) or a Hugging Face model folder")
    lora_run = False
    if run:
        config = load_config_json(source)          # the whole config.json checked, as every command does
        if config["model"]["type"] != "gpt":
            raise ValueError(f"{source} holds a {config['model']['type']} model; `numformer {command}` works on a "
                             f"GPT (use `numformer translate` or `classify` for the others)")
        lora_run = config.get("lora") is not None
    while_loading = None if adapter is not None or lora_run else quantize
    model, tokenizer = load(source, quantize=while_loading)
    if adapter is not None:
        if getattr(model, "lora_config", None):
            raise ValueError(f"{source} is a LoRA run (its adapters are in its weights); --adapter puts an adapter "
                             f"on a base model: give the base model, or export the run with --merge first")
        load_adapter(model, adapter).eval()
    if tokenizer is None:
        raise ValueError(f"{source} has no tokenizer.json, so text cannot be encoded" if run else
                         f"{source} has no tokenizer (tokenizer.json or vocab.json + merges.txt), so text cannot "
                         f"be encoded")
    if quantize is not None:
        if while_loading is None:
            from ..lora import merge_lora

            merge_lora(model)
            print("the LoRA adapters were merged into their layers before quantizing", file=sys.stderr)
            quantize.finish(model)
        print(quantize.report, file=sys.stderr)
    return model, tokenizer


def check_ids_fit(ids, model, tokenizer, source):
    """ValueError when the tokenizer gave ``ids`` the model has no embedding for: a tokenizer larger than the
    model's vocabulary is not the model's (or tokens were added to it without resizing the model)."""
    beyond = [i for i in ids if i >= model.vocab_size]
    if beyond:
        raise ValueError(f"the prompt encodes to token id {max(beyond)}, beyond the model's vocabulary of "
                         f"{model.vocab_size:,} ids: {source}'s tokenizer has {tokenizer.vocab_size:,} tokens, so it "
                         f"is not this model's tokenizer (or tokens were added to it without resizing the model's "
                         f"embedding); give the folder the model's own tokenizer")


def model_folder(source):
    """The folder that holds SOURCE's files: the run folder or Hugging Face folder itself, or a hub id's cached
    snapshot."""
    from ..interop.hf import resolve_source
    from ..interop.sources import is_run_folder

    return Path(source) if is_run_folder(source) else resolve_source(source)


def run(args):
    from ..data.chat import generation_eos_ids
    from ..generate import generate

    check_sampling_arguments(args)
    check_quantize_arguments(args)
    model, tokenizer = load_generator(args.run_dir, args.adapter, quantize=quantizer_for(args))
    stop = None if args.ignore_eos else generation_eos_ids(model_folder(args.run_dir), tokenizer) or None
    prompt_ids = tokenizer.encode_prompt(args.prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one character with --prompt")
    check_ids_fit(prompt_ids, model, tokenizer, args.run_dir)
    out = sys.stdout
    new, shown = [], []               # the prompt is printed with the first token: after every option is checked

    def stream(token):
        # decode everything so far: a byte-level BPE token can be part of a character
        if not shown:
            out.write(args.prompt)
            shown.append(0)
        if stop is not None and token in stop:         # the end token ends the text, unprinted
            return
        new.append(token)
        text = tokenizer.decode(new)
        if not text.endswith("\ufffd"):
            out.write(text[shown[0]:])
            out.flush()
            shown[0] = len(text)

    with int8_worker_processes(model, args):
        generate(model, prompt_ids, args.max_new_tokens, temperature=1.0 if args.temperature is None else
                 args.temperature, top_k=args.top_k,
                 top_p=args.top_p, greedy=args.greedy, rng=args.seed, stream=stream, stop_tokens=stop)
    out.write((tokenizer.decode(new)[shown[0]:] if shown else args.prompt) + "\n")


def register(sub):
    p = sub.add_parser("generate", help="continue a prompt with a GPT (streams to the terminal)")
    p.add_argument("run_dir", metavar="SOURCE", help="a run folder written by `numformer train` or `import-hf`, or "
                                                     "a Hugging Face model folder or hub id (hf:gpt2) of a family "
                                                     "numformer loads")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="go on past the model's end token (by default generation stops there, as transformers' does)")
    add_adapter_argument(p)
    add_sampling_arguments(p)
    add_quantize_arguments(p)
    p.set_defaults(func=run)


def add_adapter_argument(p):
    p.add_argument("--adapter", metavar="DIR", default=None,
                   help="a LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors, as "
                        "`numformer export` of a LoRA run or peft's save_pretrained writes) to put on the model")


def add_sampling_arguments(p, max_new_tokens=500, temperature_default="1.0"):
    """The sampling flags of ``generate`` (``numformer chat`` has them too). --temperature is None when not
    given (the command then takes its default), so that --greedy with it is an error."""
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                   help=f"tokens to generate (default {max_new_tokens})")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"softmax temperature (default {temperature_default}; 0 = greedy)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: smallest set with probability >= p")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--seed", type=int, default=None,
                   help="random seed, for a repeatable sample (default: a new sample each time)")


SAMPLING_FLAGS = (        # flag, its attribute, whether a value is valid, what it must be
    ("--max-new-tokens", "max_new_tokens", lambda v: v >= 0, "an integer >= 0"),
    ("--temperature", "temperature", lambda v: math.isfinite(v) and v >= 0, "a number >= 0 (0: greedy)"),
    ("--top-k", "top_k", lambda v: v >= 1, "an integer >= 1"),
    ("--top-p", "top_p", lambda v: 0 < v <= 1, "a number in (0, 1]"),
    ("--seed", "seed", lambda v: v >= 0, "an integer >= 0"),
)


def check_sampling_arguments(args):
    """The one error of the sampling flags (``generate``, ``chat``, ``explore``), in the flags' names and before
    any model is loaded; a flag left unset (None) is not checked."""
    for flag, name, valid, wanted in SAMPLING_FLAGS:
        value = getattr(args, name)
        if value is not None and not valid(value):
            raise ValueError(f"{flag} must be {wanted}, got {value}")
    if getattr(args, "greedy", False):
        ignored = [flag for flag, name in (("--temperature", "temperature"), ("--top-k", "top_k"), ("--top-p", "top_p"))
                   if getattr(args, name, None) not in (None, 0 if name == "temperature" else None)]
        if ignored:
            flags = " and ".join(ignored)
            raise ValueError(f"--greedy always takes the most likely token, so {flags} would do nothing: drop "
                             f"--greedy to sample, or drop {flags}")


def add_quantize_arguments(p):
    """``--quantize int8 [--group-size G]`` (``generate`` and ``chat``)."""
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="generate from int8 weights (symmetric absmax; embeddings and norms stay float)")
    p.add_argument("--group-size", type=int, default=None,
                   help="with --quantize: one scale per GROUP_SIZE inputs of each output row (default: one per row)")


def check_quantize_arguments(args):
    """The one error of the quantize flags, raised before any model is loaded."""
    if args.group_size is not None and args.quantize is None:
        raise ValueError("--group-size sets the groups of --quantize int8; add --quantize int8")
    if args.group_size is not None and args.group_size < 1:
        raise ValueError(f"--group-size must be a positive number of inputs per scale (or left out: one scale per "
                         f"row), got {args.group_size}")


def quantizer_for(args):
    """The ``LayerQuantizer`` of ``--quantize int8 [--group-size G]`` for ``load_generator``, or None."""
    if not getattr(args, "quantize", None):
        return None
    from ..quantize import LayerQuantizer

    return LayerQuantizer(bits=8, group_size=args.group_size)


def int8_worker_processes(model, args):
    """With ``--quantize int8`` and more than one of numformer's threads (``NUMFORMER_NUM_THREADS``): the int8
    products shared with worker processes (``numformer.quantize.worker_processes``, one process per thread);
    else nothing."""
    from .._runtime import get_num_threads

    if not args.quantize or get_num_threads() < 2:
        return contextlib.nullcontext()
    from ..quantize import worker_processes

    return worker_processes(model)
