"""A mixture-of-experts feed-forward: a router sends each token to k of E experts and sums their outputs, weighted.

Shazeer et al. 2017 (sparsely-gated MoE), Fedus et al. 2021 (Switch: the load-balancing loss), Zoph et al. 2022
(ST-MoE: the router z-loss), Jiang et al. 2024 (Mixtral), Qwen2-MoE (shared expert), DeepSeek-V3 (arXiv 2412.19437:
sigmoid scores, group-limited routing, the aux-loss-free correction bias).

Shapes: N tokens (B·T flattened), C model width, E experts, k experts per token, I an expert's width,
G expert groups.

    logits   = x W_rᵀ (+ b_r)                                          (N, E)   fp32
    scores   = softmax(logits) | sigmoid(logits)                       (N, E)
    choice   = scores (+ correction_bias); group-limited: only the topk_group groups scoring highest stay,
               a group scoring the sum of its two best choice scores (DeepSeek-V3, group_score "top2") or
               its best one (DeepSeek-V2's group_limited_greedy, "max")   (N, E)
    experts  = topk(choice, k)                                         (N, k)   indices
    weights  = scores at those experts; ÷ (their sum + 1e-20) where norm_topk_prob; × routed_scaling_factor
    top_k_first (gpt-oss): experts = topk(logits, k), weights = softmax over those k logits
    y        = Σ_j weights_j · expert_{e_j}(x)  (+ σ(x w_s) ·) shared(x)

The correction bias chooses experts but never weighs them (the weights come from the unbiased scores).
An expert is SwiGLU: W_down (silu(W_gate x) ⊙ W_up x); gpt-oss's clamped variant: g = min(W_gate x, L),
u = clamp(W_up x, ±L), W_down ((u + 1) ⊙ g σ(α g)).

Three ways to run the experts, one answer (tests/test_moe.py: 1e-6 in fp32): ``reference_dispatch`` loops over
experts and finds each one's tokens (HF's MixtralExperts loop, readable); ``grouped_dispatch`` sorts the N·k
assignments by expert once, gathers the tokens once and runs each expert on one contiguous slice
(``SwiGLUExperts.segments``; in training the speed layer, qkv.kernels.moe_training, runs each product as one
``torch._grouped_mm`` over every slice);
``gathered_dispatch`` gathers each assignment's expert weights (N·k, I, C) and runs them all in batched products:
static shapes, no data-dependent slicing (torch.compile traces it whole) and only the k chosen experts' weights
read per token, which suits decoding (N·k small beside E); the speed layer (qkv.kernels.moe) runs it inside
torch.compile.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import FeedForward

SCORES = ("softmax", "sigmoid")  # the router's score function
EXPERT_ACTIVATIONS = ("swiglu", "swiglu_clamped")  # Mixtral/Qwen/DeepSeek | gpt-oss
DISPATCHES = ("grouped", "reference", "gathered")
GROUP_SCORES = ("top2", "max")  # a group's score: its two best experts' sum (DeepSeek-V3) | its best (DeepSeek-V2)


def routing_problems(num_experts, top_k, *, score: str = "softmax", top_k_first: bool = False,
                     n_group: int | None = None, topk_group: int | None = None,
                     activation: str = "swiglu", group_score: str = "top2") -> list[str]:
    """Every problem with a router's and experts' settings, in words (empty: they are consistent)."""
    out = []
    for name, v in (("num_experts", num_experts), ("top_k", top_k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            out.append(f"{name} must be a positive int, got {v!r}")
    if not out and top_k > num_experts:
        out.append(f"top_k={top_k} is larger than num_experts={num_experts}")
    if score not in SCORES:
        out.append(f"score must be one of {SCORES}, got {score!r}")
    if activation not in EXPERT_ACTIVATIONS:
        out.append(f"expert activation must be one of {EXPERT_ACTIVATIONS}, got {activation!r}")
    if group_score not in GROUP_SCORES:
        out.append(f"group_score must be one of {GROUP_SCORES}, got {group_score!r}")
    if (n_group is None) != (topk_group is None):
        out.append(f"n_group and topk_group go together, got n_group={n_group!r}, topk_group={topk_group!r}")
    elif n_group is not None:
        out += group_problems(num_experts, top_k, n_group, topk_group, top_k_first, group_score)
    return out


def group_problems(num_experts, top_k, n_group, topk_group, top_k_first: bool, group_score: str = "top2") -> list[str]:
    """Group-limited routing: G divides E into groups (of ≥ 2 where a group's score is its best two), keeps
    1 ≤ topk_group ≤ G groups, whose experts hold at least k."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (n_group, topk_group)):
        return [f"n_group and topk_group must be positive ints, got {n_group!r}, {topk_group!r}"]
    out = []
    least = 2 if group_score == "top2" else 1
    if not isinstance(num_experts, int) or num_experts % n_group or num_experts // n_group < least:
        out.append(f"n_group={n_group} must divide num_experts={num_experts} into groups of at least {least}")
    elif isinstance(top_k, int) and top_k > topk_group * (num_experts // n_group):
        out.append(f"top_k={top_k} is more than the {topk_group * (num_experts // n_group)} experts of "
                   f"topk_group={topk_group} groups")
    if topk_group > n_group:
        out.append(f"topk_group={topk_group} is larger than n_group={n_group}")
    if top_k_first:
        out.append("top_k_first (softmax over the k best logits) takes no group-limited routing")
    return out


class Routing(NamedTuple):
    """What the router decided for N tokens."""

    weights: Tensor  # (N, k) fp32: each chosen expert's weight
    experts: Tensor  # (N, k) long: the chosen experts
    logits: Tensor  # (N, E) fp32: the router's logits (auxiliary losses read them)


class Router(nn.Module):
    """logits = x W_rᵀ (+ b_r) in fp32 -> the k experts of each token and their weights (see the module's notes)."""

    def __init__(self, d_model: int, num_experts: int, top_k: int, *, score: str = "softmax",
                 top_k_first: bool = False, norm_topk_prob: bool = True, bias: bool = False,
                 n_group: int | None = None, topk_group: int | None = None, correction_bias: bool = False,
                 scaling: float = 1.0, group_score: str = "top2") -> None:
        super().__init__()
        problems = routing_problems(num_experts, top_k, score=score, top_k_first=top_k_first, n_group=n_group,
                                    topk_group=topk_group, group_score=group_score)
        if problems:
            raise ValueError("router: " + "; ".join(problems))
        self.num_experts, self.top_k, self.score, self.top_k_first = num_experts, top_k, score, top_k_first
        self.norm_topk_prob, self.n_group, self.topk_group, self.scaling = norm_topk_prob, n_group, topk_group, scaling
        self.group_score = group_score
        self.weight = nn.Parameter(torch.randn(num_experts, d_model) * 0.02)  # (E, C)
        self.bias = nn.Parameter(torch.zeros(num_experts)) if bias else None  # (E,)
        # DeepSeek-V3's e_score_correction_bias: chooses experts, weighs none (updated outside the gradient)
        self.correction_bias = nn.Buffer(torch.zeros(num_experts)) if correction_bias else None  # (E,)

    def forward(self, x: Tensor) -> Routing:
        """x (N, C) -> Routing: weights and experts (N, k), logits (N, E)."""
        bias = None if self.bias is None else self.bias.float()
        logits = F.linear(x.float(), self.weight.float(), bias)  # (N, E)
        if self.top_k_first:  # gpt-oss: the k best logits, then softmax over them alone
            top, experts = logits.topk(self.top_k, dim=-1)  # (N, k)
            return Routing(top.softmax(dim=-1), experts, logits)
        scores = logits.softmax(dim=-1) if self.score == "softmax" else logits.sigmoid()  # (N, E)
        choice = scores if self.correction_bias is None else scores + self.correction_bias.float()  # (N, E)
        if self.n_group is not None:
            choice = limit_groups(choice, self.n_group, self.topk_group, self.group_score)
        experts = choice.topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(-1, experts)  # (N, k): unbiased
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return Routing(weights * self.scaling, experts, logits)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, top_k={self.top_k}, score={self.score}, top_k_first={self.top_k_first}"
                f", norm_topk_prob={self.norm_topk_prob}, n_group={self.n_group}, topk_group={self.topk_group}"
                f", group_score={self.group_score}")


def limit_groups(choice: Tensor, n_group: int, topk_group: int, group_score: str = "top2") -> Tensor:
    """Group-limited routing: E experts in G groups; a group scores the sum of its two best ``choice`` scores
    (DeepSeek-V3, "top2") or its best one (DeepSeek-V2, "max"); the experts of all but the best topk_group groups
    get -inf (V2's HF code zeroes them instead: the same choice, since k fits in the kept groups and softmax
    scores are positive). choice (N, E) -> (N, E)."""
    N, E = choice.shape
    grouped = choice.view(N, n_group, E // n_group)  # (N, G, E/G)
    if group_score == "max":
        group_scores = grouped.max(dim=-1).values  # (N, G)
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(topk_group, dim=-1).indices, True)  # (N, G)
    keep = keep.unsqueeze(-1).expand_as(grouped).reshape(N, E)  # (N, G, E/G) -> (N, E)
    return choice.masked_fill(~keep, float("-inf"))


class SwiGLUExperts(nn.Module):
    """E SwiGLU experts as stacked weights: gate_proj, up_proj (E, I, C), down_proj (E, C, I), biases
    gate_bias, up_bias (E, I), down_bias (E, C) where ``bias``; ``activation`` swiglu or gpt-oss's
    swiglu_clamped (``limit`` L, ``alpha`` α)."""

    def __init__(self, num_experts: int, d_model: int, d_expert: int, *, bias: bool = False,
                 activation: str = "swiglu", limit: float = 7.0, alpha: float = 1.702) -> None:
        super().__init__()
        if activation not in EXPERT_ACTIVATIONS:
            raise ValueError(f"expert activation must be one of {EXPERT_ACTIVATIONS}, got {activation!r}")
        self.num_experts, self.activation, self.limit, self.alpha = num_experts, activation, limit, alpha
        E, C, I = num_experts, d_model, d_expert
        self.gate_proj = nn.Parameter(torch.randn(E, I, C) * 0.02)
        self.up_proj = nn.Parameter(torch.randn(E, I, C) * 0.02)
        self.down_proj = nn.Parameter(torch.randn(E, C, I) * 0.02)
        zeros = (lambda *shape: nn.Parameter(torch.zeros(*shape))) if bias else (lambda *shape: None)
        self.gate_bias, self.up_bias, self.down_bias = zeros(E, I), zeros(E, I), zeros(E, C)

    def forward(self, x: Tensor, e: int) -> Tensor:
        """Expert ``e`` on its tokens: x (n, C) -> (n, C)."""
        return self.expert(x, *(None if p is None else p[e] for p in self.weights()))

    def weights(self) -> tuple[Tensor | None, ...]:
        """gate_proj, up_proj, down_proj, gate_bias, up_bias, down_bias (a bias None where there is none)."""
        return self.gate_proj, self.up_proj, self.down_proj, self.gate_bias, self.up_bias, self.down_bias

    def expert(self, x: Tensor, gate_w, up_w, down_w, gate_b, up_b, down_b) -> Tensor:
        """One expert given its weights (I, C), (I, C), (C, I) and biases or None: x (n, C) -> (n, C)."""
        gate, up = F.linear(x, gate_w, gate_b), F.linear(x, up_w, up_b)  # (n, I)
        return F.linear(self.activate(gate, up), down_w, down_b)  # (n, C)

    def segments(self, x: Tensor, counts: Tensor) -> Tensor:
        """Each expert on its own contiguous rows of x (sorted by expert, counts[e] rows for expert e): one
        product per expert that has rows, the stacked weights unbound once (one gradient op per weight, not one
        per expert). x (M, C), counts (E,) long -> (M, C)."""
        return per_expert(self, x, counts)

    def activate(self, gate: Tensor, up: Tensor) -> Tensor:
        """h from the gate and up products (..., I): silu(gate) ⊙ up, or gpt-oss's clamped variant."""
        if self.activation == "swiglu":
            return F.silu(gate) * up
        gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)  # gpt-oss: clamped,
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))  # α-sharpened gate, up shifted by one

    def gathered(self, x: Tensor, idx: Tensor) -> Tensor:
        """Row m through expert idx[m], every row at once: each row's weights gathered, then batched
        matrix-vector products. x (M, C), idx (M,) long -> (M, C)."""
        def product(w: Tensor, bias: Tensor | None, v: Tensor) -> Tensor:
            out = torch.matmul(w.index_select(0, idx), v.unsqueeze(-1)).squeeze(-1)  # (M, O, K) @ (M, K, 1) -> (M, O)
            return out if bias is None else out + bias.index_select(0, idx)
        gate, up = product(self.gate_proj, self.gate_bias, x), product(self.up_proj, self.up_bias, x)  # (M, I)
        return product(self.down_proj, self.down_bias, self.activate(gate, up))  # (M, C)


