"""Which fast path may run, asked in one place: each path is one entry of ``PATHS`` that says what it was built and
tested for (``accepts``) and gives the one reason it refuses a subject (``refuses``; None: it runs).

    path        subject, context        built and tested for
    fused       model, batch=           qkv's C++ decode step (``qkv.kernels.fused_step``: its MODULES and CONFIG)
    inductor    model                   the one-token step compiled by torch.compile
    cudagraph   model                   the one-token step recorded once as a CUDA graph (``cuda_graph``)
    moe_kernel  MoE layer, x=           decoding's C++ expert op (``qkv.kernels.moe``)
    grouped_mm  MoE layer, x=           training's expert products as torch._grouped_mm (``qkv.kernels.moe_training``)
    int8        model                   int8 linear weights through torchao (``qkv.kernels.quant``)
    paged       model                   the server's paged KV cache (``qkv.generation.paged``)
    packed      model                   the server's linears on weights in oneDNN's blocked layout
                                        (``qkv.kernels.linear.packed_weights``)

Each path's module names its check ``refuses`` and the check's parts ``refuses_<what>`` (``fused_step.refuses``,
``moe.refuses``, ``moe_training.refuses``, ``paged.refuses``, ``cuda_graph.refuses_device``/``refuses_model``);
the entries here are ``refuses_<path>``. Callers ask once and say the reason where they fall back: ``generate``,
beam search and ``qkv sample``/``chat`` through the decode plan (``qkv.generation.plan``;
``backends.backend_for`` turns the answers into a backend), training through ``grouped_mm_refusals(model)``
before its first step, the server's plan (``plan.plan_serving``: auto or eager, no fast step here decodes a
paged cache's rows) through "paged" and, for auto, "packed". The MoE layers' own forwards call the same checks
(the functions named here) for each input, where the answer depends on the tokens' dtype, device and grad mode;
the reference layer (``qkv.nn.moe``) asks only its own ``refuses_fast_dispatch``. The tables a check reads stay
with its path (the fused step's allow-lists beside its packing).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels import accelerated, fused_step, linear, moe, moe_training, quant
from ..nn.moe import MixtureOfExperts
from . import cuda_graph, paged


@dataclass(frozen=True)
class FastPath:
    """One fast path: its ``name``, what it ``accepts`` in words, and ``check`` (subject, **context) -> the one
    reason it refuses, or None."""

    name: str
    accepts: str
    check: Callable[..., str | None]

    def refuses(self, subject, **context) -> str | None:
        """Why this path cannot run ``subject`` in ``context``, or None where it can."""
        return self.check(subject, **context)


def model_device(model) -> torch.device:
    """Where ``model``'s weights are (tests replace this to decide for a GPU on a CPU)."""
    return next(model.parameters()).device


def refuses_fused(model, *, batch: int = 1) -> str | None:
    """The fused step's reason (``fused_step.refuses``) for ``batch`` rows."""
    return fused_step.refuses(model, batch)


def refuses_compiled_step(model) -> str | None:
    """Why inductor's compiled step cannot decode ``model``, or None. It is compiled once and then runs
    without its guards, so everything a step reads must be a tensor: every cache's static form is (a sliding
    layer's ring cache places its keys by the step's ``input_pos`` tensor alone), so none is refused today."""
    return None


def refuses_graph(model) -> str | None:
    """Why the CUDA-graph step cannot decode ``model``, or None: it must sit on a CUDA device, and it is
    recorded once, so (as inductor's step) everything a step reads must be a tensor."""
    return (cuda_graph.refuses_device(model_device(model)) or refuses_compiled_step(model)
            or cuda_graph.refuses_model(model))


def refuses_moe_kernel(layer: MixtureOfExperts, *, x: torch.Tensor) -> str | None:
    """Why decoding's expert op cannot run ``layer`` on x (..., C) (``moe.refuses``), or None."""
    return layer.refuses_fast_dispatch() or moe.refuses(layer.experts, x.reshape(-1, x.size(-1)))


