"""Stateful layers: Linear, Embedding, norms, Dropout, FeedForward and the gated feed-forwards (SwiGLU, GeGLU).

Each calls its op pair through ``dispatch.F``: the kernels of ``numformer.kernels``, or the references of
``numformer.ops`` inside ``numformer.reference_mode()``.
"""
from __future__ import annotations

import numpy as np

from . import init
from .dispatch import F
from .hooks import HookPoint
from .module import NO_FORWARD, Module, Parameter


class Linear(Module):
    """y = x Wᵀ + b with W: (out_features, in_features), as torch.nn.Linear: x (..., in_features) ->
    y (..., out_features); ``backward(dy)`` returns dx and accumulates dW (and db).

    W and b (``bias=False``: None) are initialized U(-1/√in_features, 1/√in_features), as torch's; ``rng``: a
    Generator, an integer seed or None (fresh randomness).
    """

    def __init__(self, in_features, out_features, bias=True, rng=None, dtype=np.float32):
        super().__init__()
        rng = init.default_rng(rng)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(init.linear_default(rng, (out_features, in_features), dtype))
        self.bias = Parameter(init.uniform(rng, (out_features,), 1.0 / np.sqrt(in_features), dtype)) if bias else None
        self._cache = self._out_shape = None

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear expects inputs with last dimension {self.in_features}, got shape {x.shape}")
        y, self._cache = F.linear_forward(x, self.weight.data, None if self.bias is None else self.bias.data)
        self._out_shape = y.shape
        return y

    def backward(self, dy):
        if self._cache is None:
            raise RuntimeError(NO_FORWARD)
        if np.shape(dy) != self._out_shape:
            raise ValueError(f"the gradient must have the shape of the forward output {self._out_shape}, "
                             f"got {np.shape(dy)}")
        dx, dW, db = F.linear_backward(dy, self._cache, weight_grad=self.weight.requires_grad)
        if dW is not None:
            self.weight.accumulate(dW)
        if self.bias is not None:
            self.bias.accumulate(db)
        self._cache = None
        return dx

    def flops_per_token(self, context):
        """2 · in_features · out_features: a multiply and an add per weight."""
        return 2 * self.in_features * self.out_features

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """Lookup table E: (num_embeddings, embedding_dim); forward(ids (...) ints) = E[ids], (..., embedding_dim).
    Initialized N(0, std²), std=1.0 by default as torch. ``backward(dy)`` accumulates dE and returns None
    (integer ids have no gradient).

    ``padding_idx``: as torch's, the row E[padding_idx] starts at zero and gets no gradient from the lookup
    (positions holding that id contribute nothing to dE; a tied output layer still adds its own gradient to the
    row); a negative index counts from the end, and one outside the table is refused.
    """

    def __init__(self, num_embeddings, embedding_dim, rng=None, dtype=np.float32, std=1.0, padding_idx=None):
        super().__init__()
        rng = init.default_rng(rng)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"padding_idx {padding_idx} is outside the table of {num_embeddings} rows")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self.weight = Parameter(init.normal(rng, (num_embeddings, embedding_dim), std, dtype))
        if padding_idx is not None:
            self.weight.data[padding_idx] = 0
        self._cache = None

    def forward(self, ids):
        ids = np.asarray(ids)
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"token ids must be integers, got dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_embeddings):
            bad = np.unique(ids[(ids < 0) | (ids >= self.num_embeddings)])[:10].tolist()
            raise ValueError(f"token ids {bad} are outside the vocabulary [0, {self.num_embeddings}); "
                             f"check the tokenizer or raise vocab_size")
        y, self._cache = F.embedding_forward(ids, self.weight.data)
        return y

    parameter_kind = "embedding"

    def backward(self, dy):
        if self._cache is None:
            raise RuntimeError(NO_FORWARD)
        p = self.weight
        if not p.requires_grad:                               # frozen: no scatter at all
            self._cache = None
            return None
        if self.padding_idx is not None:
            dy = np.where((self._cache[0] == self.padding_idx)[..., None], 0, dy).astype(dy.dtype, copy=False)
        if p.grad is None:
            p.grad = F.embedding_backward(dy, self._cache)
        else:                                                  # tied weights: add into the gradient in place
            F.embedding_backward_into(dy, self._cache, p.grad)
        self._cache = None
        return None

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class _Norm(Module):
    """y = x̂ ⊙ γ (+ β) over the last axis, with learnable γ (``weight``, ones) and β (``bias``, zeros; None
    without): the op pair ``F.<OP>_forward`` / ``F.<OP>_backward``, whose backward returns (dx, dγ[, dβ]).
    The output is the hook point ``hook_normalized`` (TransformerLens's ``ln1.hook_normalized`` …)."""

    OP = None
    parameter_kind = "norm"

    def __init__(self, d, eps, bias, dtype):
        super().__init__()
        self.d, self.eps = d, eps
        self.weight = Parameter(np.ones(d, dtype=dtype))
        self.bias = Parameter(np.zeros(d, dtype=dtype)) if bias else None
        self.hook_normalized = HookPoint()
        self._cache = None

    def backward(self, dy):
        dy = self.hook_normalized.backward(dy)
        dx, dgamma, *dbeta = getattr(F, self.OP + "_backward")(dy, self._cache)
        self.weight.accumulate(dgamma)
        if self.bias is not None:
            self.bias.accumulate(dbeta[0])
        self._cache = None
        return dx

    def extra_repr(self):
        return f"{self.d}, eps={self.eps}"


