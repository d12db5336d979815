"""Self-attention against a recurrent network, as checks: any two positions one step apart, where
an RNN's signal from the first token fades over n steps (chapter 1, "Why"); no sequential
dependency, so the whole sequence is one batched computation (Q15), and, with ``full``, what
that is worth in time per token.

Shapes: B batch, T length, C model width.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch
from torch import Tensor, nn

from ..nn.attention import MultiHeadAttention, SelfAttention
from ..runtime import fixed_threads, resolve_device
from .measure import FLOAT_TOL, fmt, rel_err
from .messages import Joined, named, say
from .registry import check


def input_gradients(f: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """‖∂ f(x)[0, −1] / ∂ x[0, j]‖ for every position j: how much the last output depends on each input. x (1, T, C)."""
    x = x.detach().clone().requires_grad_(True)
    f(x)[0, -1].sum().backward()
    return x.grad[0].norm(dim=-1)  # (T,)


def recurrent(rnn: nn.Module) -> Callable[[Tensor], Tensor]:
    """An nn.LSTM / nn.GRU (batch_first) as a function x (B, T, C) -> outputs (B, T, C)."""
    return lambda x: rnn(x)[0]


@check("path-length-one", "§1",
       "any two positions are one step apart in self-attention, however far; in an RNN the first token's "
       "signal passes n − 1 steps and fades",
       claim_zh="「这意味着，序列里任意两个位置之间的\"路径长度\"都是 1 步——物理距离再远也不会衰减」"
                "「当序列一长（几百、上千个 token），早期的关键信息会被冲淡」")
def path_length_one(models: dict | None = None, *, n: int = 64, d: int = 32):
    """``models``: name -> f(x (1, T, C)) -> (1, T, C); "attention" must not fade with distance, the rest must."""
    if models is None:
        models = {"attention": SelfAttention(d), "LSTM": recurrent(nn.LSTM(d, d, batch_first=True)),
                  "GRU": recurrent(nn.GRU(d, d, batch_first=True))}
    x = torch.randn(1, n, d)
    far_over_near = {}
    for name, f in models.items():
        g = input_gradients(f, x)  # (T,)
        far_over_near[name] = float(g[0] / g[-2])  # the first token against the last one's neighbour
    rnns = [v for k, v in far_over_near.items() if k != "attention"]
    holds = 0.1 < far_over_near["attention"] < 10 and all(r < 1e-3 for r in rnns)
    summary = say("path-length-one", n=n, d=d,
                  ratios=Joined([named(k, f"{v:.3g}") for k, v in far_over_near.items()], sep=", "))
    return {"n": n, "far_over_near_gradient": far_over_near}, holds, summary


def graph_depth(out: Tensor) -> int:
    """The longest chain of autograd nodes behind ``out``: operations that must run one after another."""
    depth: dict = {}
    stack = [out.grad_fn]
    while stack:
        node = stack[-1]
        children = [c for c, _ in node.next_functions if c is not None]
        todo = [c for c in children if c not in depth]
        if todo:
            stack += todo
            continue
        stack.pop()
        depth[node] = 1 + max((depth[c] for c in children), default=0)
    return depth[out.grad_fn]


def rowwise(module: nn.Module, x: Tensor) -> Tensor:
    """Each position's output computed alone (its query against all keys), stacked: x (1, T, C) -> (1, T, C)."""
    q = module.q_proj(x)  # (1, T, C): every position's query, then one position at a time
    k, v = module.k_proj(x), module.v_proj(x)
    scale = 1 / math.sqrt(q.size(-1))
    rows = [torch.softmax(q[:, t:t + 1] @ k.transpose(-2, -1) * scale, -1) @ v for t in range(x.size(1))]
    return torch.cat(rows, dim=1)


@check("no-sequential-dependency", "Q15",
       "self-attention has no sequential dependency: its chain of operations does not grow with n and each "
       "position can be computed alone; an RNN's chain grows with n",
       claim_zh="「Q / K / V 都是矩阵乘，Q·K^T 也是矩阵乘，整条链路没有\"必须等前一个位置算完\"的依赖」")
def no_sequential_dependency(models: dict | None = None, *, lengths=(8, 32, 128), d: int = 32):
    """``models``: name -> f(x (1, T, C)); "attention" must keep a constant autograd depth, the others must not."""
    if models is None:
        models = {"attention": MultiHeadAttention(d, 4), "GRU": recurrent(nn.GRU(d, d, batch_first=True))}
    depths = {name: [graph_depth(f(torch.randn(1, n, d, requires_grad=True))) for n in lengths]
              for name, f in models.items()}
    sa, x = SelfAttention(d), torch.randn(1, lengths[-1], d)
    with torch.no_grad():
        alone = rel_err(rowwise(sa, x), sa(x))  # position by position = all at once
    rnns = [v for k, v in depths.items() if k != "attention"]
    holds = len(set(depths["attention"])) == 1 and all(v[-1] >= lengths[-1] for v in rnns) and alone < FLOAT_TOL
    summary = say("no-sequential-dependency", lengths=fmt(lengths), alone=alone,
                  depths=Joined([named(k, ", ".join(map(str, v))) for k, v in depths.items()]))
    return {"lengths": lengths, "graph_depth": depths, "rowwise_rel_error": alone}, holds, summary


def seconds_per_token(f: Callable[[Tensor], Tensor], x: Tensor, *, repeats: int = 3) -> float:
    """Median seconds of a forward and backward pass of f on x (1, T, C), divided by T."""
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        xi = x.detach().requires_grad_(True)
        t0 = time.perf_counter()
        f(xi).sum().backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) / x.size(1)


@check("parallel-speed", "Q15",
       "measured: per token, a forward and backward pass of multi-head attention is faster than an LSTM's or "
       "a GRU's of the same width at common training lengths",
       claim_zh="「GPU 可以一次性把整个序列的注意力分数矩阵算出来。这就是 Transformer 训练速度远快于 RNN 的关键原因」",
       full=True)
def parallel_speed(models: dict | None = None, *, lengths=(64, 256, 1024, 4096), d: int = 256,
                   train_lengths: int = 256):
    """``models``: name -> f(x (1, T, C)); "attention" must beat the rest at n ≤ ``train_lengths`` (BERT
    pre-trains 90 % of its steps at 128 tokens). Beyond, its n² term may lose on a CPU: reported as found."""
    device = resolve_device("auto")
    if models is None:
        models = {"attention": MultiHeadAttention(d, 4).to(device),
                  "LSTM": recurrent(nn.LSTM(d, d, batch_first=True).to(device)),
                  "GRU": recurrent(nn.GRU(d, d, batch_first=True).to(device))}
    with fixed_threads(None):
        us = {name: [1e6 * seconds_per_token(f, torch.randn(1, n, d, device=device)) for n in lengths]
              for name, f in models.items()}
    rnns = {k: v for k, v in us.items() if k != "attention"}
    short = [i for i, n in enumerate(lengths) if n <= train_lengths]
    holds = all(us["attention"][i] < v[i] for v in rnns.values() for i in short)
    slower = [n for i, n in enumerate(lengths) if any(us["attention"][i] >= v[i] for v in rnns.values())]
    summary = say("parallel-speed", d=d, lengths=fmt(lengths), device=device.type,
                  times=Joined([named(k, fmt(v)) for k, v in us.items()]),
                  slower=say("parallel-speed/slower", at=fmt(slower)) if slower else "")
    return {"lengths": lengths, "microseconds_per_token": us, "device": device.type,
            "attention_slower_at": slower}, holds, summary
