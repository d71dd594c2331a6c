"""Hugging Face folders in and out: config.json and safetensors to numformer's ``GPT``, and back.

    model, tokenizer = load_pretrained("gpt2")          # hub id, or a folder with config.json + model.safetensors
    export_hf(model, "out_dir", tokenizer)              # config.json + model.safetensors (+ tokenizer.json)

A model family is a ``GPTConfig`` of the existing ``GPT``, not a model of its own. ``FAMILIES``
(``families``) maps a Hugging Face ``model_type`` (gpt2, llama, mistral, qwen2, qwen3, gemma2, gemma3_text)
to the ``Family`` of its file: the table of every config.json field transformers reads (each honoured with
transformers' default, or refused by name), the map from config.json to a ``GPTConfig`` and back, and the
table of tensors pairing each numformer parameter with the Hugging Face tensor(s) holding it. This module
does the rest, the same for every family: finding the files, reading them, mapping names and shapes.

Weights are read from safetensors only (``model.safetensors`` or the shards of
``model.safetensors.index.json``); a pickle file (``pytorch_model.bin``) is
never loaded, because loading one can run arbitrary code. Export writes one
``model.safetensors`` (never shards) in the model's dtype. A hub id is fetched
with ``huggingface_hub`` (the ``hf`` extra) into its usual cache
(``~/.cache/huggingface/hub``, or ``$HF_HOME``); a copy already there is used
without the network.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..._install import install_hint, require
from ..._platform import check_memory
from ..._limits import bounded_json, check_bounds
from ...data.tokenizers import PretrainedTokenizer
from ...data.tokenizers.pretrained import check_side_files, side_files
from ...models import GPT
from ...nn import init
from ...run_files import write_atomic, write_json_atomic
from ...safetensors_reader import CHUNK_BYTES, read_header, read_safetensors_file, shard_files, stored_tensors
from ...safetensors_writer import safetensors_pieces
from .families import FAMILIES, default_export_type, family

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER = "tokenizer.json"
TOKENIZER_FILES = (TOKENIZER, "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
HUB_FILES = [CONFIG, WEIGHTS, WEIGHTS_INDEX, "model-*.safetensors", "generation_config.json", *TOKENIZER_FILES,
             "chat_template.jinja", "additional_chat_templates/*.jinja"]
# What `hf download --include` fetches for numformer (weights, config and tokenizer files, chat templates)
HUB_PATTERNS = '"*.json" "*.safetensors" "*.jinja" "merges.txt"'
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# -- finding the files ---------------------------------------------------------------------------------
def _hub_download(repo_id, no_folder=False):
    """A local snapshot folder of ``repo_id`` (config, safetensors, tokenizer files), from the cache if there;
    ``no_folder``: the id was given as a path that is not a folder (the error says so first: a typo?)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"{repo_id!r} is not a folder, and fetching it from the Hugging Face hub needs "
                         f"huggingface_hub: {install_hint('hf', 'huggingface_hub')}, or pass a local folder") from None
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True)
    except Exception:       # not (completely) in the cache: download
        pass
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_FILES)
    except Exception as e:
        from huggingface_hub.constants import HF_HUB_CACHE

        raise ValueError(
            (f"there is no folder {repo_id!r}, and " if no_folder else "")
            + f"cannot fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}; offline?). On a machine with "
            f"internet run `hf download {repo_id} --include {HUB_PATTERNS}` (it fills the cache in {HF_HUB_CACHE}, "
            f"which numformer then uses offline), or download those files into a folder and pass the folder") from None


def resolve_source(source):
    """A folder path for ``source``: an existing folder, or a hub id (``gpt2``, ``openai-community/gpt2``,
    also written ``hf:gpt2``) fetched into the Hugging Face cache."""
    text = str(source)
    hub = text[3:] if text.startswith("hf:") else None
    if hub is None and Path(text).is_dir():
        return Path(text)
    if hub is None and Path(text).parent.name and Path(text).parent.is_dir():     # runs/nope, where runs/ is
        raise ValueError(f"there is no folder {text!r} in {str(Path(text).parent)!r} (a typo? a Hugging Face hub id "
                         f"is written hf:{text})")
    hub = text if hub is None else hub
    if not _HUB_ID.match(hub) or Path(text).exists():
        raise ValueError(f"{text!r} is neither a folder nor a Hugging Face hub id (such as gpt2 or "
                         f"openai-community/gpt2)")
    return Path(_hub_download(hub, no_folder=not text.startswith("hf:")))


