"""Supervised fine-tuning on conversations: a decoder learns the assistant's turns of chat conversations.

    loss = Σ cross-entropy over the assistant's tokens of the step / number of those tokens

The task sums the loss over a batch's answer tokens and the loop divides by those of the whole optimizer step —
across its micro-batches, processes and rows — so a long answer weighs per token, not per conversation, and
4 micro-batches of 1 equal 1 of 4. The prompt's
tokens (system, user, the template's markup) are context only; ``--train-on-prompt`` counts them too.

Each conversation is rendered by the chat template (``qkv.data.chat_template``: the checkpoint's, or ChatML for
a model from scratch) and cut into the assistant's pieces and the rest. Shapes: B conversations, L tokens.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data.chat_template import CHATML_TOKENS, plain_ids
from ...data.conversations import Conversation, catalog_conversations, load_conversations
from ...models import GPT, ModelConfig
from ..sampler import EpochSampler
from .base import SCRATCH, DecoderTask, TaskDefaults, TaskOptions, option
from .chat_data import TEMPLATE_FILE, ChatData, batch, chat_option, fitting, prepare_chat
from .rows import PackedRow, Row, targets_trained

VAL_FRACTION = 0.05  # without --val-data: the held-out share, chosen by a hash of each conversation
EVAL_CONVERSATIONS = 256  # held-out conversations of each periodic validation


@dataclass(frozen=True)
class SFTOptions(TaskOptions):
    """What chat fine-tuning alone is trained and scored with (``data`` is then conversations in JSONL)."""

    FREE_ON_RESUME = ("eval_generate",)
    val_data: str = option("", "held-out conversations (JSONL; default: 5 % of --data, chosen by a hash of each "
                               "conversation)")
    train_on_prompt: bool = option(False, "the loss counts every token, not only the assistant's")
    chat_template: str = chat_option("chat_template")
    truncate: bool = chat_option("truncate")
    packing: bool = option(False, "conversations packed into full rows of the context, each attending within "
                                  "itself with positions restarting (no padding: more tokens a step)")
    mask_end_of_turn_newline: bool = chat_option("mask_end_of_turn_newline")
    eval_generate: int = option(0, "at the end, greedy answers to N held-out conversations, scored by exact match "
                                   "and chrF against theirs (default 0: the held-out loss alone)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_generate < 0:
            raise ValueError(f"eval_generate must be >= 0, got {self.eval_generate}")

def held_out(conversations: list[Conversation]) -> tuple[list[Conversation], list[Conversation]]:
    """(train, validation): about VAL_FRACTION of the conversations, chosen by a hash of their messages."""
    def score(c: Conversation) -> float:
        key = json.dumps(c.messages, ensure_ascii=False, sort_keys=True).encode()
        return int(hashlib.sha1(key).hexdigest()[:8], 16) / 16**8
    chosen = {i for i, c in enumerate(conversations) if score(c) < VAL_FRACTION} or {len(conversations) - 1}
    train = [c for i, c in enumerate(conversations) if i not in chosen]
    val = [c for i, c in enumerate(conversations) if i in chosen]
    return train, val


def read_conversations(data: str | None, val_data: str) -> tuple[list[Conversation], list[Conversation], str]:
    """(train, validation, where from): --data's conversations, or the catalogs' by default; validation is
    --val-data's, or a held-out share."""
    if data is None:
        train, val, source = catalog_conversations()
        return (train, load_conversations(val_data) if val_data else val, source)
    conversations = load_conversations(data)
    if val_data:
        return conversations, load_conversations(val_data), data
    train, val = held_out(conversations)
    return train, val, f"{data} ({len(val)} held out: {VAL_FRACTION:.0%} by a hash of each conversation)"


