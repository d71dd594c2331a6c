"""Scaled RoPE (``ops.rope_scaling``) and its config parser (``interop.hf_rope``) against transformers.

transformers computes the frequencies in float32 on purpose (``torch.float``, and ``torch.float32`` in
YaRN's ramp); its float32 rounding alone moves them by ~1e-7. ``transformers_in_float64`` runs transformers'
own functions with those names (and the default dtype) meaning float64, so the same formulas are compared at
1e-12 relative. Each config goes through transformers' config class (its standardization of ``rope_scaling``
/ ``rope_parameters``) and ``ROPE_INIT_FUNCTIONS``, and through numformer's parser and math.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from numformer import kernels, ops
from numformer.interop.hf_rope import read_gemma3_rope, read_rope
from numformer.ops.rope_scaling import RopeScaling, rope_inverse_frequencies

from conftest import F64_TOL, assert_close
from test_ops import check_op, torch_parity

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

REL = 1e-12


@contextlib.contextmanager
def transformers_in_float64():
    """torch.float and torch.float32 (the dtypes transformers' RoPE code names) and the default dtype mean
    float64 while transformers' functions run."""
    saved = torch.float, torch.float32, torch.get_default_dtype()
    torch.float = torch.float32 = torch.float64
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.float, torch.float32 = saved[0], saved[1]
        torch.set_default_dtype(saved[2])


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def _hf_frequencies(cfg, seq_len=None, layer_type=None):
    """transformers' (inv_freq, attention factor) of a config object, in float64."""
    params = cfg.rope_parameters if layer_type is None else cfg.rope_parameters[layer_type]
    kw = {} if layer_type is None else {"layer_type": layer_type}
    with transformers_in_float64():
        if params["rope_type"] == "default":
            rot = transformers.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding if layer_type else \
                transformers.models.llama.modeling_llama.LlamaRotaryEmbedding
            inv, factor = rot.compute_default_rope_parameters(cfg, **kw)
        else:
            inv, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, seq_len=seq_len, **kw)
    assert inv.dtype == torch.float64
    return inv.numpy(), factor


BASE = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "intermediate_size": 32, "vocab_size": 50}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
# (config.json fields beyond BASE): v4 and v5 forms, every type, defaults and edge values
CONFIGS = {
    "default-v4": {"rope_theta": 500000.0},
    "default-none": {},
    "linear-v4-type": {"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 10000.0},
    "linear-v5": {"rope_parameters": {"rope_type": "linear", "factor": 4.5, "rope_theta": 1e6}},
    "dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 64},
    "dynamic-head-dim": {"rope_parameters": {"rope_type": "dynamic", "factor": 3.0, "rope_theta": 500.0},
                         "head_dim": 32, "max_position_embeddings": 100},
    "llama3.2-1b": {"rope_scaling": {**LLAMA3, "factor": 32.0, "original_max_position_embeddings": 8192},
                    "rope_theta": 500000.0, "max_position_embeddings": 131072, "head_dim": 64},
    "llama3.1-8b": {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": 8192,
                                        "rope_theta": 500000.0}, "max_position_embeddings": 131072,
                    "head_dim": 128},
    "llama3-small-all-bands": {"rope_scaling": {**LLAMA3, "original_max_position_embeddings": 64},
                               "max_position_embeddings": 512, "head_dim": 32},
    "llama3-default-original": {"rope_scaling": {**LLAMA3, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
                                "max_position_embeddings": 128, "head_dim": 32},
    "yarn-qwen": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                  "rope_theta": 1e6, "max_position_embeddings": 131072, "head_dim": 128},
    "yarn-small": {"rope_parameters": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                                       "rope_theta": 10000.0}, "max_position_embeddings": 512, "head_dim": 32},
    "yarn-no-truncate-betas": {"rope_scaling": {"type": "yarn", "factor": 3.0, "truncate": False, "beta_fast": 16,
                                                "beta_slow": 2.0, "original_max_position_embeddings": 100},
                               "max_position_embeddings": 300, "head_dim": 32},
    "yarn-attention-factor": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 0.7}},
    "yarn-mscale": {"rope_scaling": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                                     "original_max_position_embeddings": 64}, "max_position_embeddings": 2560},
    "yarn-factor-null": {"rope_scaling": {"rope_type": "yarn", "factor": None,
                                          "original_max_position_embeddings": 32}, "max_position_embeddings": 96},
    "yarn-zero-betas": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 0, "beta_slow": 0,
                                         "original_max_position_embeddings": 64}, "max_position_embeddings": 128},
    "yarn-meeting-bounds": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 4.0, "beta_slow": 4.0,
                                             "original_max_position_embeddings": 64}, "max_position_embeddings": 128,
                            "head_dim": 16},
    "both-forms-scaling-wins": {"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                                "rope_parameters": {"rope_type": "dynamic", "factor": 3.0, "rope_theta": 7.0},
                                "rope_theta": 5.0},
    "llama3-top-level-original-wins": {"rope_scaling": {**LLAMA3, "original_max_position_embeddings": 16},
                                       "original_max_position_embeddings": 64, "max_position_embeddings": 512,
                                       "head_dim": 32},
    "yarn-top-level-original": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4},
                                "original_max_position_embeddings": 32, "max_position_embeddings": 128,
                                "head_dim": 32},
    "theta-inside-wins": {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 9.0},
                          "rope_theta": 5.0},
}
SEQ_LENS = (None, 1, 63, 64, 65, 100, 1000, 5000)


