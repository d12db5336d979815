"""Attention maps: every layer's per-head weights, taken from a model in one place for the
figures, the explorer and the claims (no matplotlib here).

    ids → model(ids, return_attention=True).attentions → N × (B, H, T, T) → (N, B, H, T, T)

Shapes: N layers, B batch, H heads, T tokens.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


def model_device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@torch.no_grad()
def attention_weights(model: nn.Module, ids: Tensor) -> Tensor:
    """ids (B, T) -> (N, B, H, T, T) float32 on the CPU, the model run in eval mode (no dropout).

    TypeError for a model that is not an nn.Module or does not take ``return_attention=True``;
    ValueError when it returns no maps or maps of another shape.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module (qkv.GPT or qkv.Encoder), got {type(model).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"expected ids (B, T), got shape {tuple(ids.shape)}")
    was_training = model.training
    model.eval()  # dropout would make the maps random
    try:
        out = model(ids.to(model_device(model)), return_attention=True)
    except TypeError as e:
        raise TypeError(f"{type(model).__name__} cannot be explored: it must take one id sequence and "
                        f"return_attention=True (qkv.GPT, qkv.Encoder); {e}") from None
    finally:
        model.train(was_training)
    maps = getattr(out, "attentions", None)
    if not maps:
        raise ValueError(f"{type(model).__name__} returned no attentions")
    B, T = ids.shape
    if maps[0].dim() != 4 or maps[0].size(0) != B or maps[0].shape[2:] != (T, T):
        raise ValueError(f"expected attention maps ({B}, H, {T}, {T}) per layer, got {tuple(maps[0].shape)}")
    return torch.stack(maps).float().cpu()  # N × (B, H, T, T) -> (N, B, H, T, T)


def attention_maps(model: nn.Module, ids: Tensor) -> Tensor:
    """One sequence: ids (T,) or (1, T) -> (N, H, T, T)."""
    return attention_weights(model, ids.reshape(1, -1))[:, 0]  # (N, 1, H, T, T) -> (N, H, T, T)
