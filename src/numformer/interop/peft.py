"""LoRA adapters in PEFT's format, out and in: ``adapter_config.json`` + ``adapter_model.safetensors``.

    save_adapter(model, "adapter/")     # peft.PeftModel.from_pretrained(hf_model, "adapter/") gives the same logits
    load_adapter(model, "adapter/")     # a PEFT LoRA adapter onto a numformer model of the same base

PEFT names a tensor ``base_model.model.<Hugging Face module>.lora_A.weight`` (no adapter name), e.g.
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``; A is (r, in) and B (out, r), as numformer
stores them, the scaling α / r (α / √r with rsLoRA) kept apart. The Hugging Face module of each adapter comes
from the family's layout (``interop.hf``: the same table as the weights'). PEFT only warns about keys it does not
expect and leaves such an adapter's B at zero, an adapter that silently does nothing: so ``load_adapter`` reads
every key or refuses, and refuses by name the PEFT options numformer does not implement (``REFUSED``, among them
the LoRA variants: DoRA, aLoRA, BD-LoRA, VeLoRA, MonteCLoRA, KaSA, Arrow) and the initialisations PEFT runs again
on the base weights when it loads an adapter (``BASE_CHANGING_INITS``: PiSSA, CorDA, OLoRA). GPT-2's
``Conv1D`` layers store W as (in, out): PEFT marks them ``fan_in_fan_out`` (which changes how it merges, not
the adapter's tensors); ``c_attn`` there is one adapter on the fused q/k/v matrix.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._limits import bounded_json
from ..lora import TARGET_MODULES, add_lora, lora_adapters
from ..run_files import write_atomic, write_json_atomic
from .hf.families import default_export_type, family
from ..safetensors_reader import read_safetensors_file
from ..safetensors_writer import safetensors_pieces

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."

# PEFT LoRA options numformer does not implement: {option: the values that mean "not used"}, the first the one
# PEFT writes (every PEFT release writes that one or leaves the option out, and absent means "not used" too).
# A flag is off as false or null, a list or mapping option as null or empty; a LoRA variant's *_config only as
# null (PEFT turns {} into the variant's default options) and bias only as "none"; layers_to_transform 0 is a
# layer. Compared by type as well: 0 is not false.
_FLAG_OFF = (False, None)
_EMPTY = (None, {}, [])
REFUSED = {"use_dora": _FLAG_OFF, "rank_pattern": ({}, None, []), "alpha_pattern": ({}, None, []),
           "bias": ("none",), "modules_to_save": _EMPTY, "layers_to_transform": (None, []),
           "layers_pattern": _EMPTY, "lora_bias": _FLAG_OFF, "exclude_modules": _EMPTY, "target_parameters": _EMPTY,
           "trainable_token_indices": _EMPTY, "layer_replication": _EMPTY, "use_qalora": _FLAG_OFF,
           "megatron_config": _EMPTY, "loftq_config": ({}, None, []), "arrow_config": (None,),
           "alora_invocation_tokens": (None, []), "use_bdlora": (None,), "velora_config": (None,),
           "monteclora_config": (None,), "kasa_config": (None,)}
# init_lora_weights PEFT runs again when it loads an adapter, changing the base layers' weights (PiSSA, CorDA, OLoRA)
BASE_CHANGING_INITS = ("pissa", "corda", "olora")


def adapter_keys(model, model_type=None):
    """{PEFT key: (LoRAAdapter, "lora_A" | "lora_B")} of a model with adapters, in model order; the keys name
    the modules of the family ``model_type`` (default: the one ``export_hf`` writes, ``default_export_type``)."""
    fam = family(model_type or default_export_type(model.config))
    keys = {}
    for prefix, adapter, layer_path, _ in lora_adapters(model):
        module = _hf_module(fam, prefix, layer_path)
        keys[f"{PREFIX}{module}.lora_A.weight"] = (adapter, "lora_A")
        keys[f"{PREFIX}{module}.lora_B.weight"] = (adapter, "lora_B")
    return keys


def _hf_module(fam, prefix, layer_path):
    """The Hugging Face module of the adapter ``prefix`` (blocks.0.self_attn.q_proj) on the numformer layer
    ``layer_path`` (blocks.0.self_attn.qkv_proj): model.layers.0.self_attn.q_proj under Llama's layout."""
    _, i, local = layer_path.split(".", 2)
    hf_name = prefix.rpartition(".")[2]
    for mod in fam.layout.layer:
        if mod.nf == local:
            for h in mod.hf:
                if h.rpartition(".")[2] == hf_name:
                    return h.format(i=i)
    raise _NoHFModule(f"the adapter {prefix} has no {fam.model_type} module: a {fam.model_type} model's adapters "
                      f"target {_family_targets(fam)}")


