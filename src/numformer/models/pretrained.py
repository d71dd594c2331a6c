"""Pretrained weights without an import of the interop layer: the interop layer registers its loader here.

``GPT.from_pretrained``, a config's ``[model] init_from`` (``numformer.config``) and
the trainer's fine-tuning start all reach Hugging Face checkpoints and other run
folders through ``loader()``. Models and training sit below the interop layer
and do not import it; ``numformer.interop.hf`` registers itself when it is
imported, and ``import numformer`` imports it, so the loader is always there.

The loader is a module (or object) with four functions:

- ``load_pretrained(source, dtype, **overrides)`` -> (model, tokenizer or None)
- ``pretrained_source(source)`` -> (model config, tokenizer state or None), reading no weights
- ``merge_init_from(source, model, source_model, from_data)`` -> the fine-tuned run's [model] section
- ``load_init_weights(model, source)`` -> ``model`` with the source's weights
"""
from __future__ import annotations

_LOADER = None


def register_loader(loader):
    """Make ``loader`` (see the module docstring) the one that pretrained weights are read with."""
    global _LOADER
    _LOADER = loader


def loader():
    """The registered loader; RuntimeError when none is (numformer.interop.hf was never imported)."""
    if _LOADER is None:
        raise RuntimeError("no pretrained-weights loader is registered; import numformer (or numformer.interop.hf)")
    return _LOADER