@torch.compiler.disable
def per_expert(experts: SwiGLUExperts, x: Tensor, counts: Tensor) -> Tensor:
    """``SwiGLUExperts.segments``'s loop, outside any compiled graph: the row counts are read on the host (one sync),
    and a graph traced through the split would be recompiled for every new split (the experts' loads change every
    step) until dynamo's limit, then run eagerly. Left out, the graphs around it keep static shapes."""
    weights = [None if p is None else p.unbind(0) for p in experts.weights()]  # 6 × (E × one expert's) or None
    ys = [experts.expert(rows, *(None if w is None else w[e] for w in weights))
          for e, rows in enumerate(x.split(counts.tolist())) if rows.numel()]  # one host sync
    return torch.cat(ys) if ys else x.new_zeros(x.shape)


def reference_dispatch(x: Tensor, routing: Routing, experts: nn.Module) -> Tensor:
    """Σ_j weights_j · expert_{e_j}(x), one expert at a time: find its tokens, run it, add back. x (N, C) -> (N, C)."""
    out = torch.zeros_like(x)
    weights = routing.weights.to(x.dtype)  # (N, k)
    for e in range(experts.num_experts):
        token, slot = torch.where(routing.experts == e)  # (n,), (n,): which token, which of its k choices
        if token.numel():
            out.index_add_(0, token, experts(x[token], e) * weights[token, slot, None])
    return out