class _NoHFModule(ValueError):
    """An adapter on rows the Hugging Face family has no module of their own for (q_proj on GPT-2's c_attn)."""


def _family_targets(fam):
    """The target names (``TARGET_MODULES``) that name modules of the Hugging Face family ``fam``."""
    names = {h.rpartition(".")[2] for m in fam.layout.layer for h in m.hf}
    return [n for n in TARGET_MODULES if n in names]


def savable_adapter_keys(model, model_type):
    """``adapter_keys`` of a model ``save_adapter`` can write as ``model_type``, else one ValueError saying what to
    do (``numformer export`` checks it before it clears a folder)."""
    options = getattr(model, "lora_config", None)
    if not options:
        raise ValueError("the model has no LoRA adapters to save (numformer.lora.add_lora adds them)")
    try:
        return adapter_keys(model, model_type)
    except _NoHFModule as e:
        names = _family_targets(family(model_type))
        raise ValueError(f"{e}, and this model's adapters target {list(options['target_modules'])}: write it as "
                         f"one model with the adapters merged (`numformer export --merge`; in Python "
                         f"merge_lora(model), then export_hf), or train the adapters on {model_type}'s names "
                         f"([lora] target_modules = {json.dumps(names)}) to get a PEFT adapter") from None


def save_adapter(model, out_dir, base_model_name_or_path=None, model_type=None):
    """Write the adapters of ``model`` (``numformer.lora.add_lora``) in PEFT's format into ``out_dir``, in the
    model's dtype; ``model_type`` names the Hugging Face family of the base (default: the one ``export_hf``
    writes). Returns the folder. The weights are written atomically, a tensor at a time from the adapters' own
    arrays (``safetensors_pieces``): no copy of the file in memory."""
    options = getattr(model, "lora_config", None)
    model_type = model_type or default_export_type(model.config)
    keys = savable_adapter_keys(model, model_type)
    tensors = {k: np.ascontiguousarray(getattr(a, which).data) for k, (a, which) in keys.items()}
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
              "r": options["r"], "lora_alpha": options["alpha"], "lora_dropout": options["dropout"],
              "target_modules": list(options["target_modules"]), "use_rslora": options["use_rslora"],
              "fan_in_fan_out": model_type == "gpt2", "init_lora_weights": True, "inference_mode": True,
              "revision": None, **{option: off[0] for option, off in REFUSED.items()}}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / ADAPTER_WEIGHTS, safetensors_pieces(tensors, {"format": "pt"}))
    write_json_atomic(out / ADAPTER_CONFIG, config)
    return out


def read_adapter_config(folder):
    """The [lora] options of a PEFT LoRA adapter folder ({r, alpha, dropout, target_modules, use_rslora}, with
    PEFT's defaults r 8, lora_alpha 8 when absent); one ValueError naming what numformer cannot load."""
    path = Path(folder) / ADAPTER_CONFIG
    if not Path(folder).exists():
        raise ValueError(f"adapter folder {folder} does not exist")
    if not path.is_file():
        raise ValueError(f"{folder} is not a PEFT adapter folder (no {ADAPTER_CONFIG})")
    c = bounded_json(path.read_bytes(), str(path))
    if not isinstance(c, dict):
        raise ValueError(f"{path} is not a JSON object")
    if c.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type {c.get('peft_type')!r} is not supported; numformer loads LoRA adapters")
    _refuse_options(c, path)
    targets = c.get("target_modules")
    if isinstance(targets, str):
        raise ValueError(f"{path}: target_modules {targets!r} is a pattern; numformer loads adapters whose "
                         f"target_modules list layer names among {list(TARGET_MODULES)}")
    # PEFT matches a name to every module whose path ends with it; "all-linear" is saved as full module paths
    # (model.layers.0.self_attn.q_proj): their last part names the layer (the weights' keys say which blocks)
    targets = list(dict.fromkeys(t.rsplit(".", 1)[-1] if isinstance(t, str) else t for t in targets or []))
    unknown = [t for t in targets if t not in TARGET_MODULES]
    if unknown:
        raise ValueError(f"{path}: target_modules {unknown} are not layers numformer puts adapters on; it loads "
                         f"adapters of {list(TARGET_MODULES)}")
    return {"r": c.get("r", 8), "alpha": c.get("lora_alpha", 8), "dropout": c.get("lora_dropout", 0.0),
            "target_modules": targets or [], "use_rslora": bool(c.get("use_rslora", False))}


