"""Hook points: the named activations of a forward pass, to read (a cache) or to replace (patching), with
TransformerLens's names and calling conventions, so that its users' habits carry over.

    logits, cache = model.run_with_cache(ids)               # cache["blocks.0.attn.hook_pattern"]: (B, H, T, T)
    logits = model.run_with_hooks(ids, fwd_hooks=[("blocks.1.hook_resid_pre", fn)])
    def fn(activation, hook):                               # hook.name is the hook point's name
        return replacement                                  # or None: the array given, as the hook left it

A module marks a place in its forward pass with a ``HookPoint``: ``x = self.hook_resid_pre(x)``, and its
backward passes the gradient back through it: ``dx = self.hook_resid_pre.backward(dx)``. With no hook
attached the call returns its input and keeps nothing (one attribute test); training never pays for more.

What backward means under patching. A hook function is not differentiated (it is any Python code): its
result is taken as values written into the activation, and every element written is a constant of the
patched computation (no gradient flows through it to what produced the original value), as torch's
autograd does for ``act[...] = value``. Which elements are written:

* a hook that changes the array it is given in place (``act[:, pos] = v``, also through a view of it,
  ``act.flat[i] = v``, ``act.put(i, v)``, ``act.fill``, ``act *= 0``, ``np.copyto(act, ...)``,
  ``np.add.at(act, ...)``) and returns None or that array writes the elements it assigned, even those
  assigned an equal value, plus any whose value changed (the only ones counted for other in-place
  methods, ``act.sort()``); the others pass their gradient through unchanged;
* a hook that returns a new array (``act * 2``, ``np.where(...)``, another run's activation) writes
  every element: nothing upstream gets a gradient through the hook point. To patch a slice and keep
  the gradient of the rest, assign the slice in place.

So zero and mean ablation, and patching with another run's activations (whole, or a slice: a position, a
head) give exactly the gradients of the patched computation: what finite differences of the patched
forward give (tests/test_hooks.py checks it). A hook that computes a function of the activation is not
differentiated as that function. The decision is made in the forward pass and kept with the hook point
until backward, so ``model.backward`` after ``run_with_hooks`` (whose hooks are removed at its end) still
computes the patched computation's gradients.

Backward hooks (``bwd_hooks``, or ``dir="bwd"``) receive the gradient of the loss with respect to the hook
point's activation (of its output: after any replacement) while ``model.backward`` runs; like forward hooks
they may return a replacement. They fire only while attached, so attach them around both passes::

    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", save_grad)]):
        logits = model(ids); model.backward(dlogits)

Hook functions receive copies: keeping the array they are given, or changing it in place (TransformerLens's
``act[:, pos] = ...``, which with a None return replaces the activation), never touches the model's own arrays,
then or later: the model goes on with its own array when the hook wrote nothing, with a copy of the hook's
when it wrote, and with a copy of an array a hook returns. So the cache of ``run_with_cache`` holds arrays of
its own: changing an entry in place (``cache[name] *= 0.5``) changes neither the model nor its next backward.
The copy is an ndarray subclass that records the writes (its arithmetic gives plain arrays); a hook
returns None or a real-valued array of the activation's shape (anything else is a ValueError). A forward
pass whose hook raises leaves the model without a pass to go back through: ``model.backward`` then refuses.
"""
from __future__ import annotations

import contextlib
import difflib

import numpy as np

DIRECTIONS = ("fwd", "bwd")
_SEQ_FIRST = (0, 2, 1, 3)      # (B, H, T, d) <-> (B, T, H, d): its own inverse


