"""The order in which a run visits its training rows: every row once per epoch, each epoch shuffled, as
transformers' ``Trainer`` does (a ``RandomSampler`` made seedable by accelerate: epoch e is
``torch.randperm(n)`` from a generator seeded with ``seed + e``).

A step takes the next ``batch_size`` positions of the epochs laid end to end, so its rows follow from the seed
and the step alone: a resumed run draws what an uninterrupted one would, with no state of its own to save.
Where n is a multiple of the step's rows the batches are the Trainer's; otherwise the Trainer's last batch of
an epoch is short, and here the step runs on into the next epoch.

Shapes: n rows; B rows per step.
"""
from __future__ import annotations

import torch
from torch import Tensor


class EpochSampler:
    """Row indices of each step, for ``n`` rows and ``seed`` (the Trainer's ``seed``, or its ``data_seed``)."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError(f"an EpochSampler needs at least one row, got n={n}")
        self.n, self.seed = n, seed
        self.cached: tuple[int, Tensor] | None = None  # (epoch, its permutation): a step reads one or two epochs

    def epoch(self, e: int) -> Tensor:
        """The order of epoch ``e`` (n,): accelerate's ``SeedableRandomSampler`` at epoch e."""
        if self.cached is None or self.cached[0] != e:
            self.cached = (e, torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + e)))
        return self.cached[1]

    def positions(self, start: int, count: int) -> Tensor:
        """The rows at positions ``start`` … ``start + count − 1`` of the epochs laid end to end (count,)."""
        out, p = [], start
        while p < start + count:
            e, offset = divmod(p, self.n)
            take = min(self.n - offset, start + count - p)
            out.append(self.epoch(e)[offset:offset + take])
            p += take
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)

    def step(self, step: int, batch_size: int) -> Tensor:
        """The rows of optimizer step ``step`` (0-based) of ``batch_size`` rows (B,)."""
        return self.positions(step * batch_size, batch_size)