class Sorted(NamedTuple):
    """The N·k (token, choice) assignments sorted by expert, each expert's rows padded to a multiple."""

    token: Tensor  # (M,) each sorted row's token (padding rows: token 0)
    slot: Tensor  # (N·k,) each assignment's row, token by token, choice by choice
    rows: Tensor  # (E,) each expert's rows, padding included


def sort_assignments(experts: Tensor, num_experts: int, align: int = 1) -> Sorted:
    """Sort the assignments experts (N, k) by expert (stably), each expert's rows padded to a multiple of
    ``align`` (padding rows copy token 0; a dispatch never reads their outputs, so their gradients are zero)."""
    N, k = experts.shape
    flat = experts.reshape(-1)  # (N·k,)
    order = flat.argsort(stable=True)  # (N·k,) assignments, expert by expert
    counts = torch.bincount(flat, minlength=num_experts)  # (E,)
    rows = (counts + align - 1) // align * align  # (E,) each expert's rows, padded
    expert = flat[order]  # (N·k,) each sorted assignment's expert
    rank = torch.arange(N * k, device=flat.device) - (counts.cumsum(0) - counts)[expert]  # its place among them
    slot = torch.empty_like(flat).index_copy_(0, order, (rows.cumsum(0) - rows)[expert] + rank)  # (N·k,) its row
    M = N * k if align == 1 else int(rows.sum())  # one host sync where padded
    token = torch.zeros(M, dtype=torch.long, device=flat.device).index_copy_(0, slot, torch.arange(
        N * k, device=flat.device) // k)  # (M,) each row's token
    return Sorted(token, slot, rows)


def weighted_sum(y: Tensor, weights: Tensor) -> Tensor:
    """Σ_j weights[:, j] · y[:, j]: each token's k expert outputs y (N, k, C) summed with their weights (N, k),
    in the two's promoted dtype (y cast first: a one-dtype multiply is faster than a mixed one, same values).
    -> (N, C)."""
    y = y.to(torch.promote_types(y.dtype, weights.dtype))
    return (y * weights.unsqueeze(-1)).sum(dim=1)  # (N, C)


def combine(y: Tensor, order: Sorted, weights: Tensor) -> Tensor:
    """The sorted rows' outputs y (M, C) gathered back to their assignments and summed over each token's k
    choices with their weights (N, k). -> (N, C)."""
    return weighted_sum(y.index_select(0, order.slot).view(*weights.shape, -1), weights)  # (N, k, C) -> (N, C)


def grouped_dispatch(x: Tensor, routing: Routing, experts: nn.Module) -> Tensor:
    """The same sum with the N·k assignments sorted by expert (``sort_assignments``): one gather, each expert on
    its contiguous rows (``SwiGLUExperts.segments``), the outputs gathered back to their tokens and summed over
    the k choices (``combine``). Gathers are ``index_select`` (its backward, an ``index_add``, is cheaper on a
    CPU than indexing's ``index_put``). x (N, C) -> (N, C)."""
    order = sort_assignments(routing.experts, experts.num_experts)
    y = experts.segments(x.index_select(0, order.token), order.rows)  # (N·k, C) sorted by expert
    return combine(y, order, routing.weights.to(x.dtype))


def gathered_dispatch(x: Tensor, routing: Routing, experts: nn.Module) -> Tensor:
    """The same sum with each of the N·k assignments' expert weights gathered (``SwiGLUExperts.gathered``):
    batched products of static shapes, no data-dependent slicing and no host sync; reads N·k experts' weights
    (the grouped path reads each chosen expert once), so it suits few tokens. x (N, C) -> (N, C)."""
    N, k = routing.experts.shape
    rows = x.unsqueeze(1).expand(N, k, x.size(-1)).reshape(N * k, -1)  # (N, C) -> (N·k, C)
    y = experts.gathered(rows, routing.experts.reshape(-1)).view(N, k, -1)  # (N·k, C) -> (N, k, C)
    return weighted_sum(y, routing.weights.to(x.dtype))  # (N, C)


DISPATCH = {"grouped": grouped_dispatch, "reference": reference_dispatch, "gathered": gathered_dispatch}


class MixtureOfExperts(nn.Module):
    """The MoE feed-forward, from parts made elsewhere (``qkv.models.components`` builds them from the config):
    a ``Router``, the routed experts, optionally a dense ``shared`` expert always on, scaled by
    σ(``shared_gate``(x)) where given (Qwen2-MoE).

    ``forward(x, return_router_logits=True)`` returns the router's logits (N, E) beside the output, for
    ``load_balancing_loss`` and ``router_z_loss`` (the model hands them on in its output). After each forward
    ``expert_counts`` (E,) holds the tokens each expert got (all k choices counted).
    ``dispatch``: "grouped" (the fast path), "gathered" (static shapes, for few tokens) or "reference"; the
    grouped and gathered paths take ``SwiGLUExperts`` without hooks only and otherwise run the reference,
    warning once why.
    """

    def __init__(self, router: Router, experts: nn.Module, shared: FeedForward | None = None,
                 shared_gate: nn.Linear | None = None, *, dispatch: str = "grouped") -> None:
        super().__init__()
        if dispatch not in DISPATCH:
            raise ValueError(f"dispatch must be one of {DISPATCHES}, got {dispatch!r}")
        if router.num_experts != experts.num_experts:
            raise ValueError(f"the router chooses among {router.num_experts} experts but there are "
                             f"{experts.num_experts}")
        if shared_gate is not None and shared is None:
            raise ValueError("a shared_gate scales a shared expert: pass shared too")
        self.router, self.experts, self.shared, self.shared_gate = router, experts, shared, shared_gate
        self.dispatch, self.fallback = dispatch, None  # fallback: why the grouped path was not taken
        self.expert_counts: Tensor | None = None

    def refuses_fast_dispatch(self) -> str | None:
        """Why the grouped (or gathered) path cannot run these experts (built and tested for SwiGLUExperts), or None."""
        if type(self.experts) is not SwiGLUExperts:
            return f"experts are a {type(self.experts).__name__}, the fast dispatches run SwiGLUExperts"
        if self.experts._forward_hooks or self.experts._forward_pre_hooks:
            return "the experts have hooks, which the fast dispatches call differently"
        return None

    def forward(self, x: Tensor, *, return_router_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """x (B, T, C) -> (B, T, C) [, the router's logits (B·T, E) where ``return_router_logits``]."""
        dispatch = self.dispatch
        if dispatch != "reference" and (reason := self.refuses_fast_dispatch()) is not None:
            if self.fallback != reason:
                warnings.warn(f"MixtureOfExperts runs the reference dispatch: {reason}", stacklevel=2)
            self.fallback, dispatch = reason, "reference"
        return self.run(x, DISPATCH[dispatch], return_router_logits)

    def reference_forward(self, x: Tensor) -> Tensor:
        """The same, always through ``reference_dispatch`` (the tests' yardstick). x (B, T, C) -> (B, T, C)."""
        return self.run(x, reference_dispatch)

    def run(self, x: Tensor, dispatch, return_router_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """The layer through ``dispatch``: x (B, T, C) -> (B, T, C) [, router logits (B·T, E)]."""
        flat = x.reshape(-1, x.size(-1))  # (B, T, C) -> (N, C)
        routing = self.router(flat)
        out = dispatch(flat, routing, self.experts)  # (N, C)
        if self.shared is not None:
            shared = self.shared(flat)  # (N, C)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(flat)) * shared)
        self.expert_counts = expert_counts(routing.experts, self.router.num_experts)
        return (out.view_as(x), routing.logits) if return_router_logits else out.view_as(x)


def expert_counts(experts: Tensor, num_experts: int) -> Tensor:
    """How many of the (token, choice) pairs each expert got: experts (N, k) -> (E,) long. A scatter of static
    shape (``bincount``'s length depends on the data, which torch.compile cannot trace without a break)."""
    flat = experts.reshape(-1).detach()  # (N·k,)
    return torch.zeros(num_experts, dtype=torch.long, device=flat.device).index_add_(0, flat, torch.ones_like(flat))


def load_balancing_loss(router_logits: Tensor, top_k: int, mask: Tensor | None = None) -> Tensor:
    """Switch/Mixtral's auxiliary loss: E · Σ_e f_e · P_e, where f_e is the fraction of (token, choice) pairs
    that top-k of softmax(logits) sends to expert e (summing to k over e), and P_e the mean router probability
    of e. Balanced routing gives k; all tokens on one expert gives E·k. router_logits (..., E) (layers may be
    concatenated along the tokens), mask (...) True where a token counts (padding excluded)."""
    E = router_logits.size(-1)
    probs = router_logits.float().reshape(-1, E).softmax(dim=-1)  # (N, E)
    w = torch.ones(probs.size(0), device=probs.device) if mask is None else mask.reshape(-1).float()  # (N,)
    chosen = F.one_hot(probs.topk(top_k, dim=-1).indices, E).sum(dim=1).float()  # (N, E): 1 where chosen
    f = (chosen * w[:, None]).sum(0) / w.sum()  # (E,)
    p = (probs * w[:, None]).sum(0) / w.sum()  # (E,)
    return E * (f * p).sum()


def router_losses(router_logits: Sequence[Tensor], top_k: int,
                  mask: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """(load_balancing_loss, router_z_loss) over the router logits (N, E) of every MoE layer of a forward (a model
    output's ``router_logits``), the layers' tokens taken together as Mixtral's loss does; mask (B, T) True where a
    token counts. None when there are none (no experts)."""
    if not router_logits:
        return None
    logits = torch.cat(list(router_logits))  # (layers · N, E)
    mask = None if mask is None else mask.reshape(-1).repeat(len(router_logits))  # (layers · N,)
    return load_balancing_loss(logits, top_k, mask), router_z_loss(logits, mask)


def router_z_loss(router_logits: Tensor, mask: Tensor | None = None) -> Tensor:
    """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): mean over tokens of (log Σ_e exp(logit_e))², which keeps
    the logits small. router_logits (..., E), mask (...) True where a token counts."""
    z = torch.logsumexp(router_logits.float().reshape(-1, router_logits.size(-1)), dim=-1) ** 2  # (N,)
    if mask is None:
        return z.mean()
    w = mask.reshape(-1).float()
    return (z * w).sum() / w.sum()

