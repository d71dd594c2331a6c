"""GPT-2 (``GPT2LMHeadModel``): a learned position table, LayerNorm before each sub-layer and at the end,
a feed-forward of 4·n_embd (``n_inner``) with tanh GELU (``activation_function``: also exact GELU or ReLU),
biases everywhere, the output layer tied to the token embedding unless ``tie_word_embeddings`` is false.

    GPTConfig.from_keywords(positional="learned", activation="gelu_tanh", norm="layer", bias=True,
                            tie_weights=tie_word_embeddings, ...)

GPT-2's ``Conv1D`` layers store W as (in, out): those weights are transposed into numformer's (out, in)
``Linear`` layout (``transpose`` in the layout).
"""
from __future__ import annotations

from ...models import GPTConfig
from .family import Family, Layout, Module_, check_export, shared
from .fields import (HONOURED, NO_EFFECT, SAME, TOKENIZER, TRAINING, Field, documented, norm_eps, only, positive,
                     resolve)

MODEL_TYPE = "gpt2"
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
TO_GPT2_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}

FIELDS = (  # the fields of transformers' GPT2Config, in its order
    Field("vocab_size", 50257, HONOURED, positive, note="vocab_size"),
    Field("n_positions", 1024, HONOURED, positive, ("max_position_embeddings",), note="block_size"),
    Field("n_embd", 768, HONOURED, positive, ("hidden_size",), note="d_model"),
    Field("n_layer", 12, HONOURED, positive, ("num_hidden_layers",), note="n_layers"),
    Field("n_head", 12, HONOURED, documented("a positive divisor of n_embd")(
        lambda v, r: positive(v, r) or (None if r["n_embd"] % v == 0 else
                                        f"must divide n_embd = {r['n_embd']} (GPT-2's heads split it; transformers' "
                                        f"GPT2Attention refuses it too)")), ("num_attention_heads",), note="n_heads"),
    Field("n_inner", lambda r: 4 * r["n_embd"], HONOURED, positive, type="int | None", null=SAME, note="d_ff"),
    Field("activation_function", "gelu_new", HONOURED, only(*ACTIVATIONS), type="str", note="activation"),
    Field("resid_pdrop", 0.1, TRAINING, type="float"),
    Field("embd_pdrop", 0.1, TRAINING, type="float"),
    Field("attn_pdrop", 0.1, TRAINING, type="float"),
    Field("layer_norm_epsilon", 1e-5, HONOURED, norm_eps, type="float", note="layer_norm_eps"),
    Field("initializer_range", 0.02, NO_EFFECT, type="float"),
    Field("summary_type", "cls_index", NO_EFFECT, type="str", note="GPT2DoubleHeadsModel only"),
    Field("summary_use_proj", True, NO_EFFECT, type="bool", note="GPT2DoubleHeadsModel only"),
    Field("summary_activation", None, NO_EFFECT, type="str | None", note="GPT2DoubleHeadsModel only"),
    Field("summary_proj_to_labels", True, NO_EFFECT, type="bool", note="GPT2DoubleHeadsModel only"),
    Field("summary_first_dropout", 0.1, NO_EFFECT, type="float", note="GPT2DoubleHeadsModel only"),
    Field("scale_attn_weights", True, HONOURED, only(True, why=" (scores scaled by 1/sqrt(d_head))"), type="bool"),
    Field("use_cache", True, NO_EFFECT, type="bool"),
    Field("bos_token_id", 50256, TOKENIZER, type="int | None"),
    Field("eos_token_id", 50256, TOKENIZER, type="int | list[int] | None"),
    Field("pad_token_id", None, TOKENIZER, type="int | None", note="GPT-2's embedding has no padding row"),
    Field("scale_attn_by_inverse_layer_idx", False, HONOURED,
          only(False, why=" (scores divided by the layer index: not in numformer's GPT)"), type="bool"),
    Field("reorder_and_upcast_attn", False, NO_EFFECT, type="bool",
          note="the scores' float32 upcast: rounding only"),
    Field("add_cross_attention", False, HONOURED, only(False, why=" (a decoder-only GPT)"), type="bool"),
    Field("tie_word_embeddings", True, HONOURED, type="bool",
          note="tie_weights (a stored lm_head.weight that differs unties, as transformers)"),
)


