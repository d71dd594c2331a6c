"""Encoder and decoder blocks, what each is made of (``BlockConfig``), and their stacks.

Where the norms sit (``norm_placement``), for the self-attention sub-layer (the feed-forward likewise):

    "post" (the paper)          h = Norm₁(x + Dropout(SelfAttn(x)))
    "pre" (GPT-2, Llama)        h = x + Dropout(SelfAttn(Norm₁(x)))
    "sandwich" (Gemma 2, 3)     h = x + Dropout(Norm₁'(SelfAttn(Norm₁(x))))

(``norm_first=True`` is "pre", torch's name.) The decoder block adds cross-attention to the encoder output
(the memory) between the two. The sub-module names follow ``torch.nn.TransformerEncoderLayer`` /
``TransformerDecoderLayer`` (``self_attn``, ``norm1`` …) so that weights map one to one; the feed-forward is
grouped as ``ff`` (``ff.linear1`` / ``ff.linear2``, or ``ff.gate_proj`` / ``up_proj`` / ``down_proj``), the
sandwich's norms after each sub-layer are ``post_norm1`` …. A decoder-only model (GPT) uses ``EncoderBlock``
with a causal mask.

Hook points (``nn.hooks``; TransformerLens's names): ``hook_resid_pre`` (the block's input), then for each
sub-layer its output as added to the residual stream (``hook_attn_out``, ``hook_cross_attn_out``,
``hook_mlp_out``: after the sandwich's norm and the dropout) and the residual stream after it
(``hook_resid_mid``, ``hook_resid_mid_cross``; the last one is ``hook_resid_post``, the block's output). With
"pre" and "sandwich" norms resid_mid = resid_pre + attn_out and resid_post = resid_mid + mlp_out; with "post"
norms the residual hook points hold the normed sums, norm(resid_pre + attn_out) ….
"""
from __future__ import annotations

import inspect
import math
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from .. import ops
from ..ops.rope_scaling import RopeScaling
from . import checkpoint, init
from .attention import MultiHeadAttention
from .hooks import HookPoint, has_forward_hooks
from .layers import FEED_FORWARD_ACTIVATIONS, GATED, RMS_NORMS, Dropout, make_feed_forward, make_norm
from .module import Module, ModuleList

NORM_PLACEMENTS = ("pre", "post", "sandwich")


