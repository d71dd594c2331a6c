"""Reading the residual stream of a GPT: the logit lens and direct logit attribution.

    lens = logit_lens(model, ids)              # every layer's residual through the final norm and unembedding
    lens.logits                                # (L + 1, B, T, V): stage 0 the embeddings, stage l after layer l-1
    lens.plot(tokens, path="lens.png")         # probability of the next token, stage × position
    dla = direct_logit_attribution(model, ids, tokens=answer)
    dla.heads                                  # (B, L, H): what each head writes onto the answer's logit

The logit lens (nostalgebraist 2020) reads an intermediate residual stream x_l as if it were the last one:
logits_l = W_U · Norm_f(x_l). Direct logit attribution splits the final residual stream into the terms that
were added to it (the embeddings, each head's output z_h W_O,hᵀ, each attention bias, each MLP) and
reads each through the final norm with the norm's scale frozen at its value on the whole stream (as
TransformerLens's ``apply_ln_to_stack``): the terms then add up exactly to the logit. With sandwich norms
(Gemma) a head's output passes through the norm after the attention, frozen the same way. Post-LN models
have no residual stream to split (each sub-layer's output is normed with the stream) and are refused.
The logits are taken before a final soft-cap (Gemma 2), which is not linear.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..lora import LoRALinear
from ..models import GPT
from ..nn import RMSNorm
from ._common import (as_inputs, check_position, check_token_ids, check_unpadded, eval_mode, mask_kwargs, new_figure,
                      save_figure, set_token_ticks)


def _check_gpt(model, what):
    if not isinstance(model, GPT):
        raise ValueError(f"{what} reads a GPT's residual stream through its output layer; "
                         f"a {type(model).__name__} has none")


def unembed(model, resid):
    """Logits (before a final soft-cap) of residual-stream vectors (..., d_model): the final norm, then the
    output layer. Runs the model's modules, so run it after any backward you need (their caches are reset)."""
    x = resid if model.norm_f is None else model.norm_f(resid)
    logits = model.lm_head(x)
    model.clear_cache()
    return logits


@dataclass
class LogitLens:
    """logits (L + 1, B, T, V): stage 0 reads the embeddings (resid_pre of layer 0), stage l the output of
    layer l - 1; the last stage is the model's own logits (before a final soft-cap). ids (B, T): the input;
    attention_mask (B, T) bool or None: True at real tokens (the logits at padding are not a token's)."""
    logits: np.ndarray
    ids: np.ndarray
    attention_mask: np.ndarray = None

    @property
    def stage_names(self):
        """["embeddings", "layer 0", ...]: the name of each stage (L + 1)."""
        return ["embeddings"] + [f"layer {layer}" for layer in range(len(self.logits) - 1)]

    def probabilities(self):
        """softmax over the vocabulary, float64 (L + 1, B, T, V)."""
        x = self.logits.astype(np.float64)
        x = np.exp(x - x.max(axis=-1, keepdims=True))
        return x / x.sum(axis=-1, keepdims=True)

    def next_token_probability(self):
        """(L + 1, B, T - 1): each stage's probability of the token that comes next in ``ids`` (NaN where this
        token or the next is padding)."""
        p = self.probabilities()[:, :, :-1]
        prob = np.take_along_axis(p, self.ids[None, :, 1:, None], axis=-1)[..., 0]
        if self.attention_mask is not None:
            prob[:, ~(self.attention_mask[:, :-1] & self.attention_mask[:, 1:])] = np.nan
        return prob

    def top(self, k=5):
        """(token ids, probabilities), each (L + 1, B, T, k): each stage's k most likely tokens."""
        p = self.probabilities()
        order = np.argsort(-p, axis=-1, kind="stable")[..., :k]
        return order, np.take_along_axis(p, order, axis=-1)

    def plot(self, tokens=None, batch=0, path=None, title=None, dpi=100):
        """Heatmap stage × position of the probability of the next token, the stage's top token written in
        each cell (``tokens``: the vocabulary's strings, a list or a function of an id)."""
        prob = self.next_token_probability()[:, batch]
        top = self.top(1)[0][:, batch, :-1, 0]
        name = (lambda i: str(tokens(int(i)))) if callable(tokens) else (lambda i: str(tokens[int(i)])) \
            if tokens is not None else (lambda i: str(int(i)))
        S, T = prob.shape
        fig = new_figure(max(5.0, 0.42 * T + 2.0), max(2.5, 0.32 * S + 1.6))
        ax = fig.subplots()
        im = ax.imshow(prob, cmap="Blues", vmin=0, vmax=1, aspect="auto")
        if T * S <= 600:
            for s in range(S):
                for t in np.flatnonzero(np.isfinite(prob[s])):              # no text on padding
                    ax.text(t, s, _short(name(top[s, t])), ha="center", va="center", fontsize=6,
                            color="white" if prob[s, t] > 0.6 else "black")
        ax.set_yticks(range(S))
        ax.set_yticklabels(self.stage_names, fontsize=7)
        set_token_ticks(ax, [f"{name(a)}→{name(b)}" for a, b in zip(self.ids[batch, :-1], self.ids[batch, 1:])],
                        "x", fig.get_figwidth() - 2.0)
        ax.set_xlabel("position (this token → the next one)", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="p(next token)")
        ax.set_title(title or "logit lens: each layer's residual stream read by the output layer", fontsize=9)
        return save_figure(fig, path, dpi)


