"""Hugging Face checkpoints in and out: GPT-2 folders and hub ids to numformer's ``GPT``, and back.

    model, tokenizer = load_pretrained("gpt2")          # hub id, or a folder with config.json + model.safetensors
    model = GPT.from_pretrained("path/to/gpt2")         # the same, model only
    export_hf(model, "out_dir", tokenizer)              # config.json + model.safetensors (+ tokenizer.json)

A model family is a set of options of the existing ``GPT`` (``positional``,
``activation``, ``norm`` ...), not a model of its own. ``FAMILIES`` maps a
Hugging Face ``model_type`` to a ``Family``: how its config.json becomes
numformer's model config (and back), and a table of ``TensorMap`` rows that
pair each numformer parameter with the Hugging Face tensor(s) holding it. The
importer maps names and shapes and nothing else, so a family is added by
writing one ``Family`` (see ``GPT2``).

Llama (``model_type = "llama"``: LlamaForCausalLM, e.g. SmolLM, TinyLlama, Llama 2; also "mistral"
when its sliding window covers the context) is ``GPT(positional="rope", activation="swiglu", norm="rms",
n_kv_heads=num_key_value_heads, bias=attention_bias)``; q_proj, k_proj and v_proj are stacked into
``qkv_proj``. RoPE scaling and sliding windows are refused with one line naming them.

GPT-2 (``model_type = "gpt2"``: gpt2, gpt2-medium, -large, -xl, distilgpt2) is
``GPT(positional="learned", activation="gelu_tanh", norm_first=True, bias=True,
tie_weights=True)``. Its ``Conv1D`` layers store ``W`` as (in, out), so those
weights are transposed into numformer's (out, in) ``Linear`` layout.

Weights are read from safetensors only (``model.safetensors`` or the shards of
``model.safetensors.index.json``); a pickle file (``pytorch_model.bin``) is
never loaded, because loading one can run arbitrary code. A hub id is fetched
with ``huggingface_hub`` (the ``numformer[hf]`` extra) into its usual cache
(``~/.cache/huggingface/hub``, or ``$HF_HOME``); a copy already there is used
without the network.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .safetensors_reader import read_safetensors_file, shard_files

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
HUB_FILES = [CONFIG, WEIGHTS, WEIGHTS_INDEX, "model-*.safetensors", "generation_config.json", *TOKENIZER_FILES]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# -- the family table -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorMap:
    """numformer parameter ``nf`` <- Hugging Face tensor(s) ``hf``.

    transpose: the Hugging Face tensor is stored (in, out) (GPT-2's Conv1D); several ``hf``
    tensors are concatenated along axis 0 in order (e.g. separate q, k, v projections into
    numformer's fused ``qkv_proj``), and split back on export at ``sizes`` (rows of each part;
    equal parts when empty).
    """

    nf: str
    hf: tuple
    transpose: bool = False
    sizes: tuple = ()


@dataclass(frozen=True)
class Family:
    """How one Hugging Face ``model_type`` maps onto numformer.

    to_numformer(hf_config) -> numformer model config (``{"type": "gpt", ...}``); raises ValueError for
                               an option numformer cannot reproduce.
    to_hf(model_config)     -> config.json dict; raises ValueError naming a feature the family lacks.
    tensors(model_config)   -> [TensorMap, ...] covering every numformer parameter.
    canonical(name)         -> a checkpoint tensor name as ``tensors`` spells it (prefix variants).
    ignored:                 regex of checkpoint tensors that are buffers, not weights.
    """

    model_type: str
    to_numformer: Callable
    to_hf: Callable
    tensors: Callable
    canonical: Callable = lambda name: name
    ignored: str = r"(?!)"


# GPT-2 ------------------------------------------------------------------------------------------------
_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                     "gelu": "gelu", "relu": "relu"}
_NF_TO_GPT2_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def _gpt2_to_numformer(c):
    refused = [(c.get("scale_attn_by_inverse_layer_idx"), "scale_attn_by_inverse_layer_idx = true (attention "
                                                          "scores divided by the layer index)"),
               (c.get("scale_attn_weights", True) is False, "scale_attn_weights = false (unscaled attention)"),
               (c.get("add_cross_attention"), "add_cross_attention = true (a GPT-2 decoder with cross-attention)")]
    for bad, what in refused:
        if bad:
            raise ValueError(f"this GPT-2 checkpoint uses {what}, which numformer's GPT does not have")
    act = c.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        raise ValueError(f"GPT-2 activation_function {act!r} is not supported; numformer has "
                         f"{sorted(_GPT2_ACTIVATIONS)}")
    return {"type": "gpt", "vocab_size": c["vocab_size"], "block_size": c.get("n_positions", 1024),
            "n_layers": c["n_layer"], "n_heads": c["n_head"], "d_model": c["n_embd"],
            "d_ff": c.get("n_inner") or 4 * c["n_embd"], "dropout": 0.0, "positional": "learned",
            "activation": _GPT2_ACTIVATIONS[act], "norm_first": True, "norm": "layer",
            "tie_weights": c.get("tie_word_embeddings", True), "bias": True,
            "layer_norm_eps": c.get("layer_norm_epsilon", 1e-5)}


def _gpt2_to_hf(m):
    checks = [(m.get("type") == "gpt", f"a {m.get('type')!r} model (GPT-2 is a decoder-only GPT)"),
              (m.get("norm_first", True), "post-LN blocks (norm_first = false; GPT-2 is pre-LN with a final norm)"),
              (m.get("norm", "layer") == "layer", f"norm = {m.get('norm')!r} (GPT-2 uses LayerNorm)"),
              (m.get("positional") in ("learned", "sinusoidal"),
               f"positional = {m.get('positional')!r} (GPT-2 has a position table)"),
              (m.get("activation") in _NF_TO_GPT2_ACTIVATION, f"activation = {m.get('activation')!r}"),
              (m.get("n_kv_heads") in (None, m.get("n_heads")), "grouped-query attention (n_kv_heads)")]
    for ok, what in checks:
        if not ok:
            raise ValueError(f"GPT-2 cannot express {what}; this model cannot be exported to the gpt2 format")
    p = m.get("dropout", 0.0)
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": m["vocab_size"],
            "n_positions": m["block_size"], "n_embd": m["d_model"], "n_layer": m["n_layers"], "n_head": m["n_heads"],
            "n_inner": m["d_ff"], "activation_function": _NF_TO_GPT2_ACTIVATION[m["activation"]],
            "layer_norm_epsilon": m["layer_norm_eps"], "tie_word_embeddings": m["tie_weights"],
            "resid_pdrop": p, "embd_pdrop": p, "attn_pdrop": p, "initializer_range": 0.02,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "use_cache": True}


def _gpt2_tensors(m):
    rows = [TensorMap("tok_emb.weight", ("transformer.wte.weight",)),
            TensorMap("pos_emb.weight", ("transformer.wpe.weight",))]
    for i in range(m["n_layers"]):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        for nf, hf, t in (("norm1", "ln_1", False), ("self_attn.qkv_proj", "attn.c_attn", True),
                          ("self_attn.out_proj", "attn.c_proj", True), ("norm2", "ln_2", False),
                          ("ff.linear1", "mlp.c_fc", True), ("ff.linear2", "mlp.c_proj", True)):
            rows += [TensorMap(b + nf + ".weight", (h + hf + ".weight",), t), TensorMap(b + nf + ".bias", (h + hf + ".bias",))]
    rows += [TensorMap("norm_f.weight", ("transformer.ln_f.weight",)),
             TensorMap("norm_f.bias", ("transformer.ln_f.bias",))]
    if not m["tie_weights"]:
        rows.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    return rows


def _gpt2_canonical(name):
    """Checkpoints saved from ``GPT2Model`` (the original gpt2 files) have no ``transformer.`` prefix."""
    return name if name.startswith(("transformer.", "lm_head.")) else "transformer." + name


GPT2 = Family("gpt2", _gpt2_to_numformer, _gpt2_to_hf, _gpt2_tensors, _gpt2_canonical,
              ignored=r"^transformer\.h\.\d+\.attn\.(masked_)?bias$")

# Llama -----------------------------------------------------------------------------------------------
# LlamaForCausalLM (Llama 1-3 without RoPE scaling, SmolLM, TinyLlama, ...) is GPT(positional="rope",
# activation="swiglu", norm="rms", norm_first=True, n_kv_heads=num_key_value_heads, bias=attention_bias). Its
# q_proj and k_proj rows are already in the half-split layout of rotate_half (numformer's RoPE), so the
# separate q, k, v projections are only stacked into qkv_proj. Mistral's config (model_type "mistral") is
# the same network plus a sliding attention window; it is read when the window covers the whole context.

def _llama_rope(c):
    """(rope_theta, rope type) from config.json: ``rope_parameters`` (transformers >= 5), else the older
    top-level ``rope_theta`` and ``rope_scaling``."""
    params = c.get("rope_parameters") or {}
    scaling = c.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return float(params.get("rope_theta", c.get("rope_theta", 10000.0))), kind


def _llama_to_numformer(c):
    heads, d = c["num_attention_heads"], c["hidden_size"]
    theta, kind = _llama_rope(c)
    window = c.get("sliding_window")
    refused = [(kind != "default", f"rope scaling of type {kind!r} (numformer's RoPE is the plain one; "
                                   f"rope_type 'default')"),
               (window is not None and window < c.get("max_position_embeddings", 0),
                f"a sliding attention window of {window} positions (numformer attends to the whole context)"),
               (c.get("hidden_act", "silu") != "silu", f"hidden_act = {c.get('hidden_act')!r} (SwiGLU uses silu)"),
               (c.get("head_dim") not in (None, d // heads), f"head_dim = {c.get('head_dim')} != hidden_size / "
                                                             f"num_attention_heads = {d // heads}"),
               (bool(c.get("attention_bias", False)) != bool(c.get("mlp_bias", False)),
                "attention_bias != mlp_bias (numformer's bias option covers both)")]
    for bad, what in refused:
        if bad:
            raise ValueError(f"this {c.get('model_type', 'llama')} checkpoint uses {what}, which numformer's GPT "
                             f"does not have")
    return {"type": "gpt", "vocab_size": c["vocab_size"], "block_size": c.get("max_position_embeddings", 2048),
            "n_layers": c["num_hidden_layers"], "n_heads": heads, "n_kv_heads": c.get("num_key_value_heads") or heads,
            "d_model": d, "d_ff": c["intermediate_size"], "dropout": 0.0, "positional": "rope", "rope_theta": theta,
            "activation": "swiglu", "norm_first": True, "norm": "rms", "layer_norm_eps": c.get("rms_norm_eps", 1e-6),
            "tie_weights": bool(c.get("tie_word_embeddings", False)), "bias": bool(c.get("attention_bias", False))}


def _llama_to_hf(m):
    checks = [(m.get("type") == "gpt", f"a {m.get('type')!r} model (Llama is a decoder-only GPT)"),
              (m.get("norm_first", True), "post-norm blocks (norm_first = false; Llama is pre-norm)"),
              (m.get("norm") == "rms", f"norm = {m.get('norm')!r} (Llama uses RMSNorm: norm = 'rms')"),
              (m.get("positional") == "rope", f"positional = {m.get('positional')!r} (Llama uses 'rope')"),
              (m.get("activation") == "swiglu", f"activation = {m.get('activation')!r} (Llama uses 'swiglu')")]
    for ok, what in checks:
        if not ok:
            raise ValueError(f"Llama cannot express {what}; this model cannot be exported to the llama format")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": m["vocab_size"],
            "hidden_size": m["d_model"], "intermediate_size": m["d_ff"], "num_hidden_layers": m["n_layers"],
            "num_attention_heads": m["n_heads"], "num_key_value_heads": m.get("n_kv_heads") or m["n_heads"],
            "head_dim": m["d_model"] // m["n_heads"], "hidden_act": "silu",
            "max_position_embeddings": m["block_size"], "rms_norm_eps": m["layer_norm_eps"],
            "rope_parameters": {"rope_type": "default", "rope_theta": m.get("rope_theta", 10000.0)},
            "rope_theta": m.get("rope_theta", 10000.0), "attention_bias": m["bias"], "mlp_bias": m["bias"],
            "tie_word_embeddings": m["tie_weights"], "attention_dropout": 0.0, "pretraining_tp": 1,
            "initializer_range": 0.02, "use_cache": True}


def _llama_tensors(m):
    dh = m["d_model"] // m["n_heads"]
    kv = (m.get("n_kv_heads") or m["n_heads"]) * dh
    names = (("weight", "bias") if m["bias"] else ("weight",))
    rows = [TensorMap("tok_emb.weight", ("model.embed_tokens.weight",))]
    for i in range(m["n_layers"]):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        for t in names:
            rows.append(TensorMap(f"{b}self_attn.qkv_proj.{t}", tuple(f"{h}self_attn.{p}_proj.{t}" for p in "qkv"),
                                  sizes=(m["d_model"], kv, kv)))
            rows += [TensorMap(f"{b}{nf}.{t}", (f"{h}{hf}.{t}",))
                     for nf, hf in (("self_attn.out_proj", "self_attn.o_proj"), ("ff.gate_proj", "mlp.gate_proj"),
                                    ("ff.up_proj", "mlp.up_proj"), ("ff.down_proj", "mlp.down_proj"))]
        rows += [TensorMap(b + "norm1.weight", (h + "input_layernorm.weight",)),
                 TensorMap(b + "norm2.weight", (h + "post_attention_layernorm.weight",))]
    rows.append(TensorMap("norm_f.weight", ("model.norm.weight",)))
    if not m["tie_weights"]:
        rows.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    return rows


def _llama_canonical(name):
    """Checkpoints saved from ``LlamaModel`` (no head) have no ``model.`` prefix."""
    return name if name.startswith(("model.", "lm_head.")) else "model." + name


LLAMA = Family("llama", _llama_to_numformer, _llama_to_hf, _llama_tensors, _llama_canonical,
               ignored=r"\.rotary_emb\.inv_freq$")
MISTRAL = Family("mistral", _llama_to_numformer,
                 lambda m: {**_llama_to_hf(m), "model_type": "mistral", "architectures": ["MistralForCausalLM"],
                            "sliding_window": None}, _llama_tensors, _llama_canonical,
                 ignored=r"\.rotary_emb\.inv_freq$")

FAMILIES = {"gpt2": GPT2, "llama": LLAMA, "mistral": MISTRAL}


def family(model_type):
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported; numformer imports {sorted(FAMILIES)}")
    return FAMILIES[model_type]


# -- finding the files ---------------------------------------------------------------------------------
def _hub_download(repo_id):
    """A local snapshot folder of ``repo_id`` (config, safetensors, tokenizer files), from the cache if there."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"{repo_id!r} is not a folder, and fetching it from the Hugging Face hub needs "
                         f"huggingface_hub: pip install 'numformer[hf]' (or pass a local folder)") from None
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True)
    except Exception:       # not (completely) in the cache: download
        pass
    try:
        return snapshot_download(repo_id, allow_patterns=HUB_FILES)
    except Exception as e:
        raise ValueError(
            f"cannot fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}; offline?). On a machine with "
            f"internet run `hf download {repo_id} {CONFIG} {WEIGHTS} tokenizer.json` (it fills the cache in "
            f"~/.cache/huggingface/hub, which numformer then uses offline), or download those files into a folder "
            f"and pass the folder") from None


