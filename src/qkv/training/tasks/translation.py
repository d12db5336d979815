"""Translation with the paper's encoder-decoder: English → another language, from sentence pairs.

    model = qkv.pointer.PointerTransformer: the Transformer that may also copy a source token (the
            default, ``copy``; UI strings keep placeholders, options and paths verbatim), or qkv.Transformer
    loss = label-smoothed cross-entropy of the next target token (ε = 0.1, the paper's §5.4)
    decoding = beam search (K = 4, α = 0.6, §6.1) over a shared source/target vocabulary (§3.4)
    scores = BLEU and chrF (sacrebleu) of the held-out pairs, beside copying the source and a
             translation memory (the nearest training source's translation)

A batch is ``batch_size`` pairs of similar length: pairs are sorted by length once and a batch is
a random run of neighbours, so padding wastes little.

Shapes: B pairs, S source length, T target length, V vocabulary.
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from torch import Tensor, nn

from ...generation.beam_search import Special, decode
from ...data.catalogs import load_pairs
from ...data import SPECIAL_TOKENS, BPETokenizer
from ...models import ModelConfig, Transformer
from ...models.pointer import PointerTransformer
from ...checks import check_fraction, check_positive_int
from .base import SCRATCH, Task, TaskDefaults, TaskOptions, option

EVAL_PAIRS = 256  # held-out pairs scored by the periodic validation loss
DECODE_COST = 6  # a pair beam-searched and greedily decoded costs about this many loss-evaluated pairs


def special_tokens(tokenizer) -> Special:
    """Start, end and padding of a sequence-to-sequence tokenizer; ValueError if it lacks them.

    A checkpoint's tokenizer that carries its own (``qkv.interop.hf.load_pretrained``'s, for
    Marian) gives those; qkv's BPE gives BOS, EOS and PAD, BOS and PAD never generated.
    """
    if getattr(tokenizer, "special", None) is not None:
        return tokenizer.special
    ids = [getattr(tokenizer, name, None) for name in ("bos_id", "eos_id", "pad_id")]
    if any(i is None for i in ids):
        raise ValueError(f"a translation tokenizer needs the special tokens {SPECIAL_TOKENS}; this one has none")
    bos, eos, pad = ids
    return Special(start=bos, eos=eos, pad=pad, suppress=(pad, bos))


def pad_batch(rows: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    """Right-pad token lists -> ids (B, L) and mask (B, L), True on real tokens."""
    L = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (L - len(r)) for r in rows], dtype=torch.long)
    return ids, ids.new_tensor([[True] * len(r) + [False] * (L - len(r)) for r in rows], dtype=torch.bool)


def translate_texts(model: nn.Module, tokenizer, texts: list[str], *, num_beams: int = 4, length_penalty: float = 0.6,
                    max_new_tokens: int | None = None, batch_size: int = 32, special: Special | None = None) -> list[str]:
    """Translate each text with a ``qkv.Transformer`` (batched, sorted by length).

    ``tokenizer.encode(text)`` gives the text's ids without EOS (appended here) and
    ``tokenizer.decode`` reads the ids between start and EOS. ``special``: the decoding tokens,
    by default ``special_tokens(tokenizer)``. Hugging Face's Marian decodes with
    ``length_penalty=1.0`` and its generation_config's ``num_beams``.
    """
    if not isinstance(model, Transformer):
        raise ValueError(f"translation needs an encoder-decoder qkv.Transformer, got {type(model).__name__}")
    special, limit = special or special_tokens(tokenizer), model.config.max_len
    device = next(model.parameters()).device
    encoded = [tokenizer.encode(t)[: limit - 1] + [special.eos] for t in texts]
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    out = [""] * len(texts)
    for lo in range(0, len(order), batch_size):
        chunk = order[lo:lo + batch_size]
        src, mask = pad_batch([encoded[i] for i in chunk], special.pad)
        n = max_new_tokens or min(limit - 1, 2 * src.size(1) + 10)
        ids = decode(model, src.to(device), src_mask=mask.to(device), max_new_tokens=n, special=special,
                     num_beams=num_beams, length_penalty=length_penalty)
        for i, row in zip(chunk, ids.tolist()):
            out[i] = tokenizer.decode(row[1:row.index(special.eos)] if special.eos in row else row[1:])
    return out


def translate_lines(model: nn.Module, tokenizer, lines: Iterable[str], *, batch_size: int = 32,
                    **kwargs) -> Iterator[str]:
    """``translate_texts`` over lines read as they come (a pipe, a terminal): each run of ``batch_size``
    consecutive lines (fewer at the end) is translated as soon as it has been read, its translations
    yielded in the lines' order. ``kwargs`` as ``translate_texts``'."""
    check_positive_int("batch_size", batch_size)
    pending = iter(lines)
    while group := list(itertools.islice(pending, batch_size)):
        yield from translate_texts(model, tokenizer, group, batch_size=batch_size, **kwargs)


def shared_vocabulary(pairs: list[tuple[str, str]], vocab_size: int, *, max_chars: int = 2_000_000) -> BPETokenizer:
    """One byte-level BPE for both languages (the paper's shared vocabulary, §3.4), with SPECIAL_TOKENS.

    Sources first, then targets: the trainer keeps every k-th piece of a long list, and on
    interleaved (source, target) pieces k = 2 once kept English only.
    """
    texts = [s for s, _ in pairs] + [t for _, t in pairs]
    return BPETokenizer.train(texts, vocab_size, max_chars=max_chars, special_tokens=SPECIAL_TOKENS)


def encode_pairs(tokenizer, special: Special, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """(source ids + EOS, BOS + target ids + EOS) for each pair."""
    enc = tokenizer.tokenizer.encode_batch([s for pair in pairs for s in pair])
    e, b = special.eos, special.start
    return [(enc[2 * i].ids + [e], [b] + enc[2 * i + 1].ids + [e]) for i in range(len(pairs))]


def pairs_batch(pairs: list[tuple[list[int], list[int]]], pad: int, device) -> tuple[Tensor, ...]:
    """src (B, S), src_mask (B, S), tgt_in (B, T), targets (B, T) with -100 on padding."""
    src, src_mask = pad_batch([s for s, _ in pairs], pad)
    tgt, tgt_mask = pad_batch([t for _, t in pairs], pad)
    targets = tgt[:, 1:].masked_fill(~tgt_mask[:, 1:], -100)
    return tuple(x.to(device, non_blocking=True) for x in (src, src_mask, tgt[:, :-1], targets))


@dataclass(frozen=True)
class TranslationOptions(TaskOptions):
    """What translation alone is trained and scored with (``data`` is then a pairs file or a directory of
    .po/.mo catalogs)."""

    target_lang: str = option("zh_CN", "the catalogs' target language (default zh_CN; any locale under "
                                       "/usr/share/locale)")
    label_smoothing: float = option(0.1, "label smoothing ε (default 0.1, the paper's, §5.4)")
    copy: bool = option(True, "the pointer-generator's copy mechanism (qkv.models.pointer; default: on; off: the "
                              "paper's plain Transformer)")
    num_beams: int = option(4, "beam width of the final BLEU/chrF (default 4, the paper's, §6.1)")
    length_penalty: float = option(0.6, "the final beam search's length penalty α (default 0.6, the paper's)")

    FREE_ON_RESUME = ("num_beams", "length_penalty")  # they only decode the final scores
    SAVED_BEFORE = {"copy": False}  # runs saved before the copy mechanism had none

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.target_lang:
            raise ValueError(f"target_lang must name a locale such as 'zh_CN', got {self.target_lang!r}")
        check_fraction("label_smoothing", self.label_smoothing)
        check_positive_int("num_beams", self.num_beams)


class TranslationTask(Task):
    """Sentence pairs (default: the system's gettext catalogs, English → Simplified Chinese) with a Transformer."""

    name = "translate"
    model_class = Transformer
    options_type = TranslationOptions
    # Copying on by default (TranslationOptions.copy); the batch, lr, optimizer, schedule and budget that serve it
    # best on CPU (docs/design-notes.md has the runs behind them). Always a shared byte-level BPE (§3.4).
    defaults = TaskDefaults(preset="translate", batch_size=32, lr=2e-3, warmup_steps=40, tokenizer=("bpe", 8000),
                            minutes=10.0, data="the system's gettext catalogs (English -> the target language)",
                            preset_recipes={"translate": SCRATCH, "paper-base": SCRATCH}, lr_width=0.256)

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.tokenizer not in (None, "bpe"):
            raise ValueError(f"translation uses a shared byte-level BPE vocabulary; --tokenizer {cfg.tokenizer} "
                             "is for language modelling")
        if cfg.sharding == "fsdp":  # the decoder projects the encoder's K/V outside its blocks' sharded forwards
            raise ValueError("--task translate trains with --sharding ddp or none, not fsdp (the encoder-decoder's "
                             "cross-attention keys and values are projected outside the sharded blocks)")

    # --- data ------------------------------------------------------------------------------------
    def prepare(self, cfg, run, dist) -> None:
        if self.corpus is None:
            self.corpus = load_pairs(cfg.data, target_lang=cfg.task_options.target_lang)  # a pairs file or catalogs
        self.tokenizer = self.ready_tokenizer(cfg, run, dist, lambda: shared_vocabulary(self.corpus.train,
                                                                                       cfg.vocab_size))
        self.special = special_tokens(self.tokenizer)
        self.model_class = PointerTransformer if cfg.task_options.copy else Transformer
        self.train_pairs = encode_pairs(self.tokenizer, self.special, self.corpus.train)
        self.val_pairs = encode_pairs(self.tokenizer, self.special, self.corpus.val)

    def check(self, cfg, mconf: ModelConfig, dist) -> None:
        fits = lambda p: len(p[0]) <= mconf.max_len and len(p[1]) <= mconf.max_len + 1  # noqa: E731
        dropped = sum(not fits(p) for p in self.train_pairs)
        self.train_pairs = sorted((p for p in self.train_pairs if fits(p)), key=lambda p: (len(p[0]) + len(p[1]), p))
        self.val_fit = [i for i, p in enumerate(self.val_pairs) if fits(p)]
        if len(self.train_pairs) < cfg.batch_size:
            raise ValueError(f"{len(self.train_pairs)} training pairs fit max_len {mconf.max_len}; "
                             f"need at least batch_size={cfg.batch_size}")
        if dropped and dist.is_main and cfg.progress:
            print(f"qkv: {dropped} training pairs longer than max_len {mconf.max_len} tokens left out", file=sys.stderr)
        mean = sum(len(s) + len(t) - 1 for s, t in self.train_pairs) / len(self.train_pairs)
        self.tokens_per_step = round(cfg.batch_size * mean)
        self.eval_sample = self.val_fit[:: max(1, len(self.val_fit) // EVAL_PAIRS)][:EVAL_PAIRS]
        self.eval_all = self.val_fit
        self.unit_counts = {split: torch.tensor([len(t) - 1 for _, t in pairs], dtype=torch.long)  # target tokens
                            for split, pairs in (("train", self.train_pairs), ("val", self.val_pairs))}
        self.final_units = DECODE_COST * len(self.val_pairs) if cfg.final_eval else 0
        self.device, self.options = dist.device, cfg.task_options

    # --- training and held-out batches --------------------------------------------------------------
    eval_batch_size = 64

    def draw(self, generator: torch.Generator, step: int, size: int) -> Tensor:
        """A random run of ``size`` neighbours in length (little padding), shuffled."""
        start = int(torch.randint(len(self.train_pairs) - size + 1, (1,), generator=generator))
        return torch.arange(start, start + size)[torch.randperm(size, generator=generator)]

    def batch(self, items, split: str = "train"):
        """src, src_mask, tgt_in, targets (``pairs_batch``) and the target tokens, counted on the host."""
        pairs = self.train_pairs if split == "train" else self.val_pairs
        chosen = [pairs[i] for i in torch.as_tensor(items).tolist()]
        return pairs_batch(chosen, self.special.pad, self.device) + (sum(len(t) - 1 for _, t in chosen),)

    def loss(self, model: nn.Module, micro) -> Tensor:
        """The micro-batch's label-smoothed cross-entropy summed over its target tokens."""
        src, src_mask, tgt_in, targets, tokens = micro
        out = model(src, tgt_in, src_mask=src_mask, targets=targets, label_smoothing=self.options.label_smoothing)
        return out.loss * tokens

    def eval_loss(self, model: nn.Module, micro) -> Tensor:
        """The held-out cross-entropy without smoothing (nats per target token, once divided)."""
        src, src_mask, tgt_in, targets, _ = micro
        logits = model(src, tgt_in, src_mask=src_mask).logits  # (B, T, V)
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100,
                                           reduction="sum")

    def decoded_metrics(self, model, *, autocast, dist) -> dict:
        """BLEU and chrF of beam and greedy translations of the held-out sources, beside the baselines'."""
        from ..metrics import baselines, bleu, chrf

        sources = [s for s, _ in self.corpus.val]
        refs = [t for _, t in self.corpus.val]
        lang = self.corpus.target_lang
        with autocast():
            beam = translate_texts(model, self.tokenizer, sources, num_beams=self.options.num_beams,
                                   length_penalty=self.options.length_penalty)
            greedy = translate_texts(model, self.tokenizer, sources, num_beams=1)
        examples = [{"source": s, "reference": r, "translation": h} for s, r, h in list(zip(sources, refs, beam))[:8]]
        return {"bleu": bleu(beam, refs, target_lang=lang), "chrf": chrf(beam, refs),
                "greedy_bleu": bleu(greedy, refs, target_lang=lang), "greedy_chrf": chrf(greedy, refs)} | \
            baselines(self.corpus) | {"examples": examples}

    # --- reporting ---------------------------------------------------------------------------------
    def describe(self) -> str:
        c = self.corpus
        return (f"{self.tokenizer.vocab_size}-token shared BPE) on {c.source}: {len(self.train_pairs)} training "
                f"pairs, {len(c.val)} held out, from {c.catalogs} catalogs")

    def summary(self) -> dict:
        c = self.corpus
        return {"corpus": c.source, "target_lang": c.target_lang, "catalogs": c.catalogs,
                "skipped_catalogs": c.skipped_catalogs, "train_pairs": len(c.train), "val_pairs": len(c.val),
                "tokenizer": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size,
                "num_beams": self.options.num_beams, "length_penalty": self.options.length_penalty,
                "architecture": self.model_class.__name__}

    def info(self, s: dict) -> dict[str, str]:
        return {"scores": f"BLEU {s['bleu']:.1f}, chrF {s['chrf']:.1f} (beam {s['num_beams']}); greedy chrF "
                          f"{s['greedy_chrf']:.1f}; copy {s['copy_bleu']:.1f} / {s['copy_chrf']:.1f}; translation "
                          f"memory {s['memory_bleu']:.1f} / {s['memory_chrf']:.1f}"}

    def result_lines(self, s: dict) -> list[str]:
        """The scores beside the two baselines, then three held-out examples."""
        examples = [f"  {e['source'].strip()!r} -> {e['translation'].strip()!r}  (reference {e['reference'].strip()!r})"
                    for e in s.get("examples", [])[:3]]
        return [f"held-out translation ({s['val_pairs']} pairs, {s['target_lang']}): "
                f"BLEU {s['bleu']:.1f}  chrF {s['chrf']:.1f}  (beam {s['num_beams']}, greedy chrF "
                f"{s['greedy_chrf']:.1f})",
                f"  baselines: copy the source BLEU {s['copy_bleu']:.1f} chrF {s['copy_chrf']:.1f} | translation "
                f"memory BLEU {s['memory_bleu']:.1f} chrF {s['memory_chrf']:.1f}", *examples]