def _short(s, n=4):
    s = s.replace("\n", "\\n").replace(" ", "␣").replace("$", r"\$")
    return s if len(s) <= n else s[:n - 1] + "…"


def logit_lens(model, ids, cache=None):
    """The ``LogitLens`` of a GPT on ids (T,) or (B, T), or a dict {"idx": ids, "attention_mask": mask}: each
    layer's residual stream (resid_pre of every layer, then resid_post of the last) through the final norm and
    the output layer. ``cache``: a run_with_cache cache of these ids (and mask), to reuse."""
    _check_gpt(model, "the logit lens")
    inputs = as_inputs(model, ids)
    idx, extra = inputs["idx"], mask_kwargs(model, inputs, "the logit lens")
    with eval_mode(model):
        if cache is None:
            _, cache = model.run_with_cache(idx, names_filter=lambda n: n.endswith(("hook_resid_pre",
                                                                                       "hook_resid_post")), **extra)
        L = model.n_layers
        stream = np.stack([cache["resid_pre", layer] for layer in range(L)] + [cache["resid_post", L - 1]])
        mask = extra.get("attention_mask")
        return LogitLens(unembed(model, stream), idx, None if mask is None else np.asarray(mask).astype(bool))


# -- direct logit attribution ---------------------------------------------------------------------------------
@dataclass
class LogitAttribution:
    """What each term of the final residual stream adds to a logit (or a logit difference), each (B,) or with
    the layer and head axes: ``embed`` (token + position embeddings), ``heads`` (B, L, H), ``attn_bias``
    (B, L), ``mlp`` (B, L), ``norm_bias`` (the final norm's β), ``logit`` (the model's, before a soft-cap).
    ``total()`` adds the terms up: it equals ``logit``."""
    embed: np.ndarray
    heads: np.ndarray
    attn_bias: np.ndarray
    mlp: np.ndarray
    norm_bias: np.ndarray
    logit: np.ndarray

    def total(self):
        """(B,): the sum of every term."""
        return self.embed + self.heads.sum(axis=(1, 2)) + self.attn_bias.sum(axis=1) + self.mlp.sum(axis=1) \
            + self.norm_bias

    def plot(self, batch=None, path=None, title=None, dpi=100):
        """Heatmap layer × head of the heads' terms (the mean over the batch, or one row ``batch``)."""
        v = self.heads.mean(axis=0) if batch is None else self.heads[batch]
        return plot_layer_head(v, "logit attribution", path, title or "direct logit attribution of each head",
                               dpi, diverging=True)


