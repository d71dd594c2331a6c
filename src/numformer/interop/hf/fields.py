"""The Hugging Face model families numformer reads and writes, as data: per ``model_type`` a table of every
config.json field transformers reads for the model, and a table of its tensors.

One rule for every field. ``FIELDS[model_type]`` lists the fields of transformers' config class (its
``__init__`` / dataclass fields) and the keyword arguments it consumes (``rope_scaling``, ``rope_theta``,
``partial_rotary_factor``), plus the keys the modeling file reads with ``getattr``. Each ``Field`` has
transformers' default (used when the key is absent, or null where transformers' ``__post_init__`` fills
it) and either maps onto numformer's ``GPT`` options or is refused with one line naming the field and
its value (``refuse``). Keys in no table are ignored, as transformers' model ignores them.
``tests/test_hf_fields.py`` fails when transformers' config class gains a field missing here.

A family is a set of options of the existing ``GPT``, not a model of its own:

    gpt2     GPT(positional="learned", activation="gelu_tanh", norm="layer", bias=True, tie_weights=True)
    llama    GPT(positional="rope", activation="swiglu", norm="rms", n_kv_heads=num_key_value_heads,
                 attn_bias=attention_bias, bias=mlp_bias)
    mistral  llama without biases, with sliding_window (MistralConfig's default 4096 when absent)
    qwen2    llama with q/k/v biases only (qkv_bias=True, attn_bias=False, bias=False), rope_theta, and the
             window of use_sliding_window / max_window_layers / layer_types when it covers every layer

Tensors: ``LAYOUTS[model_type]`` pairs each numformer module with the Hugging Face module(s) holding it;
``tensors(model_config)`` expands it into ``TensorMap`` rows (weight and, where the model has one, bias).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable

# -- config fields ---------------------------------------------------------------------------------------------
KEEP, SAME = "keep", "same"
HONOURED, NO_EFFECT, TRAINING, TOKENIZER, REFUSED = (
    "honoured", "no effect on outputs", "training only", "tokenizer", "refused")


@dataclass(frozen=True)
class Field:
    """One config.json field transformers reads.

    default:  transformers' value when the key is absent (a callable of the fields resolved so far when it
              derives from them); ``null``: the value transformers' ``__post_init__`` puts in place of a null
              (``SAME``: the default; ``KEEP``: null stays null).
    role:     what numformer does with it: HONOURED (a numformer option reproduces it), NO_EFFECT (initialization,
              cache flags: the logits and gradients do not depend on it), TRAINING (dropout rates: numformer
              uses its own [model] dropout), TOKENIZER (special token ids), or REFUSED for values in ``refuse``.
    refuse:   (value, resolved fields) -> why numformer cannot reproduce this value, or None.
    aliases:  other names transformers maps onto this field (GPT-2's ``attribute_map``).
    kind:     "count" (a positive integer) or "" (no type check here).
    """

    name: str
    default: object
    role: str
    refuse: Callable | None = None
    aliases: tuple = ()
    kind: str = ""
    null: object = "keep"
    note: str = ""
    accepts: str = ""                # the docs' wording of the accepted values, for a rule applied elsewhere


def _documented(text):
    """Attach the docs' wording of what a refusal rule accepts."""
    def mark(rule):
        rule.accepts = text
        return rule
    return mark


def _only(*allowed, why=""):
    shown = " or ".join(map(repr, allowed))
    return _documented(shown)(lambda v, _: None if v in allowed else f"numformer reproduces only {shown}{why}")


@_documented("a positive integer")
def _positive(v, _):
    return None if type(v) is int and v > 0 else "must be a positive integer"


_positive_or_null = _documented("a positive integer or null")(lambda v, r: None if v is None else _positive(v, r))


_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                     "gelu": "gelu", "relu": "relu"}
_NF_TO_GPT2_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def _same(name):
    return lambda r: r[name]


def _head_dim_default(r):
    return r["hidden_size"] // r["num_attention_heads"]