class LayerNorm(_Norm):
    """y = (x - μ) / √(σ² + eps) ⊙ γ + β over the last axis (μ, σ² biased, per position), x (..., d) ->
    y (..., d); learnable γ (``weight``, ones) and β (``bias``, zeros; None with ``bias=False``), eps=1e-5 as
    torch."""

    OP = "layer_norm"

    def __init__(self, d, eps=1e-5, bias=True, dtype=np.float32):
        super().__init__(d, eps, bias, dtype)

    def forward(self, x):
        beta = None if self.bias is None else self.bias.data
        y, self._cache = F.layer_norm_forward(x, self.weight.data, beta, self.eps)
        return self.hook_normalized(y)


class RMSNorm(_Norm):
    """y = x / rms(x) ⊙ γ, rms(x) = √(mean(x²) + eps), over the last axis: x (..., d) -> y (..., d); learnable
    γ (``weight``, ones), no bias, eps=1e-6."""

    OP = "rms_norm"
    OFFSET = 0.0

    def __init__(self, d, eps=1e-6, dtype=np.float32):
        super().__init__(d, eps, False, dtype)
        self.weight.data -= self.OFFSET             # the scale OFFSET + weight starts at 1

    def forward(self, x):
        gamma = self.weight.data
        if self.OFFSET:                             # in the weights' dtype, as transformers' (1.0 + w.float())
            gamma = gamma + gamma.dtype.type(self.OFFSET)
        y, self._cache = F.rms_norm_forward(x, gamma, self.eps)
        return self.hook_normalized(y)


class RMSNormPlusOne(RMSNorm):
    """Gemma's RMSNorm: y = x / rms(x) ⊙ (1 + w), the learnable ``weight`` w starting at 0 (so that weight decay
    pulls the scale towards 1). The op is ``rms_norm`` with γ = 1 + w, whose gradient dγ is dw."""

    OFFSET = 1.0


class BatchStatNorm(_Norm):
    """Batch-statistics norm: y = (x - μ) / √(σ² + eps) ⊙ γ + β with per-feature μ and σ² (biased) over batch
    and sequence (see ops.batch_norm_forward), x (..., d) -> y (..., d). There are no running statistics: eval
    mode also normalizes with the statistics of the batch it is given."""

    OP = "batch_norm"

    def __init__(self, d, eps=1e-5, dtype=np.float32):
        super().__init__(d, eps, True, dtype)

    def forward(self, x):
        y, self._cache = F.batch_norm_forward(x, self.weight.data, self.bias.data, self.eps)
        return self.hook_normalized(y)


NORMS = {"layer": LayerNorm, "rms": RMSNorm, "rms_plus_one": RMSNormPlusOne, "batch": BatchStatNorm}
RMS_NORMS = ("rms", "rms_plus_one")