def _doc(default, text):
    """A dataclass field with its one-line description (the docs' tables are generated from these)."""
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True)
class BlockConfig:
    """What one block is: every choice that may differ from layer to layer (Gemma 3 alternates windows and
    RoPE bases, Qwen2 slides from a given layer on). The fields are named as the models' keyword forms name
    them; each field's description is in its metadata (``fields(BlockConfig)``, and the docs' tables). None
    means "derived" where a default depends on the model width: ``resolved(d_model)`` fills it.
    """

    n_heads: int = _doc(4, "query heads")
    n_kv_heads: int | None = _doc(None, "key/value heads, a divisor of n_heads (None: n_heads; 1: multi-query)")
    head_dim: int | None = _doc(None, "features per head (None: d_model / n_heads); the queries are n_heads · "
                                      "head_dim wide")
    d_ff: int | None = _doc(None, "feed-forward width (None: 4·d_model; 8·d_model/3 rounded up to a multiple of "
                                  "8 for swiglu and geglu)")
    activation: str = _doc("gelu", "relu, relu2 (squared ReLU), gelu, gelu_tanh, silu (W₂ act(W₁ x)); "
                                    "swiglu, geglu (gated, three matrices)")
    norm_placement: str = _doc("pre", "pre (GPT-2), post (the paper) or sandwich (Gemma: a norm before and after "
                                      "each sub-layer)")
    qk_norm: bool = _doc(False, "RMSNorm of each query and key head, before RoPE (Qwen3, Gemma 3)")
    sliding_window: int | None = _doc(None, "the keys a query attends to, itself included (Mistral); None: all")
    rope_theta: float = _doc(10000.0, "RoPE base of this layer (with positional = rope)")
    rope_scaling: RopeScaling | None = _doc(None, "scaled RoPE of this layer: a RopeScaling (linear, dynamic, "
                                                  "llama3, yarn; a dict of its fields in config.json); None: "
                                                  "plain RoPE")
    attn_scale: float | None = _doc(None, "the scores' factor (None: 1/√head_dim; Gemma: "
                                          "query_pre_attn_scalar^-½)")
    attn_logit_softcap: float | None = _doc(None, "c: scores capped to c·tanh(S/c) before the mask (Gemma 2)")
    bias: bool = _doc(True, "biases of the feed-forward and of the block's layer norms (the "
                                              "batch norm always has one)")
    attn_bias: bool | None = _doc(None, "bias of the attention output projection (None: bias)")
    qkv_bias: bool | None = _doc(None, "biases of the q/k/v projection (None: attn_bias; Qwen2: true alone)")
    feed_forward: bool = _doc(True, "a feed-forward sub-layer after the attention (false: an attention-only "
                                    "block, as Olsson et al.'s induction-head models)")

    def __post_init__(self):
        self.check()

    def check(self, where="BlockConfig"):
        """Each field of its type and range, and n_kv_heads a divisor of n_heads; one ValueError naming
        ``where`` and the field otherwise. Numbers are stored as Python's (an int where a float belongs)."""
        for f in fields(self):
            value = getattr(self, f.name)
            value = value.item() if isinstance(value, np.generic) else value       # numpy scalars as Python's
            object.__setattr__(self, f.name, _checked(where, f.name, value))
        if self.n_kv_heads is not None:
            try:
                ops.check_kv_heads(self.n_heads, self.n_kv_heads)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None

    def resolved(self, d_model):
        """This config with every derived field (None) given its value for a model of width ``d_model``."""
        if self.head_dim is None and d_model % self.n_heads:
            raise ValueError(f"d_model = {d_model} must be divisible by n_heads = {self.n_heads} (each head gets "
                             f"d_model / n_heads features), or give head_dim")
        attn_bias = self.bias if self.attn_bias is None else self.attn_bias
        return replace(self, n_kv_heads=self.n_heads if self.n_kv_heads is None else self.n_kv_heads,
                       head_dim=d_model // self.n_heads if self.head_dim is None else self.head_dim,
                       d_ff=default_d_ff(d_model, self.activation) if self.d_ff is None else self.d_ff,
                       attn_bias=attn_bias, qkv_bias=attn_bias if self.qkv_bias is None else self.qkv_bias)

    def to_dict(self):
        """The fields as plain values (``rope_scaling`` as the dict of its set fields)."""
        return {**asdict(self), "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.to_dict()}

    @classmethod
    def from_dict(cls, d):
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} of a block; valid keys: {sorted(valid)}")
        return cls(**d)


def _checked(where, name, value):
    """A BlockConfig field checked (``where``: the model and layer, for the message)."""
    if name == "activation":
        if value not in FEED_FORWARD_ACTIVATIONS:
            raise ValueError(f"{where}: unknown activation {value!r}; choose one of {list(FEED_FORWARD_ACTIVATIONS)}")
    elif name == "norm_placement":
        if value not in NORM_PLACEMENTS:
            raise ValueError(f"{where}: unknown norm_placement {value!r}; choose one of {list(NORM_PLACEMENTS)}")
    elif name in ("n_heads", "n_kv_heads", "head_dim", "d_ff", "sliding_window"):
        if (value is not None or name == "n_heads") and (type(value) is not int or value < 1):
            raise ValueError(f"{where}: {name} must be a positive integer{'' if name == 'n_heads' else ' or None'}, "
                             f"got {value!r}")
    elif name == "rope_scaling":
        if isinstance(value, dict):
            try:
                value = RopeScaling.from_dict(value)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{where}: rope_scaling: {e}") from None
        elif value is not None and not isinstance(value, RopeScaling):
            raise ValueError(f"{where}: rope_scaling must be a RopeScaling, a dict of its fields or None, "
                             f"got {value!r}")
    elif name in ("qk_norm", "bias", "attn_bias", "qkv_bias", "feed_forward"):
        if type(value) is not bool and (value is not None or name in ("qk_norm", "bias", "feed_forward")):
            raise ValueError(f"{where}: {name} must be true or false, got {value!r}")
    elif value is not None or name == "rope_theta":            # rope_theta, attn_scale, attn_logit_softcap
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{where}: {name} must be a positive number{'' if name == 'rope_theta' else ' or None'},"
                             f" got {value!r}")
        value = float(value)
    return value


