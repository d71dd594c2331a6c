"""Gemma 2 (``Gemma2ForCausalLM``): token embeddings × √hidden_size, RMSNorm scaled by ``1 + w`` (weights from
0), four norms per block (before and after the attention and the feed-forward: the "sandwich"), a GeGLU
feed-forward with tanh GELU, scores scaled by ``query_pre_attn_scalar^-½`` and soft-capped (c·tanh(S/c),
after the scale, before the mask), a window on the sliding layers (without ``layer_types``, the even layers
from 0), the output layer tied to the embedding unless ``tie_word_embeddings`` is false, biases on the four
attention projections only with ``attention_bias``, and the final logits soft-capped.

    GPTConfig.from_keywords(norm="rms_plus_one", norm_placement="sandwich", activation="geglu",
                            scale_embeddings=True, attn_scale=query_pre_attn_scalar ** -0.5,
                            attn_logit_softcap=attn_logit_softcapping,
                            final_logit_softcap=final_logit_softcapping,
                            layers=[{"sliding_window": window of layer i}, ...])

``common_fields``, ``gemma_keywords`` and ``hf_fields`` are what Gemma 3 shares.
"""
from __future__ import annotations

from ...models import GPTConfig
from ..hf_rope import hf_rope_parameters, rope_settings
from .family import Family, Layout, Module_, check_export, shared
from .fields import (HONOURED, NO_EFFECT, TOKENIZER, TRAINING, Field, divides, documented, only, pad_id, positive,
                     norm_eps, read_rope, resolve, rope_refusal)
from .llama import head_dim_rule

MODEL_TYPE = "gemma2"
LAYER_TYPES = ("full_attention", "sliding_attention")


@documented("null or false")
def not_bidirectional(v, _):
    return None if not v else "makes the attention bidirectional (an encoder); numformer's GPT is causal"


@documented("a positive integer (also when no layer slides)")
def window_rule(v, r):
    if v is None:       # Gemma2Model / Gemma3TextModel build the sliding-window mask whatever the layer types
        return ("transformers' Gemma forward builds the sliding-window mask from it even when every layer is full "
                "attention, and fails on null ('Could not find a `sliding_window` argument in the config'); set it "
                "to a positive integer, such as max_position_embeddings (full-attention layers ignore it)")
    return positive(v, r)


def common_fields(max_positions, vocab_size):
    """The fields of Gemma2Config and Gemma3TextConfig, in the classes' order (the defaults that differ given)."""
    return (
        Field("vocab_size", vocab_size, HONOURED, positive, note="vocab_size"),
        Field("hidden_size", 2304, HONOURED, positive, note="d_model (and the embeddings' factor √hidden_size)"),
        Field("intermediate_size", 9216, HONOURED, positive, note="d_ff"),
        Field("num_hidden_layers", 26, HONOURED, positive, note="n_layers"),
        Field("num_attention_heads", 8, HONOURED, positive, note="n_heads"),
        Field("num_key_value_heads", 4, HONOURED, divides("num_attention_heads"), note="n_kv_heads"),
        Field("head_dim", 256, HONOURED, head_dim_rule, note="head_dim (its own: not hidden_size // heads)",
              accepts="a positive even integer"),
        Field("hidden_activation", "gelu_pytorch_tanh", HONOURED, only("gelu_pytorch_tanh", why=" (the tanh GELU "
              "gate of activation 'geglu')"), type="str", note="activation 'geglu'"),
        Field("max_position_embeddings", max_positions, HONOURED, positive, note="block_size"),
        Field("initializer_range", 0.02, NO_EFFECT, type="float"),
        Field("rms_norm_eps", 1e-6, HONOURED, norm_eps, type="float", note="layer_norm_eps (norm 'rms_plus_one')"),
        Field("use_cache", True, NO_EFFECT, type="bool"),
        Field("pad_token_id", 0, HONOURED, pad_id, type="int | None",
              note="padding_idx (that embedding row gets no lookup gradient)"),
        Field("eos_token_id", 1, TOKENIZER, type="int | list[int] | None"),
        Field("bos_token_id", 2, TOKENIZER, type="int | None"),
        Field("tie_word_embeddings", True, HONOURED, type="bool",
              note="tie_weights (a stored lm_head.weight that differs unties, as transformers)"),
        Field("rope_parameters", None, HONOURED, rope_refusal, type="dict | None", read=read_rope,
              note="rope_theta and rope_scaling of every layer"),
        Field("attention_bias", False, HONOURED, type="bool",
              note="qkv_bias and attn_bias (the four attention projections)"),
        Field("attention_dropout", 0.0, TRAINING, type="int | float | None"),
        Field("query_pre_attn_scalar", 256, HONOURED, positive, note="attn_scale = query_pre_attn_scalar^-½"),
        Field("sliding_window", 4096, HONOURED, window_rule, type="int | None",
              note="sliding_window of the sliding layers"),
        Field("layer_types", None, HONOURED, type="list[str] | None", note="which layers slide: "
              "layers[i].sliding_window", accepts="null, or 'full_attention' / 'sliding_attention' for each layer"),
    )


