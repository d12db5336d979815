"""Multi-head latent attention's two decode paths beside multi-head attention: batch-1 decode steps.

    python -m benchmarks.latent_attention [--quick]

One layer at one width (d_model 512, 8 heads; MLA with d_c 128, d_R 32, d_N 64, d_V 64; MHA with head width 64
and RoPE), fp32, one new token attending over 512, 2 048 and 8 192 cached ones: the naive path (per-head K, V
cached, as Hugging Face's transformers 4), the absorbed path (only [c_KV; k_R] cached, W_UK folded into the query,
W_UV after the sum) and qkv.MultiHeadAttention with its KVCache. The three run in alternating rounds and
each is reported as the median of its rounds, so ratios come from one run. Beside each time: the step's
FLOPs (its matrix products, from the shapes: 2 per multiply-add) and the bytes of cache it reads per token.
The caches are filled with random latents (the naive cache with the same latents expanded), so the two MLA
paths must also give the same output: their largest difference is printed.
"""
from __future__ import annotations

import argparse

import torch

import qkv
from qkv.generation.timing import decode_step_seconds, fill_random
from qkv.nn.latent_attention import MultiHeadLatentAttention

from .common import machine_info, table

MLA_SHAPE = dict(kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64)
D_MODEL, HEADS, MHA_HEAD = 512, 8, 64
CONTEXTS = (512, 2048, 8192)
PATHS = ("MHA", "MLA naive", "MLA absorbed")


def flops_per_token(path: str, n: int, mla: MultiHeadLatentAttention) -> int:
    """FLOPs of one decoded token's matrix products, attending over n keys."""
    C, H = D_MODEL, HEADS
    if path == "MHA":
        return 2 * (4 * C * H * MHA_HEAD + 2 * H * n * MHA_HEAD)  # q, k, v, o; scores and weighted sum
    dc, dr, dn, dv = mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim
    shared = C * H * (dn + dr) + C * (dc + dr) + H * dv * C  # q_proj, kv_a_proj_with_mqa, o_proj
    if path == "MLA naive":  # kv_b_proj on the new token; then attention over per-head keys and values
        return 2 * (shared + dc * H * (dn + dv) + H * n * (dn + dr) + H * n * dv)
    # absorbed: W_UK into the query, attention over [c_KV; k_R] with values c_KV, then W_UV
    return 2 * (shared + H * dn * dc + H * n * (dc + dr) + H * n * dc + H * dc * dv)


def cache_numbers_per_token(path: str, mla: MultiHeadLatentAttention) -> int:
    """Numbers one token costs the layer's cache (per batch row): 2·H·D, H·(d_K + d_V), d_c + d_R."""
    if path == "MHA":
        return 2 * HEADS * MHA_HEAD
    if path == "MLA naive":
        return HEADS * (mla.qk_head_dim + mla.v_head_dim)
    return mla.kv_lora_rank + mla.qk_rope_head_dim


def filled_caches(mla, mha, S: int) -> dict:
    """The three caches, each holding S tokens: random latents, the naive cache holding them expanded."""
    latent = fill_random(mla.new_cache(1, S + 1), S)
    naive = mla.new_cache(1, S + 1, mode="naive")
    k_nope, v = mla.expand(latent.latent())  # (1, H, S, d_N), (1, H, S, d_V)
    naive.k[:, :, :S] = torch.cat((k_nope, latent.k_rope().expand(-1, HEADS, -1, -1)), dim=-1)
    naive.v[:, :, :S] = v
    mha_cache = fill_random(qkv.KVCache(1, HEADS, S + 1, MHA_HEAD), S)
    return {"MHA": mha_cache, "MLA naive": naive, "MLA absorbed": latent}


def step(module, cache, S: int, x: torch.Tensor) -> torch.Tensor:
    """One decoded token over S cached ones (the cache rewinds to S first, so every call does the same work)."""
    cache.pos = S
    return module(x, kv_cache=cache)  # one query: it sees every key, no mask needed


def run(S: int, mla, mha, *, repeats: int, inner: int) -> tuple[list[list], float]:
    caches, x = filled_caches(mla, mha, S), torch.randn(1, 1, D_MODEL)
    modules = {"MHA": mha, "MLA naive": mla, "MLA absorbed": mla}
    steps = {p: (lambda p=p: modules[p](x, kv_cache=caches[p]), [caches[p]]) for p in PATHS}
    times = decode_step_seconds(steps, S, repeats=repeats, inner=inner)  # interleaved rounds, medians
    agree = (step(mla, caches["MLA naive"], S, x) - step(mla, caches["MLA absorbed"], S, x)).abs().max().item()
    rows = []
    for p in PATHS:
        numbers = cache_numbers_per_token(p, mla)
        rows.append([S, p, f"{times[p] * 1e3:.3f}", f"{times[p] / times['MLA absorbed']:.2f}",
                     f"{flops_per_token(p, S + 1, mla) / 1e6:.2f}", numbers,
                     f"{numbers * (S + 1) * 4 / 2**20:.2f}"])
    return rows, agree


HEADER = ["cached tokens", "path", "ms / step", "time ÷ absorbed's", "MFLOP / token", "cache numbers / token",
          "cache MiB read / token"]


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    print(machine_info())
    mla = MultiHeadLatentAttention(D_MODEL, HEADS, **MLA_SHAPE, rope=qkv.RotaryEmbedding(32)).eval()
    mha = qkv.MultiHeadAttention(D_MODEL, HEADS, rope=qkv.RotaryEmbedding(MHA_HEAD)).eval()
    weights = {"MHA": sum(t.numel() for t in mha.parameters()), "MLA": sum(t.numel() for t in mla.parameters())}
    print(f"parameters: MHA {weights['MHA']:,}, MLA {weights['MLA']:,} (fp32 weights read per step: "
          f"{weights['MHA'] * 4 / 2**20:.2f} and {weights['MLA'] * 4 / 2**20:.2f} MiB)")
    rows = []
    with torch.inference_mode():
        for S in CONTEXTS:
            got, agree = run(S, mla, mha, repeats=5 if args.quick else 31, inner=5 if args.quick else 20)
            rows += got
            print(f"{S} cached tokens: naive and absorbed outputs differ by at most {agree:.1e}", flush=True)
    out = table(rows, HEADER)
    print(out)
    print("time ÷ absorbed's > 1: the absorbed path is faster; medians of alternating rounds, fp32, batch 1")
    return out


if __name__ == "__main__":
    main()
