"""The Hugging Face families numformer reads and writes: ``FAMILIES`` maps a config.json ``model_type`` to its
family file's ``Family`` (gpt2, llama, mistral, qwen2, qwen3,
gemma2, gemma3_text, arcee). A new family is a new file beside these and one line
here (see the docs' "Adding a model family")."""
from __future__ import annotations

import json

from . import arcee, gemma2, gemma3, gpt2, llama, mistral, qwen2, qwen3
from .fields import resolve as resolve_fields

FAMILIES = {m.MODEL_TYPE: m.FAMILY for m in (gpt2, llama, mistral, qwen2, qwen3, gemma2, gemma3, arcee)}


def family(model_type):
    """The ``Family`` of a config.json ``model_type``; a ValueError naming the supported ones for any other."""
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported; numformer imports {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def resolve(model_type, c):
    """{field: value} of config.json ``c`` under the field table of ``model_type`` (``fields.resolve``)."""
    return resolve_fields(family(model_type).fields, c, model_type)


def default_export_type(config):
    """The family a GPTConfig exports to by default: gpt2 for a position table; for RoPE with Gemma's 1 + w
    norms gemma3_text (with q/k norms) or gemma2; arcee for a feed-forward that is not gated; else qwen3 for
    q/k norms, qwen2 for q/k/v-only biases or windows on some layers only, mistral for a window on every layer,
    llama otherwise."""
    if config.positional != "rope":
        return "gpt2"
    if config.norm == "rms" and all(b.activation not in ("swiglu", "geglu") for b in config.layers):
        return "arcee"
    qk_norm = any(b.qk_norm for b in config.layers)
    if config.norm == "rms_plus_one":
        return "gemma3_text" if qk_norm else "gemma2"
    if qk_norm:
        return "qwen3"
    windows = {b.sliding_window for b in config.layers}
    if any(b.qkv_bias and not b.attn_bias and not b.bias for b in config.layers) or \
            (len(windows) > 1 and None in windows):
        return "qwen2"
    return "mistral" if windows != {None} else "llama"


def fields_markdown():
    """The fields table of every family, for the docs: field | type | transformers' default | numformer |
    accepted."""
    derived = {"n_inner": "4 · n_embd", "num_key_value_heads": "num_attention_heads",
               "head_dim": "hidden_size // num_attention_heads"}
    lines = []
    for model_type, fam in FAMILIES.items():
        lines += [f"### {model_type}", "", "| field | type | transformers' default | numformer | accepted (else "
                  "refused) |", "|---|---|---|---|---|"]
        for f in fam.fields:
            default = derived.get(f.name, "derived") if callable(f.default) else f"`{json.dumps(f.default)}`"
            what = f.role + (f": {f.note}" if f.note else "")
            accepted = f.accepts or (getattr(f.refuse, "accepts", "any") if f.refuse is not None else "any")
            kind = " or ".join(f"`{t}`" for t in f.type.split(" | "))         # no "|" inside a table cell
            lines.append(f"| `{f.name}` | {kind} | {default} | {what} | {accepted} |")
        lines.append("")
    return "\n".join(lines)
