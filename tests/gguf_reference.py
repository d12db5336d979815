"""What llama.cpp reads from a GGUF file, written out for the GGUF tests: the file read back with gguf-py's GGUFReader,
the tensor names an architecture loads (from ``gguf.MODEL_TENSORS``), each tensor against its Hugging Face weight
(q/k un-permuted by the converter's formula, experts re-joined), and llama.cpp's graph for the architectures qkv
writes (src/models/{llama,qwen2,qwen3,qwen2moe,qwen3moe,olmo2,phi3,smollm3}.cpp) in PyTorch over the file's tensors.

Shapes: T tokens, C model width, H heads, G key/value heads, D head width, E experts, I expert width, K per token.
"""
import re

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install -e '.[gguf]'")

# llama.cpp's build_moe_ffn(..., norm_w, ...) per architecture: the top-k weights renormalised or not
RENORMALISES = {"llama": True, "qwen2moe": False, "qwen3moe": True}
NOPE_STEP = {"smollm3": 4}  # src/models/smollm3.cpp: hparams.n_no_rope_layer_step = 4, no RoPE where (il + 1) % 4 == 0


def read(path):
    """(name -> float32 tensor in HF's (out, in) order, name -> GGMLQuantizationType, metadata key -> value)."""
    reader = gguf.GGUFReader(path)
    values = {t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).astype("float32").copy())
              .reshape(tuple(int(n) for n in reversed(t.shape))) for t in reader.tensors}
    types = {t.name: t.tensor_type for t in reader.tensors}
    meta = {k: f.contents() for k, f in reader.fields.items()}
    return values, types, meta


def expected_names(arch, blocks: int, *, absent=(), biases=()) -> set[str]:
    """The tensors llama.cpp loads for ``arch``: gguf.MODEL_TENSORS less the ``absent`` kinds (regexes over
    gguf.MODEL_TENSOR member names), with ``.bias`` tensors for the ``biases`` kinds."""
    out = set()
    for kind in gguf.MODEL_TENSORS[arch]:
        if any(re.fullmatch(pattern, kind.name) for pattern in absent):
            continue
        name = gguf.TENSOR_NAMES[kind]
        out |= {name.format(bid=i) + ".weight" for i in range(blocks)} if "{bid}" in name else {name + ".weight"}
    out |= {gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, k)].format(bid=i) + ".bias" for k in biases
            for i in range(blocks)}
    return out


def check_metadata(meta, arch, config, file_type, more=()):
    """The keys convert_hf_to_gguf.py writes for every architecture from the HF ``config``, and ``more``:
    (gguf.Keys template, value) pairs."""
    name = gguf.MODEL_ARCH_NAMES[arch]
    L = gguf.Keys.LLM
    want = {gguf.Keys.General.ARCHITECTURE: name, gguf.Keys.General.FILE_TYPE: file_type,
            L.CONTEXT_LENGTH: config["max_position_embeddings"], L.EMBEDDING_LENGTH: config["hidden_size"],
            L.BLOCK_COUNT: config["num_hidden_layers"], L.FEED_FORWARD_LENGTH: config["intermediate_size"],
            L.VOCAB_SIZE: config["vocab_size"], gguf.Keys.Attention.HEAD_COUNT: config["num_attention_heads"],
            gguf.Keys.Attention.HEAD_COUNT_KV: config["num_key_value_heads"],
            gguf.Keys.Attention.KEY_LENGTH: config["head_dim"], gguf.Keys.Attention.VALUE_LENGTH: config["head_dim"],
            gguf.Keys.Rope.DIMENSION_COUNT: config["head_dim"]} | dict(more)
    for key, value in want.items():
        assert meta[key.format(arch=name)] == value, key
    assert meta[gguf.Keys.Rope.FREQ_BASE.format(arch=name)] == pytest.approx(config["rope_theta"])
    assert meta[gguf.Keys.Attention.LAYERNORM_RMS_EPS.format(arch=name)] == pytest.approx(config["rms_norm_eps"])


