"""Scaled RoPE: the rotary frequencies stretched for a context longer than the one a model was trained on,
computed as Hugging Face transformers computes them (``transformers.modeling_rope_utils``), in float64.

Plain RoPE (``ops.rotary``) rotates pair i of a head of size d by p·θ_i, with the inverse frequencies and
wavelengths

    θ_i = base^(-2i/d),   λ_i = 2π / θ_i,   i = 0 … d/2-1.

A scaling replaces θ by θ' (and YaRN also multiplies cos and sin by an attention factor a); the formulas of
``ops.rotary`` are unchanged: each pair is multiplied by a·R(pθ'_i) and dy's pair by a·R(pθ'_i)ᵀ, the
rotation back times the same a (a = 1 but for YaRN). With s = ``factor``, L₀ =
``original_max_position_embeddings`` (the context the model was pre-trained on) and L = ``max_position_embeddings``:

    linear    θ'_i = θ_i / s                          every position divided by s (position interpolation)
    dynamic   θ'_i = base'^(-2i/d),  base' = base · (s·n/L - (s - 1))^(d/(d-2))   for a sequence of
              n > L tokens (n = the largest position + 1); θ itself while n <= L ("dynamic NTK")
    llama3    λ_i < L₀/h:  θ'_i = θ_i                  high frequencies kept (h = ``high_freq_factor``)
              λ_i > L₀/l:  θ'_i = θ_i / s              low frequencies interpolated (l = ``low_freq_factor``)
              otherwise:   θ'_i = (1 - γ_i)·θ_i/s + γ_i·θ_i,   γ_i = (L₀/λ_i - l) / (h - l)
    yarn      θ'_i = (1 - r_i)·θ_i + r_i·θ_i/s,   r_i = clip((i - lo) / (hi - lo), 0, 1), a ramp between the
              pairs lo and hi that turn β_fast and β_slow times over L₀ tokens:
              i(β) = d·ln(L₀ / (2π·β)) / (2·ln base),  lo = ⌊i(β_fast)⌋, hi = ⌈i(β_slow)⌉ (``truncate``),
              lo ≥ 0, hi ≤ d - 1 (hi = lo + 0.001 if they meet);
              a = ``attention_factor`` when given, else 0.1·ln s + 1 (or (0.1·m·ln s + 1) /
              (0.1·m_all·ln s + 1) with ``mscale`` m and ``mscale_all_dim`` m_all, both nonzero), 1 for
              s <= 1; it multiplies cos and sin.

Each expression is evaluated in the order transformers evaluates it, so the values agree with transformers'
own functions run in float64 to rounding (transformers runs them in float32, whose rounding alone moves θ'
by about 1e-7 relative).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE's frequencies are rescaled (transformers' ``rope_parameters`` without ``rope_theta``).

    rope_type: "linear", "dynamic", "yarn" or "llama3" (plain RoPE is no scaling: ``None``).
    factor: s; yarn takes max_position_embeddings / original_max_position_embeddings when it is None.
    original_max_position_embeddings: L₀ (llama3, yarn); max_position_embeddings: L (dynamic; yarn's
    default factor). low_freq_factor / high_freq_factor: llama3's l and h. attention_factor, beta_fast,
    beta_slow, mscale, mscale_all_dim, truncate: yarn's (None: transformers' defaults; truncate True).
    Invalid values are one ValueError naming the field.
    """
    rope_type: str
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self):
        problem = _problem(self)
        if problem:
            raise ValueError(f"RoPE scaling {self.rope_type!r}: {problem}")

    def to_dict(self) -> dict:
        """The fields that are set (config.json form); ``RopeScaling.from_dict`` reads it back."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "RopeScaling":
        """The RopeScaling of a dict of its fields (``to_dict``'s form); an unknown field: ValueError."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"RoPE scaling has unknown fields {unknown}; known: {[f.name for f in fields(cls)]}")
        return cls(**d)


def _problem(s):
    """What is wrong with a RopeScaling, or None."""
    if s.rope_type not in ROPE_TYPES:
        return f"unknown type; numformer computes {', '.join(ROPE_TYPES)}"
    needed = {"linear": ("factor",), "dynamic": ("factor", "max_position_embeddings"),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
              "yarn": ("original_max_position_embeddings",)}[s.rope_type]
    if s.rope_type == "yarn" and s.factor is None:
        needed += ("max_position_embeddings",)          # the default factor L / L₀
    for name in ("factor", "original_max_position_embeddings", "max_position_embeddings", "low_freq_factor",
                 "high_freq_factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        value = getattr(s, name)
        if value is None:
            if name in needed:
                return f"needs {name}"
            continue
        positive = name in ("factor", "original_max_position_embeddings", "max_position_embeddings")
        if not _number(value) or (positive and value <= 0):
            return f"{name} = {value!r} is not a {'positive ' if positive else ''}number"
    if s.rope_type == "llama3" and not s.high_freq_factor > s.low_freq_factor:
        return (f"high_freq_factor ({s.high_freq_factor}) must exceed low_freq_factor ({s.low_freq_factor}): "
                f"they bound the band of medium frequencies")
    if not isinstance(s.truncate, bool):
        return f"truncate = {s.truncate!r} is not true or false"
    return None


def rope_inverse_frequencies(head_dim, theta=10000.0, scaling=None, seq_len=None):
    """(θ' float64 (head_dim/2,), attention factor a) of RoPE with base ``theta`` and ``scaling``
    (a ``RopeScaling``, or None for plain RoPE: θ_i = theta^(-2i/d), a = 1).

    seq_len: the number of positions the frequencies serve (the largest position + 1); only "dynamic"
    depends on it (None: max_position_embeddings, i.e. the unscaled frequencies).
    """
    if head_dim % 2:
        raise ValueError(f"rotary position embeddings need an even head size, got {head_dim}; "
                         f"choose d_model / n_heads even")
    if scaling is None:
        return theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim), 1.0
    return _SCALINGS[scaling.rope_type](scaling, head_dim, float(theta), seq_len)


def _plain(theta, d):
    """θ_i = 1 / theta^(2i/d), transformers' expression."""
    return 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)


