"""`qkv export`: a trained run as a Hugging Face directory (``qkv.interop.export``) or a GGUF file
(``qkv.interop.gguf``: llama.cpp, Ollama); conversion without training: a Hugging Face directory as a GGUF file,
a GGUF file as a Hugging Face directory (``qkv.interop.gguf.convert``)."""
from __future__ import annotations

import argparse
import sys
import warnings

from ..interop.gguf import TYPES as GGUF_TYPES, GGUFApproximation
from .errors import CommandError
from .sources import add_dtype_flag, check_directory_kind


def add_export(sub) -> argparse.ArgumentParser:
    """Declare `qkv export`."""
    p = sub.add_parser("export", help="write a trained run (or convert a checkpoint) as a Hugging Face model "
                            "directory or a GGUF file",
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
                                   "or character tokenizer; other shapes are refused with the reason. Without "
                                   "training: --hf DIR --format gguf --out FILE converts a Hugging Face checkpoint "
                                   "to GGUF, --gguf FILE --hf OUT a GGUF file to a Hugging Face directory.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--run", metavar="DIR", help="a run directory written by `qkv train`")
    src.add_argument("--gguf", metavar="FILE", help="a GGUF file to convert to a Hugging Face directory (--hf OUT): "
                                                    "llama, qwen2 or qwen3, any type gguf dequantises")
    p.add_argument("--hf", metavar="DIR", help="with --run or --gguf: the Hugging Face directory to write (missing or "
                                               "empty); alone: the Hugging Face directory to convert (--format gguf "
                                               "--out FILE), as llama.cpp's convert_hf_to_gguf.py does")
    p.add_argument("--out", metavar="OUT", help="what to write: a directory for --format hf, a file "
                                                "(model.gguf) for --format gguf")
    p.add_argument("--format", choices=("hf", "gguf"), default="hf",
                   help="hf: a save_pretrained directory (default); gguf: one file for llama.cpp and Ollama")
    p.add_argument("--gguf-type", choices=GGUF_TYPES, default=None,
                   help="--format gguf: the matrices' type (default f16; q8_0: 8-bit blocks of 32); norms and "
                        "biases stay f32")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT (an existing GGUF file)")
    add_dtype_flag(p)
    return p


def say_warnings(caught: list) -> None:
    """Each of llama.cpp's approximations as one ``qkv export: warning:`` line; any other warning as Python shows it."""
    for w in caught:
        if issubclass(w.category, GGUFApproximation):
            print(f"qkv export: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def check_export_flags(args: argparse.Namespace) -> str:
    """Where the export writes: CommandError for flags that do not go together."""
    out = args.out or (args.hf if args.run or args.gguf else None)
    if args.run is None and args.gguf is None and args.hf is None:
        raise CommandError("give the model to export: --run DIR, --hf DIR (with --format gguf) or --gguf FILE")
    if args.run and args.format == "gguf" and args.hf:
        raise CommandError("--hf names a Hugging Face directory; with --format gguf give the file as --out FILE.gguf")
    if args.format == "hf" and args.gguf_type:
        raise CommandError(f"--gguf-type {args.gguf_type} applies to --format gguf (got --format hf)")
    if args.gguf and args.format == "gguf":
        raise CommandError(f"--gguf {args.gguf} is a GGUF file already: write it as a Hugging Face directory "
                           "(--hf OUT)")
    if not (args.run or args.gguf) and args.format == "hf":
        raise CommandError(f"--hf {args.hf} is a Hugging Face directory already: convert it with --format gguf "
                           "--out FILE.gguf")
    if out is None or (args.out and args.hf and (args.run or args.gguf)):
        raise CommandError("give one place to write: --out OUT" + (" or --hf OUT" if args.run or args.gguf else ""))
    return out


def run_export(args: argparse.Namespace) -> int:
    """Export or convert, then say what was written."""
    from ..interop.gguf.convert import gguf_to_hf, hf_to_gguf
    from ..runtime import resolve_dtype
    from ..training.export import export_run, export_run_gguf

    out, dtype = check_export_flags(args), resolve_dtype(args.dtype, "cpu")
    if args.run:
        check_directory_kind(args.run, "--run", hint=f"convert it with --hf {args.run} --format gguf --out "
                                                     "FILE.gguf (transformers loads it as it is)")
    elif args.hf and not args.gguf:
        check_directory_kind(args.hf, "--hf")
    if args.format == "gguf":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GGUFApproximation)
            kwargs = dict(dtype=dtype, overwrite=args.overwrite)
            out = export_run_gguf(args.run, out, gguf_type=args.gguf_type or "f16", **kwargs) if args.run else \
                hf_to_gguf(args.hf, out, gguf_type=args.gguf_type or "f16", **kwargs)
        say_warnings(caught)
        print(f"wrote {out}: run it with llama-cli -m {out}, or in Ollama with a Modelfile saying FROM {out}")
        return 0
    out = gguf_to_hf(args.gguf, out, dtype=dtype, overwrite=args.overwrite) if args.gguf else \
        export_run(args.run, out, dtype=dtype, overwrite=args.overwrite)
    print(f"wrote {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}) "
          f"and AutoTokenizer.from_pretrained({str(out)!r})")
    return 0