def default_d_ff(d_model, activation):
    """4·d_model; for a gated feed-forward 8·d_model/3 rounded up to a multiple of 8 (about the parameters of
    the 4·d_model ungated one, as Llama)."""
    return -(-8 * d_model // 24) * 8 if activation in GATED else 4 * d_model


class _Block(Module):
    """What the encoder and decoder blocks share: their sub-modules, built from a ``BlockConfig``. The
    self-attention (``self_attn``), for a decoder block the cross-attention to the memory (``cross_attn``), the
    feed-forward (``ff``), one norm and one dropout per sub-layer (``norm1`` …, ``dropout1`` …) and, in a
    sandwich, one more norm after each sub-layer (``post_norm1`` …).

    Built as ``Block(d_model, config, dropout=, norm=, layer_norm_eps=, rng=, dtype=, attention=, positional=)``
    with a ``BlockConfig`` (the keywords of the config's fields are then not read), or in the keyword form of
    torch's layers, ``Block(d_model, n_heads, d_ff, dropout, activation, norm_first, ...)``, which builds the
    config. ``dropout`` (0.1) applies to the attention weights, the hidden layer of an ungated feed-forward
    and each sub-layer's output; ``norm`` ("layer") is the kind of every norm (``make_norm``),
    ``layer_norm_eps`` (1e-5) their ε, the q/k norms' included.
    """

    CROSS_ATTENTION = False

    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.1, activation="relu", norm_first=False, norm="layer",
                 layer_norm_eps=1e-5, bias=True, attn_bias=None, rng=None, dtype=np.float32, attention="plain",
                 n_kv_heads=None, positional=None, rope_theta=10000.0, qkv_bias=None, sliding_window=None, **more):
        super().__init__()
        if isinstance(n_heads, BlockConfig):
            config = n_heads
            named = dict(d_ff=d_ff, activation=activation, norm_first=norm_first, bias=bias, attn_bias=attn_bias,
                         n_kv_heads=n_kv_heads, rope_theta=rope_theta, qkv_bias=qkv_bias, sliding_window=sliding_window)
            defaults = inspect.signature(_Block.__init__).parameters
            given = sorted([*more, *(k for k, v in named.items() if v != defaults[k].default)])
            if given:
                raise TypeError(f"give either a BlockConfig or the keyword form, not both: the config's fields "
                                f"come from the config (got {', '.join(given)})")
        else:
            placement = more.pop("norm_placement", None) or ("pre" if norm_first else "post")
            config = BlockConfig(n_heads=n_heads, d_ff=d_ff, activation=activation, norm_placement=placement,
                                 bias=bias, attn_bias=attn_bias,
                                 n_kv_heads=n_kv_heads, rope_theta=rope_theta, qkv_bias=qkv_bias,
                                 sliding_window=sliding_window, **more)
        self.config = c = config.resolved(d_model)
        rng = init.default_rng(rng)
        self.d_model, self.n_heads, self.d_ff = d_model, c.n_heads, c.d_ff
        self.norm_first, self.activation, self.norm_kind = c.norm_placement != "post", c.activation, norm
        self.self_attn = MultiHeadAttention(d_model, c.n_heads, dropout, c.attn_bias, rng, dtype, attention,
                                            n_kv_heads=c.n_kv_heads, positional=positional,
                                            rope_theta=c.rope_theta, qkv_bias=c.qkv_bias,
                                            sliding_window=c.sliding_window, head_dim=c.head_dim,
                                            qk_norm=c.qk_norm, scale=c.attn_scale,
                                            attn_logit_softcap=c.attn_logit_softcap, norm_eps=layer_norm_eps,
                                            rope_scaling=c.rope_scaling,
                                            qk_norm_kind=norm if norm in RMS_NORMS else "rms")
        if self.CROSS_ATTENTION:
            self.cross_attn = MultiHeadAttention(d_model, c.n_heads, dropout, c.attn_bias, rng, dtype, attention,
                                                 n_kv_heads=c.n_kv_heads, head_dim=c.head_dim)
        self.ff = make_feed_forward(d_model, c.d_ff, c.activation, dropout, c.bias, rng, dtype) if c.feed_forward \
            else None
        n_sublayers = (2 if self.CROSS_ATTENTION else 1) + c.feed_forward
        for i in range(1, n_sublayers + 1):
            setattr(self, f"norm{i}", make_norm(norm, d_model, layer_norm_eps, c.bias, dtype))
        if c.norm_placement == "sandwich":
            for i in range(1, n_sublayers + 1):
                setattr(self, f"post_norm{i}", make_norm(norm, d_model, layer_norm_eps, c.bias, dtype))
        for i in range(1, n_sublayers + 1):
            setattr(self, f"dropout{i}", Dropout(dropout, rng))
        self._add_hook_points()

    def _add_hook_points(self):
        """hook_resid_pre, and per sub-layer (its output's hook point, the residual's after it): see the module
        docstring."""
        outputs = ["attn_out"] + (["cross_attn_out"] if self.CROSS_ATTENTION else []) + \
            (["mlp_out"] if self.ff is not None else [])
        residuals = ["resid_mid", "resid_mid_cross"][:len(outputs) - 1] + ["resid_post"]
        self.hook_resid_pre = HookPoint()
        self._sublayer_hooks = {}
        for i, (out, resid) in enumerate(zip(outputs, residuals), start=1):
            setattr(self, f"hook_{out}", HookPoint())
            setattr(self, f"hook_{resid}", HookPoint())
            self._sublayer_hooks[i] = (getattr(self, f"hook_{out}"), getattr(self, f"hook_{resid}"))

    def extra_repr(self):
        return f"norm_placement={self.config.norm_placement!r}"

    def hidden_matrices(self):
        """Every weight matrix inside the block (attention and feed-forward): the hidden layers' matrices."""
        return [p for _, p in self.named_parameters() if p.data.ndim == 2]

    def _sublayer(self, i, x, f):
        """One residual sub-layer (number i) around ``f``, its norms placed as ``config.norm_placement`` says,
        through its two hook points (the output added to the residual stream, the residual stream after it)."""
        norm, drop = getattr(self, f"norm{i}"), getattr(self, f"dropout{i}")
        hook_out, hook_resid = self._sublayer_hooks[i]
        if self.config.norm_placement == "post":
            return hook_resid(norm(x + hook_out(drop(f(x)))))
        z = f(norm(x))
        if self.config.norm_placement == "sandwich":
            z = getattr(self, f"post_norm{i}")(z)
        return hook_resid(x + hook_out(drop(z)))

    def _sublayer_backward(self, i, dy, f_backward):
        """Backward of ``_sublayer`` number i: dy (B, T, d_model), the gradient of its output, to dx, that of its
        input x. ``f_backward`` maps the gradient of f's output to that of f's input. The residual add passes its
        gradient both around f and into it, and dx sums the two (g' is g's backward):

            "post"                 ds = Norm'(dy),  dx = ds + f'(Dropout'(ds))
            "pre" / "sandwich"     dx = dy + Norm'(f'(PostNorm'(Dropout'(dy))))    (PostNorm' only in a sandwich)

        dy first passes the residual hook point's backward, and the branch's gradient the output hook point's,
        just before Dropout'. The norms and f accumulate their parameters' ``.grad``."""
        norm, drop = getattr(self, f"norm{i}"), getattr(self, f"dropout{i}")
        hook_out, hook_resid = self._sublayer_hooks[i]
        dy = hook_resid.backward(dy)
        if self.config.norm_placement == "post":
            dsum = norm.backward(dy)
            return dsum + f_backward(drop.backward(hook_out.backward(dsum)))
        dz = drop.backward(hook_out.backward(dy))
        if self.config.norm_placement == "sandwich":
            dz = getattr(self, f"post_norm{i}").backward(dz)
        return dy + norm.backward(f_backward(dz))