FIELDS = common_fields(8192, 256000) + (
    Field("final_logit_softcapping", 30.0, HONOURED, type="float | None",
          note="final_logit_softcap (null: none)"),
    Field("attn_logit_softcapping", 50.0, HONOURED, type="float | None",
          note="attn_logit_softcap of every layer (null: none)"),
    Field("use_bidirectional_attention", None, HONOURED, not_bidirectional, type="bool | None",
          note="causal attention"),
    Field("rope_scaling", None, HONOURED, type="dict | None",
          note="the older name of rope_parameters; wins over it when both are set", accepts="as rope_parameters"),
    Field("rope_theta", 10000.0, HONOURED, type="float", note="rope_theta when rope_parameters has none"),
    Field("partial_rotary_factor", None, HONOURED, type="float | None", note="into rope_parameters",
          accepts="null or 1"),
)


def layer_types(r, model_type, default):
    """The layer types of a resolved config: ``layer_types`` when given, else ``default`` (one per layer)."""
    n, types = r["num_hidden_layers"], r["layer_types"]
    if types is None:
        return list(default)
    if len(types) != n or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"{model_type} config.json field layer_types = {types!r}: must list 'full_attention' or "
                         f"'sliding_attention' for each of the {n} layers")
    return types


def gemma_keywords(r, types, rope):
    """GPTConfig keywords of a resolved Gemma config: ``types`` the layer types, ``rope`` {layer type: (θ,
    RopeScaling or None)}."""
    pad = r["pad_token_id"]
    bias = bool(r["attention_bias"])
    layers = [{"sliding_window": r["sliding_window"] if t == "sliding_attention" else None,
               "rope_theta": rope[t][0], "rope_scaling": rope[t][1]} for t in types]
    return {"vocab_size": r["vocab_size"], "block_size": r["max_position_embeddings"],
            "n_layers": r["num_hidden_layers"], "n_heads": r["num_attention_heads"],
            "n_kv_heads": r["num_key_value_heads"], "head_dim": r["head_dim"], "d_model": r["hidden_size"],
            "d_ff": r["intermediate_size"], "dropout": 0.0, "positional": "rope", "activation": "geglu",
            "norm": "rms_plus_one", "norm_placement": "sandwich", "layer_norm_eps": r["rms_norm_eps"],
            "tie_weights": bool(r["tie_word_embeddings"]), "bias": False, "attn_bias": bias, "qkv_bias": bias,
            "scale_embeddings": True, "attn_scale": float(r["query_pre_attn_scalar"]) ** -0.5, "layers": layers,
            **({"padding_idx": pad % r["vocab_size"]} if pad is not None else {})}


def to_config(c):
    """The GPTConfig of a Gemma 2 config.json."""
    r = resolve(FIELDS, c, MODEL_TYPE)
    n = r["num_hidden_layers"]
    types = layer_types(r, MODEL_TYPE, ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)])
    rope = rope_settings(r["rope_parameters"], r["max_position_embeddings"])
    return GPTConfig.from_keywords(**gemma_keywords(r, types, {t: rope for t in LAYER_TYPES}),
                                   attn_logit_softcap=r["attn_logit_softcapping"],
                                   final_logit_softcap=r["final_logit_softcapping"])


