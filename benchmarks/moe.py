"""The mixture-of-experts feed-forward's dispatches beside Hugging Face's Mixtral block, and MoE training steps, on a CPU.

    python -m benchmarks.moe [--quick] [--markdown docs]

One ``qkv.nn.moe.MixtureOfExperts`` layer (softmax router, top-k renormalised, SwiGLU experts), fp32, at a few
(tokens N, width C, expert width I, experts E, k) shapes: ``reference_dispatch`` (a loop over experts, each
finding its tokens with torch.where over the (N, k) choices), ``grouped_dispatch`` (the N·k assignments sorted
by expert once, one gather, one contiguous slice and product per expert, the outputs gathered back), the training
speed layer's ``grouped_mm_dispatch`` (the same with each product one torch._grouped_mm over every expert's
slice) and transformers' ``MixtralSparseMoeBlock`` given the same weights (its default experts implementation).
Forward at inference, and forward + backward. Calls alternate round-robin; each time is the median of its rounds,
so ratios come from one run. The largest difference from the reference's output is printed beside.

Then a training step of whole GPTs (forward + backward, then the optimizer step, each timed) as ``qkv train``
takes it (the training speed layer on, the layer's default dispatch: grouped; ``qkv train``'s optimizers: AdamW,
its default for a model of its own shape as these are, ``--optimizer muon``, and AdamW ``--fused-adamw``): a
dense SwiGLU GPT against an MoE GPT of equal active parameters (E experts of width d_ff / k, top-k), in fp32
(the default for a model of its own shape) and under bf16 autocast (``--bf16``) interleaved, at
``qkv train``'s default batch (16 sequences) and at 64, at torch's threads and then at one thread; the ratio MoE
÷ dense is the one the MoE training issue holds to ≤ 1.3.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from qkv.kernels import accelerated
from qkv.kernels.moe_training import grouped_mm_dispatch
from qkv.nn.moe import MixtureOfExperts, Router, SwiGLUExperts, grouped_dispatch, reference_dispatch

from .common import machine_info, table, time_interleaved, write_generated

SHAPES = [(512, 512, 1024, 8, 2), (2048, 512, 1024, 8, 2), (512, 256, 256, 64, 8)]  # N, C, I, E, k
QUICK = [(256, 256, 512, 8, 2), (256, 128, 128, 32, 4)]


def layer(C: int, I: int, E: int, k: int) -> MixtureOfExperts:
    return MixtureOfExperts(Router(C, E, k), SwiGLUExperts(E, C, I))


def hf_block(m: MixtureOfExperts):
    """transformers' MixtralSparseMoeBlock holding ``m``'s weights; None without transformers."""
    try:
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    except ImportError:
        return None
    e = m.experts
    E, I, C = e.gate_proj.shape
    block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=C, intermediate_size=I, num_local_experts=E,
                                                num_experts_per_tok=m.router.top_k))
    with torch.no_grad():
        block.gate.weight.copy_(m.router.weight)
        block.experts.gate_up_proj.copy_(torch.cat([e.gate_proj, e.up_proj], dim=1))
        block.experts.down_proj.copy_(e.down_proj)
    return block


def measure_shape(shape: tuple, repeats: int) -> list[list]:
    N, C, I, E, k = shape
    torch.manual_seed(0)
    m, x = layer(C, I, E, k), torch.randn(1, N, C)
    hf = hf_block(m)
    paths = {"reference": lambda x: m.run(x, reference_dispatch), "grouped": lambda x: m.run(x, grouped_dispatch),
             "grouped, torch._grouped_mm (training)": lambda x: m.run(x, grouped_mm_dispatch)}
    if hf is not None:
        paths["transformers Mixtral block"] = hf
    with torch.inference_mode():
        forward = time_interleaved({p: (lambda f=f: f(x)) for p, f in paths.items()}, repeats=repeats)
        diff = {p: f"{(paths[p](x) - paths['reference'](x)).abs().max().item():.1e}" for p in paths if "grouped" in p}
    xg = x.clone().requires_grad_()
    backward = time_interleaved({p: (lambda f=f: f(xg).square().sum().backward()) for p, f in paths.items()},
                                repeats=repeats)
    return [[f"N={N} C={C} I={I} E={E} k={k}", p, f"{forward[p] * 1e3:.2f}",
             f"{forward['reference'] / forward[p]:.2f}", f"{backward[p] * 1e3:.2f}",
             f"{backward['reference'] / backward[p]:.2f}", diff.get(p, "")] for p in paths]


TRAIN_SHAPES = [(256, 4, 1024, 8, 2, 16, 128), (256, 4, 1024, 8, 2, 64, 128)]  # d_model, layers, d_ff, E, k, B, T
TRAIN_QUICK = [(64, 2, 256, 4, 2, 4, 64)]


def training_step(model, ids: torch.Tensor, opt, bf16: bool, split: list) -> None:
    """One step as ``qkv train`` takes it (the training speed layer on, the forward under bf16 autocast or not);
    appends (forward + backward seconds, optimizer seconds) to ``split``."""
    t0 = time.perf_counter()
    with accelerated(model, training=True), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        loss = model(ids, targets=ids).loss
    loss.backward()
    t1 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    split.append((t1 - t0, time.perf_counter() - t1))


OPTIMIZERS = {"adamw": dict(optimizer="adamw"), "muon": dict(optimizer="muon"),
              "adamw fused": dict(optimizer="adamw", fused_adamw=True)}
TRAIN_RUNS = [("fp32", "adamw"), ("fp32", "muon"), ("bf16 autocast", "adamw"), ("bf16 autocast", "muon"),
              ("bf16 autocast", "adamw fused")]  # (precision, optimizer) of each pair of rows; the first is
# what `qkv train --model moe.num_experts=E ...` takes for a model of its own shape (AdamW, fp32)


def train_optimizer(model, kind: str):
    """The optimizer ``qkv train`` builds for ``model`` on a CPU: ``--optimizer adamw`` (its default for a model
    of its own shape), ``--optimizer muon`` (Muon on the hidden matrices, each expert's included, AdamW on the
    rest: the presets' default from scratch), or AdamW with ``--fused-adamw``."""
    from qkv.training.config import TrainConfig
    from qkv.training.optim import build_optimizer

    cfg = TrainConfig(max_steps=1, lr=1e-4, device="cpu", **OPTIMIZERS[kind])
    return build_optimizer(model, cfg, torch.device("cpu"))


def training_models(shape: tuple) -> dict:
    """A dense SwiGLU GPT and an MoE GPT of its active parameters (E experts of width d_ff / k, top-k)."""
    from qkv.models import GPT, ModelConfig

    C, L, F, E, k, B, T = shape
    base = dict(vocab_size=256, d_model=C,
                attention=dict(num_heads=4, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False, d_ff=F),
                normalization=dict(kind="rmsnorm"), num_layers=L, max_len=T)
    torch.manual_seed(0)
    return {"dense": GPT(ModelConfig(**base)).train(),
            "moe": GPT(ModelConfig(**base, moe=dict(num_experts=E, top_k=k, d_expert=F // k))).train()}


def measure_training(shape: tuple, runs: list[tuple[str, str]], repeats: int) -> list[list]:
    """Milliseconds of a training step and of its two parts (forward + backward, optimizer), dense against MoE,
    in the (precision, optimizer) ``runs`` (of ``TRAIN_RUNS``), interleaved; at torch's
    threads, then at one thread (the count changes between runs only: changing it between calls would rebuild
    the thread pool each time)."""
    C, L, F, E, k, B, T = shape
    models, ids = training_models(shape), torch.randint(0, 256, (B, T))
    opts = {(kind, name): train_optimizer(m, kind) for kind in {k for _, k in runs} for name, m in models.items()}
    label, threads, rows = f"d_model={C} layers={L} d_ff={F} E={E} k={k}", torch.get_num_threads(), []
    for n in sorted({1, threads}, reverse=True):
        splits = {(precision, kind, name): [] for precision, kind in runs for name in models}
        steps = {key: (lambda m=models[key[2]], o=opts[key[1:]], bf16=key[0] != "fp32", split=splits[key]:
                       training_step(m, ids, o, bf16, split)) for key in splits}
        torch.set_num_threads(n)
        try:
            t = time_interleaved(steps, repeats=repeats)
        finally:
            torch.set_num_threads(threads)
        parts = {key: [statistics.median(s[i] for s in split[-repeats:]) for i in (0, 1)]  # the timed rounds
                 for key, split in splits.items()}
        for precision, kind, name in steps:
            dense, part = (precision, kind, "dense"), parts[precision, kind, name]
            rows.append([label, f"{B}x{T}", precision, kind, n, name, f"{part[0] * 1e3:.1f}", f"{part[1] * 1e3:.1f}",
                         f"{t[precision, kind, name] * 1e3:.1f}", f"{part[0] / parts[dense][0]:.2f}",
                         f"{t[precision, kind, name] / t[dense]:.2f}"])
    return rows


TRAIN_HEADER = {"en": ["GPT", "batch", "precision", "optimizer", "threads", "feed-forward", "forward+backward ms",
                       "optimizer ms", "step ms", "forward+backward ÷ dense", "step ÷ dense"],
                "zh": ["GPT", "批次", "精度", "优化器", "线程", "前馈层", "前向+反向 ms", "优化器 ms", "训练步 ms",
                       "前向+反向 ÷ 稠密", "训练步 ÷ 稠密"]}
HEADER = {"en": ["shape", "path", "forward ms", "reference ÷ this", "forward+backward ms", "reference ÷ this",
                 "max abs(this − reference)"],
          "zh": ["形状", "路径", "前向 ms", "参考 ÷ 本项", "前向+反向 ms", "参考 ÷ 本项", "最大 abs(本项 − 参考)"]}

NOTE = {"en": "fp32, one layer; medians of alternating rounds; reference ÷ this > 1: faster than the loop.",
        "zh": "fp32，单层；交替轮次的中位数；参考 ÷ 本项 > 1：比逐专家循环快。"}
TRAIN_NOTE = {"en": "A whole training step with the training speed layer, as `qkv train` runs it: forward + backward, "
                    "then the optimizer, each timed (medians of alternating rounds; the step's median is its own, so "
                    "the parts need not add up to it). MoE of the dense model's active parameters (experts of width "
                    "d_ff / k, the speed layer's grouped products); batch 16 is `qkv train`'s default. `qkv train "
                    "--model moe.num_experts=E ...` makes a model of its own shape, which trains by default with "
                    "AdamW in fp32 (the first pair of rows); `muon` is `--optimizer muon` (Muon on the hidden "
                    "matrices — the dense feed-forward's and each expert's alike — AdamW on the router, embeddings, "
                    "norms and biases; the presets' default from scratch), `adamw fused` `--fused-adamw`, bf16 "
                    "`--bf16`. The MoE's feed-forward holds E / k times the dense one's parameters, and an "
                    "optimizer's work grows with the parameters, not with the tokens: Muon's Newton–Schulz "
                    "iterations cost each expert matrix what they cost a dense matrix of its shape, so with Muon the "
                    "optimizer's share of the MoE step shrinks only as the batch grows. One thread measures the "
                    "work; at more threads a shared machine's load weighs on the MoE step's more numerous "
                    "operations.",
              "zh": "完整训练步，开启训练加速层，与 `qkv train` 相同：前向 + 反向、优化器分别计时（交替轮次的中位数；"
                    "整步的中位数单独取，故两部分之和不必等于它）。MoE 与稠密模型激活参数相同（专家宽度 d_ff / k，"
                    "加速层的分组乘法）；批次 16 是 `qkv train` 的默认值。`qkv train --model moe.num_experts=E ...` "
                    "得到的是自定义形状的模型，默认用 AdamW、fp32 训练（第一对行）；`muon` 即 `--optimizer muon`"
                    "（隐藏矩阵用 Muon——稠密前馈层与每个专家的矩阵一样——路由器、嵌入、归一化与偏置用 AdamW；"
                    "这是各预设从零训练时的默认），`adamw fused` 即 `--fused-adamw`，bf16 即 `--bf16`。MoE 前馈层的参数是"
                    "稠密前馈层的 E / k 倍，而优化器的开销随参数增长、不随词元数增长：Muon 的 Newton–Schulz 迭代对每个"
                    "专家矩阵的开销与同形状的稠密矩阵相同，所以用 Muon 时，优化器在 MoE 训练步中的占比只随批次增大而"
                    "缩小。单线程衡量的是计算量；多线程时，共享机器的负载对 MoE 步中更多的算子影响更大。"}


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes, fewer rounds")
    p.add_argument("--markdown", metavar="DOCS", default=None, help="write DOCS/generated/moe.md, .zh.md, .json")
    p.add_argument("--training-only", action="store_true", help="the training steps alone, not the single layer")
    p.add_argument("--fp32", action="store_true", help="training steps in fp32 only (a CPU without native bf16, "
                                                       "where bf16 autocast's products are emulated)")
    args = p.parse_args(argv)
    from qkv.runtime import machine, source_commit

    print(machine_info())
    rows = []
    for shape in [] if args.training_only else QUICK if args.quick else SHAPES:
        rows += measure_shape(shape, repeats=5 if args.quick else 15)
        print(f"{shape} done", file=sys.stderr, flush=True)
    train_rows = []
    for shape in TRAIN_QUICK if args.quick else TRAIN_SHAPES:
        runs = [r for r in TRAIN_RUNS if r[0] == "fp32" or not args.fp32]
        train_rows += measure_training(shape, runs, repeats=5 if args.quick else 11 if shape[5] <= 16 else 7)
    saved = {"stamp": f"{time.strftime('%Y-%m-%d')}, commit {source_commit()}, {machine()}",
             "command": "python -m benchmarks.moe " + " ".join(argv if argv is not None else sys.argv[1:]),
             "rows": rows, "train_rows": train_rows}
    if args.markdown:
        write_generated(Path(args.markdown), "moe", saved,
                        lambda lang: table(saved["rows"], HEADER[lang]) + "\n\n" + NOTE[lang] + "\n\n"
                        + table(saved["train_rows"], TRAIN_HEADER[lang]) + "\n\n" + TRAIN_NOTE[lang])
    out = table(rows, HEADER["en"]) + "\n\n" + table(train_rows, TRAIN_HEADER["en"])
    print(out)
    print(json.dumps({"stamp": saved["stamp"]}))
    return out


if __name__ == "__main__":
    main()
