"""bf16 weights for decoding (opt-in: ``qkv sample --dtype bfloat16``): their speed beside fp32's, and their cost.

    python -m benchmarks.low_precision [--run DIR] [--quick] [--no-compile]

Speed: the `generation` benchmark's model (GPT-2's shape at CPU size, 23.6 M parameters; 92.4 MB
of weights in fp32, 46.2 MB in bf16), greedy at batch 1, prompt 16 tokens, 128 new (32 with
--quick), eager and compiled (inductor's step for bf16 and fp32 alike), each dtype beside fp32,
interleaved, medians; how many of the new tokens agree with fp32's. First, the rates at which one large
matrix streams in each type.
Cost: a trained run's bits per character on its whole held-out text (its final ``val_bpc``), with
its fp32 weights and with the same weights rounded to bf16. ``make demo`` writes the default run,
runs/demo; without it the cost is not measured (and the benchmark says so).
"""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import machine_info, stream_seconds, table, time_interleaved
from .generation import CONFIG, PROMPT, build, weight_bytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def decode_speed(new: int, compile: bool, repeats: int) -> list[list]:
    """Rows (dtype, MB per token, eager tok/s, compiled tok/s, eager / fp32, compiled / fp32, tokens as fp32's)."""
    model, _ = build()
    models = {name: copy.deepcopy(model).to(dtype) for name, dtype in DTYPES.items()}
    ids = torch.randint(0, CONFIG.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    calls = {}
    for name, m in models.items():
        calls[f"{name} eager"] = lambda m=m: m.generate(ids, new, temperature=0)
        if compile:
            calls[f"{name} compiled"] = lambda m=m: m.generate(ids, new, temperature=0, compile="inductor")
    with torch.inference_mode():
        tokens = {name: fn()[0, PROMPT:] for name, fn in calls.items()}
        seconds = time_interleaved(calls, repeats=repeats, warmup=0)
    tps = {name: new / s for name, s in seconds.items()}
    rows = []
    for name, m in models.items():
        eager, comp = tps[f"{name} eager"], tps.get(f"{name} compiled")
        agree = (tokens[f"{name} eager"] == tokens["fp32 eager"]).float().mean().item()
        rows.append([name, f"{weight_bytes(m) / 1e6:.1f}", f"{eager:.0f}", "-" if comp is None else f"{comp:.0f}",
                     f"{eager / tps['fp32 eager']:.2f}x",
                     "-" if comp is None else f"{comp / tps['fp32 compiled']:.2f}x", f"{agree:.0%}"])
    return rows


def matvec_rates(megabytes: int = 128) -> str:
    """GB/s of weights streamed by one matrix-vector product over a ``megabytes`` fp32 matrix, as stored in
    fp32 and bf16 (``qkv.linear``: qkv's kernel where it is built; ``F.linear``: MKL's fp32, oneDNN's bf16)
    and int8 (``torch.ao`` dynamic quantization): whether fewer bytes also stream as fast."""
    import warnings

    from qkv.kernels.linear import linear

    cols = 4096
    lin = torch.nn.Linear(cols, megabytes * 2**20 // (4 * cols), bias=False)
    with warnings.catch_warnings():  # torch.ao's eager quantization warns that it is deprecated (torchao replaces it)
        warnings.simplefilter("ignore")
        int8 = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
    x, w = torch.randn(1, cols), lin.weight.detach()
    x16, w16 = x.bfloat16(), w.bfloat16()
    calls = {"fp32 qkv.linear": (lambda: linear(x, w), 4), "fp32 F.linear": (lambda: F.linear(x, w), 4),
             "bf16 qkv.linear": (lambda: linear(x16, w16), 2), "bf16 F.linear": (lambda: F.linear(x16, w16), 2),
             "int8": (lambda: int8(x), 1)}
    with torch.inference_mode():
        rates = {name: w.numel() * size / stream_seconds(fn, 15) / 1e9 for name, (fn, size) in calls.items()}
    return (f"one {w.size(0)} x {cols} matrix times a vector, GB/s of weights streamed: "
            + ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items()))


def quality(run_dir: Path) -> str:
    """Held-out bits per character of a trained run with fp32 and with bf16 weights."""
    from qkv.training.run_dir import load_run
    from qkv.data import load_corpus
    from qkv.training.tasks.language_model import held_out_bpc

    run = load_run(run_dir)
    cfg = json.loads((run_dir / "train_config.json").read_text())
    text = load_corpus(cfg["data"]).val
    T = cfg["context"] or run.config.max_len
    bpc = {name: held_out_bpc(copy.deepcopy(run.model).to(dtype), run.tokenizer, text, T)
           for name, dtype in DTYPES.items()}
    stored = json.loads((run_dir / "summary.json").read_text())["val_bpc"]
    return (f"{run_dir}: {run.model.num_parameters() / 1e6:.2f} M parameters, {len(text)} held-out characters; "
            f"bits per character fp32 {bpc['fp32']:.4f} (the run's summary: {stored:.4f}), bf16 weights "
            f"{bpc['bf16']:.4f} ({bpc['bf16'] - bpc['fp32']:+.4f}, {bpc['bf16'] / bpc['fp32'] - 1:+.2%})")


HEADER = ["weights", "MB per token", "eager tok/s", "compiled tok/s", "eager / fp32", "compiled / fp32",
          "new tokens as fp32's"]


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, default=Path("runs/demo"), help="a trained LM run (default runs/demo)")
    p.add_argument("--quick", action="store_true", help="32 new tokens, fewer repeats")
    p.add_argument("--no-compile", action="store_true", help="eager only")
    args = p.parse_args(argv)
    print(machine_info())
    print(matvec_rates())
    out = table(decode_speed(32 if args.quick else 128, not args.no_compile, 3 if args.quick else 5), HEADER)
    print(out)
    if (args.run / "summary.json").is_file():
        print(quality(args.run))
    else:
        print(f"{args.run}: no trained run there (make demo writes runs/demo): the quality cost was not measured")
    return out


if __name__ == "__main__":
    main()