def unpermute(w, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute undone: per head, rows (D/2, 2) -> (2, D/2)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def as_hf(values, key, names, arch, config):
    """The GGUF tensor (or tensors) that hold HF ``key``, in HF's layout; None where there is none."""
    if key.endswith("experts.gate_up_proj"):  # HF (E, 2I, C) = [gate; up]; llama.cpp two (E, I, C)
        stem = key.removesuffix("gate_up_proj")
        parts = [values.get(f"{names.get_name(stem + w)}.weight") for w in ("gate_proj", "up_proj")]
        return None if None in parts else torch.cat(parts, dim=1)
    name = names.get_name(key, try_suffixes=(".weight", ".bias"))
    name = name + ".weight" if name is not None and not name.endswith((".weight", ".bias")) else name
    if name not in values:
        return None
    got, proj = values[name], key.rsplit(".", 2)[-2]
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    if arch in (gguf.MODEL_ARCH.LLAMA, gguf.MODEL_ARCH.SMOLLM3) and proj in heads:
        got = unpermute(got, heads[proj])
    return got.reshape(1, -1) if key.endswith("shared_expert_gate.weight") else got  # llama.cpp's is (C,)


def check_values(values, types, hf_state, arch, config, qtype):
    """Each HF tensor against its GGUF one(s): exact in f32, within half a step of f16 / q8_0 otherwise; matrices
    of ``qtype``, vectors, norms and routers f32; no GGUF tensor left unchecked but a tied head's copy."""
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    for key, want in hf_state.items():
        got = as_hf(values, key, names, arch, config)
        if got is None:
            assert key == "lm_head.weight" or key.endswith("inv_freq"), key  # a tied head: token_embd
            continue
        assert got.shape == want.shape, key
        gate = key.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))  # a router; a vector to llama.cpp
        kind = qtype if want.dim() >= 2 and "norm" not in key and not gate else gguf.GGMLQuantizationType.F32
        assert {types[n] for n in values if got_from(n, key, names)} == {kind}, key
        want = want.float()
        if kind == gguf.GGMLQuantizationType.F32:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        elif kind == gguf.GGMLQuantizationType.Q8_0:  # per block of 32: d = max|w| / 127, stored in f16
            step = want.reshape(-1, 32).abs().amax(dim=1, keepdim=True) / 127
            assert ((got - want).reshape(-1, 32).abs() <= (0.5 + 127 * 2 ** -11) * step).all(), key
        else:
            torch.testing.assert_close(got, want.to(torch.float16).float(), rtol=0, atol=0)
    mapped = {n for n in values if any(got_from(n, k, names) for k in hf_state)}
    assert set(values) - mapped <= {"output.weight"}, set(values) - mapped


def got_from(name, key, names) -> bool:
    """Whether GGUF tensor ``name`` holds (part of) HF ``key``."""
    if key.endswith("experts.gate_up_proj"):
        stem = key.removesuffix("gate_up_proj")
        return name in {f"{names.get_name(stem + w)}.weight" for w in ("gate_proj", "up_proj")}
    mapped = names.get_name(key, try_suffixes=(".weight", ".bias"))
    return mapped is not None and name in (mapped, mapped + ".weight")


def rope(x, base, *, adjacent: bool, dims: int | None = None):
    """RoPE on the first ``dims`` of x (T, H, D) at positions 0..T-1: pairs (2i, 2i+1) (llama.cpp's NORM mode) or
    (i, i + dims/2) (NEOX); the other dims pass through."""
    T, _, D = x.shape
    dims = dims or D
    x, rest = x[..., :dims], x[..., dims:]
    angle = torch.arange(T)[:, None] * base ** (-torch.arange(0, dims, 2) / dims)  # (T, dims/2)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]  # (T, 1, dims/2)
    a, b = (x[..., 0::2], x[..., 1::2]) if adjacent else x.chunk(2, dim=-1)
    turned = (a * cos - b * sin, a * sin + b * cos)
    x = torch.stack(turned, dim=-1).flatten(-2) if adjacent else torch.cat(turned, dim=-1)
    return torch.cat([x, rest], dim=-1)