def _pair(name, config_class=None):
    config = {**BASE, **CONFIGS[name]}
    cfg = (config_class or transformers.LlamaConfig)(**__import__("copy").deepcopy(config))
    return config, cfg


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_frequencies_equal_transformers_in_float64(name):
    config, cfg = _pair(name)
    theta, scaling = read_rope(config, max_position_embeddings=cfg.max_position_embeddings)
    assert theta == cfg.rope_parameters["rope_theta"]
    assert (scaling.rope_type if scaling else "default") == cfg.rope_parameters["rope_type"]
    head_dim = cfg.head_dim
    for seq_len in SEQ_LENS:
        inv, factor = rope_inverse_frequencies(head_dim, theta, scaling, seq_len)
        hf_inv, hf_factor = _hf_frequencies(cfg, seq_len)
        assert inv.dtype == np.float64 and inv.shape == (head_dim // 2,)
        assert _rel(inv, hf_inv) < REL, (name, seq_len)
        assert factor == pytest.approx(hf_factor, rel=REL), (name, seq_len)


@pytest.mark.parametrize("name", ["linear-v5", "llama3.2-1b", "yarn-small"])
def test_float32_transformers_differ_from_float64_by_rounding_only(name):
    """transformers' own float32 values sit ~1e-7 from the float64 ones: the reason for the patch above."""
    config, cfg = _pair(name)
    theta, scaling = read_rope(config)
    inv, _ = rope_inverse_frequencies(cfg.head_dim, theta, scaling)
    hf32, _ = ROPE_INIT_FUNCTIONS[cfg.rope_parameters["rope_type"]](cfg, None)
    assert hf32.dtype == torch.float32
    assert 1e-10 < _rel(hf32.numpy(), inv) < 1e-6


def test_scaled_frequencies_are_what_the_equations_say():
    """Independent of transformers: llama3's three bands and yarn's ramp, read off the formulas."""
    d, theta = 32, 10000.0
    plain = theta ** (-np.arange(0, d, 2) / d)
    s = RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64)
    inv, a = rope_inverse_frequencies(d, theta, s)
    wavelength = 2 * np.pi / plain
    high, low = wavelength < 64 / 4, wavelength > 64 / 1
    assert a == 1.0 and high.any() and low.any() and (~high & ~low).any()
    assert np.allclose(inv[high], plain[high], rtol=1e-15) and np.allclose(inv[low], plain[low] / 8, rtol=1e-15)
    mid = ~high & ~low
    assert np.all((inv[mid] < plain[mid]) & (inv[mid] > plain[mid] / 8))
    y = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=64)
    inv, a = rope_inverse_frequencies(d, theta, y)
    assert a == pytest.approx(0.1 * np.log(4.0) + 1)
    ratio = inv / plain                                  # 1 (kept) -> 1/4 (interpolated), monotone
    assert ratio[0] == pytest.approx(1) and ratio[-1] == pytest.approx(0.25) and np.all(np.diff(ratio) <= 1e-15)
    lin, _ = rope_inverse_frequencies(d, theta, RopeScaling("linear", factor=2.0))
    assert np.allclose(lin, plain / 2, rtol=1e-15)
    dyn = RopeScaling("dynamic", factor=2.0, max_position_embeddings=64)
    assert np.array_equal(rope_inverse_frequencies(d, theta, dyn, 64)[0], rope_inverse_frequencies(d, theta)[0]) \
        or _rel(rope_inverse_frequencies(d, theta, dyn, 64)[0], plain) < 1e-15
    assert np.all(rope_inverse_frequencies(d, theta, dyn, 128)[0][1:] < plain[1:])


