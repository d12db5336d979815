"""Preference tuning: Direct Preference Optimization (Rafailov et al. 2023) and the variants TRL trains.

For a prompt x with a chosen answer y_w and a rejected one y_l, with log π(y | x) the sum of the answer's
token log-probabilities under the model being trained and log π_ref under the reference (the starting weights),
ρ_w = log π(y_w|x) − log π_ref(y_w|x), ρ_l likewise, h = ρ_w − ρ_l, |y| an answer's tokens, ε = label_smoothing:

    sigmoid       −log σ(β h)                                           (DPO, eq. 7)
    hinge         max(0, 1 − β h)                                       (SLiC, Zhao et al. 2023)
    ipo           (ρ_w / |y_w| − ρ_l / |y_l| − 1 / (2β))²               (Azar et al. 2023, eq. 17; each log-ratio
                                                                         averaged over its answer's tokens, as TRL)
    sigmoid_norm  −log σ(β (ρ_w / |y_w| − ρ_l / |y_l|))                 (TRL's length-normalised DPO)
    robust        (−(1 − ε) log σ(β h) + ε log σ(−β h)) / (1 − 2ε)      (rDPO, Chowdhury et al. 2024)
    bco_pair      −log σ(β ρ_w) − log σ(−β ρ_l)                         (BCO, Jung et al. 2024, paired)
    sppo_hard     (ρ_w − 1 / (2β))² + (ρ_l + 1 / (2β))²                 (SPPO, Wu et al. 2024, hard labels)
    nca_pair      −log σ(β ρ_w) − ½ log σ(−β ρ_w) − ½ log σ(−β ρ_l)     (NCA, Chen et al. 2024)
    apo_zero      1 − σ(β ρ_w) + σ(β ρ_l)                               (APO, D'Oosterlinck et al. 2024, eq. 7)
    apo_down      σ(β ρ_w) + 1 − σ(β h)                                 (APO, eq. 8)
    rewards       r_w = β ρ_w, r_l = β ρ_l; accuracy = mean(r_w > r_l), margin = mean(r_w − r_l)

Each is TRL's ``DPOTrainer`` loss of the same name (tests/test_dpo.py compares them on the same log-probabilities).
The reference is the starting weights: with ``--lora`` the same model with its adapters switched off (no copy);
without, a frozen copy — or, with ``--precompute-ref``, its log-probabilities computed once and the copy dropped.
Everything else — data, chat template, tokenizer, context — is the SFT task's (``qkv.training.tasks.sft``).
"""
from __future__ import annotations

import copy
import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data.conversations import Preference, catalog_preferences, load_preferences
from ...models import GPT
from ..sampler import EpochSampler
from .base import SCRATCH, DecoderTask, TaskDefaults, TaskOptions, option
from .chat_data import TEMPLATE_FILE, ChatData, batch, chat_option, fitting, prepare_chat
from .rows import Pair, targets_trained

LOSSES = ("sigmoid", "hinge", "ipo", "sigmoid_norm", "robust", "bco_pair", "sppo_hard", "nca_pair", "apo_zero",
          "apo_down")
REWARD_FIELDS = ("val_loss", "val_reward_accuracy", "val_reward_margin", "val_rewards_chosen", "val_rewards_rejected")


@dataclass(frozen=True)
class DPOOptions(TaskOptions):
    """What preference tuning alone is trained with: the loss, and the SFT task's data options."""

    val_data: str = option("", "held-out pairs (JSONL; default: 5 % of --data, chosen by a hash of each pair)")
    chat_template: str = chat_option("chat_template")
    truncate: bool = chat_option("truncate")
    beta: float = option(0.1, "β, the strength of the pull towards the reference (default 0.1)")
    dpo_loss: str = option("sigmoid", "sigmoid (DPO's, default), hinge, ipo (log-ratios averaged over each answer's "
                                      "tokens, as TRL's), sigmoid_norm, robust, bco_pair, sppo_hard, nca_pair, apo_zero "
                                      "or apo_down: TRL's losses of those names", choices=LOSSES)
    precompute_ref: bool = option(False, "the reference's log-probabilities computed once before training, then its "
                                         "copy dropped (without --lora)")
    label_smoothing: float = option(0.0, "the robust loss's ε, the share of pairs thought mislabelled (default 0)")
    mask_end_of_turn_newline: bool = chat_option("mask_end_of_turn_newline")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.dpo_loss not in LOSSES:
            raise ValueError(f"dpo_loss must be one of {', '.join(LOSSES)}, got {self.dpo_loss!r}")


