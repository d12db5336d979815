"""What a run trains on: the device, the model (sharded under fsdp, wrapped for the loop), its optimizer, precision,
threads and memory, and what sharding changes after (evaluation on the shards, the whole model gathered)."""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from torch import nn

from .finetune import add_lora
from ..runtime import cpu_threads, resolve_device, use_compile_cache
from .distributed import Dist
from .expert_load import step_hooks
from .optim import build_optimizer
from .memory import MiB, PeakMemory, available_bytes, check_fits, estimate_memory
from .sharding import (checkpoint_blocks, full_weights, model_blocks, resolve_sharding, shard_frozen, shard_model,
                       whole_from)
from .state import TrainState


class Engine:
    """The model of one run and what it runs on, a collaborator of the run (``qkv.training.recipe.Recipe``): device,
    sharding, the model and its optimizer, autocast, the step hooks, the memory estimate."""

    def __init__(self, cfg, dist: Dist, task) -> None:
        self.cfg, self.dist, self.task = cfg, dist, task

    def place(self) -> None:
        """The device (``dist.device`` too: where collectives' tensors live), TF32 on a GPU, the sharding."""
        cfg, dist = self.cfg, self.dist
        self.device = dist.device = resolve_device(cfg.device, dist.local_rank, dist.local_world)
        if self.device.type == "cuda":  # fp32 products on tensor cores (TF32), as PyTorch's own examples train
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        self.sharding = resolve_sharding(cfg.sharding, dist.world)
        self.speed_layer = cfg.speed_layer and self.sharding != "fsdp"  # built and tested unsharded and under DDP

    def build(self, run, saved: TrainState | None) -> None:
        """Once the task has its data: threads, the model's shape (a resume's must be the run's), the task's checks,
        the model, its memory checked, sharded, its optimizer."""
        cfg, dist = self.cfg, self.dist
        if self.device.type == "cpu":  # after the data preparation: the cores free when training starts
            torch.set_num_threads(self.run_threads(saved))
        self.mconf = self.task.model_config(cfg)
        if saved is not None and run.read_config() != self.mconf:
            old, new = run.read_config().to_dict(), self.mconf.to_dict()
            raise ValueError(f"--resume with a changed model config: "
                             f"{ {k: (v, new[k]) for k, v in old.items() if new[k] != v} }")
        if cfg.batch_size % (dist.world * cfg.grad_accum):
            raise ValueError(f"batch_size {cfg.batch_size} must divide into {dist.world} processes x "
                             f"{cfg.grad_accum} accumulation steps")
        self.task.check(cfg, self.mconf, dist)
        torch.manual_seed(cfg.seed)
        self.memory, available = PeakMemory(self.device), available_bytes(self.device, dist.local_world)
        self.model = self.task.build_model(self.mconf)
        if cfg.lora:
            add_lora(self.model, r=cfg.lora, alpha=cfg.lora_alpha, targets=cfg.lora_targets)
        self.check_memory(available)
        self.model.to(self.device)
        self.shard()
        self.opt = build_optimizer(self.model, cfg, self.device)
        self.step_hooks = step_hooks(self.model, self.mconf.moe.bias_update_speed, dist)  # expert load, balancing
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if cfg.bf16 else nullcontext

    def check_memory(self, available: int | None) -> None:
        """The estimate per rank (``self.estimate``), refused when it exceeds what the device has free; rank 0's
        reading decides for all, so that every rank stops together."""
        cfg, world, task = self.cfg, self.dist.world, self.task
        rows = cfg.batch_size // (world * cfg.grad_accum) * getattr(task, "sequences_per_row", 1)  # DPO: 2 a pair
        self.estimate = estimate_memory(
            self.model, self.mconf, sharding=self.sharding, world=world, checkpointed=cfg.activation_checkpointing,
            rows=rows, T=getattr(task, "T", self.mconf.max_len), blocks=len(model_blocks(self.model)), bf16=cfg.bf16,
            device=self.device, frozen=getattr(task, "reference", None))
        if self.dist.world > 1 and available is not None:
            available = int(self.dist.from_main(float(available)))
        check_fits(self.estimate, available, self.device)

    def report_peak(self, bar, steps: int) -> None:
        """The peak measured over the first ``steps`` steps, the most of the ranks, beside the estimate."""
        from .progress import note

        peak = self.memory.peak()
        if peak is None:
            return
        self.peak_bytes = int(self.dist.max(float(peak)))
        if bar is not None:
            note(bar, f"qkv: measured peak over the first {steps} step(s): {self.peak_bytes / MiB:.1f} MiB per rank "
                      f"(the most of {self.dist.world}; {self.memory.how} since before the model was built), "
                      f"estimated {self.estimate.total / MiB:.1f} MiB")

    def run_threads(self, saved: TrainState | None) -> int:
        """CPU threads: --threads; else, where qkv chooses (one process, no OMP_NUM_THREADS), the ones a resumed
        run trained with (inductor's kernels and some eager ops sum in an order set by the count: bit for bit),
        else the cores free now; under torchrun the launcher's count."""
        if self.cfg.threads:
            return self.cfg.threads
        if self.dist.world > 1 or os.environ.get("OMP_NUM_THREADS"):
            return torch.get_num_threads()
        return saved.threads if saved is not None and saved.threads else cpu_threads()

    def shard(self) -> None:
        """Activation checkpointing, then FSDP2: ``self.model`` becomes the sharded one, and no rank keeps a
        whole copy (evaluation runs the shards, see ``eval_dist``; saving gathers, see ``gathered_model``)."""
        self.model_type = type(self.model)  # before fully_shard swaps the class
        if self.cfg.activation_checkpointing:
            checkpoint_blocks(self.model)
        if self.sharding == "fsdp":
            shard_model(self.model, self.device, self.dist.world, bf16=self.cfg.bf16)
            if getattr(self.task, "reference", None) is not None:  # DPO's frozen copy: sharded too
                shard_frozen(self.task.reference, self.device, self.dist.world, bf16=self.cfg.bf16)

    def eval_dist(self) -> Dist:
        """The ranks as evaluation sees them: under fsdp each rank alone, scoring every window itself, for a
        sharded forward is a collective (every rank runs the same ones, in the same order); else ``self.dist``."""
        if self.sharding != "fsdp":
            return self.dist
        alone = Dist()
        alone.device = self.device
        return alone

    def resharded(self) -> None:
        """Under fsdp, drop the root's gathered weights that a forward without a backward leaves behind."""
        if self.sharding == "fsdp":
            self.model.reshard()

    def gathered_model(self, *, frozen: bool = True) -> nn.Module | None:
        """The model with all its weights: ``self.model``, or under fsdp one built on rank 0 alone around the
        weights gathered there into CPU memory (None on the other ranks; a collective, every rank calls it).
        ``frozen=False`` gathers only what trains (a LoRA run's adapters, all it saves)."""
        if self.sharding != "fsdp":
            return self.model
        weights = full_weights(self.model, frozen=frozen)
        if not self.dist.is_main:
            return None
        with torch.device("meta"):
            skeleton = self.model_type(self.mconf)
            if self.cfg.lora:
                add_lora(skeleton, r=self.cfg.lora, alpha=self.cfg.lora_alpha, targets=self.cfg.lora_targets)
        return whole_from(skeleton, weights, self.model, strict=frozen)

    def wrapped(self) -> nn.Module:
        """The model the loop steps: wrapped in DDP, then compiled (``self.model`` stays the plain one). Compiled
        around DDP, dynamo splits the graph at DDP's gradient buckets (its DDPOptimizer), so each bucket's
        all-reduce overlaps the rest of the backward; DDP around a compiled model would reduce after it."""
        model = self.model
        if self.sharding == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        if self.cfg.compile:  # compiled in the first step: inside the loop, so a time budget counts the compile
            use_compile_cache()
            model = torch.compile(model, dynamic=False)
        return model

    def final_model(self) -> nn.Module:
        """What ``train`` returns, in eval mode: ``self.model``; under fsdp, on rank 0, a whole model built
        after training from the weights gathered there (the other ranks return their shards, ``self.model``)."""
        whole = self.gathered_model()
        return (self.model if whole is None else whole.to(self.device)).eval()