def refuses_grouped_mm(layer: MixtureOfExperts, *, x: torch.Tensor, compiling: bool | None = None) -> str | None:
    """Why training's grouped products cannot run ``layer`` on x (B, T, C) now (``moe_training.refuses``: the
    layer's dispatch, grad mode, torch.compile (``compiling``; None: whether it runs inside it now), then the
    experts and the device), or None."""
    return moe_training.refuses(layer, x, compiling=compiling)


def refuses_int8(model) -> str | None:
    """Why ``quant.quantize_weights(model, "int8")`` would not quantise ``model``, or None."""
    done = quant.quantized(model)
    if done:
        return f"the model is already quantised ({len(done)} parameters such as {next(iter(done))})"
    if not quant.targets(model):
        return f"{type(model).__name__} has no linear layer to quantise (the output head is kept)"
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install 'qkv[quant]')"
    return None


def refuses_paged(model) -> str | None:
    """Why a paged cache cannot hold ``model``'s keys (``paged.refuses``), or None."""
    return paged.refuses(model)


def refuses_packed(model) -> str | None:
    """Why none of ``model``'s linears would read its weight in oneDNN's blocked layout under the speed layer
    (``linear.packed_weights`` packs the ones ``linear.packable`` takes), or None where one would."""
    if not linear.ONEDNN:
        return "this torch has no oneDNN"
    device = model_device(model)
    if device.type != "cpu":
        return f"the model is on {device}: the blocked layout is oneDNN's for a CPU"
    with accelerated(model):
        packs = any(linear.packable(m) for m in model.modules())
    return None if packs else (f"no linear it packs (plain fp32, or bf16 where the CPU computes it natively, of at "
                               f"least {linear.ONEDNN_MIN_WEIGHT} numbers)")


PATHS = {p.name: p for p in (
    FastPath("fused", "a qkv.GPT whose every module and config field the step declares, at most MAX_ROWS rows, "
             "float32, bfloat16 or int8 weights on a CPU, where qkv's C++ kernels are built", refuses_fused),
    FastPath("inductor", "every model whose step reads only tensors (every static cache)", refuses_compiled_step),
    FastPath("cudagraph", "a model on a CUDA device whose step reads only tensors and syncs with no host value",
             refuses_graph),
    FastPath("moe_kernel", "SwiGLU experts without biases, at most MAX_ROWS fp32 tokens on a CPU, at inference",
             refuses_moe_kernel),
    FastPath("grouped_mm", "SwiGLU experts without biases, rows 16-byte aligned, where autograd records, eagerly: "
             "fp32 or bf16 on a CPU, bf16 on a GPU of compute capability 9.0 or more", refuses_grouped_mm),
    FastPath("int8", "a float model with linear layers, where torchao is installed", refuses_int8),
    FastPath("paged", "a decoder each of whose layers keeps a KVCache, RingKVCache or LatentCache, its positions not "
             "a bias over shared key places (not ALiBi or T5)", refuses_paged),
    FastPath("packed", "linears under the speed layer on a CPU with oneDNN, plain fp32 or bf16 where the CPU "
             "computes it natively, of at least ONEDNN_MIN_WEIGHT numbers", refuses_packed),
)}


def refuses(path: str, subject, **context) -> str | None:
    """Why ``path`` (a name in ``PATHS``) cannot run ``subject`` in ``context``, or None where it can."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {tuple(PATHS)}, got {path!r}")
    return PATHS[path].refuses(subject, **context)


def grouped_mm_refusals(model, *, x: torch.Tensor | None = None, compiling: bool = False) -> dict[str, str]:
    """Training's question, asked once before it runs: for each mixture-of-experts layer of ``model`` (by name), why
    training's grouped products will not run it on tokens like ``x`` (default: an empty batch in its experts'
    dtype; autocast as it is on) with autograd recording, inside torch.compile where ``compiling``, where they
    will not. Empty: every layer runs them (or there is none)."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, MixtureOfExperts):
            weight = next(m.experts.parameters())
            probe = x if x is not None else weight.new_empty(1, 0, m.router.weight.size(1))  # (B, T, C)
            with torch.enable_grad():
                reason = refuses("grouped_mm", m, x=probe, compiling=compiling)
            if reason is not None:
                out[name] = reason
    return out