def read_hf_config(folder):
    """The dict of ``folder``'s config.json, which must be a JSON object with a string ``model_type`` (any
    model_type: ``family`` checks it is supported); one ValueError naming the file otherwise."""
    folder = Path(folder)
    path = folder / CONFIG
    if not path.is_file():
        raise ValueError(f"{folder} has no {CONFIG}: it is neither a run folder (written by numformer train) nor a "
                         f"Hugging Face model folder ({CONFIG} and {WEIGHTS}, as model.save_pretrained(folder) "
                         f"writes)")
    config = bounded_json(path.read_bytes(), str(path))
    if not isinstance(config, dict):
        raise ValueError(f"{path} is a JSON {type(config).__name__}, not a Hugging Face config (an object with "
                         f"model_type)")
    if not isinstance(config.get("model_type"), str):
        if {"data", "train"} & set(config):         # a numformer run's config.json that lost its [model] section
            raise ValueError(f"{path} is a numformer run's config without its [model] section (it has "
                             f"{sorted({'data', 'train'} & set(config))}); restore the file from a copy, or train "
                             f"the run again")
        raise ValueError(f"{path} has no model_type; numformer imports {sorted(FAMILIES)}")
    return config


def _weight_files(folder):
    """(weight_map {tensor: shard name} or None, [safetensors files]) of a Hugging Face folder."""
    if (folder / WEIGHTS).is_file():
        return None, [folder / WEIGHTS]
    if (folder / WEIGHTS_INDEX).is_file():
        return shard_files(folder, folder / WEIGHTS_INDEX)
    if any((folder / p).is_file() for p in PICKLE_WEIGHTS):
        raise ValueError(
            f"{folder} has only PyTorch pickle weights (pytorch_model.bin); numformer reads safetensors only, "
            f"because loading a pickle file can run arbitrary code. Convert once with PyTorch: python -c \"from "
            f"transformers import AutoModelForCausalLM as M; M.from_pretrained('{folder}').save_pretrained('{folder}')\""
            f" (this writes {WEIGHTS})")
    raise ValueError(f"{folder} has no {WEIGHTS} (nor {WEIGHTS_INDEX}); save the model with "
                     f"model.save_pretrained(folder)")


def read_safetensors(folder, lazy=False):
    """{tensor name: array} of every weight file of a folder, as stored (bfloat16 as float32); every file's
    header checked in full by ``safetensors_reader`` before any tensor is read; with shards, every tensor must be
    listed by the index, in the shard the index names, and in one shard only. ``lazy``: the values are
    ``StoredTensor``s (shape and dtype known, the data read when used as an array) instead of arrays."""
    folder = Path(folder)
    weight_map, files = _weight_files(folder)
    tensors, where = {}, {}
    for path in files:
        if not path.is_file():
            raise ValueError(f"{path} is listed in {WEIGHTS_INDEX} but missing; download it again")
        for name, array in stored_tensors(path).items():
            if name in tensors:
                raise ValueError(f"{path} holds tensor {name!r}, which {where[name]} also holds; download the "
                                 f"shards again")
            if weight_map is not None and name not in weight_map:
                raise ValueError(f"{path} holds tensor {name!r}, which {WEIGHTS_INDEX} does not list (its weight_map "
                                 f"names the shard of every tensor); download the index and the shards again")
            if weight_map is not None and weight_map[name] != path.name:
                raise ValueError(f"{path} holds tensor {name!r}, but {WEIGHTS_INDEX} places it in "
                                 f"{weight_map[name]!r}; download the shards again")
            tensors[name], where[name] = array, path.name
    if weight_map is not None and set(weight_map) - set(tensors):
        raise ValueError(f"{folder / WEIGHTS_INDEX} lists tensors no shard holds: "
                         f"{sorted(set(weight_map) - set(tensors))[:5]}; download the shards again")
    return tensors if lazy else {name: t.read() for name, t in tensors.items()}


def _stores(folder, fam, name):
    """Whether a checkpoint file of ``folder`` holds a tensor of canonical name ``name`` (headers only)."""
    _, files = _weight_files(Path(folder))
    return any(fam.canonical(k) == name for path in files if path.is_file() for k in read_header(path)[0])


