"""`qkv chat`: talk with a chat model, turn after turn; and the chat pieces `qkv sample --chat` shares.

A conversation is rendered by the checkpoint's chat template — a run's own ``chat_template.jinja`` (a run of
``--task sft`` or ``dpo``), else the tokenizer's — and each reply streams as it is generated, stopping at the end
of the turn. The history is kept and sent again each turn (cut from the left past the model's context).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import CommandError
from .sources import load_model_source, model_command, source_name
from .weights import apply_weights

COMMANDS_HELP = "/reset forgets the conversation, /exit (or Ctrl-D) ends the session, Ctrl-C ends the answer"


def run_chat_template(run: str | None) -> str | None:
    """The chat template a run of --task sft or dpo trained with (its chat_template.jinja), None for others."""
    from ..training.tasks.sft import TEMPLATE_FILE

    path = Path(run) / TEMPLATE_FILE if run else None
    return path.read_text(encoding="utf-8") if path is not None and path.is_file() else None


def conversation_ids(args: argparse.Namespace, tokenizer, messages: list[dict]) -> list[int]:
    """``messages`` in the run's chat template, or the checkpoint's, opening the assistant's turn; CommandError
    when there is none."""
    template = run_chat_template(args.run)
    if template is not None:  # a run of --task sft or dpo: the template it trained with
        from ..data.chat_template import plain_ids, render

        return plain_ids(tokenizer, render(template, messages, add_generation_prompt=True))
    if getattr(tokenizer, "chat_template", None) is None:
        raise CommandError(f"{source_name(args)}: the tokenizer has no chat template "
                           "(tokenizer_config.json 'chat_template'), nor the run a chat_template.jinja")
    return tokenizer.chat_ids(messages)


def end_of_turn(model, tokenizer) -> list[int] | None:
    """Where a chat reply ends: the model's generation_config eos ids, the tokenizer's eos and ChatML's end of turn
    where the tokenizer has it (None: none)."""
    from ..data.chat_template import CHATML_TOKENS

    config = getattr(model, "generation_config", None)
    ids = list(config.eos_ids) if config is not None else []
    ids += [] if getattr(tokenizer, "eos_id", None) is None else [tokenizer.eos_id]
    end = tokenizer.special_id(CHATML_TOKENS[1]) if hasattr(tokenizer, "special_id") else None
    ids += [] if end is None else [end]
    return list(dict.fromkeys(ids)) or None


def stream_chat(model, tokenizer, ids: list[int], tokens: int, **kwargs) -> str:
    """Print the reply to a chat prompt's ``ids`` as it comes, then a newline: its text alone, without the prompt
    or special tokens; returns it (what was printed, if Ctrl-C stopped it). ``kwargs`` as ``generate``'s."""
    from types import SimpleNamespace

    import torch

    from ..generation import TextStreamer, generate

    streamer = TextStreamer(SimpleNamespace(decode=getattr(tokenizer, "decode_text", tokenizer.decode)),
                            skip_prompt=True)  # qkv's BPE decodes without its special tokens already
    try:
        generate(model, torch.tensor([ids], device=model.lm_head.weight.device), tokens, streamer=streamer, **kwargs)
    finally:
        if streamer.pieces:
            print(flush=True)
    return streamer.text


@model_command("talk with a chat model, turn after turn (streaming)", gguf=True, epilog=COMMANDS_HELP + ".")
def add_chat(p: argparse.ArgumentParser) -> None:
    """A conversation with a chat model: a run trained with --task sft or dpo, or a Hugging Face directory or a GGUF
    file with a chat template. Each reply streams as it is generated; the history is kept."""
    p.add_argument("--system", metavar="TEXT", default=None, help="a system message before the conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, help="the longest reply, in tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy (default 0.7)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: keep probability mass p")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible replies")


def run_chat(args: argparse.Namespace) -> int:
    """Read a turn, answer it, until /exit or the end of input."""
    from ..generation.plan import plan_decode
    from ..models import GPT

    model, tokenizer = load_model_source(args, device=args.device)
    if not isinstance(model, GPT):
        raise CommandError(f"{source_name(args)}: chat needs a decoder, got {type(model).__name__}")
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    conversation_ids(args, tokenizer, system + [{"role": "user", "content": ""}])  # no template: refused now
    apply_weights(args, model)
    plan = plan_decode(model, 1)  # one choice for every turn
    settings = dict(temperature=args.temperature, top_p=args.top_p, seed=args.seed, eos_id=end_of_turn(model, tokenizer),
                    plan=plan)
    history = list(system)
    print(f"qkv chat: {plan}", file=sys.stderr)
    print(f"qkv chat: {COMMANDS_HELP}", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            history = list(system)
            print("qkv chat: the conversation is forgotten", file=sys.stderr)
            continue
        if line.strip():
            history = answer(model, tokenizer, args, history + [{"role": "user", "content": line}], settings)


def answer(model, tokenizer, args: argparse.Namespace, history: list[dict], settings: dict) -> list[dict]:
    """The history with the reply to its last turn (what was printed, if Ctrl-C stopped it)."""
    ids = conversation_ids(args, tokenizer, history)
    room = model.config.max_len - args.max_new_tokens
    try:
        reply = stream_chat(model, tokenizer, ids[-max(1, room):], args.max_new_tokens, **settings)
    except KeyboardInterrupt:
        print("qkv chat: answer stopped (that turn is left out of the conversation)", file=sys.stderr)
        return history[:-1]
    return history + [{"role": "assistant", "content": reply.strip()}]
