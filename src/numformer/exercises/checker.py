"""The grader of ``numformer exercises check``: a learner's op pair against numformer's reference, step by step.

``check(exercise, functions)`` runs the steps in order and stops at the first failure:

1. import and signature: the file imports nothing of numformer but what its stub imports (read before it runs,
   ``exercises.imports``), and defines every function of the exercise, with the parameters and defaults of the
   reference in ``numformer.ops`` (the names of those every caller passes by position are the learner's);
2. shapes and dtype: every output and gradient has the reference's shape, float64 in gives float64 out,
   and neither forward nor backward writes into its arguments;
3. forward: equal to the reference within 1e-10 (float64, relative to the largest entry);
4. backward: every gradient equal to the reference's within 1e-10, for the same upstream gradient, after a
   second forward call on other inputs (those of the finite-difference case, then of each edge and keyword case);
5. finite differences: the learner's backward against central differences of the learner's own forward
   (``numformer.gradcheck.check_gradients``, the check the ops' own tests run);
6. edge cases: the inputs that catch real mistakes (a repeated id, a fully masked row, ignored targets,
   large logits, batch axes, broadcast parameters);
7. keyword arguments: every keyword argument at a value other than its default, at the same tolerance; a value
   the reference refuses (``Case.raises``) raises the reference's error.

A failure says which step failed, on which input and where (the output or gradient, its worst entry), never
what the code should be. The oracle is the reference op itself, the one the ops' own tests check by finite
differences and against torch; tests/test_exercises.py checks it against torch again on every input of the
grader that torch defines the same way. The cache is the learner's own: only the forward's outputs and the backward's
gradients are compared. An exercise whose op is random (dropout) or not a forward/backward pair (the AdamW
step) gives steps of its own (``Exercise.steps``).
"""
from __future__ import annotations

import inspect
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .. import ops
from ..gradcheck import check_gradients

_NOT_THEIRS = (Path(__file__).resolve().parents[1], Path(np.__file__).resolve().parent)   # numformer, NumPy
TOL = 1e-10          # forward and backward against the reference: float64, relative to the largest entry
FD_TOL = 1e-6        # the learner's backward against finite differences of the learner's forward
SEED = 0             # inputs; the upstream gradients use SEED + 1


class Failure(Exception):
    """A step failed; the message says what and where."""


@dataclass(frozen=True)
class NewRng:
    """A keyword argument that is a fresh ``numpy.random.Generator`` seeded with ``seed`` at every call, so that
    two calls of a random op (the learner's and the reference's, or two calls of finite differences) draw
    the same numbers."""
    seed: int = 0


@dataclass(frozen=True)
class Case:
    """One call of the op: ``make(rng)`` returns the forward's keyword arguments; ``why`` says what a failure
    on this case usually means (shown with the failure); ``name`` names the case; ``backward_options`` are
    keyword arguments the backward is called with; ``raises``: the exception the reference's forward refuses
    these arguments with (an unknown keyword value), which the learner's forward must raise too."""
    name: str
    make: Callable
    why: str = ""
    tol: float = TOL
    backward_options: tuple = ()       # (name, value) pairs: keyword arguments of the backward (linear's weight_grad)
    raises: type | None = None

    def inputs(self, seed=SEED):
        """The keyword arguments, fresh (new arrays, new generators) at every call."""
        return {k: np.random.default_rng(v.seed) if isinstance(v, NewRng) else v
                for k, v in self.make(np.random.default_rng(seed)).items()}


def normal_inputs(shapes, scale=1.0, **values):
    """A ``Case.make``: a standard normal array (times ``scale``) for each name of ``shapes`` (name -> shape),
    and the other keyword arguments as given."""
    def make(rng):
        return {name: rng.standard_normal(shape) * scale for name, shape in shapes.items()} | values
    return make


@dataclass(frozen=True)
class Function:
    """A function the learner writes: its name in ``numformer.ops`` (or the exercise's reference), the stub's
    docstring (shapes and equation) and the TODO lines of its body. ``positional``: how many of its leading
    parameters every caller (the model and the grader) passes by position, whose names are then the learner's
    to choose; None: a backward's gradients and cache (``Exercise.by_position``), none of another function's."""
    name: str
    doc: str
    todos: tuple = ()
    positional: int | None = None


