"""Chapter 4's picture of one block, as a check: token embedding + PE → multi-head attention →
Add & LayerNorm → position-wise feed-forward → Add & LayerNorm → the next block, written out by
hand on a model's own parameters and compared with the model.

Shapes: B batch, T length, C model width.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models import Encoder, ModelConfig
from .measure import FLOAT_TOL, rel_err
from .messages import say
from .registry import check


def by_the_picture(model: nn.Module, ids: Tensor) -> Tensor:
    """The chapter-4 diagram line by line on ``model``'s parameters: ids (B, T) -> (B, T, C)."""
    embed = model.embed
    x = embed.tok(ids) * embed.scale + embed.pos(ids.size(1))  # X = Embedding + PE: (B, T, C)
    for block in model.blocks:
        x = block.attn_norm(x + block.attn(x))  # Multi-Head Attention, then Add & LayerNorm
        x = block.ff_norm(x + block.ff(x))  # Position-wise Feed-Forward, then Add & LayerNorm
    return x


@check("block-order", "§4",
       "one block: Embedding + PE → multi-head attention → Add & LayerNorm → feed-forward → Add & LayerNorm → "
       "next block",
       claim_zh="「Transformer 实际 Block 里在 Multi-Head Attention 之后还会有残差连接 + LayerNorm + Feed-Forward + "
                "残差 + LayerNorm」「Step 1：加位置（PE）——给 X 注入顺序信息」")
def block_order(model: nn.Module | None = None):
    """``model``: a qkv Encoder with sinusoidal PE; it must equal the diagram written by hand."""
    if model is None:
        model = Encoder(ModelConfig(vocab_size=64, d_model=32, attention=dict(num_heads=4),
                                    position=dict(kind="sinusoidal"), normalization=dict(first=False, final=False),
                                    num_layers=2, max_len=16))
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        err = rel_err(model.eval()(ids).last_hidden_state, by_the_picture(model, ids))
    holds = err < FLOAT_TOL
    summary = say("block-order", blocks=len(model.blocks), d=model.config.d_model, err=err)
    return {"rel_error": err, "blocks": len(model.blocks)}, holds, summary
