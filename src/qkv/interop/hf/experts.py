"""Mixture-of-experts layers in Hugging Face checkpoints: what the MoE families (Mixtral, Qwen2-MoE, Qwen3-MoE) share.

Weights. transformers 5 holds a layer's experts fused, and that is what the rules name (``to_hf`` fills such a
model); checkpoints on disk keep one tensor per expert, which ``fuse_experts`` (a ``Family.merge``) stacks first:

    in memory (5.x)                                    on disk (4.x and 5.x save_pretrained)
    mlp.gate.weight                (E, C)              mlp.gate.weight
    mlp.experts.gate_up_proj       (E, 2I, C)          mlp.experts.{e}.gate_proj.weight, .up_proj.weight  (I, C)
    mlp.experts.down_proj          (E, C, I)           mlp.experts.{e}.down_proj.weight                   (C, I)
    mlp.shared_expert(_gate)       Qwen2-MoE's, as a dense MLP and a (1, C) gate

qkv's ``SwiGLUExperts`` keeps gate_proj and up_proj apart (E, I, C) each: the fused matrix is their concatenation
along I. Config. ``moe_layers`` reads Qwen's decoder_sparse_step and mlp_only_layers; ``export_moe`` writes the
routing fields and lists what a family's router has no counterpart for.
"""
from __future__ import annotations

import re

import torch
from torch import Tensor

from ...models import ModelConfig
from .rules import Rule, same
from .settings import HF_ACTIVATIONS

PER_EXPERT = re.compile(r"(?P<layer>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<w>gate_proj|up_proj|down_proj)\.weight")
PLAIN_ROUTER = dict(score="softmax", top_k_first=False, router_bias=False, n_group=None, topk_group=None,
                    group_score="top2", correction_bias=False, routed_scaling_factor=1.0, expert_bias=False,
                    activation="swiglu", shared_bias=False)


def fuse_experts(tensors: dict[str, Tensor], config: ModelConfig, problems: list[str]) -> dict[str, Tensor]:
    """Per-expert tensors (``experts.{e}.gate_proj.weight`` …) -> each layer's fused ``experts.gate_up_proj`` and
    ``experts.down_proj``; every missing or mis-shaped expert tensor goes to problems (that layer then stays
    unfused, and the loader reports its fused keys missing too). Other tensors pass through."""
    layers: dict[str, dict[tuple[str, int], str]] = {}
    for key in tensors:
        if m := PER_EXPERT.fullmatch(key):
            layers.setdefault(m["layer"], {})[m["w"], int(m["e"])] = key
    out, E = dict(tensors), config.moe.num_experts or 0
    if not E:  # a dense config: any per-expert tensor is unexpected, as the loader reports
        return out
    missing, wrong = [], []
    for layer, found in layers.items():
        want = [(w, e) for w in ("gate_proj", "up_proj", "down_proj") for e in range(E)]
        absent = [f"{layer}.{e}.{w}.weight" for w, e in want if (w, e) not in found]
        shapes = {w: {tuple(tensors[found[w, e]].shape) for e in range(E) if (w, e) in found} for w, _ in want}
        uneven = [f"{layer}.*.{w}.weight {sorted(s)}" for w, s in shapes.items() if len(s) > 1]
        missing, wrong = missing + absent, wrong + uneven
        if absent or uneven:
            continue
        stack = {w: torch.stack([out.pop(found[w, e]) for e in range(E)])
                 for w in ("gate_proj", "up_proj", "down_proj")}
        out[f"{layer}.gate_up_proj"] = torch.cat([stack["gate_proj"], stack["up_proj"]], dim=1)  # (E, 2I, C)
        out[f"{layer}.down_proj"] = stack["down_proj"]  # (E, C, I)
    if missing:
        problems.append(f"{len(missing)} missing expert tensors: " + ", ".join(missing[:6])
                        + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else ""))
    if wrong:
        problems.append("experts of one layer with different shapes: " + "; ".join(wrong[:6]))
    return out


def fused_gate_up(hf: str, gate: str, up: str) -> Rule:
    """HF's fused (E, 2I, C) = [gate; up] along I <-> qkv's gate_proj and up_proj (E, I, C) each."""
    return Rule(hf, (gate, up), lambda t: tuple(t.chunk(2, dim=1)), lambda ts: torch.cat(ts, dim=1))