def hf_fields(name, config, qk_norm):
    """The config.json fields Gemma 2 and 3 share, from a GPTConfig (layer_types and one window for the sliding
    layers: block_size when no layer slides, as transformers' forward builds the sliding mask from the window
    whatever the layers, and fails on a null one); ValueError naming what the family ``name`` cannot
    express."""
    n_heads, head_dim, kv, d_ff, activation, placement, has_qk_norm, bias, attn, qkv, scale = shared(
        config, name, "n_heads", "head_dim", "n_kv_heads", "d_ff", "activation", "norm_placement", "qk_norm",
        "bias", "attn_bias", "qkv_bias", "attn_scale")
    windows = [b.sliding_window for b in config.layers]
    sizes = {w for w in windows if w is not None}
    scalar = None if scale is None else round(scale ** -2)
    check_export(name, [
        (placement == "sandwich" and config.final_norm, f"blocks that are not sandwiches ({name} has a norm "
                                                        f"before and after each sub-layer)"),
        (config.norm == "rms_plus_one", f"norm = {config.norm!r} ({name} uses norm = 'rms_plus_one')"),
        (config.positional == "rope", f"positional = {config.positional!r} ({name} uses 'rope')"),
        (activation == "geglu", f"activation = {activation!r} ({name} uses 'geglu')"),
        (config.scale_embeddings, f"unscaled embeddings ({name} multiplies them by √d_model)"),
        (has_qk_norm == qk_norm, "q/k norms" if has_qk_norm else f"a model without q/k norms ({name} has them)"),
        (not bias and attn == qkv, f"feed-forward biases or biases on some attention projections only"),
        (scale is None or abs(scalar ** -0.5 - scale) <= 1e-12 * scale,
         f"attn_scale = {scale} (query_pre_attn_scalar^-½ of an integer)"),
        (len(sizes) <= 1, f"windows of several sizes {sorted(sizes)} ({name} has one sliding_window)")])
    return {"vocab_size": config.vocab_size, "hidden_size": config.d_model, "intermediate_size": d_ff,
            "num_hidden_layers": config.n_layers, "num_attention_heads": n_heads, "num_key_value_heads": kv,
            "head_dim": head_dim, "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": config.block_size, "rms_norm_eps": config.layer_norm_eps,
            "tie_word_embeddings": config.tie_weights, "attention_bias": attn, "attention_dropout": 0.0,
            "query_pre_attn_scalar": head_dim if scale is None else scalar,
            "sliding_window": sizes.pop() if sizes else config.block_size,
            "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
            "initializer_range": 0.02, "use_cache": True, "pad_token_id": config.padding_idx}


def to_hf(config):
    """The Gemma 2 config.json of a GPTConfig."""
    theta, scaling, cap = shared(config, "Gemma2", "rope_theta", "rope_scaling", "attn_logit_softcap")
    # a cap of None is written as null: an absent key would mean transformers' 30 / 50
    return {"architectures": ["Gemma2ForCausalLM"], "model_type": MODEL_TYPE,
            **hf_fields("Gemma2", config, qk_norm=False), "rope_parameters": hf_rope_parameters(theta, scaling),
            "final_logit_softcapping": config.final_logit_softcap, "attn_logit_softcapping": cap}


def layout(q_k_norms):
    """The Gemma tensors: four norms per block (input, post-attention, pre- and post-feed-forward), and with
    ``q_k_norms`` (Gemma 3) the query and key norms; q/k/v and output biases with attention_bias, none in the
    feed-forward."""
    norms = (Module_("self_attn.q_norm", ("model.layers.{i}.self_attn.q_norm",), "never"),
             Module_("self_attn.k_norm", ("model.layers.{i}.self_attn.k_norm",), "never")) if q_k_norms else ()
    return Layout(
        top=(Module_("tok_emb", ("model.embed_tokens",), "never"),),
        layer=(Module_("self_attn.qkv_proj", tuple(f"model.layers.{{i}}.self_attn.{p}_proj" for p in "qkv"),
                       "qkv", split=True),
               Module_("self_attn.out_proj", ("model.layers.{i}.self_attn.o_proj",), "attn"), *norms,
               Module_("ff.gate_proj", ("model.layers.{i}.mlp.gate_proj",), "never"),
               Module_("ff.up_proj", ("model.layers.{i}.mlp.up_proj",), "never"),
               Module_("ff.down_proj", ("model.layers.{i}.mlp.down_proj",), "never"),
               Module_("norm1", ("model.layers.{i}.input_layernorm",), "never"),
               Module_("post_norm1", ("model.layers.{i}.post_attention_layernorm",), "never"),
               Module_("norm2", ("model.layers.{i}.pre_feedforward_layernorm",), "never"),
               Module_("post_norm2", ("model.layers.{i}.post_feedforward_layernorm",), "never")),
        final=(Module_("norm_f", ("model.norm",), "never"),),
        prefixes=("model.",), ignored=r"\.rotary_emb\.")


FAMILY = Family(MODEL_TYPE, FIELDS, to_config, to_hf, layout(q_k_norms=False))
