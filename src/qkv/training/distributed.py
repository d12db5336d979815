"""This process's place in a ``torchrun`` job, and the few collectives the training recipe needs.

One process is rank 0 of 1 and every collective is the identity; under torchrun the recipe joins the
process group (gloo on CPU, nccl on CUDA) so that every rank takes the same decisions.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch

from ..runtime import local_gpu

# How long a collective waits for the slowest rank (NCCL's default is 10 minutes): the other ranks wait in the next
# one while rank 0 alone writes a whole checkpoint, which for a large model on a slow disk takes longer.
DIST_TIMEOUT = timedelta(minutes=60)


def process_group_options(*, cuda: bool, local_rank: int, gpus: int) -> dict:
    """``init_process_group``'s arguments: nccl bound to this process's GPU (``device_id``: the communicator made
    at once, on the right GPU; ``local_gpu``), else gloo; both waiting ``DIST_TIMEOUT``."""
    if not cuda:
        return {"backend": "gloo", "timeout": DIST_TIMEOUT}
    return {"backend": "nccl", "device_id": torch.device("cuda", local_gpu(local_rank, gpus)), "timeout": DIST_TIMEOUT}


class Dist:
    """This process's place in a ``torchrun`` job (one process: rank 0 of 1), and the few collectives
    the training recipe needs so that every rank takes the same decisions."""

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0, *, owns_group: bool = False,
                 local_world: int = 1) -> None:
        self.rank, self.world, self.local_rank, self.owns_group = rank, world, local_rank, owns_group
        self.local_world = local_world  # the processes on this machine (torchrun's LOCAL_WORLD_SIZE)
        self.device = torch.device("cpu")  # where collectives' tensors live; set by the recipe

    @classmethod
    def from_env(cls, device_name: str = "auto") -> "Dist":
        """Join the process group torchrun describes (gloo on CPU, nccl on CUDA), if any."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        local, owns = int(os.environ.get("LOCAL_RANK", "0")), False
        if not dist.is_initialized():
            cuda = device_name != "cpu" and torch.cuda.is_available()
            options = process_group_options(cuda=cuda, local_rank=local, gpus=torch.cuda.device_count() if cuda else 0)
            if cuda:
                torch.cuda.set_device(options["device_id"])
            dist.init_process_group(**options)
            owns = True
        return cls(dist.get_rank(), dist.get_world_size(), local, owns_group=owns,
                   local_world=int(os.environ.get("LOCAL_WORLD_SIZE", world)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def close(self) -> None:
        if self.owns_group:
            torch.distributed.destroy_process_group()

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when any rank's flag is set (so all stop at the same step)."""
        if self.world == 1:
            return flag
        t = torch.tensor(float(flag), device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item())

    def from_main(self, value: float) -> float:
        """Rank 0's value (a clock reading), so every rank computes the same learning rate and stops together."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.broadcast(t, src=0)
        return float(t)

    def max(self, value: float) -> float:
        """The largest of the ranks' values, on every rank."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.AVG)
        return t

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(t)
        return t

    def share(self, make):
        """``make()`` on rank 0, its (picklable) result on every rank."""
        if self.world == 1:
            return make()
        box = [make() if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]
