"""Decode steps timed side by side: one new token over S cached ones, for several modules or cache paths.

The calls run in interleaved rounds (round-robin, so that a machine's drift hits every path alike) and
each is reported as the median of its rounds; every call first rewinds its caches to S, so every call does
the same work. The caches hold random contents (``fill_random``): a step's time does not depend on what
the cache holds. Used by ``benchmarks/latent_attention.py`` (single layers) and ``qkv study kv`` (models).

Shapes: B batch, H heads, M cache capacity, S cached tokens.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch
from torch import nn


def sync() -> None:
    """Wait for the GPU's queued work (a no-op on a CPU), so that a clock reads finished work."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def fill_random(cache: nn.Module, cached: int, *, generator: torch.Generator | None = None) -> nn.Module:
    """Fill the first ``cached`` slots of every buffer of ``cache`` (a ``KVCache``'s k (B, H, M, D) and v,
    a latent cache's kv (B, 1, M, d_c + d_R)) with N(0, 1) draws and set ``cache.pos = cached``."""
    for buf in cache.buffers():
        if buf.size(2) < cached:
            raise ValueError(f"a cache of {buf.size(2)} slots cannot hold {cached} cached tokens")
        buf[:, :, :cached] = torch.randn(buf[:, :, :cached].shape, generator=generator).to(buf)
    cache.pos = cached
    return cache


def rewind(caches: Sequence[nn.Module], cached: int) -> None:
    """Every cache back to ``cached`` tokens: the next step writes slot ``cached`` again."""
    for cache in caches:
        cache.pos = cached


def decode_step_seconds(steps: dict[str, tuple[Callable[[], object], Sequence[nn.Module]]], cached: int, *,
                        repeats: int = 7, inner: int = 1, warmup: int = 2) -> dict[str, float]:
    """Median seconds of one decode step of each entry of ``steps``: name -> (step, its caches).

    ``step()`` decodes one token with ``caches`` (rewound to ``cached`` before each call). Each round runs
    every entry ``inner`` times in turn; ``warmup`` rounds are not timed; the median of ``repeats`` rounds,
    divided by ``inner``, is returned.
    """
    if not steps or min(repeats, inner) < 1 or warmup < 0:
        raise ValueError(f"need at least one step, repeats >= 1, inner >= 1, warmup >= 0, got {len(steps)} "
                         f"steps, repeats={repeats}, inner={inner}, warmup={warmup}")
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(warmup + repeats):
        for name, (step, caches) in steps.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(inner):
                rewind(caches, cached)
                step()
            sync()
            if round_ >= warmup:
                times[name].append((time.perf_counter() - t0) / inner)
    return {name: statistics.median(ts) for name, ts in times.items()}
