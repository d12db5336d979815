"""Which llama.cpp architecture each Hugging Face family is written as, what that architecture would compute
differently (refused, with the reason), and the HF tensors and config fields laid out as it reads them.

    HF model_type       gguf arch   what differs from LLaMA's layout (llama.cpp's src/models/<arch>.cpp)
    llama, mistral      llama       q/k rows permuted to interleaved RoPE (NORM mode), as convert_hf_to_gguf.py
    mixtral             llama       + a router (ffn_gate_inp) and the experts stacked, ffn_{gate,up,down}_exps
    qwen2, qwen3        qwen2/3     RoPE on halves (NEOX), as HF: no permutation; q/k/v biases; QK-norm per head
    qwen2_moe           qwen2moe    experts in every layer + a shared expert scaled by σ(ffn_gate_inp_shexp · x)
    qwen3_moe           qwen3moe    experts in every layer, QK-norm per head
    olmo2               olmo2       norms after each sublayer (post_attention_norm, post_ffw_norm), none before;
                                    QK-norm over the whole q and k projections
    phi3                phi3        q/k/v fused (attn_qkv), gate/up fused (ffn_up = [gate; up]); LongRoPE's
                                    factors as rope_factors_short/long (llama.cpp picks by the context it is
                                    started with: short up to the original context); RoPE on the
                                    first ``rope.dimension_count`` dims of each head
    smollm3             smollm3     llama's layout; no RoPE in every 4th layer (fixed in llama.cpp, no key)
    deepseek_v2/v3      deepseek2   multi-head latent attention, leading dense layers, routing as keys (``deepseek``);
                                    YaRN with its scores' correction (``yarn``)
    gpt_oss             gpt-oss     a sink logit per head (attn_sinks); q/k/v/o biases; a window on even layers
                                    (fixed); YaRN with its ramp's ends rounded (truncate=False written so, with a
                                    warning: ``yarn``); the router's bias,
                                    softmax over the top-k logits; experts with biases and the clamped SwiGLU
                                    (α 1.702, limit 7 in llama.cpp's build_moe_ffn); post_attention_norm the
                                    feed-forward's pre-norm

Experts: transformers 5 holds gate and up fused, ``experts.gate_up_proj`` (E, 2I, C) = [gate; up] along I;
llama.cpp reads two (E, I, C) tensors. gpt-oss's are transposed, (E, C, 2I) with gate and up interleaved, and
biased: ``gate_up_proj_bias`` (E, 2I) the same way, ``down_proj`` (E, I, C), ``down_proj_bias`` (E, C).
Routing is the architecture's own in llama.cpp, not a setting: softmax over all experts, top-k, the k weights
renormalised in llama, qwen3moe and gpt-oss (there as a softmax over the k logits) but not in qwen2moe; deepseek2
reads its routing from keys (``deepseek``).

Shapes: C model width, E experts, I expert width, H heads, D head width.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..hf import hf_config
from ..hf.families.gpt_oss import interleaved
from ..hf.rules import half_split_to_interleaved
from .deepseek import latent_problems, latent_tensors, write_latent_experts, write_latent_heads
from .yarn import ramp_warning, write_yarn, yarn_problems, yarn_scaling


@dataclass(frozen=True)
class Arch:
    """One llama.cpp architecture as qkv writes it: what its loader and graph fix that HF configs leave open."""

    member: str  # gguf.MODEL_ARCH member
    permute: bool = False  # q/k rows to interleaved RoPE (llama's NORM mode; HF rotates halves)
    head: bool = False  # output.weight written for a tied head too (a copy of token_embd): its loader wants one
    q_width: bool = False  # q is as wide as the model: head_dim · heads must be hidden_size
    biases: bool | None = None  # q/k/v biases: True it needs them, False it has none, None either
    renormalise: bool | None = None  # its experts' top-k weights renormalised; None: no experts
    nope_step: int | None = None  # every nope_step-th layer has no RoPE (a constant in llama.cpp, not a key)
    swa_step: int | None = None  # a window on layers il % swa_step < swa_step - 1 (llama.cpp's fixed pattern)
    yarn: bool = False  # YaRN written (rope.scaling.*), with llama.cpp's rounded ramp ends (HF truncate=True)
    unrounded_yarn: bool = False  # HF truncate=False written rounded, with a warning (how llama.cpp runs gpt-oss)
    swiglu_oai: tuple[float, float] | None = None  # (α, limit): clamped SwiGLU experts, gpt-oss's layout
    latent_gating: str | None = None  # DeepSeek's MLA as deepseek2 reads it; its gguf.ExpertGatingFuncType
    longrope: bool = False  # LongRoPE's factors written as rope_factors_short / rope_factors_long

    @property
    def name(self) -> str:
        """As gguf.MODEL_ARCH_NAMES spells it: qwen2moe, gpt-oss."""
        return self.member.lower().replace("_", "-")


ARCHES = {
    "llama": Arch("LLAMA", permute=True), "mistral": Arch("LLAMA", permute=True),
    "mixtral": Arch("LLAMA", permute=True, biases=False, renormalise=True),
    "qwen2": Arch("QWEN2"), "qwen3": Arch("QWEN3", biases=False),
    "qwen2_moe": Arch("QWEN2MOE", head=True, q_width=True, biases=True, renormalise=False),
    "qwen3_moe": Arch("QWEN3MOE", biases=False, renormalise=True),
    "olmo2": Arch("OLMO2", head=True, q_width=True, biases=False),
    "phi3": Arch("PHI3", q_width=True, biases=False, longrope=True),
    "smollm3": Arch("SMOLLM3", permute=True, head=True, biases=False, nope_step=4),
    "gpt_oss": Arch("GPT_OSS", head=True, biases=True, renormalise=True, swa_step=2, yarn=True, unrounded_yarn=True,
                    swiglu_oai=(1.702, 7.0)),  # softmax over the top-k logits: the top-k of a softmax renormalised
    "deepseek_v2": Arch("DEEPSEEK2", biases=False, yarn=True, latent_gating="SOFTMAX"),  # routing: ``deepseek``
    "deepseek_v3": Arch("DEEPSEEK2", biases=False, yarn=True, latent_gating="SIGMOID"),
}
# Families to_hf writes that this exporter does not: why, for the error message
NOT_WRITTEN = {
    "gpt2": "GPT-2 shape (learned positions, LayerNorm): llama.cpp's gpt2 architecture is not written by qkv's "
            "GGUF export yet; export a RoPE + RMSNorm + SwiGLU model (LLaMA shape), or use --format hf",
    "gpt_neox": "GPT-NeoX shape (RoPE with LayerNorm, the demo preset's): llama.cpp's gptneox architecture is not "
                "written by qkv's GGUF export yet; train with --norm rmsnorm --activation swiglu for a LLaMA "
                "shape, or use --format hf",
    "gemma2": "Gemma 2 ((1 + w) norms, soft caps, sliding layers) is not written by qkv's GGUF export yet",
    "gemma3": "Gemma 3 ((1 + w) norms, sliding layers, a local RoPE base) is not written by qkv's GGUF export yet",
}


def gguf_problems(model_type: str, hf: dict) -> list[str]:
    """What llama.cpp's architecture for ``model_type`` would compute differently from this HF config."""
    if model_type not in ARCHES:
        return [NOT_WRITTEN.get(model_type, f"Hugging Face model_type {model_type!r} has no GGUF mapping here")]
    arch = ARCHES[model_type]
    name, problems = arch.name, []
    if hf.get("hidden_act") != "silu":
        problems.append(f"hidden_act={hf.get('hidden_act')!r} (llama.cpp's {name} gates with silu: SwiGLU)")
    problems += rope_problems(arch, hf) + window_problems(arch, hf)
    heads, width = hf["num_attention_heads"], head_dim(hf) * hf["num_attention_heads"]
    if arch.q_width and width != hf["hidden_size"]:
        problems.append(f"head_dim={head_dim(hf)} × {heads} heads = {width} ≠ hidden_size={hf['hidden_size']} "
                        f"(llama.cpp's {name} makes q as wide as the model)")
    biased = bool(hf.get("attention_bias", hf.get("qkv_bias", False)))
    if arch.biases is not None and biased != arch.biases:
        problems.append(f"attention biases {'on' if biased else 'off'} (llama.cpp's {name} "
                        f"{'reads q/k/v biases' if arch.biases else 'has none'})")
    if arch.biases is False and hf.get("mlp_bias"):
        problems.append(f"mlp_bias=True (llama.cpp's {name} has none)")
    return problems + expert_problems(arch, hf) + nope_problems(arch, hf) + \
        (latent_problems(hf) if arch.latent_gating else [])


