"""Exercise ``lora``: LoRA's low-rank update Δh = s · (x Aᵀ) Bᵀ, and its backward."""
from __future__ import annotations

import tracemalloc

import numpy as np

from ..checker import STANDARD_STEPS, Case, Exercise, Failure, Function, Step, call, normal_inputs

D_IN, D_OUT = 6, 4
# The memory step: a layer wide enough that B A (d_out × d_in float64, 8 MiB) dwarfs every array the
# low-rank computation needs (each at most positions × max(d_in, d_out), 48 KiB).
WIDE_IN, WIDE_OUT, WIDE_RANK, WIDE_LEAD = 1024, 1024, 4, (2, 3)


def _inputs(lead=(5,), r=2, scaling=2.0, zero_b=False):
    make = normal_inputs({"x": lead + (D_IN,), "A": (r, D_IN), "B": (D_OUT, r)}, scaling=scaling)

    def inputs(rng):
        values = make(rng)
        if zero_b:
            values["B"] = np.zeros_like(values["B"])
        return values
    return inputs


def _peak_bytes(run):
    """(run(), the peak of the memory traced while it ran, beyond what was traced before it)."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = run()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()


def step_low_rank_memory(exercise, learner, reference):
    """Forward and backward on a 1024 × 1024 layer of rank 4: neither may allocate as much as a quarter of
    the d_out × d_in matrix B A (tracemalloc's peak of the arrays made during each call; NumPy reports its
    buffers to it), which the low-rank computation never needs."""
    inputs = normal_inputs({"x": WIDE_LEAD + (WIDE_IN,), "A": (WIDE_RANK, WIDE_IN), "B": (WIDE_OUT, WIDE_RANK)},
                           scaling=2.0)(np.random.default_rng(0))
    dy = np.random.default_rng(1).standard_normal(WIDE_LEAD + (WIDE_OUT,))
    limit = WIDE_OUT * WIDE_IN * 8 // 4
    forward, backward = exercise.names
    for name, run in ((forward, lambda: call(forward, learner[forward], **inputs)),
                      (backward, lambda: call(backward, learner[backward], dy, cache))):
        result, peak = _peak_bytes(run)
        if name == forward:
            cache = result[1]
        if peak > limit:
            raise Failure(f"{name} with d_in = d_out = {WIDE_IN} and r = {WIDE_RANK} allocated {peak / 2**20:.1f} "
                          f"MiB at its peak: about the size of the {WIDE_OUT} × {WIDE_IN} matrix B A (8 MiB in "
                          f"float64), which LoRA never forms. Go through the rank-r subspace: u = x Aᵀ, then u Bᵀ "
                          f"(and backward, dy B before anything is multiplied by A)")


EXERCISE = Exercise(
    name="lora",
    summary="LoRA's low-rank update s·(x Aᵀ) Bᵀ and its three gradients",
    functions=(
        Function("lora_forward", """\
Δh = s · (x Aᵀ) Bᵀ, the update LoRA adds to a frozen linear layer's output
(Hu et al. 2021). Returns (y, cache).

x: (..., d_in), any number of leading axes   A: (r, d_in)   B: (d_out, r)
(PEFT's layout: lora_A, lora_B)   scaling s: a float (α / r; α / √r with rsLoRA)
->   y: (..., d_out). Compute u = x Aᵀ (..., r) first: the d_out × d_in product
B A is never needed.""",
                 todos=("u = x Aᵀ, the input in the rank-r subspace", "y = s · u Bᵀ",
                        "return y and your cache")),
        Function("lora_backward", """\
Gradients of Δh = s · (x Aᵀ) Bᵀ from dy of shape (..., d_out).
Returns (dx, dA, dB).

dx: (..., d_in)   dA: (r, d_in)   dB: (d_out, r), both summed over every leading
position. With u = x Aᵀ: y = s · u Bᵀ is a linear layer on u, and u = x Aᵀ a
linear layer on x; s appears once on the way down.""",
                 todos=("flatten the leading axes of dy, u and x into rows", "du and dB from y = s · u Bᵀ",
                        "dA and dx from u = x Aᵀ", "return (dx, dA, dB), dx in the shape of x")),
    ),
    grads=("x", "A", "B"),
    case=Case("x (5, 6), A (2, 6), B (4, 2), scaling 2", _inputs()),
    edge_cases=(
        Case("batch axes", _inputs((2, 3)),
             why="x has two leading axes (batch, time), as in a model: dA and dB sum over every position"),
        Case("one vector", _inputs(()), why="x is a single vector of shape (d_in,)"),
        Case("rank 1", _inputs(r=1), why="A (1, d_in) and B (d_out, 1): keep the rank axis, do not squeeze it"),
        Case("B = 0, a new adapter", _inputs((2, 3), zero_b=True),
             why="PEFT starts B at zero: Δh = 0 and dA = 0, while dB = s · dyᵀ u is not zero"),
    ),
    keyword_cases=(
        Case("scaling=α/√r (rsLoRA)", _inputs((2, 3), r=4, scaling=16 / np.sqrt(4)),
             why="scaling is whatever number the layer passes (α / r, or α / √r with use_rslora)"),
    ),
    hints=(
        "Two linear layers without bias in a row: u = x Aᵀ, then y = s · u Bᵀ. The linear exercise's "
        "gradients apply to each; go backwards, the second one first.",
        "Check the shapes: dB must be (d_out, r), and only one product of dy and u has that shape; dA must be "
        "(r, d_in), one product of du and x.",
        "s multiplies y, so it multiplies du and dB once; dA and dx are computed from du, which already holds "
        "it: multiplying them by s again counts it twice.",
        "With leading axes, reshape x to (-1, d_in), u to (-1, r) and dy to (-1, d_out) first: each position is "
        "a row and a matrix product sums over the rows. Give dx back the shape of x.",
    ),
    page="tutorials/chat-model.md#lora",
    in_model=False,
    steps=STANDARD_STEPS + (Step("the product B A never formed", step_low_rank_memory),),
)
