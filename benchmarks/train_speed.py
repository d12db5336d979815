"""Training tokens/s: qkv GPT against Hugging Face ``GPT2LMHeadModel`` of the same shape and weights;
and validation bits per character of the default ``qkv train`` beside gzip -9 and xz -9e.

    python -m benchmarks.train_speed [--quick] [--threads N]      # speed (both models, one process)
    python -m benchmarks.train_speed --bpc-minutes 3 [--bpc-minutes 30]   # what `qkv train` reaches
    python -m benchmarks.train_speed --sweep                        # the tokenizer / batch / lr sweep

One optimizer step = forward + cross-entropy + backward + AdamW step, on the same random batch.
The HF model is ``qkv.interop.to_hf`` of the qkv one (identical weights; the first losses must
agree), random init, HF's default attention (SDPA). Steps are interleaved round-robin and the
median is reported, so that the load of a shared machine hits both alike; the ratio is the number
to read. MFU = 6·N·tokens + attention FLOPs (PaLM appendix B) over this machine's fp32 matmul peak.

``--bpc-minutes M`` trains the demo preset exactly as ``qkv train --max-minutes M`` does (nothing
written) and prints its validation bits per character beside the compressors'. ``--sweep`` trains
the README's table at an equal token budget (equal compute, so a busy machine only slows it down).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import qkv
from qkv.interop import to_hf

from .common import machine_info, matmul_peak_gflops, table, time_interleaved

# GPT-2 architecture (learned positions, GELU-tanh, biases, pre-LN, tied head) at CPU-friendly sizes.
SHAPES = {
    "demo-size": (qkv.ModelConfig.preset("gpt2", vocab_size=256, d_model=128, num_heads=4, num_layers=4, max_len=128), 32),
    "gpt2-mini": (qkv.ModelConfig.preset("gpt2", vocab_size=8192, d_model=384, num_heads=6, num_layers=6, max_len=256), 8),
}


def flops_per_token(c: qkv.ModelConfig, T: int) -> float:
    """Training FLOPs per token: 6 per weight (forward + backward) plus attention's 12·L·T·d."""
    n = c.num_layers * (4 * c.d_model**2 + 2 * c.d_model * c.ff_width) + c.d_model * c.vocab_size
    return 6 * n + 12 * c.num_layers * T * c.d_model


def step_fn(model, forward, opt, x):
    def step():
        loss = forward(model, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def qkv_loss(model, x):
    return model(x[:, :-1], targets=x[:, 1:]).loss


def hf_loss(model, x):
    logits = model(input_ids=x[:, :-1]).logits  # (B, T, V); the same next-token loss on every position
    return F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())


def measure(name: str, config: qkv.ModelConfig, batch: int, repeats: int, peak: float) -> list:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    ours = qkv.GPT(config).to(device).train()
    theirs = to_hf(ours).to(device).train()
    T = config.max_len
    x = torch.randint(0, config.vocab_size, (batch, T + 1), device=device)
    with torch.no_grad():
        a, b = qkv_loss(ours, x).item(), hf_loss(theirs, x).item()
    assert abs(a - b) < 1e-4, f"same weights, different losses: qkv {a} vs HF {b}"
    steps = {"qkv": step_fn(ours, qkv_loss, torch.optim.AdamW(ours.parameters(), lr=1e-4), x),
             "HF": step_fn(theirs, hf_loss, torch.optim.AdamW(theirs.parameters(), lr=1e-4), x)}
    sec = time_interleaved(steps, repeats=repeats, warmup=2)
    tokens = batch * T
    tps = {k: tokens / v for k, v in sec.items()}
    mfu = {k: tps[k] * flops_per_token(config, T) / (peak * 1e9) for k in tps}
    return [name, f"{ours.num_parameters() / 1e6:.2f} M", f"{batch}x{T}", f"{tps['qkv']:.0f}", f"{tps['HF']:.0f}",
            f"{tps['qkv'] / tps['HF']:.2f}x", f"{100 * mfu['qkv']:.1f}% / {100 * mfu['HF']:.1f}%"]


