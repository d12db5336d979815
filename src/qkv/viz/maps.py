"""Attention maps: every layer's per-head weights, taken from a model in one place for the
figures, the explorer and the claims (no matplotlib here).

    ids → model(ids, return_attention=True).attentions → N × (B, H, T, T) → (N, B, H, T, T)

Each block's attention module returns its own softmax weights (``return_weights``): multi-head attention's
over its (grouped) heads, multi-head latent attention's over [q_C; q_R]·[k_C; k_R] (its naive path), with
the sliding window's band where a layer has one.

The encoder-decoder (``qkv.Transformer``) has three kinds, from one encoder and one decoder pass:

    source ids + EOS ──encoder──▶ encoder self-attention  (N, H, S, S)
    START + target ids ─decoder─▶ decoder self-attention  (M, H, T, T), causal
                                  cross-attention         (M, H, T, S): target rows, source columns

Shapes: N layers (M: decoder layers), B batch, H heads, T tokens (target), S source tokens.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..models import Transformer
from ..data.tokens import encode_text, vocabulary_string
from .labels import readable_labels


def model_device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """The model in eval mode (no dropout: the maps would be random), its own mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def attention_weights(model: nn.Module, ids: Tensor) -> Tensor:
    """ids (B, T) -> (N, B, H, T, T) float32 on the CPU, the model run in eval mode (no dropout).

    TypeError for a model that is not an nn.Module or does not take ``return_attention=True``;
    ValueError when it returns no maps or maps of another shape.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module (qkv.GPT or qkv.Encoder), got {type(model).__name__}")
    if isinstance(model, Transformer):
        raise TypeError("a qkv.Transformer cannot be explored from one id sequence: it reads a source and a "
                        "target (qkv.viz.maps.translation_attention; the explorer's target_ids=; the figure "
                        "qkv.viz.seq2seq.plot_translation_attention)")
    if ids.dim() != 2:
        raise ValueError(f"expected ids (B, T), got shape {tuple(ids.shape)}")
    try:
        with eval_mode(model):
            out = model(ids.to(model_device(model)), return_attention=True)
    except TypeError as e:
        raise TypeError(f"{type(model).__name__} cannot be explored: it must take one id sequence and "
                        f"return_attention=True (qkv.GPT, qkv.Encoder); {e}") from None
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


# --- the encoder-decoder ---------------------------------------------------------------------

def _one_row(ids: Tensor | Sequence[int], name: str, max_len: int) -> Tensor:
    """ids (L,) or (1, L) -> (1, L) long; ValueError unless 1 ≤ L ≤ max_len."""
    row = torch.as_tensor(ids, dtype=torch.long)
    if row.dim() == 2 and row.size(0) == 1:
        row = row[0]
    if row.dim() != 1 or not 1 <= row.numel() <= max_len:
        raise ValueError(f"expected {name} as one sequence of 1 … {max_len} ids, got shape {tuple(row.shape)}")
    return row[None]  # (1, L)


@torch.no_grad()
def seq2seq_maps(model: Transformer, src_ids: Tensor | Sequence[int],
                 tgt_ids: Tensor | Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    """src_ids (S,), tgt_ids (T,) -> encoder (N, H, S, S), decoder (M, H, T, T), cross (M, H, T, S).

    One encoder pass and one decoder pass in eval mode, float32 on the CPU. ``tgt_ids`` is what the
    decoder reads (START + target tokens): row t is the query that predicts target token t + 1.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"expected a qkv.Transformer (encoder-decoder), got {type(model).__name__}")
    device, limit = model_device(model), model.config.max_len
    src = _one_row(src_ids, "src_ids", limit).to(device)  # (1, S)
    tgt = _one_row(tgt_ids, "tgt_ids", limit).to(device)  # (1, T)
    with eval_mode(model):
        enc = model.encoder(src, return_attention=True)  # .attentions: N × (1, H, S, S)
        dec = model.decode(tgt, enc.last_hidden_state, src_ids=src, return_attention=True)
    stack = lambda maps: torch.stack(maps)[:, 0].float().cpu()  # noqa: E731  N × (1, H, ·, ·) -> (N, H, ·, ·)
    return stack(enc.attentions), stack(dec.attentions), stack(dec.cross_attentions)


