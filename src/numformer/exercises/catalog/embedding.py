"""Exercise ``embedding``: the lookup y = E[ids] and its backward, a scatter-add into the table."""
from __future__ import annotations

import numpy as np

from ..checker import Case, Exercise, Function

V, D = 10, 4


def _ids(ids):
    def make(rng):
        return {"ids": np.array(ids), "E": rng.standard_normal((V, D))}
    return make


def _plug(functions):
    """The tied output layer adds its gradient into the embedding's: ``embedding_backward_into``."""
    backward = functions["embedding_backward"]

    def backward_into(dy, cache, out):
        out += backward(dy, cache)
        return out

    return {"embedding_forward": functions["embedding_forward"], "embedding_backward": backward,
            "embedding_backward_into": backward_into}


EXERCISE = Exercise(
    name="embedding",
    summary="y = E[ids], whose backward sums over repeated ids",
    functions=(
        Function("embedding_forward", """\
y[...] = E[ids[...]]: row ids[p] of the table for every position p.
Returns (y, cache).

ids: integer array of any shape (...)   E: (V, d)   ->   y: (..., d).""",
                 todos=("the lookup", "return y and your cache")),
        Function("embedding_backward", """\
dE from dy = ∂L/∂y of shape (..., d):
    dE[v] = Σ over the positions p with ids[p] = v of dy[p].

->   dE: (V, d), zero in the rows of ids that do not occur. A token that occurs
at several positions gets the sum of their gradients.""",
                 todos=("start from a zero table of E's shape", "add every position's gradient into its row",
                        "return dE")),
    ),
    grads=("E",),
    case=Case("ids (2, 3), all different, E (10, 4)", _ids([[1, 3, 5], [6, 0, 2]])),
    edge_cases=(
        Case("repeated ids", _ids([[1, 3, 3], [6, 0, 1]]),
             why="tokens 1 and 3 each occur twice in the batch, as characters do in any text"),
        Case("batch axes", _ids([[[2, 2], [7, 9]], [[9, 9], [9, 4]]]), why="ids of shape (2, 2, 2)"),
    ),
    hints=(
        "The forward is one indexing expression; the cache needs the ids and the shape of E.",
        "In the backward, a position p sends dy[p] to row ids[p]. What happens to your code when two positions "
        "send to the same row?",
        "dE[ids] += dy does not accumulate: NumPy evaluates the right side once per distinct index and keeps "
        "the last write. Look for a NumPy function that adds at indices without buffering.",
        "Flatten the ids to (N,) and dy to (N, d) first.",
    ),
    page="tutorials/backprop.md#embedding",
    plug=_plug,
)