class EncoderBlock(_Block):
    """Self-attention and feed-forward sub-layers, each with a residual connection and its norms.

    x: (B, T, d_model) -> (B, T, d_model); ``backward(dy)`` returns dx. Masks follow torch.nn (bool True =
    blocked). Keyword form (defaults ``d_ff=None``: ``default_d_ff``, ``dropout=0.1``, ``activation="relu"``,
    ``norm_first=False``: post-norm, as torch's layers): ``attn_bias`` (default: ``bias``) switches the
    attention projections' biases separately;
    ``attention``: "plain" or "flash" (memory-efficient kernel, see MultiHeadAttention); ``activation``
    "swiglu" / "geglu": the gated feed-forwards (GatedFeedForward); ``n_kv_heads``, ``positional``
    ("rope" / "alibi", else None), ``rope_theta``, ``qkv_bias`` (default: ``attn_bias``; biases on the q/k/v
    projection only, as Qwen2) and ``sliding_window`` are the self-attention options of MultiHeadAttention;
    the other ``BlockConfig`` fields (head_dim, qk_norm, norm_placement, attn_scale, attn_logit_softcap) are
    keywords too.
    """

    def forward(self, x, attn_mask=None, key_padding_mask=None, is_causal=False, kv_cache=None, positions=None):
        """x (B, T, d_model) -> (B, T, d_model). ``attn_mask``, ``key_padding_mask``, ``is_causal``,
        ``kv_cache``: as ``MultiHeadAttention.forward``'s. ``positions`` (B, T): each row's token positions,
        for positional='rope' (default: 0 … T-1 after the cached ones)."""
        where = {} if positions is None else {"positions": positions}

        def attend(z):
            return self.self_attn(z, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                                  kv_cache=kv_cache, **where)

        h = self._sublayer(1, self.hook_resid_pre(x), attend)
        return h if self.ff is None else self._sublayer(2, h, self.ff)

    def backward(self, dy):
        dh = dy if self.ff is None else self._sublayer_backward(2, dy, self.ff.backward)
        return self.hook_resid_pre.backward(self._sublayer_backward(1, dh, self.self_attn.backward))


