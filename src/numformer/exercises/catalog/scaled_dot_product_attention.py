"""Exercise ``scaled_dot_product_attention``: softmax(Q Kᵀ · scale + M) V with masks and dropout, and its
backward."""
from __future__ import annotations

import numpy as np

from ..checker import (FD_TOL, STANDARD_STEPS, Calls, Case, Exercise, Failure, Function, NewRng, Step,
                       check_gradients, describe, fixed_count, index_text, mask_dependence, run_backward, run_forward,
                       step_keywords)


def _qkv(lead=(2, 2), t_q=3, t_k=5, d_k=4, d_v=3, **options):
    def make(rng):
        return {"q": rng.standard_normal(lead + (t_q, d_k)), "k": rng.standard_normal(lead + (t_k, d_k)),
                "v": rng.standard_normal(lead + (t_k, d_v))} | options
    return make


def _with_mask(kind):
    def make(rng):
        inputs = _qkv()(rng)
        if kind == "padding":               # batch element 1 has its last two keys as padding
            mask = np.ones((2, 1, 1, 5), dtype=bool)
            mask[1, ..., 3:] = False
        elif kind == "float":
            mask = rng.standard_normal((3, 5))
        elif kind == "far":                 # query 2's scores lie 2000 below the others'
            mask = np.zeros((3, 5))
            mask[2] = -2000.0
        else:                               # query 1 of every head may attend to no key
            mask = rng.random((2, 2, 3, 5)) > 0.3
            mask[..., 0] = True
            mask[:, :, 1, :] = False
        return inputs | {"attn_mask": mask}
    return make


def _causal_and_padding(rng):
    inputs = _qkv(t_q=4, t_k=4, is_causal=True)(rng)
    mask = np.ones((2, 1, 1, 4), dtype=bool)
    mask[1, ..., 3] = False
    return inputs | {"attn_mask": mask}


def _causal_and_float(rng):
    inputs = _qkv(t_q=4, t_k=4, is_causal=True)(rng)
    return inputs | {"attn_mask": rng.standard_normal((4, 4))}


# Dropout is checked at two rates (at 0.5 alone, keep and drop swapped, or 1/p for 1/(1 - p), go unseen) on
# 4 x 4 items of 8 x 8 weights: the share dropped lies within 5 standard deviations of p.
DROPOUT_RATES = (0.5, 0.1)


def _dropout_case(p, seed=3):
    return Case("dropout_p", _qkv((4, 4), 8, 8, dropout_p=p, rng=NewRng(seed), need_weights=True))


def _dropped_weights(exercise, learner, reference, p, seed=3):
    """(where, dropped mask) of one call at rate p, its weights checked: each the reference's weight, zeroed or
    divided by 1 - p, the output those weights times v."""
    inputs = _dropout_case(p, seed).inputs()
    where = f"keyword case 'dropout_p={p}': {exercise.names[0]}({describe(inputs)}): "
    outputs, _ = run_forward(exercise, learner, inputs)
    out, weights = outputs["out"], outputs["weights"]
    probs = reference["scaled_dot_product_attention_forward"](**(inputs | {"dropout_p": 0.0, "rng": None}))[1]
    if weights is None or np.shape(weights) != probs.shape:
        raise Failure(where + f"with need_weights=True the weights (after dropout) of shape {probs.shape} are "
                              f"returned; got {None if weights is None else np.shape(weights)}")
    kept = np.isclose(weights, probs / (1 - p), rtol=1e-10, atol=0)
    dropped = weights == 0
    if not np.all(kept | dropped):
        i = tuple(np.argwhere(~(kept | dropped))[0])
        raise Failure(where + f"a weight after dropout is either 0 or the weight divided by 1 - p; at {index_text(i)} "
                              f"it is {weights[i]:.6g}, and the weight is {probs[i]:.6g}")
    if not np.allclose(out, weights @ inputs["v"], rtol=0, atol=1e-10):
        raise Failure(where + "the output is not the returned weights (after dropout) times v")
    return where, dropped


