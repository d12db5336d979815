"""The ``moe`` section of ``ModelConfig``: a mixture-of-experts feed-forward (``qkv.nn.moe``) and the layers that
have one. The factory (``qkv.models.components.mixture_of_experts``) builds it; families read and write it
(``qkv.interop.hf.families.mixtral``, ``qwen2_moe``, ``qwen3_moe``)."""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..checks import check_positive_int
from ..nn.moe import routing_problems

MOE_LAYERS = ("moe", "dense")  # what a block's feed-forward is in a model with experts


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts feed-forward (``qkv.nn.moe``) in place of the dense one, in the layers ``layers``
    names; the dense layers keep feed_forward's. num_experts None: every feed-forward dense (the rest unused)."""

    num_experts: int | None = None  # E
    top_k: int = 2  # k experts per token
    d_expert: int | None = None  # I, each expert's width; None: feed_forward.d_ff
    score: str = "softmax"  # softmax | sigmoid (DeepSeek-V3)
    top_k_first: bool = False  # top-k of the logits, then softmax over the k (gpt-oss)
    norm_topk_prob: bool = True  # the k weights renormalised to sum to one (Mixtral always; Qwen's norm_topk_prob)
    router_bias: bool = False  # a bias on the router's logits (gpt-oss)
    n_group: int | None = None  # group-limited routing (DeepSeek-V3): E experts in n_group groups, ...
    topk_group: int | None = None  # ... of which the best topk_group are kept
    group_score: str = "top2"  # a group's score: its two best experts' sum (DeepSeek-V3) | its best, "max" (V2)
    correction_bias: bool = False  # DeepSeek-V3's e_score_correction_bias: chooses experts, weighs none
    routed_scaling_factor: float = 1.0  # the routed weights × this (DeepSeek-V3)
    expert_bias: bool = False  # biases in the experts' projections (gpt-oss)
    activation: str = "swiglu"  # swiglu | swiglu_clamped (gpt-oss)
    swiglu_limit: float = 7.0  # swiglu_clamped's L
    swiglu_alpha: float = 1.702  # swiglu_clamped's α
    d_shared: int | None = None  # a dense SwiGLU expert always on, of this width (Qwen2-MoE, DeepSeek); None: none
    shared_gate: bool = False  # the shared expert × σ(x w_s) (Qwen2-MoE's shared_expert_gate)
    shared_bias: bool = False  # biases in the shared expert's projections (DeepSeek-V2's mlp_bias)
    layers: tuple[str, ...] | None = None  # "moe" | "dense" per block; None: every block MoE
    aux_loss_coef: float = 0.0  # training: GPT's loss + this × the load-balancing loss (HF's router_aux_loss_coef)
    z_loss_coef: float = 0.0  # training: GPT's loss + this × the router z-loss (ST-MoE)
    bias_update_speed: float = 0.0  # training: DeepSeek-V3's aux-loss-free balancing γ (0: off; > 0 adds a
    # correction bias that qkv.training.expert_load moves after each optimizer step)

    def __post_init__(self) -> None:
        if self.layers is not None and isinstance(self.layers, (list, tuple)):
            object.__setattr__(self, "layers", tuple(self.layers))
        if self.num_experts is None:
            changed = sorted(f.name for f in fields(self) if getattr(self, f.name) != f.default)
            if changed:
                raise ValueError(f"moe fields {changed} need moe.num_experts (a mixture of experts), got None")
            return
        problems = routing_problems(self.num_experts, self.top_k, score=self.score, top_k_first=self.top_k_first,
                                    n_group=self.n_group, topk_group=self.topk_group, activation=self.activation,
                                    group_score=self.group_score)
        problems += self.layer_problems()
        if problems:
            raise ValueError("moe: " + "; ".join(problems))
        check_positive_int("moe.d_expert", self.d_expert, optional=True)
        check_positive_int("moe.d_shared", self.d_shared, optional=True)

    def layer_problems(self) -> list[str]:
        out = []
        if not all(isinstance(c, (int, float)) and not isinstance(c, bool) and c >= 0
                   for c in (self.aux_loss_coef, self.z_loss_coef, self.bias_update_speed)):
            out.append(f"aux_loss_coef, z_loss_coef and bias_update_speed must be numbers >= 0, got "
                       f"{self.aux_loss_coef!r}, {self.z_loss_coef!r}, {self.bias_update_speed!r}")
        for name in ("shared_gate", "shared_bias"):
            if getattr(self, name) and self.d_shared is None:
                out.append(f"{name} belongs to a shared expert: set d_shared too")
        if self.layers is not None and (not isinstance(self.layers, tuple)
                                        or not set(self.layers) <= set(MOE_LAYERS)):
            out.append(f"layers must list {' or '.join(map(repr, MOE_LAYERS))} per block, got {self.layers!r}")
        return out

    @property
    def enabled(self) -> bool:
        return self.num_experts is not None

    @property
    def has_correction_bias(self) -> bool:
        """A router with a correction bias: a checkpoint's (DeepSeek-V3) or aux-loss-free balancing's."""
        return self.correction_bias or self.bias_update_speed > 0