def pair_losses(rho_w: Tensor, rho_l: Tensor, *, beta: float, kind: str, lengths: tuple[Tensor, Tensor],
                label_smoothing: float) -> Tensor:
    """Loss ``kind`` (B,) of the log-ratios ρ_w, ρ_l (B,) each; ``lengths``: the answers' tokens (B,) each."""
    h, ls = rho_w - rho_l, F.logsigmoid
    if kind in ("ipo", "sigmoid_norm"):
        avg = rho_w / lengths[0].clamp(min=1) - rho_l / lengths[1].clamp(min=1)
        return (avg - 1 / (2 * beta)) ** 2 if kind == "ipo" else -ls(beta * avg)
    if kind == "robust":
        eps = label_smoothing
        return (-(1 - eps) * ls(beta * h) + eps * ls(-beta * h)) / (1 - 2 * eps)
    w, l = beta * rho_w, beta * rho_l
    table = {"sigmoid": lambda: -ls(beta * h), "hinge": lambda: torch.relu(1 - beta * h),
             "bco_pair": lambda: -ls(w) - ls(-l),
             "sppo_hard": lambda: (rho_w - 0.5 / beta) ** 2 + (rho_l + 0.5 / beta) ** 2,
             "nca_pair": lambda: -ls(w) - 0.5 * ls(-w) - 0.5 * ls(-l),
             "apo_zero": lambda: 1 - torch.sigmoid(w) + torch.sigmoid(l),
             "apo_down": lambda: torch.sigmoid(w) + 1 - torch.sigmoid(beta * h)}
    if kind not in table:
        raise ValueError(f"dpo_loss must be one of {', '.join(LOSSES)}, got {kind!r}")
    return table[kind]()


def preference_loss(chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, *, beta: float,
                    kind: str = "sigmoid", lengths: tuple[Tensor, Tensor] | None = None,
                    label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """(losses (B,), chosen rewards (B,), rejected rewards (B,)) from summed answer log-probabilities (B,) each;
    ``lengths`` (the answers' tokens, (B,) each) is needed by the length-averaged losses (ipo, sigmoid_norm)."""
    if lengths is None and kind in ("ipo", "sigmoid_norm"):
        raise ValueError(f"the {kind} loss averages each log-ratio over its answer: give lengths")
    rho_w, rho_l = chosen - ref_chosen, rejected - ref_rejected
    losses = pair_losses(rho_w, rho_l, beta=beta, kind=kind, lengths=lengths, label_smoothing=label_smoothing)
    return losses, beta * rho_w.detach(), beta * rho_l.detach()


def answer_logps(model: nn.Module, inputs: Tensor, targets: Tensor, keep: int = 0) -> Tensor:
    """Σ log p(target) over the positions whose target is not −100: inputs, targets (B, L) -> (B,); ``keep``: the
    last positions that hold them all (``answer_window``; 0: all), the only logits computed."""
    logits = model(inputs, logits_to_keep=keep).logits.float()  # (B, keep or L, V)
    targets = targets[:, -keep:]
    kept = targets != -100
    picked = torch.gather(logits.log_softmax(-1), 2, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, L)
    return (picked * kept).sum(-1)


@contextmanager
def adapters_off(model: nn.Module):
    """The model with its LoRA adapters switched off inside (peft's layers), on again after."""
    layers = [m for m in model.modules() if hasattr(m, "enable_adapters") and hasattr(m, "lora_A")]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)


def read_pairs(data: str | None, val_data: str) -> tuple[list[Preference], list[Preference], str]:
    """(train, validation, where from): --data's pairs, or the catalogs' by default; validation is --val-data's,
    or the last 5 % of the pairs."""
    if data is None:
        train, val, source = catalog_preferences()
        return train, (load_preferences(val_data) if val_data else val), source
    pairs = load_preferences(data)
    if val_data:
        return pairs, load_preferences(val_data), data
    cut = max(1, round(0.05 * len(pairs)))
    return pairs[:-cut], pairs[-cut:], f"{data} (its last {cut} pairs held out)"


def pair_messages(pairs: list[Preference]) -> list:
    """The conversations a new tokenizer is fitted on: each prompt with each of its answers."""
    return [({"role": "user", "content": p.prompt + answer},) if p.raw else p.prompt + answer
            for p in pairs for answer in (p.chosen, p.rejected)]


