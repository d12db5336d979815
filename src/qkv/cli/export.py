"""`qkv export`: a trained run as a Hugging Face directory (``qkv.interop.export``) or a GGUF file
(``qkv.interop.gguf``: llama.cpp, Ollama)."""
from __future__ import annotations

import argparse
import sys
import warnings

from ..interop.gguf import TYPES as GGUF_TYPES, GGUFApproximation
from .errors import CommandError
from .sources import check_directory_kind


def add_export(sub) -> argparse.ArgumentParser:
    """Declare `qkv export`."""
    p = sub.add_parser("export", help="write a trained run as a Hugging Face model directory or a GGUF file",
                       description="Write a run's model and tokenizer as a directory that transformers' "
                                   "AutoModelForCausalLM and AutoTokenizer load without qkv, as the family that "
                                   "holds its shape: GPT-2 (learned positions, LayerNorm), LLaMA (RoPE, RMSNorm, "
                                   "SwiGLU; RoPE scaling kept), GPT-NeoX (RoPE, LayerNorm, GELU: the demo preset's "
                                   "shape), or a fine-tuned Qwen2, Qwen3, Mistral or Gemma 2 as itself (sliding "
                                   "windows kept); LoRA adapters merged. With --format gguf, one GGUF file that "
                                   "llama.cpp (llama-cli -m FILE) and Ollama (a Modelfile's FROM FILE) run: "
                                   "LLaMA-shaped runs (and Mistral, Mixtral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, "
                                   "gpt-oss, DeepSeek-V2/V3, OLMo 2, Phi-3 (LongRoPE too) and SmolLM3, each in the "
                                   "settings llama.cpp fixes) with a byte-level BPE "
                                   "or character tokenizer; other shapes are refused with the reason.")
    p.add_argument("--run", required=True, metavar="DIR", help="a run directory written by `qkv train`")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--hf", metavar="OUT", help="the Hugging Face directory to write (missing or empty)")
    out.add_argument("--out", metavar="OUT", help="what to write: a directory for --format hf, a file "
                                                  "(model.gguf) for --format gguf")
    p.add_argument("--format", choices=("hf", "gguf"), default="hf",
                   help="hf: a save_pretrained directory (default); gguf: one file for llama.cpp and Ollama")
    p.add_argument("--gguf-type", choices=GGUF_TYPES, default=None,
                   help="--format gguf: the matrices' type (default f16; q8_0: 8-bit blocks of 32); norms and "
                        "biases stay f32")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT (an existing GGUF file)")
    return p


def say_warnings(caught: list) -> None:
    """Each of llama.cpp's approximations as one ``qkv export: warning:`` line; any other warning as Python shows it."""
    for w in caught:
        if issubclass(w.category, GGUFApproximation):
            print(f"qkv export: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def run_export(args: argparse.Namespace) -> int:
    """Export, then say what was written."""
    from ..training.export import export_run, export_run_gguf

    if args.format == "gguf" and args.hf:
        raise CommandError("--hf names a Hugging Face directory; with --format gguf give the file as --out FILE.gguf")
    if args.format == "hf" and args.gguf_type:
        raise CommandError(f"--gguf-type {args.gguf_type} applies to --format gguf (got --format hf)")
    check_directory_kind(args.run, "--run", hint="transformers loads it as it is (qkv export writes a run's "
                                                 "model as one)")
    if args.format == "gguf":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GGUFApproximation)
            out = export_run_gguf(args.run, args.out, dtype=args.gguf_type or "f16", overwrite=args.overwrite)
        say_warnings(caught)
        print(f"wrote {out}: run it with llama-cli -m {out}, or in Ollama with a Modelfile saying FROM {out}")
        return 0
    out = export_run(args.run, args.hf or args.out, overwrite=args.overwrite)
    print(f"wrote {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}) "
          f"and AutoTokenizer.from_pretrained({str(out)!r})")
    return 0
