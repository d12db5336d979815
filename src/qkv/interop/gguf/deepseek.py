"""DeepSeek-V2 and -V3 as llama.cpp's ``deepseek2`` (src/models/deepseek2.cpp), as convert_hf_to_gguf.py's
DeepseekV2Model writes them.

    attention  multi-head latent attention in its absorbed form: q from ``attn_q`` or ``attn_q_a`` →
               ``attn_q_a_norm`` → ``attn_q_b``; ``attn_kv_a_mqa`` (C → r + R: the latent and the shared RoPE
               key), ``attn_kv_a_norm``; HF's ``kv_b_proj`` (H·(N + V), r) split per head into ``attn_k_b``
               (H, r, N), transposed, and ``attn_v_b`` (H, V, r); metadata as one key/value head
               (head_count_kv 1, key_length r + R, value_length r) and the per-head widths apart
               (key_length_mla N + R, value_length_mla V)
    RoPE       on adjacent pairs of the last R dims of each head (llama.cpp's NORM mode): HF's interleaved
               layout (V2 always, V3 with rope_interleave), so no row moves; V3 with rope_interleave=False
               rotates halves, so those R rows of q and of the RoPE key are permuted per head, as the
               converter's ``LlamaModel.permute``
    experts    from layer ``leading_dense_block_count`` on: ``ffn_gate_inp``, the stacked experts, the shared
               experts (``expert_shared_count`` of them, one SwiGLU), V3's correction bias ``exp_probs_b.bias``;
               ``expert_gating_func`` softmax (V2) or sigmoid (V3), the top-k chosen on scores + bias within the
               ``expert_group_used_count`` best of ``expert_group_count`` groups (a group scores its two best),
               weighed unbiased, renormalised where ``expert_weights_norm``, × ``expert_weights_scale``

YaRN is written with ``rope.scaling.yarn_log_multiplier`` (0.1 · mscale_all_dim), from which llama.cpp corrects the
cos/sin factor and the scores (``yarn``).

Refused: V2's group_limited_greedy over groups (its groups score their best expert only), experts without a
shared one (llama.cpp's graph adds one in every expert layer), RoPE scaling but YaRN as llama.cpp corrects it
(``architectures.rope_problems``).

Shapes: C model width, H heads, N and R a head's non-rotated and rotated q/k widths, V its value width,
r the latent (kv_lora_rank).
"""
from __future__ import annotations

import torch

from ..hf.rules import half_split_to_interleaved


def latent_problems(hf: dict) -> list[str]:
    """What llama.cpp's deepseek2 would compute differently from this DeepSeek config."""
    problems = []
    groups, kept = hf.get("n_group") or 1, hf.get("topk_group") or 1
    if hf.get("topk_method") == "group_limited_greedy" and 1 < groups and kept < groups:
        problems.append(f"topk_method='group_limited_greedy' with n_group={groups} (llama.cpp's deepseek2 scores a "
                        "group by its two best experts, DeepSeek-V2 by its best)")
    if hf.get("n_routed_experts") and hf.get("first_k_dense_replace", 0) < hf["num_hidden_layers"] \
            and not hf.get("n_shared_experts"):
        problems.append(f"n_shared_experts={hf.get('n_shared_experts')} (llama.cpp's deepseek2 adds a shared "
                        "expert in every mixture-of-experts layer)")
    return problems


def latent_tensors(key: str, tensor: torch.Tensor, fields: dict) -> dict | None:
    """HF ``key`` as deepseek2 holds it (kv_b_proj split, the correction bias renamed, RoPE rows on halves
    permuted to adjacent pairs); None: unchanged."""
    if fields.get("rope_interleave", True) is False and key.endswith(ROTATED):
        heads = 1 if key.endswith("kv_a_proj_with_mqa.weight") else fields["num_attention_heads"]
        return {key: rotated_rows_interleaved(tensor, heads, fields["qk_rope_head_dim"])}
    if key.endswith("kv_b_proj.weight"):  # (H·(N + V), r)
        H, N, V = fields["num_attention_heads"], fields["qk_nope_head_dim"], fields["v_head_dim"]
        k_b, v_b = tensor.reshape(H, N + V, -1).split([N, V], dim=1)  # (H, N, r), (H, V, r)
        stem = key.removesuffix("kv_b_proj.weight")
        return {stem + "k_b_proj.weight": k_b.transpose(1, 2), stem + "v_b_proj.weight": v_b}  # (H, r, N)
    if key.endswith("e_score_correction_bias"):
        return {key.removesuffix("_bias") + ".bias": tensor}  # the converter's name: exp_probs_b.bias
    return None


ROTATED = ("q_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight")  # rows: each head's last R rotate


def rotated_rows_interleaved(w: torch.Tensor, heads: int, R: int) -> torch.Tensor:
    """(heads·W, in) with each head's last R rows rotated on halves -> those rows in adjacent pairs."""
    w = w.reshape(heads, -1, w.shape[-1]).clone()  # (heads, W, in)
    w[:, -R:] = half_split_to_interleaved(w[:, -R:].reshape(heads * R, -1), heads).reshape(heads, R, -1)
    return w.flatten(0, 1)


def write_latent_heads(writer, fields: dict) -> None:
    """Heads as the absorbed form reads them: one key/value head of the latent plus the RoPE key."""
    r, R = fields["kv_lora_rank"], fields["qk_rope_head_dim"]
    writer.add_head_count_kv(1)
    writer.add_key_length(r + R)
    writer.add_value_length(r)
    writer.add_key_length_mla(fields["qk_nope_head_dim"] + R)
    writer.add_value_length_mla(fields["v_head_dim"])
    writer.add_rope_dimension_count(R)
    writer.add_kv_lora_rank(r)
    if fields.get("q_lora_rank"):
        writer.add_q_lora_rank(fields["q_lora_rank"])


def write_latent_experts(gguf, writer, fields: dict, gating: str) -> None:
    """The experts' keys deepseek2 reads, ``gating`` a gguf.ExpertGatingFuncType member (V2 SOFTMAX, V3 SIGMOID);
    every layer dense when there are no experts (leading_dense_block_count)."""
    experts, layers = fields.get("n_routed_experts"), fields["num_hidden_layers"]
    dense = fields.get("first_k_dense_replace", 0) if experts else layers
    writer.add_leading_dense_block_count(min(dense, layers))
    writer.add_expert_feed_forward_length(fields.get("moe_intermediate_size") or fields["intermediate_size"])
    writer.add_expert_shared_count(fields.get("n_shared_experts") or 0)
    if dense >= layers:
        return
    writer.add_expert_count(experts)
    writer.add_expert_used_count(fields["num_experts_per_tok"])
    writer.add_expert_gating_func(getattr(gguf.ExpertGatingFuncType, gating))
    writer.add_expert_weights_scale(float(fields.get("routed_scaling_factor") or 1.0))
    if fields.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    if gating == "SIGMOID" and (fields.get("n_group") or 1) > 1:  # V3's groups (V2's greedy ignores n_group)
        writer.add_expert_group_count(fields["n_group"])
        writer.add_expert_group_used_count(fields["topk_group"])
