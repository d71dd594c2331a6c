"""Gemma 3, the text model (``Gemma3ForCausalLM``, model_type ``gemma3_text``): Gemma 2's blocks (√hidden_size
embeddings, ``1 + w`` RMSNorms, four norms per block, tanh-GELU GeGLU, ``query_pre_attn_scalar``) with an
RMSNorm (``1 + w``) over each query and key head before RoPE, five sliding layers to one full-attention layer
(``layer_types``, else ``sliding_window_pattern``), and a RoPE per layer type: the sliding layers' base
``rope_local_base_freq`` (10⁴), the full layers' ``rope_theta`` (10⁶) with their ``rope_scaling`` (v4 files),
or ``rope_parameters`` nested by layer type (v5). No attention soft-capping (transformers' Gemma3Attention
does not apply ``attn_logit_softcapping``); the final one when set.

    GPTConfig.from_keywords(**gemma2.gemma_keywords(...), qk_norm=True,
                            final_logit_softcap=final_logit_softcapping,
                            layers=[{"sliding_window": ..., "rope_theta": ..., "rope_scaling": ...}, ...])
"""
from __future__ import annotations

from ...models import GPTConfig
from ..hf_rope import gemma3_nested, gemma3_rope_parameters, hf_rope_parameters, read_gemma3_rope, rope_problem
from . import gemma2
from .family import Family, check_export
from .fields import HONOURED, NO_EFFECT, Field, documented, positive, resolve, with_fields

MODEL_TYPE = "gemma3_text"


def read_rope(c, values):
    """The rope_parameters of a Gemma 3 config.json as Gemma3TextConfig builds them (nested by layer type)."""
    return gemma3_rope_parameters({**c, "max_position_embeddings": values["max_position_embeddings"]})


@documented("per layer type, rope_type 'default', 'linear', 'dynamic', 'llama3' or 'yarn' with the keys "
            "transformers requires, partial_rotary_factor 1")
def rope_refusal(v, r):
    if not gemma3_nested(v):            # transformers computes such a file's layers as 'default', unscaled
        return ("is not nested by layer type: Gemma 3 reads one dict per layer type, {\"full_attention\": {...}, "
                "\"sliding_attention\": {...}} (transformers ignores the rope_type and scaling of a flat one); "
                "nest it")
    for layer_type, entry in v.items():
        entry = {**entry, "truncate": True} if entry.get("rope_type") == "yarn" else entry
        problem = rope_problem(entry, r["max_position_embeddings"])
        if problem:
            return f"[{layer_type!r}] {problem}"
    return None


FIELDS = with_fields(
    gemma2.common_fields(131072, 262208),
    rope_parameters=Field("rope_parameters", None, HONOURED, rope_refusal, type="dict | None", read=read_rope,
                          note="rope_theta and rope_scaling of the layers of each type ('full_attention', "
                               "'sliding_attention')"),
    final_logit_softcapping=Field("final_logit_softcapping", None, HONOURED, type="float | None",
                                  note="final_logit_softcap (null: none)"),
    attn_logit_softcapping=Field("attn_logit_softcapping", None, NO_EFFECT, type="float | None",
                                 note="Gemma3Attention does not pass it to the attention"),
    use_bidirectional_attention=Field("use_bidirectional_attention", False, HONOURED, gemma2.not_bidirectional,
                                      type="bool | None", note="causal attention"),
    rope_scaling=Field("rope_scaling", None, HONOURED, type="dict | None", accepts="as rope_parameters",
                       note="merged into rope_parameters['full_attention'] (the v4 form)"),
    rope_theta=Field("rope_theta", 1_000_000.0, HONOURED, type="float",
                     note="rope_theta of the full-attention layers when rope_parameters has none"),
    rope_local_base_freq=Field("rope_local_base_freq", 10_000.0, HONOURED, type="float",
                               note="rope_theta of the sliding layers when rope_parameters has none"),
    sliding_window_pattern=Field("sliding_window_pattern", 6, HONOURED, positive,
                                 note="without layer_types: layer i slides unless i + 1 is a multiple of it"))


def to_config(c):
    """The GPTConfig of a Gemma 3 (text) config.json."""
    r = resolve(FIELDS, c, MODEL_TYPE)
    n, pattern = r["num_hidden_layers"], r["sliding_window_pattern"]
    types = gemma2.layer_types(r, MODEL_TYPE, ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                               for i in range(n)])
    rope = read_gemma3_rope({**c, "max_position_embeddings": r["max_position_embeddings"]}, types)
    return GPTConfig.from_keywords(**gemma2.gemma_keywords(r, types, rope), qk_norm=True,
                                   final_logit_softcap=r["final_logit_softcapping"])


def to_hf(config):
    """The Gemma 3 config.json of a GPTConfig: rope_parameters per layer type (v5's form)."""
    rope = {}
    for b in config.layers:
        rope.setdefault("full_attention" if b.sliding_window is None else "sliding_attention",
                        set()).add((b.rope_theta, b.rope_scaling))
    check_export("Gemma3", [
        (all(len(v) == 1 for v in rope.values()), "layers of one type (sliding or full attention) with "
                                                  "different RoPE (Gemma 3 has one RoPE per layer type)"),
        (all(b.attn_logit_softcap is None for b in config.layers), "attention soft-capping (Gemma 3 has none)")])
    params = {t: hf_rope_parameters(*v.pop()) for t, v in rope.items()}
    for layer_type, theta in (("full_attention", 1_000_000.0), ("sliding_attention", 10_000.0)):
        params.setdefault(layer_type, {"rope_type": "default", "rope_theta": theta})
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": MODEL_TYPE,
            **gemma2.hf_fields("Gemma3", config, qk_norm=True), "rope_parameters": params,
            "final_logit_softcapping": config.final_logit_softcap, "attn_logit_softcapping": None,
            "use_bidirectional_attention": False}


FAMILY = Family(MODEL_TYPE, FIELDS, to_config, to_hf, gemma2.layout(q_k_norms=True))
