"""The models described as data: ``GPTConfig`` (one ``BlockConfig`` per layer), ``EncoderClassifierConfig`` and
``TransformerConfig``.

A model is built from its config (``GPT(config)``) and keeps it (``model.config``). Each config has a keyword
form, the arguments users and TOML files write (``GPT(vocab_size=65, block_size=64, n_layers=4, ...)``,
``[model] n_layers = 4``), and ``to_dict()`` / ``from_dict()`` turn a config into that form and back:
what a run folder's config.json, ``--resume``, ``numformer export`` and the Hugging Face import read and
write. ``from_dict(config.to_dict()) == config``.

A GPT's keyword form describes identical layers by the block keywords (``n_heads``, ``sliding_window``,
``rope_theta`` ...); ``layers``, a list with one dict per layer, overrides them layer by layer
(``layers = [{sliding_window = 512}, {}]``: the first layer slides, the second attends to everything).
``to_dict`` writes each block keyword at the value most layers share and lists the layers that differ.
"""
from __future__ import annotations

import inspect
import math
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, field, fields

import numpy as np

from ..nn.blocks import BlockConfig, default_d_ff
from ..nn.layers import NORMS
from ..nn.positional import POSITIONAL_KINDS
from ..ops.rope_scaling import RopeScaling
from ._checks import check_sizes

# The keywords of the keyword form that describe one block, in the order of the keyword form; norm_first is
# the keyword form's (torch's) name for a "pre" or "post" norm_placement.
BLOCK_KEYWORDS = ("n_heads", "d_ff", "activation", "norm_first", "bias", "n_kv_heads", "rope_theta", "attn_bias",
                  "qkv_bias", "sliding_window", "head_dim", "qk_norm", "norm_placement", "attn_scale",
                  "attn_logit_softcap", "feed_forward", "rope_scaling")
ATTENTION_KINDS = ("plain", "flash")