def moe_rules(c: ModelConfig, dense: list[Rule], shared: str | None = None) -> list[Rule]:
    """A LLaMA-shaped table (``dense``) with each MoE layer's MLP rules replaced by its router's, its fused
    experts' and (``shared``: HF's module name, e.g. "shared_expert") its shared expert's and gate's."""
    moe = {i for i in range(c.num_layers) if c.moe_layer(i)}
    out = [r for r in dense if not any(r.qkv[0].startswith(f"blocks.{i}.ff.") for i in moe)]
    for i in sorted(moe):
        l, b = f"layers.{i}.mlp.", f"blocks.{i}.ff."
        out += [same(f"{l}gate.weight", f"{b}router.weight"),
                fused_gate_up(f"{l}experts.gate_up_proj", f"{b}experts.gate_proj", f"{b}experts.up_proj"),
                same(f"{l}experts.down_proj", f"{b}experts.down_proj")]
        if c.moe.correction_bias:  # DeepSeek-V3's e_score_correction_bias, a buffer in both
            out.append(same(f"{l}gate.e_score_correction_bias", f"{b}router.correction_bias"))
        if shared is not None and c.moe.d_shared is not None:
            params = ("weight", "bias") if c.moe.shared_bias else ("weight",)  # DeepSeek-V2's mlp_bias
            out += [same(f"{l}{shared}.{p}.{w}", f"{b}shared.{p}.{w}") for p in ("gate_proj", "up_proj", "down_proj")
                    for w in params]
        if shared is not None and c.moe.shared_gate:
            out.append(same(f"{l}{shared}_gate.weight", f"{b}shared_gate.weight"))
    return out


def moe_layers(hf: dict, problems: list[str]) -> list[str] | None:
    """Qwen's rule: layer i is MoE unless listed in mlp_only_layers, when (i + 1) % decoder_sparse_step == 0;
    None when every layer is (ModelConfig's default)."""
    n, step, dense = hf.get("num_hidden_layers", 24), hf.get("decoder_sparse_step", 1), hf.get("mlp_only_layers") or []
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        problems.append(f"decoder_sparse_step={step!r} (expected a positive int)")
        return None
    if not isinstance(dense, (list, tuple)) or not all(isinstance(i, int) for i in dense):
        problems.append(f"mlp_only_layers={dense!r:.80} (expected a list of layer indices)")
        return None
    layers = ["moe" if i not in dense and (i + 1) % step == 0 else "dense" for i in range(n)]
    return None if set(layers) == {"moe"} else layers


def silu_experts(hf: dict, problems: list[str]) -> None:
    """HF's experts (and shared experts) gate with ``hidden_act``, qkv's with silu (SwiGLU): any other function
    is a problem (one qkv does not know at all is ``read_activation``'s)."""
    name = hf.get("hidden_act", "silu")
    if HF_ACTIVATIONS.get(name, "silu") != "silu":
        problems.append(f"hidden_act={name!r} with mixture-of-experts layers is not supported (qkv's experts gate "
                        "with silu: 'silu')")


def router_loss_config(hf: dict) -> dict:
    """HF's load-balancing coefficient as moe.aux_loss_coef: ``router_aux_loss_coef``, which HF's
    *ForCausalLM adds to the loss only where ``output_router_logits`` is true (as qkv then does in training)."""
    coef = hf.get("router_aux_loss_coef")
    return dict(aux_loss_coef=float(coef)) if hf.get("output_router_logits") and coef else {}


def export_moe(c: ModelConfig, problems: list[str], family: str, **fixed) -> dict:
    """The routing HF config fields the MoE families share (num_experts_per_tok, norm_topk_prob, Qwen's
    mlp_only_layers), appending each setting of c.moe that ``family`` cannot hold: ``fixed`` its own
    values for MoEConfig fields (PLAIN_ROUTER's for the rest)."""
    m = c.moe
    if not m.enabled:
        problems.append(f"no mixture of experts (moe.num_experts=None; {family} has one)")
        return {}
    needed = PLAIN_ROUTER | fixed
    problems += [f"moe.{k}={getattr(m, k)!r} ({family} needs {v!r})" for k, v in needed.items() if getattr(m, k) != v]
    sparse = any(c.moe_layer(i) for i in range(c.num_layers))
    act = c.feed_forward.activation
    if needed["activation"] == "swiglu" and act != "swiglu" and sparse:  # hidden_act: experts' and MLPs' alike
        problems.append(f"feed_forward.activation={act!r} with a mixture of experts ({family}'s hidden_act is the "
                        "experts' too, and qkv's experts are 'swiglu')")
    losses = dict(router_aux_loss_coef=m.aux_loss_coef, output_router_logits=True) if m.aux_loss_coef else {}
    return dict(num_experts_per_tok=m.top_k, norm_topk_prob=m.norm_topk_prob, decoder_sparse_step=1,
                mlp_only_layers=[i for i in range(c.num_layers) if not c.moe_layer(i)]) | losses