@_documented("hidden_size / num_attention_heads")
def _head_dim(v, r):
    if v is None:
        return "null, which Qwen2's attention (reading head_dim with getattr) cannot use"
    if v == r["hidden_size"] // r["num_attention_heads"]:
        return None
    split = r["hidden_size"] // r["num_attention_heads"]
    return f"!= hidden_size / num_attention_heads = {split} (numformer's heads split d_model)"


@_documented("null or a token id of the vocabulary")
def _pad_id(v, r):
    if v is None or (type(v) is int and -r["vocab_size"] <= v < r["vocab_size"]):
        return None
    return f"is not a token id of the vocabulary [0, {r['vocab_size']}) (torch's Embedding refuses it too)"


@_documented("rope_type 'default' (also spelled type), partial_rotary_factor 1, one dict for every layer")
def _rope_refusal(v, r):
    """The standardized rope_parameters (``_standard_rope``): only plain RoPE."""
    if v.get("nested"):
        return f"has per-layer-type entries {v['nested']} (numformer has one RoPE for every layer)"
    if v["rope_type"] != "default":
        return (f"has rope_type {v['rope_type']!r} (scaled RoPE); numformer's RoPE is the plain one "
                f"(rope_type 'default')")
    if v.get("partial_rotary_factor") not in (None, 1, 1.0):
        return f"has partial_rotary_factor {v['partial_rotary_factor']} (numformer rotates every feature of a head)"
    if not isinstance(v["rope_theta"], (int, float)) or v["rope_theta"] <= 0:
        return f"has rope_theta {v['rope_theta']!r}, not a positive number"
    return None


COMMON_LLAMA = (  # fields every Llama-like config class has, in the class's order
    Field("vocab_size", 32000, HONOURED, _positive, kind="count", note="vocab_size"),
    Field("hidden_size", 4096, HONOURED, _positive, kind="count", note="d_model"),
    Field("intermediate_size", 11008, HONOURED, _positive, kind="count", note="d_ff"),
    Field("num_hidden_layers", 32, HONOURED, _positive, kind="count", note="n_layers"),
    Field("num_attention_heads", 32, HONOURED, _positive, kind="count", note="n_heads"),
    Field("num_key_value_heads", _same("num_attention_heads"), HONOURED, _positive, kind="count",
          null=SAME, note="n_kv_heads"),
    Field("hidden_act", "silu", HONOURED, _only("silu", why=" (the SwiGLU gate)"), note="activation 'swiglu'"),
    Field("max_position_embeddings", 2048, HONOURED, _positive, kind="count", note="block_size"),
    Field("initializer_range", 0.02, NO_EFFECT),
    Field("rms_norm_eps", 1e-6, HONOURED, note="layer_norm_eps (norm 'rms')"),
    Field("use_cache", True, NO_EFFECT),
    Field("pad_token_id", None, HONOURED, _pad_id, note="padding_idx (that embedding row gets no lookup gradient)"),
    Field("bos_token_id", 1, TOKENIZER),
    Field("eos_token_id", 2, TOKENIZER),
    Field("tie_word_embeddings", False, HONOURED, note="tie_weights (a stored lm_head.weight that differs unties, "
                                                       "as transformers)"),
    Field("rope_parameters", None, HONOURED, _rope_refusal, note="rope_theta (its rope_theta, else the top-level "
                                                                  "one, else 10000)"),
    Field("rope_scaling", None, HONOURED, note="the older name of rope_parameters; wins over it when both are set",
          accepts="as rope_parameters"),
    Field("rope_theta", 10000.0, HONOURED, note="rope_theta when rope_parameters has none"),
    Field("partial_rotary_factor", None, HONOURED, note="into rope_parameters", accepts="null or 1"),
    Field("attention_dropout", 0.0, TRAINING),
    Field("head_dim", _head_dim_default, HONOURED, _head_dim, null=SAME,
          note="only hidden_size / num_attention_heads"),
)


