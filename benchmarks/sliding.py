"""Sliding-window decoding on each backend: a Mistral-shaped model's batch-1 greedy tokens/s.

    python -m benchmarks.sliding [--quick] [--markdown DOCS]

Model: a random-initialised ``qkv.GPT`` shaped as Mistral — d_model 512, 8 layers, 8 query and 2 key/value heads,
a sliding window of 64 keys in every layer (each layer's cache a ``RingKVCache`` of 64 slots), RoPE, SwiGLU
d_ff 1408, pre-norm RMSNorm, vocabulary 8000, tied head. Prompt 32 tokens, 256 new (64 with --quick), greedy,
fp32, batch 1: the decoding runs past the window four times. Contenders interleaved, one ``generate`` call each,
median tokens/s of 5 rounds (3 with --quick) after a warm-up call (inductor's compile, untimed). "fused" is what
``backend="fused"`` runs: qkv's C++ step where ``qkv.kernels.fused_step`` accepts the model, else its fallback,
the reason printed. Every contender's tokens are asserted equal to eager's.
``--markdown DOCS`` writes DOCS/generated/sliding.md (and .zh.md, .json) through ``common.write_generated``.
"""
from __future__ import annotations

import argparse

import torch

import qkv
from qkv.generation.backends import backend_for

from .common import publish, table, time_interleaved

SHAPE = dict(vocab_size=8000, d_model=512, num_layers=8, max_len=512,
             attention=dict(num_heads=8, num_kv_heads=2, sliding_window=64), position=dict(kind="rope"),
             feed_forward=dict(d_ff=1408, activation="swiglu"), normalization=dict(kind="rmsnorm", first=True),
             head=dict(tie=True))
PROMPT = 32


def model() -> qkv.GPT:
    torch.manual_seed(0)
    return qkv.GPT(qkv.ModelConfig(**SHAPE)).eval()


def measure(new: int, repeats: int) -> dict:
    """{"results": {backend: tok/s}, "ran": {backend: what decoded}, "why": {backend: fallback reason}, ...}."""
    m = model()
    ids = torch.randint(0, SHAPE["vocab_size"], (1, PROMPT), generator=torch.Generator().manual_seed(1))
    ran, why = {}, {}
    for backend in ("eager", "auto", "inductor", "fused"):
        ran[backend], reason = backend_for(m, 1, backend)
        if reason:
            why[backend] = reason
    calls = {b: (lambda b=b: m.generate(ids, new, temperature=0, backend=ran[b])) for b in ran}
    with torch.inference_mode():
        want = calls["eager"]()
        for b, call in calls.items():  # the warm-up: inductor compiles here
            assert torch.equal(call(), want), f"{b}'s tokens differ from eager's"
        seconds = time_interleaved(calls, repeats=repeats, warmup=0)
    return {"results": {b: new / s for b, s in seconds.items()}, "ran": ran, "why": why,
            "params_m": sum(p.numel() for p in m.parameters()) / 1e6, "new": new}


def body(saved: dict, lang: str) -> str:
    """The page's text: the setting, the table and each fallback's reason."""
    res, ran, eager = saved["results"], saved["ran"], saved["results"]["eager"]
    rows = [[b, ran[b], f"{res[b]:.0f}", f"{res[b] / eager:.2f}x"] for b in res]
    zh = lang == "zh"
    header = ["后端（要求）", "实际运行", "tokens/s", "相对 eager"] if zh else [
        "backend asked", "ran", "tokens/s", "vs eager"]
    setting = (f"Mistral 形状的 qkv.GPT（{saved['params_m']:.1f} M 参数，8 层全部为 64 个键的滑动窗口，8 个查询头 / "
               f"2 个键值头），batch 1，提示 {PROMPT} 个 token，贪心生成 {saved['new']} 个，fp32；交替运行，取中位数；"
               "各后端的 token 均与 eager 相同。") if zh else (
        f"A Mistral-shaped qkv.GPT ({saved['params_m']:.1f} M parameters, all 8 layers sliding over 64 keys, "
        f"8 query / 2 key-value heads), batch 1, prompt {PROMPT} tokens, {saved['new']} greedy new ones, fp32; "
        "interleaved, medians; every backend's tokens equal eager's.")
    notes = [f"- {b} → {ran[b]}: {reason}" for b, reason in saved["why"].items()]
    return "\n".join([setting, "", table(rows, header)] + ([""] + notes if notes else []))


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="64 new tokens, 3 rounds")
    p.add_argument("--markdown", metavar="DOCS", default=None)
    args = p.parse_args(argv)
    saved = measure(64 if args.quick else 256, 3 if args.quick else 5)
    return publish("sliding", saved, lambda lang: body(saved, lang), argv, args.markdown)


if __name__ == "__main__":
    main()
