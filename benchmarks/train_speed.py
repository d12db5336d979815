"""Training tokens/s: qkv GPT against Hugging Face ``GPT2LMHeadModel`` of the same shape and weights, and at
the demo's shape against nanoGPT's ``model.py``; validation bits per character of the default ``qkv train``
beside gzip -9 and xz -9e.

    python -m benchmarks.train_speed [--quick] [--threads N]      # speed (both models, one process)
    python -m benchmarks.train_speed --nanogpt PATH/TO/model.py     # also nanoGPT, eager and compiled
    python -m benchmarks.train_speed --bpc-minutes 3 [--bpc-minutes 30]   # what `qkv train` reaches
    python -m benchmarks.train_speed --sweep                        # the tokenizer / batch / lr sweep

One optimizer step = forward + cross-entropy + backward + AdamW step, on the same random batch.
The HF model is ``qkv.interop.to_hf`` of the qkv one (identical weights; the first losses must
agree), random init, HF's default attention (SDPA). Steps are interleaved round-robin and the
median is reported, so that the load of a shared machine hits both alike; the ratio is the number
to read. MFU = 6·N·tokens + attention FLOPs (PaLM appendix B) over this machine's fp32 matmul peak.

The demo-shape table (``demo_shape_rows``) builds the demo preset's width, depth, heads, context and
vocabulary with nanoGPT's own choices on the qkv side (learned positions, LayerNorm, exact GELU, biases, tied
head), so that qkv, HF and nanoGPT (imported at run time from the file ``--nanogpt`` names; no nanoGPT code is
kept here) compute the same function on the same weights (the first losses are asserted equal); AdamW, batch
16. Eager steps are interleaved as above. A compiled contender is timed over a fixed wall-clock budget
(``--budget-s``, by default the demo's 3 minutes) that starts before ``torch.compile`` and runs on an empty
inductor cache, as a fresh clone's first run does (and once more on the cache a first compile filled, as a second
run finds it): its tokens/s carry its start-up cost. qkv's paths: its reference modules eager, and through the speed
layer's training path (``qkv.kernels.training``, what ``qkv train`` runs) eager, each in fp32 and under bf16
autocast (``qkv train --bf16``), then compiled with fused AdamW (``--compile --fused-adamw``) in fp32 and in bf16.

``--bpc-minutes M`` trains the demo preset exactly as ``qkv train --max-minutes M`` does (nothing
written) and prints its validation bits per character beside the compressors'. ``--sweep`` trains
the README's table at an equal token budget (equal compute, so a busy machine only slows it down).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import io
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import qkv
from qkv.interop import to_hf
from qkv.kernels import accelerate_training

from .common import machine_info, matmul_peak_gflops, table, time_interleaved

# GPT-2 architecture (learned positions, GELU-tanh, biases, pre-LN, tied head) at CPU-friendly sizes.
SHAPES = {
    "demo-size": (qkv.ModelConfig.preset("gpt2", vocab_size=256, d_model=128, attention=dict(num_heads=4),
                                         num_layers=4, max_len=128), 32),
    "gpt2-mini": (qkv.ModelConfig.preset("gpt2", vocab_size=8192, d_model=384, attention=dict(num_heads=6),
                                         num_layers=6, max_len=256), 8),
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


def demo_gpt2_config() -> qkv.ModelConfig:
    """The demo preset's width, depth, heads, context and vocabulary with nanoGPT's choices: learned positions,
    LayerNorm, exact GELU (nanoGPT's ``nn.GELU()``), biases, tied head."""
    from qkv.models import PRESETS
    from qkv.training.tasks import task_type

    demo, (_, vocab) = PRESETS["demo"], task_type("lm").defaults.tokenizer_for("demo")
    return qkv.ModelConfig.preset("gpt2", vocab_size=vocab, d_model=demo.d_model, num_layers=demo.num_layers,
                                  max_len=demo.max_len, attention=dict(num_heads=demo.attention.num_heads),
                                  feed_forward=dict(activation="gelu"))


def load_nanogpt(path: str):
    """nanoGPT's ``model.py``, imported from ``path`` at run time; SystemExit naming what was expected."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", path) if Path(path).is_file() else None
    if spec is None:
        raise SystemExit(f"--nanogpt expects the path of nanoGPT's model.py, got {path!r} (not a file)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not (hasattr(module, "GPT") and hasattr(module, "GPTConfig")):
        raise SystemExit(f"--nanogpt {path}: expected nanoGPT's model.py (classes GPT and GPTConfig), found neither")
    return module


NANOGPT_NAMES = (("ln_1", "attn_norm"), ("attn.c_proj", "attn.out_proj"), ("ln_2", "ff_norm"),
                 ("mlp.c_fc", "ff.up_proj"), ("mlp.c_proj", "ff.down_proj"))  # nanoGPT's block <- qkv's


def nanogpt_weights(ours: qkv.GPT) -> dict[str, torch.Tensor]:
    """qkv's weights under nanoGPT's names; q, k and v packed into ``c_attn`` in the order nanoGPT splits it."""
    w = ours.state_dict()
    out = {"transformer.wte.weight": w["embed.tok.weight"], "transformer.wpe.weight": w["embed.pos.weight"],
           "lm_head.weight": w["embed.tok.weight"], "transformer.ln_f.weight": w["final_norm.weight"],
           "transformer.ln_f.bias": w["final_norm.bias"]}
    for i in range(ours.config.num_layers):
        for kind in ("weight", "bias"):
            out[f"transformer.h.{i}.attn.c_attn.{kind}"] = torch.cat([w[f"blocks.{i}.attn.{x}_proj.{kind}"]
                                                                      for x in "qkv"])
            for theirs, mine in NANOGPT_NAMES:
                out[f"transformer.h.{i}.{theirs}.{kind}"] = w[f"blocks.{i}.{mine}.{kind}"]
    return out


def build_nanogpt(module, ours: qkv.GPT) -> torch.nn.Module:
    """nanoGPT's GPT at ``ours``' shape holding its weights."""
    c = ours.config
    config = module.GPTConfig(block_size=c.max_len, vocab_size=c.vocab_size, n_layer=c.num_layers,
                              n_head=c.attention.num_heads, n_embd=c.d_model, dropout=0.0, bias=True)
    with contextlib.redirect_stdout(io.StringIO()):  # its constructor prints the parameter count
        theirs = module.GPT(config)
    theirs.load_state_dict(nanogpt_weights(ours))
    return theirs


def nanogpt_loss(model, x):
    return model(x[:, :-1].contiguous(), x[:, 1:].contiguous())[1]  # (logits, loss); it views its targets


@contextlib.contextmanager
def empty_compile_cache():
    """An empty on-disk inductor cache, as a fresh clone's first run has, and no compiled code in memory."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="qkv-bench-inductor-") as fresh:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh
        torch._dynamo.reset()
        try:
            yield
        finally:
            torch._dynamo.reset()
            if before is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def bf16_loss(loss_fn):
    """``loss_fn`` under bfloat16 autocast (``qkv train --bf16``): matrix products in bf16, weights in fp32."""
    def loss(model, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return loss_fn(model, x)

    return loss


def budget_rate(model, loss_fn, x, seconds: float, *, fused: bool, warm: bool = False) -> tuple[float, int]:
    """(tokens/s, steps) of compiled optimizer steps over ``seconds`` of wall clock that start before
    ``torch.compile``: the compile is part of the cost — on an empty cache, or with ``warm`` on a cache that a
    first compile of the same step filled (a second run's start-up), that first compile not timed."""
    with empty_compile_cache():
        if warm:
            first = copy.deepcopy(model)  # its compile fills the cache; the timed model stays as it was
            opt = torch.optim.AdamW(first.parameters(), lr=1e-4, fused=fused or None)
            step_fn(torch.compile(first, dynamic=False), loss_fn, opt, x)()
            torch._dynamo.reset()  # compiled code gone from memory; its kernels stay in the cache on disk
        t0 = time.perf_counter()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
        step, steps = step_fn(torch.compile(model, dynamic=False), loss_fn, opt, x), 0
        while time.perf_counter() - t0 < seconds:
            step()
            steps += 1
        return steps * x.size(0) * (x.size(1) - 1) / (time.perf_counter() - t0), steps


def demo_contenders(nanogpt: str | None, batch: int) -> tuple[dict, torch.Tensor]:
    """{name: (model, loss function)} at the demo's shape with nanoGPT's choices, on qkv's weights — qkv (the
    reference modules, and through the speed layer's training path), HF and, given its model.py, nanoGPT — and a
    random batch on which their losses are asserted equal."""
    config = demo_gpt2_config()
    torch.manual_seed(0)
    ours = qkv.GPT(config).train()
    contenders = {"qkv": (ours, qkv_loss), "qkv + speed layer": (accelerate_training(copy.deepcopy(ours)), qkv_loss),
                  "HF": (to_hf(ours).train(), hf_loss)}
    if nanogpt:
        contenders["nanoGPT"] = (build_nanogpt(load_nanogpt(nanogpt), ours).train(), nanogpt_loss)
    x = torch.randint(0, config.vocab_size, (batch, config.max_len + 1))
    with torch.no_grad():
        losses = {name: loss(model, x).item() for name, (model, loss) in contenders.items()}
    assert max(losses.values()) - min(losses.values()) < 1e-4, f"same weights, different losses: {losses}"
    return contenders, x


COMPILED = [  # (label, contender, fused AdamW, bf16 autocast, warm cache): qkv's fastest paths, and nanoGPT's
    ("qkv + speed layer compiled + fused AdamW", "qkv + speed layer", True, False, False),
    ("qkv + speed layer compiled + fused AdamW + bf16", "qkv + speed layer", True, True, False),
    ("qkv + speed layer compiled + fused AdamW + bf16, warm cache", "qkv + speed layer", True, True, True),
    ("nanoGPT compiled", "nanoGPT", False, False, False),
]


def eager_rates(contenders: dict, x: torch.Tensor, repeats: int) -> dict[str, tuple[float, str]]:
    """{label: (tokens/s, how)} of each contender's eager step, and qkv's two under bf16 autocast, interleaved."""
    for name in ("qkv", "qkv + speed layer"):
        model, loss = contenders[name]
        contenders[f"{name} + bf16"] = (copy.deepcopy(model), bf16_loss(loss))  # deepcopy keeps the swapped class
    tokens = x.size(0) * (x.size(1) - 1)
    steps = {name: step_fn(model, loss, torch.optim.AdamW(model.parameters(), lr=1e-4), x)
             for name, (model, loss) in contenders.items()}
    return {f"{name} eager": (tokens / sec, f"median of {repeats} interleaved steps")
            for name, sec in time_interleaved(steps, repeats=repeats, warmup=2).items()}


def demo_shape_rows(nanogpt: str | None, *, batch: int, repeats: int, budget_s: float, peak: float) -> list[list]:
    """Eager steps of each contender (and qkv's under bf16 autocast) interleaved, then qkv's compiled paths and
    nanoGPT compiled, each over ``budget_s`` of wall clock with its compile; tokens/s, the ratio to the reference
    (nanoGPT eager, else HF eager) and the fraction of the fp32 matmul peak ``peak`` (GFLOP/s)."""
    contenders, x = demo_contenders(nanogpt, batch)
    rates = eager_rates(contenders, x, repeats)
    for label, name, fused, bf16, warm in COMPILED:
        if name in contenders:
            model, loss = contenders[name]
            rate, n = budget_rate(model, bf16_loss(loss) if bf16 else loss, x, budget_s, fused=fused, warm=warm)
            rates[label] = (rate, f"{n} step{'s' * (n != 1)} in {budget_s:g} s, {'warm' if warm else 'cold'} "
                                  "compile included")
    ref = "nanoGPT eager" if nanogpt else "HF eager"
    flops = flops_per_token(contenders["qkv"][0].config, x.size(1) - 1)
    return [[label, f"{rate:.0f}", f"{rate / rates[ref][0]:.2f}x", f"{100 * rate * flops / (peak * 1e9):.1f}%", note]
            for label, (rate, note) in rates.items()]


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
    p.add_argument("--quick", action="store_true", help="only the demo-size shape, fewer repeats, short budgets")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: qkv's choice for training)")
    p.add_argument("--nanogpt", metavar="PATH", help="nanoGPT's model.py: also time nanoGPT at the demo's shape")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock seconds each compiled contender runs, its compile included (default: 180, "
                        "the demo's budget; 10 with --quick)")
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
    return speed_tables(args)


def speed_tables(args: argparse.Namespace) -> str:
    """The qkv / HF table over SHAPES, then the demo-shape table (with nanoGPT when given)."""
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
    c = demo_gpt2_config()
    print(f"\nthe demo's shape with nanoGPT's choices (d_model {c.d_model}, {c.num_layers} layers, "
          f"{c.attention.num_heads} heads, context {c.max_len}, vocabulary {c.vocab_size}; learned positions, LayerNorm, GELU, biases), "
          "AdamW, batch 16:")
    budget = args.budget_s or (10.0 if args.quick else 180.0)
    if torch.cuda.is_available():  # the demo-shape contenders run on the CPU: their fraction is of the CPU's peak
        peak = matmul_peak_gflops((1024,) if args.quick else (1024, 2048, 3072), device="cpu")
        print(f"fp32 matmul peak of this CPU (the demo-shape rows): {peak:.0f} GFLOP/s")
    demo = table(demo_shape_rows(args.nanogpt, batch=16, repeats=5 if args.quick else 21, budget_s=budget, peak=peak),
                 ["contender", "tok/s", "vs nanoGPT eager" if args.nanogpt else "vs HF eager", "of matmul peak",
                  "measured as"])
    print(demo)
    return out + "\n\n" + demo


if __name__ == "__main__":
    main()
