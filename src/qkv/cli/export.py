"""`qkv export`: a trained run as a Hugging Face directory (``qkv.interop.export``)."""
from __future__ import annotations

import argparse

from .sources import check_directory_kind


def add_export(sub) -> argparse.ArgumentParser:
    """Declare `qkv export`."""
    p = sub.add_parser("export", help="write a trained run as a Hugging Face model directory",
                       description="Write a run's model and tokenizer as a directory that transformers' "
                                   "AutoModelForCausalLM and AutoTokenizer load without qkv, as the family that "
                                   "holds its shape: GPT-2 (learned positions, LayerNorm), LLaMA (RoPE, RMSNorm, "
                                   "SwiGLU; RoPE scaling kept), GPT-NeoX (RoPE, LayerNorm, GELU: the demo preset's "
                                   "shape), or a fine-tuned Qwen2, Qwen3, Mistral or Gemma 2 as itself (sliding "
                                   "windows kept); LoRA adapters merged.")
    p.add_argument("--run", required=True, metavar="DIR", help="a run directory written by `qkv train`")
    p.add_argument("--hf", required=True, metavar="OUT", help="the directory to write (missing or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    return p


def run_export(args: argparse.Namespace) -> int:
    """Export, then say what was written."""
    from ..training.export import export_run

    check_directory_kind(args.run, "--run", hint="transformers loads it as it is (qkv export writes a run's "
                                                 "model as one)")
    out = export_run(args.run, args.hf, overwrite=args.overwrite)
    print(f"wrote {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}) "
          f"and AutoTokenizer.from_pretrained({str(out)!r})")
    return 0