def _refuse_options(c, path):
    """One ValueError naming the options of the adapter config ``c`` (read from ``path``) that numformer does not
    implement: those of ``REFUSED`` set to other than their "not used" values, and an ``init_lora_weights``
    that PEFT runs again at load (``BASE_CHANGING_INITS``)."""
    used = [f"{k} = {c[k]!r}" for k, off in REFUSED.items() if k in c and not _is_one_of(c[k], off)]
    if used:
        raise ValueError(f"{path}: numformer does not implement the PEFT option(s) {', '.join(used)}; it loads "
                         f"plain LoRA adapters (bias 'none', no DoRA, aLoRA or other LoRA variant, no per-layer "
                         f"patterns or extra modules): run this adapter with PEFT")
    init = c.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(BASE_CHANGING_INITS):
        raise ValueError(f"{path}: init_lora_weights = {init!r}: PEFT runs this initialisation again when it loads "
                         f"the adapter, changing the base model's weights, and numformer does not; convert it to a "
                         f"plain LoRA adapter (PEFT's save_pretrained(..., path_initial_model_for_weight_conversion="
                         f"...)) and load that")


def _is_one_of(value, values):
    """Whether ``value`` equals one of ``values`` with the same type (JSON's 0 is not false, nor 1 true)."""
    return any(type(value) is type(v) and value == v for v in values)


def load_adapter(model, folder, model_type=None):
    """Put the PEFT LoRA adapter in ``folder`` on ``model`` (a model of the adapter's base): its options
    become ``add_lora``'s, every tensor is read into its adapter (names and shapes checked: a key the model
    does not have, or one it lacks, is an error, never an adapter left at zero), cast to the model's dtype.
    ``model_type``: the Hugging Face family whose module names the keys use (default: the one ``export_hf``
    writes for the model). Returns the model."""
    options = read_adapter_config(folder)
    path = Path(folder) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ValueError(f"{folder} has no {ADAPTER_WEIGHTS}")
    tensors = read_safetensors_file(path)
    try:
        add_lora(model, **options)
    except ValueError as e:             # the options are the adapter's: name its file, not a [lora] section
        raise ValueError(f"the adapter {Path(folder) / ADAPTER_CONFIG} does not fit this model: {e}") from None
    expected = adapter_keys(model, model_type)
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path} does not fit this model's adapters: missing {_shown(missing)}, unexpected "
                         f"{_shown(unexpected)} (is it an adapter of another base model?)")
    for key, (adapter, which) in expected.items():
        p = getattr(adapter, which)
        if tensors[key].shape != p.shape:
            raise ValueError(f"{path}: {key} has shape {tensors[key].shape}, the model's adapter {p.shape}")
        p.data[...] = tensors[key]
    return model


def _shown(keys, most=4):
    """The first ``most`` of ``keys`` as a list, saying how many there are when some are left out."""
    return f"{keys[:most]} ({most} of {len(keys)} shown)" if len(keys) > most else f"{keys}"


__all__ = ["save_adapter", "load_adapter", "read_adapter_config", "adapter_keys", "ADAPTER_CONFIG",
           "ADAPTER_WEIGHTS", "REFUSED", "BASE_CHANGING_INITS"]