def _with(fields, **changes):
    """A copy of ``fields`` with the given (name -> Field or None) replaced, removed or appended."""
    out = [changes.pop(f.name, f) for f in fields]
    return tuple(f for f in out + list(changes.values()) if f is not None)


FIELDS = {
    "gpt2": (
        Field("vocab_size", 50257, HONOURED, _positive, kind="count", note="vocab_size"),
        Field("n_positions", 1024, HONOURED, _positive, ("max_position_embeddings",), "count", note="block_size"),
        Field("n_embd", 768, HONOURED, _positive, ("hidden_size",), "count", note="d_model"),
        Field("n_layer", 12, HONOURED, _positive, ("num_hidden_layers",), "count", note="n_layers"),
        Field("n_head", 12, HONOURED, _positive, ("num_attention_heads",), "count", note="n_heads"),
        Field("n_inner", lambda r: 4 * r["n_embd"], HONOURED, _positive, null=SAME, note="d_ff"),
        Field("activation_function", "gelu_new", HONOURED, _only(*_GPT2_ACTIVATIONS), note="activation"),
        Field("resid_pdrop", 0.1, TRAINING),
        Field("embd_pdrop", 0.1, TRAINING),
        Field("attn_pdrop", 0.1, TRAINING),
        Field("layer_norm_epsilon", 1e-5, HONOURED, note="layer_norm_eps"),
        Field("initializer_range", 0.02, NO_EFFECT),
        Field("summary_type", "cls_index", NO_EFFECT, note="GPT2DoubleHeadsModel only"),
        Field("summary_use_proj", True, NO_EFFECT, note="GPT2DoubleHeadsModel only"),
        Field("summary_activation", None, NO_EFFECT, note="GPT2DoubleHeadsModel only"),
        Field("summary_proj_to_labels", True, NO_EFFECT, note="GPT2DoubleHeadsModel only"),
        Field("summary_first_dropout", 0.1, NO_EFFECT, note="GPT2DoubleHeadsModel only"),
        Field("scale_attn_weights", True, HONOURED, _only(True, why=" (scores scaled by 1/sqrt(d_head))")),
        Field("use_cache", True, NO_EFFECT),
        Field("bos_token_id", 50256, TOKENIZER),
        Field("eos_token_id", 50256, TOKENIZER),
        Field("pad_token_id", None, TOKENIZER, note="GPT-2's embedding has no padding row"),
        Field("scale_attn_by_inverse_layer_idx", False, HONOURED,
              _only(False, why=" (scores divided by the layer index: not in numformer's GPT)")),
        Field("reorder_and_upcast_attn", False, NO_EFFECT, note="the scores' float32 upcast: rounding only"),
        Field("add_cross_attention", False, HONOURED, _only(False, why=" (a decoder-only GPT)")),
        Field("tie_word_embeddings", True, HONOURED, note="tie_weights (a stored lm_head.weight that differs "
                                                         "unties, as transformers)"),
    ),
    "llama": _with(COMMON_LLAMA,
                   pretraining_tp=Field("pretraining_tp", 1, NO_EFFECT, note="unused by LlamaForCausalLM's forward"),
                   attention_bias=Field("attention_bias", False, HONOURED, note="attn_bias"),
                   mlp_bias=Field("mlp_bias", False, HONOURED, note="bias (of the feed-forward)")),
    "mistral": _with(COMMON_LLAMA,
                     intermediate_size=Field("intermediate_size", 14336, HONOURED, _positive, kind="count",
                                             note="d_ff"),
                     num_key_value_heads=Field("num_key_value_heads", 8, HONOURED, _positive, kind="count",
                                               null=_same("num_attention_heads"), note="n_kv_heads"),
                     max_position_embeddings=Field("max_position_embeddings", 4096 * 32, HONOURED, _positive,
                                                   kind="count", note="block_size"),
                     sliding_window=Field("sliding_window", 4096, HONOURED,
                                          _positive_or_null,
                                          note="sliding_window (null: none)")),
    "qwen2": _with(COMMON_LLAMA,
                   vocab_size=Field("vocab_size", 151936, HONOURED, _positive, kind="count", note="vocab_size"),
                   intermediate_size=Field("intermediate_size", 22016, HONOURED, _positive, kind="count",
                                           note="d_ff"),
                   max_position_embeddings=Field("max_position_embeddings", 32768, HONOURED, _positive,
                                                 kind="count", note="block_size"),
                   num_key_value_heads=Field("num_key_value_heads", 32, HONOURED, _positive, kind="count",
                                             null=_same("num_attention_heads"), note="n_kv_heads"),
                   bos_token_id=Field("bos_token_id", None, TOKENIZER),
                   eos_token_id=Field("eos_token_id", None, TOKENIZER),
                   use_sliding_window=Field("use_sliding_window", False, HONOURED,
                                            note="sliding_window when every layer slides"),
                   sliding_window=Field("sliding_window", 4096, HONOURED,
                                        _positive_or_null,
                                        note="sliding_window (when use_sliding_window)"),
                   max_window_layers=Field("max_window_layers", 28, HONOURED, note="layers from this index slide",
                                           accepts="with a window: 0 or >= num_hidden_layers (one window for "
                                                   "every layer)"),
                   layer_types=Field("layer_types", None, HONOURED, note="which layers slide",
                                     accepts="all 'full_attention', or all 'sliding_attention'"),
                   head_dim=Field("head_dim", _head_dim_default, HONOURED, _head_dim,
                                  note="read with getattr by the modeling file; only hidden_size / "
                                       "num_attention_heads")),
}
# transformers' default RoPE base (RotaryEmbeddingConfigMixin.default_theta), the same for the four classes
DEFAULT_THETA = 10000.0


