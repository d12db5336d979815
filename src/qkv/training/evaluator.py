"""The one held-out evaluation of every task: its held-out items cut among the ranks, batched, summed, added
over the ranks, and turned into the metrics record's fields by the task.

    sums = Σ over held-out batches of task.eval_sums(model, batch)     (float64; the last entry: the units)
    val_loss = sums[0] / units                                          (a token-level task: nats per token)

The periodic validation scores the task's sample (``eval_sample``), the final one the whole split (``eval_all``)
and adds what the task decodes (``decoded_metrics``).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn


@torch.no_grad()
def held_out_sums(task, model: nn.Module, items: list[int], *, autocast: Callable, dist) -> list[float]:
    """``task.eval_sums`` added over ``items`` (each rank scores its share, ``eval_batch_size`` at a time) and
    over the ranks, in eval mode; the model's mode is restored after."""
    was = model.training
    model.eval()
    total: Tensor = torch.zeros(len(task.eval_fields) + 1, dtype=torch.float64, device=dist.device)
    mine, size = items[dist.rank::dist.world], task.eval_batch_size
    for lo in range(0, len(mine), size):
        chunk = mine[lo:lo + size]
        batch = task.batch(chunk, "val")
        with autocast():
            total += task.eval_sums(model, batch, chunk).double()
    model.train(was)
    return dist.sum(total).tolist()


def validate(task, model: nn.Module, *, autocast: Callable, dist) -> tuple[dict, int]:
    """The periodic validation on the task's sample: (fields of the metrics record, items scored)."""
    items = task.eval_sample
    sums = held_out_sums(task, model, items, autocast=autocast, dist=dist)
    return task.val_metrics(sums, final=False), len(items)


def final_metrics(task, model: nn.Module, *, autocast: Callable, dist) -> dict:
    """The summary's measured numbers: the held-out sums over the whole split, then what the task decodes."""
    sums = held_out_sums(task, model, task.eval_all, autocast=autocast, dist=dist)
    return task.val_metrics(sums, final=True) | task.decoded_metrics(model, autocast=autocast, dist=dist)
