"""The recipe's optimizers and learning-rate schedules.

Optimizers (``TrainConfig.optimizer``):

    adamw  AdamW on every weight (Loshchilov & Hutter 2019); weight decay on matrices only
    muon   Muon on the hidden matrices — the attention and feed-forward projections — and AdamW on the
           rest: embeddings, the output head, norm gains and biases (Jordan et al. 2024,
           https://kellerjordan.github.io/posts/muon/; ``qkv.training.muon``: torch.optim.Muon's algorithm, its
           Newton–Schulz in bf16 where the device computes bf16 natively and in fp32 elsewhere)

Muon orthogonalises each matrix's momentum (Newton–Schulz) and scales the result to the RMS of an AdamW
update ("Muon is Scalable for LLM Training", Liu et al. 2025; torch's ``adjust_lr_fn="match_rms_adamw"``),
so the peak ``lr`` and ``weight_decay`` that suit AdamW suit it too; ``muon_lr`` sets its peak apart.

Schedules (``TrainConfig.schedule``), both after a linear warmup from 0 to lr over the first W =
``warmup_steps`` steps (step s < W: lr · s / W, as transformers' schedulers):

    cosine  lr · (m + (1 − m) · ½ (1 + cos π p)) over the remaining steps, p = (s − W) / (N − W) from 0 to 1,
            m = min_lr_ratio (transformers' ``get_cosine_with_min_lr_schedule_with_warmup``; m = 0 is
            ``get_cosine_schedule_with_warmup``)
    wsd     warmup-stable-decay: lr held until the last WSD_DECAY of the budget, then a linear decay to
            lr · min_lr_ratio (Hu et al. 2024, "MiniCPM", §4)

N is the step budget; a time or token budget measures p by the share of it spent instead.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..nn.moe import SwiGLUExperts
from .muon import Muon, ns_dtype_for

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")
WSD_DECAY = 0.2  # wsd: the final fraction of the budget over which the learning rate decays
DEFAULT_WARMUP_RATIO = 0.1  # a run that names no warmup warms up over at most this share of its steps


def check_optimizer_options(cfg) -> None:
    """ValueError for an unknown optimizer or schedule, or a setting the chosen optimizer cannot take."""
    if cfg.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {cfg.optimizer!r}")
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
    if cfg.muon_lr is not None and cfg.optimizer != "muon":
        raise ValueError(f"muon_lr is Muon's learning rate: it needs optimizer 'muon', got {cfg.optimizer!r}")
    if cfg.muon_lr is not None and not cfg.muon_lr > 0:
        raise ValueError(f"muon_lr must be > 0, got {cfg.muon_lr}")
    if cfg.optimizer == "muon" and cfg.sharding == "fsdp":
        raise ValueError("optimizer 'muon' orthogonalises whole matrices; sharding 'fsdp' splits them: "
                         "use sharding 'ddp' or 'none' with muon, or optimizer 'adamw' with fsdp")


def lr_at(cfg, step: int, progress: float) -> float:
    """The learning rate of optimizer step ``step`` (from 0) with ``progress`` (0 to 1) of the budget spent
    before it: lr · step / W during the warmup (W = ``warmup_steps``), then ``cfg.schedule``'s decay from lr to
    lr · min_lr_ratio over the rest of the budget."""
    W = cfg.warmup_steps
    if step < W:
        return cfg.lr * step / W
    progress = min(1.0, progress)
    if cfg.schedule == "wsd":
        decay = min(1.0, (1.0 - progress) / WSD_DECAY)  # 1 while stable, then linear down to 0
    else:
        warmed = progress * W / step if step else 0.0  # the budget's share the warmup took: W / N for a step budget
        after = (progress - warmed) / (1.0 - warmed) if warmed < 1 else 1.0  # (s − W) / (N − W)
        decay = 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, after))))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay)


def default_warmup(task_steps: int, max_steps: int | None) -> int:
    """The warmup of a run that names none: the task's ``task_steps``, but at most DEFAULT_WARMUP_RATIO of a step
    budget (rounded up), so that a short run reaches its peak."""
    return task_steps if not max_steps else min(task_steps, math.ceil(DEFAULT_WARMUP_RATIO * max_steps))


def ratio_warmup(ratio: float, max_steps: int | None) -> int:
    """``warmup_ratio``'s steps: ⌈ratio · max_steps⌉, as transformers' ``TrainingArguments.get_warmup_steps``;
    ValueError without a step budget or for a ratio outside [0, 1)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        raise ValueError(f"warmup_ratio must be a number in [0, 1), got {ratio!r}")
    if not max_steps:
        raise ValueError("--warmup-ratio is a share of --max-steps: give --max-steps, or --warmup-steps N instead")
    return math.ceil(ratio * max_steps)


def set_lr(opt, lr: float) -> None:
    """Set each parameter group's learning rate to ``lr`` times the group's own ``lr_scale`` (Muon's, when
    ``muon_lr`` differs from ``lr``; 1 for the rest)."""
    for group in opt.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def muon_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The hidden matrices Muon trains: weights of linear layers with both sides wider than one, trained, and
    neither the output head (``lm_head``) nor shared with an embedding (a tied head); and a mixture's expert
    weights, stacks (E, m, n) that Muon steps matrix by matrix (their biases and the router go to AdamW)."""
    embedded = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    heads = {id(m.weight) for name, m in model.named_modules() if name.split(".")[-1] == "lm_head"}
    linear = [m.weight for m in model.modules()
              if isinstance(m, nn.Linear) and m.weight.requires_grad and min(m.weight.shape) > 1
              and id(m.weight) not in embedded | heads]
    experts = [w for m in model.modules() if isinstance(m, SwiGLUExperts)
               for w in (m.gate_proj, m.up_proj, m.down_proj) if w.requires_grad and min(w.shape[-2:]) > 1]
    return linear + experts


def adamw(params: list[nn.Parameter], cfg, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (weights, embeddings), none on biases and norm gains. Fused (one
    kernel for every tensor) on CUDA, and on the CPU with ``cfg.fused_adamw``."""
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type == "cuda" or cfg.fused_adamw or None)


def build_optimizer(model: nn.Module, cfg, device: torch.device):
    """The optimizer ``cfg.optimizer`` names over the model's trained weights: AdamW, or Muon for the hidden
    matrices beside AdamW for the rest (an ``OptimizerPair``, AdamW's groups first)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return adamw(params, cfg, device)
    matrices = muon_matrices(model)
    chosen = {id(p) for p in matrices}
    muon_lr = cfg.muon_lr or cfg.lr
    muon = Muon([{"params": matrices, "lr_scale": muon_lr / cfg.lr}], lr=muon_lr, weight_decay=cfg.weight_decay,
                ns_dtype=ns_dtype_for(device))
    return OptimizerPair(adamw=adamw([p for p in params if id(p) not in chosen], cfg, device), muon=muon)


class OptimizerPair:
    """Two optimizers over disjoint parameters, stepped, zeroed, saved and restored as one."""

    def __init__(self, **parts: torch.optim.Optimizer) -> None:
        self.parts = parts

    @property
    def param_groups(self) -> list[dict]:
        return [group for opt in self.parts.values() for group in opt.param_groups]

    def step(self) -> None:
        for opt in self.parts.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.parts.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each part's state; ValueError when the saved parts are not these (a run of another optimizer)."""
        if not isinstance(state, dict) or set(state) != set(self.parts):
            saved = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"the saved optimizer state holds {saved}, expected the parts {sorted(self.parts)}")
        for name, opt in self.parts.items():
            opt.load_state_dict(state[name])