class SFTTask(DecoderTask):
    """Next-token prediction on the assistant's turns of conversations, with a GPT."""

    name = "sft"
    model_class = GPT
    bpe_only = True
    options_type = SFTOptions
    defaults = TaskDefaults(preset="demo", batch_size=32, lr=6e-3, warmup_steps=20, lr_width=0.576,
                            tokenizer=("bpe", 2048), preset_tokenizers={"demo": ("bpe", 2048)}, minutes=10.0,
                            preset_recipes={"demo": SCRATCH},
                            data="the system's gettext catalogs as 'Translate to Chinese' conversations")

    # --- data ------------------------------------------------------------------------------------
    def prepare(self, cfg, run, dist) -> None:
        prepare_chat(self, cfg, run, dist, read_conversations, lambda records: [c.messages for c in records],
                     ChatData.conversation)

    def run_files(self) -> dict[str, str]:
        return {TEMPLATE_FILE: self.chat.template}  # what `qkv sample --chat`, `qkv chat` and export render with

    def check(self, cfg, mconf: ModelConfig, dist) -> None:
        T = self.T = self.context(cfg, mconf)
        if cfg.data is None:  # the built-in conversations: those past the context are left out, as translate does
            self.train_rows, self.val_rows = (fitting(rows, T, dist, cfg.progress)
                                              for rows in (self.train_rows, self.val_rows))
        self.train_rows = [self.chat.fitted(r, T) for r in self.train_rows]
        self.val_rows = [self.chat.fitted(r, T) for r in self.val_rows]
        if len(self.train_rows) < 1:
            raise ValueError("no training conversations")
        self.conversations = len(self.train_rows)
        if self.options.packing:
            self.train_rows = pack(self.train_rows, T + 1)
        self.order = EpochSampler(len(self.train_rows), cfg.seed)
        # the units of the loss: each row's answer tokens (every token with --train-on-prompt)
        self.unit_counts = {split: torch.tensor([targets_trained(r) for r in rows], dtype=torch.long)
                            for split, rows in (("train", self.train_rows), ("val", self.val_rows))}
        self.tokens_per_step = round(cfg.batch_size * sum(len(r.ids) for r in self.train_rows) / len(self.train_rows))
        self.eval_sample = list(range(0, len(self.val_rows), max(1, len(self.val_rows) // EVAL_CONVERSATIONS)))
        self.eval_all = list(range(len(self.val_rows)))
        answered = min(self.options.eval_generate, len(self.val_rows))
        self.final_units = len(self.val_rows) + 20 * answered if cfg.final_eval else 0
        self.device = dist.device

    # --- training and held-out batches ------------------------------------------------------------------
    def draw(self, generator: torch.Generator, step: int, size: int) -> Tensor:
        """Each row once per epoch, in the order transformers' Trainer visits them (``EpochSampler``)."""
        return self.order.step(step, size)

    def batch(self, items, split: str = "train"):
        return batch(self.train_rows if split == "train" else self.val_rows, torch.as_tensor(items).tolist(),
                     self.device)

    def loss(self, model: nn.Module, micro) -> Tensor:
        """The micro-batch's summed cross-entropy over the answer tokens, of their logits alone (``answer_window``)."""
        inputs, targets, docs, keep = micro
        packed = {} if docs is None else {"document_ids": docs}
        logits = model(inputs, logits_to_keep=keep, **packed).logits  # (B, keep or L, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets[:, -keep:].flatten(), ignore_index=-100,
                               reduction="sum")

    def val_metrics(self, sums: list[float], *, final: bool) -> dict:
        nats, n = sums
        return {"val_loss": nats / max(1, n)} | ({"val_answer_tokens": int(n)} if final else {})

    def decoded_metrics(self, model, *, autocast, dist) -> dict:
        return greedy_answers(self, model, autocast) if self.options.eval_generate else {}

    # --- reporting ------------------------------------------------------------------------------------
    def describe(self) -> str:
        packed = f" packed into {len(self.train_rows)} rows" if self.options.packing else ""
        return (f"{self.tokenizer.kind} tokenizer, {self.tokenizer.vocab_size} tokens, context {self.T}) on "
                f"{self.source}: {self.conversations} conversations{packed}, {len(self.val_rows)} held out; "
                f"chat template: {self.chat.template_from}; "
                f"loss on {'every token' if self.options.train_on_prompt else 'the answers'}")

    def summary(self) -> dict:
        return {"data": self.source, "conversations": self.conversations, "val_conversations": len(self.val_rows),
                "packed_rows": len(self.train_rows) if self.options.packing else None,
                "chat_template": self.chat.template_from, "train_on_prompt": self.options.train_on_prompt,
                "tokenizer": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size, "context": self.T}

    def info(self, s: dict) -> dict[str, str]:
        return {"val_loss": f"{s['val_loss']:.4f} nats per answer token{answered_text(s)}"}

    def result_lines(self, s: dict) -> list[str]:
        lines = [f"validation loss: {s['val_loss']:.4f} nats per answer token ({s['val_conversations']} held-out "
                 f"conversations){answered_text(s)}"]
        return lines + [f"  {e['reference']!r} -> {e['answer']!r}" for e in s.get("examples", [])[:3]]


@torch.no_grad()
def greedy_answers(task: "SFTTask", model: nn.Module, autocast) -> dict:
    """Greedy answers to the last user turn of up to ``eval_generate`` of ``task``'s held-out conversations: exact
    match and chrF against the held-out answer."""
    from ...generation import generate
    from ..metrics import chrf
    from ..sharding import decode_backend

    end = task.tokenizer.special_id(CHATML_TOKENS[1]) if hasattr(task.tokenizer, "special_id") else None
    most = task.options.eval_generate
    chosen = task.val_set[:: max(1, len(task.val_set) // most)][:most]
    hyps, refs = [], []
    for c in chosen:
        last = max(i for i, m in enumerate(c.messages) if m["role"] == "assistant")
        prompt = c.messages[0]["content"] if c.raw else \
            task.chat.render(c.messages[:last], add_generation_prompt=True)
        ids = torch.tensor([plain_ids(task.tokenizer, prompt)[-task.T:]], device=task.device)
        with autocast():
            out = generate(model, ids, min(64, task.T), temperature=0, eos_id=end, backend=decode_backend(model))
        hyps.append(task.tokenizer.decode(out[0, ids.size(1):].tolist()).split(CHATML_TOKENS[1])[0].strip())
        refs.append(c.messages[last]["content"].strip())
    exact = 100 * sum(h == r for h, r in zip(hyps, refs)) / max(1, len(refs))
    examples = [{"answer": h, "reference": r} for h, r in list(zip(hyps, refs))[:5]]
    return {"val_exact_match": exact, "val_chrf": chrf(hyps, refs), "answered": len(refs), "examples": examples}


def answered_text(s: dict) -> str:
    """The greedy answers' scores in words, where --eval-generate asked for them."""
    if not s.get("answered"):
        return ""
    return (f"; greedy answers to {s['answered']}: exact match {s['val_exact_match']:.1f} %, "
            f"chrF {s['val_chrf']:.1f}")


def pack(rows: list[Row], length: int) -> list[PackedRow]:
    """Conversations concatenated, in order, into rows of at most ``length`` tokens. A document's first token is
    never a target (nothing before it in its own document predicts it)."""
    packs, current = [], []
    for row in rows:
        if current and sum(len(r.ids) for r in current) + len(row.ids) > length:
            packs.append(current)
            current = []
        current.append(row)
    packs.append(current)
    out = []
    for group in packs:
        trained = [r.trained.clone() for r in group]
        for t in trained:
            t[0] = False
        docs = torch.cat([torch.full((len(r.ids),), d) for d, r in enumerate(group)])
        out.append(PackedRow(torch.cat([r.ids for r in group]), torch.cat(trained), group[0].where, docs))
    return out