@dataclass(frozen=True)
class Calls:
    """How an op pair is called: the forward returns (*outputs, cache); ``differentiable`` are the outputs
    backward takes a gradient of (the others, e.g. attention weights, are only compared); ``cache_first``:
    backward(cache, dloss) instead of backward(dy, cache) (cross-entropy, whose output is a scalar)."""
    outputs: tuple = ("y",)
    differentiable: tuple = ("y",)
    cache_first: bool = False


@dataclass(frozen=True)
class Exercise:
    """One exercise: the op pair to write, the inputs that grade it, and the hints.

    name: the op's name in ``numformer.ops`` without _forward/_backward; functions: what the learner writes
    (forward first); grads: the forward's arguments whose gradients backward returns, in order; case: the
    input of steps 2 to 5 (``fd_case``, a smaller one, for finite differences if given); edge_cases and
    keyword_cases: steps 6 and 7; page: where the docs derive the op; plug: the entries of
    ``numformer.nn.dispatch.OPS`` the learner's functions replace in ``numformer exercises train`` (a callable
    from the learner's functions to {name: function}); steps: replaces the standard steps; in_model: False for an
    exercise no model calls (the BPE merge step, or an op the models run fused), which ``numformer exercises
    train`` has no use for; model: the model that calls it ("gpt" or "llama", tests/test_exercises.py checks);
    route: for an op outside the models, the ``--set`` item of ``numformer exercises train`` that makes the model
    call it ("model.activation=relu2");
    allowed_imports: the helpers of numformer the stub imports for the learner, as dotted names
    ("numformer.ops.erf"): the only names of numformer a learner's file may import.
    """
    name: str
    summary: str
    functions: tuple
    grads: tuple = ()
    case: Case | None = None
    fd_case: Case | None = None
    edge_cases: tuple = ()
    keyword_cases: tuple = ()
    hints: tuple = ()
    page: str = ""
    calls: Calls = Calls()
    reference: object = ops
    plug: Callable | None = None
    steps: tuple | None = None
    in_model: bool = True
    model: str = "gpt"          # the model of ``numformer exercises train --model`` that calls the op
    route: str = ""
    allowed_imports: tuple = ()

    @property
    def names(self):
        return tuple(f.name for f in self.functions)

    def reference_functions(self):
        return {n: getattr(self.reference, n) for n in self.names}

    def by_position(self, name):
        """How many leading parameters of function ``name`` every caller passes by position: its ``positional``,
        else for the backward of a forward/backward pair the gradients and the cache it is called with
        (backward(dy, cache), backward(cache, dloss): ``run_backward``, as the model calls it), else 0."""
        function = self.functions[self.names.index(name)]
        if function.positional is not None:
            return function.positional
        return len(self.calls.differentiable) + 1 if self.grads and name == self.names[1] else 0


@dataclass(frozen=True)
class Step:
    title: str
    run: Callable            # run(exercise, learner functions, reference functions); raises Failure


@dataclass
class Report:
    """What ``check`` found: the titles of the steps passed, and the failed one with its message."""
    exercise: str
    passed: list = field(default_factory=list)
    failed: str | None = None
    message: str = ""

    @property
    def ok(self):
        return self.failed is None


def check(exercise, functions):
    """Run the exercise's steps on ``functions`` ({name: function}, e.g. a learner's module's namespace)."""
    report = Report(exercise.name)
    learner = {n: functions.get(n) for n in exercise.names}
    for step in exercise.steps or STANDARD_STEPS:
        try:
            with np.errstate(all="ignore"):
                step.run(exercise, learner, exercise.reference_functions())
        except Failure as failure:
            report.failed, report.message = step.title, str(failure)
            return report
        report.passed.append(step.title)
    return report


# -- calling the learner's code -----------------------------------------------------------------------------
def call(name, function, *args, **kwargs):
    """function(*args, **kwargs); an exception becomes a Failure naming the line of the learner's file."""
    try:
        return function(*args, **kwargs)
    except NotImplementedError:
        raise Failure(f"{name} is not written yet (it raises NotImplementedError, as the stub does): fill in its "
                      f"TODOs") from None
    except Exception as e:          # noqa: BLE001 -- any error of the learner's code is a failed step
        raise Failure(raised(name, e)) from None


