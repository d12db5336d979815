"""Convert between PyTorch's ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` and qkv.

PyTorch holds Q, K, V in one packed ``in_proj_weight`` (3C × C) when key and value widths
equal C (separate ``q/k/v_proj_weight`` otherwise) plus ``out_proj``. Its masks use the
opposite polarity to qkv: bool True = *ignore*. This module is the only place that
translates (see ``mask_from_torch``).

Shapes: B batch, L query length, S key length, C model width.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention
from ..nn.block import ParallelTransformerBlock, TransformerBlock


def mask_from_torch(attn_mask: Tensor | None = None, key_padding_mask: Tensor | None = None
                    ) -> tuple[Tensor | None, Tensor | None]:
    """PyTorch's (attn_mask (L, S), key_padding_mask (B, S)) -> qkv's (mask, bias).

    PyTorch: bool True = may NOT attend; a float attn_mask / key_padding_mask is added.
    qkv: bool True = may attend; float goes to ``bias``. Returned shapes broadcast to (B, H, L, S).
    """
    mask = bias = None
    for t, expand in ((attn_mask, lambda t: t), (key_padding_mask, lambda t: t[:, None, None, :])):
        if t is None:
            continue
        if t.dtype == torch.bool:
            allowed = expand(~t)
            mask = allowed if mask is None else mask & allowed
        else:
            add = expand(t.float())
            bias = add if bias is None else bias + add
    return mask, bias


def mha_from_torch(module: nn.MultiheadAttention) -> MultiHeadAttention:
    """A qkv MultiHeadAttention with the same weights (packed or separate projections, bias or not)."""
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(f"expected nn.MultiheadAttention, got {type(module).__name__}")
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError("add_bias_kv and add_zero_attn have no qkv counterpart")
    if module.kdim != module.vdim:
        raise ValueError(f"qkv needs kdim == vdim, got kdim={module.kdim}, vdim={module.vdim}")
    C, H = module.embed_dim, module.num_heads
    has_bias = module.in_proj_bias is not None
    out = MultiHeadAttention(C, H, bias=has_bias, dropout=module.dropout, kv_dim=module.kdim)
    with torch.no_grad():
        if module._qkv_same_embed_dim:
            wq, wk, wv = module.in_proj_weight.chunk(3, dim=0)  # (3C, C) -> 3 × (C, C)
        else:
            wq, wk, wv = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
        for proj, w in ((out.q_proj, wq), (out.k_proj, wk), (out.v_proj, wv)):
            proj.weight.copy_(w)
        if has_bias:
            for proj, b in zip((out.q_proj, out.k_proj, out.v_proj), module.in_proj_bias.chunk(3)):
                proj.bias.copy_(b)
        out.out_proj.weight.copy_(module.out_proj.weight)
        if has_bias:
            out.out_proj.bias.copy_(module.out_proj.bias)
    return out.to(module.out_proj.weight.device, module.out_proj.weight.dtype)


def torch_mha_lacks(module: MultiHeadAttention) -> list[str]:
    """What ``module`` computes that ``nn.MultiheadAttention`` cannot (empty: it can hold it exactly)."""
    biases = [p.bias is not None for p in (module.q_proj, module.k_proj, module.v_proj, module.out_proj)]
    checks = {"grouped-query heads": module.num_kv_heads != module.num_heads, "RoPE": module.rope is not None,
              "ALiBi": module.alibi is not None, "relative position bias (T5)": module.relative_bias is not None,
              "QK-norm": module.q_norm is not None or module.k_norm is not None,
              "head_dim apart from d_model / num_heads": module.head_dim * module.num_heads != module.d_model,
              "bias on some projections only": len(set(biases)) > 1,
              "scale apart from 1/√D": module.scale is not None, "soft cap": module.softcap is not None}
    return [name for name, lacks in checks.items() if lacks]


def mha_to_torch(module: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` with the same weights."""
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"expected qkv.MultiHeadAttention, got {type(module).__name__}")
    missing = torch_mha_lacks(module)
    if missing:
        raise ValueError(f"nn.MultiheadAttention has no {', '.join(missing)}")
    has_bias = module.q_proj.bias is not None
    kdim = None if module.kv_dim == module.d_model else module.kv_dim
    out = nn.MultiheadAttention(module.d_model, module.num_heads, dropout=module.dropout, bias=has_bias,
                                batch_first=True, kdim=kdim, vdim=kdim)
    with torch.no_grad():
        ws = (module.q_proj.weight, module.k_proj.weight, module.v_proj.weight)
        if out._qkv_same_embed_dim:
            out.in_proj_weight.copy_(torch.cat(ws, dim=0))  # 3 × (C, C) -> (3C, C)
        else:
            for name, w in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), ws):
                getattr(out, name).copy_(w)
        if has_bias:
            out.in_proj_bias.copy_(torch.cat((module.q_proj.bias, module.k_proj.bias, module.v_proj.bias)))
            out.out_proj.bias.copy_(module.out_proj.bias)
        out.out_proj.weight.copy_(module.out_proj.weight)
    return out.to(module.out_proj.weight.device, module.out_proj.weight.dtype)


