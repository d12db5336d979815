"""What a run carries and hands back: its state (everything a checkpoint restores), its result, and how it stops
(Ctrl-C, a diverged loss)."""
from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path

from torch import Tensor, nn

from ..models import ModelConfig


@dataclass
class TrainResult:
    """What ``train`` returns."""

    model: nn.Module  # the trained model, in eval mode
    tokenizer: object
    config: ModelConfig
    metrics: list[dict] = field(default_factory=list)  # one record per evaluation
    summary: dict = field(default_factory=dict)  # final numbers (empty when stopped early)
    path: Path | None = None


@dataclass
class TrainState:
    """Everything a checkpoint restores: counters, weights, optimizer and RNG states.

    The weights are saved here too, beside model.safetensors: a kill between the two files
    still resumes from one consistent snapshot. Under fsdp ``model`` and ``optimizer`` are None and
    ``sharded`` names the distributed checkpoint that holds them (written before this file, by every rank).
    """

    step: int = 0
    elapsed: float = 0.0  # wall-clock seconds of training so far (rank 0's clock)
    train_time: float = 0.0  # seconds spent in optimizer steps (throughput)
    tokens: int = 0  # training tokens consumed
    running: list = field(default_factory=lambda: [0.0, 0])  # training-loss sum and count since the last evaluation
    eval_cost: float = 0.0  # seconds per validation unit, from the latest evaluation
    model: dict | None = None
    optimizer: dict | None = None
    batch_rng: Tensor | None = None
    torch_rng: Tensor | None = None
    cuda_rng: Tensor | None = None
    sharded: str | None = None  # fsdp: the run's DCP checkpoint of weights and optimizer (RunDir.sharded_name)
    threads: int | None = None  # CPU threads the run trained with (a resume keeps them, see Engine.run_threads)

    def to_dict(self) -> dict:
        """The fields by name, holding the live tensors themselves (``dataclasses.asdict`` would deep-copy every
        weight and optimizer moment, on the device, before saving); the inverse of ``from_dict``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict, *, where: str) -> "TrainState":
        known = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or not {"step", "model", "optimizer"} <= set(d) or set(d) - known:
            raise ValueError(f"{where} is not a qkv training state (fields {sorted(d) if isinstance(d, dict) else d})")
        return cls(**d)



def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(all parameters, those that train): fewer train when LoRA freezes the base."""
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.parameters() if p.requires_grad)


class Diverged(ValueError):
    """The loss became NaN or infinite: the run stops and keeps its last good checkpoint."""


class StopRequest:
    """Ctrl-C (SIGINT) asks the loop to stop at the next step boundary, save a checkpoint and exit.

    A second Ctrl-C interrupts at once (the last checkpoint on disk stays as it was).
    """

    def __init__(self) -> None:
        self.requested, self._previous = False, None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Interrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C after saving a checkpoint."""