def resolve_source(source):
    """A folder path for ``source``: an existing folder, or a hub id (``gpt2``, ``openai-community/gpt2``,
    also written ``hf:gpt2``) fetched into the Hugging Face cache."""
    text = str(source)
    hub = text[3:] if text.startswith("hf:") else None
    if hub is None and Path(text).is_dir():
        return Path(text)
    hub = text if hub is None else hub
    if not _HUB_ID.match(hub) or Path(text).exists():
        raise ValueError(f"{text!r} is neither a folder nor a Hugging Face hub id (such as gpt2 or "
                         f"openai-community/gpt2)")
    return Path(_hub_download(hub))


def read_hf_config(folder):
    folder = Path(folder)
    path = folder / CONFIG
    if not path.is_file():
        raise ValueError(f"{folder} has no {CONFIG}: a Hugging Face model folder holds {CONFIG} and {WEIGHTS} "
                         f"(write one with model.save_pretrained(folder))")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if "model_type" not in config:
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


def read_safetensors(folder):
    """{tensor name: array} of every weight file of a folder, as stored (bfloat16 as float32), each file
    checked in full by ``safetensors_reader`` before it is read; with shards, every tensor must be in the
    shard the index names, and in one shard only."""
    folder = Path(folder)
    weight_map, files = _weight_files(folder)
    tensors, where = {}, {}
    for path in files:
        if not path.is_file():
            raise ValueError(f"{path} is listed in {WEIGHTS_INDEX} but missing; download it again")
        for name, array in read_safetensors_file(path).items():
            if name in tensors:
                raise ValueError(f"{path} holds tensor {name!r}, which {where[name]} also holds; download the "
                                 f"shards again")
            if weight_map is not None and weight_map.get(name) != path.name:
                raise ValueError(f"{path} holds tensor {name!r}, but {WEIGHTS_INDEX} places it in "
                                 f"{weight_map.get(name)!r}; download the shards again")
            tensors[name], where[name] = array, path.name
    if weight_map is not None and set(weight_map) - set(tensors):
        raise ValueError(f"{folder / WEIGHTS_INDEX} lists tensors no shard holds: "
                         f"{sorted(set(weight_map) - set(tensors))[:5]}; download the shards again")
    return tensors


