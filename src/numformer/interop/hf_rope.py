"""RoPE from a Hugging Face config.json, in both of its forms, read as transformers reads it
(``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`` and ``standardize_rope_params``):

- transformers 4.x: ``rope_scaling`` (``{"rope_type": "llama3", "factor": 8.0, ...}``, older files say
  ``type``) beside a top-level ``rope_theta``;
- transformers 5.x: ``rope_parameters``, one dict holding ``rope_theta`` too; for a model whose layers
  differ (Gemma 3) one dict per layer type (``full_attention``, ``sliding_attention``).

When both are present ``rope_scaling`` wins; a ``rope_theta`` inside the dict wins over the top-level one;
llama3 and yarn default ``original_max_position_embeddings`` to ``max_position_embeddings`` (a top-level
``original_max_position_embeddings`` replaces theirs in a dict that is not nested by layer type). The result is
numformer's description: the base θ and a ``RopeScaling`` (``numformer.ops.rope_scaling``), or None for
plain RoPE. A RoPE numformer does not compute (longrope, multimodal sections, a partial rotary factor other
than 1) is one ValueError naming the field. The family files read config.json through their field tables
(``hf.fields.standard_rope``, ``gemma3_rope_parameters``) and this module's ``rope_settings`` and
``read_gemma3_rope``; ``read_rope`` reads a whole config.json with one RoPE at once.

    theta, scaling = read_rope(config)                          # one RoPE for every layer
    per_type = read_gemma3_rope(config, layer_types)            # {"full_attention": (theta, scaling), ...}
"""
from __future__ import annotations

import copy

from ..ops.rope_scaling import ROPE_TYPES, RopeScaling

DEFAULT_THETA = 10000.0                       # transformers' RotaryEmbeddingConfigMixin.default_theta
GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
SCALED = ("llama3", "yarn", "longrope")       # the types that get original_max_position_embeddings
# The keys transformers' computation reads, per type (it warns about and ignores any other key).
READ = {"default": (), "linear": ("factor",), "dynamic": ("factor",),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                 "mscale", "mscale_all_dim", "truncate")}
REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def rope_parameters(config, default_theta=DEFAULT_THETA):
    """The standardized ``rope_parameters`` dict of a config.json (a copy; flat, or nested by layer type when
    its keys are layer types of ``config["layer_types"]``), as transformers standardizes it."""
    params = copy.deepcopy(config.get("rope_scaling") or config.get("rope_parameters") or {})
    if not isinstance(params, dict):
        raise ValueError(f"config.json field {_source(config)} = {params!r} is not an object")
    theta = config.get("rope_theta", default_theta)
    nested = [k for k in params if k in (config.get("layer_types") or ())]
    for entry in [params[k] for k in nested] or [params]:
        if entry is not None:
            entry.setdefault("rope_theta", theta)
            if config.get("partial_rotary_factor") is not None:
                entry.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
            standardize_entry(entry, config, flat=not nested)
    return params


def gemma3_rope_parameters(config):
    """Gemma 3's nested ``rope_parameters`` as ``Gemma3TextConfig`` builds them: v5 files nest them per layer
    type; v4 files give ``rope_theta`` (full-attention layers, default 1e6, where ``rope_scaling`` applies,
    merged into their dict) and ``rope_local_base_freq`` (sliding layers, default 1e4)."""
    params = copy.deepcopy(config.get("rope_parameters")) or {"sliding_attention": {"rope_type": "default"},
                                                             "full_attention": {"rope_type": "default"}}
    if not gemma3_nested(params):
        return params                           # refused by the family's field table (gemma3.rope_refusal)
    scaling = config.get("rope_scaling")
    if scaling is not None:
        if not isinstance(params.get("full_attention"), dict):
            raise ValueError("config.json has rope_scaling but its rope_parameters have no full_attention entry "
                             "to apply it to (transformers fails there too); give rope_parameters per layer type")
        params["full_attention"].update(scaling)
    for layer_type, key in (("full_attention", "rope_theta"), ("sliding_attention", "rope_local_base_freq")):
        if params.get(layer_type) is None:
            params[layer_type] = {"rope_type": "default"}
        params[layer_type].setdefault("rope_theta", config.get(key, GEMMA3_THETA[layer_type]))
        standardize_entry(params[layer_type], config)
    return params


def gemma3_nested(params):
    """Whether Gemma 3's rope_parameters are nested by layer type: {layer type: dict or None}."""
    return isinstance(params, dict) and not set(params) - set(GEMMA3_THETA) and \
        all(v is None or isinstance(v, dict) for v in params.values())