def _stored_tensors(folder, fam, names):
    """{canonical name: array} of the checkpoint tensors of ``folder`` whose canonical names are in ``names``."""
    _, files = _weight_files(Path(folder))
    out = {}
    for path in files:
        if path.is_file():
            found = read_safetensors_file(path, select=lambda k: fam.canonical(k) in names)
            out.update({fam.canonical(k): v for k, v in found.items()})
    return out


def hf_model_config(folder, hf_config):
    """The ``GPTConfig`` of a Hugging Face folder: its family's map (``Family.to_config``), and
    ``tie_word_embeddings`` as transformers applies it: a stored ``lm_head.weight`` that differs from the
    embedding is used as an untied head (transformers then does not tie them). A value numformer cannot read
    is one ValueError naming the file (and, from the family's field table, the field)."""
    model_type = hf_config["model_type"]
    fam = family(model_type)
    try:
        config = fam.to_config(hf_config)
    except (KeyError, TypeError, AttributeError, IndexError, OverflowError) as e:
        raise ValueError(f"{Path(folder) / CONFIG} does not describe a model numformer can build "
                         f"({type(e).__name__}: {e}); restore it") from None
    except ValueError as e:
        if str(e).startswith(f"{model_type} config.json field"):
            raise ValueError(f"{Path(folder) / CONFIG}: {e}") from None
        raise ValueError(f"{Path(folder) / CONFIG} does not describe a model numformer can build ({e}); "
                         f"restore it") from None
    if config.tie_weights and _stores(folder, fam, "lm_head.weight"):     # read the two only then
        emb = fam.tensors(config)[0].hf[0]
        stored = _stored_tensors(folder, fam, {emb, "lm_head.weight"})
        if "lm_head.weight" in stored and not np.array_equal(stored["lm_head.weight"], stored.get(emb)):
            config = replace(config, tie_weights=False)
    return config


# -- names and shapes -------------------------------------------------------------------------------
def to_numformer_state(fam, config, hf_state, expected, where="checkpoint"):
    """Checkpoint tensors (Hugging Face names) -> {numformer name: array}, checking every name and shape.

    fam: the ``Family``; config: the model's ``GPTConfig``; hf_state: {checkpoint name: array} (names without
    the family's prefix, as a headless model saves them, are accepted; buffers matching ``fam.ignored`` are
    skipped); expected: {numformer name: shape}; where: the file named in errors. Transposed (GPT-2's Conv1D)
    and separate q/k/v tensors become numformer's (out, in) layout and fused ``qkv_proj``. A tied model
    (``config.tie_weights``) drops a stored ``lm_head.weight`` equal to the embedding and refuses one that
    differs. Raises one ValueError naming missing, unexpected or misshapen tensors.
    """
    return {nf: _assembled(parts, transpose) for nf, parts, transpose in
            numformer_plan(fam, config, hf_state, expected, where)}


def numformer_plan(fam, config, hf_state, expected, where="checkpoint"):
    """``to_numformer_state``'s checks, made from the tensors' shapes alone: [(numformer name, [checkpoint
    tensors], transpose)], the tensors that make each numformer tensor (``_assembled``). ``hf_state``'s values
    may be arrays or ``StoredTensor``s, which are read only to compare a stored lm_head with the embedding."""
    state = {fam.canonical(k): v for k, v in hf_state.items() if not re.search(fam.ignored, fam.canonical(k))}
    emb = fam.tensors(config)[0].hf[0]
    if config.tie_weights and "lm_head.weight" in state:
        if not np.array_equal(state["lm_head.weight"], state.get(emb)):
            raise ValueError(f"{where} stores an lm_head.weight that differs from {emb}, but the model ties them; "
                             f"build it with tie_weights = false")
        state.pop("lm_head.weight")              # a tied head saved anyway: the embedding itself
    plan, missing, wrong = [], [], []
    for row in fam.tensors(config):
        missing += [name for name in row.hf if name not in state]
        parts = [state.pop(name) for name in row.hf if name in state]
        if len(parts) != len(row.hf):
            continue
        shapes = [tuple(np.shape(p)) for p in parts]                     # as stored
        want = tuple(expected[row.nf])
        if _concatenated_shape([s[::-1] if row.transpose else s for s in shapes]) != want:
            want_hf = want[::-1] if row.transpose and len(parts) == 1 else want
            wrong.append(f"{', '.join(row.hf)} has shape {', '.join(map(str, shapes))} but {CONFIG} implies "
                         f"{want_hf}")
            continue
        plan.append((row.nf, parts, row.transpose))
    problems = ([f"shape mismatch: {'; '.join(wrong)}"] if wrong else []) + \
               ([f"missing tensors {missing}"] if missing else []) + \
               ([f"unexpected tensors {sorted(state)}"] if state else [])
    if problems:
        raise ValueError(f"{where} does not fit its {CONFIG} ({fam.model_type}): " + " | ".join(problems))
    return plan


