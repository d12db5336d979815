"""Decoder-only language modelling: predict each next token of a text.

    loss = mean cross-entropy of next-token prediction (nats per token)
    bits per character (bpc) = total nats / ln 2 / number of characters predicted

A batch is ``batch_size`` windows of T + 1 tokens drawn uniformly from the training text;
validation scores non-overlapping windows of the held-out text, beside gzip -9 and xz -9e.

Shapes: B windows (a micro-batch), T context length, N tokens in a split, V vocabulary.
"""
from __future__ import annotations

import gzip
import lzma
import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data import Corpus, encode_corpus, fit_tokenizer, load_corpus
from ...models import GPT, ModelConfig
from ..distributed import Dist
from ..evaluator import held_out_sums
from .base import SCRATCH, DecoderTask, TaskDefaults, TaskHeldOut

LN2 = math.log(2)
# The demo trains byte-level BPE, its vocabulary sized for its budget (docs/design-notes.md has the runs), and so
# does the GPU's default; a run of the translate preset, its shared vocabulary; every other preset and a model of
# its own shape: characters.
PRESET_TOKENIZERS = {"demo": ("bpe", 2048), "gpu": ("bpe", 4096), "translate": ("bpe", 8000)}
# Every preset from scratch but the unit tests' (SCRATCH: Muon + warmup-stable-decay, bf16 where native; the
# GPU's default compiled too). docs/training.md has the lever runs and the rule.
PRESET_RECIPES = {"demo": SCRATCH, "gpt2": SCRATCH, "paper-base": SCRATCH, "translate": SCRATCH,
                  "gpu": SCRATCH | {"compile": True}}
PRESET_BATCHES = {"gpu": 128}  # sequences per step where a preset fills a GPU

def compressor_bpc(text: str) -> dict[str, float]:
    """Bits per character of gzip -9 and xz -9e on ``text``: the floor a language model should beat."""
    raw = text.encode("utf-8")
    n = max(1, len(text))
    return {"gzip_bpc": 8 * len(gzip.compress(raw, compresslevel=9, mtime=0)) / n,
            "xz_bpc": 8 * len(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)) / n}


def eval_starts(n_tokens: int, T: int, count: int | None) -> list[int]:
    """Starts of non-overlapping windows over a split: every window (count None, the last one may be
    shorter) or ``count`` full windows spread evenly over it."""
    if count is None:
        return list(range(0, n_tokens - 1, T))
    full = (n_tokens - 1) // T
    if full == 0:
        return [0]
    idx = torch.linspace(0, full - 1, min(count, full)).round().long().unique()
    return (idx * T).tolist()


def _window_groups(ids: Tensor, T: int, chunk: list[int]) -> list[Tensor]:
    """Full windows stacked (B, T + 1); the last, shorter window alone (1, t + 1)."""
    full = [s for s in chunk if s + T < len(ids)]
    groups = [torch.stack([ids[s:s + T + 1] for s in full])] if full else []
    return groups + [ids[s:][None] for s in chunk if s + T >= len(ids)]


class HeldOutWindows(TaskHeldOut):
    """Non-overlapping windows of a held-out text (N,) as the evaluator scores them: items are window starts,
    a window's loss its summed next-token cross-entropy (nats), its units its predicted tokens."""

    def __init__(self, ids: Tensor, T: int, device, batch_size: int = 32) -> None:
        self.ids, self.T, self.device, self.eval_batch_size = ids, T, torch.device(device), batch_size

    def units(self, items, split: str = "val") -> Tensor:
        return (len(self.ids) - 1 - torch.as_tensor(items, dtype=torch.long)).clamp(max=self.T)

    def batch(self, items, split: str = "val") -> list[Tensor]:
        return [rows.to(self.device) for rows in _window_groups(self.ids, self.T, list(items))]

    def eval_loss(self, model: nn.Module, groups: list[Tensor]) -> Tensor:
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for rows in groups:
            logits = model(rows[:, :-1]).logits  # (B, T, V)
            total += F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten(), reduction="sum").double()
        return total


def evaluate(model, ids: Tensor, T: int, starts: list[int], *, batch_size: int = 32, device="cpu",
             autocast=nullcontext, rank: int = 0, world: int = 1) -> tuple[float, int]:
    """Summed next-token cross-entropy (nats) and token count over the windows at ``starts``."""
    dist = Dist(rank, world)
    dist.device = torch.device(device)
    nats, n = held_out_sums(HeldOutWindows(ids, T, device, batch_size), model, starts, autocast=autocast, dist=dist)
    return nats, int(n)


def predicted_chars(tokenizer, text: str, ids: Tensor) -> int:
    """Characters of ``text`` that its next-token predictions cover: all but the first token's."""
    return len(text) - len(tokenizer.decode(ids[:1].tolist()))


def held_out_bpc(model, tokenizer, text: str, T: int, **kwargs) -> float:
    """Bits per character of ``model`` on the whole of ``text`` in non-overlapping windows of T tokens:
    a run's final ``val_bpc`` when ``text`` is its held-out split (``kwargs`` as ``evaluate``)."""
    ids = encode_corpus(tokenizer, text)  # (N,)
    nats, _ = evaluate(model, ids, T, eval_starts(len(ids), T, None), **kwargs)
    return nats / LN2 / predicted_chars(tokenizer, text, ids)


