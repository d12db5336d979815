"""Supervised fine-tuning on conversations: a decoder learns the assistant's turns of chat conversations.

    loss = Σ cross-entropy over the assistant's tokens of the step / number of those tokens

The mean is over every assistant token of the optimizer step — across its micro-batches, processes and rows —
so a long answer weighs per token, not per conversation, and 4 micro-batches of 1 equal 1 of 4. The prompt's
tokens (system, user, the template's markup) are context only; ``--train-on-prompt`` counts them too.

Each conversation is rendered by the chat template (``qkv.data.chat_template``: the checkpoint's, or ChatML for
a model from scratch) and cut into the assistant's pieces and the rest. Shapes: B conversations, L tokens.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data import BPETokenizer
from ...data.chat_template import (CHATML, CHATML_TOKENS, encode_conversation, encode_pieces, plain_ids, render,
                                   template_source)
from ...data.conversations import Conversation, catalog_conversations, load_conversations
from ...models import GPT, ModelConfig
from ..sampler import EpochSampler
from .base import SCRATCH, DecoderTask, TaskDefaults, TaskOptions
from .rows import PackedRow, Row, sequences, targets_trained

VAL_FRACTION = 0.05  # without --val-data: the held-out share, chosen by a hash of each conversation
EVAL_CONVERSATIONS = 256  # held-out conversations of each periodic validation
TEMPLATE_FILE = "chat_template.jinja"  # the template a run trained with, in its directory


@dataclass(frozen=True)
class SFTOptions(TaskOptions):
    """``--val-data``, ``--train-on-prompt``, ``--chat-template`` (chatml, a file or a template; default the
    checkpoint's, ChatML from scratch), ``--truncate`` (cut a long conversation's prompt from the left),
    ``--packing`` (conversations packed into full rows, each attending within itself), ``--mask-end-of-turn-newline``
    and ``--eval-generate N`` (greedy answers to N held-out conversations at the end: exact match, chrF)."""

    FREE_ON_RESUME = ("eval_generate",)
    val_data: str = ""
    train_on_prompt: bool = False
    chat_template: str = ""
    truncate: bool = False
    packing: bool = False
    mask_end_of_turn_newline: bool = False  # the loss counts the newlines a template writes after an answer's end
    eval_generate: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_generate < 0:
            raise ValueError(f"eval_generate must be >= 0, got {self.eval_generate}")

def checkpoint_template(path: str) -> tuple[str | None, dict]:
    """The chat template of a Hugging Face directory (chat_template.jinja, or tokenizer_config.json's) and its
    special-token variables (bos_token, eos_token) for rendering."""
    folder = Path(path)
    config = {}
    if (folder / "tokenizer_config.json").is_file():
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = (folder / TEMPLATE_FILE).read_text(encoding="utf-8") if (folder / TEMPLATE_FILE).is_file() \
        else config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    tokens = {k: (v["content"] if isinstance(v, dict) else v) for k, v in config.items()
              if k in ("bos_token", "eos_token") and v is not None}
    return template, tokens


def pins_host_batches(device) -> bool:
    """Whether batches go to ``device`` through pinned host memory, copied without waiting: where it is a GPU."""
    return torch.device(device).type == "cuda"


def to_device(tensors: list[Tensor], device) -> list[Tensor]:
    """Host tensors on ``device``: pinned and copied asynchronously to a GPU (no sync per micro-batch), else moved."""
    if not pins_host_batches(device):
        return [t.to(device) for t in tensors]
    return [t.contiguous().pin_memory().to(device, non_blocking=True) for t in tensors]


def answer_window(targets: Tensor) -> int:
    """The last positions of targets (B, L) that hold every counted one (not −100): the only logits a loss over
    them needs, as GPT's ``logits_to_keep`` (0: all L, or none counted)."""
    counted = (targets != -100).any(0).nonzero()
    first = int(counted[0]) if len(counted) else 0
    return targets.size(1) - first if first else 0


def held_out(conversations: list[Conversation]) -> tuple[list[Conversation], list[Conversation]]:
    """(train, validation): about VAL_FRACTION of the conversations, chosen by a hash of their messages."""
    def score(c: Conversation) -> float:
        key = json.dumps(c.messages, ensure_ascii=False, sort_keys=True).encode()
        return int(hashlib.sha1(key).hexdigest()[:8], 16) / 16**8
    chosen = {i for i, c in enumerate(conversations) if score(c) < VAL_FRACTION} or {len(conversations) - 1}
    train = [c for i, c in enumerate(conversations) if i not in chosen]
    val = [c for i, c in enumerate(conversations) if i in chosen]
    return train, val


class SFTTask(DecoderTask):
    """Next-token prediction on the assistant's turns of conversations, with a GPT."""

    name = "sft"
    model_class = GPT
    options_type = SFTOptions
    defaults = TaskDefaults(preset="demo", batch_size=32, lr=6e-3, warmup_steps=20, lr_width=0.576,
                            tokenizer=("bpe", 2048), preset_tokenizers={"demo": ("bpe", 2048)}, minutes=10.0,
                            preset_recipes={"demo": SCRATCH},
                            data="the system's gettext catalogs as 'Translate to Chinese' conversations")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.tokenizer not in (None, "bpe"):
            why = f"the run {cfg.init_from} has a {cfg.tokenizer} tokenizer" if cfg.init_from else \
                f"--tokenizer {cfg.tokenizer} is for --task lm"
            raise ValueError(f"--task sft trains a byte-level BPE (its chat markers are special tokens); {why}")

    # --- data ------------------------------------------------------------------------------------
    def prepare(self, cfg, run, dist) -> None:
        opts = self.options = cfg.task_options
        self.train_set, self.val_set, self.source = self.read(cfg.data, opts.val_data)
        self.read_base(cfg)
        self.template, self.template_tokens, self.template_from = self.chat_template(cfg, opts)
        fit = (lambda: self.base.tokenizer) if self.base else (lambda: self.fit(cfg.vocab_size))
        self.tokenizer = self.ready_tokenizer(cfg, run, dist, fit)
        self.train_rows = [self.encode(x) for x in self.train_set]
        self.val_rows = [self.encode(x) for x in self.val_set]

    def run_files(self) -> dict[str, str]:
        return {TEMPLATE_FILE: self.template}  # what `qkv sample --chat`, `qkv chat` and export render with

    @staticmethod
    def read(data: str | None, val_data: str) -> tuple[list[Conversation], list[Conversation], str]:
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

    def chat_template(self, cfg, opts: SFTOptions) -> tuple[str, dict, str]:
        """(template, its token variables, where it came from): --chat-template, else the checkpoint's; a model
        from scratch takes ChatML; a checkpoint without one needs --chat-template."""
        given = template_source(opts.chat_template)
        if self.base is not None:
            own, tokens = checkpoint_template(self.base.path)  # a run's: the chat_template.jinja it trained with
            if given is None and own is None:
                raise ValueError(f"{self.base.path} has no chat template (tokenizer_config.json 'chat_template' or "
                                 f"{TEMPLATE_FILE}); give one with --chat-template chatml|FILE")
            return (given or own), tokens, ("--chat-template" if given else "the checkpoint's")
        if cfg.resume and cfg.out and (Path(cfg.out) / TEMPLATE_FILE).is_file():
            return (Path(cfg.out) / TEMPLATE_FILE).read_text(encoding="utf-8"), {}, "the run's"
        return (given or CHATML), {}, ("--chat-template" if given else "ChatML")

    def fit(self, vocab_size: int | None) -> BPETokenizer:
        """A byte-level BPE on the rendered training data, ChatML's markers as special tokens."""
        texts = [render(self.template, messages, **self.template_tokens) for messages in self.fit_messages()]
        return BPETokenizer.train(texts, vocab_size or 2048, special_tokens=CHATML_TOKENS)

    def fit_messages(self) -> list:
        """The conversations a new tokenizer is fitted on."""
        return [c.messages for c in self.train_set]

    def encode(self, c: Conversation) -> Row:
        """(ids (L,), trained (L,) bool, where): the rendered conversation (a raw one: prompt + completion + EOS)
        and which tokens the loss counts."""
        if c.raw:
            ids, trained = self.raw_ids(c.messages[0]["content"], c.messages[1]["content"])
            trained = [t or self.options.train_on_prompt for t in trained]
        else:
            ids, trained = encode_conversation(self.tokenizer, self.template, c.messages,
                                               train_on_prompt=self.options.train_on_prompt,
                                               end_newline=self.options.mask_end_of_turn_newline,
                                               context_answers=c.context_answers, **self.template_tokens)
        return Row(torch.tensor(ids), torch.tensor(trained), c.where)

    def raw_ids(self, prompt: str, answer: str) -> tuple[list[int], list[bool]]:
        """(ids, learnt) of raw text, as TRL treats strings: prompt + answer + EOS (unless the answer ends with
        it), no chat template; the answer's tokens learnt."""
        eos = self.template_tokens.get("eos_token") or CHATML_TOKENS[1]
        return encode_pieces(self.tokenizer, [(prompt, False), (answer if answer.endswith(eos) else answer + eos,
                                                                True)])

    def check(self, cfg, mconf: ModelConfig, dist) -> None:
        T = self.T = self.context(cfg, mconf)
        if cfg.data is None:  # the built-in conversations: those past the context are left out, as translate does
            self.train_rows, self.val_rows = (self.fitting(rows, T, dist, cfg.progress)
                                              for rows in (self.train_rows, self.val_rows))
        self.train_rows = [self.fitted(r, T) for r in self.train_rows]
        self.val_rows = [self.fitted(r, T) for r in self.val_rows]
        if len(self.train_rows) < 1:
            raise ValueError("no training conversations")
        self.conversations = len(self.train_rows)
        if self.options.packing:
            self.train_rows = pack(self.train_rows, T + 1)
        self.order = EpochSampler(len(self.train_rows), cfg.seed)
        self.answered = torch.tensor([targets_trained(r) for r in self.train_rows])
        self.tokens_per_step = round(cfg.batch_size * sum(len(r.ids) for r in self.train_rows) / len(self.train_rows))
        self.micro = cfg.batch_size // (dist.world * cfg.grad_accum)
        self.eval_sample = list(range(0, len(self.val_rows), max(1, len(self.val_rows) // EVAL_CONVERSATIONS)))
        answered = min(self.options.eval_generate, len(self.val_rows))
        self.final_units = len(self.val_rows) + 20 * answered if cfg.final_eval else 0
        self.device = dist.device

    @staticmethod
    def fitting(rows: list, T: int, dist, progress: bool) -> list:
        """The rows of at most T + 1 tokens (each sequence of a row: a pair's two answers too), saying how many
        were left out."""
        kept = [r for r in rows if all(len(x.ids) <= T + 1 for x in sequences(r))]
        if len(kept) < len(rows) and dist.is_main and progress:
            print(f"qkv: {len(rows) - len(kept)} of {len(rows)} built-in conversations longer than the context "
                  f"({T} + 1 tokens) left out", file=sys.stderr)
        return kept

    def fitted(self, row: Row, T: int) -> Row:
        """The row within T + 1 tokens: as it is, or with --truncate its prompt cut from the left (never an
        answer); ValueError naming the conversation and its length otherwise."""
        ids, trained, where = row
        cut = len(ids) - (T + 1)
        if cut <= 0:
            return row
        if not self.options.truncate:
            raise ValueError(f"{where}: a conversation of {len(ids)} tokens, longer than the context ({T} + 1); "
                             "--truncate cuts its prompt from the left, or raise --context")
        if bool(trained[:cut].any()):
            raise ValueError(f"{where}: a conversation of {len(ids)} tokens whose answers alone do not fit the "
                             f"context ({T} + 1) even with the prompt cut: raise --context")
        return Row(ids[cut:], trained[cut:], where)

    # --- training ------------------------------------------------------------------------------------
    def batch(self, rows: list, indices: list[int]) -> tuple[Tensor, Tensor, Tensor | None, int]:
        """inputs (B, L − 1) right-padded with 0, targets (B, L − 1) with −100 where the loss does not count, for
        packed rows their document ids (B, L − 1), the padding a document of its own (else None), and the
        ``answer_window`` of the targets (read on the host: no wait for the device)."""
        longest = max(len(rows[i].ids) for i in indices)
        ids = torch.zeros(len(indices), longest, dtype=torch.long)
        targets = torch.full((len(indices), longest), -100, dtype=torch.long)
        packed = isinstance(rows[indices[0]], PackedRow)
        docs = torch.full((len(indices), longest), -1, dtype=torch.long) if packed else None
        for b, i in enumerate(indices):
            row = rows[i]
            ids[b, :len(row.ids)] = row.ids
            targets[b, :len(row.ids)] = row.ids.masked_fill(~row.trained, -100)
            if docs is not None:
                docs[b, :len(row.ids)] = row.docs
        host = [ids[:, :-1], targets[:, 1:]] + ([] if docs is None else [docs[:, :-1]])
        moved = to_device(host, self.device)
        return moved[0], moved[1], (moved[2] if docs is not None else None), answer_window(host[1])

    def draw(self, generator: torch.Generator, cfg, dist, step: int = 0) -> list:
        """Each row once per epoch, in the order transformers' Trainer visits them (``EpochSampler``)."""
        idx = self.order.step(step, cfg.batch_size)  # the global batch
        total = max(1, int(self.answered[idx].sum()))  # every rank counts the whole step's answer tokens
        scale = cfg.grad_accum * dist.world / total  # see ``loss``
        mine = idx.view(cfg.grad_accum, dist.world, self.micro)[:, dist.rank]  # (accum, B)
        return [self.batch(self.train_rows, row.tolist()) + (scale,) for row in mine]

    def loss(self, model: nn.Module, micro) -> Tensor:
        """The micro-batch's summed loss × accum · world / the step's answer tokens: the recipe's mean over
        micro-batches and processes is then the mean over every answer token of the step."""
        inputs, targets, docs, keep, scale = micro
        packed = {} if docs is None else {"document_ids": docs}
        logits = model(inputs, logits_to_keep=keep, **packed).logits  # (B, keep or L, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets[:, -keep:].flatten(), ignore_index=-100,
                               reduction="sum") * scale

    # --- validation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def nll(self, model: nn.Module, indices: list[int], autocast, dist) -> tuple[float, int]:
        """(summed nats, answer tokens) of held-out conversations ``indices``."""
        was, total = model.training, torch.zeros(2, dtype=torch.float64, device=self.device)
        model.eval()
        mine = indices[dist.rank::dist.world]
        for lo in range(0, len(mine), 32):
            inputs, targets, _, keep = self.batch(self.val_rows, mine[lo:lo + 32])
            with autocast():
                logits = model(inputs, logits_to_keep=keep).logits
            total[0] += F.cross_entropy(logits.flatten(0, 1).float(), targets[:, -keep:].flatten(), ignore_index=-100,
                                        reduction="sum").double()
            total[1] += (targets != -100).sum()
        model.train(was)
        total = dist.sum(total)
        return float(total[0]), int(total[1])

    def evaluate(self, model, *, autocast, dist) -> tuple[dict, int]:
        nats, n = self.nll(model, self.eval_sample, autocast, dist)
        return {"val_loss": nats / max(1, n)}, len(self.eval_sample)

    def final_metrics(self, model, *, autocast, dist, progress: bool) -> dict:
        nats, n = self.nll(model, list(range(len(self.val_rows))), autocast, dist)
        answers = self.answers(model, autocast) if self.options.eval_generate else {}
        return {"val_loss": nats / max(1, n), "val_answer_tokens": n} | answers

    @torch.no_grad()
    def answers(self, model, autocast) -> dict:
        """Greedy answers to the last user turn of up to ``eval_generate`` held-out conversations: exact match and
        chrF against the held-out answer."""
        from ...generation import generate
        from ..metrics import chrf
        from ..sharding import decode_backend

        end = self.tokenizer.special_id(CHATML_TOKENS[1]) if hasattr(self.tokenizer, "special_id") else None
        most = self.options.eval_generate
        chosen = self.val_set[:: max(1, len(self.val_set) // most)][:most]
        hyps, refs = [], []
        for c in chosen:
            last = max(i for i, m in enumerate(c.messages) if m["role"] == "assistant")
            prompt = c.messages[0]["content"] if c.raw else \
                render(self.template, c.messages[:last], add_generation_prompt=True, **self.template_tokens)
            ids = torch.tensor([plain_ids(self.tokenizer, prompt)[-self.T:]], device=self.device)
            with autocast():
                out = generate(model, ids, min(64, self.T), temperature=0, eos_id=end, backend=decode_backend(model))
            hyps.append(self.tokenizer.decode(out[0, ids.size(1):].tolist()).split(CHATML_TOKENS[1])[0].strip())
            refs.append(c.messages[last]["content"].strip())
        exact = 100 * sum(h == r for h, r in zip(hyps, refs)) / max(1, len(refs))
        examples = [{"answer": h, "reference": r} for h, r in list(zip(hyps, refs))[:5]]
        return {"val_exact_match": exact, "val_chrf": chrf(hyps, refs), "answered": len(refs), "examples": examples}

    # --- reporting ------------------------------------------------------------------------------------
    def packed(self) -> str:
        return f" packed into {len(self.train_rows)} rows" if self.options.packing else ""

    def describe(self) -> str:
        return (f"{self.tokenizer.kind} tokenizer, {self.tokenizer.vocab_size} tokens, context {self.T}) on "
                f"{self.source}: {self.conversations} conversations{self.packed()}, {len(self.val_rows)} held out; "
                f"chat template: "
                f"{self.template_from}; loss on {'every token' if self.options.train_on_prompt else 'the answers'}")

    def summary(self) -> dict:
        return {"data": self.source, "conversations": self.conversations, "val_conversations": len(self.val_rows),
                "packed_rows": len(self.train_rows) if self.options.packing else None,
                "chat_template": self.template_from, "train_on_prompt": self.options.train_on_prompt,
                "tokenizer": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size, "context": self.T}

    @staticmethod
    def answered_text(s: dict) -> str:
        """The greedy answers' scores in words, where --eval-generate asked for them."""
        if not s.get("answered"):
            return ""
        return (f"; greedy answers to {s['answered']}: exact match {s['val_exact_match']:.1f} %, "
                f"chrF {s['val_chrf']:.1f}")

    def info(self, s: dict) -> dict[str, str]:
        return {"val_loss": f"{s['val_loss']:.4f} nats per answer token{self.answered_text(s)}"}

    def result_lines(self, s: dict) -> list[str]:
        lines = [f"validation loss: {s['val_loss']:.4f} nats per answer token ({s['val_conversations']} held-out "
                 f"conversations){self.answered_text(s)}"]
        return lines + [f"  {e['reference']!r} -> {e['answer']!r}" for e in s.get("examples", [])[:3]]


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