_ACTIVATION = {1: "relu", 2: "gelu"}  # nn.TransformerEncoderLayer.activation_relu_or_gelu


def encoder_layer_from_torch(layer: nn.TransformerEncoderLayer) -> TransformerBlock:
    """A qkv TransformerBlock (post- or pre-LN as the layer) with the same weights."""
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise TypeError(f"expected nn.TransformerEncoderLayer, got {type(layer).__name__}")
    activation = _ACTIVATION.get(getattr(layer, "activation_relu_or_gelu", 0))
    if activation is None:
        raise ValueError(f"only relu and gelu activations translate, got {layer.activation!r}")
    attn = layer.self_attn
    has_bias = layer.linear1.bias is not None
    block = TransformerBlock(
        attn.embed_dim, attn.num_heads, layer.linear1.out_features, norm_first=layer.norm_first,
        dropout=layer.dropout.p, activation=activation, norm_eps=layer.norm1.eps, bias=has_bias,
    )
    with torch.no_grad():
        block.attn.load_state_dict(mha_from_torch(attn).state_dict())
        for mine, theirs in ((block.ff.up_proj, layer.linear1), (block.ff.down_proj, layer.linear2),
                             (block.attn_norm, layer.norm1), (block.ff_norm, layer.norm2)):
            mine.load_state_dict(theirs.state_dict())
    return block.to(layer.linear1.weight.device, layer.linear1.weight.dtype)


def encoder_layer_to_torch(block: TransformerBlock) -> nn.TransformerEncoderLayer:
    """An ``nn.TransformerEncoderLayer(batch_first=True)`` with the block's weights."""
    if not isinstance(block, TransformerBlock):
        raise TypeError(f"expected qkv.TransformerBlock, got {type(block).__name__}")
    if isinstance(block, ParallelTransformerBlock):
        raise ValueError("nn.TransformerEncoderLayer is sequential (attention, then the feed-forward), got a "
                         "ParallelTransformerBlock")
    if block.cross_attn is not None or block.ff.gate_proj is not None:
        raise ValueError("nn.TransformerEncoderLayer has no cross-attention or gated feed-forward")
    if block.ff.activation not in ("relu", "gelu") or not isinstance(block.attn_norm, nn.LayerNorm):
        raise ValueError(f"nn.TransformerEncoderLayer takes relu/gelu and LayerNorm, got {block.ff.activation}")
    attn = block.attn
    layer = nn.TransformerEncoderLayer(
        attn.d_model, attn.num_heads, block.ff.up_proj.out_features, dropout=block.drop.p,
        activation=block.ff.activation, layer_norm_eps=block.attn_norm.eps, batch_first=True,
        norm_first=block.norm_first, bias=block.ff.up_proj.bias is not None,
    )
    with torch.no_grad():
        layer.self_attn.load_state_dict(mha_to_torch(attn).state_dict())
        for theirs, mine in ((layer.linear1, block.ff.up_proj), (layer.linear2, block.ff.down_proj),
                             (layer.norm1, block.attn_norm), (layer.norm2, block.ff_norm)):
            theirs.load_state_dict(mine.state_dict())
    return layer.to(block.ff.up_proj.weight.device, block.ff.up_proj.weight.dtype)