def rope_scaling(hf: dict) -> dict:
    """The config's RoPE scaling (4.x rope_scaling or 5.x rope_parameters), {} for none."""
    return hf.get("rope_scaling") or hf.get("rope_parameters") or {}


def scaling_type(hf: dict) -> str:
    """The config's RoPE scaling type ("type" before transformers 4.43), "default" for none."""
    scaling = rope_scaling(hf)
    return scaling.get("rope_type", scaling.get("type", "default"))


def gguf_warnings(arch: Arch, hf: dict) -> list[str]:
    """What a file of ``arch`` runs in llama.cpp with an approximation llama.cpp takes itself for it: gpt-oss's
    unrounded YaRN ramp (truncate=False) rounded (``yarn.ramp_warning``)."""
    if not arch.unrounded_yarn or scaling_type(hf) != "yarn":
        return []
    s = yarn_scaling(hf)
    if s.truncate:
        return []
    dims = int(head_dim(hf) * hf.get("partial_rotary_factor", 1.0))
    warning = ramp_warning(arch.name, dims, float(hf["rope_theta"]), s, hf["max_position_embeddings"])
    return [warning] if warning else []


def rope_problems(arch: Arch, hf: dict) -> list[str]:
    """RoPE scalings llama.cpp computes otherwise: LongRoPE, YaRN where not written or computed otherwise
    (``yarn.yarn_problems``)."""
    kind = scaling_type(hf)
    if kind == "longrope" and not arch.longrope:
        return [f"RoPE scaling 'longrope' (llama.cpp's {arch.name} has no short and long factors)"]
    if kind == "yarn" and arch.yarn:
        return yarn_problems(arch.name, yarn_scaling(hf), latent=bool(arch.latent_gating),
                             unrounded=arch.unrounded_yarn)
    # deepseek2: no linear (its graph would correct the scores as for YaRN: × (1 + 0.1 ln s)²)
    written = ("default",) + ("yarn",) * arch.yarn + ("longrope",) * arch.longrope + \
        ("linear",) * (not arch.latent_gating)
    if kind not in written:
        return [f"RoPE scaling {kind!r} (written for llama.cpp's {arch.name}: {', '.join(written[1:]) or 'none'})"]
    return []