def _concatenated_shape(shapes):
    """The shape of arrays of ``shapes`` concatenated along axis 0, or None where they do not concatenate."""
    if len(shapes) == 1:
        return shapes[0]
    if any(len(s) == 0 or s[1:] != shapes[0][1:] for s in shapes):
        return None
    return (sum(s[0] for s in shapes),) + shapes[0][1:]


def _assembled(parts, transpose):
    """One numformer tensor from its checkpoint tensors (``numformer_plan``): each read, transposed if asked,
    then concatenated along axis 0 (q, k, v into qkv_proj); C-contiguous."""
    arrays = [np.asarray(p) for p in parts]
    arrays = [a.T for a in arrays] if transpose else arrays
    return np.ascontiguousarray(arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0))


def _read_into(out, parts, transpose):
    """``out[...] = _assembled(parts, transpose)`` for ``StoredTensor`` parts, without a whole copy of any: each
    part read straight into its rows of ``out`` a piece at a time (``StoredTensor.read_into``); a transposed
    part (GPT-2's Conv1D weights) is read whole first."""
    if transpose:
        out[...] = _assembled(parts, transpose)
        return
    row = 0
    for part in parts:
        rows = part.shape[0] if part.ndim else 1
        part.read_into(out[row:row + rows] if part.ndim else out)
        row += rows


def to_hf_state(fam, config, nf_state):
    """{numformer name: array} -> {Hugging Face name: array}, the inverse of ``to_numformer_state``: every
    tensor of ``fam.tensors(config)`` (``nf_state`` must hold each one), ``qkv_proj`` split into q, k, v,
    GPT-2's Conv1D weights transposed to (in, out), no ``lm_head.weight`` for a tied model."""
    out = {}
    for row in fam.tensors(config):
        a = nf_state[row.nf]
        parts = np.split(a, np.cumsum(row.sizes)[:-1] if row.sizes else len(row.hf), axis=0)
        for name, part in zip(row.hf, parts):
            out[name] = np.ascontiguousarray(part.T if row.transpose else part)
    return out


# -- import -------------------------------------------------------------------------------------------
def load_tokenizer(folder, hf_config=None):
    """The folder's tokenizer (tokenizer.json, else vocab.json + merges.txt as GPT-2's byte-level BPE) as a
    ``PretrainedTokenizer``, or None when the folder has neither. Its end id is ``hf_config``'s eos_token_id
    (default: the id of ``<|endoftext|>``), its start id bos_token_id (default: the end id); a list of ids or
    an id outside the vocabulary gives None."""
    require(("tokenizers",), "reading a Hugging Face folder's tokenizer")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        path = folder / "tokenizer.json"
        check_bounds(path.read_bytes().decode("utf-8", "replace"), str(path))
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 -- the tokenizers library raises a bare Exception for a bad file
            raise ValueError(f"{path} is not a Hugging Face tokenizer ({' '.join(str(e).split())}); restore it "
                             f"(tokenizer.save_pretrained writes it)") from None
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        tok = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        if tok.token_to_id("<|endoftext|>") is not None:
            tok.add_special_tokens(["<|endoftext|>"])
    else:
        return None
    cfg = hf_config or {}
    files = side_files(folder)
    n = tok.get_vocab_size(with_added_tokens=True)
    fit = lambda i: i if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n else None     # noqa: E731
    eos = cfg.get("eos_token_id", tok.token_to_id("<|endoftext|>"))
    eos_ids = [i for i in (eos if isinstance(eos, list) else [eos]) if fit(i) is not None]
    if isinstance(eos, list):       # Llama 3 Instruct's three: the tokenizer's own eos_token, else the first
        named = _token_content(files.get("tokenizer_config.json", {}).get("eos_token"))
        eos = tok.token_to_id(named) if named is not None and tok.token_to_id(named) in eos_ids else \
            (eos_ids or [None])[0]
    bos = cfg.get("bos_token_id", eos)
    return PretrainedTokenizer(tok, fit(eos), fit(bos), eos_ids, files)