def step_keywords_and_dropout(exercise, learner, reference):
    """The keyword cases, then dropout_p, whose random keep-mask is the learner's own draw: at two rates, the
    returned weights are the reference's weights, zeroed or scaled by 1/(1 - p), a share near p of them
    zeroed, each on its own; the output is those weights times v; the draw comes from ``rng`` (the same seed
    gives the same mask, another seed another); the backward is checked by finite differences with the same
    draw."""
    step_keywords(exercise, learner, reference)
    draws = []
    for p in reversed(DROPOUT_RATES):                  # the first rate last: its mask is compared below
        where, dropped = _dropped_weights(exercise, learner, reference, p)
        draws += [(dropped, p)] + [(_dropped_weights(exercise, learner, reference, p, seed=s)[1], p) for s in (4, 5)]
        if abs(dropped.mean() - p) > 5 * np.sqrt(p * (1 - p) / dropped.size):
            raise Failure(where + f"{100 * dropped.mean():.0f}% of the weights are dropped; each one is dropped "
                                  f"with probability dropout_p = {p}")
        dependence = mask_dependence(dropped, ("batch element", "head"))
        if dependence:
            raise Failure(where + f"each weight is dropped on its own; here {dependence}")
    if not np.array_equal(_dropped_weights(exercise, learner, reference, p)[1], dropped):
        raise Failure(where + "two calls with generators of the same seed drop different weights: draw the "
                              "keep-mask from rng (not from np.random)")
    if np.array_equal(draws[-1][0], dropped):
        raise Failure(where + "generators of different seeds drop the same weights: draw the keep-mask from rng")
    if fixed_count(draws):
        raise Failure(where + "at both rates, generators of three seeds each drop exactly round(dropout_p · "
                              f"{dropped.size}) weights: drop each weight on its own, with probability dropout_p "
                              "(the count then varies from draw to draw), not a fixed number of weights")
    _dropout_gradients(exercise, learner, _dropout_case(p), where)


def _dropout_gradients(exercise, learner, case, where):
    arrays = {k: v for k, v in case.inputs().items() if k in ("q", "k", "v")}

    def forward():
        return run_forward(exercise, learner, case.inputs() | arrays)[0]["out"]

    def backward(dout):
        cache = run_forward(exercise, learner, case.inputs() | arrays)[1]
        return run_backward(exercise, learner, cache, {"out": dout})

    errors = check_gradients(forward, backward, arrays)
    bad = {k: e for k, e in errors.items() if not e < FD_TOL}
    if bad:
        raise Failure(where + "with the same keep-mask, your backward disagrees with finite differences of your "
                              "forward (" + "; ".join(f"d{k}: relative error {e:.2g}" for k, e in bad.items())
                      + "): the dropped weights pass no gradient, the kept ones 1/(1 - p) of it")