def _standard_rope(c, fields):
    """transformers' rope standardization (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict):
    ``rope_scaling`` wins over ``rope_parameters`` when set; a missing rope_theta falls back to the top-level
    ``rope_theta``, then 10000; ``rope_type`` falls back to the older key ``type``, then 'default'."""
    params = dict(c.get("rope_scaling") or c.get("rope_parameters") or {})
    nested = sorted(k for k in params if k in ("full_attention", "sliding_attention"))
    theta = c.get("rope_theta", DEFAULT_THETA)
    params.setdefault("rope_theta", theta)
    if "partial_rotary_factor" in c:
        params.setdefault("partial_rotary_factor", c["partial_rotary_factor"])
    params.setdefault("rope_type", params.get("type", "default"))
    if nested:
        params["nested"] = nested
    return params


def resolve(model_type, c):
    """{field: value} of config.json ``c`` for ``model_type``: each field of ``FIELDS`` as transformers reads it
    (its default when absent), checked; raises one ValueError naming the first refused field and its value."""
    fields = FIELDS[model_type]
    values = {}
    for f in fields:
        key = next((n for n in (f.name, *f.aliases) if n in c), None)
        value = c[key] if key is not None else None
        fill = f.default if key is None else None if value is not None or f.null == KEEP else \
            f.default if f.null == SAME else f.null
        if fill is not None:
            value = fill(values) if callable(fill) else fill
        name = f.name
        if f.name == "rope_parameters":      # the standardized dict, named by the key it came from
            value, name = _standard_rope(c, fields), "rope_scaling" if c.get("rope_scaling") else "rope_parameters"
        values[f.name] = value
        why = f.refuse(value, values) if f.refuse is not None else None
        if why and name == "rope_parameters" and why.startswith("has partial_rotary_factor") and \
                "partial_rotary_factor" in c:
            name, value = "partial_rotary_factor", c["partial_rotary_factor"]
        if why:
            shown = {k: v for k, v in value.items() if k != "nested"} if isinstance(value, dict) else value
            raise ValueError(f"{model_type} config.json field {name} = {shown!r}: {why}; numformer refuses a "
                             f"checkpoint it would not run as transformers does")
    return values