def window_problems(arch: Arch, hf: dict) -> list[str]:
    """Sliding windows llama.cpp's architecture does not apply where HF does (or applies where HF does not)."""
    name, window, context = arch.name, hf.get("sliding_window"), hf.get("max_position_embeddings")
    if window is None or window >= context or not hf.get("use_sliding_window", True):
        return []
    if arch.swa_step is None:
        return [f"sliding_window={window} < context {context} (llama.cpp's {name} attends to every key)"]
    fixed = ["sliding_attention" if i % arch.swa_step < arch.swa_step - 1 else "full_attention"
             for i in range(hf["num_hidden_layers"])]
    types = hf.get("layer_types") or fixed
    return [] if list(types) == fixed else [f"layer_types={list(types)} (llama.cpp's {name} slides on {fixed})"]


def expert_problems(arch: Arch, hf: dict) -> list[str]:
    """What llama.cpp's routing for ``arch`` fixes that the HF config sets otherwise."""
    if arch.renormalise is None:
        return []
    name, problems = arch.name, []
    dense = hf.get("mlp_only_layers") or []
    if dense or hf.get("decoder_sparse_step", 1) != 1:
        problems.append(f"dense layers {dense} among the mixture-of-experts ones (llama.cpp's {name} has experts "
                        "in every layer)")
    renormalised = hf.get("norm_topk_prob", True)  # Mixtral's config has no such field: it renormalises
    if renormalised != arch.renormalise:
        problems.append(f"norm_topk_prob={renormalised} (llama.cpp's {name} "
                        f"{'renormalises' if arch.renormalise else 'does not renormalise'} the top-k weights)")
    if arch.swiglu_oai and (hf.get("swiglu_alpha"), hf.get("swiglu_limit")) != arch.swiglu_oai:
        problems.append(f"swiglu_alpha={hf.get('swiglu_alpha')}, swiglu_limit={hf.get('swiglu_limit')} (llama.cpp's "
                        f"{name} fixes α={arch.swiglu_oai[0]}, limit={arch.swiglu_oai[1]})")
    return problems