GEMMA3 = {
    "v4-defaults": {},
    "v4-linear-full": {"rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_theta": 1e6,
                       "rope_local_base_freq": 1e4},
    "v4-yarn-full-theta": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": False},
                           "rope_theta": 2e5, "rope_local_base_freq": 500.0},
    "v5-nested": {"rope_parameters": {"full_attention": {"rope_type": "llama3", "factor": 8.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "rope_theta": 3e5},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}},
                  "rope_theta": 5.0},
    "v5-nested-dynamic-sliding": {"rope_parameters": {"full_attention": {"rope_type": "default"},
                                                      "sliding_attention": {"rope_type": "dynamic", "factor": 2.0}}},
    "both-forms-update-full": {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                      "rope_theta": 3.0},
                                                   "sliding_attention": {"rope_type": "default"}},
                               "rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
}


@pytest.mark.parametrize("name", sorted(GEMMA3))
def test_gemma3_rope_per_layer_type_equals_transformers(name):
    config = {**BASE, "head_dim": 16, "num_hidden_layers": 6, "max_position_embeddings": 256,
              "sliding_window": 8, **GEMMA3[name]}
    cfg = transformers.Gemma3TextConfig(**__import__("copy").deepcopy(config))
    ours = read_gemma3_rope(config, cfg.layer_types)
    assert set(ours) == {"full_attention", "sliding_attention"}
    for layer_type, (theta, scaling) in ours.items():
        assert theta == cfg.rope_parameters[layer_type]["rope_theta"]
        for seq_len in (None, 100, 300, 4000):
            inv, factor = rope_inverse_frequencies(16, theta, scaling, seq_len)
            hf_inv, hf_factor = _hf_frequencies(cfg, seq_len, layer_type)
            assert _rel(inv, hf_inv) < REL, (name, layer_type, seq_len)
            assert factor == pytest.approx(hf_factor, rel=REL)


@pytest.mark.parametrize("config, match", [
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "'longrope'"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}, "partial_rotary_factor": 0.5},
     "partial_rotary_factor 0.5"),
    ({"rope_scaling": {"rope_type": "linear"}}, "without factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}},
     "high_freq_factor"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": -2.0}}, "factor = -2.0"),
    ({"rope_theta": None}, "rope_theta None"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}, "layer_types": ["full_attention"]},
     "per-layer-type"),
    ({"rope_scaling": {"rope_type": "default", "mrope_section": [2, 2]}}, "mrope_section"),
])
def test_unsupported_rope_is_one_clear_error(config, match):
    with pytest.raises(ValueError, match=match) as e:
        read_rope({**BASE, "max_position_embeddings": 64, **config})
    assert "\n" not in str(e.value)


def test_rope_scaling_round_trips_and_refuses_bad_values():
    s = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=32, beta_fast=16.0)
    assert RopeScaling.from_dict(s.to_dict()) == s
    assert s.to_dict() == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                           "beta_fast": 16.0, "truncate": True}
    for bad, match in (({"rope_type": "ntk"}, "unknown type"), ({"rope_type": "linear"}, "needs factor"),
                       ({"rope_type": "dynamic", "factor": 2.0}, "needs max_position_embeddings"),
                       ({"rope_type": "yarn", "original_max_position_embeddings": 8}, "needs max_position"),
                       ({"rope_type": "linear", "factor": "2"}, "not a positive number"),
                       ({"rope_type": "linear", "factor": 2.0, "colour": 1}, "unknown fields")):
        with pytest.raises(ValueError, match=match):
            RopeScaling.from_dict(bad)


# -- the op: cos and sin of scaled RoPE, forward and backward ------------------------------------------
SCALINGS = {
    "linear": RopeScaling("linear", factor=2.0),
    "dynamic": RopeScaling("dynamic", factor=2.0, max_position_embeddings=16),
    "llama3": RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16),
    "yarn": RopeScaling("yarn", factor=4.0, original_max_position_embeddings=16),
}