# -- names and shapes -------------------------------------------------------------------------------
def to_numformer_state(fam, model_config, hf_state, expected, where="checkpoint"):
    """Checkpoint tensors (Hugging Face names) -> {numformer name: array}, checking every name and shape.

    expected: {numformer name: shape}. Raises one ValueError naming missing, unexpected or misshapen tensors.
    """
    state = {fam.canonical(k): v for k, v in hf_state.items() if not re.search(fam.ignored, fam.canonical(k))}
    out, missing, wrong = {}, [], []
    for row in fam.tensors(model_config):
        parts = []
        for name in row.hf:
            if name not in state:
                missing.append(name)
                continue
            a = state.pop(name)
            parts.append(a.T if row.transpose else a)
        if len(parts) != len(row.hf):
            continue
        a = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        if a.shape != tuple(expected[row.nf]):
            shapes = [tuple(p.T.shape if row.transpose else p.shape) for p in parts]
            want = tuple(expected[row.nf])
            want_hf = want[::-1] if row.transpose and len(parts) == 1 else want
            wrong.append(f"{', '.join(row.hf)} has shape {', '.join(map(str, shapes))} but {CONFIG} implies "
                         f"{want_hf}")
            continue
        out[row.nf] = np.ascontiguousarray(a)
    problems = ([f"shape mismatch: {'; '.join(wrong)}"] if wrong else []) + \
               ([f"missing tensors {missing}"] if missing else []) + \
               ([f"unexpected tensors {sorted(state)}"] if state else [])
    if problems:
        raise ValueError(f"{where} does not fit its {CONFIG} ({fam.model_type}): " + " | ".join(problems))
    return out