def _doc(default, text):
    """A dataclass field with its one-line description (the docs' tables are generated from these)."""
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True)
class GPTConfig:
    """Every architectural choice of a ``GPT``: each field's description is in its metadata
    (``fields(GPTConfig)``, ``config_fields_markdown``), and the docs' engine page ("A model is a GPTConfig")
    shows them as tables, with ``BlockConfig``'s. ``layers`` are stored resolved
    (``BlockConfig.resolved(d_model)``), ``final_norm`` too, so that two configs of the same model are equal.
    """

    vocab_size: int = field(metadata={"doc": "tokens of the vocabulary"})
    block_size: int = field(metadata={"doc": "context length (positions)"})
    d_model: int = _doc(128, "width of the residual stream")
    layers: tuple = _doc((BlockConfig(),) * 4, "one BlockConfig per layer (below)")
    dropout: float = _doc(0.0, "dropout of the embeddings, the residuals, the attention weights and "
                                          "the hidden layer of an ungated feed-forward")
    positional: str = _doc("learned", "learned or sinusoidal (a table added to the embeddings), rope or alibi "
                                      "(inside attention)")
    norm: str = _doc("layer", "every norm: layer (LayerNorm), rms (RMSNorm), rms_plus_one (RMSNorm scaled by 1 + w, "
                              "Gemma) or batch")
    layer_norm_eps: float = _doc(1e-5, "the norms' ε")
    final_norm: bool | None = _doc(None, "a norm after the last block (None: unless the last block is post-norm)")
    tie_weights: bool = _doc(True, "the output layer is the token embedding")
    attention: str = _doc("plain", "attention kernel: plain or flash (memory linear in the length)")
    gradient_checkpointing: bool = _doc(False, "recompute each block's activations in backward")
    padding_idx: int | None = _doc(None, "a token whose embedding row gets no lookup gradient")
    scale_embeddings: bool = _doc(False, "token embeddings × √d_model (Gemma)")
    final_logit_softcap: float | None = _doc(None, "c: logits capped to c·tanh(logits/c) (Gemma 2)")

    def __post_init__(self):
        check_sizes("GPT", vocab_size=self.vocab_size, block_size=self.block_size, d_model=self.d_model)
        layers = tuple(BlockConfig.from_dict(b) if isinstance(b, dict) else b for b in self.layers)
        if not layers or not all(isinstance(b, BlockConfig) for b in layers):
            raise ValueError(f"GPT: layers must be a non-empty sequence of BlockConfig (one per layer), got "
                             f"{self.layers!r}")
        where = (lambda i: "GPT") if len(set(layers)) == 1 else (lambda i: f"GPT layer {i}")
        object.__setattr__(self, "layers", tuple(_resolved(where(i), b, self.d_model) for i, b in enumerate(layers)))
        self._check_options()
        if self.final_norm is None:
            object.__setattr__(self, "final_norm", self.layers[-1].norm_placement != "post")

    def _check_options(self):
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(f"unknown positional encoding {self.positional!r}; choose one of {list(POSITIONAL_KINDS)}")
        if self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r}; choose one of {sorted(NORMS)}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kernel {self.attention!r}; choose one of {list(ATTENTION_KINDS)}")
        if not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
            raise ValueError(f"GPT: dropout must be in [0, 1), got {self.dropout!r}")
        cap = self.final_logit_softcap
        if cap is not None and (type(cap) not in (int, float) or not math.isfinite(cap) or cap <= 0):
            raise ValueError(f"GPT: final_logit_softcap must be a positive number or None, got {cap!r}")
        for i, b in enumerate(self.layers):
            if b.rope_scaling is not None and self.positional != "rope":
                raise ValueError(f"GPT: layer {i} has rope_scaling, which scales RoPE's frequencies, but positional "
                                 f"= {self.positional!r}; use positional = 'rope' or drop rope_scaling")
            if self.positional == "rope" and b.head_dim % 2:
                raise ValueError(f"positional='rope' needs an even head size, but layer {i}'s head size is "
                                 f"d_model / n_heads = {self.d_model} / {b.n_heads} = {b.head_dim}"
                                 if b.head_dim * b.n_heads == self.d_model else
                                 f"positional='rope' needs an even head size, but layer {i} has head_dim = "
                                 f"{b.head_dim}; change head_dim")

    @property
    def n_layers(self):
        return len(self.layers)

    # -- the keyword form ----------------------------------------------------------------------------------
    @classmethod
    def from_keywords(cls, vocab_size, block_size, n_layers=4, n_heads=4, d_model=128, d_ff=None, dropout=0.0,
                      positional="learned", activation="gelu", norm_first=True, norm="layer", tie_weights=True,
                      bias=True, layer_norm_eps=1e-5, attention="plain", gradient_checkpointing=False,
                      n_kv_heads=None, rope_theta=10000.0, attn_bias=None, qkv_bias=None, sliding_window=None,
                      padding_idx=None, head_dim=None, qk_norm=False, norm_placement=None, attn_scale=None,
                      attn_logit_softcap=None, final_norm=None, scale_embeddings=False, final_logit_softcap=None,
                      feed_forward=True, rope_scaling=None, layers=None):
        """The config of the keyword form: n_layers identical blocks of the block keywords (``BLOCK_KEYWORDS``),
        each overridden by its entry of ``layers`` (a list of n_layers dicts of block keywords) when given.
        ``norm_placement`` (None: "pre" with ``norm_first``, else "post") may also be "sandwich"."""
        check_sizes("GPT", vocab_size=vocab_size, block_size=block_size, n_layers=n_layers, n_heads=n_heads,
                    d_model=d_model, d_ff=d_ff)
        top = dict(n_heads=n_heads, d_ff=d_ff, activation=activation, norm_first=norm_first, bias=bias,
                   n_kv_heads=n_kv_heads, rope_theta=rope_theta, attn_bias=attn_bias, qkv_bias=qkv_bias,
                   sliding_window=sliding_window, head_dim=head_dim, qk_norm=qk_norm,
                   norm_placement=norm_placement, attn_scale=attn_scale, attn_logit_softcap=attn_logit_softcap,
                   feed_forward=feed_forward, rope_scaling=rope_scaling)
        overrides = _layer_overrides(layers, n_layers)
        blocks = tuple(_block(f"GPT layer {i}" if overrides[i] else "GPT", {**top, **overrides[i]}, overrides[i])
                       for i in range(n_layers))
        return cls(vocab_size, block_size, d_model, blocks, dropout, positional, norm, layer_norm_eps, final_norm,
                   tie_weights, attention, gradient_checkpointing, padding_idx, scale_embeddings, final_logit_softcap)

    @classmethod
    def from_dict(cls, d):
        """The config of a keyword-form dict (``to_dict``'s, a config.json [model] section without its type);
        an unknown key is one ValueError listing the valid ones."""
        d = {k: v for k, v in d.items() if k != "type"}
        valid = keyword_arguments("gpt")
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} of a GPT config; valid keys: {sorted(valid)}")
        return cls.from_keywords(**d)

    def to_dict(self):
        """The keyword form: every keyword with its value (the block keywords at the value most layers share),
        and ``layers`` (one dict per layer: its differences) only when the layers differ."""
        out = {k: getattr(self, k) for k in ("vocab_size", "block_size")}
        out["n_layers"] = self.n_layers
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in out and f.name != "layers"})
        per_layer = [_keywords_of(b) for b in self.layers]
        common = {k: Counter(d[k] for d in per_layer).most_common(1)[0][0] for k in per_layer[0]}
        common["norm_first"] = common["norm_placement"] != "post"
        out.update(common)
        diffs = [{k: v for k, v in d.items() if v != common[k]} for d in per_layer]
        if any(diffs):
            out["layers"] = [{k: _plain(v) for k, v in d.items()} for d in diffs]
        out["rope_scaling"] = _plain(out["rope_scaling"])
        return out


