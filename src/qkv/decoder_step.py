"""qkv's fused decode step: one token for each of a few rows through a whole pre-norm decoder in one
call, ``DecoderState.step`` (``decoder_step.cpp``), what ``generate(compile=True)`` runs on a CPU.

    ids (B, 1), slots (B, M), kv_caches, input_pos (1,)  ->  logits (B, V)      B ≤ MAX_ROWS, fp32
    greedy: up to n such steps in one call, each taking its logits' argmax  ->  tokens (B, k)

At batch 1 a token reads every weight once, so its time is the weights' bytes over the memory's rate.
A decoder that calls one kernel per weight matrix (eager, or inductor's code) stops and restarts its
threads 25-37 times a token: over the model's weights alone that streamed at ~0.74 of a plain read
here, where one parallel region streamed the same products at 0.95-1.0 (README, Speed). The embedding
is looked up in C++ too: a step is one call from Python, since after a token's 92 MB have streamed
through the caches each further small op there costs 20-60 µs rather than 2-5 (measured). The model's
own forward is the reference: the tests compare logits, caches and tokens.

It decodes decoder-only models (``qkv.GPT``) with pre-norm blocks (GPT-2's and LLaMA's shapes: LayerNorm
or RMSNorm, any of the activations, gated or not, biases or none, grouped K/V heads, learned, sinusoidal,
rotary or no positions); ``unsupported`` names what it does not (ALiBi, post-norm, hooks, adapters,
bf16, more than MAX_ROWS rows), and ``generate`` then compiles the step with inductor instead. It is
built with qkv's other kernel (``qkv.matvec``), once per machine.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from . import matvec
from .layers import ACTIVATIONS, GATED
from .linear import plain
from .positional import LearnedPositionalEmbedding

MAX_ROWS = matvec.MAX_ROWS  # the rows its products read each weight row for, as the matrix-vector kernel's
NORMS = {nn.LayerNorm: 0, nn.RMSNorm: 1}
ACTS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3, "swiglu": 3, "geglu": 1}  # decoder_step.cpp's Act
assert set(ACTS) == set(ACTIVATIONS) | set(GATED)


def unsupported(model, batch: int) -> str | None:
    """Why the fused step cannot decode ``model`` at ``batch`` rows, or None where it can."""
    decoder_only = hasattr(model, "new_kv_caches") and hasattr(model, "lm_head") and not hasattr(model, "encoder")
    if not decoder_only:  # duck-typed: qkv.models imports qkv.generate, which imports this
        return f"it decodes decoder-only models (qkv.GPT), not {type(model).__name__}"
    c, weight = model.config, model.lm_head.weight
    norms = [n for b in model.blocks for n in (b.attn_norm, b.ff_norm)]
    norms += [n for n in (model.final_norm, model.embed.norm) if n is not None]
    reasons = (
        (batch > MAX_ROWS, f"batch {batch} > {MAX_ROWS} rows (oneDNN's blocked products are faster there)"),
        (not c.norm_first, "post-norm blocks (norm_first=False)"),
        (c.positional == "alibi", "ALiBi positions"),
        (weight.dtype != torch.float32 or not weight.is_cpu, f"{weight.dtype} weights on {weight.device}: "
         "it runs float32 on a CPU"),
        (any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()), "a module with hooks"),
        (not all(plain(m) for m in model.modules() if isinstance(m, nn.Linear)), "an adapted Linear (LoRA)"),
        (not all(affine_norm(n) and type(n) is type(norms[0]) for n in norms),
         "norms other than one kind of nn.LayerNorm or nn.RMSNorm with weights"),
        (model.lm_head.bias is not None, "a bias on the LM head"),
    )
    for failed, reason in reasons:
        if failed:
            return reason
    tables = [model.embed.tok.weight] + ([model.embed.pos.weight] if c.positional == "learned" else [])
    if not all(t.dtype == torch.float32 and t.is_cpu and t.is_contiguous() for t in tables + layer_weights(model)
               if t.numel()):
        return "a weight that is not a contiguous float32 CPU tensor"
    return None if matvec.available() else "qkv's C++ kernels could not be built (the warning says why)"


def affine_norm(norm: nn.Module) -> bool:
    """nn.LayerNorm or nn.RMSNorm with a weight (qkv's are), the norms decoder_step.cpp computes."""
    return type(norm) in NORMS and getattr(norm, "weight", None) is not None


def norm_weights(norm: nn.Module | None) -> list[Tensor]:
    empty = torch.empty(0)
    if norm is None:
        return [empty, empty]
    return [norm.weight.detach(), empty if getattr(norm, "bias", None) is None else norm.bias.detach()]


def linear_weights(*linears: nn.Linear | None) -> list[Tensor]:
    """(weight, bias) of each, an empty tensor for what is absent (decoder_step.cpp reads it as none)."""
    out = []
    for m in linears:
        for t in (None if m is None else m.weight, None if m is None else m.bias):
            out.append(torch.empty(0) if t is None else t.detach())
    return out


def embedding_weights(embed, max_len: int) -> list[Tensor]:
    """decoder_step.cpp's ``Embedding``: the token table, the position table (learned, or the sinusoids at
    the max_len positions the model takes), the token-type vector added (type 0's) and the embedding norm's two."""
    empty = torch.empty(0)
    if embed.pos is None:
        table = empty
    elif isinstance(embed.pos, LearnedPositionalEmbedding):
        table = embed.pos.weight.detach()
    else:  # sinusoidal: its own forward at every position, as the model computes it
        table = embed.pos(torch.arange(max_len)).contiguous()
    token_type = empty if embed.token_type is None else embed.token_type.weight.detach()[0]
    return [embed.tok.weight.detach(), table, token_type] + norm_weights(embed.norm)


def layer_weights(model) -> list[Tensor]:
    """Every block's 18 tensors in decoder_step.cpp's ``Layer`` order, then Norm_f's two and the LM head."""
    out = []
    for b in model.blocks:
        a, f = b.attn, b.ff
        out += norm_weights(b.attn_norm) + linear_weights(a.q_proj, a.k_proj, a.v_proj, a.out_proj)
        out += norm_weights(b.ff_norm) + linear_weights(f.up_proj, f.gate_proj, f.down_proj)
    return out + norm_weights(model.final_norm) + [model.lm_head.weight.detach()]


class FusedStep:
    """``generate``'s one-token step for ``model`` through ``DecoderState.step``: the same
    signature as ``qkv.generate.last_logits(model)``, whose answer it gives (to fp32's rounding)."""

    def __init__(self, model) -> None:
        reason = unsupported(model, 1)
        if reason is not None:
            raise ValueError(f"the fused decode step cannot run this model: {reason}")
        c = model.config
        self.weights = embedding_weights(model.embed, c.max_len) + layer_weights(model)
        self.eps, self.scale = c.norm_eps, model.embed.scale
        self.rotary = rope = model.blocks[0].attn.rope  # one RotaryEmbedding, shared by the blocks
        self.shape = [c.d_model, c.num_heads, c.num_kv_heads or c.num_heads, c.head_dim, c.ff_width, c.vocab_size,
                      NORMS[type(model.blocks[0].attn_norm)], ACTS[c.activation], int(c.activation in GATED),
                      0 if rope is None else 2 if rope.interleaved else 1]  # decoder_step.cpp's Shape and Rope
        self.caches = None

    def rope_table(self, capacity: int) -> Tensor:
        """cos and sin (2, M, D/2) of every slot's angles, as the model's RotaryEmbedding computes them."""
        if self.rotary is None:
            return torch.empty(0)
        return torch.stack(self.rotary.angles(torch.arange(capacity))).contiguous()

    def state(self, kv_caches):
        """The C++ ``DecoderState`` for these caches: the weights, each layer's k and v buffers (B, G, M, D)
        and RoPE's table, handed to C++ (and checked) once: the cache writes in place, the same tensors
        every step."""
        if self.caches is None or self.caches[0] is not kv_caches:
            buffers = [t for cache in kv_caches for t in (cache.k, cache.v)]
            table = self.rope_table(buffers[0].size(2))
            self.caches = kv_caches, matvec.MODULE.DecoderState(self.weights, buffers, table, self.shape,
                                                                self.eps, self.scale)
        return self.caches[1]

    def __call__(self, ids: Tensor, slots: Tensor, kv_caches, input_pos: Tensor) -> Tensor:
        """ids (B, 1) into cache slot input_pos (1,), slots (B, M) True on real tokens -> logits (B, V)."""
        return self.state(kv_caches).step(ids, slots, input_pos)

    def greedy(self, ids: Tensor, slots: Tensor, kv_caches, slot: int, n: int, eos_id: int | None,
               finished: Tensor) -> Tensor:
        """Up to n greedy steps in one call, the first feeding ids (B, 1) at ``slot``: each marks its slot and
        takes the argmax, as ``generate``'s loop does (a row that emitted ``eos_id`` emits it again, and the
        call stops once all have; ``finished`` (B,) is updated) -> the tokens (B, k), k ≤ n."""
        return self.state(kv_caches).greedy(ids, slots, slot, n, -1 if eos_id is None else eos_id, finished)