def _hf_rotary(kind, head_dim=8):
    """transformers' LlamaRotaryEmbedding of a config with SCALINGS[kind], built and run in float64."""
    s = SCALINGS[kind]
    params = {k: v for k, v in s.to_dict().items() if k != "max_position_embeddings"}
    cfg = transformers.LlamaConfig(**{**BASE, "head_dim": head_dim, "max_position_embeddings": 16,
                                      "rope_parameters": {**params, "rope_theta": 10000.0}})
    with transformers_in_float64():
        return transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_cos_sin_past_the_original_context_equal_transformers_module(kind):
    """Prefill past the original context (16), then one token at a time as generation does: transformers'
    rotary module (with its dynamic update for "dynamic") against ops.rope_angles, float64."""
    rot = _hf_rotary(kind)
    x = torch.zeros(1, dtype=torch.float64)
    calls = [np.arange(0, 40)] + [np.array([p]) for p in range(40, 45)] + [np.arange(0, 10)]
    for positions in calls:
        with transformers_in_float64():
            cos, sin = rot(x, torch.from_numpy(positions)[None])
        ours = ops.rope_angles(positions, 8, 10000.0, np.float64, SCALINGS[kind])
        assert _rel(ours[0] + 2, cos[0].numpy() + 2) < REL and _rel(ours[1] + 2, sin[0].numpy() + 2) < REL, \
            (kind, positions[:3])


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_scaled_rope_gradients_and_torch_parity(kind, rng):
    s = SCALINGS[kind]
    arrays = {"x": rng.standard_normal((2, 2, 24, 8))}       # 24 positions: past the original 16

    def fwd(x):
        return ops.rope_forward(x, offset=3, scaling=s)

    check_op(fwd, ops.rope_backward, arrays)
    rot = _hf_rotary(kind)
    with transformers_in_float64():
        cos, sin = rot(torch.zeros(1, dtype=torch.float64), torch.arange(3, 27)[None])
    rotate_half = transformers.models.llama.modeling_llama.rotate_half

    def tfn(x):
        return x * cos[0].to(x.dtype) + rotate_half(x) * sin[0].to(x.dtype)

    torch_parity(fwd, ops.rope_backward, tfn, arrays, np.float64, F64_TOL)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_scaled_rope_kernel_equals_reference(kind, dtype, rng):
    """Offsets within and past the context (dynamic changes tables there), explicit positions (B, T)."""
    s = SCALINGS[kind]
    x = rng.standard_normal((2, 3, 5, 8)).astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for offset, positions in ((0, None), (9, None), (30, None), (0, rng.integers(0, 40, (2, 5))),
                              (0, np.arange(5))):
        pairs = []
        for lib in (ops, kernels):
            y, cache = lib.rope_forward(x, offset, 500.0, positions, scaling=s)
            pairs.append((y, lib.rope_backward(np.ones_like(y), cache)))
        assert_close(pairs[1][0], pairs[0][0], tol, f"{kind} forward {offset}")
        assert_close(pairs[1][1], pairs[0][1], tol, f"{kind} backward {offset}")


def test_plain_rope_is_unchanged_by_the_scaling_argument(rng):
    x = rng.standard_normal((1, 2, 6, 8))
    assert np.array_equal(ops.rope_forward(x, offset=4)[0], ops.rope_forward(x, offset=4, scaling=None)[0])
    assert np.array_equal(kernels.rope_forward(x, offset=4)[0], ops.rope_forward(x, offset=4)[0]) or \
        np.allclose(kernels.rope_forward(x, offset=4)[0], ops.rope_forward(x, offset=4)[0], rtol=1e-15)


def test_the_engine_page_example_prints_what_it_shows(capsys):
    """The "Scaled RoPE" example of docs/reference/engine.md: its code runs and prints the output shown."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "engine.md").read_text(encoding="utf-8")
    section = page.split("## Scaled RoPE", 1)[1].split("\n## ", 1)[0]
    code, shown = re.search(r"```python\n(.*?)```\n\n```text\n(.*?)```", section, re.S).groups()
    exec(compile(code, "engine.md", "exec"), {})
    assert capsys.readouterr().out == shown
