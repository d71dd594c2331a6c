"""Every op: finite differences in float64 and parity with torch autograd (float64 and float32)."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import ops
from numformer.gradcheck import check_gradients

from conftest import F32_TOL, F64_TOL, assert_close, assert_gradcheck

torch = pytest.importorskip("torch")


def T(a, grad=True):
    t = torch.from_numpy(np.array(a))
    return t.requires_grad_(grad) if t.is_floating_point() else t


def check_op(fwd, bwd, arrays):
    """fwd(**arrays) -> (y, cache); bwd(dy, cache) -> tuple of grads in the order of arrays."""
    names = list(arrays)

    def forward():
        return fwd(**arrays)[0]

    def backward(dy):
        y, cache = fwd(**arrays)
        grads = bwd(dy, cache)
        grads = grads if isinstance(grads, tuple) else (grads,)
        return dict(zip(names, grads))

    assert_gradcheck(check_gradients(forward, backward, arrays))


def torch_parity(fwd, bwd, torch_fn, arrays, dtype, tol, dy_seed=0):
    arrays = {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in arrays.items()}
    y, cache = fwd(**arrays)
    dy = np.random.default_rng(dy_seed).standard_normal(y.shape).astype(dtype)
    grads = bwd(dy, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)
    tens = {k: T(v) for k, v in arrays.items()}
    ty = torch_fn(**tens)
    ty.backward(torch.from_numpy(dy))
    assert_close(y, ty.detach().numpy(), tol, "forward")
    for (name, t), g in zip([(k, t) for k, t in tens.items() if t.is_floating_point()], grads):
        assert_close(g, t.grad.numpy(), tol, f"d{name}")


@pytest.mark.parametrize("bias", [True, False])
def test_linear(rng, bias):
    arrays = {"x": rng.standard_normal((2, 3, 4)), "W": rng.standard_normal((5, 4))}
    if bias:
        arrays["b"] = rng.standard_normal(5)

    def bwd(dy, cache):
        dx, dW, db = ops.linear_backward(dy, cache)
        return (dx, dW, db) if bias else (dx, dW)

    check_op(ops.linear_forward, bwd, arrays)
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(ops.linear_forward, bwd, lambda x, W, b=None: torch.nn.functional.linear(x, W, b), dict(arrays),
                     dtype, tol)


def test_embedding(rng):
    E = rng.standard_normal((7, 4))
    ids = np.array([[1, 3, 3], [6, 0, 1]])

    def fwd(E):
        return ops.embedding_forward(ids, E)

    check_op(fwd, lambda dy, c: ops.embedding_backward(dy, c), {"E": E})
    tE = T(E)
    y = torch.nn.functional.embedding(torch.from_numpy(ids), tE)
    dy = rng.standard_normal(y.shape)
    y.backward(torch.from_numpy(dy))
    y2, cache = fwd(E)
    assert_close(y2, y.detach().numpy(), F64_TOL)
    assert_close(ops.embedding_backward(dy, cache), tE.grad.numpy(), F64_TOL)


def _ln_torch(x, gamma, beta):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], gamma, beta, eps=1e-5)


def test_layer_norm(rng):
    arrays = {"x": rng.standard_normal((2, 3, 6)) * 3 + 1, "gamma": rng.standard_normal(6),
              "beta": rng.standard_normal(6)}
    check_op(ops.layer_norm_forward, ops.layer_norm_backward, arrays)
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(ops.layer_norm_forward, ops.layer_norm_backward, _ln_torch, arrays, dtype, tol)


def test_rms_norm(rng):
    arrays = {"x": rng.standard_normal((2, 3, 6)) * 2, "gamma": rng.standard_normal(6)}
    check_op(ops.rms_norm_forward, ops.rms_norm_backward, arrays)

    def t_rms(x, gamma):
        return torch.nn.functional.rms_norm(x, x.shape[-1:], gamma, eps=1e-6)

    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(ops.rms_norm_forward, ops.rms_norm_backward, t_rms, arrays, dtype, tol)


def test_batch_statistics_norm(rng):
    arrays = {"x": rng.standard_normal((3, 4, 5)) * 2 - 1, "gamma": rng.standard_normal(5),
              "beta": rng.standard_normal(5)}
    check_op(ops.batch_norm_forward, ops.batch_norm_backward, arrays)

    def t_bn(x, gamma, beta):
        y = torch.nn.functional.batch_norm(x.reshape(-1, x.shape[-1]), None, None, gamma, beta, training=True,
                                           eps=1e-5)
        return y.reshape(x.shape)

    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(ops.batch_norm_forward, ops.batch_norm_backward, t_bn, arrays, dtype, tol)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family(rng, name):
    fwd = getattr(ops, f"{name}_forward")
    bwd = getattr(ops, f"{name}_backward")
    arrays = {"x": rng.standard_normal((3, 4, 5)) * 3}
    check_op(fwd, bwd, arrays)
    tfn = getattr(torch, name)
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, bwd, lambda x: tfn(x, dim=-1), arrays, dtype, tol)


def test_softmax_large_logits_and_masked_rows():
    x = np.array([[1000.0, 1001.0, -np.inf], [-np.inf, -np.inf, -np.inf]])
    y, cache = ops.softmax_forward(x)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y[0, :2], [1 / (1 + np.e), np.e / (1 + np.e)])
    assert np.all(y[1] == 0)
    assert np.all(np.isfinite(ops.softmax_backward(np.ones_like(x), cache)))
    ls, _ = ops.log_softmax_forward(np.array([[1000.0, 0.0]]))
    np.testing.assert_allclose(ls, [[0.0, -1000.0]], atol=1e-12)


def test_relu(rng):
    x = rng.standard_normal((4, 5))
    x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink for finite differences
    check_op(ops.relu_forward, ops.relu_backward, {"x": x})
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(ops.relu_forward, ops.relu_backward, torch.relu, {"x": x}, dtype, tol)


def test_relu_squared(rng):
    x = rng.standard_normal((4, 5)) * 2
    x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink for finite differences
    check_op(ops.relu_squared_forward, ops.relu_squared_backward, {"x": x})
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(ops.relu_squared_forward, ops.relu_squared_backward, lambda x: torch.relu(x).square(),
                     {"x": x}, dtype, tol)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(rng, approximate):
    x = rng.standard_normal((4, 7)) * 3

    def fwd(x):
        return ops.gelu_forward(x, approximate)

    check_op(fwd, ops.gelu_backward, {"x": x})
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, ops.gelu_backward, lambda x: torch.nn.functional.gelu(x, approximate=approximate),
                     {"x": x}, dtype, tol)


def test_erf_float32_and_float64_accuracy():
    x = np.linspace(-6, 6, 20001)
    ref = torch.special.erf(torch.from_numpy(x)).numpy()
    assert np.max(np.abs(ops.erf(x) - ref)) < 1e-15
    x32 = x.astype(np.float32)
    ref32 = torch.special.erf(torch.from_numpy(x32.astype(np.float64))).numpy()
    assert np.max(np.abs(ops.erf(x32) - ref32)) < 4e-7   # A&S 7.1.26 bound 1.5e-7, plus float32 rounding
    small = np.abs(x32) < 0.5
    rel = np.abs(ops.erf(x32) - ref32)[small] / np.maximum(np.abs(ref32[small]), 1e-30)
    assert rel.max() < 1e-6   # no cancellation near zero
    assert ops.erf(x32).dtype == np.float32


def test_erf_of_integers_is_computed_in_float64_as_torch_promotes_them():
    got = ops.erf(np.array([0, 1, -2]))
    ref = torch.special.erf(torch.tensor([0, 1, -2])).double().numpy()      # torch: float32 for integers
    assert got.dtype == np.float64 and np.abs(got - ref).max() < 1e-7 and got[1] > 0.84
    assert ops.erf(np.array([True]))[0] == ops.erf(1.0)


def test_dropout_statistics_and_gradient(rng):
    x = np.ones((200, 500))
    y, mask = ops.dropout_forward(x, 0.3, np.random.default_rng(0))
    assert abs((y == 0).mean() - 0.3) < 0.01
    np.testing.assert_allclose(y[y != 0], 1 / 0.7)
    dy = rng.standard_normal(x.shape)
    np.testing.assert_array_equal(ops.dropout_backward(dy, mask), dy * mask)
    y_eval, c = ops.dropout_forward(x, 0.3, np.random.default_rng(0), training=False)
    assert y_eval is x and c is None
    # Same seed, same mask: a run is reproducible.
    y2, _ = ops.dropout_forward(x, 0.3, np.random.default_rng(0))
    np.testing.assert_array_equal(y, y2)


# -- attention -----------------------------------------------------------------------------------
def _attn_arrays(rng, B=2, H=2, Tq=3, Tk=4, dk=5, dv=3):
    return {"q": rng.standard_normal((B, H, Tq, dk)), "k": rng.standard_normal((B, H, Tk, dk)),
            "v": rng.standard_normal((B, H, Tk, dv))}


def _masks(rng, Tq, Tk):
    bool_mask = rng.random((Tq, Tk)) > 0.3
    bool_mask[:, 0] = True  # no fully masked row in the parity cases
    float_mask = rng.standard_normal((Tq, Tk))
    padding = np.ones((2, 1, 1, Tk), dtype=bool)
    padding[1, ..., -2:] = False
    return {"none": None, "bool": bool_mask, "float": float_mask, "padding": padding}


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "padding", "causal"])
@pytest.mark.parametrize("lengths", [(3, 3), (3, 4)])
def test_attention(rng, mask_kind, lengths):
    Tq, Tk = lengths
    arrays = _attn_arrays(rng, Tq=Tq, Tk=Tk)
    causal = mask_kind == "causal"
    mask = None if causal else _masks(rng, Tq, Tk)[mask_kind]

    def fwd(q, k, v):
        out, _, cache = ops.scaled_dot_product_attention_forward(q, k, v, attn_mask=mask, is_causal=causal)
        return out, cache

    check_op(fwd, ops.scaled_dot_product_attention_backward, arrays)

    def tfn(q, k, v):
        m = None if mask is None else torch.from_numpy(mask).to(q.dtype if mask.dtype != bool else torch.bool)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)

    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, ops.scaled_dot_product_attention_backward, tfn, arrays, dtype, tol)


def test_attention_returns_weights(rng):
    a = _attn_arrays(rng)
    out, w, _ = ops.scaled_dot_product_attention_forward(**a, need_weights=True)
    assert w.shape == (2, 2, 3, 4)
    np.testing.assert_allclose(w.sum(-1), 1.0)
    np.testing.assert_allclose(w @ a["v"], out)
    _, w_none, _ = ops.scaled_dot_product_attention_forward(**a)
    assert w_none is None


def test_attention_fully_masked_row_gives_zeros_not_nan(rng):
    a = _attn_arrays(rng)
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False  # query 1 may attend nothing
    out, w, cache = ops.scaled_dot_product_attention_forward(**a, attn_mask=mask, need_weights=True)
    assert np.all(np.isfinite(out)) and np.all(out[:, :, 1] == 0) and np.all(w[:, :, 1] == 0)
    grads = ops.scaled_dot_product_attention_backward(np.ones_like(out), cache)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.all(grads[0][:, :, 1] == 0)


def test_attention_dropout_gradients(rng):
    arrays = _attn_arrays(rng)

    def fwd(q, k, v):
        out, _, cache = ops.scaled_dot_product_attention_forward(q, k, v, dropout_p=0.3,
                                                                 rng=np.random.default_rng(7))
        return out, cache

    check_op(fwd, ops.scaled_dot_product_attention_backward, arrays)


# -- cross-entropy -------------------------------------------------------------------------------
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy(rng, smoothing, ignore):
    logits = rng.standard_normal((3, 4, 6)) * 2
    targets = rng.integers(0, 6, size=(3, 4))
    if ignore:
        targets[0, :2] = -100
        targets[2, 3] = -100

    def fwd(logits):
        loss, cache = ops.cross_entropy_forward(logits, targets, label_smoothing=smoothing)
        return np.array(loss), cache

    check_op(fwd, lambda dy, c: ops.cross_entropy_backward(c, float(dy)), {"logits": logits})
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        x = logits.astype(dtype)
        loss, cache = ops.cross_entropy_forward(x, targets, label_smoothing=smoothing)
        tx = T(x)
        tl = torch.nn.functional.cross_entropy(tx.reshape(-1, 6), torch.from_numpy(targets).reshape(-1),
                                               ignore_index=-100, label_smoothing=smoothing)
        tl.backward()
        assert_close(loss, tl.item(), tol, "loss")
        assert_close(ops.cross_entropy_backward(cache), tx.grad.numpy(), tol, "dlogits")


def test_cross_entropy_all_ignored_is_zero_not_nan():
    loss, cache = ops.cross_entropy_forward(np.zeros((2, 3)), np.array([-100, -100]))
    assert loss == 0.0
    assert np.all(ops.cross_entropy_backward(cache) == 0)


def test_cross_entropy_bad_targets():
    with pytest.raises(ValueError, match=r"target ids must be in \[0, 3\)"):
        ops.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="do not match"):
        ops.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 1, 2]))
