"""The field tables of the Hugging Face families: one rule for every config.json field transformers reads.

Each family file (``gpt2.py``, ``llama.py`` ...) lists the fields of transformers' config class (its dataclass
fields) and the keyword arguments it consumes (``rope_scaling``, ``rope_theta``, ``partial_rotary_factor``),
plus the keys the modeling file reads with ``getattr``. Each ``Field`` has its type (transformers' annotation,
checked: a value of another type is refused by name, as transformers' strict config class refuses it),
transformers' default (used when the key is absent, or null where transformers' ``__post_init__`` fills it),
and either maps onto a ``GPTConfig`` option or is refused with one line naming the field and its value
(``refuse``). Keys in no table are ignored, as transformers' model ignores them. ``resolve`` applies a table
to a config.json; tests/test_hf_fields.py fails when transformers' config class gains a field missing from a
table, or types one differently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..hf_rope import rope_problem, standardize_entry

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
    aliases:  other names transformers maps onto this field (GPT-2's ``attribute_map``): one present wins over the
              field's own name, as transformers sets the field from it after its own key.
    type:     the value's type as transformers annotates it ("int", "float | None", "list[str] | None" ...).
    note:     the docs' wording of what numformer does with it (the ``GPTConfig`` option it sets ...).
    """

    name: str
    default: object
    role: str
    refuse: Callable | None = None
    aliases: tuple = ()
    type: str = "int"
    null: object = "keep"
    note: str = ""
    accepts: str = ""                # the docs' wording of the accepted values, for a rule applied elsewhere
    read: Callable | None = None     # (config.json, resolved fields) -> the value transformers builds from
    #                                  several keys (the standardized RoPE), in place of the key's own value


def documented(text):
    """Attach the docs' wording of what a refusal rule accepts."""
    def mark(rule):
        rule.accepts = text
        return rule
    return mark


def only(*allowed, why=""):
    """The rule that accepts the values ``allowed`` only (``why``: the reason appended to the refusal)."""
    shown = " or ".join(map(repr, allowed))
    return documented(shown)(lambda v, _: None if v in allowed else f"numformer reproduces only {shown}{why}")


@documented("a positive integer")
def positive(v, _):
    return None if type(v) is int and v > 0 else "must be a positive integer"


@documented("a number >= 0")
def norm_eps(v, _):
    if v >= 0 and v != float("inf"):
        return None
    return ("must be a finite number >= 0: each norm divides by √(mean(x²) + eps) (LayerNorm: of the variance), "
            "which a negative eps makes NaN (in transformers too); restore the file")


positive_or_null = documented("a positive integer or null")(lambda v, r: None if v is None else positive(v, r))


def same(name):
    """A default equal to the resolved field ``name``."""
    return lambda r: r[name]


@documented("null or a token id of the vocabulary")
def pad_id(v, r):
    if v is None or (type(v) is int and -r["vocab_size"] <= v < r["vocab_size"]):
        return None
    return f"is not a token id of the vocabulary [0, {r['vocab_size']}) (torch's Embedding refuses it too)"


def divides(heads_field):
    """The rule of a key/value head count: a divisor of the field ``heads_field``."""
    @documented(f"a positive divisor of {heads_field}")
    def rule(v, r):
        if type(v) is not int or v < 1:
            return "must be a positive integer"
        if r[heads_field] % v:
            return (f"must divide {heads_field} = {r[heads_field]} (each key/value head serves {heads_field} / "
                    f"num_key_value_heads query heads); transformers cannot run this config.json either: it is "
                    f"damaged or belongs to another model")
        return None
    return rule


# -- types -------------------------------------------------------------------------------------------------
def fits(value, type_text):
    """Whether ``value`` (from JSON) has the type ``type_text``, transformers' annotation ("int | None" ...);
    an integer is a float too."""
    for part in type_text.split(" | "):
        if (part == "None" and value is None) or (part == "int" and type(value) is int) or \
                (part == "float" and type(value) in (int, float)) or (part == "bool" and type(value) is bool) or \
                (part == "str" and isinstance(value, str)) or (part == "dict" and isinstance(value, dict)):
            return True
        if part.startswith("list[") and isinstance(value, list) and all(fits(v, part[5:-1]) for v in value):
            return True
    return False


def describe(type_text):
    """A type annotation in words ("int | None" -> "an integer or null")."""
    words = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
             "dict": "an object", "None": "null", "list[str]": "a list of strings", "list[int]": "a list of integers"}
    return " or ".join(words.get(p, p) for p in type_text.split(" | "))


# -- RoPE ---------------------------------------------------------------------------------------------------
# transformers' default RoPE base (RotaryEmbeddingConfigMixin.default_theta): Llama, Mistral, Qwen2, Qwen3, Gemma 2
DEFAULT_THETA = 10000.0