def plot_layer_head(values, label, path=None, title=None, dpi=100, diverging=False, vmin=None, vmax=None):
    """A layer × head heatmap with the values written in the cells (shared by the heads' figures)."""
    v = np.asarray(values, dtype=np.float64)
    L, H = v.shape
    fig = new_figure(max(3.4, 0.6 * H + 1.8), max(2.2, 0.5 * L + 1.2))
    ax = fig.subplots()
    if diverging:
        lim = max(np.nanmax(np.abs(v)), 1e-12)
        vmin, vmax, cmap = -lim, lim, "RdBu_r"
    else:
        cmap = "viridis"
    im = ax.imshow(v, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    if v.size <= 256:
        span = (vmax if vmax is not None else np.nanmax(v)) - (vmin if vmin is not None else np.nanmin(v))
        for layer in range(L):
            for head in range(H):
                dark = (not diverging and v[layer, head] < (vmin or 0) + 0.5 * span) or \
                    (diverging and abs(v[layer, head]) > 0.6 * vmax)
                ax.text(head, layer, f"{v[layer, head]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.set_xlabel("head", fontsize=8)
    ax.set_ylabel("layer", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03, label=label)
    ax.set_title(title or label, fontsize=9)
    return save_figure(fig, path, dpi)


def _frozen(norm, total):
    """The norm ``norm`` as a linear map with its scale frozen at its value on ``total`` (..., d): (f, β) with
    f(c) = γ ⊙ (c - mean c) / σ(total) (LayerNorm) or γ ⊙ c / rms(total) (RMSNorm), so that
    norm(total) = f(total) + β and f(Σ terms) = Σ f(term). γ is the scale the norm applies: Gemma's RMSNorm
    scales by 1 + weight (``RMSNormPlusOne.OFFSET``)."""
    x = total.astype(np.float64)
    gamma = norm.weight.data.astype(np.float64) + getattr(norm, "OFFSET", 0.0)
    if isinstance(norm, RMSNorm):
        scale = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + norm.eps)
        return (lambda c: gamma * c / scale), np.zeros_like(gamma)
    scale = np.sqrt(np.var(x, axis=-1, keepdims=True) + norm.eps)
    beta = np.zeros_like(gamma) if norm.bias is None else norm.bias.data.astype(np.float64)
    return (lambda c: gamma * (c - c.mean(axis=-1, keepdims=True)) / scale), beta


def effective_weight(layer, name):
    """(out, in) float64: the weight a linear layer multiplies by. A quantized layer's dequantized
    weight s·q; a LoRA-adapted layer's base weight plus each adapter's s·B A on its rows (the adapters'
    dropout is off in eval mode). ValueError for a layer with no such weight."""
    adapters, base = [], layer
    if isinstance(layer, LoRALinear):
        adapters, base = layer._adapters, layer._base
    if hasattr(base, "dequantized_weight"):
        W = np.array(base.dequantized_weight(), dtype=np.float64)
    elif getattr(base, "weight", None) is not None:
        W = np.array(base.weight.data, dtype=np.float64)
    else:
        raise ValueError(f"{name} ({type(base).__name__}) has no weight matrix to read; direct logit "
                         f"attribution needs a Linear, quantized or LoRA-adapted layer there")
    for rows, adapter in adapters:
        W[rows] += adapter.delta_weight().astype(np.float64)
    return W


def _direction(model, tokens, baseline_tokens, batch):
    """(B, d_model): the unembedding rows of the tokens (minus those of the baseline tokens)."""
    W = effective_weight(model.lm_head, "the output layer lm_head")
    d = W[_per_row(check_token_ids(tokens, len(W), "tokens"), batch, "tokens")]
    if baseline_tokens is not None:
        d = d - W[_per_row(check_token_ids(baseline_tokens, len(W), "baseline_tokens"), batch, "baseline_tokens")]
    return d


def _per_row(tokens, batch, what):
    """(batch,) token ids from one id or one per row; one ValueError for another count."""
    if tokens.ndim > 1 or (tokens.ndim == 1 and len(tokens) not in (1, batch)):
        raise ValueError(f"{what} must be one token id or one per batch row ({batch}), got shape {tokens.shape}")
    return np.broadcast_to(tokens, (batch,))


def direct_logit_attribution(model, ids, tokens=None, baseline_tokens=None, position=-1, cache=None):
    """The ``LogitAttribution`` of the logit of ``tokens`` (an id, or one per batch row; default: the token the
    model ranks first) at ``position``, or of the difference of logits ``tokens`` - ``baseline_tokens``.

    ids: (T,) or (B, T), or a dict {"idx": ids, "attention_mask": mask} (``position`` must then be a real token
    in every row: left padding); cache: a ``run_with_cache`` cache of these ids with every hook, to reuse. The
    terms are float64. Post-LN models are refused (ValueError)."""
    _check_gpt(model, "direct logit attribution")
    if any(b.norm_placement == "post" for b in model.config.layers):
        raise ValueError("direct logit attribution splits the residual stream, which post-LN blocks do not "
                         "keep (each sub-layer's output is normed with it); use a pre-norm or sandwich model")
    inputs = as_inputs(model, ids)
    idx, extra = inputs["idx"], mask_kwargs(model, inputs, "direct logit attribution")
    check_position(position, idx.shape[1])
    check_unpadded(extra, position, "direct logit attribution")
    with eval_mode(model):
        if cache is None:
            _, cache = model.run_with_cache(idx, **extra)
        last = cache["resid_post", model.n_layers - 1][:, position].astype(np.float64)
        if tokens is None:
            tokens = np.argmax(unembed(model, last), axis=-1)
    final, beta = _frozen(model.norm_f, last) if model.norm_f is not None else ((lambda c: c), 0.0 * last[0])
    direction = _direction(model, tokens, baseline_tokens, len(idx))

    def read(term):                             # (B, ..., d) -> (B, ...): through the frozen norm onto the logit
        term = np.moveaxis(term, 0, -2) if term.ndim > 2 else term
        out = np.sum(final(term) * direction, axis=-1)
        return np.moveaxis(out, -1, 0) if out.ndim > 1 else out

    embed = cache["embed"][:, position] + (cache["pos_embed"][:, position] if "hook_pos_embed" in cache else 0)
    heads, biases, mlps = [], [], []
    for layer, block in enumerate(model.blocks):
        head_terms, bias = _head_terms(block, cache, layer, position)
        heads.append(read(head_terms))
        biases.append(read(bias))
        mlps.append(read(cache["mlp_out", layer][:, position].astype(np.float64)) if block.ff is not None
                    else np.zeros(len(idx)))
    return LogitAttribution(read(embed.astype(np.float64)), np.stack(heads, axis=1), np.stack(biases, axis=1),
                            np.stack(mlps, axis=1), np.sum(beta * direction, axis=-1),
                            np.sum((final(last) + beta) * direction, axis=-1))


def _head_terms(block, cache, layer, position):
    """((B, H, d) each head's output z_h W_O,hᵀ, (B, d) the output bias) of a block's attention at
    ``position``, through the block's frozen post-attention norm in a sandwich."""
    attn = block.self_attn
    z = cache["z", layer][:, position].astype(np.float64)                    # (B, H, d_head)
    W = effective_weight(attn.out_proj, f"blocks.{layer}.attn.out_proj")
    W = W.reshape(attn.d_model, attn.n_heads, attn.d_head)
    heads = np.einsum("bhe,dhe->bhd", z, W)
    bias = np.zeros_like(heads[:, 0]) if attn.out_proj.bias is None else \
        np.broadcast_to(attn.out_proj.bias.data.astype(np.float64), heads[:, 0].shape)
    if block.config.norm_placement == "sandwich":
        post, beta = _frozen(block.post_norm1, heads.sum(axis=1) + bias)
        heads = post(heads.transpose(1, 0, 2)).transpose(1, 0, 2)
        bias = post(bias) + beta
    return heads, bias


__all__ = ["LogitLens", "LogitAttribution", "logit_lens", "direct_logit_attribution", "unembed",
           "plot_layer_head"]
