"""Expert load in training: tokens per expert and MaxVio, and DeepSeek-V3's aux-loss-free balancing.

Shapes: L MoE layers, E experts per layer.

    load_i   = tokens routed to expert i (all k choices counted), summed over a step's micro-batches
    MaxVio   = max_i load_i / mean_i load_i − 1          (Wang et al. 2024, arXiv 2408.15664 §4.1: 0 is balanced)
    b_i     ← b_i + γ · sign(mean load − load_i)          after each optimizer step (DeepSeek-V3, arXiv 2412.19437
                                                          §2.1.2), b the router's ``correction_bias``

The bias only chooses experts (``qkv.nn.moe.Router``); the gate weights come from the unbiased scores, so the
update moves no weight of a chosen expert. The counts come from forward hooks on each ``MixtureOfExperts``'s
router (the experts it chose), counted in training mode only: the layer itself stays without hooks, so the training
speed layer still swaps it (``qkv.kernels.moe_training``). Under DDP they are summed over the processes before the
update, so every rank moves its bias alike.

The recipe calls ``after_step`` after each ``optimizer.step()`` and ``metrics`` at each evaluation (the loads since
the last one), through ``step_hooks``, which is empty for a model without experts.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..nn.moe import MixtureOfExperts, Router, Routing, expert_counts

LOAD_KEYS = ("expert_tokens", "maxvio", "maxvio_mean")  # what ``ExpertLoad.metrics`` logs (and summary.json keeps)


def max_violation(load: Tensor) -> Tensor:
    """MaxVio = max load / mean load − 1 per row: load (..., E) -> (...,); 0 where no token was routed."""
    load = load.float()
    mean = load.mean(dim=-1)
    return torch.where(mean > 0, load.amax(dim=-1) / mean.clamp_min(1e-12) - 1, torch.zeros_like(mean))


def update_bias(bias: Tensor, load: Tensor, speed: float) -> None:
    """b_i ← b_i + γ·sign(mean load − load_i), in place: bias (E,), load (E,) the step's tokens per expert."""
    bias.add_(speed * torch.sign(load.float().mean() - load.float()))


class ExpertLoad:
    """The tokens each expert of each MoE layer of ``model`` got: this step's (for the bias update) and since the
    last evaluation (for the metrics log); ``speed`` γ > 0 moves each router's correction bias after a step."""

    def __init__(self, model: nn.Module, *, speed: float = 0.0, dist=None) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
        if speed > 0 and any(m.router.correction_bias is None for m in self.layers):
            raise ValueError("aux-loss-free balancing needs routers with a correction bias (moe.bias_update_speed "
                             "> 0 builds them)")
        self.speed, self.dist = speed, dist
        E = self.layers[0].router.num_experts if self.layers else 0
        device = self.layers[0].router.weight.device if self.layers else None
        self.step_load = torch.zeros(len(self.layers), E, dtype=torch.long, device=device)  # (L, E)
        self.window_load = torch.zeros_like(self.step_load)  # (L, E) since the last ``metrics``
        self.handles = [m.router.register_forward_hook(self.counter(i)) for i, m in enumerate(self.layers)]

    def counter(self, i: int):
        """Layer i's router hook: the tokens each expert got, added to this step's load (in training)."""
        def hook(router: Router, inputs, routing: Routing) -> None:
            if router.training:
                self.step_load[i] += expert_counts(routing.experts, router.num_experts).to(self.step_load.device)
        return hook

    @torch.no_grad()
    def after_step(self) -> None:
        """The step's loads (summed over processes) into the window; each router's bias moved where γ > 0."""
        load = self.step_load if self.dist is None else self.dist.sum(self.step_load)  # (L, E)
        self.window_load += load
        if self.speed > 0:
            for m, layer_load in zip(self.layers, load):
                update_bias(m.router.correction_bias, layer_load, self.speed)
        self.step_load.zero_()

    def metrics(self) -> dict:
        """expert_tokens (L × E), maxvio (L) and maxvio_mean over the training steps since the last call."""
        load, self.window_load = self.window_load, torch.zeros_like(self.window_load)
        vio = max_violation(load)  # (L,)
        return {"expert_tokens": load.tolist(), "maxvio": [round(v, 4) for v in vio.tolist()],
                "maxvio_mean": round(vio.mean().item(), 4)}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def step_hooks(model: nn.Module, speed: float, dist=None) -> list[ExpertLoad]:
    """What the loop calls after each optimizer step and at each evaluation: an ``ExpertLoad`` for a model with
    experts, nothing for a dense one."""
    has_experts = any(isinstance(m, MixtureOfExperts) for m in model.modules())
    return [ExpertLoad(model, speed=speed, dist=dist)] if has_experts else []