def nope_problems(arch: Arch, hf: dict) -> list[str]:
    """SmolLM3's layers without RoPE (no_rope_layers: 0 = NoPE) against the ones llama.cpp's graph skips."""
    if arch.nope_step is None:
        return []  # only SmolLM3's config has no_rope_layers
    n = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers") or [1] * n
    fixed = [int((i + 1) % arch.nope_step != 0) for i in range(n)]
    if list(flags[:n]) == fixed:
        return []
    return [f"no_rope_layers={list(flags[:n])} (llama.cpp's {arch.name} skips RoPE in every "
            f"{arch.nope_step}th layer: {fixed})"]


def head_dim(hf: dict) -> int:
    """D: the config's head_dim, else hidden_size / heads (Phi-3's writes none)."""
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]


def check_exportable(model) -> tuple[dict, Arch]:
    """(the HF config fields ``to_hf`` writes, the llama.cpp architecture) for ``model``; one ValueError naming
    every reason it has no GGUF counterpart."""
    family, fields = hf_config(getattr(model, "config", None), type(model))
    problems = gguf_problems(family.model_type, fields)
    if problems:
        raise ValueError(f"no GGUF counterpart for this {family.name} model: " + "; ".join(problems))
    return fields, ARCHES[family.model_type]


def llama_cpp_layout(state: dict, fields: dict, arch: Arch) -> dict:
    """An HF state dict with the tensors llama.cpp holds otherwise: fused experts split into gate and up, the
    shared expert's (1, C) gate as (C,), a tied head dropped (llama.cpp reuses token_embd) or copied where
    ``arch`` loads one; RoPE's inv_freq table dropped (llama.cpp computes it)."""
    out = {}
    for key, tensor in state.items():
        if arch.latent_gating and (latent := latent_tensors(key, tensor, fields)) is not None:
            out |= latent
        elif arch.swiglu_oai and ".experts." in key:
            out |= oai_experts(key, tensor)
        elif key.endswith("self_attn.sinks"):
            out[key + ".weight"] = tensor  # (H,): the converter's name
        elif key.endswith("experts.gate_up_proj"):  # (E, 2I, C) = [gate; up] along I
            stem = key.removesuffix("gate_up_proj")
            out[stem + "gate_proj.weight"], out[stem + "up_proj.weight"] = tensor.chunk(2, dim=1)  # (E, I, C) each
        elif key.endswith("experts.down_proj"):  # (E, C, I)
            out[key + ".weight"] = tensor
        elif key.endswith("shared_expert_gate.weight"):
            out[key] = tensor.reshape(-1)  # (1, C) -> (C,), as llama.cpp's qwen2moe loads it
        elif not key.endswith("rotary_emb.inv_freq"):
            out[key] = tensor
    if fields["tie_word_embeddings"]:
        if arch.head:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        else:
            out.pop("lm_head.weight", None)
    return out


def oai_experts(key: str, tensor: torch.Tensor) -> dict:
    """gpt-oss's experts as llama.cpp holds them: gate and up apart, (E, out, in), biases (E, out)."""
    stem, kind = key.rsplit(".", 1)
    if kind == "gate_up_proj":  # (E, C, 2I), interleaved
        gate, up = (w.transpose(1, 2) for w in interleaved(tensor))  # (E, I, C) each
        return {f"{stem}.gate_proj.weight": gate, f"{stem}.up_proj.weight": up}
    if kind == "gate_up_proj_bias":  # (E, 2I), interleaved
        gate, up = interleaved(tensor)
        return {f"{stem}.gate_proj.bias": gate, f"{stem}.up_proj.bias": up}
    if kind == "down_proj":  # (E, I, C)
        return {f"{stem}.down_proj.weight": tensor.transpose(1, 2)}
    return {f"{stem}.down_proj.bias": tensor}  # down_proj_bias (E, C)


def gguf_tensors(gguf, state: dict, fields: dict, arch: Arch):
    """(GGUF name, float32 array) for every tensor of an HF ``state`` dict in ``llama_cpp_layout``, named by
    gguf's table, q/k permuted to interleaved RoPE where the architecture wants it; LongRoPE's factors."""
    member = getattr(gguf.MODEL_ARCH, arch.member)
    names = gguf.get_tensor_name_map(member, fields["num_hidden_layers"])
    heads = {"q_proj": fields["num_attention_heads"], "k_proj": fields["num_key_value_heads"]}
    for key, tensor in llama_cpp_layout(state, fields, arch).items():
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"{key} has no name in gguf's {gguf.MODEL_ARCH_NAMES[member]} table")
        proj = key.rsplit(".", 2)[-2]
        if arch.permute and proj in heads:
            tensor = half_split_to_interleaved(tensor, heads[proj])  # (H·D, …): per head (2, D/2) -> (D/2, 2)
        yield name, tensor.detach().to(torch.float32).cpu().numpy()
    yield from rope_factor_tensors(gguf, fields)