def _linear(s, d, theta, seq_len):
    return _plain(theta, d) / s.factor, 1.0


def _dynamic(s, d, theta, seq_len):
    if d <= 2:
        raise ValueError(f"dynamic RoPE scaling needs a head size above 2 (its exponent is d/(d-2)), got {d}")
    n = s.max_position_embeddings if seq_len is None else max(seq_len, s.max_position_embeddings)
    base = theta * ((s.factor * n / s.max_position_embeddings) - (s.factor - 1)) ** (d / (d - 2))
    return _plain(base, d), 1.0


def _llama3(s, d, theta, seq_len):
    inv_freq = _plain(theta, d)
    old_context = s.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context / s.low_freq_factor, old_context / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled), 1.0


def yarn_attention_factor(s):
    """YaRN's a: ``attention_factor`` when set, else 0.1·ln s + 1 (1 for s <= 1), or the mscale ratio."""
    factor = s.factor if s.factor is not None else s.max_position_embeddings / s.original_max_position_embeddings
    if s.attention_factor is not None:
        return float(s.attention_factor)

    def mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.mscale and s.mscale_all_dim:
        return float(mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim))
    return mscale(factor)


def yarn_ramp_bounds(s, d, theta):
    """(lo, hi): the pair indices where YaRN's ramp from kept to interpolated frequencies starts and ends."""
    def pair_index(rotations):          # the i whose wavelength fits ``rotations`` times into L₀
        return (d * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = pair_index(s.beta_fast or 32), pair_index(s.beta_slow or 1)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, d - 1)


def _yarn(s, d, theta, seq_len):
    factor = s.factor if s.factor is not None else s.max_position_embeddings / s.original_max_position_embeddings
    low, high = yarn_ramp_bounds(s, d, theta)
    if low == high:
        high += 0.001                   # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp                     # the share of the original frequency
    return interpolation * (1 - keep) + extrapolation * keep, yarn_attention_factor(s)


_SCALINGS = {"linear": _linear, "dynamic": _dynamic, "llama3": _llama3, "yarn": _yarn}
