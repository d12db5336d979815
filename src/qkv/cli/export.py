"""`qkv export`: a trained run as a Hugging Face directory (``qkv.interop.export``)."""
from __future__ import annotations

import argparse


def add_export(sub) -> argparse.ArgumentParser:
    """Declare `qkv export`."""
    p = sub.add_parser("export", help="write a trained run as a Hugging Face model directory",
                       description="Write a run's model and tokenizer as a directory that transformers' "
                                   "AutoModelForCausalLM and AutoTokenizer load without qkv: GPT-2 (learned "
                                   "positions, LayerNorm), LLaMA (RoPE, RMSNorm, SwiGLU) or GPT-NeoX (RoPE, "
                                   "LayerNorm, GELU: the demo preset's shape); LoRA adapters merged.")
    p.add_argument("--run", required=True, metavar="DIR", help="a run directory written by `qkv train`")
    p.add_argument("--hf", required=True, metavar="OUT", help="the directory to write (missing or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    return p


def run_export(args: argparse.Namespace) -> int:
    """Export, then say what was written."""
    from ..training.export import export_run

    out = export_run(args.run, args.hf, overwrite=args.overwrite)
    print(f"wrote {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}) "
          f"and AutoTokenizer.from_pretrained({str(out)!r})")
    return 0