def _llama_like(model_type, r):
    """numformer's GPT options of a resolved Llama-like config."""
    pad = r["pad_token_id"]
    return {"type": "gpt", "vocab_size": r["vocab_size"], "block_size": r["max_position_embeddings"],
            "n_layers": r["num_hidden_layers"], "n_heads": r["num_attention_heads"],
            "n_kv_heads": r["num_key_value_heads"], "d_model": r["hidden_size"], "d_ff": r["intermediate_size"],
            "dropout": 0.0, "positional": "rope", "rope_theta": float(r["rope_parameters"]["rope_theta"]),
            "activation": "swiglu", "norm_first": True, "norm": "rms", "layer_norm_eps": r["rms_norm_eps"],
            "tie_weights": bool(r["tie_word_embeddings"]),
            **({"padding_idx": pad % r["vocab_size"]} if pad is not None else {})}


def _qwen2_window(r):
    """Qwen2Config.__post_init__ and Qwen2Attention: layer i slides (window ``sliding_window``) when
    use_sliding_window, sliding_window is set and layer_types[i] (default: i >= max_window_layers) says so."""
    window = r["sliding_window"] if r["use_sliding_window"] else None
    n = r["num_hidden_layers"]
    types = r["layer_types"]
    if types is None:
        types = ["sliding_attention" if window is not None and i >= r["max_window_layers"] else "full_attention"
                 for i in range(n)]
        culprit = ("max_window_layers", r["max_window_layers"])
    else:
        culprit = ("layer_types", types)
        if not isinstance(types, list) or len(types) != n or not set(types) <= {"full_attention", "sliding_attention"}:
            raise ValueError(f"qwen2 config.json field layer_types = {types!r}: must list 'full_attention' or "
                             f"'sliding_attention' for each of the {n} layers")
    windows = {window if t == "sliding_attention" else None for t in types}
    if len(windows) > 1:
        raise ValueError(f"qwen2 config.json field {culprit[0]} = {culprit[1]!r}: some layers slide (window "
                         f"{window}) and others attend to the whole context; numformer's GPT has one window for "
                         f"every layer; numformer refuses a checkpoint it would not run as transformers does")
    return windows.pop()


def gpt2_to_numformer(c):
    r = resolve("gpt2", c)
    return {"type": "gpt", "vocab_size": r["vocab_size"], "block_size": r["n_positions"], "n_layers": r["n_layer"],
            "n_heads": r["n_head"], "d_model": r["n_embd"], "d_ff": r["n_inner"], "dropout": 0.0,
            "positional": "learned", "activation": _GPT2_ACTIVATIONS[r["activation_function"]], "norm_first": True,
            "norm": "layer", "tie_weights": bool(r["tie_word_embeddings"]), "bias": True,
            "layer_norm_eps": r["layer_norm_epsilon"]}


def llama_to_numformer(c):
    r = resolve("llama", c)
    return {**_llama_like("llama", r), "bias": bool(r["mlp_bias"]), "attn_bias": bool(r["attention_bias"])}


def mistral_to_numformer(c):
    r = resolve("mistral", c)
    return {**_llama_like("mistral", r), "bias": False, "sliding_window": r["sliding_window"]}


def qwen2_to_numformer(c):
    r = resolve("qwen2", c)
    return {**_llama_like("qwen2", r), "bias": False, "attn_bias": False, "qkv_bias": True,
            "sliding_window": _qwen2_window(r)}


# -- export: numformer config -> config.json -------------------------------------------------------------------
def _biases(m):
    """(feed-forward bias, attention output bias, q/k/v bias) of a numformer model config."""
    bias = bool(m.get("bias", True))
    attn = bias if m.get("attn_bias") is None else bool(m["attn_bias"])
    return bias, attn, attn if m.get("qkv_bias") is None else bool(m["qkv_bias"])


def _check(family_name, checks):
    for ok, what in checks:
        if not ok:
            raise ValueError(f"{family_name} cannot express {what}; this model cannot be exported to the "
                             f"{family_name.lower()} format")