def raised(name, error):
    """The words of a Failure for ``error`` raised in the learner's function ``name``: NAME raised TYPE: message
    at line N of FILE: code, that line the last of the learner's own frames."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not Path(f.filename).resolve().is_relative_to(_NOT_THEIRS[0])
              and not Path(f.filename).resolve().is_relative_to(_NOT_THEIRS[1])]
    where = f" at line {frames[-1].lineno} of {frames[-1].filename}: {frames[-1].line}" if frames else ""
    return f"{name} raised {type(error).__name__}: {error}{where}"


def run_forward(exercise, functions, inputs, learner=True):
    """(outputs {name: value}, cache) of the exercise's forward on ``inputs``."""
    name = exercise.names[0]
    result = call(name, functions[name], **inputs) if learner else functions[name](**inputs)
    n = len(exercise.calls.outputs) + 1
    if not isinstance(result, tuple) or len(result) != n:
        what = ", ".join(exercise.calls.outputs + ("cache",))
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise Failure(f"{name} must return ({what}), a tuple of {n}; it returned {got}")
    return dict(zip(exercise.calls.outputs, result[:-1])), result[-1]


def run_backward(exercise, functions, cache, upstream, learner=True, options=()):
    """{input name: gradient} of the exercise's backward, given {output name: upstream gradient} (``options``:
    (name, value) pairs of its keyword arguments)."""
    name = exercise.names[1]
    grads = [upstream[o] for o in exercise.calls.differentiable]
    args = (cache, *grads) if exercise.calls.cache_first else (*grads, cache)
    kwargs = dict(options)
    result = call(name, functions[name], *args, **kwargs) if learner else functions[name](*args, **kwargs)
    n = len(exercise.grads)
    if n == 1 and not isinstance(result, (tuple, list)):
        result = (result,)
    if not isinstance(result, (tuple, list)) or len(result) != n:
        what = ", ".join(f"d{g}" for g in exercise.grads)
        got = f"{len(result)} values" if isinstance(result, (tuple, list)) else type(result).__name__
        raise Failure(f"{name} must return ({what}), {n} gradient{'s' * (n > 1)}; it returned {got}")
    return dict(zip(exercise.grads, result))


def upstream_for(outputs, exercise, seed=SEED + 1):
    """A random gradient for each differentiable output (a float for a scalar output)."""
    rng = np.random.default_rng(seed)
    return {o: (float(rng.standard_normal()) if np.ndim(outputs[o]) == 0
                else rng.standard_normal(np.shape(outputs[o])))
            for o in exercise.calls.differentiable}


# -- comparing ------------------------------------------------------------------------------------------------
def index_text(i):
    """An array index as Python writes it: [0, 3] (NumPy's own integers would print as np.int64(0))."""
    return "[" + ", ".join(str(int(k)) for k in i) + "]" if len(i) else ""


def difference(label, got, want, tol=TOL):
    """None when ``got`` equals ``want`` within tol (relative to the largest entry of want), else what differs,
    where, and by how much."""
    if want is None:
        return None if got is None else f"{label} should be None here (as the reference returns), not a value"
    if got is None:
        return f"{label} is None; an array of shape {np.shape(want)} is expected"
    try:
        got = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return f"{label} is a {type(got).__name__}, not an array of numbers"
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return f"{label} has shape {got.shape}; {want.shape} is expected"
    same_inf = np.isinf(want) & (got == want)
    bad = ~np.isfinite(got) & ~same_inf
    if bad.any():
        i = np.argwhere(bad)[0]
        return (f"{label} is {got[tuple(i)]} at {label}{index_text(i)} where the reference is {want[tuple(i)]:.6g} "
                f"({int(bad.sum())} entr{'ies' if bad.sum() > 1 else 'y'} not finite)")
    if (np.isinf(want) & ~same_inf).any():
        i = np.argwhere(np.isinf(want) & ~same_inf)[0]
        return f"{label}{index_text(i)} is {got[tuple(i)]:.6g} where the reference is {want[tuple(i)]}"
    finite = np.isfinite(want)
    if not finite.any():
        return None
    scale = max(1.0, float(np.abs(want[finite]).max()))
    err = np.where(finite, np.abs(got - want), 0.0)
    if err.max() <= tol * scale:
        return None
    i = np.unravel_index(int(err.argmax()), err.shape)
    return (f"{label} differs from the reference by up to {err.max() / scale:.2g} (relative to its largest entry; "
            f"the tolerance is {tol:g}), most at {label}{index_text(i)}: yours {got[i]:.10g}, the reference's "
            f"{want[i]:.10g}")


