"""Positional encodings: added to embeddings (sinusoidal, learned) or inside attention (RoPE, ALiBi).

Self-attention is permutation-equivariant (permute the input rows and the output rows
permute the same way), so order must be injected.

Shapes: B batch, T length, C model width, H heads, D head width, L/S query/key length.
Positions: ``positions`` is always a token's absolute position, an integer tensor (T,) or (B, T)
(where an int is accepted, each docstring says what it means). Static-KV-cache *slots* are
``input_pos`` (see ``qkv.kv_cache``), a different thing.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import check_positive_int
from .rope_scaling import LENGTH_DEPENDENT, RopeScaling, as_rope_scaling, rope_frequencies

SINUSOIDAL_LAYOUTS = ("interleaved", "split")


def _range_if_length(positions: Tensor | int, device=None) -> Tensor:
    """An int T means positions 0 … T−1; an integer tensor passes through."""
    if isinstance(positions, int):
        return torch.arange(positions, device=device)
    if not isinstance(positions, Tensor) or positions.is_floating_point():
        raise TypeError(f"positions must be an int length or an integer Tensor, got {positions!r:.60}")
    return positions


class SinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / base^(2i/C)), PE(pos, 2i+1) = cos(pos / base^(2i/C)) (Vaswani et al. §3.5).

    Fixed, defined for every position. ``forward(positions)`` takes integer positions of any
    shape (…), or an int length T meaning 0 … T−1, and returns (…, C) to add to embeddings.
    ``layout``: "interleaved" (the paper: sin on even dims, cos on odd) or "split" (all sines,
    then all cosines: Marian, fairseq, Hugging Face's MarianSinusoidalPositionalEmbedding).
    """

    def __init__(self, d_model: int, base: float = 10000.0, *, layout: str = "interleaved") -> None:
        super().__init__()
        if not isinstance(d_model, int) or d_model <= 0 or d_model % 2:
            raise ValueError(f"d_model must be a positive even int (sin/cos pairs), got {d_model!r}")
        if base <= 1:
            raise ValueError(f"base must be > 1, got {base}")
        if layout not in SINUSOIDAL_LAYOUTS:
            raise ValueError(f"layout must be one of {SINUSOIDAL_LAYOUTS}, got {layout!r}")
        self.d_model, self.base, self.layout = d_model, base, layout
        # 1 / base^(2i/C), i = 0 … C/2 − 1: wavelengths 2π … base·2π
        inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(base) / d_model))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)  # (C/2,)

    def forward(self, positions: Tensor | int) -> Tensor:
        pos = _range_if_length(positions, self.inv_freq.device).float()
        angles = pos.unsqueeze(-1) * self.inv_freq  # (…, C/2)
        if self.layout == "split":
            return torch.cat((angles.sin(), angles.cos()), dim=-1)  # (…, C): sines in [0, C/2), cosines after
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (…, C/2, 2): sin on even dims, cos on odd
        return pe.flatten(-2)  # (…, C)


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position 0 … max_len − 1 (BERT, GPT-2); none beyond.

    ``forward(positions)``: integer positions of any shape (…), or an int length T (0 … T−1) -> (…, C).
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        for name, value in (("max_len", max_len), ("d_model", d_model)):
            check_positive_int(name, value)
        self.max_len, self.d_model = max_len, d_model
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, positions: Tensor | int) -> Tensor:
        pos = _range_if_length(positions, self.weight.device)
        if pos.numel() and pos.is_cpu and not torch.compiler.is_compiling():  # on a GPU: the embedding's own assert
            low, top = (int(v) for v in torch.aminmax(pos))
            if top >= self.max_len:
                raise ValueError(
                    f"position {top} is past the learned embedding's max_len={self.max_len} "
                    f"(positions 0 … {self.max_len - 1} exist)"
                )
            if low < 0:
                raise ValueError(f"positions must be >= 0, got {low}")
        return self.weight[pos]  # (…, C)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021, RoFormer): rotate each (q, k) pair by pos·θ_i.

    θ_i = base^(−2i/R). Layouts: half-split (default; LLaMA, GPT-NeoX: pairs (x_i, x_{i+R/2}))
    or interleaved (RoFormer, GPT-J: pairs (x_{2i}, x_{2i+1})). Scores then depend on
    positions only through their difference.

    ``rotary_dim`` R: partial rotation (GPT-NeoX's and Pythia's rotary_pct, GPT-J's rotary_dim) rotates
    the first R of each head's D dims and passes the rest through unchanged; None: R = D, the whole head.

    ``scaling``: a ``qkv.nn.rope_scaling.RopeScaling`` (or a dict of its fields) stretching RoPE past the
    trained context: linear, dynamic (NTK), yarn, llama3, longrope; it sets θ and an attention factor that
    multiplies cos and sin, as transformers does. dynamic and longrope follow the longest position seen, as
    transformers' ``dynamic_rope_update`` does (``follow_length``); None: plain RoPE.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = False, *,
                 rotary_dim: int | None = None, scaling: RopeScaling | dict | None = None) -> None:
        super().__init__()
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ValueError(f"RoPE head_dim must be a positive even int (it rotates pairs), got {head_dim!r}")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not isinstance(rotary_dim, int) or not 0 < rotary_dim <= head_dim or rotary_dim % 2:
            raise ValueError(f"RoPE rotary_dim must be a positive even int <= head_dim={head_dim}, got {rotary_dim!r}")
        self.head_dim, self.base, self.interleaved, self.rotary_dim = head_dim, base, interleaved, rotary_dim
        self.scaling = as_rope_scaling(scaling) or RopeScaling()
        self.scaling.check_dim(rotary_dim)
        inv_freq, self.attention_factor = rope_frequencies(rotary_dim, base, self.scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (R/2,)
        if self.scaling.type in LENGTH_DEPENDENT:  # the θ of lengths up to L₀, restored when a shorter input comes
            self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)
            self.max_seq_len_cached = self.scaling.original_max_position_embeddings

    @property
    def follows_length(self) -> bool:
        """Its table follows the current length (dynamic, longrope), so where it rotates is not only relative."""
        return self.scaling.type in LENGTH_DEPENDENT

    def places(self, slots: Tensor | int, real: Tensor | None) -> Tensor | int:
        """Where to rotate a call's tokens: their cache ``slots`` (RoPE is relative, so a padded row's shift
        cancels), or, where the table follows the length, their ``real`` positions (T,) or (B, T) when given:
        left padding must neither lengthen the input nor shift a padded row's phase when the table changes
        mid-decode (transformers rotates at real positions)."""
        return real if real is not None and self.follows_length else slots

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin of pos·θ_i, each (…, R/2), in float32, times the scaling's attention factor."""
        if self.follows_length:
            self.follow_length(positions)
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # (…, R/2)
        if self.attention_factor == 1.0:
            return freqs.cos(), freqs.sin()
        return freqs.cos() * self.attention_factor, freqs.sin() * self.attention_factor

    def follow_length(self, positions: Tensor) -> None:
        """dynamic and longrope: θ for the length L = max(positions) + 1, as transformers' ``dynamic_rope_update``:
        dynamic recomputes θ when L grows past the longest length so far (beyond L₀) and returns to the
        original θ when an input fits in L₀ again; longrope takes the long factors while L > L₀."""
        if not positions.numel():
            return
        length, top = int(positions.max()) + 1, self.scaling.original_max_position_embeddings
        if self.scaling.type == "longrope":
            chosen = rope_frequencies(self.rotary_dim, self.base, self.scaling, length)[0] if length > top else None
            self.inv_freq = self.original_inv_freq if chosen is None else chosen.to(self.original_inv_freq.device)
            return
        if length > self.max_seq_len_cached:  # growth
            inv_freq, self.attention_factor = rope_frequencies(self.rotary_dim, self.base, self.scaling, length)
            self.inv_freq, self.max_seq_len_cached = inv_freq.to(self.original_inv_freq.device), length
        elif length < top < self.max_seq_len_cached:  # back within the trained context
            self.inv_freq, self.max_seq_len_cached = self.original_inv_freq, top

    def forward(self, x: Tensor, positions: Tensor | int | None = None) -> Tensor:
        """x (B, H, T, D) -> rotated (B, H, T, D).

        ``positions``: each row's position, an integer tensor (T,) or (B, T); or an int p, the
        first position (rows at p … p+T−1; cached decoding). None: 0 … T−1.
        """
        if not isinstance(x, Tensor) or x.dim() != 4 or x.size(-1) != self.head_dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"expected x of shape (B, H, T, {self.head_dim}), got {shape}")
        pos = self._row_positions(positions, x)
        cos, sin = self.angles(pos)  # (…, T, R/2)
        xf = x.float() if self.rotary_dim == self.head_dim else x[..., :self.rotary_dim].float()  # (B, H, T, R)
        if self.interleaved:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]  # (B, H, T, R/2) each
            out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
        else:
            x1, x2 = xf.chunk(2, dim=-1)  # (B, H, T, R/2) each
            out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        if self.rotary_dim < self.head_dim:  # the dims past R pass through
            return torch.cat((out.to(x.dtype), x[..., self.rotary_dim:]), dim=-1)
        return out.to(x.dtype)

    @staticmethod
    def _row_positions(positions: Tensor | int | None, x: Tensor) -> Tensor:
        """The positions of x's rows, (T,) or (B, 1, T), broadcastable against x (B, H, T, D)."""
        B, T = x.size(0), x.size(-2)
        if isinstance(positions, Tensor) and (positions.is_floating_point() or positions.is_complex()):
            raise TypeError(f"positions must be an int or an integer Tensor, got dtype {positions.dtype}")
        if positions is None or isinstance(positions, int) or (isinstance(positions, Tensor) and positions.dim() == 0):
            return torch.arange(T, device=x.device) + (0 if positions is None else positions)  # (T,)
        if not isinstance(positions, Tensor):
            raise TypeError(f"positions must be an int or an integer Tensor, got {type(positions).__name__}")
        if positions.shape not in ((T,), (B, T), (1, T)):
            raise ValueError(f"positions must be (T={T},) or (B={B}, T={T}), got {tuple(positions.shape)}")
        return positions[:, None, :] if positions.dim() == 2 else positions  # (B, T) -> (B, 1, T)