def gpt2_to_hf(m):
    _check("GPT-2", [(m.get("type") == "gpt", f"a {m.get('type')!r} model (GPT-2 is a decoder-only GPT)"),
                     (m.get("norm_first", True), "post-LN blocks (norm_first = false; GPT-2 is pre-LN with a final "
                                                 "norm)"),
                     (m.get("norm", "layer") == "layer", f"norm = {m.get('norm')!r} (GPT-2 uses LayerNorm)"),
                     (m.get("positional") in ("learned", "sinusoidal"),
                      f"positional = {m.get('positional')!r} (GPT-2 has a position table)"),
                     (m.get("activation") in _NF_TO_GPT2_ACTIVATION, f"activation = {m.get('activation')!r}"),
                     (m.get("n_kv_heads") in (None, m.get("n_heads")), "grouped-query attention (n_kv_heads)"),
                     (m.get("sliding_window") is None, f"sliding_window = {m.get('sliding_window')}")])
    p = m.get("dropout", 0.0)
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": m["vocab_size"],
            "n_positions": m["block_size"], "n_embd": m["d_model"], "n_layer": m["n_layers"], "n_head": m["n_heads"],
            "n_inner": m["d_ff"], "activation_function": _NF_TO_GPT2_ACTIVATION[m["activation"]],
            "layer_norm_epsilon": m["layer_norm_eps"], "tie_word_embeddings": m["tie_weights"],
            "resid_pdrop": p, "embd_pdrop": p, "attn_pdrop": p, "initializer_range": 0.02,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "use_cache": True}


def _llama_like_to_hf(name, m):
    _check(name, [(m.get("type") == "gpt", f"a {m.get('type')!r} model ({name} is a decoder-only GPT)"),
                  (m.get("norm_first", True), f"post-norm blocks (norm_first = false; {name} is pre-norm)"),
                  (m.get("norm") == "rms", f"norm = {m.get('norm')!r} ({name} uses RMSNorm: norm = 'rms')"),
                  (m.get("positional") == "rope", f"positional = {m.get('positional')!r} ({name} uses 'rope')"),
                  (m.get("activation") == "swiglu", f"activation = {m.get('activation')!r} ({name} uses 'swiglu')")])
    theta = m.get("rope_theta", DEFAULT_THETA)
    return {"vocab_size": m["vocab_size"], "hidden_size": m["d_model"], "intermediate_size": m["d_ff"],
            "num_hidden_layers": m["n_layers"], "num_attention_heads": m["n_heads"],
            "num_key_value_heads": m.get("n_kv_heads") or m["n_heads"], "head_dim": m["d_model"] // m["n_heads"],
            "hidden_act": "silu", "max_position_embeddings": m["block_size"], "rms_norm_eps": m["layer_norm_eps"],
            "rope_parameters": {"rope_type": "default", "rope_theta": theta}, "rope_theta": theta,
            "tie_word_embeddings": m["tie_weights"], "attention_dropout": 0.0, "initializer_range": 0.02,
            "use_cache": True, "pad_token_id": m.get("padding_idx")}


def llama_to_hf(m):
    bias, attn, qkv = _biases(m)
    _check("Llama", [(qkv == attn, "q/k/v biases without an output projection bias (qkv_bias != attn_bias; "
                                   "export as qwen2)"),
                     (m.get("sliding_window") is None, f"sliding_window = {m.get('sliding_window')} (export as "
                                                       f"mistral)")])
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_llama_like_to_hf("Llama", m),
            "attention_bias": attn, "mlp_bias": bias, "pretraining_tp": 1}


def mistral_to_hf(m):
    _check("Mistral", [(not any(_biases(m)), "biases (Mistral has none)")])
    return {"architectures": ["MistralForCausalLM"], "model_type": "mistral", **_llama_like_to_hf("Mistral", m),
            "sliding_window": m.get("sliding_window")}


