"""The op pairs of fine-tuning: LoRA's low-rank update, sequence log-probabilities and the DPO loss; each
checked by finite differences in float64 and against torch autograd (forward and every gradient)."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import ops

from conftest import F32_TOL, F64_TOL, assert_close
from test_ops import check_op, torch, torch_parity


@pytest.mark.parametrize("scaling", [1.0, 2.0, 16 / 8 ** 0.5])
def test_lora(rng, scaling):
    arrays = {"x": rng.standard_normal((2, 3, 6)), "A": rng.standard_normal((4, 6)),
              "B": rng.standard_normal((5, 4))}
    fwd = lambda x, A, B: ops.lora_forward(x, A, B, scaling)                # noqa: E731
    check_op(fwd, ops.lora_backward, arrays)
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, ops.lora_backward, lambda x, A, B: scaling * (x @ A.T) @ B.T, arrays, dtype, tol)


def test_lora_update_is_the_product_of_its_factors(rng):
    x, A, B = rng.standard_normal((3, 6)), rng.standard_normal((2, 6)), rng.standard_normal((5, 2))
    y, _ = ops.lora_forward(x, A, B, 0.5)
    np.testing.assert_allclose(y, x @ (0.5 * B @ A).T, rtol=1e-12)       # = x ΔWᵀ with ΔW = s·B A
    assert np.all(ops.lora_forward(x, A, np.zeros_like(B), 0.5)[0] == 0)  # B = 0 at init: no change


def _logp_case(rng):
    labels = rng.integers(0, 7, size=(3, 5))
    labels[0, :2] = -100                                                  # a prompt: not counted
    labels[2, 4] = -100
    return {"logits": rng.standard_normal((3, 5, 7))}, labels


def test_sequence_logprob(rng):
    arrays, labels = _logp_case(rng)
    fwd = lambda logits: ops.sequence_logprob_forward(logits, labels)     # noqa: E731
    check_op(fwd, lambda dy, c: ops.sequence_logprob_backward(dy, c), arrays)
    tl = torch.from_numpy(labels)

    def tfn(logits):
        logp = logits.log_softmax(-1).gather(-1, tl.clamp(min=0)[..., None])[..., 0]
        return (logp * (tl != -100)).sum(1)

    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        torch_parity(fwd, ops.sequence_logprob_backward, tfn, arrays, dtype, tol)


def test_sequence_logprob_takes_label_lists_and_refuses_labels_not_one_per_position(rng):
    logits = rng.standard_normal((1, 3, 4))
    listed = ops.sequence_logprob_forward(logits, [[0, 1, -100]])[0]
    assert listed == ops.sequence_logprob_forward(logits, np.array([[0, 1, -100]]))[0]
    for labels in (np.array([[2]]), np.array([[0, 1, 2, 3]]), np.array([[0.0, 1.0, 2.0]])):
        with pytest.raises(ValueError, match=r"integer labels of shape \(B, T\) = \(1, 3\)"):
            ops.sequence_logprob_forward(logits, labels)


def test_dpo_loss_takes_lists():
    loss, cache = ops.dpo_loss_forward([0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], 0.1)
    assert loss == ops.dpo_loss_forward(np.array([0.0, 1.0]), np.zeros(2), np.zeros(2), np.zeros(2), 0.1)[0]


def _dpo_case(rng, n=6):
    return ({"policy_chosen": rng.standard_normal(n) * 3, "policy_rejected": rng.standard_normal(n) * 3},
            rng.standard_normal(n) * 3, rng.standard_normal(n) * 3)


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_dpo_loss(rng, beta):
    arrays, ref_c, ref_r = _dpo_case(rng)
    fwd = lambda policy_chosen, policy_rejected: ops.dpo_loss_forward(      # noqa: E731
        policy_chosen, policy_rejected, ref_c, ref_r, beta)
    check_op(lambda **a: (np.asarray(fwd(**a)[0]), fwd(**a)[1]),
             lambda dy, c: ops.dpo_loss_backward(c, float(dy)), arrays)
    for dtype, tol in ((np.float64, F64_TOL), (np.float32, F32_TOL)):
        a = {k: torch.tensor(v.astype(dtype), requires_grad=True) for k, v in arrays.items()}
        rc, rr = torch.tensor(ref_c.astype(dtype)), torch.tensor(ref_r.astype(dtype))
        t_loss = -torch.nn.functional.logsigmoid(beta * ((a["policy_chosen"] - rc) - (a["policy_rejected"] - rr)))
        t_loss.mean().backward()
        loss, cache = ops.dpo_loss_forward(*(v.astype(dtype) for v in arrays.values()), ref_c.astype(dtype),
                                           ref_r.astype(dtype), beta)
        assert_close(np.asarray(loss), t_loss.mean().detach().numpy(), tol, "forward")
        for g, name in zip(ops.dpo_loss_backward(cache), arrays):
            assert_close(g, a[name].grad.numpy(), tol, f"d{name}")


def test_dpo_loss_is_stable_and_counts_the_pairs_it_prefers():
    chosen, rejected, zero = np.array([1e4, -1e4, 0.0]), np.array([0.0, 0.0, 0.0]), np.zeros(3)
    loss, cache = ops.dpo_loss_forward(chosen, rejected, zero, zero, 1.0)
    assert np.isfinite(loss) and np.all(np.isfinite(ops.dpo_loss_backward(cache)[0]))
    np.testing.assert_allclose(loss, (0.0 + 1e4 + np.log(2)) / 3)       # -log σ(z): 0, -z, log 2
    assert ops.dpo_reward_accuracy(cache) == pytest.approx(1 / 3)