def standard_rope(c, max_position_embeddings=None):
    """transformers' rope standardization (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict):
    ``rope_scaling`` wins over ``rope_parameters`` when set; a missing rope_theta falls back to the top-level
    ``rope_theta``, then 10000; a top-level ``partial_rotary_factor`` is copied in when the dict lacks one;
    ``rope_type`` and ``original_max_position_embeddings`` as ``hf_rope.standardize_entry`` sets them. A dict
    nested by layer type gets the key ``nested`` (the layer types), which ``rope_refusal`` refuses."""
    params = dict(c.get("rope_scaling") or c.get("rope_parameters") or {})
    nested = sorted(k for k in params if k in ("full_attention", "sliding_attention"))
    theta = c.get("rope_theta", DEFAULT_THETA)
    params.setdefault("rope_theta", theta)
    if "partial_rotary_factor" in c:
        params.setdefault("partial_rotary_factor", c["partial_rotary_factor"])
    config = {k: v for k, v in c.items() if k != "max_position_embeddings"}
    if max_position_embeddings is not None:
        config["max_position_embeddings"] = max_position_embeddings
    standardize_entry(params, config, flat=not nested)
    if nested:
        params["nested"] = nested
    return params


def read_rope(c, values):
    """The ``read`` of a rope_parameters field with one RoPE for every layer."""
    return standard_rope(c, values.get("max_position_embeddings"))


@documented("rope_type 'default', 'linear', 'dynamic', 'llama3' or 'yarn' (also spelled type) with the keys "
            "transformers requires, partial_rotary_factor 1, one dict for every layer")
def rope_refusal(v, r):
    """The standardized rope_parameters (``standard_rope``): plain RoPE or a scaling numformer computes as
    transformers does (``numformer.interop.hf_rope``)."""
    if v.get("nested"):
        return f"has per-layer-type entries {v['nested']} (numformer reads one RoPE for every layer here)"
    return rope_problem(v, r.get("max_position_embeddings"))


# -- applying a table -----------------------------------------------------------------------------------------
def resolve(fields, c, model_type):
    """{field: value} of config.json ``c`` under the table ``fields``: each field as transformers reads it (its
    default when absent), of its type, checked by its rule; one ValueError naming the first refused field and
    its value (``{model_type} config.json field NAME = VALUE: why``). A quantized checkpoint (its weights
    fp8, int4 ... with their scales) is refused first, whatever its family."""
    quantized = c.get("quantization_config")
    if quantized:
        method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized
        _refuse(model_type, "quantization_config", {"quant_method": method},
                "its weights are quantized, and numformer reads float32, bfloat16 and float16 weights; use the "
                "model's unquantized release (numformer's own int8: generate --quantize int8)")
    for f in fields:                         # every value of its type first: a rule may read several fields
        key = _key(f, c)
        if key is not None and not fits(c[key], f.type):
            _refuse(model_type, key, c[key], f"must be {describe(f.type)}, the type transformers gives it; restore "
                                             f"the file")
    values = {}
    for f in fields:
        key = _key(f, c)
        value = c[key] if key is not None else None
        fill = f.default if key is None else None if value is not None or f.null == KEEP else \
            f.default if f.null == SAME else f.null
        if fill is not None:
            value = fill(values) if callable(fill) else fill
        name = key or f.name
        if f.read is not None:               # the standardized RoPE, named by the key it came from
            value, name = f.read(c, values), "rope_scaling" if c.get("rope_scaling") else "rope_parameters"
        values[f.name] = value
        why = f.refuse(value, values) if f.refuse is not None else None
        if why and name == "rope_parameters" and why.startswith("has partial_rotary_factor") and \
                "partial_rotary_factor" in c:
            name, value = "partial_rotary_factor", c["partial_rotary_factor"]
        if why:
            _refuse(model_type, name, {k: v for k, v in value.items() if k != "nested"}
                    if isinstance(value, dict) else value, why + "; numformer refuses a checkpoint it would not "
                                                                 "run as transformers does")
    return values


def _key(field, c):
    """The key of config.json ``c`` that gives ``field`` its value, as transformers reads it: an alias present
    (``attribute_map``: ``num_attention_heads`` for GPT-2's ``n_head``) wins over the field's own name; None when
    neither is there."""
    return next((n for n in (*field.aliases, field.name) if n in c), None)


def _refuse(model_type, name, value, why):
    raise ValueError(f"{model_type} config.json field {name} = {value!r}: {why}")


def with_fields(fields, **changes):
    """A copy of the table ``fields`` with the given (name -> Field or None) replaced, removed or appended."""
    out = [changes.pop(f.name, f) for f in fields]
    return tuple(f for f in out + list(changes.values()) if f is not None)