def _resolved(where, block, d_model):
    try:
        return block.resolved(d_model)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _layer_overrides(layers, n_layers):
    """The per-layer override dicts of the keyword form's ``layers`` (n_layers empty ones without it)."""
    if layers is None:
        return [{}] * n_layers
    if not isinstance(layers, (list, tuple)) or len(layers) != n_layers or \
            not all(isinstance(d, dict) for d in layers):
        raise ValueError(f"GPT: layers must be a list of {n_layers} dicts (n_layers = {n_layers}), one per layer, "
                         f"of the block keywords {list(BLOCK_KEYWORDS)}; got {layers!r}")
    for i, d in enumerate(layers):
        unknown = sorted(set(d) - set(BLOCK_KEYWORDS))
        if unknown:
            raise ValueError(f"GPT: layers[{i}] has key(s) {unknown} that are not block keywords; a layer may set "
                             f"{sorted(BLOCK_KEYWORDS)}")
    return [dict(d) for d in layers]


def _block(where, kw, override):
    """A BlockConfig from block keywords; norm_placement (when set, at the level that sets it) wins over
    norm_first, which otherwise decides between "pre" and "post"."""
    kw = dict(kw)
    norm_first, placement = kw.pop("norm_first"), kw.pop("norm_placement")
    if "norm_first" in override and "norm_placement" not in override:
        placement = None
    if placement is None:
        placement = "pre" if norm_first else "post"
    elif norm_first is False and placement != "post":
        raise ValueError(f"{where}: norm_first = false contradicts norm_placement = {placement!r}; give one of them")
    try:
        return BlockConfig(**kw, norm_placement=placement)
    except ValueError as e:
        raise ValueError(str(e).replace("BlockConfig", where, 1)) from None


def _keywords_of(block):
    """A resolved BlockConfig as keyword-form block keywords (norm_first follows norm_placement); rope_scaling
    stays a RopeScaling (hashable, for counting; ``_plain`` writes it)."""
    return {k: getattr(block, k) for k in BLOCK_KEYWORDS if k != "norm_first"}


def _plain(value):
    """A keyword's value as config.json holds it: a RopeScaling as the dict of its set fields."""
    return value.to_dict() if isinstance(value, RopeScaling) else value


# -- the encoder classifier and the seq2seq Transformer: one keyword per field -------------------------------
class _KeywordFields:
    """to_dict / from_dict of a config whose fields are its keyword form."""

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class EncoderClassifierConfig(_KeywordFields):
    """Every choice of an ``EncoderClassifier`` (its keyword form, field for field; identical layers)."""

    vocab_size: int
    n_classes: int
    max_len: int = 512
    d_model: int = 64
    n_heads: int = 1
    n_layers: int = 1
    d_ff: int | None = None
    dropout: float = 0.1
    pooling: str = "mean"
    positional: str = "sinusoidal"
    activation: str = "relu"
    norm_first: bool = False
    norm: str = "layer"
    pad_id: int | None = 0
    scale_embeddings: bool = True
    bias: bool = True
    layer_norm_eps: float = 1e-5
    attention: str = "plain"
    gradient_checkpointing: bool = False
    n_kv_heads: int | None = None
    rope_theta: float = 10000.0

    def __post_init__(self):
        check_sizes("EncoderClassifier", vocab_size=self.vocab_size, n_classes=self.n_classes, max_len=self.max_len,
                    d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers, d_ff=self.d_ff)

    def block(self):
        """The BlockConfig of every layer."""
        return BlockConfig(n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, d_ff=4 * self.d_model
                           if self.d_ff is None else self.d_ff, activation=self.activation, bias=self.bias,
                           norm_placement="pre" if self.norm_first else "post", rope_theta=self.rope_theta)