def differences(values, reference, prefix="", tol=TOL):
    """The messages of every entry of ``values`` that differs from ``reference``, and the names that match."""
    wrong, right = [], []
    for name, want in reference.items():
        message = difference(prefix + name, values.get(name), want, tol)
        if message:
            wrong.append(message)
        elif want is not None:                  # None on both sides (weights not asked for) matches nothing
            right.append(prefix + name)
    return wrong, right


def fail_if_different(values, reference, prefix="", tol=TOL, context=""):
    wrong, right = differences(values, reference, prefix, tol)
    if wrong:
        matched = f"\n({', '.join(right)} match{'es' if len(right) == 1 else ''}.)" if right else ""
        raise Failure(context + "\n".join(wrong) + matched)


# A check on a mask's slices runs only where a mask drawn entry by entry would fail it with a chance below this.
CHANCE = 1e-6


def mask_dependence(dropped, items=()):
    """What makes a dropout mask (True = dropped, at least 2-D) not a draw of each entry on its own, or None:

    * every row dropped or kept whole, every column likewise, or the same mask along a leading axis (``items``
      names them: "batch element", "head") for every batch element or every head;
    * two rows, two columns or two items with the same mask (part of a draw used twice; with leading axes,
      row i is every item's row i);
    * the flattened mask repeating itself after some shift (a shorter draw repeated, as ``np.resize`` does);
    * the same number of entries dropped in every row, every column or every item (a fixed number of entries
      picked in each, where each entry is dropped on its own).

    The checks of the last three kinds run only where a mask drawn entry by entry at the mask's own rate would
    fail them with a chance below ``CHANCE``.
    """
    dropped = np.asarray(dropped, dtype=bool)
    fix = "draw a mask entry by entry, of the full shape"
    if np.all(dropped.all(axis=-1) | (~dropped).all(axis=-1)):
        return f"each row is dropped or kept whole: {fix}"
    if np.all(dropped.all(axis=-2) | (~dropped).all(axis=-2)):
        return f"each column is dropped or kept whole: {fix}"
    for axis, item in enumerate(items):
        if dropped.shape[axis] > 1 and np.all(dropped == dropped.take([0], axis=axis)):
            return f"every {item} has the same mask: {fix}"
    rate = float(dropped.mean())
    slices = [("row", dropped.ndim - 2), ("column", dropped.ndim - 1)] + [(item, a) for a, item in enumerate(items)]
    for name, axis in slices:
        found = _repeated_slice(np.moveaxis(dropped, axis, 0).reshape(dropped.shape[axis], -1), rate)
        if found:
            return f"{name}s {found[0]} and {found[1]} have the same mask: {fix}"
    shift = _period(dropped.reshape(-1))
    if shift:
        return f"the mask repeats itself every {shift} entries (in memory order): {fix}"
    own = [("row", dropped.reshape(-1, dropped.shape[-1])),
           ("column", np.swapaxes(dropped, -1, -2).reshape(-1, dropped.shape[-2]))]
    for name, flat in own + [(item, np.moveaxis(dropped, a, 0).reshape(dropped.shape[a], -1))
                             for a, item in enumerate(items)]:
        count = _same_count(flat, rate)
        if count is not None:
            return (f"every {name} has exactly {count} dropped entries: drop each entry on its own, with "
                    f"probability p (the count then varies), not a fixed number of entries")
    return None


def _repeated_slice(flat, rate):
    """The first two rows of ``flat`` (slices, entries) that are equal, or None; not checked (None) where two
    independent draws at ``rate`` would have some equal pair with a chance of ``CHANCE`` or more."""
    n, m = flat.shape
    agree = rate ** 2 + (1 - rate) ** 2                     # two entries drawn on their own are equal
    if n < 2 or n * (n - 1) / 2 * agree ** m >= CHANCE:
        return None
    seen = {}
    for i, row in enumerate(np.packbits(flat, axis=1)):
        j = seen.setdefault(row.tobytes(), i)
        if j != i:
            return j, i
    return None


