"""The speed layer applied on top of a model, as torchao's ``quantize_`` is: nothing in the model changes but
which function computes some of its steps — a module's class, swapped in place for a subclass.

    accelerate(model)        in place: every plain nn.Linear becomes a KernelLinear (same parameters, names,
                             state dict; the class alone changes), whose product at inference on a CPU goes
                             through qkv.kernels.linear; training, autocast and other devices keep F.linear's;
                             every MixtureOfExperts a DecodeMixtureOfExperts (qkv.kernels.moe: the gathered
                             dispatch inside torch.compile)
    accelerate_training(m)   in place: every plain MultiHeadAttention becomes a TrainingAttention
                             (qkv.kernels.training: q, k, v in one product; the core in fp32 where faster),
                             every MixtureOfExperts a TrainingMixtureOfExperts (qkv.kernels.moe_training:
                             each expert product one torch._grouped_mm over every expert's rows)
    restore(model)           the reverse of both: the reference classes again
    with accelerated(model): accelerate for the block's duration, then restore (what generate, beam search
                             and the benchmarks do); accelerated(model, training=True) for training's swap

Only a module of exactly the reference class is swapped (a subclass such as a LoRA layer, a module with
hooks, or a linear whose weight torchao quantised (``qkv.kernels.quant``) keeps its own forward), so a saved,
copied, moved, adapted or trained model behaves as the reference one does.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from ..nn.attention import MultiHeadAttention
from ..nn.moe import MixtureOfExperts
from .linear import KernelLinear, plain_tensor
from .moe import DecodeMixtureOfExperts
from .moe_training import TrainingMixtureOfExperts
from .training import TrainingAttention, hookless

INFERENCE = {nn.Linear: KernelLinear, MixtureOfExperts: DecodeMixtureOfExperts}  # reference class -> its subclass
TRAINING = {MultiHeadAttention: TrainingAttention, MixtureOfExperts: TrainingMixtureOfExperts}


def plain_modules(model: nn.Module, swaps: dict[type, type]) -> list[nn.Module]:
    """The model's modules whose class is exactly one ``swaps`` names (no subclass), that have no hooks and whose
    own parameters are plain tensors (a linear holding torchao's quantised weight keeps its class and product)."""
    return [m for m in model.modules() if type(m) in swaps and hookless(m) and plain_parameters(m)]


def plain_parameters(module: nn.Module) -> bool:
    """``module``'s own parameters are plain tensors, none a subclass such as torchao's ``Int8Tensor``."""
    return all(plain_tensor(p) for p in module.parameters(recurse=False))


def plain_linears(model: nn.Module) -> list[nn.Linear]:
    """The model's ``nn.Linear`` layers that are exactly that: no subclass and no hooks."""
    return plain_modules(model, INFERENCE)


def swap(modules: list[nn.Module], swaps: dict[type, type]) -> None:
    for m in modules:
        m.__class__ = swaps[type(m)]  # forward alone differs: parameters, buffers and hooks are untouched


def accelerate(model: nn.Module) -> nn.Module:
    """Serve ``model``'s plain linears through qkv's CPU kernels at inference, in place; returns ``model``."""
    swap(plain_linears(model), INFERENCE)
    return model


def accelerate_training(model: nn.Module) -> nn.Module:
    """Compute ``model``'s plain attention and mixture-of-experts modules through the training path, in place;
    returns ``model``."""
    swap(plain_modules(model, TRAINING), TRAINING)
    return model


def restore(model: nn.Module) -> nn.Module:
    """Undo ``accelerate`` and ``accelerate_training``: the reference classes again; returns ``model``."""
    back = {fast: ref for swaps in (INFERENCE, TRAINING) for ref, fast in swaps.items()}
    swap([m for m in model.modules() if type(m) in back], back)
    return model


@contextmanager
def accelerated(model: nn.Module, *, training: bool = False) -> Iterator[nn.Module]:
    """``accelerate(model)`` (``accelerate_training`` with ``training``) inside the block, the modules it swapped
    restored after (also on an error)."""
    swaps = TRAINING if training else INFERENCE
    swapped = plain_modules(model, swaps)
    swap(swapped, swaps)
    try:
        yield model
    finally:
        swap(swapped, {fast: ref for ref, fast in swaps.items()})