class Graph:
    """llama.cpp's graph for one architecture over a GGUF file's tensors ``t`` and metadata ``meta``."""

    def __init__(self, t, meta, arch):
        self.t, self.arch, name = t, arch, gguf.MODEL_ARCH_NAMES[arch]
        self.meta = {k.removeprefix(name + "."): v for k, v in meta.items()}
        self.H, self.G = self.meta["attention.head_count"], self.meta["attention.head_count_kv"]
        self.D, self.eps = self.meta["attention.key_length"], self.meta["attention.layer_norm_rms_epsilon"]
        self.renormalise, self.nope_step = RENORMALISES.get(name), NOPE_STEP.get(name)

    def norm(self, x, key):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.t[key + ".weight"]

    def proj(self, x, key):
        return x @ self.t[key + ".weight"].T + self.t.get(key + ".bias", 0)

    def logits(self, ids):
        """(T, V) for token ids: embed, each block (pre- or post-norm as the file holds), final norm, head."""
        x = self.t["token_embd.weight"][ids]
        for i in range(self.meta["block_count"]):
            b = f"blk.{i}."
            h = self.norm(x, b + "attn_norm") if b + "attn_norm.weight" in self.t else x  # olmo2: none before
            x = x + self.attention(b, h, rotate=self.nope_step is None or (i + 1) % self.nope_step != 0)
            h = self.norm(x, b + "ffn_norm") if b + "ffn_norm.weight" in self.t else x
            y = self.experts(b, h) if b + "ffn_gate_inp.weight" in self.t else self.mlp(b, h)
            x = x + (self.norm(y, b + "post_ffw_norm") if b + "post_ffw_norm.weight" in self.t else y)
        return self.norm(x, "output_norm") @ self.t.get("output.weight", self.t["token_embd.weight"]).T

    def attention(self, b, h, rotate: bool):
        """Causal self-attention of (T, C) ``h``: fused or separate q/k/v, QK-norm per head or over the projection,
        RoPE on rope.dimension_count dims (adjacent pairs in llama and smollm3, halves elsewhere) where ``rotate``,
        a post-norm in olmo2."""
        T, H, G, D, t = len(h), self.H, self.G, self.D, self.t
        if b + "attn_qkv.weight" in t:  # phi3: [q; k; v] rows
            q, k, v = self.proj(h, b + "attn_qkv").split([H * D, G * D, G * D], dim=-1)
        else:
            q, k, v = (self.proj(h, b + f"attn_{n}") for n in "qkv")
        whole = b + "attn_q_norm.weight" in t and t[b + "attn_q_norm.weight"].numel() == H * D
        if whole:  # olmo2: one norm over all heads
            q, k = self.norm(q, b + "attn_q_norm"), self.norm(k, b + "attn_k_norm")
        q, k, v = q.reshape(T, H, D), k.reshape(T, G, D), v.reshape(T, G, D)
        if b + "attn_q_norm.weight" in t and not whole:
            q, k = self.norm(q, b + "attn_q_norm"), self.norm(k, b + "attn_k_norm")
        if rotate:
            turn = dict(adjacent=self.arch in (gguf.MODEL_ARCH.LLAMA, gguf.MODEL_ARCH.SMOLLM3),
                        dims=self.meta["rope.dimension_count"])
            q, k = (rope(z, self.meta["rope.freq_base"], **turn) for z in (q, k))
        k, v = (z.repeat_interleave(H // G, dim=1) for z in (k, v))  # (T, H, D)
        scores = torch.einsum("thd,shd->hts", q, k) / D ** 0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out = self.proj(torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, -1), b + "attn_output")
        return self.norm(out, b + "post_attention_norm") if b + "post_attention_norm.weight" in t else out

    def mlp(self, b, h, gate="ffn_gate", up="ffn_up", down="ffn_down"):
        """SwiGLU: separate gate and up, or phi3's fused ffn_up = [gate; up] (llama.cpp's LLM_FFN_SWIGLU)."""
        if b + gate + ".weight" in self.t:
            return self.proj(torch.nn.functional.silu(self.proj(h, b + gate)) * self.proj(h, b + up), b + down)
        g, u = self.proj(h, b + up).chunk(2, dim=-1)
        return self.proj(torch.nn.functional.silu(g) * u, b + down)

    def experts(self, b, h):
        """build_moe_ffn: softmax over all experts, top-k, renormalised where the architecture does; each
        chosen expert's SwiGLU weighted; qwen2moe's shared expert scaled by σ(ffn_gate_inp_shexp · h)."""
        t, K = self.t, self.meta["expert_used_count"]
        assert t[b + "ffn_gate_inp.weight"].shape[0] == self.meta["expert_count"]
        weights, chosen = (h @ t[b + "ffn_gate_inp.weight"].T).softmax(-1).topk(K, dim=-1)  # (T, K) each
        if self.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        gate, up, down = (t[f"{b}ffn_{w}_exps.weight"][chosen] for w in ("gate", "up", "down"))  # (T, K, ·, ·)
        inner = torch.nn.functional.silu(torch.einsum("tc,tkic->tki", h, gate)) * torch.einsum("tc,tkic->tki", h, up)
        out = torch.einsum("tk,tkci,tki->tc", weights, down, inner)
        if b + "ffn_gate_inp_shexp.weight" in t:
            share = torch.sigmoid(h @ t[b + "ffn_gate_inp_shexp.weight"])[:, None]  # (T, 1)
            out = out + share * self.mlp(b, h, "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
        return out