def standardize_entry(entry, config, flat=False):
    """transformers' per-dict defaults: rope_type from the older key ``type``, else "default"; llama3, yarn
    and longrope get original_max_position_embeddings = max_position_embeddings when they lack one. A
    top-level ``original_max_position_embeddings`` (Phi-3's and DeepSeek's files) replaces the dict's in a
    flat dict (one RoPE for every layer), as ``standardize_rope_params`` gives it priority there; a dict
    nested by layer type ignores it."""
    entry.setdefault("rope_type", entry.get("type", "default"))
    if entry["rope_type"] in SCALED and flat and "original_max_position_embeddings" in config:
        entry["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    elif entry["rope_type"] in SCALED and "max_position_embeddings" in config:
        entry.setdefault("original_max_position_embeddings", config["max_position_embeddings"])


def _source(config):
    return "rope_scaling" if config.get("rope_scaling") else "rope_parameters"


def rope_problem(params, max_position_embeddings=None):
    """What keeps numformer from computing the RoPE of one standardized rope dict as transformers does (a
    phrase to follow the field's name: "has rope_type 'longrope' ..."), or None."""
    rope_type = params.get("rope_type", "default")
    if rope_type != "default" and rope_type not in ROPE_TYPES:
        return f"has rope_type {rope_type!r}; numformer computes 'default', {', '.join(map(repr, ROPE_TYPES))}"
    if params.get("partial_rotary_factor") not in (None, 1, 1.0):
        return (f"has partial_rotary_factor {params['partial_rotary_factor']!r} (numformer rotates every feature "
                f"of a head)")
    if params.get("mrope_section") is not None:
        return "has mrope_section (multimodal RoPE)"
    theta = params.get("rope_theta")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 0:
        return f"has rope_theta {theta!r}, not a positive number"
    if rope_type == "default":
        return None
    missing = [k for k in REQUIRED.get(rope_type, ()) if k not in params]
    if missing:
        return f"has rope_type {rope_type!r} without {missing[0]}"
    try:
        _scaling(params, rope_type, max_position_embeddings)
    except (ValueError, TypeError) as e:
        return f"does not describe a RoPE scaling ({e})"
    return None


def _scaling(params, rope_type, max_position_embeddings):
    values = {k: params[k] for k in READ[rope_type] if k in params}
    if rope_type == "yarn":
        values["truncate"] = params.get("truncate", True)
    if rope_type in ("dynamic", "yarn"):
        values["max_position_embeddings"] = max_position_embeddings
    return RopeScaling(rope_type, **values)


def rope_settings(params, max_position_embeddings, where="rope_parameters"):
    """(θ, RopeScaling or None) of one standardized rope dict; a RoPE numformer cannot compute is one
    ValueError naming ``where`` and the key."""
    problem = rope_problem(params, max_position_embeddings)
    if problem:
        raise ValueError(f"config.json {where} {problem}; numformer refuses a checkpoint it would not run as "
                         f"transformers does")
    rope_type = params.get("rope_type", "default")
    scaling = None if rope_type == "default" else _scaling(params, rope_type, max_position_embeddings)
    return float(params["rope_theta"]), scaling


def hf_rope_parameters(theta, scaling):
    """The transformers 5.x ``rope_parameters`` dict of a RoPE base and scaling (``save_pretrained``'s form):
    the keys transformers reads for the type (dynamic and yarn take max_position_embeddings from the config's
    own field, not from this dict)."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    fields = scaling.to_dict()
    return {"rope_type": scaling.rope_type, "rope_theta": theta,
            **{k: fields[k] for k in READ[scaling.rope_type] if k in fields}}


def read_rope(config, default_theta=DEFAULT_THETA, max_position_embeddings=None):
    """(θ, RopeScaling or None) of a config.json whose layers share one RoPE (Llama, Mistral, Qwen2, Qwen3,
    Gemma 2).

    default_theta: the base when the file gives none; max_position_embeddings: the family's value when the
    file has none (used by dynamic and yarn, and as llama3's and yarn's original_max_position_embeddings
    when they lack one)."""
    config = _with_context(config, max_position_embeddings)
    params = rope_parameters(config, default_theta)
    nested = [k for k in params if k in (config.get("layer_types") or ())]
    if nested:
        raise ValueError(f"config.json {_source(config)} has per-layer-type entries {nested}, but this model "
                         f"family has one RoPE for every layer")
    return rope_settings(params, config.get("max_position_embeddings"), _source(config))


def read_gemma3_rope(config, layer_types, max_position_embeddings=None):
    """{layer type: (θ, RopeScaling or None)} of a Gemma 3 config.json, for the layer types in
    ``layer_types``. transformers' YaRN reads ``truncate`` from the top level of the nested dict, where it
    never is, so YaRN truncates for Gemma 3 whatever the layer's dict says; numformer does the same.
    max_position_embeddings: the family's value when the file has none."""
    config = _with_context(config, max_position_embeddings)
    params = gemma3_rope_parameters(config)
    out = {}
    for layer_type in dict.fromkeys(layer_types):
        entry = params.get(layer_type)
        if entry is None:
            raise ValueError(f"config.json rope_parameters have no entry for the layer type {layer_type!r}")
        if entry.get("rope_type") == "yarn":
            entry = {**entry, "truncate": True}
        out[layer_type] = rope_settings(entry, config.get("max_position_embeddings"),
                                        f"rope_parameters[{layer_type!r}]")
    return out


def _with_context(config, max_position_embeddings):
    if max_position_embeddings is None or "max_position_embeddings" in config:
        return config
    return {**config, "max_position_embeddings": max_position_embeddings}