def to_config(c):
    """The GPTConfig of a GPT-2 config.json."""
    r = resolve(FIELDS, c, MODEL_TYPE)
    return GPTConfig.from_keywords(
        vocab_size=r["vocab_size"], block_size=r["n_positions"], n_layers=r["n_layer"], n_heads=r["n_head"],
        d_model=r["n_embd"], d_ff=r["n_inner"], dropout=0.0, positional="learned",
        activation=ACTIVATIONS[r["activation_function"]], norm_first=True, norm="layer",
        tie_weights=bool(r["tie_word_embeddings"]), bias=True, layer_norm_eps=r["layer_norm_epsilon"])


def to_hf(config):
    """The GPT-2 config.json of a GPTConfig; ValueError naming what GPT-2 cannot express."""
    n_heads, head_dim, d_ff, activation, placement, kv, window = shared(
        config, "GPT-2", "n_heads", "head_dim", "d_ff", "activation", "norm_placement", "n_kv_heads",
        "sliding_window")
    qk_norm, scale, cap = shared(config, "GPT-2", "qk_norm", "attn_scale", "attn_logit_softcap")
    check_export("GPT-2", [
        (placement == "pre" and config.final_norm, "post-LN or sandwich blocks (norm_first = false; GPT-2 is "
                                                   "pre-LN with a final norm)"),
        (config.norm == "layer", f"norm = {config.norm!r} (GPT-2 uses LayerNorm)"),
        (config.positional in ("learned", "sinusoidal"), f"positional = {config.positional!r} (GPT-2 has a "
                                                         f"position table)"),
        (activation in TO_GPT2_ACTIVATION, f"activation = {activation!r}"),
        (kv == n_heads, "grouped-query attention (n_kv_heads)"),
        (window is None, f"sliding_window = {window}"),
        (head_dim * n_heads == config.d_model, f"head_dim = {head_dim} (GPT-2's heads split n_embd)"),
        (not qk_norm and scale is None and cap is None and config.final_logit_softcap is None
         and not config.scale_embeddings, "q/k norms, another attention scale, soft-capping or scaled embeddings")])
    p = config.dropout
    return {"architectures": ["GPT2LMHeadModel"], "model_type": MODEL_TYPE, "vocab_size": config.vocab_size,
            "n_positions": config.block_size, "n_embd": config.d_model, "n_layer": config.n_layers,
            "n_head": n_heads, "n_inner": d_ff, "activation_function": TO_GPT2_ACTIVATION[activation],
            "layer_norm_epsilon": config.layer_norm_eps, "tie_word_embeddings": config.tie_weights,
            "resid_pdrop": p, "embd_pdrop": p, "attn_pdrop": p, "initializer_range": 0.02,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "use_cache": True}


LAYOUT = Layout(
    top=(Module_("tok_emb", ("transformer.wte",), "never"), Module_("pos_emb", ("transformer.wpe",), "never")),
    layer=(Module_("norm1", ("transformer.h.{i}.ln_1",), "always"),
           Module_("self_attn.qkv_proj", ("transformer.h.{i}.attn.c_attn",), "always", transpose=True),
           Module_("self_attn.out_proj", ("transformer.h.{i}.attn.c_proj",), "always", transpose=True),
           Module_("norm2", ("transformer.h.{i}.ln_2",), "always"),
           Module_("ff.linear1", ("transformer.h.{i}.mlp.c_fc",), "always", transpose=True),
           Module_("ff.linear2", ("transformer.h.{i}.mlp.c_proj",), "always", transpose=True)),
    final=(Module_("norm_f", ("transformer.ln_f",), "always"),),
    prefixes=("transformer.",), ignored=r"^transformer\.h\.\d+\.attn\.(masked_)?bias$")

FAMILY = Family(MODEL_TYPE, FIELDS, to_config, to_hf, LAYOUT)
