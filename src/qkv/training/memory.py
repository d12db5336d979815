"""Training memory per rank: the estimate before training, the peak measured over the first steps, and the
refusal of a run that will not fit.

Estimate (per rank):
    states       4 B per parameter for its weight; a trained one adds its gradient (4 B) and AdamW's two
                 moments (8 B): 16 B in all. fsdp holds 1/N of them, and no whole copy: evaluation runs the
                 shards; saving gathers the whole weights into rank 0's CPU memory alone, between steps (when
                 no activations or gradients are held)
    activations  what the backward keeps of one micro-batch (rows × T tokens), per token: in each block its
                 inputs, norms, q, k, v, attention output (8 C), the feed-forward's two hidden layers (2 F) and
                 the attention weights (2 H T) where they are materialised — on a CPU, counted as an upper bound;
                 on a GPU SDPA's fused kernels keep none — and the logits with their fp32 log-softmax (2 V).
                 4 B a float, 2 B under bf16 autocast (the fp32 log-softmax stays 4 B). With activation
                 checkpointing each block keeps its input (C) and one block at a time is recomputed. A rough
                 count (after Korthikanti et al. 2022,
                 "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198, §4).

Measured: CUDA, ``torch.cuda.max_memory_allocated`` since before the model was built; CPU, the growth of the
process's peak resident set (VmHWM, reset through /proc/self/clear_refs) over its resident set then.
Available: CUDA, ``torch.cuda.mem_get_info``'s free bytes; CPU, /proc/meminfo's MemAvailable shared by the
processes of this machine (``LOCAL_WORLD_SIZE``) — both read before the model is built.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

MiB = 2**20


def estimated_bytes(model: nn.Module, sharding: str, world: int) -> int:
    """Weights, gradients and AdamW state per rank: 16 B per trained parameter, 4 B per frozen one;
    fsdp divides it by the world size."""
    total = sum(p.numel() * (16 if p.requires_grad else 4) for p in model.parameters())
    return total // world if sharding == "fsdp" else total


def activation_bytes(config, blocks: int, rows: int, T: int, *, checkpointed: bool, bf16: bool = False,
                     attention_weights: bool = True) -> int:
    """What the backward keeps of one micro-batch of ``rows`` × ``T`` tokens (see the module's notes)."""
    weights = 2 * config.attention.num_heads * T if attention_weights else 0
    block = 8 * config.d_model + 2 * config.ff_width + weights  # floats per token
    kept = blocks * config.d_model + block if checkpointed else blocks * block
    size = 2 if bf16 else 4
    return rows * T * (size * (kept + config.vocab_size + config.d_model) + 4 * config.vocab_size)


@dataclass
class MemoryEstimate:
    """Bytes per rank: the training states and one micro-batch's activations."""

    sharding: str
    world: int
    states: int
    activations: int
    tokens: str  # "rows x T"
    precision: str = "fp32"

    @property
    def total(self) -> int:
        return self.states + self.activations

    def describe(self) -> str:
        share = f"1/{self.world} of them" if self.sharding == "fsdp" else "all of them"
        return (f"about {self.total / MiB:.1f} MiB per rank = {self.states / MiB:.1f} MiB weights, gradients and "
                f"AdamW state (16 B per trained parameter, 4 B per frozen one; {share}) + "
                f"{self.activations / MiB:.1f} MiB activations ({self.tokens} tokens per micro-step, {self.precision}, rough)")


def estimate_memory(model: nn.Module, config, *, sharding: str, world: int, rows: int, T: int, blocks: int,
                    checkpointed: bool, bf16: bool = False, device: torch.device = torch.device("cpu"),
                    frozen: nn.Module | None = None) -> MemoryEstimate:
    """The estimate per rank for micro-batches of ``rows`` sequences of ``T`` tokens; ``frozen``: a copy of the
    weights that only runs forwards without gradients (DPO's reference), 4 B per parameter, sharded like the model."""
    activations = activation_bytes(config, blocks, rows, T, checkpointed=checkpointed, bf16=bf16,
                                   attention_weights=device.type == "cpu")
    states = estimated_bytes(model, sharding, world)
    if frozen is not None:  # its parameters do not train: 4 B each
        states += sum(4 * p.numel() for p in frozen.parameters()) // (world if sharding == "fsdp" else 1)
    return MemoryEstimate(sharding, world, states, activations, f"{rows} x {T}", "bf16" if bf16 else "fp32")


def memory_line(estimate: MemoryEstimate) -> str:
    return f"qkv: sharding {estimate.sharding}: {estimate.describe()}"


def available_bytes(device: torch.device, local_world: int = 1) -> int | None:
    """Memory this rank may use: the GPU's free bytes, or the machine's MemAvailable over its processes;
    None where the device does not say."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        kib = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return int(kib[1]) * 1024 // max(1, local_world) if kib else None


def check_fits(estimate: MemoryEstimate, available: int | None, device: torch.device) -> None:
    """ValueError with the arithmetic when the estimate exceeds what the device has free."""
    if available is None or estimate.total <= available:
        return
    where = "free on the GPU (torch.cuda.mem_get_info)" if device.type == "cuda" else \
        "available (MemAvailable of /proc/meminfo, shared by this machine's processes)"
    raise ValueError(f"the run will not fit: {estimate.describe()}, but {available / MiB:.1f} MiB are {where}; "
                     "use --sharding fsdp over more processes, --activation-checkpointing, a smaller --batch-size "
                     "or more --grad-accum")


def _status_kib(field: str) -> int | None:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(match[1]) if match else None


class PeakMemory:
    """The most memory this process used since it was made (see the module's notes); ``peak()`` is None
    where the platform does not tell."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.base = device, None
        if device.type == "cuda":
            torch.empty(1, device=device)  # the caching allocator exists only after a first allocation
            torch.cuda.reset_peak_memory_stats(device)
            self.base = torch.cuda.memory_allocated(device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the resident set now
            self.base = _status_kib("VmRSS")
        except OSError:
            pass

    @property
    def how(self) -> str:
        return "torch.cuda.max_memory_allocated" if self.device.type == "cuda" else "growth of the peak resident set"

    def peak(self) -> int | None:
        if self.base is None:
            return None
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.base
        hwm = _status_kib("VmHWM")
        return None if hwm is None else (hwm - self.base) * 1024
