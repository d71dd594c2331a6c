"""The op pairs of the later decoders: logit soft-capping c·tanh(x/c) (Gemma 2), the GeGLU gate
GELU_tanh(a) ⊙ b (Gemma), attention with soft-capped scores and its own scale, and a Linear backward that
skips a frozen weight's gradient; each checked by finite differences in float64 and against torch autograd."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import kernels, ops

from conftest import F32_TOL, F64_TOL
from test_ops import check_op, torch, torch_parity


@pytest.mark.parametrize("cap", [0.5, 3.0, 50.0])
def test_softcap(rng, cap):
    arrays = {"x": 3 * rng.standard_normal((2, 3, 5))}
    check_op(lambda x: ops.softcap_forward(x, cap), ops.softcap_backward, arrays)
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(lambda x: ops.softcap_forward(x, cap), ops.softcap_backward,
                     lambda x: cap * torch.tanh(x / cap), arrays, dtype, tol)
    y, _ = ops.softcap_forward(np.array([-np.inf, 0.0, 1e9]), cap)
    np.testing.assert_allclose(y, [-cap, 0.0, cap])                     # bounded by ±c, 0 kept


def test_gelu_gate(rng):
    arrays = {"a": 2 * rng.standard_normal((2, 4, 6)), "b": rng.standard_normal((2, 4, 6))}
    check_op(ops.gelu_gate_forward, ops.gelu_gate_backward, arrays)
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(ops.gelu_gate_forward, ops.gelu_gate_backward,
                     lambda a, b: torch.nn.functional.gelu(a, approximate="tanh") * b, arrays, dtype, tol)


@pytest.mark.parametrize("scale,cap", [(None, 2.0), (0.3, None), (0.7, 1.5)])
def test_attention_with_its_own_scale_and_soft_capped_scores(rng, scale, cap):
    arrays = {"q": rng.standard_normal((2, 2, 4, 6)), "k": rng.standard_normal((2, 2, 5, 6)),
              "v": rng.standard_normal((2, 2, 5, 3))}
    mask = np.tril(np.ones((4, 5), dtype=bool), 1)

    def fwd(q, k, v):
        out, _, cache = ops.scaled_dot_product_attention_forward(q, k, v, attn_mask=mask, scale=scale, softcap=cap)
        return out, cache

    check_op(fwd, ops.scaled_dot_product_attention_backward, arrays)

    def tfn(q, k, v):
        s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if cap is not None:
            s = cap * torch.tanh(s / cap)
        s = s.masked_fill(~torch.from_numpy(mask), float("-inf"))
        return s.softmax(-1) @ v

    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, ops.scaled_dot_product_attention_backward, tfn, arrays, dtype, tol)


@pytest.mark.parametrize("module", [ops, kernels])
def test_linear_backward_without_the_weight_gradient(rng, module):
    x, W, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((6, 5)), rng.standard_normal(6)
    dy = rng.standard_normal((3, 4, 6))
    _, cache = module.linear_forward(x, W, b)
    dx, dW, db = module.linear_backward(dy, cache)
    _, cache = module.linear_forward(x, W, b)
    dx2, dW2, db2 = module.linear_backward(dy, cache, weight_grad=False)
    assert dW2 is None and dW is not None
    np.testing.assert_allclose(dx2, dx, rtol=1e-12)
    np.testing.assert_allclose(db2, db, rtol=1e-12)