class DecoderBlock(_Block):
    """Masked self-attention, cross-attention to the memory, and feed-forward; each with residual + norms.

    x: (B, T, d_model), memory: (B, S, d_model) -> (B, T, d_model).
    backward(dy) returns (dx, dmemory). ``attention``: "plain" or "flash" (both attention layers).
    ``n_kv_heads``, ``head_dim`` and ``attn_bias`` apply to both attention layers; ``positional`` ("rope" /
    "alibi"), ``rope_theta``, ``rope_scaling``, ``qkv_bias``, ``sliding_window``, ``qk_norm``, ``attn_scale``
    and ``attn_logit_softcap`` to the self-attention only (the memory's positions are the encoder's business).
    """

    CROSS_ATTENTION = True

    def forward(self, x, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, cache=None):
        """x (B, T, d_model), memory (B, S, d_model) -> (B, T, d_model). ``tgt_mask`` (T, T) and
        ``tgt_key_padding_mask`` (B, T) mask the self-attention, ``memory_mask`` (T, S) and
        ``memory_key_padding_mask`` (B, S) the cross-attention (bool True = blocked); ``tgt_is_causal``: causal
        self-attention. ``cache`` = (self-attention KVCache, static cross-attention KVCache) for incremental
        decoding."""
        self_cache, cross_cache = (None, None) if cache is None else cache

        def self_attend(z):
            return self.self_attn(z, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask,
                                  is_causal=tgt_is_causal, kv_cache=self_cache)

        def cross_attend(z):
            return self.cross_attn(z, memory, attn_mask=memory_mask, key_padding_mask=memory_key_padding_mask,
                                   kv_cache=cross_cache)

        h1 = self._sublayer(1, self.hook_resid_pre(x), self_attend)
        h2 = self._sublayer(2, h1, cross_attend)
        return h2 if self.ff is None else self._sublayer(3, h2, self.ff)

    def backward(self, dy):
        dmemory = []

        def cross_backward(dz):
            dq, dm = self.cross_attn.backward(dz)
            dmemory.append(dm)
            return dq

        dh2 = dy if self.ff is None else self._sublayer_backward(3, dy, self.ff.backward)
        dh1 = self._sublayer_backward(2, dh2, cross_backward)
        return self.hook_resid_pre.backward(self._sublayer_backward(1, dh1, self.self_attn.backward)), dmemory[0]