class HookPoint:
    """One named activation. ``hook_point(x)`` runs the forward hooks on x (returns x itself when there are
    none); ``hook_point.backward(dy)`` runs the backward hooks and cuts the gradient of the elements a
    forward hook replaced (see the module docstring). ``name`` is set by the model that owns it
    (``HookedModel.hook_dict``)."""

    __slots__ = ("name", "fwd_hooks", "bwd_hooks", "_written")

    def __init__(self, name=None):
        self.name = name
        self.fwd_hooks, self.bwd_hooks = [], []
        self._written = None           # what the last hooked forward replaced: None, True (all) or a bool mask

    def __repr__(self):
        return f"HookPoint({self.name!r}, fwd={len(self.fwd_hooks)}, bwd={len(self.bwd_hooks)})"

    def add_hook(self, fn, dir="fwd"):
        """Attach ``fn(activation, hook)``: a forward hook (``dir="fwd"``) or a backward hook (``"bwd"``)."""
        if dir not in DIRECTIONS:
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        if not callable(fn):
            raise TypeError(f"a hook must be a function fn(activation, hook), got {type(fn).__name__}")
        (self.fwd_hooks if dir == "fwd" else self.bwd_hooks).append(fn)

    def remove_hook(self, fn, dir="fwd"):
        """Detach one hook ``fn`` attached with ``add_hook(fn, dir)`` (its last attachment)."""
        hooks = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
        for i in range(len(hooks) - 1, -1, -1):
            if hooks[i] is fn:
                del hooks[i]
                return

    def remove_hooks(self, dir="both"):
        """Detach every hook of direction ``dir``: "fwd", "bwd" or "both"."""
        if dir in ("fwd", "both"):
            self.fwd_hooks = []
        if dir in ("bwd", "both"):
            self.bwd_hooks = []

    def forget(self):
        """Forget what the last hooked forward replaced (a forward that skips this hook point)."""
        self._written = None

    # -- forward ------------------------------------------------------------------------------------------
    def __call__(self, x):
        if not self.fwd_hooks:
            self._written = None
            return x
        return self._run_forward(x)

    def seq_first(self, x):
        """The hook point of a per-head array held as (B, H, T, d): the hooks see it as (B, T, H, d), the
        layout TransformerLens gives hook_q, hook_k, hook_v (a transposed view both ways, no copy)."""
        if not self.fwd_hooks:
            self._written = None
            return x
        return self._run_forward(x.transpose(_SEQ_FIRST)).transpose(_SEQ_FIRST)

    def _run_forward(self, x):
        written = None
        for fn in list(self.fwd_hooks):
            given, log = _WriteLog.track(x)
            try:
                out = fn(given, self)
            finally:
                log.active = False              # an array the hook keeps records nothing more
            if out is None or log.is_whole(out):
                new = np.asarray(given)          # written in place: the elements written, and any changed
                changed = log.mask.reshape(x.shape) | ~((new == x) | (np.isnan(new) & np.isnan(x)))
                if changed.any():                # the model goes on with a copy: the hook may keep ``given``
                    x = np.array(new)
            else:                                # a new array replaces every element
                x = self._checked(out, x, "activation")
                changed = True
            written = changed if written is None else (written | changed)
        if written is not True:
            written = None if not written.any() else (True if written.all() else written)
        self._written = written
        return x

    def _checked(self, out, like, what):
        kind = "U" if isinstance(out, (str, bytes)) else np.asarray(out).dtype.kind
        if kind not in "biuf":
            raise ValueError(f"the hook on {self.name} returned {_describe(out)}; a hook returns None or a "
                             f"real-valued array of the {what}'s shape {like.shape}")
        if np.shape(out) != like.shape:
            raise ValueError(f"the hook on {self.name} returned an array of shape {np.shape(out)}; a replacement "
                             f"{what} must have the shape {like.shape} of the one it replaces")
        return np.array(out, dtype=like.dtype)     # a copy of its own: the hook may keep (and change) what it returned

    # -- backward -----------------------------------------------------------------------------------------
    @property
    def acts_in_backward(self):
        """Whether ``backward`` does anything: backward hooks attached, or elements replaced in forward."""
        return bool(self.bwd_hooks) or self._written is not None

    def backward(self, dy):
        """The gradient of the hook point's input from that of its output: the backward hooks see (and may
        replace) dy; the elements a forward hook replaced get zero."""
        for fn in list(self.bwd_hooks):
            out = fn(np.array(dy, copy=True), self)
            if out is not None:
                dy = self._checked(out, dy, "gradient")
        written, self._written = self._written, None
        if written is None:
            return dy
        return np.zeros_like(dy) if written is True else np.where(written, np.zeros((), dy.dtype), dy)

    def backward_seq_first(self, dy):
        """``backward`` of ``seq_first``: dy held as (B, H, T, d), the hooks see (B, T, H, d)."""
        if not self.acts_in_backward:
            return dy
        return self.backward(dy.transpose(_SEQ_FIRST)).transpose(_SEQ_FIRST)


def _describe(out):
    """A short description of what a hook returned, for its error message."""
    if isinstance(out, np.ndarray) or (np.isscalar(out) and not isinstance(out, (str, bytes))):
        return f"a {np.asarray(out).dtype} value" + (f" of shape {out.shape}" if np.ndim(out) else "")
    return f"a {type(out).__name__}"


