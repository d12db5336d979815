"""The speed layer's training path: a model's attention computed the same way in fewer, faster calls.

    q, k, v = split(x [W_q; W_k; W_v]ᵀ + [b_q; b_k; b_v])      one product instead of three (nanoGPT's c_attn)
    softmax(q kᵀ · scale) v  in fp32 under a CPU's bf16 autocast, for small heads and short sequences

``TrainingAttention`` is ``MultiHeadAttention`` with two of its steps computed otherwise:

- ``project_qkv``: self-attention projects q, k and v in one product against the three weights concatenated
  (the same parameters, read three times less often by the matrix kernel; their gradients flow back through
  the concatenation). It takes plain ``nn.Linear`` projections (no adapter, no hook) with biases on all three
  or none; anything else is the reference's three products.
- ``attend_heads``: on a CPU under bf16 autocast, PyTorch's bf16 flash-attention backward is slower than its
  fp32 one at small heads (docs/design-notes.md, issue 35), so where the head is at most
  ``FP32_CORE_MAX_HEAD_DIM`` wide and the keys at most ``FP32_CORE_MAX_KEYS`` long, the core runs on q, k, v
  cast to fp32 (exactly: every bf16 value is an fp32 value) and its output is cast back to bf16 — the reference's
  answer to within its bf16 rounding. Elsewhere it is the reference's own.

The model's ``MultiHeadAttention.forward`` is the reference; the tests compare outputs and gradients, fp32 and
bf16, and every refusal. Applied by ``qkv.kernels.accelerate_training`` (``qkv train`` does, unless
``--no-speed-layer``), undone by ``restore``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from .linear import plain_tensor

FP32_CORE_MAX_HEAD_DIM = 64  # the shapes where the fp32 core measured faster than bf16's (design notes)
FP32_CORE_MAX_KEYS = 256


def hookless(module: nn.Module) -> bool:
    """No forward hooks on ``module``: the speed layer may compute its forward otherwise."""
    return not (module._forward_hooks or module._forward_pre_hooks)


def plain(module: nn.Module | None) -> bool:
    """``module`` is an ``nn.Linear`` exactly (no subclass, no adapter) with no hooks and a plain weight (not
    torchao's quantised tensor, which ``torch.cat`` would not keep)."""
    return type(module) is nn.Linear and hookless(module) and plain_tensor(module.weight) and plain_tensor(module.bias)


def packable(attn: MultiHeadAttention) -> bool:
    """Its q, k and v projections can be one product: plain linears, biases on all three or on none."""
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    return all(map(plain, projections)) and len({p.bias is None for p in projections}) == 1


def fp32_core(q: Tensor, k: Tensor) -> bool:
    """The attention core is faster in fp32 than in the bf16 autocast gives it (CPU, small heads, short keys)."""
    return (q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_autocast_enabled("cpu")
            and q.size(-1) <= FP32_CORE_MAX_HEAD_DIM and k.size(-2) <= FP32_CORE_MAX_KEYS)


class TrainingAttention(MultiHeadAttention):
    """``MultiHeadAttention`` with q, k, v projected in one product and the core in fp32 where that is faster."""

    def project_qkv(self, x: Tensor, context: Tensor | None, context_kv) -> tuple[Tensor, Tensor, Tensor]:
        if context is not None or context_kv is not None or not packable(self):
            return super().project_qkv(x, context, context_kv)
        projections = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight for p in projections])  # (H·D + 2·G·D, C)
        bias = None if self.q_proj.bias is None else torch.cat([p.bias for p in projections])
        widths = [p.out_features for p in projections]  # H·D, G·D, G·D
        q, k, v = F.linear(x, weight, bias).split(widths, dim=-1)  # (B, T, H·D), (B, T, G·D) × 2
        H, G = self.num_heads, self.num_kv_heads
        q, k, v = self.split_heads(q, H), self.split_heads(k, G), self.split_heads(v, G)
        q = q if self.q_norm is None else self.q_norm(q)  # QK-norm over each head's D, as the reference
        k = k if self.k_norm is None else self.k_norm(k)
        return q, k, v  # (B, H, T, D), (B, G, T, D), (B, G, T, D)

    def attend_heads(self, q: Tensor, k: Tensor, v: Tensor, **kwargs) -> tuple[Tensor, Tensor | None]:
        if not fp32_core(q, k):
            return super().attend_heads(q, k, v, **kwargs)
        with torch.autocast("cpu", enabled=False):
            out, weights = super().attend_heads(q.float(), k.float(), v.float(), **kwargs)  # (B, H, L, D)
        return out.to(q.dtype), None if weights is None else weights.to(q.dtype)
