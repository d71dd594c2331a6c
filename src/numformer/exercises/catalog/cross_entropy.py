"""Exercise ``cross_entropy``: mean cross-entropy of logits against class ids, fused with the softmax."""
from __future__ import annotations

import numpy as np

from ..checker import Calls, Case, Exercise, Function

C = 5


def _inputs(targets, scale=2.0, shift=0.0, **options):
    def make(rng):
        t = np.array(targets)
        return {"logits": rng.standard_normal(t.shape + (C,)) * scale + shift, "targets": t} | options
    return make


def _far_apart(rng):
    inputs = _inputs([0, 4, 2, 2, 1, 3])(rng)
    inputs["logits"][1] -= 2000.0
    return inputs


EXERCISE = Exercise(
    name="cross_entropy",
    summary="cross-entropy with ignore_index and label smoothing",
    functions=(
        Function("cross_entropy_forward", """\
Mean cross-entropy of ``logits`` against integer ``targets``, with the semantics of
torch.nn.functional.cross_entropy. Returns (loss, cache), loss a float.

logits: (..., C)   targets: (...), integers in [0, C) or ignore_index
    loss_n = (1 - ε) · (-log p_n[y_n]) + ε · mean_c(-log p_n[c])
    p_n = softmax(logits_n),  ε = label_smoothing
    loss = Σ_n loss_n / N, over the N positions whose target is not ignore_index
Stable for large logits (log-sum-exp). When every target is ignored the loss is 0
(torch gives NaN).""",
                 todos=("flatten to (N, C) and (N,)", "log p_n[c] by log-sum-exp",
                        "the per-position loss, with label smoothing", "the mean over the positions that count",
                        "return (loss, cache)")),
        Function("cross_entropy_backward", """\
dlogits = ∂(dloss · loss)/∂logits. Note the order of the arguments: (cache, dloss),
the scalar last.

->   dlogits: the shape of logits; zero at the ignored positions. Differentiate
-log softmax(z)_y with respect to z_j; label smoothing replaces the one-hot target
by a mixture with the uniform one.""",
                 todos=("the gradient of each counted position", "zero on ignored positions",
                        "divide by the number of counted positions and multiply by dloss", "return dlogits")),
    ),
    grads=("logits",),
    calls=Calls(outputs=("loss",), differentiable=("loss",), cache_first=True),
    case=Case("logits (6, 5), targets (6,)", _inputs([0, 4, 2, 2, 1, 3])),
    edge_cases=(
        Case("ignored targets", _inputs([0, -100, 2, -100, 1, 3]),
             why="targets equal to ignore_index (-100) give no loss and no gradient, and are not counted in N"),
        Case("every target ignored", _inputs([-100, -100, -100]),
             why="no position counts: numformer returns a loss of 0 and a zero gradient, never NaN"),
        Case("large logits", _inputs([0, 4, 2, 2, 1, 3], scale=300.0, shift=1000.0),
             why="logits near 1000 and spread by hundreds: exp overflows and a softmax underflows to 0"),
        Case("batch axes", _inputs([[0, 4, 2], [2, 1, 3]]), why="logits (2, 3, 5) and targets (2, 3)"),
        Case("positions far apart", _far_apart,
             why="position 1's logits lie about 2000 below the others: each position needs its own log-sum-exp "
                 "shift (one maximum over the whole array gives inf or NaN there)"),
    ),
    keyword_cases=(
        Case("label_smoothing=0.1", _inputs([0, 4, 2, 2, 1, 3], label_smoothing=0.1),
             why="the target distribution is (1 - ε) one-hot + ε / C"),
        Case("ignore_index=0", _inputs([0, 4, 2, 0, 1, 3], ignore_index=0),
             why="class 0 is the ignored one here (a padding id); -100 means nothing special"),
        Case("label_smoothing=0.2 with ignored targets", _inputs([0, -100, 2, 2, -100, 3], label_smoothing=0.2),
             why="ignored positions give no loss and no gradient, smoothing or not"),
    ),
    hints=(
        "-log softmax(z)_y = log Σ_c exp(z_c) - z_y. Compute the log-sum-exp with the row maximum subtracted, "
        "never the log of a softmax.",
        "∂/∂z_j of log Σ_c exp(z_c) - z_y is softmax(z)_j - [j = y]: keep the softmax in the cache.",
        "Label smoothing mixes the one-hot target with the uniform one, q = (1 - ε) onehot + ε / C: the "
        "gradient of each counted row is softmax(z) - q.",
        "Count N as the positions whose target is not ignore_index; multiply the ignored rows' gradient by 0, "
        "divide by max(N, 1), and scale by dloss.",
    ),
    page="tutorials/backprop.md#cross-entropy",
)