class _WriteLog:
    """Which elements of the copy a forward hook receives are written through it: by item assignment
    (``act[:, pos] = v``, also through a view), ``fill``, an in-place ufunc or ``np.copyto``."""

    def __init__(self, root):
        self.root, self.active = root, True
        self.mask = np.zeros(root.size, bool)
        self._index = None

    @property
    def index(self):
        """0 … size-1, the root's flat indices (made on first use: most hooks write nothing)."""
        if self._index is None:
            self._index = np.arange(self.root.size, dtype=np.intp)
        return self._index

    @classmethod
    def track(cls, x):
        """(a C-ordered copy of x that records its writes, its log)."""
        given = np.array(x, copy=True, order="C").view(_Tracked)
        log = cls(given)
        given._log = log
        return given, log

    def indices(self, view):
        """The root's flat indices of the elements of ``view`` (an array shaped as ``view``), or None when
        they cannot be told (another dtype's view)."""
        size = self.root.itemsize
        if view.dtype.itemsize != size or any(st % size for st in view.strides):
            return None
        offset = (view.__array_interface__["data"][0] - self.root.__array_interface__["data"][0]) // size
        strides = tuple(st // size * self.index.itemsize for st in view.strides)
        return np.lib.stride_tricks.as_strided(self.index[offset:], view.shape, strides)

    def mark(self, view, key=Ellipsis, flat=False):
        """Record the writes into ``view[key]`` (``flat``: ``view.flat[key]``, key a flat C-order index)."""
        if not self.active:
            return
        index = self.indices(view)
        if index is None:
            self.mask[...] = True            # unknown layout: count every element as written
        else:
            self.mask[(index.ravel() if flat else index)[key]] = True

    def is_whole(self, out):
        """Whether the hook returned the array it was given (or a view of all of it in its order)."""
        if getattr(out, "_log", None) is not self or out.shape != self.root.shape:
            return False
        index = self.indices(out)
        return index is not None and np.array_equal(index.ravel(), self.index)


_WRITERS = {np.copyto, np.place, np.putmask, np.fill_diagonal}      # np.put calls ndarray.put


class _Tracked(np.ndarray):
    """The array a forward hook receives: an ndarray whose writes ``_WriteLog`` records (views share the
    log; results of arithmetic are plain arrays), so backward knows what the hook wrote."""

    def __array_finalize__(self, obj):
        log = getattr(obj, "_log", None)
        # only views of the given array record writes into it
        self._log = log if log is not None and np.may_share_memory(self, log.root) else None

    def __setitem__(self, key, value):
        if self._log is not None:
            self._log.mark(self, key.view(np.ndarray) if isinstance(key, _Tracked) else key)
        super().__setitem__(key, value)

    def fill(self, value):
        if self._log is not None:
            self._log.mark(self)
        super().fill(value)

    def put(self, indices, values, mode="raise"):
        """``ndarray.put``, its writes recorded (flat indices, wrapped or clipped as ``mode`` says)."""
        super().put(indices, values, mode)
        if self._log is not None and self.size:
            index = np.asarray(indices, dtype=np.intp).ravel()
            index = np.clip(index, 0, self.size - 1) if mode == "clip" else index % self.size
            self._log.mark(self, index, flat=True)

    @property
    def flat(self):
        """``ndarray.flat``, whose item assignments (``act.flat[i] = v``) are recorded."""
        return _TrackedFlat(self)

    @flat.setter
    def flat(self, value):
        if self._log is not None:
            self._log.mark(self)
        self.view(np.ndarray).flat = value

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = tuple(a.view(np.ndarray) if isinstance(a, _Tracked) else a for a in inputs)
        if method == "at" and isinstance(inputs[0], _Tracked) and inputs[0]._log is not None:
            inputs[0]._log.mark(inputs[0], plain[1])        # np.add.at(act, index, v) writes act[index]
        if out is not None:
            for a in out:
                if isinstance(a, _Tracked) and a._log is not None:
                    a._log.mark(a)
            kwargs["out"] = tuple(a.view(np.ndarray) if isinstance(a, _Tracked) else a for a in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return result

    def __array_function__(self, func, types, args, kwargs):
        if func in _WRITERS and isinstance(args[0], _Tracked) and args[0]._log is not None:
            args[0]._log.mark(args[0])
        return super().__array_function__(func, types, args, kwargs)


class _TrackedFlat:
    """``act.flat`` of the array a forward hook receives: numpy's flat iterator, with ``act.flat[key] = v``
    recorded as a write of those elements (everything else is the iterator's own)."""

    def __init__(self, array):
        self._array, self._flat = array, array.view(np.ndarray).flat

    def __setitem__(self, key, value):
        if self._array._log is not None:
            self._array._log.mark(self._array, key.view(np.ndarray) if isinstance(key, _Tracked) else key,
                                  flat=True)
        self._flat[key] = value

    def __getitem__(self, key):
        return self._flat[key]

    def __iter__(self):
        return iter(self._flat)

    def __len__(self):
        return len(self._flat)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._flat, dtype=dtype)

    def __getattr__(self, name):
        return getattr(self._flat, name)


def add_through_hook(module, point, x, *args, **kwargs):
    """``module(x, ...)`` for a module that adds an array to x (a position table), with that array through the
    hook point ``point`` (None: the module has none): (output, whether the array was computed apart, which
    happens only while ``point`` has a hook: a forward hook to see it, a backward hook to see its gradient)."""
    if point is None or not (point.fwd_hooks or point.bwd_hooks):
        if point is not None:
            point.forget()
        return module(x, *args, **kwargs), False
    return x + point(module(np.zeros_like(x), *args, **kwargs)), True


def add_through_hook_backward(module, point, dy, apart):
    """Backward of ``add_through_hook``: the gradient of x (the module's parameters' accumulate)."""
    if apart:
        module.backward(point.backward(dy))
        return dy
    return module.backward(dy)


def has_forward_hooks(module):
    """Whether a forward hook is attached to a hook point of ``module`` or of its sub-modules."""
    return any(isinstance(value, HookPoint) and value.fwd_hooks
               for m in module.modules() for value in vars(m).values())


class ActivationCache(dict):
    """{hook name: activation} of ``run_with_cache``, in the order of the forward pass. As TransformerLens's,
    ``cache["pattern", 1]`` is ``cache["blocks.1.attn.hook_pattern"]`` and ``cache["embed"]`` is
    ``cache["hook_embed"]`` (``act_name``); ``in`` and ``get`` read names the same way."""

    def __getitem__(self, key):
        key = _full_name(key, self.keys())
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            close = difflib.get_close_matches(str(key), list(self), n=3)
            raise KeyError(f"no activation {key!r} in the cache" + (f"; did you mean {close}?" if close else
                                                                     "")) from None

    def __contains__(self, key):
        return dict.__contains__(self, _full_name(key, self.keys()))

    def get(self, key, default=None):
        """``cache[key]`` (a full or a short name, as ``[]`` reads them), or ``default`` when it has none."""
        return dict.get(self, _full_name(key, self.keys()), default)


_ATTN = ("q", "k", "v", "z", "rot_q", "rot_k", "attn_scores", "pattern")
_MLP = ("pre", "post", "pre_linear")


def act_name(name, layer=None):
    """A hook's full name from TransformerLens's short form: ("pattern", 0) -> "blocks.0.attn.hook_pattern",
    ("resid_pre", 2) -> "blocks.2.hook_resid_pre", "embed" -> "hook_embed", ("normalized", 1, "ln2")
    is not supported: give the full name ("blocks.1.ln2.hook_normalized")."""
    if layer is None:
        return name if name.startswith("hook_") or "." in name else f"hook_{name}"
    if name in _ATTN:
        return f"blocks.{layer}.attn.hook_{name}"
    if name in _MLP:
        return f"blocks.{layer}.mlp.hook_{name}"
    return f"blocks.{layer}.hook_{name}"


def _is_short(name):
    """Whether ``name`` is TransformerLens's (name, layer) pair, e.g. ("pattern", 0)."""
    return isinstance(name, tuple) and len(name) == 2 and isinstance(name[0], str) and \
        isinstance(name[1], (int, np.integer))


def _full_name(name, points):
    """A hook name as given, or its full form from TransformerLens's short one (``act_name``):
    ("pattern", 0) or "embed", as ``ActivationCache`` reads them."""
    if _is_short(name):
        return act_name(*name)
    if isinstance(name, str) and name not in points and "." not in name:
        return act_name(name)
    return name


def _pairs(hooks, what):
    """``hooks`` as a list of (name, fn) pairs; one ValueError for anything else (a bare pair among them)."""
    hooks = list(hooks)
    if len(hooks) == 2 and callable(hooks[1]) and not isinstance(hooks[1], (tuple, list)):
        raise ValueError(f"{what} is a list of (name, fn) pairs; got one pair {tuple(hooks)!r}: "
                         f"write {what}=[(name, fn)]")
    for pair in hooks:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{what} is a list of (name, fn) pairs; got an item {pair!r}")
    return hooks


# Module attribute names -> TransformerLens's names, one dotted part at a time (the classifier's
# "encoder.layers" prefix is its own: HookedModel.HOOK_PREFIXES).
HOOK_PARTS = {"self_attn": "attn", "ff": "mlp", "norm1": "ln1", "norm2": "ln2", "post_norm1": "ln1_post",
              "post_norm2": "ln2_post", "norm_f": "ln_final"}


class HookedModel:
    """What a model with hook points offers (a mixin of ``Module`` subclasses: ``GPT``, ``EncoderClassifier``):
    ``hook_dict``, ``add_hook``, ``reset_hooks``, ``hooks(...)``, ``run_with_hooks``, ``run_with_cache``.

    A hook point is any ``HookPoint`` attribute of the model or of one of its sub-modules; its name is the
    module's dotted path with TransformerLens's names (``HOOK_PARTS``: ``self_attn`` is ``attn``, ``ff`` is
    ``mlp``, ``norm_f`` is ``ln_final``) followed by the attribute's name."""

    HOOK_PREFIXES = ()          # (path prefix, its name): e.g. ("encoder.layers.", "blocks.")

    def _hook_name(self, path, attribute):
        path = f"{path}." if path else ""
        for prefix, replacement in self.HOOK_PREFIXES:
            if path.startswith(prefix):
                path = replacement + path[len(prefix):]
                break
        parts = [HOOK_PARTS.get(p, p) for p in path.split(".") if p]
        return ".".join(parts + [attribute])

    @property
    def hook_dict(self):
        """{name: HookPoint} of every hook point of the model, in module order (read afresh at each call, so a
        module put in place with ``set_submodule`` brings its own)."""
        points = {}
        for path, module in self.named_modules():
            for attribute, value in vars(module).items():
                if isinstance(value, HookPoint):
                    value.name = self._hook_name(path, attribute)
                    points[value.name] = value
        return points

    def _matching(self, name, points):
        """The hook points a name (also a short one: ("pattern", 0), "embed"), or a filter function of
        the name, selects."""
        if callable(name):
            return [p for n, p in points.items() if name(n)]
        name = _full_name(name, points)
        if isinstance(name, str) and name in points:
            return [points[name]]
        close = difflib.get_close_matches(str(name), list(points), n=3)
        raise ValueError(f"{type(self).__name__} has no hook point {name!r}"
                         + (f"; did you mean {', '.join(close)}?" if close else "")
                         + " (model.hook_dict lists them)")

    def add_hook(self, name, fn, dir="fwd"):
        """Attach ``fn(activation, hook)`` at the hook point ``name`` (or at every hook point whose name a
        function ``name(hook_name)`` accepts); stays until ``reset_hooks``."""
        for point in self._matching(name, self.hook_dict):
            point.add_hook(fn, dir)

    def reset_hooks(self):
        """Remove every hook of every hook point."""
        for point in self.hook_dict.values():
            point.remove_hooks()

    @contextlib.contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True):
        """Attach [(name, fn), ...] for the ``with`` block (forward and backward passes run inside it); the
        hooks it attached are removed on leaving it, also on an exception (``reset_hooks_end=False`` keeps
        them). Hooks attached before, or by an enclosing ``hooks`` block, stay: the blocks nest."""
        points = self.hook_dict
        added = []
        try:
            for hooks, direction in ((fwd_hooks, "fwd"), (bwd_hooks, "bwd")):
                for name, fn in _pairs(hooks, f"{direction}_hooks"):
                    for point in self._matching(name, points):
                        point.add_hook(fn, direction)
                        added.append((point, fn, direction))
            yield self
        finally:
            if reset_hooks_end:
                for point, fn, direction in added:
                    point.remove_hook(fn, direction)

    def run_with_hooks(self, *args, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True, **kwargs):
        """The model's output on ``*args, **kwargs`` with the hooks attached for this call (removed at its end,
        also on an exception). ``model.backward`` afterwards gives the gradients of the patched computation."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end):
            return self(*args, **kwargs)

    def run_with_cache(self, *args, names_filter=None, **kwargs):
        """(output, ``ActivationCache``) of every hook point (or those ``names_filter`` selects: a name, a list
        of names, or a function of the name): copies taken in forward order, the cache's own (changing one
        changes neither the model nor its backward)."""
        points = self.hook_dict
        if names_filter is None:
            selected = list(points)
        elif isinstance(names_filter, str) or _is_short(names_filter):
            selected = [names_filter]
        elif callable(names_filter):
            selected = [n for n in points if names_filter(n)]
        else:
            selected = list(names_filter)
        cache = ActivationCache()

        def keep(activation, hook):
            cache[hook.name] = np.asarray(activation)    # a plain array, not the hook's write-recording one

        output = self.run_with_hooks(*args, fwd_hooks=[(n, keep) for n in selected], **kwargs)
        return output, cache


__all__ = ["HookPoint", "HookedModel", "ActivationCache", "act_name", "has_forward_hooks", "add_through_hook",
           "add_through_hook_backward", "HOOK_PARTS"]
