"""Weight-only int8 through torchao: a transform applied on top of a finished model, for inference.

    y = x Wᵀ + b   with   W ≈ s ⊙ Q,   Q int8 (N, K),   s (N, 1) one scale per output row (absmax / 127)

``quantize_weights(model, "int8")`` is torchao's ``quantize_(model, Int8WeightOnlyConfig())`` over the model's
linear layers, in place (as torchao's is; quantise a ``copy.deepcopy`` to keep the float model): each weight
becomes torchao's ``Int8Tensor`` (a tensor subclass holding Q and s) inside the same ``nn.Linear``, whose
product torchao computes; activations stay in the model's float type. Nothing in the reference layer changes:
the modules keep their classes, the rest of the model its weights.

What is quantised: every ``nn.Linear`` but the output head — the blocks' attention and feed-forward projections,
which hold nearly all the weights a decoded token reads. Kept in the model's float type: the embedding (a table
lookup reads one row a token) and the output head, whose rounding would fall on the logits directly and which is
often tied to the embedding (quantising it would untie the two: a second, int8 copy of the table), unless asked
for (``head=True``: the head's bytes, a large share of a small model's, are then a quarter of fp32's, as in
llama.cpp's q8_0 files). A linear whose weight another module shares is kept for the same reason.

The speed layer's matrix-vector paths read plain memory: ``accelerate`` leaves a quantised linear as it is and
inductor compiles torchao's product; the fused C++ step reads each quantised weight's Q and s themselves
(``int8_rows``) and streams a quarter of float32's bytes. Shapes: N output width, K input width.
"""
from __future__ import annotations

import contextlib
import logging
import warnings

import torch
from torch import Tensor, nn

from .linear import plain_tensor

KINDS = ("none", "int8")
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")  # what importing torchao logs on a CPU-only build, harmlessly


@contextlib.contextmanager
def quiet_import():
    """Silence the warnings torchao logs as it is imported (at first, and inside its first ``quantize_``) where
    its CUDA extensions cannot load ("Failed to load _C_mxfp8 …"), and torch's note on its enum registration:
    nothing there concerns int8 on a CPU."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def torchao_int8():
    """torchao's (``quantize_``, ``Int8WeightOnlyConfig``), imported quietly; ImportError naming the extra."""
    try:
        with quiet_import():
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as e:
        raise ImportError(f"int8 weights need torchao: pip install 'qkv[quant]' ({e})") from None
    return quantize_, Int8WeightOnlyConfig


def shared_weights(model: nn.Module) -> set[int]:
    """The ids of the parameters more than one module holds (a tied output head and embedding)."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {i for i, n in seen.items() if n > 1}


def targets(model: nn.Module, head: bool = False) -> dict[str, nn.Linear]:
    """The linears ``quantize_weights`` quantises, by name: every ``nn.Linear`` but the output head (``lm_head``)
    and those whose weight another module shares; with ``head``, the output head too."""
    lm_head, shared = getattr(model, "lm_head", None), shared_weights(model)
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear)
            and ((head and m is lm_head) or (m is not lm_head and id(m.weight) not in shared))}


def untie_head(model: nn.Module) -> None:
    """Give the output head its own copy of a weight it shares (a tied embedding), so that quantising the head
    leaves the embedding's table as it is."""
    lm_head = getattr(model, "lm_head", None)
    if isinstance(lm_head, nn.Linear) and id(lm_head.weight) in shared_weights(model):
        lm_head.weight = nn.Parameter(lm_head.weight.detach().clone(), requires_grad=lm_head.weight.requires_grad)


def int8_rows(weight) -> tuple[Tensor, Tensor] | None:
    """(Q int8 (N, K) contiguous, s float32 (N,)) of a weight ``quantize_weights`` made (torchao's ``Int8Tensor``:
    one symmetric scale per output row, no zero point, no activation quantisation), W ≈ s ⊙ Q; None for any
    other tensor."""
    if type(weight).__name__ != "Int8Tensor" or weight.dim() != 2:
        return None
    q, scale, zero = (getattr(weight, name, None) for name in ("qdata", "scale", "zero_point"))
    per_row = list(getattr(weight, "block_size", ())) == [1, weight.size(1)]
    plain = getattr(weight, "act_quant_kwargs", None) is None and getattr(weight, "act_pre_scale", None) is None
    if not (per_row and plain and isinstance(q, Tensor) and q.dtype == torch.int8 and q.shape == weight.shape
            and isinstance(scale, Tensor) and scale.numel() == q.size(0)
            and (zero is None or not bool(zero.any()))):
        return None
    return q.contiguous(), scale.detach().reshape(-1).float().contiguous()


def quantized(model: nn.Module) -> dict[str, str]:
    """The parameters that are not plain tensors (quantised), by name: their type's name."""
    return {name: type(p).__name__ for name, p in model.named_parameters() if not plain_tensor(p)}


def quantize_weights(model: nn.Module, kind: str = "int8", head: bool = False) -> nn.Module:
    """Quantise ``model``'s linear weights to ``kind`` in place (``"none"``: leave it as it is); returns ``model``.
    ``head``: the output head too (untied first from an embedding it shares: an int8 copy beside the table).

    Raises ValueError for a kind not in ``KINDS`` or a model already quantised (quantise the float model once),
    ImportError without torchao (the ``quant`` extra)."""
    if kind not in KINDS:
        raise ValueError(f"weights kind must be one of {KINDS}, got {kind!r}")
    if kind == "none":
        return model
    done = quantized(model)
    if done:
        name, typ = next(iter(done.items()))
        raise ValueError(f"the model is already quantised ({name}: {typ}, {len(done)} such parameters): "
                         "quantise its float weights once")
    if head:
        untie_head(model)
    chosen = targets(model, head)
    if not chosen:
        raise ValueError(f"{type(model).__name__} has no linear layer to quantise (the output head is kept)")
    quantize_, Int8WeightOnlyConfig = torchao_int8()
    with quiet_import():  # quantize_ imports more of torchao on its first call
        quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda m, name: chosen.get(name) is m)
    # torch.compile (the inductor backend) notes that Int8Tensor has no stable hash for its AOT cache: it only
    # skips that cache, so the note is left out of the command's output
    warnings.filterwarnings("ignore", message=r"Int8Tensor does not implement _stable_hash_for_caching")
    return model


def describe(model: nn.Module) -> str:
    """One line: how many weights are quantised (and their parameters) and how many parameters are kept in
    which float type; "weights: none quantised" for a float model."""
    done = quantized(model)
    if not done:
        return "weights: none quantised"
    params = dict(model.named_parameters())  # a tied weight once
    q = sum(params[name].numel() for name in done)
    kept = [p for name, p in params.items() if name not in done]
    floats = "/".join(sorted({str(p.dtype).removeprefix("torch.") for p in kept})) or "-"
    head = ", the output head among them" if hasattr(model, "lm_head") and "lm_head.weight" not in done else ""
    return (f"weights: {len(done)} linear weights to int8 by torchao ({'/'.join(sorted(set(done.values())))}, "
            f"{q:,} parameters); {sum(p.numel() for p in kept):,} parameters kept in {floats}{head}")
