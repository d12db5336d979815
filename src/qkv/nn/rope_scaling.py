"""RoPE scaling: how a rotary embedding trained on L₀ positions is stretched to longer contexts.

Each type is one function ``(dim, base, scaling, seq_len) -> (inv_freq (dim/2,), attention_factor)``:
the inverse frequencies θ_i that replace base^(−2i/dim), and a factor that multiplies cos and sin (so
every score q·k by its square). ``qkv.RotaryEmbedding(head_dim, base, scaling=RopeScaling(...))`` uses
them; the names and numbers are Hugging Face's (``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``).

    default    θ_i = base^(−2i/d)
    linear     θ_i / s                                   (position interpolation, Chen et al. 2023)
    dynamic    θ_i with base·(s·L/L₀ − (s − 1))^(d/(d−2)) once the length L passes L₀ (NTK-aware, bloc97 2023)
    yarn       ramp between θ_i and θ_i / s by each θ_i's rotations over L₀; factor 0.1·ln s + 1 (Peng et al. 2023)
    llama3     θ_i / s below the low frequencies, θ_i above the high ones, smooth between (Meta, Llama 3.1)
    longrope   θ_i / λ_i, λ the long factors past L₀, the short ones before (Ding et al. 2024)

s is ``factor``, L₀ ``original_max_position_embeddings``, d the rotated dims. dynamic and longrope
depend on the current length L; ``RotaryEmbedding`` updates them as transformers does.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

# type -> (the fields it needs, the fields it may take besides)
FIELDS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "llama3": (("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"), ()),
    "longrope": (("factor", "original_max_position_embeddings", "short_factor", "long_factor"), ("attention_factor",)),
}
LENGTH_DEPENDENT = ("dynamic", "longrope")  # their θ depend on the current length


@dataclass(frozen=True, repr=False)
class RopeScaling:
    """One RoPE scaling, validated on construction; the field names are Hugging Face's ``rope_parameters``.

    ``RopeScaling()`` is plain RoPE. For dynamic, ``original_max_position_embeddings`` is the length past
    which it rescales (Hugging Face's ``max_position_embeddings``).
    """

    type: str = "default"  # one of FIELDS
    factor: float | None = None  # s
    original_max_position_embeddings: int | None = None  # L₀, the context the model was trained on
    attention_factor: float | None = None  # yarn, longrope: cos/sin × this; None: the paper's
    beta_fast: float | None = None  # yarn: rotations over L₀ above which θ is kept (None: 32)
    beta_slow: float | None = None  # yarn: below which θ is divided by s (None: 1)
    mscale: float | None = None  # yarn (DeepSeek): attention factor mscale(s, mscale) / mscale(s, mscale_all_dim)
    mscale_all_dim: float | None = None
    truncate: bool = True  # yarn: round the ramp's ends to whole dims (False: gpt-oss)
    low_freq_factor: float | None = None  # llama3: wavelengths past L₀ / low are divided by s
    high_freq_factor: float | None = None  # llama3: wavelengths under L₀ / high are kept
    short_factor: tuple[float, ...] | None = None  # longrope: λ_i (dim/2 of them) up to L₀
    long_factor: tuple[float, ...] | None = None  # longrope: λ_i past L₀

    def __post_init__(self) -> None:
        if self.type not in FIELDS:
            raise ValueError(f"unknown RoPE scaling type {self.type!r}; known types: {sorted(FIELDS)}")
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        self.check_fields()
        self.check_values()

    def __repr__(self) -> str:
        return "RopeScaling(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"

    def check_fields(self) -> None:
        """The type's required fields are given, and no field it does not read."""
        needed, optional = FIELDS[self.type]
        given = {f.name for f in dataclasses.fields(self) if f.name != "type" and getattr(self, f.name) != f.default}
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"RoPE scaling {self.type!r} needs {', '.join(missing)} (it takes {list(needed)}"
                             f"{f' and optionally {list(optional)}' if optional else ''})")
        unused = sorted(given - set(needed) - set(optional))
        if unused:
            raise ValueError(f"RoPE scaling {self.type!r} does not read {unused} (it takes {list(needed + optional)})")

    def check_values(self) -> None:
        for name in ("factor", "attention_factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                     "mscale", "mscale_all_dim"):
            value = getattr(self, name)
            positive = name in ("factor", "attention_factor", "low_freq_factor", "high_freq_factor")
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not (value > 0 if positive else value >= 0)):
                raise ValueError(f"RoPE scaling {name} must be a {'positive' if positive else 'non-negative'} "
                                 f"number, got {value!r}")
        top = self.original_max_position_embeddings
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top <= 0):
            raise ValueError(f"RoPE scaling original_max_position_embeddings must be a positive int, got {top!r}")
        if self.type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(f"llama3 RoPE scaling needs high_freq_factor > low_freq_factor, got "
                             f"{self.high_freq_factor} and {self.low_freq_factor}")
        if not isinstance(self.truncate, bool):
            raise ValueError(f"RoPE scaling truncate must be a bool, got {self.truncate!r}")
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, tuple) and value and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)):
                raise ValueError(f"RoPE scaling {name} must be a list of positive numbers, got {value!r:.80}")

    def check_dim(self, dim: int) -> None:
        """longrope's factors are one per rotated pair: dim/2 of them."""
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if value is not None and len(value) != dim // 2:
                raise ValueError(f"RoPE scaling {name} needs {dim // 2} numbers (one per pair of the {dim} rotated "
                                 f"dims), got {len(value)}")

    def to_dict(self) -> dict:
        """The type and the fields it was given (JSON-ready: factors as lists)."""
        out = {"type": self.type}
        for f in dataclasses.fields(self)[1:]:
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "RopeScaling":
        """From ``to_dict``'s form, refusing unknown keys."""
        if not isinstance(d, dict):
            raise TypeError(f"a RoPE scaling must be a RopeScaling or a dict of its fields, got {type(d).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"unknown RoPE scaling keys {unknown}; known: {known}")
        return cls(**d)


def as_rope_scaling(value: RopeScaling | dict | None) -> RopeScaling | None:
    """A ``RopeScaling`` from itself, a dict of its fields, or None."""
    return value if value is None or isinstance(value, RopeScaling) else RopeScaling.from_dict(value)


def plain_inv_freq(dim: int, base: float) -> Tensor:
    """θ_i = base^(−2i/d), i = 0 … d/2 − 1 (computed in float64), float32 (d/2,)."""
    return (1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)).float()