def _token_content(token):
    """The text of a special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) else None


def load_pretrained(source, dtype=np.float32, quantize=None, **overrides):
    """(GPT in eval mode, tokenizer or None) from a Hugging Face folder or hub id; weights checked name by name.

    The config is ``hf_model_config``'s (a stored lm_head.weight that differs from the embedding unties them);
    the tensors (safetensors, one file or shards; bfloat16, float16, float32 or float64) are cast to ``dtype``
    (default float32; the file's dtype is not kept). overrides: ``GPTConfig`` options that do not change the
    weights (``dropout``, ``attention``, ``gradient_checkpointing``); dropout is 0 unless given (set it to
    fine-tune with dropout, as nanoGPT). The tokenizer is ``load_tokenizer``'s. quantize: a
    ``numformer.quantize.LayerQuantizer``, which quantizes each linear layer as soon as its weights are read
    (the float model is never whole in memory; what it did is in ``quantize.report``).
    """
    folder = resolve_source(source)
    hf_config = read_hf_config(folder)
    config = hf_model_config(folder, hf_config)
    changed = sorted(set(overrides) - {"dropout", "attention", "gradient_checkpointing"})
    if changed:
        raise ValueError(f"{changed} would change the model of {source}; only dropout, attention and "
                         f"gradient_checkpointing may be set when loading it")
    stored = read_safetensors(folder, lazy=True)        # every header checked, no tensor read yet
    transposed = transposed_tensors(family(hf_config["model_type"]), config, stored)
    if quantize is None:                                # before anything is allocated
        check_memory(source, *memory_needed(stored, dtype, transposed=transposed))
    # every parameter is written by load_hf_weights (or it raises); until then its zeros take no memory (the
    # operating system maps a page when it is first written)
    with init.skipped():
        model = GPT(replace(config, **overrides), rng=np.random.default_rng(0), dtype=dtype)
    if quantize is not None:
        check_memory(source, *memory_needed(stored, dtype, quantize.start(model), transposed))
    load_hf_weights(model, folder, stored, written=None if quantize is None else quantize.written)
    if quantize is not None:
        quantize.finish()
    return model.eval(), load_tokenizer(folder, hf_config)


def memory_needed(stored, dtype, quantize=None, transposed=()):
    """(bytes, what they count) that loading the tensors ``stored`` (``StoredTensor``s: their shapes) into a
    model in ``dtype`` needs (``_platform.check_memory``): the model's weights, or its int8 model's with
    ``quantize`` (a started ``LayerQuantizer``: ``expected_bytes``, and the largest float layer it holds
    until that layer is quantized), and the reading's temporaries: a few pieces of the file for a tensor read
    straight into its parameter, twice the tensor for one read whole to be transposed (``transposed``: their
    names; GPT-2's Conv1D weights, ``transposed_tensors``)."""
    itemsize = np.dtype(dtype).itemsize
    n_weights = sum(math.prod(t.shape) for t in stored.values())
    reading = 2 * max((math.prod(stored[name].shape) for name in transposed), default=0) * itemsize
    reading += 4 * CHUNK_BYTES
    if quantize is None:
        return n_weights * itemsize + reading, f"{n_weights:,} weights in {np.dtype(dtype).name}"
    return (quantize.expected_bytes() + quantize.largest_layer_bytes() + reading,
            f"{n_weights:,} weights in {np.dtype(dtype).name}, linear layers in int8")


def folder_memory_needed(folder, dtype):
    """``memory_needed`` of loading the Hugging Face folder ``folder`` into a float model in ``dtype``: for a
    caller that checks before it builds the model (``interop.sources.check_load_memory``)."""
    hf_config = read_hf_config(folder)
    stored = read_safetensors(folder, lazy=True)
    transposed = transposed_tensors(family(hf_config["model_type"]), hf_model_config(folder, hf_config), stored)
    return memory_needed(stored, dtype, transposed=transposed)


def transposed_tensors(fam, config, stored):
    """The names of the tensors of ``stored`` that the family stores transposed (read whole, then transposed)."""
    return [name for row in fam.tensors(config) if row.transpose for name in row.hf if name in stored]


def load_hf_weights(model, folder, stored=None, written=None):
    """Copy the weights of a Hugging Face folder into ``model`` (a GPT of its config, ``hf_model_config``), name
    by name (``to_numformer_state``'s checks, all made before any tensor is read), cast to the model's dtype.
    The tensors are read one numformer tensor at a time, straight into the parameters: loading needs about the
    model's own memory, not twice it. ``stored``: the folder's ``read_safetensors(folder, lazy=True)``, when
    already read; ``written(name)``: called once parameter ``name`` holds its weights (no reference to it is
    kept after: ``LayerQuantizer.written`` may release it). Returns the model."""
    fam = family(read_hf_config(folder)["model_type"])
    params = dict(model.named_parameters())
    plan = numformer_plan(fam, model.config, read_safetensors(folder, lazy=True) if stored is None else stored,
                          {n: p.shape for n, p in params.items()}, f"{folder}/{WEIGHTS}")
    missing = sorted(set(params) - {nf for nf, _, _ in plan})
    if missing:
        raise ValueError(f"{folder}/{WEIGHTS} does not fit its {CONFIG} ({fam.model_type}): the model's "
                         f"{missing} have no checkpoint tensors")
    for nf, parts, transpose in plan:
        _read_into(params.pop(nf).data, parts, transpose)
        if written is not None:
            written(nf)
    return model


# -- export --------------------------------------------------------------------------------------------
def _full_state(fam, model):
    """Every tensor the family writes, numformer names: a model without biases gets zero biases, and
    sinusoidal positions their fixed table (both give the same outputs in the Hugging Face model)."""
    params = dict(model.named_parameters())
    out = {}
    for row in fam.tensors(model.config):
        name = row.nf
        if name in params:
            out[name] = params[name].data
        elif name == "pos_emb.weight":
            out[name] = np.asarray(model.pos_emb.table, dtype=model.dtype)
        elif name.endswith(".bias") and name[:-5] + ".weight" in params:
            w = params[name[:-5] + ".weight"].data
            out[name] = np.zeros(w.shape[:1], dtype=w.dtype)
        else:
            raise ValueError(f"the model has no parameter {name} to export")
    return out


def export_types(config):
    """The model_types (keys of ``FAMILIES``, in its order) whose family can express the ``GPTConfig``
    ``config``: the ``model_type`` values ``export_hf`` accepts for such a model (none for a model no family
    expresses, such as a post-LN GPT with RoPE)."""
    types = []
    if _no_family_expresses(config):
        return types
    for model_type, fam in FAMILIES.items():
        try:
            fam.to_hf(config)
        except ValueError:
            continue
        types.append(model_type)
    return types


def _no_family_expresses(config):
    """What no family numformer writes can express, in words (a block without a feed-forward), or None."""
    if any(not b.feed_forward for b in config.layers):
        return ("feed_forward = false (attention-only blocks): every Hugging Face family numformer writes has a "
                "feed-forward in each block")
    return None


def hf_export_config(config, model_type):
    """The config.json of the ``GPTConfig`` ``config`` as the family ``model_type``: one ValueError naming what
    the family cannot express (first what none can, ``_no_family_expresses``) and the model_types this model
    can be exported as (``export_types``)."""
    fam = family(model_type)
    what = _no_family_expresses(config)
    if what:
        raise ValueError(f"no Hugging Face family can express {what}; this model cannot be exported")
    try:
        return fam.to_hf(config)
    except ValueError as e:
        types = export_types(config)
        others = (f"it can be exported as model_type {_one_of(types)}" if types else
                  f"no family numformer writes ({', '.join(FAMILIES)}) can express this model")
        raise ValueError(f"{e}; {others}") from None


def _one_of(names):
    """'a', 'a or b', 'a, b or c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _write_side_files(out, tokenizer, model_type, block_size):
    """The tokenizer's files beside tokenizer.json: those of the Hugging Face model it came from
    (``PretrainedTokenizer.files``: its tokenizer_config.json, chat template, generation_config.json ..., the
    names ``pretrained.is_side_file`` allows) as they were, and a tokenizer_config.json of GPT-2's kind (the end
    token as bos, eos and unk) when they have none."""
    files = getattr(tokenizer, "files", {})
    for name, content in files.items():
        (out / name).parent.mkdir(exist_ok=True)
        if isinstance(content, str):
            write_atomic(out / name, content.encode("utf-8"))
        else:
            write_json_atomic(out / name, content)
    if "tokenizer_config.json" not in files:
        eos = getattr(tokenizer, "eos_id", None)
        eos_tok = None if eos is None else tokenizer.token(eos)
        gpt2_tokenizer = model_type == "gpt2" and isinstance(tokenizer, PretrainedTokenizer)
        write_json_atomic(out / "tokenizer_config.json",
                          {"tokenizer_class": "GPT2Tokenizer" if gpt2_tokenizer else "PreTrainedTokenizerFast",
                           "model_max_length": block_size, "add_prefix_space": False,
                           "bos_token": eos_tok, "eos_token": eos_tok, "unk_token": eos_tok})


def export_hf(model, out_dir, tokenizer=None, model_type=None):
    """Write ``model`` as a Hugging Face folder: config.json, model.safetensors (and tokenizer.json with the
    files beside it, ``_write_side_files``, for a tokenizer with a Hugging Face form), which transformers'
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads. ``model_type``: a key of ``FAMILIES`` (gpt2,
    llama, mistral, qwen2, qwen3, gemma2, gemma3_text); by default ``default_export_type`` (gpt2 for a position
    table; for a RoPE model gemma3_text or gemma2 with Gemma's 1 + w norms, qwen3 with q/k norms, qwen2 with
    q/k/v-only biases or windows on some layers, mistral with one window for every layer, else llama). Raises
    ValueError naming a feature the family cannot express and the model_types that can (``export_types``), or
    for a model with LoRA adapters (merge them first); TypeError for a tokenizer whose ``files`` names a file
    that is no side file (``check_side_files``), before anything is written: it writes no other files than
    these (``numformer.commands.export.EXPORT_FILES``, additional chat templates in their folder).

    The weights go into one model.safetensors in the model's dtype (config.json's ``dtype`` says which); a
    tied output layer is written once, as the embedding (``tie_word_embeddings`` true, no lm_head.weight);
    biases the family stores but the model lacks are written as zeros, a sinusoidal position table as its
    fixed values. config.json's bos/eos ids are the tokenizer's (null without one; every eos id of a model
    that has several, as Llama 3 Instruct).

    numformer's ``generate`` continues past the model's context (block_size) by dropping the oldest half of
    its full window; transformers' does not (GPT-2 raises an IndexError past n_positions, a RoPE model
    keeps attending to every earlier token at positions beyond max_position_embeddings), so generations
    agree up to block_size tokens only: one warning line on stderr says so, and config.json records it
    (``numformer_context``). Returns the folder."""
    config = model.config
    if getattr(model, "lora_config", None):          # the base weights alone would drop the adapters silently
        raise ValueError("the model has LoRA adapters: merge them first (numformer.lora.merge_lora), or write the "
                         "adapter with numformer.interop.peft.save_adapter and the base model without it")
    if model_type is None:
        model_type = default_export_type(config)
    fam = family(model_type)
    hf_config = hf_export_config(config, model_type)
    hf_config["dtype"] = str(model.dtype)
    n = config.block_size
    beyond = ("raises an IndexError" if model_type == "gpt2" else
              "keeps every earlier token, at positions the model was not trained on")
    note = (f"numformer generates past the context of {n} tokens by dropping the oldest half of its full window "
            f"(positions counted again from 0); "
            f"transformers' generate {beyond} past {n} tokens: the two agree on sequences of up to {n} tokens")
    hf_config["numformer_context"] = {"block_size": n, "note": note}
    tensors = to_hf_state(fam, config, _full_state(fam, model))
    hf_json = tokenizer.to_hf_json() if hasattr(tokenizer, "to_hf_json") else None   # a Hugging Face form
    if hf_json is not None:             # the side files' names become paths: only theirs, before anything is written
        check_side_files(getattr(tokenizer, "files", {}))
    eos, eos_ids = getattr(tokenizer, "eos_id", None), getattr(tokenizer, "eos_ids", [])
    hf_config.update(bos_token_id=getattr(tokenizer, "bos_id", None),
                     eos_token_id=eos_ids if len(eos_ids) > 1 else eos, pad_token_id=hf_config.get("pad_token_id"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / CONFIG, hf_config)
    write_atomic(out / WEIGHTS, safetensors_pieces(tensors, {"format": "pt"}))
    if hf_json is not None:
        write_atomic(out / TOKENIZER, hf_json.encode())
        _write_side_files(out, tokenizer, model_type, config.block_size)
    print(f"warning: {out}: {note}", file=sys.stderr)
    return out
