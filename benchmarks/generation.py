"""Greedy generation tokens/s: qkv GPT with its static KV cache, without a cache, and Hugging Face
``GPT2LMHeadModel.generate`` on the identical weights (``qkv.interop.to_hf``); tokens must agree.

    python -m benchmarks.generation [--quick] [--compile]

Prompt 16 tokens, 256 new (64 with --quick), batch 1 and 8; one timed run after a warm-up.
"""
from __future__ import annotations

import argparse
import time

import torch

import qkv
from qkv.interop import to_hf

from .common import machine_info, sync, table

# A GPT-2-shaped model small enough for CPU (GPT-2's vocabulary and positions, 4 layers of width 256).
CONFIG = qkv.ModelConfig.preset("gpt2", d_model=256, num_heads=4, num_layers=4)


def timed(fn):
    fn()  # warm-up (and, with --compile, the one compilation)
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def run(model, hf, batch: int, new: int, *, uncached: bool, compile: bool) -> list:
    device = model.lm_head.weight.device
    ids = torch.randint(0, CONFIG.vocab_size, (batch, 16), generator=torch.Generator().manual_seed(batch)).to(device)
    calls = {"qkv cached": lambda: model.generate(ids, new, temperature=0)}
    if compile:
        calls["qkv compiled"] = lambda: model.generate(ids, new, temperature=0, compile=True)
    if uncached:
        calls["qkv no cache"] = lambda: model.generate(ids, new, temperature=0, use_cache=False)
    calls["HF generate"] = lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                               min_new_tokens=new, do_sample=False, pad_token_id=0)
    results = {name: timed(fn) for name, fn in calls.items()}
    reference = results["qkv cached"][0]
    for name, (tokens, _) in results.items():
        assert torch.equal(tokens, reference), f"{name} generated different tokens from qkv cached"
    tps = {name: batch * new / t for name, (_, t) in results.items()}
    row = [batch, new] + [f"{tps[n]:.0f}" if n in tps else "-" for n in ("qkv cached", "qkv compiled", "qkv no cache",
                                                                            "HF generate")]
    row += [f"{tps['qkv cached'] / tps['HF generate']:.2f}x",
            f"{tps['qkv cached'] / tps['qkv no cache']:.1f}x" if "qkv no cache" in tps else "-"]
    return row


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="64 new tokens; no uncached run at batch 8")
    p.add_argument("--compile", action="store_true", help="also time the torch.compile'd decode step")
    args = p.parse_args(argv)
    print(machine_info())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = qkv.GPT(CONFIG).to(device).eval()
    hf = to_hf(model)
    print(f"model: GPT-2 shape, d_model={CONFIG.d_model}, layers={CONFIG.num_layers}, vocab={CONFIG.vocab_size}, "
          f"{model.num_parameters() / 1e6:.1f} M parameters; HF attention: {hf.config._attn_implementation}")
    new = 64 if args.quick else 256
    rows = [run(model, hf, 1, new, uncached=True, compile=args.compile),
            run(model, hf, 8, new, uncached=not args.quick, compile=args.compile)]
    out = table(rows, ["batch", "new tokens", "qkv cached tok/s", "qkv compiled tok/s", "qkv no cache tok/s",
                       "HF tok/s", "cached / HF", "cached / no cache"])
    print(out)
    print("all columns produced identical tokens (asserted)")
    return out


if __name__ == "__main__":
    main()