def qwen2_to_hf(m):
    bias, attn, _ = _biases(m)
    _check("Qwen2", [(not bias and not attn, "feed-forward or attention output biases (Qwen2 has q/k/v biases "
                                             "only)")])
    window = m.get("sliding_window")
    n = m["n_layers"]
    out = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **_llama_like_to_hf("Qwen2", m),
           "use_sliding_window": window is not None, "sliding_window": window, "max_window_layers": 0 if window else n,
           "layer_types": ["sliding_attention" if window else "full_attention"] * n}
    out.pop("head_dim")            # not a Qwen2Config field (the modeling file would read it with getattr)
    return out


# -- tensors ---------------------------------------------------------------------------------------------------
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
class Module_:
    """One numformer module <- Hugging Face module(s): ``nf`` and ``hf`` name modules (".weight" / ".bias"
    appended), ``{i}`` the layer; ``bias``: which of the model's bias switches gives it a bias ("norm": a
    LayerNorm, "ff", "attn", "qkv", "always", "never"); ``split``: hf modules stacked as (q, k, v)."""

    nf: str
    hf: tuple
    bias: str
    transpose: bool = False
    split: bool = False


@dataclass(frozen=True)
class Layout:
    top: tuple                       # modules before the layers (embeddings)
    layer: tuple                     # per layer, "{i}" the index
    final: tuple                     # after the layers (final norm)
    prefixes: tuple = ()             # checkpoint name prefixes; a name without one gets the first (headless saves)
    ignored: str = r"(?!)"           # checkpoint tensors that are buffers, not weights


GPT2_LAYOUT = Layout(
    top=(Module_("tok_emb", ("transformer.wte",), "never"), Module_("pos_emb", ("transformer.wpe",), "never")),
    layer=(Module_("norm1", ("transformer.h.{i}.ln_1",), "always"),
           Module_("self_attn.qkv_proj", ("transformer.h.{i}.attn.c_attn",), "always", transpose=True),
           Module_("self_attn.out_proj", ("transformer.h.{i}.attn.c_proj",), "always", transpose=True),
           Module_("norm2", ("transformer.h.{i}.ln_2",), "always"),
           Module_("ff.linear1", ("transformer.h.{i}.mlp.c_fc",), "always", transpose=True),
           Module_("ff.linear2", ("transformer.h.{i}.mlp.c_proj",), "always", transpose=True)),
    final=(Module_("norm_f", ("transformer.ln_f",), "always"),),
    prefixes=("transformer.",), ignored=r"^transformer\.h\.\d+\.attn\.(masked_)?bias$")

LLAMA_LAYOUT = Layout(
    top=(Module_("tok_emb", ("model.embed_tokens",), "never"),),
    layer=(Module_("self_attn.qkv_proj", tuple(f"model.layers.{{i}}.self_attn.{p}_proj" for p in "qkv"), "qkv",
                   split=True),
           Module_("self_attn.out_proj", ("model.layers.{i}.self_attn.o_proj",), "attn"),
           Module_("ff.gate_proj", ("model.layers.{i}.mlp.gate_proj",), "ff"),
           Module_("ff.up_proj", ("model.layers.{i}.mlp.up_proj",), "ff"),
           Module_("ff.down_proj", ("model.layers.{i}.mlp.down_proj",), "ff"),
           Module_("norm1", ("model.layers.{i}.input_layernorm",), "never"),
           Module_("norm2", ("model.layers.{i}.post_attention_layernorm",), "never")),
    final=(Module_("norm_f", ("model.norm",), "never"),),
    prefixes=("model.",), ignored=r"\.rotary_emb\.inv_freq$")
# Qwen2: q/k/v biases always (a model without them exports zeros), none elsewhere
QWEN2_LAYOUT = replace(LLAMA_LAYOUT, layer=tuple(replace(mod, bias={"qkv": "always"}.get(mod.bias, "never"))
                                                  for mod in LLAMA_LAYOUT.layer))


