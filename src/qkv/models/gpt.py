"""A decoder-only language model (Radford et al. 2019; nanoGPT's shape): causal self-attention, an LM head.

Shapes: B batch, T length, V vocabulary, N logits kept, M static-cache capacity.
"""
from __future__ import annotations

from torch import Tensor, nn

from ..nn.kv_cache import KVCache
from ..nn.layers import soft_cap
from ..nn.moe import router_losses
from .config import ModelConfig
from .decoders import decoder_for
from .trunk import (CausalTrunk, ModelOutput, check_token_ids, document_positions_and_mask, init_weights,
                    token_cross_entropy)


class GPT(CausalTrunk):
    """A decoder-only language model (Radford et al. 2019; nanoGPT's shape), causal self-attention."""

    generation_config = None  # a checkpoint's qkv.generation.GenerationConfig (from_hf sets it): generate's defaults

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, config.num_layers)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.head.bias)
        init_weights(self, config.num_layers)
        if config.head.tie:
            self.lm_head.weight = self.embed.tok.weight

    def forward(
        self,
        ids: Tensor,
        *,
        targets: Tensor | None = None,
        mask: Tensor | None = None,
        return_attention: bool = False,
        kv_caches: list[KVCache] | None = None,
        input_pos: Tensor | None = None,
        logits_to_keep: int = 0,
        document_ids: Tensor | None = None,
        return_router_logits: bool = False,
    ) -> ModelOutput:
        """ids (B, T) -> logits (B, T, V); loss when targets (B, T) are given (-100 = ignore).

        ``mask``: bool (B, S) True on real tokens, S = cached + new tokens (left padding for
        batched generation). ``kv_caches``: from ``new_kv_caches``, for incremental decoding.
        ``input_pos`` (T,): static-cache decoding (what ``generate`` and its compiled step use):
        the tokens go to those cache slots and ``mask`` (B, M) marks the slots holding real tokens;
        (B, T): each row's own slots (``qkv.serve``'s batch, whose rows are of different lengths).
        ``logits_to_keep``: logits of the last N positions only (B, N, V), as Hugging Face's; 0: all.
        ``document_ids`` (B, T): packed rows — each token attends within its document only, and positions restart
        at each document (as each would alone); not with a mask or caches.
        ``return_router_logits``: each mixture-of-experts layer's router logits (B·T, E) in ``router_logits`` (a
        training forward with targets and a router loss coefficient computes them for its loss anyway).
        """
        check_token_ids(ids)
        if not isinstance(logits_to_keep, int) or logits_to_keep < 0 or (logits_to_keep and targets is not None):
            raise ValueError(f"logits_to_keep must be an int >= 0, and 0 with targets (the loss needs every "
                             f"position's logits), got {logits_to_keep!r}")
        if document_ids is not None:
            if mask is not None or kv_caches is not None or input_pos is not None:
                raise ValueError("document_ids (packed rows) take no mask, kv_caches or input_pos")
            if document_ids.shape != ids.shape:
                raise ValueError(f"document_ids must have the shape of ids {tuple(ids.shape)}, "
                                 f"got {tuple(document_ids.shape)}")
            positions, attn_mask = document_positions_and_mask(document_ids)
        else:
            positions, attn_mask = self.causal_inputs(ids, mask, kv_caches, input_pos)
        router_loss = (targets is not None and self.training
                       and bool(self.config.moe.aux_loss_coef or self.config.moe.z_loss_coef))
        out = self.run_trunk(ids, positions, mask=attn_mask, is_causal=input_pos is None, kv_caches=kv_caches,
                             input_pos=input_pos, return_attention=return_attention,
                             return_router_logits=return_router_logits or router_loss)
        out.logits = self.lm_head(out.last_hidden_state[:, -logits_to_keep:])  # (B, T or N, V)
        if self.config.head.softcap is not None:  # Gemma 2's final_logit_softcapping, before the loss as HF's
            out.logits = soft_cap(out.logits, self.config.head.softcap)
        out.loss = None if targets is None else token_cross_entropy(out.logits, targets)
        if router_loss:
            out.loss = out.loss + self.router_loss(out.router_logits, targets != -100)
        return out

    def router_loss(self, router_logits: tuple[Tensor, ...], mask: Tensor) -> Tensor | float:
        """moe.aux_loss_coef × the load-balancing loss + moe.z_loss_coef × the router z-loss of a forward's MoE
        layers' ``router_logits`` (``qkv.nn.moe.router_losses``), over the tokens ``mask`` (B, T) counts."""
        losses = router_losses(router_logits, self.config.moe.top_k, mask)
        if losses is None:
            return 0.0
        m = self.config.moe
        return m.aux_loss_coef * losses[0] + m.z_loss_coef * losses[1]

    def generate(self, ids: Tensor, max_new_tokens: int | None = None, **kwargs) -> Tensor:
        """Autoregressive sampling; see ``qkv.generation.generate`` for the keyword arguments.

        With ``self.generation_config`` (a checkpoint's, attached by ``qkv.interop.from_hf``) every argument
        not given comes from it, as Hugging Face's ``generate`` would use it: its eos and pad ids, greedy
        unless it samples, its max_new_tokens or max_length (``qkv.generation.config_defaults``).

        The decoding itself is ``qkv.generation.methods.gpt_generate``, found through ``qkv.models.decoders``
        (the reference layer imports no decoding).
        """
        return decoder_for("GPT.generate")(self, ids, max_new_tokens, **kwargs)