@dataclass(frozen=True)
class TranslationAttention:
    """A source text, its translation and the encoder-decoder's three kinds of attention over them.

    ``source``: S labels (the last one EOS); ``target``: T labels (the first one START).
    """

    text: str
    translation: str
    source_ids: list[int]
    source: list[str]
    target_ids: list[int]
    target: list[str]
    encoder: Tensor  # (N, H, S, S)
    decoder: Tensor  # (M, H, T, T), causal
    cross: Tensor  # (M, H, T, S): target queries over source keys

    def views(self) -> dict[str, tuple[Tensor, list[str], list[str]]]:
        """name -> (maps, query labels, key labels), in the order data flows: encoder, decoder, cross."""
        return {"encoder": (self.encoder, self.source, self.source),
                "decoder": (self.decoder, self.target, self.target),
                "cross": (self.cross, self.target, self.source)}


def pair_attention(model: Transformer, source_ids: Sequence[int], source: Sequence[str], target_ids: Sequence[int],
                   target: Sequence[str], *, text: str = "", translation: str = "") -> TranslationAttention:
    """The three kinds of maps for ids already chosen (``source``, ``target``: one label per id)."""
    for name, ids, labels in (("source", source_ids, source), ("target", target_ids, target)):
        if isinstance(labels, str) or len(labels) != len(ids) or not all(isinstance(s, str) for s in labels):
            raise ValueError(f"expected {name} labels: {len(ids)} strings (one per id), got {labels!r:.80}")
    enc, dec, cross = seq2seq_maps(model, source_ids, target_ids)
    return TranslationAttention(text, translation, [int(i) for i in source_ids], list(source),
                                [int(i) for i in target_ids], list(target), enc, dec, cross)


def translation_attention(model: Transformer, tokenizer: Any, text: str, *, target: str | None = None,
                          num_beams: int = 4, length_penalty: float = 0.6) -> TranslationAttention:
    """Translate ``text`` (beam search; ``num_beams=1``: greedy) — or take ``target`` — and gather the maps
    over (source ids + EOS) and (START + target ids). The model's own ids are kept, never re-tokenised."""
    from ..training.tasks.translation import special_tokens

    if not isinstance(model, Transformer):
        raise TypeError(f"expected a qkv.Transformer (encoder-decoder), got {type(model).__name__}")
    special, limit = special_tokens(tokenizer), model.config.max_len
    src = encode_text(tokenizer, text, max_len=limit - 1)[0] + [special.eos]  # room for EOS
    if target is None:
        tgt = _translate(model, src, special, num_beams=num_beams, length_penalty=length_penalty)
        translation = tokenizer.decode(tgt)
    elif not isinstance(target, str):
        raise TypeError(f"target must be a str (the translation to look at), got {type(target).__name__}")
    else:
        tgt, translation = [int(i) for i in tokenizer.encode(target)], target
        if len(tgt) + 1 > limit:
            raise ValueError(f"the target is {len(tgt)} tokens + START but the model's max_len is {limit}; shorten it")
    tgt = [special.start] + tgt
    return pair_attention(model, src, seq2seq_labels(tokenizer, src), tgt, seq2seq_labels(tokenizer, tgt),
                          text=text, translation=translation)


def _translate(model: Transformer, src: list[int], special: Any, *, num_beams: int,
               length_penalty: float) -> list[int]:
    """The model's target ids for one source (without START and EOS); the length bound of translate_texts."""
    limit = model.config.max_len
    with eval_mode(model):
        row = model.generate(torch.tensor([src], device=model_device(model)), special=special, num_beams=num_beams,
                             length_penalty=length_penalty, max_new_tokens=min(limit - 1, 2 * len(src) + 10))
    row = row[0, 1:].tolist()  # (1, 1 + n) -> n ids after START
    return row[:row.index(special.eos)] if special.eos in row else row


def seq2seq_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """``labels.readable_labels``, with special tokens (which decode to '') named as the vocabulary spells them."""
    shown = readable_labels(tokenizer, ids)
    return [s or vocabulary_string(tokenizer, i) or f"<{i}>" for i, s in zip(ids, shown)]