EXERCISE = Exercise(
    name="scaled_dot_product_attention",
    summary="softmax(Q Kᵀ · scale + M) V with masks, and its backward",
    functions=(
        Function("scaled_dot_product_attention_forward", """\
Attention(Q, K, V) = softmax(Q Kᵀ · scale + M) V, batched over every leading axis
(batch, heads). Returns (out, weights, cache).

q: (..., Tq, d_k)   k: (..., Tk, d_k)   v: (..., Tk, d_v)   ->   out: (..., Tq, d_v)
attn_mask: broadcastable to (..., Tq, Tk). Boolean: True where a query MAY attend
    (as torch.nn.functional.scaled_dot_product_attention); float: added to S.
is_causal: query i attends to keys j <= i (top-left aligned).
scale: 1/√d_k when None.
softcap: c > 0 caps the scaled scores to c·tanh(S / c) before the mask (Gemma 2);
    None: no cap.
dropout_p > 0: each weight dropped with probability dropout_p and the others
    scaled by 1/(1 - dropout_p), the keep-mask drawn from ``rng``.
weights: the weights (after dropout), (..., Tq, Tk), when need_weights, else None.
A query that may attend to no key gets all-zero weights, hence a zero output and
zero gradients, never NaN.""",
                 todos=("the scores S = Q Kᵀ · scale", "the soft-cap, when softcap is given", "the masks: is_causal, then attn_mask (bool or float)",
                        "P = softmax(S) over the keys (a fully masked row gives zeros)",
                        "dropout on P when dropout_p > 0", "out = P V; return (out, weights or None, cache)")),
        Function("scaled_dot_product_attention_backward", """\
Gradients of out from dout of shape (..., Tq, d_v). Returns (dq, dk, dv), shaped
as q, k, v.

Go back through out = P V, P = softmax(S) row by row, and S = Q Kᵀ · scale + M:
a matrix product, a softmax, a matrix product. The mask M is a constant; dropout
multiplies P by a constant mask; the soft-cap's derivative is 1 - tanh²(S / c).""",
                 todos=("dV and dP from out = P V", "dS from dP, row by row through the softmax",
                        "dQ and dK from S = Q Kᵀ · scale", "return (dq, dk, dv)")),
    ),
    grads=("q", "k", "v"),
    calls=Calls(outputs=("out", "weights"), differentiable=("out",)),
    case=Case("q (2, 2, 3, 4), k (2, 2, 5, 4), v (2, 2, 5, 3)", _qkv()),
    fd_case=Case("q (1, 2, 3, 4), k (1, 2, 5, 4), v (1, 2, 5, 3)", _qkv((1, 2))),
    edge_cases=(
        Case("a padding mask", _with_mask("padding"),
             why="a boolean mask of shape (2, 1, 1, 5), broadcast over heads and queries: batch element 1 may not "
                 "attend to its last two keys, in the forward and the backward"),
        Case("a float mask", _with_mask("float"), why="a float mask (3, 5) is added to the scores"),
        Case("rows far apart", _with_mask("far"),
             why="a float mask puts query 2's scores about 2000 below the others: each row of scores needs its "
                 "own shift in the softmax (one maximum over all the scores underflows that row to 0)"),
        Case("a fully masked row", _with_mask("row"),
             why="query 1 of every head may attend to no key: its weights, output and gradients are 0, never NaN"),
        Case("no batch axes", _qkv(()), why="q (3, 4), k (5, 4), v (5, 3)"),
    ),
    keyword_cases=(
        Case("is_causal=True", _qkv(t_q=4, t_k=4, is_causal=True), why="query i attends to keys j <= i"),
        Case("is_causal=True with more keys", _qkv(t_q=3, t_k=5, is_causal=True),
             why="the causal mask is aligned top-left: query i still attends to keys 0 … i"),
        Case("is_causal=True with a padding mask", _causal_and_padding,
             why="both masks apply: query i attends to keys j <= i that the mask (2, 1, 1, 4) lets it see (batch "
                 "element 1 may not attend to its last key)"),
        Case("is_causal=True with a float mask", _causal_and_float,
             why="both masks apply: the float mask (4, 4) is added to the scores of the keys j <= i, and the "
                 "keys after query i stay hidden"),
        Case("scale=0.3", _qkv(scale=0.3), why="the scores are Q Kᵀ · 0.3"),
        Case("scale=0.0", _qkv(scale=0.0), why="a scale of 0 is a scale (every score 0: uniform weights), not "
                                               "the default 1/√d_k"),
        Case("need_weights=True", _qkv(need_weights=True, is_causal=True),
             why="the weights are returned too, and compared"),
        Case("softcap=1.5", _qkv(t_q=4, t_k=4, is_causal=True, softcap=1.5),
             why="the scores capped to 1.5·tanh(S / 1.5) before the causal mask (masked keys stay masked), and "
                 "the cap's derivative in the backward"),
        Case("softcap=1.5 with a float mask", lambda rng: _with_mask("float")(rng) | {"softcap": 1.5},
             why="the cap comes before the mask: 1.5·tanh(S / 1.5) + M, not a cap of S + M"),
    ),
    hints=(
        "Forward: the mask is applied to the scores before the softmax (-inf where a key is hidden), so that the "
        "other weights still sum to 1; a row with no visible key needs the softmax's guard for all -inf rows.",
        "Backward of out = P V: like a linear layer, dV = Pᵀ dout and dP = dout Vᵀ (swap the last two axes, not "
        "all of them: np.swapaxes(a, -1, -2)).",
        "Backward of the softmax, row by row: dS = P ⊙ (dP - rowsum(dP ⊙ P)). Where P is 0 (a masked key) dS is "
        "0: use the P of the forward, masked, not one recomputed without the mask.",
        "S = Q Kᵀ · scale gives dQ = dS K · scale and dK = dSᵀ Q · scale. With dropout, use the dropped P "
        "(P times the keep-mask / (1 - p)) in out = P V and multiply dP by the same mask.",
    ),
    page="tutorials/backprop.md#attention",
    steps=STANDARD_STEPS[:-1] + (Step("keyword arguments", step_keywords_and_dropout),),
)
