"""The demo's levers side by side: train the demo recipe for the same wall-clock budget with each variant, one
after the other, and print held-out bits per character beside gzip -9 and xz -9e.

    python -m benchmarks.demo_levers --minutes 3                          # every variant
    python -m benchmarks.demo_levers --minutes 3 --variant baseline --variant muon+wsd
    python -m benchmarks.demo_levers --list                               # the variants and what each sets

Each run is ``qkv train --max-minutes M`` with the variant's settings (``train_speed.bpc_run``: nothing
written); ``a+b`` combines variants. The variants run one after the other, so on a shared machine the load
differs between them: rerun, or alternate the order, before reading a small difference.
"""
from __future__ import annotations

import argparse
import dataclasses

import qkv
from qkv.training.tasks import task_type

from .common import table
from .train_speed import BPC_HEADER, bpc_row, bpc_run


def demo_model(**flat) -> dict:
    """Settings that train another model shape on the demo's own tokenizer (a given model would otherwise
    train on characters)."""
    kind, vocab = task_type("lm").defaults.tokenizer_for("demo")
    return {"model": qkv.ModelConfig.preset("demo", **flat), "tokenizer": kind, "vocab_size": vocab}


def demo_sections(**sections) -> dict:
    """``demo_model`` with fields of the demo's config sections replaced: ``attention={"qk_norm": True}``."""
    demo = qkv.ModelConfig.preset("demo")
    changed = {name: dataclasses.replace(getattr(demo, name), **fields) for name, fields in sections.items()}
    return demo_model() | {"model": demo.replace(**changed)}


LR = task_type("lm").defaults.lr  # the demo's peak learning rate
VARIANTS = {  # name -> (what it changes, TrainConfig settings; None: a model_variant)
    "baseline": ("the default recipe", {}),
    "muon": ("Muon for the hidden matrices, AdamW for the rest", {"optimizer": "muon"}),
    "adamw": ("AdamW for every weight (the demo's optimizer before Muon)", {"optimizer": "adamw"}),
    "muon-lr2x": ("Muon at twice the peak learning rate, AdamW's unchanged", {"optimizer": "muon", "muon_lr": 2 * LR}),
    "wsd": ("warmup-stable-decay schedule", {"schedule": "wsd"}),
    "lr-half": ("half the peak learning rate", {"lr": LR / 2}),
    "lr-2x": ("twice the peak learning rate", {"lr": 2 * LR}),
    "threads1": ("one CPU thread", {"threads": 1}),
    "threads2": ("two CPU threads", {"threads": 2}),
    "compile": ("torch.compile'd model (the compile counted)", {"compile": True}),
    "fused-adamw": ("AdamW's fused CPU kernel", {"fused_adamw": True}),
    "bf16": ("bfloat16 autocast", {"bf16": True}),
    "batch8": ("8 sequences per step", {"batch_size": 8}),
    "batch32": ("32 sequences per step", {"batch_size": 32}),
    "vocab1024": ("BPE vocabulary 1024", {"vocab_size": 1024}),
    "vocab4096": ("BPE vocabulary 4096", {"vocab_size": 4096}),
    "wide": ("d_model 128, 2 layers", None),
    "deep": ("d_model 64, 8 layers", None),
    "untied": ("output head apart from the embedding", None),
    "qk-norm": ("RMS-normed queries and keys", None),
}


def settings(name: str) -> dict:
    """The TrainConfig settings of variant ``name`` (``a+b``: both); SystemExit naming the known ones."""
    merged: dict = {}
    for part in name.split("+"):
        if part not in VARIANTS:
            raise SystemExit(f"unknown variant {part!r}; choose from {', '.join(VARIANTS)} (a+b combines)")
        merged |= VARIANTS[part][1] if VARIANTS[part][1] is not None else model_variant(part)
    return merged


def model_variant(name: str) -> dict:
    """The settings of a variant that changes the model (built when asked for)."""
    return {"wide": lambda: demo_model(d_model=128, num_layers=2),
            "deep": lambda: demo_model(d_model=64, num_layers=8),
            "untied": lambda: demo_sections(head={"tie": False}),
            "qk-norm": lambda: demo_sections(attention={"qk_norm": True})}[name]()


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=3.0, help="wall-clock budget of each run (default 3, the demo's)")
    p.add_argument("--variant", action="append", metavar="NAME", help="a variant to run (repeatable; a+b "
                   "combines two; default: every variant)")
    p.add_argument("--seed", type=int, default=1337, help="the runs' seed (default 1337, the demo's)")
    p.add_argument("--list", action="store_true", help="list the variants and stop")
    args = p.parse_args(argv)
    if args.list:
        out = table([[name, what] for name, (what, _) in VARIANTS.items()], ["variant", "what it changes"])
        print(out)
        return out
    plans, rows = {name: settings(name) for name in args.variant or VARIANTS}, []  # a typo stops before any run
    for name, plan in plans.items():
        s = bpc_run(args.minutes, seed=args.seed, **plan)
        rows.append(bpc_row(name, s) + [s.get("threads"), f"{s['val_bpc'] / s['xz_bpc']:.3f}"])
        print(f"{name}: val bpc {s['val_bpc']:.3f} (xz -9e {s['xz_bpc']:.3f}) after {s['steps']} steps", flush=True)
    out = table(rows, ["variant"] + BPC_HEADER[1:] + ["threads", "bpc / xz"])
    print(f"\neach variant trained for {args.minutes:g} min (qkv train --max-minutes), one after the other:")
    print(out)
    return out


if __name__ == "__main__":
    main()