def default_rope(dim: int, base: float, s: RopeScaling, seq_len: int | None = None) -> tuple[Tensor, float]:
    """θ_i = base^(−2i/d); attention factor 1 (Su et al. 2021, RoFormer)."""
    return plain_inv_freq(dim, base), 1.0


def linear_rope(dim: int, base: float, s: RopeScaling, seq_len: int | None = None) -> tuple[Tensor, float]:
    """θ_i / s: position m is rotated as m / s would be, positions interpolated into the trained range
    (Chen et al. 2023, "Extending Context Window of Large Language Models via Positional Interpolation")."""
    return plain_inv_freq(dim, base) / s.factor, 1.0


def dynamic_ntk_rope(dim: int, base: float, s: RopeScaling, seq_len: int | None = None) -> tuple[Tensor, float]:
    """base' = base · (s·L/L₀ − (s − 1))^(d/(d−2)), L = max(seq_len, L₀); θ_i = base'^(−2i/d): plain up to L₀,
    then the base grows with the length (NTK-aware scaling: bloc97 and emozilla 2023; "dynamic NTK" in
    Peng et al. 2023 §3.3)."""
    length = max(seq_len or 0, s.original_max_position_embeddings)
    scaled = base * (s.factor * length / s.original_max_position_embeddings - (s.factor - 1)) ** (dim / (dim - 2))
    return plain_inv_freq(dim, scaled), 1.0


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """0.1 · mscale · ln s + 1 (1 for s ≤ 1): YaRN's attention temperature, √(1/t) (Peng et al. 2023 eq. 22)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(s: RopeScaling) -> float:
    """The given attention_factor; else mscale(s, mscale) / mscale(s, mscale_all_dim) where both are set
    (DeepSeek-V2/V3); else 0.1 · ln s + 1."""
    if s.attention_factor is not None:
        return float(s.attention_factor)
    if s.mscale and s.mscale_all_dim:
        return float(yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim))
    return yarn_mscale(s.factor)


def yarn_ramp(dim: int, base: float, s: RopeScaling) -> Tensor:
    """γ_i (d/2,) in [0, 1]: 0 for pairs that turn more than beta_fast times over L₀ (kept), 1 for those that
    turn fewer than beta_slow times (interpolated), linear between; the ends at dims
    d·ln(L₀ / (2π·β)) / (2 ln base), rounded outwards with ``truncate``."""
    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.beta_fast or 32), correction_dim(s.beta_slow or 1)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    return ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)


def yarn_rope(dim: int, base: float, s: RopeScaling, seq_len: int | None = None) -> tuple[Tensor, float]:
    """θ'_i = (1 − γ_i)·θ_i + γ_i·θ_i / s, γ the ramp of ``yarn_ramp`` ("NTK-by-parts"); cos/sin × the
    attention factor 0.1·ln s + 1 (Peng et al. 2023, "YaRN: Efficient Context Window Extension of LLMs")."""
    theta = plain_inv_freq(dim, base).double()
    ramp = yarn_ramp(dim, base, s)
    return ((1 - ramp) * theta + ramp * theta / s.factor).float(), yarn_attention_factor(s)


def llama3_rope(dim: int, base: float, s: RopeScaling, seq_len: int | None = None) -> tuple[Tensor, float]:
    """By wavelength λ_i = 2π/θ_i: kept below L₀/high_freq_factor, θ_i / s above L₀/low_freq_factor, and between
    (1 − a)·θ_i / s + a·θ_i with a = (L₀/λ_i − low) / (high − low) (Meta's Llama 3.1, Dubey et al. 2024)."""
    theta = plain_inv_freq(dim, base).double()
    top, low, high = s.original_max_position_embeddings, s.low_freq_factor, s.high_freq_factor
    wavelen = 2 * math.pi / theta
    a = ((top / wavelen - low) / (high - low)).clamp(0, 1)  # 0 past L₀/low, 1 under L₀/high
    return ((1 - a) * theta / s.factor + a * theta).float(), 1.0


def longrope_rope(dim: int, base: float, s: RopeScaling, seq_len: int | None = None) -> tuple[Tensor, float]:
    """θ_i / λ_i with λ the long factors once seq_len > L₀, the short ones before; attention factor
    √(1 + ln s / ln L₀) (1 for s ≤ 1) unless given (Ding et al. 2024, "LongRoPE"; Phi-3)."""
    s.check_dim(dim)
    top = s.original_max_position_embeddings
    lam = torch.tensor(s.long_factor if seq_len and seq_len > top else s.short_factor, dtype=torch.float64)
    factor = s.attention_factor
    if factor is None:
        factor = 1.0 if s.factor <= 1 else math.sqrt(1 + math.log(s.factor) / math.log(top))
    return (plain_inv_freq(dim, base).double() / lam).float(), float(factor)


ROPE_SCALINGS: dict[str, Callable[..., tuple[Tensor, float]]] = {
    "default": default_rope, "linear": linear_rope, "dynamic": dynamic_ntk_rope, "yarn": yarn_rope,
    "llama3": llama3_rope, "longrope": longrope_rope,
}
assert set(ROPE_SCALINGS) == set(FIELDS)


def rope_frequencies(dim: int, base: float, scaling: RopeScaling | None = None,
                     seq_len: int | None = None) -> tuple[Tensor, float]:
    """(θ (dim/2,) float32, attention factor) of ``scaling`` (None: plain RoPE) at length ``seq_len``
    (read by dynamic and longrope; None: at most L₀)."""
    s = RopeScaling() if scaling is None else scaling
    return ROPE_SCALINGS[s.type](dim, base, s, seq_len)
