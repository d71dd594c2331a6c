"""Exercise ``dropout``: inverted dropout, whose random mask is the learner's own draw, and its backward."""
from __future__ import annotations

import numpy as np

from ..checker import (STANDARD_STEPS, Case, Exercise, Failure, Function, NewRng, Step, describe, index_text,
                       fixed_count, mask_dependence, run_backward, run_forward, step_edge_cases, step_keywords)

P = 0.3


def _inputs(shape=(100, 300), p=P, seed=0, **options):
    def make(rng):
        return {"x": rng.standard_normal(shape), "p": p, "rng": NewRng(seed)} | options
    return make


def _draw(exercise, learner, p, seed=0):
    """(x, y, cache) of one forward call at rate p with a generator of ``seed``."""
    inputs = Case("", _inputs(p=p, seed=seed)).inputs()
    outputs, cache = run_forward(exercise, learner, inputs)
    return inputs["x"], np.asarray(outputs["y"]), cache


def _check_rate(exercise, learner, p):
    """y is x with a share p of its entries zeroed and the others divided by 1 - p; the draw comes from rng."""
    x, y, _ = _draw(exercise, learner, p)
    where = f"{exercise.names[0]}(x (100, 300), p={p}, rng): "
    kept, dropped = np.isclose(y, x / (1 - p), rtol=1e-12, atol=0), y == 0
    if not np.all(kept | dropped):
        i = tuple(np.argwhere(~(kept | dropped))[0])
        raise Failure(where + f"every entry of y is either 0 or x / (1 - p); y{index_text(i)} = {y[i]:.6g} for "
                              f"x{index_text(i)} = {x[i]:.6g}")
    dependence = mask_dependence(dropped)
    if dependence:
        raise Failure(where + f"each entry is zeroed on its own, with probability p; here {dependence}")
    if abs(dropped.mean() - p) > 0.02:
        raise Failure(where + f"{100 * dropped.mean():.1f}% of the entries are zeroed; each one is zeroed with "
                              f"probability p = {p}")
    if not np.array_equal(_draw(exercise, learner, p)[1], y):
        raise Failure(where + "two calls with generators of the same seed drop different entries: draw the mask "
                              "from the rng argument (not from np.random), so that a run can be reproduced")
    other = _draw(exercise, learner, p, seed=1)[1]
    if np.array_equal(other, y):
        raise Failure(where + "generators of different seeds drop the same entries: draw the mask from the rng "
                              "argument")
    if fixed_count([(dropped, p), (other == 0, p), (_draw(exercise, learner, p, seed=2)[1] == 0, p)]):
        raise Failure(where + f"generators of three seeds all zero exactly {round(p * y.size)} entries: zero each "
                              f"entry on its own, with probability p (the count then varies from draw to draw), "
                              f"not a fixed number of entries")


def step_forward(exercise, learner, reference):
    _check_rate(exercise, learner, P)


def step_backward(exercise, learner, reference):
    """dx = dy ⊙ (the forward's y / x): the entries the forward dropped pass no gradient, the others 1/(1-p);
    the backward of a first call after a second call on another draw (a model's dropout layers all draw before
    any backward: a mask kept anywhere but the cache is the last layer's)."""
    x, y, cache = _draw(exercise, learner, P)
    _draw(exercise, learner, P, seed=1)
    dy = np.random.default_rng(1).standard_normal(x.shape)
    dx = np.asarray(run_backward(exercise, learner, cache, {"y": dy})["x"])
    want = dy * (y / x)
    i = np.unravel_index(int(np.abs(dx - want).argmax()), want.shape)
    if dx.shape != want.shape or not np.allclose(dx, want, rtol=1e-12, atol=1e-12):
        what = "a dropped entry (dx is 0 there)" if y[i] == 0 else \
            f"a kept entry (dx is dy / (1 - p) = {want[i]:.6g} there)"
        raise Failure(f"{exercise.names[1]} after {exercise.names[0]}(x (100, 300), p={P}, rng) and a second call "
                      f"with another seed: dx{index_text(i)} = {dx[i]:.6g} for dy{index_text(i)} = {dy[i]:.6g} at "
                      f"{what} of the first call's mask (the backward takes the mask from its own cache)")


def step_keywords_and_rates(exercise, learner, reference):
    step_keywords(exercise, learner, reference)
    _check_rate(exercise, learner, 0.9)


EXERCISE = Exercise(
    name="dropout",
    summary="inverted dropout with your own mask, and its backward",
    functions=(
        Function("dropout_forward", """\
y = x ⊙ m / (1 - p), with m_i = 0 with probability p and 1 otherwise, drawn from
the generator ``rng`` (a numpy.random.Generator). Returns (y, cache).

x: any shape   p: in [0, 1)   ->   y: the shape of x.
In evaluation (training=False), or with p = 0, y = x. The expected value of y is
x, so nothing changes at evaluation time.""",
                 todos=("the identity case", "draw the mask from rng", "scale the kept entries",
                        "return y and your cache (what the backward needs)")),
        Function("dropout_backward", """\
dx from dy: y_i = x_i m_i / (1 - p) is linear in x_i.   ->   dx: the shape of dy.""",
                 todos=("use the forward's mask", "return dx")),
    ),
    grads=("x",),
    case=Case("x (100, 300), p=0.3", _inputs()),
    fd_case=Case("x (3, 4), p=0.5", _inputs((3, 4), p=0.5, seed=2)),
    edge_cases=(
        Case("p=0", _inputs(p=0.0), why="p = 0 drops nothing: y = x and dx = dy"),
    ),
    keyword_cases=(
        Case("training=False", _inputs(training=False), why="in evaluation dropout is the identity: y = x, dx = dy"),
    ),
    hints=(
        "rng.random(x.shape) gives uniform numbers in [0, 1): comparing them with p gives a boolean mask. Which "
        "comparison keeps an entry with probability 1 - p?",
        "Divide the kept entries by 1 - p (inverted dropout): then E[y] = x, and evaluation needs no rescaling.",
        "Keep the scaled mask m / (1 - p) in the cache: the backward is dy times it.",
        "With training=False or p = 0 return x unchanged (a cache of None is fine) and let the backward return dy.",
    ),
    page="tutorials/backprop.md#dropout",
    steps=(STANDARD_STEPS[0], STANDARD_STEPS[1],
           Step("forward: zeroed with probability p, the rest scaled", step_forward),
           Step("backward: the forward's mask", step_backward),
           STANDARD_STEPS[4],
           Step("edge cases", step_edge_cases),
           Step("keyword arguments", step_keywords_and_rates)),
)