def query_places(q_len: int, k_len: int, positions: Tensor | None, device=None) -> Tensor:
    """The queries' places (L,) on a key axis 0 … S−1: ``positions`` (L,) checked, or bottom-right
    (i' = i + S − L, as cached decoding needs) when None. Score biases (ALiBi, T5's) take them."""
    if positions is None:
        return torch.arange(q_len, device=device) + (k_len - q_len)  # (L,)
    if not isinstance(positions, Tensor) or positions.shape != (q_len,) or positions.is_floating_point():
        got = f"{positions.dtype} {tuple(positions.shape)}" if isinstance(positions, Tensor) else positions
        raise ValueError(f"positions must be an integer tensor (L={q_len},), got {got}")
    return positions.to(device)


class ALiBi(nn.Module):
    """Attention with linear biases (Press et al. 2022): score_ij −= m_h · |i − j|.

    Slopes m_h form a geometric sequence starting at 2^(−8/n): for 8 heads 1/2, 1/4, …, 1/256.
    For a head count that is not a power of two, the slopes of the next lower power of two
    followed by every other slope of twice that count (the paper's reference code).
    Query positions align bottom-right with the keys, as cached decoding needs.
    """

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        check_positive_int("num_heads", num_heads)
        self.num_heads = num_heads
        self.register_buffer("slopes", torch.tensor(self.get_slopes(num_heads)), persistent=False)  # (H,)

    @staticmethod
    def get_slopes(n: int) -> list[float]:
        def power_of_two(n: int) -> list[float]:
            start = 2 ** (-8 / n)
            return [start ** (i + 1) for i in range(n)]

        if math.log2(n).is_integer():
            return power_of_two(n)
        lower = 2 ** math.floor(math.log2(n))
        return power_of_two(lower) + power_of_two(2 * lower)[0::2][: n - lower]

    def forward(self, q_len: int, k_len: int, *, positions: Tensor | None = None) -> Tensor:
        """Bias (H, L, S): −m_h · |i' − j|, where key j sits at position j and query i at i'.

        ``positions`` (L,): the queries' positions i' on that key axis (a static KV cache, where
        S is the capacity, passes its slots). None: bottom-right, i' = i + S − L.
        """
        i = query_places(q_len, k_len, positions, self.slopes.device)[:, None]  # (L, 1)
        j = torch.arange(k_len, device=self.slopes.device)  # (S,)
        dist = (i - j).abs().float()  # (L, S)
        return -self.slopes[:, None, None] * dist  # (H, L, S)