class Encoder(Module):
    """A stack of EncoderBlocks with an optional final norm (needed after pre-LN blocks).

    ``gradient_checkpointing=True``: each block keeps only its input in forward and
    recomputes its activations in backward (same gradients, see ``nn.checkpoint``); not in a
    forward with ``kv_caches`` or with a forward hook attached, which keep every activation.
    """

    def __init__(self, layers, norm=None, gradient_checkpointing=False):
        super().__init__()
        self.layers = ModuleList(layers)
        self.norm = norm
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, x, mask=None, key_padding_mask=None, is_causal=False, kv_caches=None):
        """x (B, T, d_model) -> (B, T, d_model). ``mask`` is each block's ``attn_mask``; ``kv_caches``: one
        KVCache per block."""
        # a hooked forward keeps every block's activations: a recomputation in backward could not rerun its hooks
        recompute = self.gradient_checkpointing and kv_caches is None and not has_forward_hooks(self)
        for i, layer in enumerate(self.layers):
            x = checkpoint.run(layer, recompute, x, attn_mask=mask,
                               key_padding_mask=key_padding_mask, is_causal=is_causal,
                               kv_cache=None if kv_caches is None else kv_caches[i])
        return x if self.norm is None else self.norm(x)

    def backward(self, dy):
        if self.norm is not None:
            dy = self.norm.backward(dy)
        for layer in reversed(list(self.layers)):
            dy = checkpoint.checkpoint_backward(layer, dy)
        return dy


class Decoder(Module):
    """A stack of DecoderBlocks with an optional final norm. backward returns (dx, dmemory), dmemory summed
    over the blocks.

    ``gradient_checkpointing=True``: as in ``Encoder``, not in a forward with ``caches`` or while forward
    hooks are attached (the recomputation in backward would run without them).
    """

    def __init__(self, layers, norm=None, gradient_checkpointing=False):
        super().__init__()
        self.layers = ModuleList(layers)
        self.norm = norm
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, x, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, caches=None):
        """x (B, T, d_model), memory (B, S, d_model) -> (B, T, d_model); the masks as ``DecoderBlock.forward``'s,
        ``caches``: one (self, cross) KVCache pair per block."""
        recompute = self.gradient_checkpointing and caches is None and not has_forward_hooks(self)
        for i, layer in enumerate(self.layers):
            x = checkpoint.run(layer, recompute, x, memory, tgt_mask,
                               memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                               cache=None if caches is None else caches[i])
        return x if self.norm is None else self.norm(x)

    def backward(self, dy):
        if self.norm is not None:
            dy = self.norm.backward(dy)
        dmemory = None
        for layer in reversed(list(self.layers)):
            dy, dm = checkpoint.checkpoint_backward(layer, dy)
            dmemory = dm if dmemory is None else dmemory + dm
        return dy, dmemory
