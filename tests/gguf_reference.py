"""What llama.cpp reads from a GGUF file, written out for the GGUF tests: the file read back with gguf-py's GGUFReader,
the tensor names an architecture loads (from ``gguf.MODEL_TENSORS``), each tensor against its Hugging Face weight
(q/k un-permuted by the converter's formula, experts re-joined), and llama.cpp's graph for the architectures qkv
writes (src/models/{llama,qwen2,qwen3,qwen2moe,qwen3moe,olmo2,phi3,smollm3,openai-moe-iswa,deepseek2}.cpp) in PyTorch
over the file's tensors, with ggml's YaRN (ggml_rope_yarn_corr_dims: the ramp's ends rounded outwards; β_fast 32, β_slow 1)
and llama_context's cos/sin factor, deepseek2's kq_scale correction.

Shapes: T tokens, C model width, H heads, G key/value heads, D head width, E experts, I expert width, K per token.
"""
import math
import re

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install -e '.[gguf]'")

# llama.cpp's build_moe_ffn(..., norm_w, ...) per architecture: the top-k weights renormalised or not
RENORMALISES = {"llama": True, "qwen2moe": False, "qwen3moe": True}
OAI = gguf.MODEL_ARCH.GPT_OSS  # openai-moe-iswa.cpp: SOFTMAX_WEIGHT (softmax over the top-k logits), swiglu_oai
SWIGLU_OAI = (1.702, 7.0)  # build_moe_ffn's constexpr alpha and limit for LLM_FFN_SWIGLU_OAI_MOE
SWA_STEP = {"gpt-oss": 2}  # set_swa_pattern(2): layer il slides where il % 2 < 1
NOPE_STEP = {"smollm3": 4}  # src/models/smollm3.cpp: hparams.n_no_rope_layer_step = 4, no RoPE where (il + 1) % 4 == 0
YARN_BETAS = (32.0, 1.0)  # llama_hparams' yarn_beta_fast/slow: gpt-oss's and deepseek2's loaders read no key


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


def sources(key, names, arch) -> list[str]:
    """The GGUF tensors that hold HF ``key``: experts' gate and up apart (gpt-oss's biases too), else its one name."""
    stem, kind = key.rsplit(".", 1)
    if key.endswith("experts.gate_up_proj") or (arch == OAI and kind == "gate_up_proj_bias"):
        suffix = "bias" if kind.endswith("bias") else "weight"
        return [f"{names.get_name(f'{stem}.{w}_proj')}.{suffix}" for w in ("gate", "up")]
    if arch == OAI and kind in ("down_proj", "down_proj_bias"):
        return [f"{names.get_name(f'{stem}.down_proj')}.{'bias' if kind.endswith('bias') else 'weight'}"]
    if key.endswith("kv_b_proj.weight"):  # deepseek2: split per head into k_b and v_b
        return [names.get_name(key.replace("kv_b_proj", f"{w}_b_proj"), try_suffixes=(".weight",)) for w in "kv"]
    if kind == "e_score_correction_bias":
        return [names.get_name(f"{stem}.e_score_correction.bias", try_suffixes=(".bias",))]
    name = names.get_name(key, try_suffixes=(".weight", ".bias"))
    return [] if name is None else [name if name.endswith((".weight", ".bias")) else name + ".weight"]


