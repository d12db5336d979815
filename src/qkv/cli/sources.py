"""Where a command's model comes from: --run DIR (a `qkv train` run) or --hf DIR (Hugging Face)."""
from __future__ import annotations

import argparse
import os

from .errors import CommandError


def add_model_source(p: argparse.ArgumentParser) -> None:
    """--run DIR | --hf DIR, exactly one: where a command's model and tokenizer come from."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="a run directory written by `qkv train`")
    src.add_argument("--hf", metavar="DIR", help="a Hugging Face model directory (save_pretrained), with its tokenizer")


def load_model_source(args: argparse.Namespace, *, device: str = "cpu"):
    """(model in eval mode on ``device``, tokenizer) from --run or --hf; one clear error for anything wrong."""
    from ..runtime import resolve_device

    device = resolve_device(device)  # ValueError for a bad name or a missing GPU, before any loading
    path = args.run or args.hf
    if not os.path.isdir(path):
        flag, kind = ("--run", "run directory (qkv train writes one)") if args.run else \
            ("--hf", "model directory (save_pretrained writes one)")
        what = "is a file, not a" if os.path.exists(path) else "no such"
        raise CommandError(f"{flag} {path}: {what} {kind}")
    if args.run:
        from ..training.run_dir import load_run

        run = load_run(path, device=device)
        return run.model, run.tokenizer
    from ..interop.hf import load_pretrained

    model, tokenizer = load_pretrained(path)
    if tokenizer is None:
        raise CommandError(f"{path} has no tokenizer files (tokenizer.json, vocab.json, vocab.txt …): "
                           "this command needs one to read text")
    return model.to(device).eval(), tokenizer