def make_norm(kind, d, eps=1e-5, bias=True, dtype=np.float32):
    """Build a norm by name: 'layer' (default), 'rms', 'rms_plus_one' (Gemma's, scaled by 1 + w) or 'batch'
    (per-feature statistics over batch and sequence), with ``eps`` (1e-5 for every kind). ``bias`` applies to
    'layer' only: the RMS norms have no bias, the batch norm always has one (``bias=False`` is refused)."""
    if kind not in NORMS:
        raise ValueError(f"unknown norm {kind!r}; choose one of {sorted(NORMS)}")
    if kind == "batch" and not bias:
        raise ValueError("the batch norm always has a bias (β); bias=False applies to the layer norm, or use "
                         "norm='rms' for a norm without one")
    if kind == "layer":
        return LayerNorm(d, eps, bias=bias, dtype=dtype)
    return NORMS[kind](d, eps, dtype=dtype)


class Dropout(Module):
    """Inverted dropout: in training mode each element is zeroed with probability ``p`` and the others scaled
    by 1/(1 - p); the identity in eval mode. Masks are drawn from ``rng`` (a Generator, shared with the
    modules built with it; an integer seed; None: fresh randomness)."""

    def __init__(self, p=0.0, rng=None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.rng = init.default_rng(rng)
        self._cache = None

    def forward(self, x):
        y, self._cache = F.dropout_forward(x, self.p, self.rng, self.training)
        return y

    def backward(self, dy):
        dx = F.dropout_backward(dy, self._cache)
        self._cache = None
        return dx

    def extra_repr(self):
        return f"p={self.p}"


ACTIVATIONS = ("relu", "relu2", "gelu", "gelu_tanh", "silu")
# "swiglu" and "geglu" name the gated feed-forwards (SiLU and tanh-GELU gates), not activations
GATED = {"swiglu": "silu_gate", "geglu": "gelu_gate"}
FEED_FORWARD_ACTIVATIONS = ACTIVATIONS + tuple(GATED)


class Activation(Module):
    """Element-wise, by ``kind``: "relu", "relu2" (squared ReLU, max(0, x)²), "gelu" (exact, erf), "gelu_tanh"
    (the tanh approximation) or "silu" (x σ(x))."""

    def __init__(self, kind="relu"):
        super().__init__()
        if kind not in ACTIVATIONS:
            raise ValueError(f"unknown activation {kind!r}; choose one of {list(ACTIVATIONS)}")
        self.kind = kind
        self._cache = None

    def forward(self, x):
        if self.kind == "relu":
            y, self._cache = F.relu_forward(x)
        elif self.kind == "relu2":
            y, self._cache = F.relu_squared_forward(x)
        elif self.kind == "silu":
            y, self._cache = F.silu_forward(x)
        else:
            y, self._cache = F.gelu_forward(x, "tanh" if self.kind == "gelu_tanh" else "none")
        return y

    def backward(self, dy):
        if self.kind == "relu":
            dx = F.relu_backward(dy, self._cache)
        elif self.kind == "relu2":
            dx = F.relu_squared_backward(dy, self._cache)
        elif self.kind == "silu":
            dx = F.silu_backward(dy, self._cache)
        else:
            dx = F.gelu_backward(dy, self._cache)
        self._cache = None
        return dx

    def extra_repr(self):
        return self.kind


class FeedForward(Module):
    """Position-wise FFN(x) = W₂ · dropout(act(W₁ x + b₁)) + b₂, d_model -> d_ff -> d_model: x (..., d_model)
    -> (..., d_model), on ``linear1`` / ``linear2``. ``activation``: one of ``ACTIVATIONS`` (see Activation);
    ``dropout``: on the hidden layer; ``bias=False``: no b₁, b₂. Hook points (TransformerLens's
    ``mlp.hook_pre`` / ``hook_post``): the hidden layer before and after the activation."""

    def __init__(self, d_model, d_ff, activation="relu", dropout=0.0, bias=True, rng=None, dtype=np.float32):
        super().__init__()
        rng = init.default_rng(rng)
        self.linear1 = Linear(d_model, d_ff, bias, rng, dtype)
        self.act = Activation(activation)
        self.dropout = Dropout(dropout, rng)
        self.linear2 = Linear(d_ff, d_model, bias, rng, dtype)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x):
        return self.linear2(self.dropout(self.hook_post(self.act(self.hook_pre(self.linear1(x))))))

    def backward(self, dy):
        dh = self.hook_post.backward(self.dropout.backward(self.linear2.backward(dy)))
        return self.linear1.backward(self.hook_pre.backward(self.act.backward(dh)))

    def residual_weights(self):
        return [self.linear2.weight]


