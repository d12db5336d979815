"""The paper's encoder-decoder Transformer (Vaswani et al. 2017): the decoder attends causally to itself
and fully to the encoder's output.

Shapes: B batch, S source length, T target length, C model width, V vocabulary, G key/value heads,
D head width.
"""
from __future__ import annotations

from torch import Tensor, nn

from ..nn.kv_cache import KVCache
from .config import ModelConfig
from .decoders import decoder_for
from .encoder import Encoder
from .trunk import CausalTrunk, ModelOutput, check_token_ids, init_weights, key_mask, token_cross_entropy


class Transformer(CausalTrunk):
    """The paper's encoder-decoder: the decoder attends causally to itself and fully to the encoder.

    ``forward`` = ``decode(encode(src))``. Step-by-step decoding encodes once, projects the
    cross-attention keys and values once (``cross_kv``) and caches the decoder's own
    (``new_kv_caches``); beam search reorders both (``KVCache.reorder``, ``qkv.kv_cache.reorder_kv``).
    """

    generation_config = None  # a checkpoint's qkv.generation.GenerationConfig (from_hf sets it): generate's defaults

    def __init__(self, config: ModelConfig) -> None:
        decoder_layers = config.num_decoder_layers or config.num_layers
        if config.layer_types is not None and decoder_layers != config.num_layers:
            raise ValueError(f"layer_types names {config.num_layers} layers, but the decoder has {decoder_layers}: "
                             "give the encoder and the decoder the same depth, or no layer_types")
        super().__init__(config, decoder_layers, cross_attention=True)
        self.encoder = Encoder(config)  # initialised by its own depth, num_layers
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.head.bias)  # bias starts at 0
        init_weights(self, decoder_layers, skip="encoder.")
        if config.head.tie:  # one shared vocabulary, as in the paper (§3.4)
            self.embed.tok.weight = self.encoder.embed.tok.weight
            self.lm_head.weight = self.encoder.embed.tok.weight

    def encode(self, src_ids: Tensor, *, src_mask: Tensor | None = None) -> Tensor:
        """src_ids (B, S), src_mask bool (B, S) True on real tokens (right padding) -> memory (B, S, C)."""
        check_token_ids(src_ids, "src_ids")
        return self.encoder(src_ids, mask=src_mask).last_hidden_state

    def cross_kv(self, memory: Tensor, src_ids: Tensor | None = None) -> list[tuple[Tensor, Tensor]]:
        """memory (B, S, C) -> per decoder layer, its cross-attention keys and values, (B, G, S, D) each.

        ``src_ids`` (B, S): unused here; a model that copies source tokens (``qkv.pointer``) needs them.
        """
        return [block.cross_attn.project_kv(memory) for block in self.blocks]

    def decode(
        self, tgt_ids: Tensor, memory: Tensor | None, *, src_ids: Tensor | None = None,
        src_mask: Tensor | None = None, tgt_mask: Tensor | None = None, kv_caches: list[KVCache] | None = None,
        cross_kv: list[tuple[Tensor, Tensor]] | None = None, input_pos: Tensor | None = None,
        return_attention: bool = False,
    ) -> ModelOutput:
        """tgt_ids (B, T) over memory (B, S, C) -> logits (B, T, V) [, attentions, cross_attentions].

        ``cross_kv``: ``self.cross_kv(memory, src_ids)``, computed once per source (memory may then be
        None); ``src_ids`` as in ``cross_kv``. ``kv_caches``, ``input_pos`` and ``tgt_mask`` cache the decoder's self-attention
        as in ``GPT.forward``. Masks are bool, True on real tokens.
        """
        check_token_ids(tgt_ids, "tgt_ids")
        if cross_kv is None:
            if memory is None:
                raise ValueError("decode needs memory (B, S, C) from encode, or its cross_kv")
            cross_kv = self.cross_kv(memory, src_ids)
        elif len(cross_kv) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} cross_kv pairs (one per decoder layer), got {len(cross_kv)}")
        positions, self_mask = self.causal_inputs(tgt_ids, tgt_mask, kv_caches, input_pos)
        cross_mask = key_mask(src_mask, tgt_ids.size(0), cross_kv[0][0].size(2))
        out = self.run_trunk(tgt_ids, positions, mask=self_mask, is_causal=input_pos is None, cross_kv=cross_kv,
                             cross_mask=cross_mask, kv_caches=kv_caches, input_pos=input_pos,
                             return_attention=return_attention)
        out.logits = self.lm_head(out.last_hidden_state)  # (B, T, V)
        return out

    def generate(self, src_ids: Tensor, *, src_mask: Tensor | None = None, max_new_tokens: int | None = None,
                 num_beams: int | None = None, length_penalty: float | None = None,
                 early_stopping: bool | None = None, use_cache: bool = True, special=None) -> Tensor:
        """Target ids (B, 1 + n) for sources (B, S): greedy when ``num_beams`` is 1, beam search otherwise.

        ``special``: a ``qkv.generation.beam_search.Special`` (start, end, padding ids); see
        ``qkv.generation.beam_search.decode``. An argument left None comes from ``self.generation_config``
        (a checkpoint's, attached by ``qkv.interop.from_hf``: its tokens, num_beams, length penalty, max_length),
        else greedy, 64 new tokens, length penalty 1.0; without either, ``special`` must be given.

        The decoding itself is ``qkv.generation.methods.transformer_generate``, found through
        ``qkv.models.decoders`` (the reference layer imports no decoding).
        """
        return decoder_for("Transformer.generate")(
            self, src_ids, src_mask=src_mask, max_new_tokens=max_new_tokens, num_beams=num_beams,
            length_penalty=length_penalty, early_stopping=early_stopping, use_cache=use_cache, special=special)

    def forward(
        self, src_ids: Tensor, tgt_ids: Tensor, *, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
        targets: Tensor | None = None, label_smoothing: float = 0.0, return_attention: bool = False,
    ) -> ModelOutput:
        """src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V); masks bool, True on real tokens.

        Loss when targets (B, T) are given (-100 = ignore), with optional ``label_smoothing``.
        """
        memory = self.encode(src_ids, src_mask=src_mask)  # (B, S, C)
        out = self.decode(tgt_ids, memory, src_mask=src_mask, tgt_mask=tgt_mask, return_attention=return_attention)
        if targets is not None:
            out.loss = token_cross_entropy(out.logits, targets, label_smoothing=label_smoothing)
        return out
