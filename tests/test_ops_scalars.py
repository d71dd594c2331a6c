"""Every op of numformer.ops and numformer.kernels given a 0-d array or a Python number (issue 36).

Decided per op, as torch does: an elementwise op (ReLU, GELU, SiLU, dropout, erf, softmax over a 0-d
array) works at any shape, so a 0-d array or a number gives what the same op gives on the one-element array
(forward and backward); an op that reads its input as (..., d) -- a linear map, a normalization,
cross-entropy, attention, rotary positions -- refuses it with one ValueError line naming the op. Every
public function of both packages must be listed here: a new op cannot skip the decision.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from numformer import kernels, ops

W, G = np.ones((3, 1)), np.ones(1)


def _rng():
    return np.random.default_rng(0)


# name -> f(x): the op applied to x where x is the input in question; the other arguments well formed
ELEMENTWISE = {
    "relu": lambda m, x: m.relu_forward(x),
    "relu_squared": lambda m, x: m.relu_squared_forward(x),
    "gelu": lambda m, x: m.gelu_forward(x),
    "gelu(tanh)": lambda m, x: m.gelu_forward(x, "tanh"),
    "silu": lambda m, x: m.silu_forward(x),
    "silu_gate": lambda m, x: m.silu_gate_forward(x, x),
    "gelu_gate": lambda m, x: m.gelu_gate_forward(x, x),
    "softcap": lambda m, x: m.softcap_forward(x, 2.0),
    "dropout": lambda m, x: m.dropout_forward(x, 0.5, _rng()),
    "softmax": lambda m, x: m.softmax_forward(x),
    "log_softmax": lambda m, x: m.log_softmax_forward(x),
}
BACKWARD = {"relu": "relu_backward", "relu_squared": "relu_squared_backward", "gelu": "gelu_backward", "gelu(tanh)": "gelu_backward",
            "silu": "silu_backward", "silu_gate": "silu_gate_backward",
            "gelu_gate": "gelu_gate_backward", "softcap": "softcap_backward", "dropout": "dropout_backward",
            "softmax": "softmax_backward", "log_softmax": "log_softmax_backward"}
FUNCTIONS = {"erf": lambda m, x: m.erf(x), "gelu_erf": lambda m, x: m.gelu_erf(x),
             "gelu_tanh": lambda m, x: m.gelu_tanh(x)}
REFUSED = {
    "linear_forward": lambda m, x: m.linear_forward(x, W),
    "layer_norm_forward": lambda m, x: m.layer_norm_forward(x, G, G),
    "rms_norm_forward": lambda m, x: m.rms_norm_forward(x, G),
    "batch_norm_forward": lambda m, x: m.batch_norm_forward(x, G, G),
    "cross_entropy_forward": lambda m, x: m.cross_entropy_forward(x, np.array(0)),
    "swiglu_forward": lambda m, x: m.swiglu_forward(x, np.ones((2, 1)), np.ones((2, 1)), np.ones((1, 2))),
    "scaled_dot_product_attention_forward": lambda m, x: m.scaled_dot_product_attention_forward(x, x, x),
    "flash_attention_forward": lambda m, x: m.flash_attention_forward(x, x, x),
    "fused_attention_forward": lambda m, x: m.fused_attention_forward(x, x, x),
    "rope_forward": lambda m, x: m.rope_forward(x),
    "rotate_half": lambda m, x: m.rotate_half(x),
    "repeat_kv_forward": lambda m, x: m.repeat_kv_forward(x, 2),
    "alibi_forward": lambda m, x: m.alibi_forward(x, G),
    "alibi_bias": lambda m, x: m.alibi_bias(x, 2, 2),
    "split_heads_forward": lambda m, x: m.split_heads_forward(x, 2),
    "merge_heads_forward": lambda m, x: m.merge_heads_forward(x),
    "lora_forward": lambda m, x: m.lora_forward(x, np.ones((2, 1)), np.ones((1, 2)), 1.0),
    "sequence_logprob_forward": lambda m, x: m.sequence_logprob_forward(x, np.array(0)),
    "dpo_loss_forward": lambda m, x: m.dpo_loss_forward(x, x, x, x, 0.1),
}
# ids: a 0-d index picks one row, as torch.nn.functional.embedding and NumPy indexing do
WORKS = {"embedding_forward": lambda m, x: m.embedding_forward(np.asarray(x).astype(np.int64), np.eye(3)),
         "rope_angles": lambda m, x: m.rope_angles(np.asarray(x).astype(np.int64), 4)}
# functions of sizes, not of an array, and backward passes (they take a forward's cache: tested below)
NOT_ARRAY_OPS = {"causal_mask", "check_kv_heads", "alibi_slopes", "alibi_backward", "batch_norm_backward",
                 "cross_entropy_backward", "embedding_backward", "layer_norm_backward", "linear_backward",
                 "repeat_kv_backward", "rms_norm_backward", "rope_backward", "scaled_dot_product_attention_backward",
                 "swiglu_backward", "flash_attention_backward", "fused_attention_backward", "gelu_erf_f32",
                 "rope_inverse_frequencies", "split_heads_backward", "merge_heads_backward", "lora_backward",
                 "sequence_logprob_backward", "dpo_loss_backward", "dpo_reward_accuracy"}
INPUTS = {"0-d float64": np.array(0.7), "0-d float32": np.array(0.7, np.float32), "Python float": 0.7,
          "negative 0-d": np.array(-1.3)}


def _functions(package):
    return {name for name in dir(package) if not name.startswith("_") and inspect.isfunction(getattr(package, name))}


def test_every_op_has_a_decision():
    forwards = {f"{k}_forward" for k in ("relu", "relu_squared", "gelu", "silu", "silu_gate", "gelu_gate", "softcap", "dropout",
                                         "softmax", "log_softmax")}
    decided = (set(BACKWARD.values()) | forwards
               | set(FUNCTIONS) | set(REFUSED) | set(WORKS) | NOT_ARRAY_OPS)
    for package in (ops, kernels):
        missing = _functions(package) - decided
        assert not missing, f"{package.__name__}: decide what {sorted(missing)} do with a 0-d input (this file)"


ATTRIBUTE = {"gelu(tanh)": "gelu_forward", "erf": "erf", "gelu_erf": "gelu_erf", "gelu_tanh": "gelu_tanh"}


def _params(names, attribute=lambda name: name):
    """(module, name) for each package that has the op (kernels has no softmax, ops no flash attention)."""
    return [pytest.param(module, name, id=f"{module.__name__.split('.')[-1]}.{name}") for module in (ops, kernels)
            for name in names if hasattr(module, attribute(name))]


@pytest.mark.parametrize("module, name", _params(list(ELEMENTWISE) + list(FUNCTIONS),
                                                  lambda name: ATTRIBUTE.get(name, f"{name}_forward")))
@pytest.mark.parametrize("label", list(INPUTS))
def test_an_elementwise_op_works_on_a_0d_array_and_a_number(module, name, label):
    f = {**ELEMENTWISE, **FUNCTIONS}[name]
    x = INPUTS[label]
    got, want = f(module, x), f(module, np.asarray(x).reshape(1))
    outputs = (lambda r: r if name in FUNCTIONS and isinstance(r, tuple) else (r[0] if isinstance(r, tuple) else r,))
    for g, w in zip(outputs(got), outputs(want)):
        assert np.shape(g) == () and np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_allclose(np.reshape(g, 1), w, rtol=1e-6)
    if name in BACKWARD:
        y, cache = got
        back = getattr(module, BACKWARD[name])(np.ones_like(np.asarray(y)), cache)
        y1, cache1 = want
        back1 = getattr(module, BACKWARD[name])(np.ones_like(y1), cache1)
        for g, w in zip(back if isinstance(back, tuple) else (back,), back1 if isinstance(back1, tuple) else (back1,)):
            np.testing.assert_allclose(np.reshape(g, 1), w, rtol=1e-6)


@pytest.mark.parametrize("module, name", _params(REFUSED))
@pytest.mark.parametrize("label", list(INPUTS))
def test_an_op_that_needs_an_axis_refuses_a_0d_input_in_one_line(module, name, label):
    with pytest.raises(ValueError) as e:
        REFUSED[name](module, INPUTS[label])
    message = str(e.value)
    assert "\n" not in message and ("0-d" in message or "shape ()" in message or "got ()" in message
                                    or "shapes (), (), ()" in message), message


@pytest.mark.parametrize("module, name", _params(WORKS))
def test_an_index_op_takes_a_0d_index(module, name):
    out = WORKS[name](module, np.array(1))
    out = out[0] if isinstance(out, tuple) else out
    assert np.shape(out)[-1] in (3, 4) and np.ndim(out) == 1


def test_the_float32_gelu_kernel_refuses_another_dtype_in_one_line():
    assert kernels.gelu_erf_f32(np.array(0.5, np.float32))[0].shape == ()
    with pytest.raises(ValueError, match="float32 kernel, got a float64 array"):
        kernels.gelu_erf_f32(np.array(0.5))


def test_the_embedding_backward_of_a_0d_index():
    y, cache = ops.embedding_forward(2, np.eye(3))
    np.testing.assert_array_equal(ops.embedding_backward(np.ones(3), cache), [[0, 0, 0], [0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(kernels.embedding_backward(np.ones(3), cache), [[0, 0, 0], [0, 0, 0], [1, 1, 1]])