def _same_count(flat, rate):
    """The count when every row of ``flat`` (slices, entries) has the same number of True entries, else None;
    not checked (None) where draws at ``rate`` would all agree with a chance of ``CHANCE`` or more (a binomial
    count takes its likeliest value with a chance of at most about 1/√(2π m p (1 - p)))."""
    n, m = flat.shape
    spread = 2 * np.pi * m * rate * (1 - rate)
    if n < 2 or spread <= 1 or spread ** (-(n - 1) / 2) >= CHANCE:
        return None
    counts = flat.sum(axis=1)
    return int(counts[0]) if np.all(counts == counts[0]) else None


def _period(flat):
    """The smallest shift s <= len/2 with flat[s:] == flat[:-s] (a draw of s entries repeated), or 0. Found
    from the autocorrelation of ±1 through an FFT: at shift s it is len - s exactly when every pair agrees."""
    n = flat.size
    rate = float(flat.mean()) if n else 0.0
    if n < 2 or n / 2 * (rate ** 2 + (1 - rate) ** 2) ** (n / 2) >= CHANCE:
        return 0
    signs = np.where(flat, 1.0, -1.0)
    spectrum = np.fft.rfft(signs, 2 * n)
    shifts = np.arange(1, n // 2 + 1)
    agreement = np.fft.irfft(spectrum * spectrum.conj(), 2 * n)[shifts]
    candidates = shifts[agreement > n - shifts - 0.5]
    return next((int(s) for s in candidates if np.array_equal(flat[s:], flat[:-s])), 0)


def fixed_count(draws):
    """True when every (mask, p) in ``draws`` (masks of other seeds or rates) drops exactly round(p · size)
    entries, as picking a fixed number of entries does. A draw entry by entry hits that count with a chance of
    about 1/√(2π · size · p (1 - p)) each (0.005 for 30,000 entries at p = 0.3): the callers pass enough draws
    for all of them to hit it with a chance below ``CHANCE``."""
    return all(int(np.sum(m)) == round(p * np.size(m)) for m, p in draws)


def describe(inputs):
    """The inputs of a call, in words: shapes of arrays, values of the rest."""
    parts = []
    for k, v in inputs.items():
        if isinstance(v, np.ndarray):
            parts.append(f"{k} {v.dtype.name}{tuple(v.shape)}" if v.dtype != np.float64 else f"{k} {tuple(v.shape)}")
        elif isinstance(v, np.random.Generator):
            parts.append(f"{k}=a Generator")
        elif hasattr(v, "to_dict"):                     # a RopeScaling: the fields that are set
            fields = ", ".join(f"{a}={b!r}" for a, b in v.to_dict().items())
            parts.append(f"{k}={type(v).__name__}({fields})")
        else:
            parts.append(f"{k}={v!r}")
    return ", ".join(parts)


# -- the standard steps ---------------------------------------------------------------------------------------
def _signature_text(function):
    return str(inspect.signature(function))


def step_signature(exercise, learner, reference):
    """Every function exists, is callable, and is called by the reference's calls as the reference is
    (``_misfit``)."""
    for name in exercise.names:
        function = learner.get(name)
        if function is None:
            raise Failure(f"the file defines no function {name}{_signature_text(reference[name])}")
        if not callable(function):
            raise Failure(f"{name} is a {type(function).__name__}, not a function")
        try:
            theirs = inspect.signature(function)
        except (TypeError, ValueError):
            continue
        ours = inspect.signature(reference[name])
        misfit = _misfit(theirs, ours, exercise.by_position(name))
        if misfit:
            raise Failure(f"{name}{theirs} has other parameters than the exercise's {name}{ours}: {misfit}. Keep "
                          f"the names, their order, the defaults and which may be given by position (the model "
                          f"calls it that way)")


_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _misfit(theirs, ours, free):
    """Why a call that the reference's signature ``ours`` takes, made as the model and the grader make it, would
    not call the learner's ``theirs`` the same way, in words; None when none. Every parameter keeps its place,
    its kind and the reference's default (a default where the reference has none is never used; a list for a
    tuple of the same items is the same default: it is only read); the first ``free`` come by position from every
    caller, so any name, and positional-only, is fine there. A keyword-only parameter is refused: the model passes
    some by position."""
    mine, reference = list(theirs.parameters.values()), list(ours.parameters.values())
    if len(mine) != len(reference):
        return f"{len(mine)} parameters where it has {len(reference)}"
    for i, (p, q) in enumerate(zip(mine, reference)):
        if i >= free and p.name != q.name:
            return f"parameter {i + 1} is {p.name}, not {q.name} (a caller passes it by name)"
        if p.kind != q.kind and not (i < free and p.kind in _BY_POSITION and q.kind in _BY_POSITION):
            return f"{p.name} is {p.kind.description}, where the exercise's {q.name} is {q.kind.description}"
        if q.default is not inspect.Parameter.empty and not _same_default(p.default, q.default):
            return f"{p.name} defaults to {_default_text(p.default)}, not {q.default!r}"
    return None


def _same_default(mine, reference):
    """True when the default ``mine`` computes as ``reference`` does: equal, or a list or tuple of the same items
    for a tuple (betas=[0.9, 0.999] for (0.9, 0.999))."""
    if isinstance(mine, (list, tuple)) and isinstance(reference, (list, tuple)):
        return len(mine) == len(reference) and all(map(_same_default, mine, reference))
    if mine is reference:
        return True
    if mine is inspect.Parameter.empty:
        return False
    try:
        return bool(mine == reference)
    except (TypeError, ValueError):                     # an array's == is no bool
        return False


def _default_text(default):
    return "nothing" if default is inspect.Parameter.empty else repr(default)


def _inputs_unchanged(name, before, after):
    for k, v in before.items():
        if isinstance(v, np.ndarray) and not np.array_equal(v, after[k], equal_nan=True):
            raise Failure(f"{name} changed its argument {k} in place (an in-place operation such as {k} -= ..., "
                          f"or {k}[...] = ..., writes into the caller's array); compute into new arrays")


def _arrays(values):
    """Copies of the arrays among ``values`` (a dict), to tell later whether a call wrote into them."""
    return {k: v.copy() for k, v in values.items() if isinstance(v, np.ndarray)}


def backward_writing_nothing(exercise, learner, call, upstream, options=()):
    """{input name: gradient} of the learner's backward after the forward ``call`` = (inputs, outputs, cache),
    given copies of ``upstream``; a Failure if it wrote into its upstream gradient, or through its cache into
    the forward's arguments or the outputs the caller holds (a softmax's y, attention's weights)."""
    inputs, outputs, cache = call
    kept_inputs, kept_outputs = _arrays(inputs), _arrays(outputs)
    given = {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in upstream.items()}
    backward = exercise.names[1]
    grads = run_backward(exercise, learner, cache, given, options=options)
    _inputs_unchanged(backward, {f"d{k}": v for k, v in upstream.items() if isinstance(v, np.ndarray)},
                      {f"d{k}": v for k, v in given.items()})
    _inputs_unchanged(f"{backward} (through the cache of {exercise.names[0]})", kept_inputs, inputs)
    for k, v in kept_outputs.items():
        if not np.array_equal(v, outputs[k], equal_nan=True):
            raise Failure(f"{backward} changed the output {k} of {exercise.names[0]} through the cache (an "
                          f"in-place operation on a cached array that is also the returned {k}): the caller "
                          f"still holds {k} and uses it; compute into new arrays")
    return grads


def step_shapes(exercise, learner, reference):
    """Outputs and gradients shaped as the reference's, float64, and no argument written into."""
    case = exercise.case
    inputs = case.inputs()
    kept = _arrays(inputs)
    outputs, cache = run_forward(exercise, learner, inputs)
    _inputs_unchanged(exercise.names[0], kept, inputs)
    ref_outputs, ref_cache = run_forward(exercise, reference, case.inputs(), learner=False)
    forward = f"{exercise.names[0]}({describe(inputs)})"
    for name, want in ref_outputs.items():
        _check_shape_and_dtype(f"{forward} returned {name}", outputs[name], want)
    upstream = upstream_for(ref_outputs, exercise)
    grads = backward_writing_nothing(exercise, learner, (inputs, outputs, cache), upstream)
    ref_grads = run_backward(exercise, reference, ref_cache, upstream, learner=False)
    for name, want in ref_grads.items():
        _check_shape_and_dtype(f"{exercise.names[1]} returned d{name}", grads[name], want)


def _check_shape_and_dtype(label, got, want):
    if want is None:
        if got is not None:
            raise Failure(f"{label} = a value where the reference returns None")
        return
    if got is None:
        raise Failure(f"{label} = None; an array of shape {np.shape(want)} is expected")
    if np.ndim(want) == 0 and not isinstance(want, np.ndarray):       # a scalar: the loss
        if np.ndim(got) != 0 or not np.issubdtype(np.asarray(got).dtype, np.floating):
            raise Failure(f"{label} of type {type(got).__name__} and shape {np.shape(got)}; a float is expected")
        if np.asarray(got).dtype != np.float64:
            raise Failure(f"{label} in {np.asarray(got).dtype}; float64 inputs give a float64 result")
        return
    if not isinstance(got, np.ndarray):
        raise Failure(f"{label} of type {type(got).__name__}; a NumPy array is expected")
    if got.shape != np.shape(want):
        raise Failure(f"{label} of shape {got.shape}; the shape {np.shape(want)} is expected")
    if got.dtype != want.dtype:
        raise Failure(f"{label} in {got.dtype}; float64 inputs give {want.dtype} (an intermediate in another "
                      f"dtype, or an integer array, changes it)")


def _compare_case(exercise, learner, reference, case, what):
    """Forward, then backward, of ``case`` against the reference; raises a Failure that starts with ``what``
    and ends with the case's ``why``."""
    inputs = case.inputs()
    why = f"\n({case.why})" if case.why else ""
    try:
        (_refused if case.raises else _compare)(exercise, learner, reference, case, inputs)
    except Failure as failure:
        raise Failure(f"{what}{failure}{why}") from None


def _compare(exercise, learner, reference, case, inputs):
    call_text = f"{exercise.names[0]}({describe(inputs)})"
    kept = _arrays(inputs)
    try:
        outputs, cache = run_forward(exercise, learner, inputs)
        _inputs_unchanged(exercise.names[0], kept, inputs)
    except Failure as failure:
        raise Failure(f"on {call_text}: {failure}") from None
    ref_outputs, ref_cache = run_forward(exercise, reference, case.inputs(), learner=False)
    fail_if_different(outputs, ref_outputs, "", case.tol, context=f"{call_text}:\n")
    upstream = upstream_for(ref_outputs, exercise)
    options = case.backward_options
    try:
        grads = backward_writing_nothing(exercise, learner, (inputs, outputs, cache), upstream, options)
    except Failure as failure:
        raise Failure(f"after {call_text}: {failure}") from None
    ref_grads = run_backward(exercise, reference, ref_cache, dict(upstream), learner=False, options=options)
    wrong, right = differences(grads, ref_grads, "d", case.tol)
    if wrong:
        matched = f"; {', '.join(right)} match{'es' if len(right) == 1 else ''}" if right else ""
        backward = exercise.names[1] + "".join(f" with {k}={v!r}" for k, v in options)
        raise Failure(f"{backward} after {call_text}:\n" + "\n".join(wrong)
                      + f"\n(the forward matches{matched})")


def _refused(exercise, learner, reference, case, inputs):
    """The learner's forward refuses ``inputs`` as the reference does: it raises ``case.raises`` (or a subclass)
    rather than another error or a result."""
    name = exercise.names[0]
    call_text = f"{name}({describe(inputs)})"
    try:
        reference[name](**case.inputs())
    except case.raises as e:
        want = f"the reference refuses it with {type(e).__name__}: {e}"
    else:
        raise RuntimeError(f"{call_text}: the reference raises no {case.raises.__name__} (the case is wrong)")
    try:
        learner[name](**inputs)
    except case.raises:
        return
    except Exception as e:          # noqa: BLE001 -- another error than the reference's is a failed step
        raise Failure(f"on {call_text}: {raised(name, e)}; {want}") from None
    raise Failure(f"{call_text} returned a result; {want}")


def step_forward(exercise, learner, reference):
    inputs = exercise.case.inputs()
    outputs, _ = run_forward(exercise, learner, inputs)
    ref_outputs, _ = run_forward(exercise, reference, exercise.case.inputs(), learner=False)
    fail_if_different(outputs, ref_outputs, tol=exercise.case.tol,
                      context=f"{exercise.names[0]}({describe(inputs)}):\n")


def step_backward(exercise, learner, reference):
    """The backward of a first forward call after a second one on other inputs, as a model's layers call them:
    those of the finite-difference case (of other shapes where it has one, drawn anew), then those of each edge
    and keyword case in turn (another axis, no bias, another scale or approximation; a case the learner's
    forward fails on is left to its own step). A backward that reads the last forward's arrays, shapes or flags
    from globals rather than its cache fails here. The first call's inputs, its outputs and the upstream
    gradient stay as they were (``backward_writing_nothing``)."""
    case = exercise.case
    ref_outputs, ref_cache = run_forward(exercise, reference, case.inputs(), learner=False)
    upstream = upstream_for(ref_outputs, exercise)
    ref_grads = run_backward(exercise, reference, ref_cache, dict(upstream), learner=False)
    _backward_after(exercise, learner, (upstream, ref_grads), (exercise.fd_case or case).inputs(seed=SEED + 2),
                    "on other inputs")
    for other in exercise.edge_cases + exercise.keyword_cases:
        if not other.raises:
            _backward_after(exercise, learner, (upstream, ref_grads), other.inputs(),
                            f"on the inputs of case '{other.name}' ({describe(other.inputs())})", tolerant=True)


def _backward_after(exercise, learner, want, second, what, tolerant=False):
    """The learner's backward of a call on the exercise's case, after a second forward call on ``second``,
    against ``want`` = (upstream gradient, the reference's gradients); ``tolerant``: nothing to check when the
    second call fails."""
    forward, backward = exercise.names
    upstream, ref_grads = want
    inputs = exercise.case.inputs()
    outputs, cache = run_forward(exercise, learner, inputs)
    try:
        run_forward(exercise, learner, second)
    except Failure:
        if tolerant:
            return
        raise
    context = (f"{backward} after {forward}({describe(inputs)}) and a second {forward} call {what}, the same "
               f"upstream gradient given to both (a backward takes what it needs from its own cache, not from the "
               f"last call: a value kept in a global is the last call's):\n")
    try:
        grads = backward_writing_nothing(exercise, learner, (inputs, outputs, cache), upstream)
    except Failure as failure:
        raise Failure(context + str(failure)) from None
    fail_if_different(grads, ref_grads, "d", exercise.case.tol, context=context)


def step_finite_differences(exercise, learner, reference):
    """The learner's backward against central differences of the learner's forward, on every input with a
    gradient."""
    case = exercise.fd_case or exercise.case
    inputs = case.inputs()
    arrays = {g: inputs[g] for g in exercise.grads
              if isinstance(inputs.get(g), np.ndarray) and inputs[g].dtype == np.float64}
    first = exercise.calls.differentiable[0]

    def current():
        fresh = case.inputs()
        return {**fresh, **arrays}

    def forward():
        return np.asarray(run_forward(exercise, learner, current())[0][first], dtype=np.float64)

    def backward(dout):
        _, cache = run_forward(exercise, learner, current())
        dout = float(dout) if np.ndim(dout) == 0 else dout
        return {k: v for k, v in run_backward(exercise, learner, cache, {first: dout}).items() if k in arrays}

    for k, dk in backward(np.ones_like(forward())).items():      # a wrong shape is no error of the maths
        if np.shape(dk) != arrays[k].shape:
            raise Failure(f"on {describe(inputs)}, your backward returns d{k} of shape {np.shape(dk)}; the shape of "
                          f"{k}, {arrays[k].shape}, is expected (the sum over the batch axes, whatever their number?)")
    errors = check_gradients(forward, backward, arrays)
    bad = {k: e for k, e in errors.items() if not e < FD_TOL}
    if bad:
        text = "; ".join(f"d{k}: relative error {e:.2g}" for k, e in bad.items())
        raise Failure(f"on {describe(inputs)}, your backward disagrees with central differences of your own "
                      f"forward ({text}; below {FD_TOL:g} is a pass): the backward does not differentiate the "
                      f"function your forward computes")


def step_edge_cases(exercise, learner, reference):
    for case in exercise.edge_cases:
        _compare_case(exercise, learner, reference, case, f"edge case '{case.name}': ")


def step_keywords(exercise, learner, reference):
    for case in exercise.keyword_cases:
        _compare_case(exercise, learner, reference, case, f"keyword case '{case.name}': ")


STANDARD_STEPS = (
    Step("import and signature", step_signature),
    Step("shapes and dtype", step_shapes),
    Step("forward against the reference", step_forward),
    Step("backward against the reference", step_backward),
    Step("finite differences of your forward", step_finite_differences),
    Step("edge cases", step_edge_cases),
    Step("keyword arguments", step_keywords),
)