@dataclass(frozen=True)
class TransformerConfig(_KeywordFields):
    """Every choice of the encoder-decoder ``Transformer`` (its keyword form, field for field)."""

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    max_len: int = 512
    n_encoder_layers: int | None = None
    n_decoder_layers: int | None = None
    norm_first: bool = False
    activation: str = "relu"
    norm: str = "layer"
    positional: str = "sinusoidal"
    share_embeddings: bool = False
    tie_output: bool = False
    src_pad_id: int | None = None
    tgt_pad_id: int | None = None
    final_norm: bool | None = None
    bias: bool = True
    attn_bias: bool | None = None
    layer_norm_eps: float = 1e-5
    scale_embeddings: bool = True
    attention: str = "plain"
    gradient_checkpointing: bool = False
    bos_id: int | None = None
    eos_id: int | None = None
    n_kv_heads: int | None = None
    rope_theta: float = 10000.0

    def __post_init__(self):
        check_sizes("Transformer", src_vocab_size=self.src_vocab_size, tgt_vocab_size=self.tgt_vocab_size,
                    d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers, d_ff=self.d_ff,
                    max_len=self.max_len, n_encoder_layers=self.n_encoder_layers,
                    n_decoder_layers=self.n_decoder_layers)
        for name in ("bos_id", "eos_id"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                                  or not 0 <= v < self.tgt_vocab_size):
                raise ValueError(f"{name} must be None or a token id in [0, {self.tgt_vocab_size}), got {v!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size "
                             f"(got {self.src_vocab_size} and {self.tgt_vocab_size})")

    def block(self):
        """The BlockConfig of every encoder and decoder layer."""
        return BlockConfig(n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, d_ff=self.d_ff,
                           activation=self.activation, bias=self.bias, attn_bias=self.attn_bias,
                           norm_placement="pre" if self.norm_first else "post", rope_theta=self.rope_theta)


def _known(cls, d):
    d = {k: v for k, v in d.items() if k != "type"}
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(d) - set(valid))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} of a {cls.__name__}; valid keys: {sorted(valid)}")
    return d


def config_fields_markdown():
    """The fields of GPTConfig and BlockConfig as Markdown tables (field | type | default | what it is), for the
    engine page (tests/test_model_config.py checks the page holds them)."""
    lines = []
    for cls, title in ((GPTConfig, "GPTConfig"), (BlockConfig, "BlockConfig (one per layer: GPTConfig.layers)")):
        lines += [f"#### {title}", "", "| field | type | default | what it is |", "|---|---|---|---|"]
        for f in fields(cls):
            default = "required" if f.default is MISSING else ("4 × BlockConfig()" if f.name == "layers"
                                                               else f"`{f.default!r}`")
            kind = " or ".join(f"`{t}`" for t in f.type.split(" | "))         # no "|" inside a table cell
            lines.append(f"| `{f.name}` | {kind} | {default} | {f.metadata['doc']} |")
        lines.append("")
    return "\n".join(lines)


# The keyword form of each model type: what a [model] section and a model's constructor accept.
KEYWORD_FORMS = {"gpt": GPTConfig.from_keywords, "classifier": EncoderClassifierConfig,
                 "transformer": TransformerConfig}
CONFIG_CLASSES = {"gpt": GPTConfig, "classifier": EncoderClassifierConfig, "transformer": TransformerConfig}


def keyword_arguments(kind):
    """{keyword: default} of a model type's keyword form (``inspect.Parameter.empty``: required)."""
    return {name: p.default for name, p in inspect.signature(KEYWORD_FORMS[kind]).parameters.items()}


def config_from(cls, args, keywords):
    """A model constructor's config: its one positional argument (or ``config=``) when that is a config of
    ``cls``, else the keyword form's (``args`` in the keyword form's order)."""
    if "config" in keywords:
        args, keywords = (keywords.pop("config"),) + tuple(args), keywords
    if args and isinstance(args[0], cls):
        if len(args) > 1 or keywords:
            raise TypeError(f"give either a {cls.__name__} or the keyword form, not both (got more arguments: "
                            f"{list(keywords) or len(args) - 1})")
        return args[0]
    return cls.from_keywords(*args, **keywords) if cls is GPTConfig else cls(*args, **keywords)


__all__ = ["GPTConfig", "BlockConfig", "EncoderClassifierConfig", "TransformerConfig", "BLOCK_KEYWORDS",
           "KEYWORD_FORMS", "CONFIG_CLASSES", "keyword_arguments", "config_from", "default_d_ff",
           "config_fields_markdown"]
