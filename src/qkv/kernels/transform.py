"""The speed layer applied on top of a model, as torchao's ``quantize_`` is: nothing in the model changes but
which function computes its linear products.

    accelerate(model)        in place: every plain nn.Linear becomes a KernelLinear (same parameters, names,
                             state dict; the class alone changes), whose product at inference on a CPU goes
                             through qkv.kernels.linear; training, autocast and other devices keep F.linear's
    restore(model)           the reverse: plain nn.Linear again
    with accelerated(model): accelerate for the block's duration, then restore (what generate, beam search
                             and the benchmarks do)

Only plain ``nn.Linear`` is swapped (a subclass such as a LoRA layer, or a module with hooks, keeps its own
forward), so a saved, copied, moved, adapted or trained model behaves as the reference one does.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from .linear import KernelLinear


def plain_linears(model: nn.Module) -> list[nn.Linear]:
    """The model's ``nn.Linear`` layers that are exactly that: no subclass and no hooks."""
    return [m for m in model.modules() if type(m) is nn.Linear and not (m._forward_hooks or m._forward_pre_hooks)]


def accelerate(model: nn.Module) -> nn.Module:
    """Serve ``model``'s plain linears through qkv's CPU kernels at inference, in place; returns ``model``."""
    for m in plain_linears(model):
        m.__class__ = KernelLinear  # forward alone differs: parameters, buffers and hooks are untouched
    return model


def restore(model: nn.Module) -> nn.Module:
    """Undo ``accelerate``: every ``KernelLinear`` of ``model`` is a plain ``nn.Linear`` again; returns ``model``."""
    for m in model.modules():
        if type(m) is KernelLinear:
            m.__class__ = nn.Linear
    return model


@contextmanager
def accelerated(model: nn.Module) -> Iterator[nn.Module]:
    """``accelerate(model)`` inside the block, the linears it swapped restored after (also on an error)."""
    swapped = plain_linears(model)
    for m in swapped:
        m.__class__ = KernelLinear
    try:
        yield model
    finally:
        for m in swapped:
            m.__class__ = nn.Linear
