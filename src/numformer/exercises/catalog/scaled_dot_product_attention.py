"""Exercise ``scaled_dot_product_attention``: softmax(Q Kᵀ · scale + M) V with masks and dropout, and its
backward."""
from __future__ import annotations

import numpy as np

from ..checker import (FD_TOL, STANDARD_STEPS, Calls, Case, Exercise, Failure, Function, NewRng, Step,
                       check_gradients, describe, index_text, run_backward, run_forward, step_keywords)


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
        else:                               # query 1 of every head may attend to no key
            mask = rng.random((2, 2, 3, 5)) > 0.3
            mask[..., 0] = True
            mask[:, :, 1, :] = False
        return inputs | {"attn_mask": mask}
    return make


P_DROP = 0.5


def step_keywords_and_dropout(exercise, learner, reference):
    """The keyword cases, then dropout_p, whose random keep-mask is the learner's own draw: the returned weights
    are the reference's weights, zeroed or scaled by 1/(1 - p); the output is those weights times v; the draw
    comes from ``rng``; the backward is checked by finite differences with the same draw."""
    step_keywords(exercise, learner, reference)
    case = Case("dropout_p", _qkv((2, 4), 4, 6, dropout_p=P_DROP, rng=NewRng(3), need_weights=True))
    inputs = case.inputs()
    where = f"keyword case 'dropout_p={P_DROP}': {exercise.names[0]}({describe(inputs)}): "
    outputs, _ = run_forward(exercise, learner, inputs)
    out, weights = outputs["out"], outputs["weights"]
    probs = reference["scaled_dot_product_attention_forward"](
        **(case.inputs() | {"dropout_p": 0.0, "rng": None}))[1]
    if weights is None or np.shape(weights) != probs.shape:
        raise Failure(where + f"with need_weights=True the weights (after dropout) of shape {probs.shape} are "
                              f"returned; got {None if weights is None else np.shape(weights)}")
    kept = np.isclose(weights, probs / (1 - P_DROP), rtol=1e-10, atol=0)
    dropped = weights == 0
    if not np.all(kept | dropped):
        i = tuple(np.argwhere(~(kept | dropped))[0])
        raise Failure(where + f"a weight after dropout is either 0 or the weight divided by 1 - p; at {index_text(i)} "
                              f"it is {weights[i]:.6g}, and the weight is {probs[i]:.6g}")
    share = dropped.mean()
    if abs(share - P_DROP) > 0.15:
        raise Failure(where + f"{100 * share:.0f}% of the weights are dropped with dropout_p={P_DROP}")
    if not np.allclose(out, weights @ inputs["v"], rtol=0, atol=1e-10):
        raise Failure(where + "the output is not the returned weights (after dropout) times v")
    again = run_forward(exercise, learner, case.inputs())[0]["weights"]
    if not np.array_equal(again, weights):
        raise Failure(where + "two calls with generators of the same seed drop different weights: draw the "
                              "keep-mask from rng (not from np.random)")
    _dropout_gradients(exercise, learner, case, where)


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
        Case("a fully masked row", _with_mask("row"),
             why="query 1 of every head may attend to no key: its weights, output and gradients are 0, never NaN"),
        Case("no batch axes", _qkv(()), why="q (3, 4), k (5, 4), v (5, 3)"),
    ),
    keyword_cases=(
        Case("is_causal=True", _qkv(t_q=4, t_k=4, is_causal=True), why="query i attends to keys j <= i"),
        Case("is_causal=True with more keys", _qkv(t_q=3, t_k=5, is_causal=True),
             why="the causal mask is aligned top-left: query i still attends to keys 0 … i"),
        Case("scale=0.3", _qkv(scale=0.3), why="the scores are Q Kᵀ · 0.3"),
        Case("need_weights=True", _qkv(need_weights=True, is_causal=True),
             why="the weights are returned too, and compared"),
        Case("softcap=1.5", _qkv(t_q=4, t_k=4, is_causal=True, softcap=1.5),
             why="the scores capped to 1.5·tanh(S / 1.5) before the causal mask (masked keys stay masked), and "
                 "the cap's derivative in the backward"),
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