def as_hf(values, key, names, arch, config):
    """The GGUF tensor (or tensors) that hold HF ``key``, in HF's layout; None where there is none."""
    parts = [values.get(n) for n in sources(key, names, arch)]
    if not parts or None in parts:
        return None
    if arch == OAI and ".experts." in key:  # HF (E, C, 2I) / (E, 2I) gate and up interleaved; (E, I, C) down
        if key.endswith("down_proj"):
            return parts[0].transpose(1, 2)
        return torch.stack([p if p.dim() == 2 else p.transpose(1, 2) for p in parts], dim=-1).flatten(-2)
    if key.endswith("experts.gate_up_proj"):  # HF (E, 2I, C) = [gate; up]; llama.cpp two (E, I, C)
        return torch.cat(parts, dim=1)
    if key.endswith("kv_b_proj.weight"):  # HF (H·(N + V), r); llama.cpp k_b (H, r, N), v_b (H, V, r)
        return torch.cat([parts[0].transpose(1, 2), parts[1]], dim=1).flatten(0, 1)
    got, proj = parts[0], key.rsplit(".", 2)[-2]
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    if arch in (gguf.MODEL_ARCH.LLAMA, gguf.MODEL_ARCH.SMOLLM3) and proj in heads:
        got = unpermute(got, heads[proj])
    if config.get("rope_interleave", True) is False and proj in ("q_proj", "q_b_proj", "kv_a_proj_with_mqa"):
        heads, R = 1 if proj.startswith("kv") else config["num_attention_heads"], config["qk_rope_head_dim"]
        got = got.reshape(heads, -1, got.shape[-1])  # deepseek2: each head's last R rows in adjacent pairs
        rotated = unpermute(got[:, -R:].reshape(heads * R, -1), heads).reshape(heads, R, -1)
        got = torch.cat([got[:, :-R], rotated], dim=1).flatten(0, 1)
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
        gate = key.endswith(("mlp.gate.weight", "shared_expert_gate.weight", "router.weight"))  # a router
        matrix = want.dim() >= 2 and "norm" not in key and "bias" not in key and not gate
        kind = qtype if matrix else gguf.GGMLQuantizationType.F32
        assert {types[n] for n in sources(key, names, arch)} == {kind}, key
        want = want.float()
        if kind == gguf.GGMLQuantizationType.F32:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        elif kind == gguf.GGMLQuantizationType.Q8_0:  # per block of 32 of a GGUF row: d = max|w| / 127, in f16
            steps = {n: values[n].reshape(-1, 32).abs().amax(dim=1, keepdim=True).expand(-1, 32)
                     .reshape(values[n].shape) / 127 for n in sources(key, names, arch)}  # each element's block's d
            step = as_hf(steps, key, names, arch, config)  # laid out as HF's tensor
            assert ((got - want).abs() <= (0.5 + 128 * 2 ** -11) * step).all(), key
        else:
            torch.testing.assert_close(got, want.to(torch.float16).float(), rtol=0, atol=0)
    mapped = {n for k in hf_state for n in sources(k, names, arch)}
    assert set(values) - mapped <= {"output.weight", "rope_factors_short.weight", "rope_factors_long.weight"}, \
        set(values) - mapped  # a tied head's copy; LongRoPE's factors (from the config)