class GatedFeedForward(Module):
    """A gated FFN(x) = down_proj(act(gate_proj(x)) ⊙ up_proj(x)), d_model -> d_ff -> d_model (Shazeer 2020),
    x (..., d_model) -> (..., d_model): ``kind="swiglu"`` (SiLU gate, Llama's MLP) or ``"geglu"`` (tanh-GELU
    gate, Gemma's MLP). ``bias=True`` (the default) gives each of the three Linear layers a bias; Llama and
    Gemma have none (``bias=False``).

    The computation of ``ops.swiglu_forward`` / ``swiglu_backward`` (where its backward is derived), on three
    Linear modules named as Hugging Face's LlamaMLP, with the gated product act(a) ⊙ b one op of the table
    (``silu_gate_forward/backward``, ``gelu_gate_forward/backward``). There is no dropout inside (as Llama);
    the block's residual dropout still applies. Hook points, as TransformerLens's gated MLP: ``hook_pre`` (the
    gate's input a), ``hook_pre_linear`` (b) and ``hook_post`` (act(a) ⊙ b).
    """

    def __init__(self, d_model, d_ff, bias=True, rng=None, dtype=np.float32, kind="swiglu"):
        super().__init__()
        if kind not in GATED:
            raise ValueError(f"unknown gated feed-forward {kind!r}; choose one of {list(GATED)}")
        rng = init.default_rng(rng)
        self.kind = kind
        self.gate_proj = Linear(d_model, d_ff, bias, rng, dtype)
        self.up_proj = Linear(d_model, d_ff, bias, rng, dtype)
        self.down_proj = Linear(d_ff, d_model, bias, rng, dtype)
        self.hook_pre, self.hook_pre_linear, self.hook_post = HookPoint(), HookPoint(), HookPoint()
        self._cache = None

    def forward(self, x):
        if x.shape[-1] != self.gate_proj.in_features:
            raise ValueError(f"{type(self).__name__} expects inputs with last dimension "
                             f"{self.gate_proj.in_features}, got shape {x.shape}")
        a = self.hook_pre(self.gate_proj(x))                        # a = x W_gateᵀ (+ b_gate)
        b = self.hook_pre_linear(self.up_proj(x))                   # b = x W_upᵀ (+ b_up)
        h, self._cache = getattr(F, GATED[self.kind] + "_forward")(a, b)      # h = act(a) ⊙ b
        return self.down_proj(self.hook_post(h))

    def backward(self, dy):
        dh = self.hook_post.backward(self.down_proj.backward(dy))   # dh = dy W_down
        da, db = getattr(F, GATED[self.kind] + "_backward")(dh, self._cache)
        da, db = self.hook_pre.backward(da), self.hook_pre_linear.backward(db)
        self._cache = None
        dx = self.gate_proj.backward(da)
        dx += self.up_proj.backward(db)                             # dx = da W_gate + db W_up
        return dx

    def residual_weights(self):
        return [self.down_proj.weight]

    def extra_repr(self):
        return self.kind


class SwiGLUFeedForward(GatedFeedForward):
    """Llama's gated FFN(x) = down_proj(SiLU(gate_proj(x)) ⊙ up_proj(x)): a ``GatedFeedForward`` of kind "swiglu"."""

    def __init__(self, d_model, d_ff, bias=True, rng=None, dtype=np.float32):
        super().__init__(d_model, d_ff, bias, rng, dtype, kind="swiglu")


def make_feed_forward(d_model, d_ff, activation="relu", dropout=0.0, bias=True, rng=None, dtype=np.float32):
    """A FeedForward with ``activation`` (relu, relu2, gelu, gelu_tanh, silu), or a GatedFeedForward for 'swiglu' or
    'geglu' (which has no dropout: ``dropout`` is then unused)."""
    if activation in GATED:
        return GatedFeedForward(d_model, d_ff, bias, rng, dtype, kind=activation)
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {list(FEED_FORWARD_ACTIVATIONS)}")
    return FeedForward(d_model, d_ff, activation, dropout, bias, rng, dtype)
