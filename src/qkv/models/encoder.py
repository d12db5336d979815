"""A bidirectional encoder (BERT's shape, and the encoder half of the encoder-decoder).

Shapes: B batch, T length, C model width.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .config import ModelConfig
from .trunk import ModelOutput, Trunk, check_token_ids, init_weights, key_mask


class Encoder(Trunk):
    """A bidirectional encoder (BERT's shape): every token attends to every real token."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, config.num_layers)
        init_weights(self, config.num_layers)

    def forward(
        self, ids: Tensor, *, mask: Tensor | None = None, token_type_ids: Tensor | None = None,
        return_attention: bool = False,
    ) -> ModelOutput:
        """ids (B, T), mask bool (B, T) True on real tokens -> last_hidden_state (B, T, C)."""
        check_token_ids(ids)
        B, T = ids.shape
        return self.run_trunk(ids, torch.arange(T, device=ids.device), mask=key_mask(mask, B, T),
                              token_type_ids=token_type_ids, return_attention=return_attention)