def to_hf_state(fam, model_config, nf_state):
    """{numformer name: array} -> {Hugging Face name: array}, the inverse of ``to_numformer_state``."""
    out = {}
    for row in fam.tensors(model_config):
        a = nf_state[row.nf]
        parts = np.split(a, np.cumsum(row.sizes)[:-1] if row.sizes else len(row.hf), axis=0)
        for name, part in zip(row.hf, parts):
            out[name] = np.ascontiguousarray(part.T if row.transpose else part)
    return out


# -- import -------------------------------------------------------------------------------------------
def load_tokenizer(folder, hf_config=None):
    """The folder's tokenizer (tokenizer.json, else vocab.json + merges.txt as GPT-2's byte-level BPE) as a
    ``PretrainedTokenizer``, or None when the folder has neither."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    from ..data.tokenizers import PretrainedTokenizer

    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
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
    eos = cfg.get("eos_token_id", tok.token_to_id("<|endoftext|>"))
    bos = cfg.get("bos_token_id", eos)
    n = tok.get_vocab_size(with_added_tokens=True)
    fit = lambda i: i if isinstance(i, int) and 0 <= i < n else None     # noqa: E731
    return PretrainedTokenizer(tok, fit(eos), fit(bos))


def load_pretrained(source, dtype=np.float32, **overrides):
    """(GPT, tokenizer or None) from a Hugging Face folder or hub id; weights checked name by name.

    overrides: numformer model options that do not change the weights' shapes (``dropout``,
    ``attention``, ``gradient_checkpointing``); dropout is 0 unless given (set it to fine-tune
    with dropout, as nanoGPT).
    """
    from ..models import build_model

    folder = resolve_source(source)
    hf_config = read_hf_config(folder)
    model_config = {**family(hf_config["model_type"]).to_numformer(hf_config), **overrides}
    model = build_model(model_config, rng=np.random.default_rng(0), dtype=dtype)
    load_init_weights(model, folder)
    return model.eval(), load_tokenizer(folder, hf_config)


def model_config_of(model):
    """The numformer config of a built ``GPT`` (what ``build_model`` needs to make it again)."""
    from ..nn.positional import SinusoidalPositionalEncoding

    block = model.blocks[0]
    positional = getattr(model, "positional", None) or (
        "sinusoidal" if isinstance(model.pos_emb, SinusoidalPositionalEncoding) else "learned")
    return {"type": "gpt", "vocab_size": model.vocab_size, "block_size": model.block_size,
            "n_layers": model.n_layers, "n_heads": model.n_heads, "d_model": model.d_model, "d_ff": model.d_ff,
            "dropout": model.drop.p, "activation": block.activation, "norm_first": block.norm_first,
            "norm": block.norm_kind, "tie_weights": model.tie_weights,
            "bias": block.self_attn.out_proj.bias is not None,
            "layer_norm_eps": getattr(block.norm1, "eps", 1e-5), "positional": positional,
            **({"rope_theta": model.rope_theta} if positional == "rope" else {}),
            **({"n_kv_heads": model.n_kv_heads} if getattr(model, "n_kv_heads", None) else {})}


# -- fine-tuning: [model] init_from = "RUN_DIR | Hugging Face folder | hub id" -----------------------------
FINE_TUNING_OPTIONS = ("dropout", "attention", "gradient_checkpointing")   # may differ from the source model


def is_run_folder(source):
    """Whether ``source`` is a numformer run folder (its config.json has a [model] section)."""
    path = Path(str(source)) / "config.json"
    if not path.is_file():
        return False
    try:
        return "model" in json.loads(path.read_text())
    except json.JSONDecodeError:
        return False


def pretrained_source(source):
    """(numformer model config, tokenizer state or None) of a numformer run folder, a Hugging Face
    folder or a hub id; reads configs and tokenizers only, not the weights."""
    if is_run_folder(source):
        from ..train.run import load_config_json, load_tokenizer_state

        model = {k: v for k, v in load_config_json(source)["model"].items() if v is not None and k != "init_from"}
        return model, load_tokenizer_state(source)
    folder = resolve_source(source)
    hf_config = read_hf_config(folder)
    tokenizer = load_tokenizer(folder, hf_config)
    return family(hf_config["model_type"]).to_numformer(hf_config), None if tokenizer is None else tokenizer.to_dict()


def merge_init_from(source, model, source_model, from_data):
    """The [model] section of a run fine-tuned from ``source``: the source's architecture, with the
    ``FINE_TUNING_OPTIONS`` the user set; the data must fit it (vocabulary, context length)."""
    changed = sorted(k for k, v in model.items() if k not in FINE_TUNING_OPTIONS and k != "type"
                     and source_model.get(k) != v)
    if changed:
        raise ValueError(f"[model] {changed} differ from the init_from model {source!r} "
                         f"({ {k: source_model.get(k) for k in changed} }); a fine-tuned model keeps its "
                         f"architecture: remove them (only {list(FINE_TUNING_OPTIONS)} may change)")
    if model.get("type", source_model["type"]) != source_model["type"]:
        raise ValueError(f"[model] type = {model['type']!r} but init_from {source!r} is a {source_model['type']!r}")
    for key, what in (("vocab_size", "the tokenizer's vocabulary"), ("block_size", "[data] block_size")):
        if key in from_data and from_data[key] > source_model.get(key, from_data[key]):
            raise ValueError(f"{what} ({from_data[key]}) exceeds the {key} of the init_from model {source!r} "
                             f"({source_model[key]}); " + ("use the model's own tokenizer" if key == "vocab_size"
                                                            else f"set [data] block_size <= {source_model[key]}"))
    return {**{k: v for k, v in source_model.items() if k != "type"}, **model}


def load_init_weights(model, source):
    """Copy the weights of ``source`` (run folder, Hugging Face folder or hub id) into ``model``."""
    if is_run_folder(source):
        from ..train.checkpoint import CHECKPOINT, MODEL, load_model_weights

        for name in (MODEL, CHECKPOINT):
            if (Path(source) / name).is_file():
                load_model_weights(Path(source) / name, model)
                return model
        raise ValueError(f"init_from {source!r} has no saved weights ({MODEL} or {CHECKPOINT})")
    folder = resolve_source(source)
    fam = family(read_hf_config(folder)["model_type"])
    expected = {n: p.shape for n, p in model.named_parameters()}
    model.load_state_dict(to_numformer_state(fam, model_config_of(model), read_safetensors(folder), expected,
                                             f"{folder}/{WEIGHTS}"))
    return model


# -- export --------------------------------------------------------------------------------------------
def _full_state(fam, model, model_config):
    """Every tensor the family writes, numformer names: a model without biases gets zero biases, and
    sinusoidal positions their fixed table (both give the same outputs in the Hugging Face model)."""
    params = dict(model.named_parameters())
    out = {}
    for row in fam.tensors(model_config):
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


def export_hf(model, out_dir, tokenizer=None, model_type=None):
    """Write ``model`` as a Hugging Face folder: config.json, model.safetensors (and tokenizer.json for a
    tokenizer with a Hugging Face form). ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)``
    loads it. ``model_type``: "gpt2" or "llama"; by default "llama" for a RoPE model, else "gpt2".
    Raises ValueError naming a feature the family cannot express. Returns the folder."""
    from safetensors.numpy import save

    from ..train.checkpoint import write_atomic, write_json_atomic

    model_config = model_config_of(model)
    if model_type is None:
        model_type = "llama" if model_config["positional"] == "rope" else "gpt2"
    fam = family(model_type)
    hf_config = fam.to_hf(model_config)
    hf_config["dtype"] = str(model.dtype)
    tensors = to_hf_state(fam, model_config, _full_state(fam, model, model_config))
    hf_tok = getattr(tokenizer, "hf", None) if type(tokenizer).__name__ == "PretrainedTokenizer" else None
    eos = getattr(tokenizer, "eos_id", None)
    hf_config.update(bos_token_id=getattr(tokenizer, "bos_id", None), eos_token_id=eos, pad_token_id=None)
    out = Path(out_dir)
    write_json_atomic(out / CONFIG, hf_config)
    write_atomic(out / WEIGHTS, save(tensors, metadata={"format": "pt"}))
    if hf_tok is not None:
        write_atomic(out / "tokenizer.json", hf_tok.to_str().encode())
        eos_tok = None if eos is None else hf_tok.id_to_token(eos)
        write_json_atomic(out / "tokenizer_config.json",
                          {"tokenizer_class": "GPT2Tokenizer" if model_type == "gpt2" else "PreTrainedTokenizerFast",
                           "model_max_length": model_config["block_size"], "add_prefix_space": False,
                           "bos_token": eos_tok, "eos_token": eos_tok, "unk_token": eos_tok})
    return out
