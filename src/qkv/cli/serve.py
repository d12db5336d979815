"""`qkv serve`: an OpenAI-compatible HTTP server for a run directory or a Hugging Face directory.

The model, tokenizer and chat template come as for `qkv sample` and `qkv chat` (``load_model_source``,
``conversation_ids``, ``end_of_turn``); the server is ``qkv.serve``: a scheduler over a paged KV cache under FastAPI and uvicorn.
"""
from __future__ import annotations

import argparse
import os
import sys

from .chat import conversation_ids, end_of_turn
from .errors import CommandError
from .sources import load_model_source, model_command, source_name
from .weights import apply_weights


@model_command("an OpenAI-compatible HTTP server (continuous batching)", gguf=True, dtype="auto")
def add_serve(p: argparse.ArgumentParser) -> None:
    """Serve a run, a Hugging Face directory or a GGUF file over OpenAI's API: /v1/chat/completions (the
    checkpoint's chat template), /v1/completions, /v1/models, /health; streaming by server-sent events. Requests
    decode together, joining and leaving the batch at each step. Binds to 127.0.0.1 unless --host says otherwise."""
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="the port (default 8000)")
    p.add_argument("--api-key", default=os.environ.get("QKV_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $QKV_API_KEY; none: no key)")
    p.add_argument("--model-name", default=None, help="the model's name in the API (default: the directory's name)")
    p.add_argument("--max-batch", type=int, default=32, help="requests decoding together at most (default 32)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting at most beyond the batch; past it: HTTP 429 (default 64)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="tokens per request at most, prompt and answer (default: the model's max_len)")
    p.add_argument("--kv-cache-memory", type=memory_size, default=None,
                   help="memory for the paged KV cache, e.g. 2GiB or 512MB (default: half the free memory on a CPU, "
                        "90%% on a GPU, capped at what --max-batch requests of --max-model-len tokens need)")
    p.add_argument("--max-prefill-tokens", type=int, default=512,
                   help="prompt tokens prefilled per step at most: a long prompt is prefilled in chunks while "
                        "the other requests keep decoding (default 512)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: the cores other processes leave free when the server starts)")
    p.add_argument("--backend", choices=("auto", "eager"), default="auto",
                   help="auto (default: the linears through qkv's CPU kernels) or eager (the modules as written)")


UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
         "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def memory_size(text: str) -> int:
    """'2GiB', '512MB', '1.5g' or a number of bytes -> bytes (argparse's type for --kv-cache-memory)."""
    number = text.strip().lower().rstrip("bikmgt")
    unit = text.strip().lower()[len(number):]
    try:
        size = float(number) * UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a size such as 2GiB, 512MB or 1000000, got {text!r}") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"expected a size > 0, got {text!r}")
    return int(size)


def build_served(args: argparse.Namespace):
    """The ``qkv.serve.app.Served`` for the command's arguments: the model loaded, its text functions, the
    scheduler (not started); CommandError for a model the scheduler cannot decode or a cache that cannot fit."""
    from ..serve.app import Served
    from ..serve.scheduler import Scheduler

    model, tokenizer = load_model_source(args, device=args.device)
    apply_weights(args, model)
    try:
        scheduler = Scheduler(model, max_batch=args.max_batch, max_queue=args.max_queue, backend=args.backend,
                              max_model_len=args.max_model_len, kv_cache_memory=args.kv_cache_memory,
                              max_prefill_tokens=args.max_prefill_tokens)
    except ValueError as e:
        raise CommandError(f"{source_name(args)}: {e}") from None

    def chat_ids(messages: list[dict]) -> list[int]:
        try:
            return conversation_ids(args, tokenizer, messages)
        except CommandError as e:  # no chat template: the client's request cannot be answered
            raise ValueError(f"this model cannot chat: {e}") from None

    eos = getattr(tokenizer, "eos_id", None)
    path = os.path.normpath(source_name(args))
    return Served(name=args.model_name or os.path.basename(path), scheduler=scheduler, encode=tokenizer.encode,
                  decode=tokenizer.decode, chat_ids=chat_ids,
                  chat_decode=getattr(tokenizer, "decode_text", tokenizer.decode),
                  eos_ids=() if eos is None else (eos,), chat_eos_ids=tuple(end_of_turn(model, tokenizer) or ()))


def run_serve(args: argparse.Namespace) -> int:
    """Load, then serve until Ctrl-C."""
    import torch

    from ..runtime import cpu_threads, resolve_device
    from ..serve.app import create_app
    from ..serve.server import LOOPBACK, serve_forever

    if not 0 <= args.port <= 65535 or args.max_batch < 1 or args.max_queue < 0 or (args.threads is not None and args.threads < 1):
        raise CommandError(f"need 0 <= --port <= 65535, --max-batch >= 1, --max-queue >= 0, --threads >= 1, got "
                           f"{args.port}, {args.max_batch}, {args.max_queue}, {args.threads}")
    if resolve_device(args.device).type == "cpu":
        torch.set_num_threads(args.threads or cpu_threads())
    served = build_served(args)
    if args.host not in LOOPBACK and not args.api_key:
        print(f"qkv serve: warning: binding {args.host} without --api-key: anyone who can reach this port can use "
              "the model", file=sys.stderr)
    print(f"qkv serve: {served.name} at http://{args.host}:{args.port}/v1 (max batch {args.max_batch}, "
          f"queue {args.max_queue}{', API key required' if args.api_key else ''}, {torch.get_num_threads()} CPU "
          "threads); Ctrl-C stops", file=sys.stderr)
    print(f"qkv serve: {served.scheduler.plan}", file=sys.stderr)
    serve_forever(create_app(served, api_key=args.api_key), args.host, args.port, scheduler=served.scheduler)
    return 0