def encode(gguf, name: str, data, qtype):
    """(bytes or array, its GGMLQuantizationType): 1-D tensors, norms, routers and biases f32, as the converter
    keeps them (a router rounded may choose other experts; llama-quantize quantises only ``.weight`` tensors);
    a matrix whose rows do not split into the type's blocks f16."""
    if data.ndim <= 1 or name.endswith(("_norm.weight", ".ffn_gate_inp.weight", ".bias")):
        qtype = gguf.GGMLQuantizationType.F32
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:  # rows not a multiple of the block: the converter's fallback
        qtype = gguf.GGMLQuantizationType.F16
        return gguf.quants.quantize(data, qtype), qtype


def write_hparams(gguf, writer, fields: dict, arch: Arch, file_type) -> None:
    """The architecture's metadata from the HF config fields, as convert_hf_to_gguf.py writes it."""
    D = head_dim(fields)
    writer.add_context_length(fields["max_position_embeddings"])
    writer.add_embedding_length(fields["hidden_size"])
    writer.add_block_count(fields["num_hidden_layers"])
    writer.add_feed_forward_length(fields["intermediate_size"])
    writer.add_head_count(fields["num_attention_heads"])
    if arch.latent_gating:
        write_latent_heads(writer, fields)
    else:
        writer.add_head_count_kv(fields["num_key_value_heads"])
        writer.add_key_length(D)
        writer.add_value_length(D)
        writer.add_rope_dimension_count(int(D * fields.get("partial_rotary_factor", 1.0)))  # Phi-3: the first dims
    writer.add_rope_freq_base(float(fields["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(fields["rms_norm_eps"]))
    writer.add_vocab_size(fields["vocab_size"])
    write_rope_scaling(gguf, writer, fields, arch)
    if arch.swa_step:
        writer.add_sliding_window(fields.get("sliding_window") or fields["max_position_embeddings"])
    write_experts(writer, fields)
    if arch.swiglu_oai:
        writer.add_expert_feed_forward_length(fields["intermediate_size"])  # gpt-oss: the experts' width
    if arch.latent_gating:
        write_latent_experts(gguf, writer, fields, arch.latent_gating)
    writer.add_file_type(file_type)


def write_rope_scaling(gguf, writer, fields: dict, arch: Arch) -> None:
    """rope.scaling.*: linear's factor; YaRN's (``yarn.write_yarn``); LongRoPE's original context and cos/sin
    scale, as the converter's Phi3MiniModel (``rope_problems`` has refused what else)."""
    scaling, kind = rope_scaling(fields), scaling_type(fields)
    if kind == "longrope":
        writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
        writer.add_rope_scaling_attn_factors(longrope_scale(scaling, fields["max_position_embeddings"]))
    elif kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    elif kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        write_yarn(writer, yarn_scaling(fields), latent=bool(arch.latent_gating))


def longrope_scale(scaling: dict, context: int) -> float:
    """LongRoPE's cos/sin factor as transformers computes it: attention_factor, else √(1 + ln s / ln L₀) with
    s the factor (else context / L₀), 1 where s ≤ 1."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or context / original
    return math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0


def rope_factor_tensors(gguf, fields: dict):
    """(GGUF name, float32 array) of LongRoPE's per-pair divisors, short and long; none without LongRoPE."""
    if scaling_type(fields) != "longrope":
        return
    scaling = rope_scaling(fields)
    for kind in ("short", "long"):
        name = gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, f"ROPE_FACTORS_{kind.upper()}")] + ".weight"
        yield name, torch.tensor(scaling[f"{kind}_factor"], dtype=torch.float32).numpy()


def write_experts(writer, fields: dict) -> None:
    """expert_count, expert_used_count and (Qwen's) the experts' and the shared expert's widths, where there
    are experts; Mixtral's width is feed_forward_length itself."""
    count = fields.get("num_local_experts", fields.get("num_experts"))
    if not count:
        return
    writer.add_expert_count(count)
    writer.add_expert_used_count(fields["num_experts_per_tok"])
    if fields.get("moe_intermediate_size"):
        writer.add_expert_feed_forward_length(fields["moe_intermediate_size"])
    if fields.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(fields["shared_expert_intermediate_size"])