def expand(layout, m):
    """[TensorMap, ...] covering every numformer parameter of model config ``m`` under ``layout``."""
    bias, attn, qkv = _biases(m)
    has_bias = {"always": True, "never": False, "ff": bias, "attn": attn, "qkv": qkv}
    dh = m["d_model"] // m["n_heads"]
    kv = (m.get("n_kv_heads") or m["n_heads"]) * dh
    rows = []
    for mod, i in ([(t, None) for t in layout.top] + [(t, i) for i in range(m["n_layers"]) for t in layout.layer]
                   + [(t, None) for t in layout.final]):
        nf = mod.nf if i is None else f"blocks.{i}.{mod.nf}"
        hf = tuple(h.format(i=i) for h in mod.hf)
        for part in ("weight", "bias") if has_bias[mod.bias] else ("weight",):
            if mod.nf == "pos_emb" and m.get("positional") in ("rope", "alibi"):
                continue
            rows.append(TensorMap(f"{nf}.{part}", tuple(f"{h}.{part}" for h in hf), mod.transpose and part == "weight",
                                  (m["d_model"], kv, kv) if mod.split else ()))
    if not m["tie_weights"]:
        rows.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    return rows


@dataclass(frozen=True)
class Family:
    """How one Hugging Face ``model_type`` maps onto numformer.

    to_numformer(hf_config) -> numformer model config (``{"type": "gpt", ...}``); raises ValueError naming a
                               config field numformer cannot reproduce (``FIELDS``).
    to_hf(model_config)     -> config.json dict; raises ValueError naming a feature the family lacks.
    layout:                  the tensor table (``tensors(model_config)`` expands it).
    """

    model_type: str
    to_numformer: Callable
    to_hf: Callable
    layout: Layout

    def tensors(self, model_config):
        return expand(self.layout, model_config)

    def canonical(self, name):
        """A checkpoint tensor name as ``tensors`` spells it: saves of the headless model (GPT2Model,
        LlamaModel) lack the prefix."""
        if name.startswith("lm_head.") or any(name.startswith(p) for p in self.layout.prefixes):
            return name
        return self.layout.prefixes[0] + name

    @property
    def ignored(self):
        return self.layout.ignored


FAMILIES = {"gpt2": Family("gpt2", gpt2_to_numformer, gpt2_to_hf, GPT2_LAYOUT),
            "llama": Family("llama", llama_to_numformer, llama_to_hf, LLAMA_LAYOUT),
            "mistral": Family("mistral", mistral_to_numformer, mistral_to_hf, LLAMA_LAYOUT),
            "qwen2": Family("qwen2", qwen2_to_numformer, qwen2_to_hf, QWEN2_LAYOUT)}


def family(model_type):
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported; numformer imports {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def default_export_type(m):
    """The family a numformer model config exports to by default: gpt2 for a position table, else qwen2 for
    q/k/v-only biases, mistral for a sliding window, llama otherwise."""
    if m.get("positional") != "rope":
        return "gpt2"
    bias, attn, qkv = _biases(m)
    if qkv and not attn and not bias:
        return "qwen2"
    return "mistral" if m.get("sliding_window") is not None else "llama"


def fields_markdown():
    """The fields table of every family, for the docs: field | transformers' default | numformer | accepted."""
    derived = {"n_inner": "4 · n_embd", "num_key_value_heads": "num_attention_heads",
               "head_dim": "hidden_size / num_attention_heads"}
    lines = []
    for model_type, fields in FIELDS.items():
        lines += [f"### {model_type}", "", "| field | transformers' default | numformer | accepted (else refused) |",
                  "|---|---|---|---|"]
        for f in fields:
            default = derived.get(f.name, "derived") if callable(f.default) else f"`{json.dumps(f.default)}`"
            what = f.role + (f": {f.note}" if f.note else "")
            accepted = f.accepts or (getattr(f.refuse, "accepts", "any") if f.refuse is not None else "any")
            lines.append(f"| `{f.name}` | {default} | {what} | {accepted} |")
        lines.append("")
    return "\n".join(lines)