def encode_pair(chat: ChatData, tokenizer, p: Preference) -> Pair:
    """Each answer after the prompt, its tokens scored."""
    return Pair(chat.answer(tokenizer, p.prompt, p.chosen, p.where), chat.answer(tokenizer, p.prompt, p.rejected,
                                                                                  p.where))


class DPOTask(DecoderTask):
    """Preference pairs: raise the chosen answer's likelihood over the rejected one's, against the reference."""

    name = "dpo"
    model_class = GPT
    bpe_only = True
    options_type = DPOOptions
    defaults = TaskDefaults(preset="demo", batch_size=16, lr=1e-4, warmup_steps=10, lr_width=None,
                            tokenizer=("bpe", 2048), preset_tokenizers={"demo": ("bpe", 2048)}, minutes=5.0,
                            preset_recipes={"demo": SCRATCH},
                            data="the system's gettext catalogs as preference pairs (another string's translation "
                                 "rejected)")
    reference: nn.Module | None = None
    sequences_per_row = 2  # the policy scores each pair's chosen and rejected answers: two sequences (memory estimate)
    ref_logps: dict[str, Tensor] | None = None  # --precompute-ref: {"train", "val"}: (pairs, 2) chosen, rejected

    def prepare(self, cfg, run, dist) -> None:
        prepare_chat(self, cfg, run, dist, read_pairs, pair_messages, encode_pair)

    def run_files(self) -> dict[str, str]:
        return {TEMPLATE_FILE: self.chat.template}  # what `qkv sample --chat`, `qkv chat` and export render with

    def build_model(self, mconf) -> nn.Module:
        model = super().build_model(mconf)
        if not self.lora:  # the starting weights, kept apart (a resume restores the trained ones after this)
            self.reference = copy.deepcopy(model).requires_grad_(False).eval()
        return model

    def check(self, cfg, mconf, dist) -> None:
        self.T, self.lora, self.device = self.context(cfg, mconf), bool(cfg.lora), dist.device
        if cfg.data is None:  # the built-in pairs: those past the context left out
            self.train_rows, self.val_rows = (fitting(rows, self.T, dist, cfg.progress)
                                              for rows in (self.train_rows, self.val_rows))
        self.train_rows, self.val_rows = ([Pair(*(self.chat.fitted(x, self.T) for x in r)) for r in rows]
                                          for rows in (self.train_rows, self.val_rows))
        tokens = sum(len(r.chosen.ids) + len(r.rejected.ids) for r in self.train_rows)
        self.tokens_per_step = round(cfg.batch_size * tokens / max(1, len(self.train_rows)))
        self.order = EpochSampler(len(self.train_rows), cfg.seed)
        self.eval_sample = list(range(0, len(self.val_rows), max(1, len(self.val_rows) // 256)))
        self.eval_all = list(range(len(self.val_rows)))
        self.final_units = len(self.val_rows) if cfg.final_eval else 0

    # --- training and held-out batches ------------------------------------------------------------------
    eval_fields = REWARD_FIELDS  # each a mean over the pairs
    eval_batch_size = 16

    def draw(self, generator: torch.Generator, step: int, size: int) -> Tensor:
        """Each pair once per epoch, in the order transformers' Trainer visits them (``EpochSampler``)."""
        return self.order.step(step, size)

    def batch(self, items, split: str = "train"):
        return torch.as_tensor(items).tolist(), split  # pairs are scored by index: the reference's may be cached

    def loss(self, model: nn.Module, micro) -> Tensor:
        """The summed loss of the micro-batch's pairs (the loop divides by the step's pairs)."""
        if self.options.precompute_ref and self.ref_logps is None:
            precompute_reference(self)
        chosen, rejected = pair_logps(self, model, micro, reference=False)
        ref_chosen, ref_rejected = pair_logps(self, model, micro, reference=True)
        losses, _, _ = pair_loss(self, micro, chosen, rejected, ref_chosen, ref_rejected)
        return losses.sum()

    def eval_sums(self, model, micro, items) -> Tensor:
        """The loss and the rewards on held-out pairs, as TRL names them (``REWARD_FIELDS``), summed; their count."""
        chosen, rejected = pair_logps(self, model, micro, reference=False)
        ref = pair_logps(self, model, micro, reference=True)
        losses, r_w, r_l = pair_loss(self, micro, chosen, rejected, *ref)
        return torch.stack([losses.sum(), (r_w > r_l).sum(), (r_w - r_l).sum(), r_w.sum(), r_l.sum(),
                            torch.tensor(float(len(items)), device=self.device)])

    # --- reporting ---------------------------------------------------------------------------------------
    def describe(self) -> str:
        ref = "the adapters switched off" if self.lora else "precomputed" if self.options.precompute_ref else \
            "a frozen copy of the starting weights"
        return (f"{self.tokenizer.kind} tokenizer, {self.tokenizer.vocab_size} tokens, context {self.T}) on "
                f"{self.source}: {len(self.train_rows)} preference pairs, {len(self.val_rows)} held out; "
                f"{self.options.dpo_loss} loss, β {self.options.beta:g}, reference: {ref}")

    def summary(self) -> dict:
        return {"data": self.source, "pairs": len(self.train_rows), "val_pairs": len(self.val_rows),
                "chat_template": self.chat.template_from, "beta": self.options.beta, "dpo_loss": self.options.dpo_loss,
                "tokenizer": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size, "context": self.T}

    def info(self, s: dict) -> dict[str, str]:
        return {"val_loss": f"{s['val_loss']:.4f} ({s['dpo_loss']}); reward accuracy "
                            f"{100 * s['val_reward_accuracy']:.1f} %, margin {s['val_reward_margin']:.3f}"}

    def result_lines(self, s: dict) -> list[str]:
        base = f" (ln 2 = {math.log(2):.4f} where the model is the reference)" if s["dpo_loss"] == "sigmoid" else ""
        return [f"validation ({s['val_pairs']} held-out pairs): {s['dpo_loss']} loss {s['val_loss']:.4f}{base}; "
                f"reward accuracy {100 * s['val_reward_accuracy']:.1f} %, margin {s['val_reward_margin']:.3f} "
                f"(chosen {s['val_rewards_chosen']:.3f}, rejected {s['val_rewards_rejected']:.3f})"]


def pair_batch(rows: list[Pair], indices: list[int], device) -> tuple[Tensor, Tensor, int]:
    """inputs, targets (2B, L − 1): the chosen answers, then the rejected ones; −100 off the answers; and their
    ``answer_window``."""
    seqs = [rows[i].chosen for i in indices] + [rows[i].rejected for i in indices]
    inputs, targets, _, keep = batch(seqs, list(range(len(seqs))), device)
    return inputs, targets, keep



def pair_logps(task: "DPOTask", model: nn.Module, micro, *, reference: bool) -> tuple[Tensor, Tensor]:
    """(chosen, rejected) summed answer log-probabilities (B,) of ``task``'s pairs ``micro`` (indices, split) under
    the policy ``model``, or under the reference."""
    indices, split = micro
    rows = task.train_rows if split == "train" else task.val_rows
    if reference and task.ref_logps is not None:
        cached = task.ref_logps[split][indices].to(task.device)
        return cached[:, 0], cached[:, 1]
    pairs = pair_batch(rows, indices, task.device)
    if not reference:
        both = answer_logps(model, *pairs)
    else:
        with torch.no_grad(), (adapters_off(model) if task.lora else nullcontext()):
            both = answer_logps(model if task.lora else on_device(task.reference, task.device), *pairs)
    return both[:len(indices)], both[len(indices):]



def on_device(module: nn.Module, device) -> nn.Module:
    """``module``, moved to ``device`` where it is not there yet."""
    if next(module.parameters()).device != device:
        module.to(device)
    return module



def pair_loss(task: "DPOTask", micro, *logps: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``preference_loss`` of ``task``'s options on its pairs ``micro``, from their ``logps``: chosen, rejected, their
    references."""
    indices, split = micro
    rows = task.train_rows if split == "train" else task.val_rows
    lengths = tuple(torch.tensor([targets_trained(getattr(rows[i], side)) for i in indices], device=task.device)
                    for side in ("chosen", "rejected"))  # each answer's scored targets
    return preference_loss(*logps, beta=task.options.beta, kind=task.options.dpo_loss, lengths=lengths,
                           label_smoothing=task.options.label_smoothing)



@torch.no_grad()
def precompute_reference(task: "DPOTask") -> None:
    """--precompute-ref: the reference's log-probabilities of every pair, once; the reference copy dropped."""
    model = on_device(task.reference, task.device)
    out = {}
    for split, rows in (("train", task.train_rows), ("val", task.val_rows)):
        parts = []
        for lo in range(0, len(rows), 32):
            indices = list(range(lo, min(lo + 32, len(rows))))
            both = answer_logps(model, *pair_batch(rows, indices, task.device))
            parts.append(torch.stack([both[:len(indices)], both[len(indices):]], -1).cpu())
        out[split] = torch.cat(parts)
    task.ref_logps, task.reference = out, None