def sample_prompt(text: str, most: int = 12) -> str:
    """Where a sample of a model trained on ``text``'s language starts: the first line of ``text`` that is not
    blank, at most ``most`` characters of it, cut after its last space if it has one (the model then starts
    a word). Whatever the language: a Chinese text gives Chinese characters, Python gives Python."""
    line = next((ln for ln in text.splitlines() if ln.strip()), text)[:most]
    cut = line.rfind(" ")
    return line[:cut + 1] if cut > 0 and line[:cut].strip() else line


class LanguageModelTask(DecoderTask):
    """Next-token prediction on a text corpus with a GPT."""

    name = "lm"
    model_class = GPT
    defaults = TaskDefaults(preset="demo", batch_size=16, lr=6e-3, warmup_steps=50, lr_width=0.576, gpu_preset="gpu",
                            preset_tokenizers=PRESET_TOKENIZERS, minutes=3.0, preset_recipes=PRESET_RECIPES,
                            preset_batches=PRESET_BATCHES,
                            data="the Python standard library's source (the default corpus)")


    def prepare(self, cfg, run, dist) -> None:
        self.corpus = self.corpus if self.corpus is not None else load_corpus(cfg.data)
        text = self.corpus.train + self.corpus.val if cfg.tokenizer == "char" else self.corpus.train
        self.read_base(cfg)
        fit = (lambda: self.base.tokenizer) if self.base else \
            (lambda: fit_tokenizer(cfg.tokenizer, text, vocab_size=cfg.vocab_size))
        self.tokenizer = self.ready_tokenizer(cfg, run, dist, fit)
        self.train_ids = encode_corpus(self.tokenizer, self.corpus.train)  # (N,)
        self.val_ids = encode_corpus(self.tokenizer, self.corpus.val)  # (N_val,)
        self.compressors = compressor_bpc(self.corpus.val)
        self.val_chars = predicted_chars(self.tokenizer, self.corpus.val, self.val_ids)
        self.chars_per_token = self.val_chars / max(1, len(self.val_ids) - 1)

    def check(self, cfg, mconf: ModelConfig, dist) -> None:
        T = self.T = self.context(cfg, mconf)
        if len(self.train_ids) < T + 1:
            raise ValueError(f"training text is {len(self.train_ids)} tokens, shorter than one window of "
                             f"context {T} + 1")
        if len(self.val_ids) < 2:
            raise ValueError(f"validation text is {len(self.val_ids)} tokens; need at least 2")
        self.windows = self.train_ids.unfold(0, T + 1, 1)  # (N - T, T + 1), a view
        self.eval_sample = eval_starts(len(self.val_ids), T, cfg.eval_windows)
        self.eval_all = eval_starts(len(self.val_ids), T, None)
        self.final_units = len(self.eval_all) if cfg.final_eval else 0
        self.tokens_per_step = cfg.batch_size * T
        self.device = dist.device
        self.val_windows = HeldOutWindows(self.val_ids, T, dist.device)

    # --- training and held-out batches ---------------------------------------------------------------
    # The model's own loss is a mean (with a mixture of experts' router terms added in training); every
    # micro-batch holds as many windows, so the mean of their means is the step's.
    reduction = "mean"

    def draw(self, generator: torch.Generator, step: int, size: int) -> Tensor:
        return torch.randint(len(self.windows), (size,), generator=generator)  # window starts

    def units(self, items, split: str = "train") -> Tensor:
        """Tokens predicted per window: T, or fewer in the held-out split's last window."""
        return torch.full((len(items),), self.T) if split == "train" else self.val_windows.units(items)

    def batch(self, items, split: str = "train"):
        """Training: windows (B, T + 1). Held out: ``HeldOutWindows``' groups of windows at starts ``items``."""
        if split == "val":
            return self.val_windows.batch(items)
        rows = self.windows[items]  # (B, T + 1)
        if self.device.type == "cuda":  # from pinned memory the copy does not wait for the device's queue
            rows = rows.pin_memory()
        return rows.to(self.device, non_blocking=True)

    def loss(self, model: nn.Module, micro: Tensor) -> Tensor:
        return model(micro[:, :-1], targets=micro[:, 1:]).loss  # micro (B, T + 1)

    def eval_loss(self, model, groups: list[Tensor]) -> Tensor:
        """Summed next-token cross-entropy (nats) of the held-out windows."""
        return self.val_windows.eval_loss(model, groups)

    def val_metrics(self, sums: list[float], *, final: bool) -> dict:
        nats, n = sums
        bpc = nats / LN2 / self.val_chars if final else nats / n / LN2 / self.chars_per_token
        return {"val_loss": nats / n, "val_bpc": bpc}

    def describe(self) -> str:
        return (f"{self.tokenizer.kind} tokenizer, {self.tokenizer.vocab_size} tokens, context {self.T}) on "
                f"{self.corpus.source}: {len(self.train_ids) / 1e6:.2f} M training tokens, "
                f"{len(self.corpus.val) / 1e6:.2f} M validation characters")

    def summary(self) -> dict:
        return self.compressors | {
            "val_chars": len(self.corpus.val), "train_chars": len(self.corpus.train), "corpus": self.corpus.source,
            "tokenizer": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size, "context": self.T,
            "sample_prompt": sample_prompt(self.corpus.val)}

    def info(self, s: dict) -> dict[str, str]:
        return {"val_bpc": f"{s['val_bpc']:.4f} (gzip -9 {s['gzip_bpc']:.4f}, xz -9e {s['xz_bpc']:.4f})"}

    def result_lines(self, s: dict) -> list[str]:
        return [f"validation bits per character: model {s['val_bpc']:.3f} | gzip -9 {s['gzip_bpc']:.3f} | "
                f"xz -9e {s['xz_bpc']:.3f}   ({s['val_chars']} characters held out)"]
