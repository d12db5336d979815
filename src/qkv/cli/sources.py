"""Where a command's model comes from: --run DIR (a `qkv train` run), --hf DIR (Hugging Face) or --gguf FILE
(llama.cpp's format), and --dtype, the type its weights are loaded in; ``model_command`` makes the parser of a
command that reads a model."""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
from typing import Callable

from .errors import CommandError
from .weights import add_weights_flag

KINDS = {"run": "a qkv run directory (qkv train writes one)", "hf": "a Hugging Face model directory"}


GGUF_HELP = ("a GGUF file (llama.cpp's llama, qwen2 or qwen3; F32, F16, BF16 or quantised: Q8_0, Q4_0, Q4_1, Q4_K, "
             "Q5_K, Q6_K …, dequantised), with the tokenizer and chat template in its metadata")


def add_model_source(p: argparse.ArgumentParser, *, gguf: bool = False) -> None:
    """--run DIR | --hf DIR (| --gguf FILE where ``gguf``), exactly one: where a command's model and tokenizer
    come from."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="a run directory written by `qkv train`")
    src.add_argument("--hf", metavar="DIR", help="a Hugging Face model directory (save_pretrained), with its tokenizer")
    if gguf:
        src.add_argument("--gguf", metavar="FILE", help=GGUF_HELP)


def model_command(help: str, *, gguf: bool = False, loading: bool = True, epilog: str | None = None,
                  dtype: str = "float32"):
    """Make ``add_NAME(p)``, which declares the own flags of `qkv NAME`, a command that reads a model, the
    ``add_NAME(sub) -> parser`` of ``qkv.cli.COMMANDS`` (click's manner): ``help`` is its line in `qkv --help`,
    the function's docstring its description; after its own flags a group "the model" has --run | --hf
    (| --gguf where ``gguf``), --device and (where ``loading``) how the weights are loaded, --dtype (default
    ``dtype``) and --weights."""
    def command(flags: Callable[[argparse.ArgumentParser], None]) -> Callable[..., argparse.ArgumentParser]:
        @functools.wraps(flags)
        def add(sub) -> argparse.ArgumentParser:
            p = sub.add_parser(flags.__name__.removeprefix("add_"), help=help, description=inspect.getdoc(flags),
                               epilog=epilog)
            flags(p)
            model = p.add_argument_group("the model")
            add_model_source(model, gguf=gguf)
            model.add_argument("--device", default="auto", help="auto (default: a GPU where there is one, else the "
                                                                "CPU), cpu, cuda or cuda:N")
            if loading:
                add_dtype_flag(model, default=dtype)
                add_weights_flag(model)
            return p
        return add
    return command


DTYPE_HELP = {  # --dtype's help by its default
    "float32": "the weights' type, as they are loaded: float32 (default), bfloat16 or float16 (half the bytes; "
               "docs/speed.md gives bfloat16's speed and its cost), or auto (bfloat16 where the device computes it "
               "natively: a GPU, a CPU with AVX-512 BF16 or AMX; float32 elsewhere)",
    "auto": "the weights' type, as they are loaded: auto (default: bfloat16 where the device computes it natively: "
            "a GPU, a CPU with AVX-512 BF16 or AMX; float32 elsewhere), float32 (answers equal to `qkv sample`'s "
            "in fp32), bfloat16 or float16",
}


def add_dtype_flag(p: argparse.ArgumentParser, *, default: str = "float32") -> None:
    """Declare --dtype: the weights' type as they are loaded, ``default`` float32 or auto (DTYPE_HELP)."""
    from ..runtime import DTYPES

    p.add_argument("--dtype", choices=DTYPES, default=default, help=DTYPE_HELP[default])


def source_name(args: argparse.Namespace) -> str:
    """The --run, --hf or --gguf path given, for messages."""
    return args.run or args.hf or getattr(args, "gguf", None)


def load_model_source(args: argparse.Namespace, *, device: str = "cpu"):
    """(model in eval mode on ``device`` in --dtype's type, tokenizer) from --run, --hf or --gguf; one clear error
    for anything wrong."""
    from ..runtime import resolve_device, resolve_dtype

    dtype = resolve_dtype(getattr(args, "dtype", "float32"), device)
    device = resolve_device(device)  # ValueError for a bad name or a missing GPU, before any loading
    if getattr(args, "gguf", None):
        from ..interop.gguf import load_gguf

        model, tokenizer = load_gguf(args.gguf, dtype=dtype)
        return model.to(device).eval(), tokenizer
    path = args.run or args.hf
    if not os.path.isdir(path):
        flag, kind = ("--run", "run directory (qkv train writes one)") if args.run else \
            ("--hf", "model directory (save_pretrained writes one)")
        what = "is a file, not a" if os.path.exists(path) else "no such"
        raise CommandError(f"{flag} {path}: {what} {kind}")
    check_directory_kind(path, "--run" if args.run else "--hf")
    if args.run:
        from ..training.run_dir import load_run

        run = load_run(path, device=device)
        return run.model.to(dtype), run.tokenizer
    from ..interop.hf import load_pretrained

    model, tokenizer = load_pretrained(path, dtype=dtype)
    if tokenizer is None:
        raise CommandError(f"{path} has no tokenizer files (tokenizer.json, vocab.json, vocab.txt …): "
                           "this command needs one to read text")
    return model.to(device).eval(), tokenizer


def directory_kind(path: str | os.PathLike) -> str | None:
    """"hf" for a save_pretrained directory (its config.json names a model_type), "run" for a qkv run (a
    ModelConfig's config.json: d_model, no model_type); None when config.json does not say."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None  # missing or damaged: the loader's own error says which
    if not isinstance(config, dict):
        return None
    return "hf" if "model_type" in config else "run" if "d_model" in config else None


def check_directory_kind(path: str | os.PathLike, flag: str, *, hint: str | None = None) -> None:
    """CommandError when the directory given to ``flag`` (--run, --init-from want a run; --hf, --init-from-hf a
    Hugging Face directory) is of the other kind; ``hint`` replaces "give it as --hf/--run PATH"."""
    wanted = "run" if flag in ("--run", "--init-from") else "hf"
    found = directory_kind(path)
    if found is None or found == wanted:
        return
    other = "--hf" if found == "hf" else "--run"
    raise CommandError(f"{flag} {path} is {KINDS[found]}, not {KINDS[wanted].split(' (')[0]}: "
                       f"{hint or f'give it as {other} {path}'}")
