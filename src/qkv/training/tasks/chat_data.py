"""The conversation pieces the sft and dpo tasks share, composed by both: the chat template, a tokenizer fitted on
rendered conversations, rows encoded from records (``tasks.rows``) and fitted to the context, batches of them.

Shapes: B rows, L tokens.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...data import BPETokenizer
from ...data.chat_template import CHATML, CHATML_TOKENS, encode_conversation, encode_pieces, render, template_source
from ...data.conversations import Conversation
from .base import option
from .rows import PackedRow, Row, sequences

TEMPLATE_FILE = "chat_template.jinja"  # the template a run trained with, in its directory
CHAT_OPTIONS = {  # the options of SFT and DPO alike: name -> (default, help)
    "chat_template": ("", "chatml, a Jinja template file, or a template (default: the checkpoint's; ChatML for a "
                          "model from scratch)"),
    "truncate": (False, "cut a conversation longer than the context from the left of its prompt (never an answer); "
                        "without it such a conversation is an error"),
    "mask_end_of_turn_newline": (False, "the loss counts the newlines a chat template writes after an answer's "
                                        "end-of-turn marker too (default: not, for every template)"),
}


def chat_option(name: str):
    """The field of chat option ``name`` (``CHAT_OPTIONS``), for each task that takes it."""
    default, text = CHAT_OPTIONS[name]
    return option(default, text)


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


def fitting(rows: list, T: int, dist, progress: bool) -> list:
    """The rows of at most T + 1 tokens (each sequence of a row: a pair's two answers too), saying how many were
    left out."""
    kept = [r for r in rows if all(len(x.ids) <= T + 1 for x in sequences(r))]
    if len(kept) < len(rows) and dist.is_main and progress:
        print(f"qkv: {len(rows) - len(kept)} of {len(rows)} built-in conversations longer than the context "
              f"({T} + 1 tokens) left out", file=sys.stderr)
    return kept


def batch(rows: list[Row | PackedRow], indices: list[int], device) -> tuple[Tensor, Tensor, Tensor | None, int]:
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
    moved = to_device(host, device)
    return moved[0], moved[1], (moved[2] if docs is not None else None), answer_window(host[1])


@dataclass
class ChatData:
    """A run's chat template (its text, token variables, where it came from) and its options (``truncate``,
    ``mask_end_of_turn_newline``, ``train_on_prompt`` where the task has it): rows encoded and fitted."""

    template: str
    template_tokens: dict
    template_from: str
    options: Any

    @classmethod
    def open(cls, cfg, base, opts) -> "ChatData":
        """--chat-template, else the checkpoint's; a model from scratch takes ChatML; a checkpoint without one
        needs --chat-template."""
        given = template_source(opts.chat_template)
        if base is not None:
            own, tokens = checkpoint_template(base.path)  # a run's: the chat_template.jinja it trained with
            if given is None and own is None:
                raise ValueError(f"{base.path} has no chat template (tokenizer_config.json 'chat_template' or "
                                 f"{TEMPLATE_FILE}); give one with --chat-template chatml|FILE")
            return cls(given or own, tokens, "--chat-template" if given else "the checkpoint's", opts)
        if cfg.resume and cfg.out and (Path(cfg.out) / TEMPLATE_FILE).is_file():
            return cls((Path(cfg.out) / TEMPLATE_FILE).read_text(encoding="utf-8"), {}, "the run's", opts)
        return cls(given or CHATML, {}, "--chat-template" if given else "ChatML", opts)

    def render(self, messages, **kw) -> str:
        return render(self.template, messages, **self.template_tokens, **kw)

    def fit(self, messages: list, vocab_size: int | None) -> BPETokenizer:
        """A byte-level BPE on the rendered ``messages`` (conversations), ChatML's markers as special tokens."""
        return BPETokenizer.train([self.render(m) for m in messages], vocab_size or 2048, special_tokens=CHATML_TOKENS)

    def conversation(self, tokenizer, c: Conversation) -> Row:
        """The rendered conversation (a raw one: prompt + completion + EOS), the tokens the loss counts marked."""
        train_on_prompt = getattr(self.options, "train_on_prompt", False)
        if c.raw:
            row = self.raw(tokenizer, c.messages[0]["content"], c.messages[1]["content"], c.where)
            return row._replace(trained=row.trained | train_on_prompt)
        ids, trained = encode_conversation(tokenizer, self.template, c.messages, train_on_prompt=train_on_prompt,
                                           end_newline=self.options.mask_end_of_turn_newline,
                                           context_answers=c.context_answers, **self.template_tokens)
        return Row(torch.tensor(ids), torch.tensor(trained), c.where)

    def answer(self, tokenizer, prompt, answer, where: str) -> Row:
        """A prompt and one answer (a preference pair's side): the answer's tokens trained, the prompt's own
        answers context."""
        if isinstance(prompt, str):  # a raw pair: text, no chat template
            return self.raw(tokenizer, prompt, answer, where)
        asked = sum(m["role"] == "assistant" for m in prompt)
        ids, trained = encode_conversation(tokenizer, self.template, list(prompt + answer),
                                           end_newline=self.options.mask_end_of_turn_newline, context_answers=asked,
                                           **self.template_tokens)
        return Row(torch.tensor(ids), torch.tensor(trained), where)

    def raw(self, tokenizer, prompt: str, answer: str, where: str) -> Row:
        """Raw text, as TRL treats strings: prompt + answer + EOS (unless the answer ends with it), no chat
        template; the answer's tokens trained."""
        eos = self.template_tokens.get("eos_token") or CHATML_TOKENS[1]
        ids, trained = encode_pieces(tokenizer, [(prompt, False), (answer if answer.endswith(eos) else answer + eos,
                                                                   True)])
        return Row(torch.tensor(ids), torch.tensor(trained), where)

    def fitted(self, row: Row, T: int) -> Row:
        """The row within T + 1 tokens: as it is, or with --truncate its prompt cut from the left (never an
        answer); ValueError naming the conversation and its length otherwise."""
        cut = len(row.ids) - (T + 1)
        if cut <= 0:
            return row
        if not self.options.truncate:
            raise ValueError(f"{row.where}: a conversation of {len(row.ids)} tokens, longer than the context "
                             f"({T} + 1); --truncate cuts its prompt from the left, or raise --context")
        if bool(row.trained[:cut].any()):
            raise ValueError(f"{row.where}: a conversation of {len(row.ids)} tokens whose answers alone do not fit "
                             f"the context ({T} + 1) even with the prompt cut: raise --context")
        return Row(row.ids[cut:], row.trained[cut:], row.where)


def prepare_chat(task, cfg, run, dist, read, messages, encode) -> None:
    """A conversation task's data, on ``task``: ``read(data, val_data)``'s records (train, validation, where
    from), the base checkpoint, the chat template (``task.chat``), the tokenizer (the base's, else fitted on the
    rendered ``messages(train records)``) and the rows, ``encode(chat, tokenizer, record)`` of each."""
    opts = task.options = cfg.task_options
    task.train_set, task.val_set, task.source = read(cfg.data, opts.val_data)
    task.read_base(cfg)
    chat = task.chat = ChatData.open(cfg, task.base, opts)
    fit = (lambda: task.base.tokenizer) if task.base else (lambda: chat.fit(messages(task.train_set), cfg.vocab_size))
    task.tokenizer = task.ready_tokenizer(cfg, run, dist, fit)
    task.train_rows = [encode(chat, task.tokenizer, x) for x in task.train_set]
    task.val_rows = [encode(chat, task.tokenizer, x) for x in task.val_set]
