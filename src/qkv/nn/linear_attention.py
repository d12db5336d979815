"""Linear attention: softmax replaced by a kernel feature map, so attention costs O(n).

Katharopoulos et al. 2020, "Transformers are RNNs" (arXiv:2006.16236). With a feature map
φ(x) = elu(x) + 1 (eq. 7) the similarity exp(q_iᵀ k_j / √D) becomes φ(q_i)ᵀ φ(k_j), and
the sums over keys no longer depend on the query, so they are computed once (eq. 5):

    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j))        O(n·D·Dv), not O(n²·D)

Causal (eq. 10–12): query i sums over the keys it may see only, so both sums become running
(prefix) sums — an RNN whose state after key j is (s_j, z_j):

    s_j = s_{j−1} + φ(k_j) v_jᵀ,    z_j = z_{j−1} + φ(k_j),    out_i = φ(q_i)ᵀ s / (φ(q_i)ᵀ z + eps)

Here the running sums are kept for every key at once (a cumulative sum): O(n·D·Dv) memory,
linear in n but D·Dv floats per position; a loop carrying one state would need only O(D·Dv).

This is another attention, not a faster softmax: its outputs differ from
``qkv.scaled_dot_product_attention``. There is no 1/√D scale (the paper has none); ``eps``
keeps the division finite, as in the paper's code.

Shapes: "..." leading dims (B, H), L query length, S key length, D head width, Dv value width.
Causal masks align bottom-right, as everywhere in qkv: query i sees keys 0 … S − L + i.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .flash import check_qkv
from .masks import causal_mask


def elu_plus_one(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1: positive everywhere, so every similarity φ(q)ᵀ φ(k) is positive (eq. 7)."""
    return F.elu(x) + 1


FEATURE_MAPS: dict[str, Callable[[Tensor], Tensor]] = {"elu1": elu_plus_one, "relu": torch.relu}


def features(q: Tensor, k: Tensor, v: Tensor, feature_map: str, eps: float) -> tuple[Tensor, Tensor]:
    """Check the inputs and return φ(q) (..., L, D), φ(k) (..., S, D)."""
    check_qkv(q, k, v)
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"feature_map must be one of {sorted(FEATURE_MAPS)}, got {feature_map!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    phi = FEATURE_MAPS[feature_map]
    return phi(q), phi(k)


def seen_prefix(prefix: Tensor, L: int, *, dim: int) -> Tensor:
    """Row i = the prefix sum over the keys query i sees (0 … S − L + i), or zeros where it sees none.

    ``prefix`` holds at row j (along ``dim``, of size S) the sum over keys 0 … j; the result has L rows.
    """
    S = prefix.size(dim)
    if L <= S:
        return prefix.narrow(dim, S - L, L)  # query i -> row S − L + i
    shape = list(prefix.shape)
    shape[dim] = L - S
    return torch.cat([prefix.new_zeros(shape), prefix], dim=dim)  # the first L − S queries see no key


def causal_sums(fq: Tensor, fk: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Numerator φ(q_i)ᵀ s_i (..., L, Dv) and denominator φ(q_i)ᵀ z_i (..., L, 1) from running sums.

    The cumulative sums are the RNN view: row j of s and z is the state after reading key j.
    """
    s = torch.einsum("...jd,...je->...jde", fk, v).cumsum(dim=-3)  # s_j = Σ_{j' ≤ j} φ(k_j') v_j'ᵀ: (..., S, D, Dv)
    z = fk.cumsum(dim=-2)  # z_j = Σ_{j' ≤ j} φ(k_j'): (..., S, D)
    s, z = seen_prefix(s, fq.size(-2), dim=-3), seen_prefix(z, fq.size(-2), dim=-2)  # (..., L, D, Dv), (..., L, D)
    num = torch.einsum("...id,...ide->...ie", fq, s)  # (..., L, Dv)
    den = torch.einsum("...id,...id->...i", fq, z).unsqueeze(-1)  # (..., L) -> (..., L, 1)
    return num, den


def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, feature_map: str = "elu1", eps: float = 1e-6
) -> Tensor:
    """out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j) + eps), in O(n) time and memory.

    Args:
        q: (..., L, D) queries; k: (..., S, D) keys; v: (..., S, Dv) values.
        is_causal: sum only over the keys query i may see (0 … S − L + i), as running sums.
        feature_map: φ, one of ``FEATURE_MAPS`` ("elu1" = elu(x) + 1, the paper's; "relu").
        eps: added to the denominator.
    Returns:
        out (..., L, Dv); a query that sees no key gets zeros.
    """
    fq, fk = features(q, k, v, feature_map, eps)  # (..., L, D), (..., S, D)
    if is_causal:
        num, den = causal_sums(fq, fk, v)
    else:
        s = fk.transpose(-2, -1) @ v  # Σ_j φ(k_j) v_jᵀ: (..., D, S) @ (..., S, Dv) -> (..., D, Dv)
        z = fk.sum(dim=-2, keepdim=True)  # Σ_j φ(k_j): (..., 1, D)
        num = fq @ s  # (..., L, D) @ (..., D, Dv) -> (..., L, Dv)
        den = fq @ z.transpose(-2, -1)  # (..., L, D) @ (..., D, 1) -> (..., L, 1)
    return num / (den + eps)


def linear_attention_quadratic(
    q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, feature_map: str = "elu1", eps: float = 1e-6
) -> Tensor:
    """The same attention as an (L, S) matrix, for reading: (φ(Q) φ(K)ᵀ ⊙ M) V over the row sums, O(n²).

    Arguments as in ``linear_attention``; M is the bottom-right causal mask when ``is_causal``.
    """
    fq, fk = features(q, k, v, feature_map, eps)  # (..., L, D), (..., S, D)
    a = fq @ fk.transpose(-2, -1)  # φ(q_i)ᵀ φ(k_j): (..., L, D) @ (..., D, S) -> (..., L, S)
    if is_causal:
        a = a * causal_mask(q.size(-2), k.size(-2), device=a.device)  # zero where query i may not see key j
    return (a @ v) / (a.sum(dim=-1, keepdim=True) + eps)  # (..., L, Dv)