SWEEP = [  # (label, TrainConfig overrides); d_model 128, 4 layers, 4 heads, RoPE, context 128, 1 M tokens
    ("characters, batch 32, lr 3e-3", dict(tokenizer="char", batch_size=32, lr=3e-3)),
    ("characters, batch 32, lr 6e-3", dict(tokenizer="char", batch_size=32, lr=6e-3)),
    ("characters, batch 16, lr 3e-3", dict(tokenizer="char", batch_size=16, lr=3e-3)),
    ("BPE 512, batch 32, lr 3e-3", dict(tokenizer="bpe", vocab_size=512, batch_size=32, lr=3e-3)),
    ("BPE 1024, batch 32, lr 3e-3", dict(tokenizer="bpe", vocab_size=1024, batch_size=32, lr=3e-3)),
    ("BPE 1024, batch 32, lr 6e-3", dict(tokenizer="bpe", vocab_size=1024, batch_size=32, lr=6e-3)),
    ("BPE 1024, batch 16, lr 6e-3", dict(tokenizer="bpe", vocab_size=1024, batch_size=16, lr=6e-3)),
    ("BPE 1024, batch 8, lr 6e-3", dict(tokenizer="bpe", vocab_size=1024, batch_size=8, lr=6e-3)),
]


def bpc_run(minutes: float | None = None, *, max_tokens: int | None = None, **overrides) -> dict:
    """Train the demo preset (``qkv train``'s defaults unless overridden); its summary."""
    from qkv.training.recipe import TrainConfig, train

    cfg = TrainConfig(max_minutes=minutes, max_tokens=max_tokens, progress=False, **overrides)
    return train(cfg).summary


def bpc_row(label: str, s: dict) -> list:
    return [label, s["steps"], f"{s['tokens'] / 1e6:.2f} M", f"{s['tokens_per_s']:.0f}", f"{s['val_bpc']:.3f}",
            f"{s['gzip_bpc']:.3f}", f"{s['xz_bpc']:.3f}"]


BPC_HEADER = ["run", "steps", "tokens", "tok/s", "val bpc", "gzip -9 bpc", "xz -9e bpc"]


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="only the demo-size shape, fewer repeats")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: qkv's choice for training)")
    p.add_argument("--bpc-minutes", type=float, action="append", default=[],
                   help="also train the default `qkv train` for this many minutes and report its bpc (repeatable)")
    p.add_argument("--sweep", action="store_true", help="train the sweep (1 M tokens each) instead of timing")
    args = p.parse_args(argv)
    if args.sweep or args.bpc_minutes:
        rows = [bpc_row(f"qkv train --max-minutes {m:g}", bpc_run(m, threads=args.threads)) for m in args.bpc_minutes]
        if args.sweep:
            model = qkv.ModelConfig.preset("demo", d_model=128)  # the sweep ran before the demo became 96 wide
            rows += [bpc_row(label, bpc_run(max_tokens=1_000_000, model=model, threads=args.threads, **kw))
                     for label, kw in SWEEP]
        out = table(rows, BPC_HEADER)
        print(out)
        return out
    if not torch.cuda.is_available():
        from qkv.training.recipe import cpu_threads

        torch.set_num_threads(args.threads or cpu_threads())
    print(machine_info())
    peak = matmul_peak_gflops((1024,) if args.quick else (1024, 2048, 3072))
    print(f"fp32 matmul peak here: {peak:.0f} GFLOP/s")
    names = ["demo-size"] if args.quick else list(SHAPES)
    rows = [measure(n, *SHAPES[n], repeats=7 if args.quick else 15, peak=peak) for n in names]
    out = table(rows, ["shape", "params", "batch", "qkv tok/s", "HF tok/s", "qkv / HF", "MFU qkv / HF"])
    print(out)
    print("median of interleaved optimizer steps; identical weights and batch (first losses asserted equal)")
    return out


if __name__ == "__main__":
    main()