def frequencies(meta, dims: int, *, rounded: bool = True):
    """(inv_freq (dims/2,), cos/sin scale): base^(-2i/dims); with YaRN, ggml's rope_yarn: each pair's frequency
    mixed between extrapolated and interpolated (÷ factor) by a ramp whose ends are rounded outwards
    (ggml_rope_yarn_corr_dims; not ``rounded``: transformers' truncate=False ends, which llama.cpp never computes),
    cos and sin scaled as ``yarn_scales`` says."""
    base = meta["rope.freq_base"]
    theta = base ** (-torch.arange(0, dims, 2, dtype=torch.float64) / dims)
    if meta.get("rope.scaling.type") != "yarn":
        return theta, 1.0
    factor, original = meta["rope.scaling.factor"], meta["rope.scaling.original_context_length"]
    def corr(beta):
        return dims * math.log(original / (beta * 2 * math.pi)) / (2 * math.log(base))
    low, high = corr(YARN_BETAS[0]), corr(YARN_BETAS[1])
    low, high = max(0, math.floor(low) if rounded else low), min(dims - 1, math.ceil(high) if rounded else high)
    extrapolate = 1 - ((torch.arange(dims // 2) - low) / max(0.001, high - low)).clamp(0, 1)
    return theta / factor * (1 - extrapolate) + theta * extrapolate, yarn_scales(meta)[0]


def yarn_scales(meta):
    """(cos/sin factor, deepseek2's scores' multiplier) with YaRN: llama_context's yarn_attn_factor a = 1 + 0.1 ln s,
    or 1 where yarn_log_multiplier is set (÷ 0.1 on load: mscale_all_dim), ÷ (1 + 0.1 ln s) which ggml's rope_yarn
    multiplies back; deepseek2.cpp's kq_scale × (a · (1 + 0.1 · mscale_all_dim · ln s))²."""
    factor = meta["rope.scaling.factor"]
    log_mul = meta.get("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
    a = 1.0 if log_mul else (1 + 0.1 * math.log(factor) if factor > 1 else 1.0)
    return a, (a * (1 + 0.1 * log_mul * math.log(factor))) ** 2


def rope(x, inv_freq, *, adjacent: bool, scale: float = 1.0):
    """RoPE on the first 2·len(inv_freq) dims of x (T, H, D) at positions 0..T-1: pairs (2i, 2i+1) (llama.cpp's
    NORM mode) or (i, i + dims/2) (NEOX), cos and sin times ``scale``; the other dims pass through."""
    T, dims = len(x), 2 * len(inv_freq)
    x, rest = x[..., :dims], x[..., dims:]
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # (T, dims/2)
    cos, sin = ((f(angle) * scale).float()[:, None] for f in (torch.cos, torch.sin))  # (T, 1, dims/2)
    a, b = (x[..., 0::2], x[..., 1::2]) if adjacent else x.chunk(2, dim=-1)
    turned = (a * cos - b * sin, a * sin + b * cos)
    x = torch.stack(turned, dim=-1).flatten(-2) if adjacent else torch.cat(turned, dim=-1)
    return torch.cat([x, rest], dim=-1)


class Graph:
    """llama.cpp's graph for one architecture over a GGUF file's tensors ``t`` and metadata ``meta``."""

    def __init__(self, t, meta, arch, *, rounded_ramp: bool = True):
        """``rounded_ramp`` False: YaRN's ramp with transformers' truncate=False ends, which llama.cpp never
        computes (to show that rounding them is all that differs)."""
        self.t, self.arch, name = t, arch, gguf.MODEL_ARCH_NAMES[arch]
        self.meta = {k.removeprefix(name + "."): v for k, v in meta.items()}
        self.H, self.G = self.meta["attention.head_count"], self.meta["attention.head_count_kv"]
        self.D, self.eps = self.meta["attention.key_length"], self.meta["attention.layer_norm_rms_epsilon"]
        self.renormalise = RENORMALISES.get(name, self.meta.get("expert_weights_norm", False))  # deepseek2: a key
        self.nope_step = NOPE_STEP.get(name)
        self.swa_step, self.window = SWA_STEP.get(name), self.meta.get("attention.sliding_window")
        self.inv_freq, self.scale = frequencies(self.meta, self.meta["rope.dimension_count"], rounded=rounded_ramp)
        self.kq = yarn_scales(self.meta)[1] if self.meta.get("rope.scaling.type") == "yarn" else 1.0  # deepseek2
        if "rope_factors_short.weight" in t:  # LongRoPE as llama.cpp runs it in a context ≤ the original one
            self.inv_freq = self.inv_freq / t["rope_factors_short.weight"].double()
            self.scale = self.meta["rope.scaling.attn_factor"]
        # gpt-oss's post_attention_norm is its feed-forward's pre-norm; olmo2's normalises the attention's output
        self.ffn_norm, self.attn_post_norm = ("post_attention_norm", None) if arch == OAI else \
            ("ffn_norm", "post_attention_norm")

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
            rotate = self.nope_step is None or (i + 1) % self.nope_step != 0
            slides = self.swa_step is not None and i % self.swa_step < self.swa_step - 1
            if b + "attn_kv_a_mqa.weight" in self.t:
                x = x + self.latent_attention(b, h)
            else:
                x = x + self.attention(b, h, rotate=rotate, window=self.window if slides else None)
            h = self.norm(x, b + self.ffn_norm) if f"{b}{self.ffn_norm}.weight" in self.t else x
            y = self.experts(b, h) if b + "ffn_gate_inp.weight" in self.t else self.mlp(b, h)
            x = x + (self.norm(y, b + "post_ffw_norm") if b + "post_ffw_norm.weight" in self.t else y)
        return self.norm(x, "output_norm") @ self.t.get("output.weight", self.t["token_embd.weight"]).T

    def attention(self, b, h, rotate: bool, window: int | None = None):
        """Causal self-attention of (T, C) ``h``: fused or separate q/k/v, QK-norm per head or over the projection,
        RoPE on rope.dimension_count dims (adjacent pairs in llama and smollm3, halves elsewhere) where ``rotate``,
        keys within ``window`` positions, a sink logit per head (gpt-oss), a post-norm in olmo2."""
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
            adjacent = self.arch in (gguf.MODEL_ARCH.LLAMA, gguf.MODEL_ARCH.SMOLLM3)
            q, k = (rope(z, self.inv_freq, adjacent=adjacent, scale=self.scale) for z in (q, k))
        k, v = (z.repeat_interleave(H // G, dim=1) for z in (k, v))  # (T, H, D)
        out = self.proj(attend(q, k, v, window, t.get(b + "attn_sinks.weight")), b + "attn_output")
        post = self.attn_post_norm and f"{b}{self.attn_post_norm}.weight" in t
        return self.norm(out, b + self.attn_post_norm) if post else out

    def latent_attention(self, b, h):
        """deepseek2's multi-head latent attention of (T, C) ``h``, decompressed: q (low-rank through attn_q_a_norm
        or plain) as N + R dims a head; attn_kv_a_mqa's latent (r, normed) and one shared RoPE key (R); per head
        keys [latent · attn_k_b; RoPE key] and values latent · attn_v_bᵀ; RoPE on adjacent pairs (cos/sin × YaRN's
        factor); scores × 1/√(N+R), × YaRN's kq_scale correction."""
        T, H, t = len(h), self.H, self.t
        R = self.meta["rope.dimension_count"]
        N = self.meta["attention.key_length_mla"] - R
        if b + "attn_q_a.weight" in t:
            q = self.proj(self.norm(self.proj(h, b + "attn_q_a"), b + "attn_q_a_norm"), b + "attn_q_b")
        else:
            q = self.proj(h, b + "attn_q")
        q_nope, q_pe = q.reshape(T, H, N + R).split([N, R], dim=-1)
        latent, k_pe = self.proj(h, b + "attn_kv_a_mqa").split([self.meta["attention.kv_lora_rank"], R], dim=-1)
        latent = self.norm(latent, b + "attn_kv_a_norm")  # (T, r)
        q_pe, k_pe = (rope(z, self.inv_freq, adjacent=True, scale=self.scale) for z in (q_pe, k_pe[:, None]))
        k = torch.cat([torch.einsum("sr,hrn->shn", latent, t[b + "attn_k_b.weight"]), k_pe.expand(T, H, R)], dim=-1)
        v = torch.einsum("sr,hvr->shv", latent, t[b + "attn_v_b.weight"])  # (T, H, V)
        scale = self.kq / (N + R) ** 0.5
        return self.proj(attend(torch.cat([q_nope, q_pe], dim=-1), k, v, scale=scale), b + "attn_output")

    def mlp(self, b, h, gate="ffn_gate", up="ffn_up", down="ffn_down"):
        """SwiGLU: separate gate and up, or phi3's fused ffn_up = [gate; up] (llama.cpp's LLM_FFN_SWIGLU)."""
        if b + gate + ".weight" in self.t:
            return self.proj(torch.nn.functional.silu(self.proj(h, b + gate)) * self.proj(h, b + up), b + down)
        g, u = self.proj(h, b + up).chunk(2, dim=-1)
        return self.proj(torch.nn.functional.silu(g) * u, b + down)

    def route(self, b, h):
        """build_moe_ffn's choice: (weights, experts) (T, K) each. Scores softmax or sigmoid (expert_gating_func);
        the top-k of scores + exp_probs_b, within the expert_group_used_count best groups (a group scores its two
        best), weighed by the unbiased scores, renormalised where the architecture does, × expert_weights_scale.
        gpt-oss: the top-k of the biased logits, softmax over those k."""
        t, K, meta = self.t, self.meta["expert_used_count"], self.meta
        assert t[b + "ffn_gate_inp.weight"].shape[0] == meta["expert_count"]
        logits = self.proj(h, b + "ffn_gate_inp")  # (T, E)
        if self.arch == OAI:
            top, chosen = logits.topk(K, dim=-1)
            return top.softmax(-1), chosen
        scores = logits.sigmoid() if meta.get("expert_gating_func") == 2 else logits.softmax(-1)  # 2: SIGMOID
        choice = scores + t.get(b + "exp_probs_b.bias", 0)
        groups = meta.get("expert_group_count", 1)
        if groups > 1:
            grouped = choice.reshape(len(h), groups, -1)  # (T, groups, E / groups)
            best = grouped.topk(2, dim=-1).values.sum(-1).topk(meta["expert_group_used_count"], dim=-1).indices
            kept = torch.zeros(len(h), groups, dtype=torch.bool).scatter(1, best, True)
            choice = grouped.masked_fill(~kept[..., None], float("-inf")).reshape(len(h), -1)
        chosen = choice.topk(K, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if self.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights * meta.get("expert_weights_scale", 1.0), chosen

    def experts(self, b, h):
        """build_moe_ffn: each chosen expert's SwiGLU (gpt-oss: biased, clamped) weighted as ``route`` says; a
        shared expert added (qwen2moe: scaled by σ(ffn_gate_inp_shexp · h))."""
        t = self.t
        weights, chosen = self.route(b, h)
        def each(w, kind="weight"):  # the chosen experts' tensors: (T, K, ·, ·) weights, (T, K, ·) biases
            key = f"{b}ffn_{w}_exps.{kind}"
            return t[key][chosen] if key in t else 0
        g, u = (torch.einsum("tc,tkic->tki", h, each(w)) + each(w, "bias") for w in ("gate", "up"))  # (T, K, I)
        if self.arch == OAI:
            alpha, limit = SWIGLU_OAI
            g, u = g.clamp(max=limit), u.clamp(-limit, limit)
            inner = g * torch.sigmoid(alpha * g) * (u + 1)
        else:
            inner = torch.nn.functional.silu(g) * u
        out = torch.einsum("tk,tkc->tc", weights, torch.einsum("tkci,tki->tkc", each("down"), inner)
                           + each("down", "bias"))
        if b + "ffn_up_shexp.weight" in t:
            gated = b + "ffn_gate_inp_shexp.weight" in t
            share = torch.sigmoid(h @ t[b + "ffn_gate_inp_shexp.weight"])[:, None] if gated else 1  # (T, 1)
            out = out + share * self.mlp(b, h, "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
        return out


def attend(q, k, v, window=None, sinks=None, scale=None):
    """Causal softmax attention (T, H, ·) -> (T, H·V), scores × ``scale`` (None: 1/√(q's width)); keys within
    ``window`` positions; ``sinks`` (H,): one more logit per head in each softmax, weighing no value."""
    T, H, D = q.shape
    scores = torch.einsum("thd,shd->hts", q, k) * (D ** -0.5 if scale is None else scale)
    back = torch.arange(T)[:, None] - torch.arange(T)  # (T, S): how far key s lies behind query t
    scores = scores.masked_fill((back < 0) | (back >= (window or T + 1)), float("-inf"))
    if sinks is None:
        weights = scores.softmax(-1)
    else:
        weights = torch.cat([scores, sinks[:, None, None].expand(H, T, 1)], dim=-1).softmax(-1)[..., :-1]
    return torch.einsum("hts,shd->thd", weights, v).reshape(T, -1)
