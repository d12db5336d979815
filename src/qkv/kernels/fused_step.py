"""qkv's fused decode step: one token for each of a few rows through a whole pre-norm decoder in one call,
``DecoderState.step`` (``csrc/decoder_step.cpp``), what ``generate(backend="fused")`` runs on a CPU.

    ids (B, 1), slots (B, M), kv_caches, input_pos (1,)  ->  logits (B, V)      B ≤ MAX_ROWS, logits fp32
    greedy: up to n such steps in one call, each taking its logits' argmax  ->  tokens (B, k)

At batch 1 a token reads every weight once, so its time is the weights' bytes over the memory's rate. A
decoder that calls one kernel per weight matrix stops and restarts its threads dozens of times a token;
this step streams every weight in one parallel region, and looks the embedding up in C++ too, so a step is
one call from Python. The model's own forward is the reference: the tests compare logits, caches and tokens.

It accepts a model only where everything in it is something it was built and tested for (an allow-list):
a ``qkv.GPT`` whose every module is of a type in ``MODULES`` (exactly that type, no subclass, no hooks) and
whose every config field holds a value ``CONFIG`` accepts. A field ``CONFIG`` does not name is accepted at its
default value only, so a field added to ``ModelConfig`` later is refused until this step declares it. A section
``CONFIG`` names whole (``position.scaling``, a ``RopeScaling``) is judged whole, by its predicate.

Families it takes: GPT-2, LLaMA 1-3.x (RoPE scaled linear, llama3 or yarn: the table is the model's own
``RotaryEmbedding.angles``, attention factor included), Qwen2 (q/k/v biases), Qwen3 (QK-norm: the model's norm
over each head's D, before RoPE), Mistral and Qwen2 with sliding windows (a sliding layer's cache is its
``RingKVCache``: the C++ step writes slot p at ring row p mod W and attends over the W rows, the window itself).
Mixtral, Qwen3-MoE and Qwen2-MoE (mixture-of-experts layers, dense ones among them: softmax top-k routing,
renormalised or not, or the softmax over the k best logits; SwiGLU experts without biases; a shared SwiGLU expert,
× σ(x·w_s) where it has a gate; the router's product, each row's routing, then the chosen experts' rows and the
shared expert's, in the same parallel region). Sigmoid or group-limited routing, correction biases, a routed
scaling factor and biased or clamped experts (DeepSeek, gpt-oss) are refused.
RoPE whose θ follow the current length (dynamic NTK, longrope) is refused.
Weights: float32, bfloat16 (the model's own memory, each weight widened to fp32 in registers) or int8 as
``qkv.kernels.quant`` makes them (torchao's ``Int8Tensor``: the step reads its Q and its scale a row, ``int8_rows``);
norms, biases and position tables go in as fp32 copies, the caches are the model's (fp32 or bf16), the sums fp32.
The weights' memory (the model's own) is moved once onto 2 MB pages where Linux gives them (``onto_huge_pages``):
the same tensors and values, at new addresses.
A bf16 model's answer is the fp32 sums' over its weights, not its eager forward's bf16 roundings: logits close,
tokens mostly the same. Mixture-of-experts layers decode in float32 only; other weight types are refused.
``refuses`` says what it refuses (the check ``qkv.generation.paths`` lists as "fused"), and ``generate`` then
falls back to the next backend, saying why.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from ..models import GPT, ModelConfig
from ..models.config import LAYER_TYPES
from ..models.trunk import Embeddings
from ..nn.attention import MultiHeadAttention
from ..nn.block import TransformerBlock
from ..nn.kv_cache import KVCache, RingKVCache
from ..nn.layers import ACTIVATIONS, FeedForward
from ..nn.moe import MixtureOfExperts, Router, SwiGLUExperts
from ..nn.positional import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from ..nn.rope_scaling import LENGTH_DEPENDENT
from . import build as matvec
from .linear import KernelLinear, plain_tensor
from .moe import DecodeMixtureOfExperts
from .quant import int8_rows

MAX_ROWS = matvec.MAX_ROWS  # the rows its products read each weight row for, as the matrix-vector kernel's
NORMS = {nn.LayerNorm: 0, nn.RMSNorm: 1}  # decoder_step.cpp's Norm
ACTS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3}  # decoder_step.cpp's Act, by the activation's base function
MODULES = {GPT, Embeddings, nn.Embedding, LearnedPositionalEmbedding, SinusoidalPositionalEncoding, nn.ModuleList,
           TransformerBlock, MultiHeadAttention, RotaryEmbedding, FeedForward, nn.Linear, KernelLinear,
           nn.LayerNorm, nn.RMSNorm, nn.Dropout, MixtureOfExperts, DecodeMixtureOfExperts, Router, SwiGLUExperts}
ANY = None  # every value the config itself accepts
FLOATS = (torch.float32, torch.bfloat16)  # the weights' float types it reads (int8: ``int8_rows``)
PROJECTION = re.compile(r"blocks\.\d+\.(attn\.(q|k|v|out)_proj|ff\.(up|gate|down)_proj)\.weight|lm_head\.weight")  # what may be int8


@dataclasses.dataclass(frozen=True)
class Where:
    """The values of a field for which ``test`` holds, and what they are in words (the refusal's reason)."""

    test: object  # value -> bool
    says: str

    def __call__(self, value) -> bool:
        return bool(self.test(value))


def fixed_rope_table(scaling) -> bool:
    """RoPE scaling whose θ and attention factor do not change with the length (``LENGTH_DEPENDENT`` do): the
    table ``RotaryEmbedding.angles`` gives for every slot at once is the one each step of the model uses."""
    return scaling is None or scaling.type not in LENGTH_DEPENDENT


CONFIG = {  # field (section.name) -> the values the step computes as the model does (tests/test_decoder_step.py)
    "vocab_size": ANY, "d_model": ANY, "num_layers": ANY, "max_len": ANY, "dropout": ANY,
    "layer_types": Where(lambda v: v is None or set(v) <= {"full_attention", "sliding_attention"},
                         "full or sliding-window attention in each layer"),
    "attention.kind": {"mha"}, "attention.num_heads": ANY, "attention.num_kv_heads": ANY, "attention.head_dim": ANY,
    "attention.sliding_window": ANY,  # a sliding layer's cache is a ring of its W rows
    "attention.q_bias": ANY, "attention.k_bias": ANY, "attention.v_bias": ANY, "attention.out_bias": ANY,
    "attention.qk_norm": ANY,  # the model's norm (layernorm or rmsnorm, as normalization.kind) over each head's D
    "position.kind": {"learned", "sinusoidal", "rope", "none"}, "position.base": ANY, "position.interleaved": ANY,
    "position.sinusoidal_layout": ANY,
    "position.scaling": Where(fixed_rope_table, "RoPE whose table is fixed: no scaling, or a type other than "
                              + " and ".join(repr(t) for t in LENGTH_DEPENDENT)
                              + ", whose θ follow the current length"),
    "feed_forward.d_ff": ANY, "feed_forward.activation": {a for a, act in ACTIVATIONS.items() if act.base in ACTS},
    "feed_forward.bias": ANY,
    "normalization.kind": {"layernorm", "rmsnorm"}, "normalization.eps": ANY, "normalization.first": {True},
    "normalization.final": ANY,
    "embedding.scale": ANY, "embedding.init_std": ANY, "embedding.type_vocab_size": ANY, "embedding.norm": ANY,
    "head.tie": ANY, "head.bias": {False},
    # a mixture of experts (Mixtral, Qwen3-MoE, Qwen2-MoE): softmax routing, top-k, renormalised or not, or softmax
    # over the k best logits; SwiGLU experts without biases; a shared SwiGLU expert, gated or not (every other moe
    # field at its default only)
    "moe.num_experts": ANY, "moe.top_k": ANY, "moe.d_expert": ANY, "moe.score": {"softmax"}, "moe.top_k_first": ANY,
    "moe.norm_topk_prob": ANY, "moe.layers": ANY, "moe.aux_loss_coef": ANY, "moe.z_loss_coef": ANY,
    "moe.d_shared": ANY, "moe.shared_gate": ANY,
}
ROUTING = {"norm_topk_prob": 1, "top_k_first": 2}  # csrc/routing.h's Routing bits
assert set(LAYER_TYPES) >= {"full_attention", "sliding_attention"}


def config_fields(config, prefix: str = "") -> dict[str, tuple[object, object]]:
    """Every field of a config, sections flattened (but those ``CONFIG`` names whole), with its default:
    {"attention.num_heads": (4, 4), "position.scaling": (RopeScaling(type='linear', factor=2.0), None), ...}."""
    out, defaults = {}, type(config)()
    for f in dataclasses.fields(config):
        name, value = prefix + f.name, getattr(config, f.name)
        if dataclasses.is_dataclass(value) and name not in CONFIG:
            out |= config_fields(value, f"{name}.")
        else:
            out[name] = value, getattr(defaults, f.name)
    return out


def refuses_field(config: ModelConfig) -> str | None:
    """The first config field whose value the step was not built for, described; None when all are accepted."""
    for name, (value, default) in config_fields(config).items():
        accepts = CONFIG.get(name, "default")
        if accepts == "default":
            if value != default:
                return f"config field {name}={value!r}, which the fused step does not declare"
        elif accepts is not ANY and not (accepts(value) if callable(accepts) else value in accepts):
            return f"config field {name}={value!r} (it computes {describe(accepts)})"
    return None


def describe(accepts) -> str:
    return accepts.says if isinstance(accepts, Where) else " or ".join(repr(v) for v in sorted(accepts, key=str))


@functools.lru_cache(maxsize=8)
def skeleton(config: ModelConfig) -> dict[str, type]:
    """Every module a ``qkv.GPT`` of this config holds, by name, and its type (built on the meta device)."""
    with torch.device("meta"):
        return {name: type(m) for name, m in GPT(config).named_modules()}


def refuses_module(model: GPT) -> str | None:
    """The first module not exactly as a GPT of its config holds it (another type, an extra or a missing one,
    hooks, settings apart from the config); None when all pass."""
    c, rope, expected = model.config, model.blocks[0].attn.rope, skeleton(model.config)
    qk_norm = c.attention.qk_norm  # its norms' types and eps are checked as every module's
    scores = "QKNorm(q)·QKNorm(k)" if qk_norm else "q·k"
    for name, m in model.named_modules():
        where = name or "the model"
        if type(m) not in MODULES or name not in expected or not same_kind(type(m), expected[name]):
            want = f"a {expected[name].__name__}" if name in expected else "nothing of the kind"
            return f"{where} is a {type(m).__name__} where a qkv.GPT of this config has {want}"
        if m._forward_hooks or m._forward_pre_hooks:
            return f"{where} has hooks (the fused step would not call them)"
        if type(m) in NORMS and getattr(m, "weight", None) is None:
            return f"{where} is a norm without weights (it computes weighted LayerNorm and RMSNorm)"
        if type(m) in NORMS and m.eps != c.normalization.eps:
            return f"{where} has eps {m.eps} where the config says {c.normalization.eps}"
        if type(m) is MultiHeadAttention and (m.rope is not rope or m.alibi is not None or m.kv_dim != c.d_model):
            return f"{where}: attention whose position or key width differs from the model's"
        if type(m) is MultiHeadAttention and (m.scale, m.softcap, m.q_norm is None, m.k_norm is None) != (
                None, None, not qk_norm, not qk_norm):
            return f"{where}: attention with QK-norm, a scale or a soft cap (it computes softmax({scores}/√D) v)"
        if (reason := refuses_experts(m, c)) is not None:
            return f"{where}: {reason}"
    if rope is not None and not fixed_rope_table(rope.scaling):  # set on the module, whatever the config says
        return f"its RotaryEmbedding's {rope.scaling.type} scaling follows the current length (its table is not fixed)"
    missing = sorted(set(expected) - {name for name, _ in model.named_modules()})
    return f"the model lacks {missing[0]}, which a qkv.GPT of this config has" if missing else None


def same_kind(got: type, want: type) -> bool:
    """The type a GPT holds there; a module the speed layer swapped in (KernelLinear, DecodeMixtureOfExperts)
    counts as the one it stands for."""
    return got is want or any(got in kinds and want in kinds for kinds in SWAPPED)


SWAPPED = ((nn.Linear, KernelLinear), (MixtureOfExperts, DecodeMixtureOfExperts))


def refuses_experts(m: nn.Module, c: ModelConfig) -> str | None:
    """Why a router or experts module differs from what the step computes (its config's, which CONFIG checked)."""
    if type(m) is Router and (m.num_experts, m.top_k, m.score, m.top_k_first, m.norm_topk_prob, m.scaling) != (
            c.moe.num_experts, c.moe.top_k, "softmax", c.moe.top_k_first, c.moe.norm_topk_prob, 1.0):
        return "a router whose settings differ from the config's"
    if type(m) is Router and (m.bias is not None or m.correction_bias is not None or m.n_group is not None):
        return "a router with a bias, a correction bias or groups (it computes top-k of softmax(h W_rᵀ))"
    if type(m) is SwiGLUExperts and (m.activation != "swiglu" or m.gate_bias is not None or m.down_bias is not None):
        return "experts with biases or another activation (it computes silu(W_gate h) ⊙ W_up h)"
    shared = getattr(m, "shared", None)
    linears = () if shared is None else (shared.gate_proj, shared.up_proj, shared.down_proj, m.shared_gate)
    if isinstance(m, MixtureOfExperts) and shared is not None and (
            shared.activation != "swiglu" or any(linear.bias is not None for linear in linears if linear)):
        return "a shared expert with biases or another activation (it computes [σ(h·w_s)] silu(S_gate h) ⊙ S_up h)"
    return None


def refuses(model, batch: int) -> str | None:
    """Why the fused step cannot decode ``model`` at ``batch`` rows, or None where it can."""
    if type(model) is not GPT:
        return f"it decodes qkv.GPT models, not {type(model).__name__}"
    reason = refuses_field(model.config) or refuses_module(model) or refuses_parameter(model)
    if reason is not None:
        return reason
    weight = model.embed.tok.weight
    if batch > MAX_ROWS:
        return f"batch {batch} > {MAX_ROWS} rows (oneDNN's blocked products are faster there)"
    if weight.dtype not in FLOATS or not weight.is_cpu:
        return f"{weight.dtype} weights on {weight.device}: it runs float32, bfloat16 or int8 weights on a CPU"
    plain = [t for t in model.parameters() if plain_tensor(t)]
    if model.config.moe.enabled and any(t.dtype != torch.float32 for t in plain):
        return "mixture-of-experts layers with weights other than float32: it decodes those in float32 only"
    if not all(t.dtype in FLOATS and t.is_cpu and t.is_contiguous() for t in plain):
        return "a weight that is not a contiguous float32 or bfloat16 CPU tensor"
    if not matvec.available():
        return f"qkv's C++ kernels are not available here ({matvec.why_not() or 'the warning said why'})"
    return None


def refuses_parameter(model: GPT) -> str | None:
    """The first parameter that is neither a plain tensor nor, in a block's dense linear, an int8 weight it reads
    (``int8_rows``), described; None when all pass."""
    for name, p in model.named_parameters():
        if not plain_tensor(p) and (not PROJECTION.fullmatch(name) or int8_rows(p) is None):
            return (f"{name} is a quantised {type(p).__name__} it does not read (it reads float32, bfloat16, and "
                    "int8 with a scale a row in a block's attention and dense feed-forward and in the output head)")
    return None


def fp32(t: Tensor | None) -> Tensor:
    """A norm's, a bias's or a table's values as decoder_step.cpp reads them: float32 (a copy where they are
    not), an empty tensor for none."""
    return torch.empty(0) if t is None else t.detach().float().contiguous()


def norm_weights(norm: nn.Module | None) -> list[Tensor]:
    return [fp32(None if norm is None else norm.weight), fp32(getattr(norm, "bias", None))]


def matrix(weight: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    """A weight matrix as decoder_step.cpp reads it: a float one as it is (fp32 or bf16: the model's memory), an
    int8 one as its (Q, scales)."""
    rows = int8_rows(weight)
    return weight.detach().contiguous() if rows is None else rows


def linear_weights(*linears: nn.Linear | None) -> list[Tensor | tuple[Tensor, Tensor]]:
    """(weight, bias) of each, an empty tensor for what is absent (decoder_step.cpp reads it as none)."""
    out = []
    for m in linears:
        out += [torch.empty(0), torch.empty(0)] if m is None else [matrix(m.weight), fp32(m.bias)]
    return out


def embedding_weights(embed, max_len: int) -> list[Tensor]:
    """decoder_step.cpp's ``Embedding``: the token table, the position table (learned, or the sinusoids at
    the max_len positions the model takes), the token-type vector added (type 0's) and the embedding norm's two."""
    empty = torch.empty(0)
    if embed.pos is None:
        table = empty
    elif isinstance(embed.pos, LearnedPositionalEmbedding):
        table = fp32(embed.pos.weight)
    else:  # sinusoidal: its own forward at every position, as the model computes it
        table = fp32(embed.pos(torch.arange(max_len)))
    token_type = empty if embed.token_type is None else fp32(embed.token_type.weight[0])
    return [embed.tok.weight.detach().contiguous(), table, token_type] + norm_weights(embed.norm)


def layer_weights(model) -> list[Tensor]:
    """Every block's 30 tensors in decoder_step.cpp's ``Layer`` order (a dense feed-forward's or a mixture of
    experts': router, gate, up, down, its shared expert's gate, up, down and w_s), then Norm_f's two and the LM
    head."""
    out = []
    for b in model.blocks:
        a, f = b.attn, b.ff
        out += norm_weights(b.attn_norm) + linear_weights(a.q_proj, a.k_proj, a.v_proj, a.out_proj)
        dense = not isinstance(f, MixtureOfExperts)
        out += norm_weights(b.ff_norm) + linear_weights(*((f.up_proj, f.gate_proj, f.down_proj) if dense else
                                                          (None, None, None)))
        out += norm_weights(a.q_norm) + norm_weights(a.k_norm)  # QK-norm's, over one head's D (or none)
        out += [torch.empty(0)] * 4 if dense else [
            t.detach() for t in (f.router.weight, f.experts.gate_proj, f.experts.up_proj, f.experts.down_proj)]
        out += shared_weights(None if dense else f)
    return out + norm_weights(model.final_norm) + [matrix(model.lm_head.weight)]


def shared_weights(moe: MixtureOfExperts | None) -> list[Tensor]:
    """A mixture of experts' shared expert: its gate, up and down weights and w_s (C,), its gate's (none: empty)."""
    shared, gate, empty = getattr(moe, "shared", None), getattr(moe, "shared_gate", None), torch.empty(0)
    if shared is None:
        return [empty] * 4
    scale = empty if gate is None else gate.weight.detach().reshape(-1)  # (1, C) -> (C,)
    return [t.weight.detach() for t in (shared.gate_proj, shared.up_proj, shared.down_proj)] + [scale]


def experts_shape(moe, ff_width: int) -> list[int]:
    """decoder_step.cpp's Shape.E, K, I, routing and S: the mixture of experts' (E 0 where there is none) and its
    shared expert's width (0: none)."""
    if not moe.enabled:
        return [0, 0, 0, 0, 0]
    routing = ROUTING["top_k_first"] if moe.top_k_first else ROUTING["norm_topk_prob"] * moe.norm_topk_prob
    return [moe.num_experts, moe.top_k, moe.d_expert or ff_width, routing, moe.d_shared or 0]


HUGE_MIN_BYTES = 64 << 10  # a smaller storage is read in a few 4 KB pages: its copy would buy nothing
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # Linux's transparent huge pages: always [madvise] never
WARNED = set()  # the fallbacks already warned of (once a process)


def thp_mode() -> str | None:
    """Linux's THP setting ("always", "madvise" or "never"), None where there is none to read (another system,
    a kernel without THP)."""
    try:
        return re.search(r"\[(\w+)\]", THP.read_text()).group(1)
    except (OSError, AttributeError):
        return None


def onto_huge_pages(tensors: list[Tensor]) -> int:
    """Moves the CPU memory under ``tensors`` (each storage of at least HUGE_MIN_BYTES, once: one moved before stays)
    onto 2 MB pages, same values, same tensors (``onto_huge_pages`` in decoder_step.cpp: a fresh mapping asked for
    2 MB pages before it is touched, each storage copied in and its data pointer swapped) -> the bytes moved. A
    token streams every weight once: on 4 KB pages its reads take a page walk every 4 KB. Where THP is off or
    absent nothing moves, silently; where Linux refuses the mapping, nothing moves, with one warning."""
    if thp_mode() in (None, "never") or not matvec.available():
        return 0
    moved = matvec.MODULE.onto_huge_pages(tensors, HUGE_MIN_BYTES)
    if moved < 0 and "refused" not in WARNED:
        WARNED.add("refused")
        warnings.warn(f"Linux refused a mapping on 2 MB pages (THP {thp_mode()!r}): the fused step reads its "
                      "weights on 4 KB pages, slower", stacklevel=3)
    return max(moved, 0)


class FusedStep:
    """``generate``'s one-token step for ``model`` through ``DecoderState.step``: the same
    signature as ``qkv.generation.decode.last_logits(model)``, whose answer it gives (to fp32's rounding)."""

    def __init__(self, model) -> None:
        reason = refuses(model, 1)
        if reason is not None:
            raise ValueError(f"the fused decode step cannot run this model: {reason}")
        c, act = model.config, ACTIVATIONS[model.config.feed_forward.activation]
        tensors = embedding_weights(model.embed, c.max_len) + layer_weights(model)
        self.weights = [t[0] if isinstance(t, tuple) else t for t in tensors]
        self.scales = [t[1] if isinstance(t, tuple) else torch.empty(0) for t in tensors]  # int8's, a row each
        onto_huge_pages(self.weights + self.scales)  # the model's own memory, moved once (the next step's stays)
        self.eps, self.scale = c.normalization.eps, model.embed.scale
        self.rotary = rope = model.blocks[0].attn.rope  # one RotaryEmbedding, shared by the blocks
        self.shape = [c.d_model, c.attention.num_heads, c.kv_heads, c.head_dim, c.ff_width, c.vocab_size,
                      NORMS[type(model.blocks[0].attn_norm)], ACTS[act.base], int(act.gated),
                      0 if rope is None else 2 if rope.interleaved else 1]  # decoder_step.cpp's Shape and Rope
        self.experts = experts_shape(c.moe, c.ff_width)
        self.windows = [c.attention.sliding_window if t == "sliding_attention" else None for t in model.layer_types]
        self.caches = None

    def rope_table(self, capacity: int) -> Tensor:
        """cos and sin (2, M, D/2) of every slot's angles, as the model's RotaryEmbedding computes them (its own θ
        and attention factor: a scaling's, which ``refuses`` has checked does not follow the length)."""
        if self.rotary is None:
            return torch.empty(0)
        return torch.stack(self.rotary.angles(torch.arange(capacity))).float().contiguous()

    def state(self, kv_caches):
        """The C++ ``DecoderState`` for these caches: the weights, each layer's k and v buffers (B, G, M, D), or
        (B, G, W, D) for a sliding layer's ring, and RoPE's table, handed to C++ (and checked) once: the cache
        writes in place, the same tensors every step."""
        if self.caches is None or self.caches[0] is not kv_caches:
            capacity = self.check_caches(kv_caches)
            buffers = [t for cache in kv_caches for t in (cache.k, cache.v)]
            self.caches = kv_caches, matvec.MODULE.DecoderState(
                self.weights, buffers, self.rope_table(capacity), self.shape + [capacity] + self.experts, self.eps,
                self.scale, self.scales)
        return self.caches[1]

    def check_caches(self, kv_caches) -> int:
        """The slots M the caches stand for; ValueError unless each layer's is the one ``new_kv_caches`` makes:
        a ``KVCache`` of M rows, or for a sliding layer a ``RingKVCache`` of min(W, M) rows (the C++ step
        attends over all a cache's rows: a ring's are its window)."""
        capacity = kv_caches[0].max_len
        for i, (cache, window) in enumerate(zip(kv_caches, self.windows, strict=True)):
            kind, rows = (KVCache, capacity) if window is None else (RingKVCache, min(window, capacity or 0))
            if type(cache) is not kind or cache.max_len != capacity or cache.k.size(2) != rows:
                raise ValueError(f"layer {i}'s cache must be a {kind.__name__} of {rows} rows standing for "
                                 f"{capacity} slots (as new_kv_caches makes it), got a {type(cache).__name__} of "
                                 f"{cache.k.size(2)} rows for {cache.max_len}")
        return capacity

    def __call__(self, ids: Tensor, slots: Tensor, kv_caches, input_pos: Tensor) -> Tensor:
        """ids (B, 1) into cache slot input_pos (1,), slots (B, M) True on real tokens -> logits (B, V)."""
        return self.state(kv_caches).step(ids, slots, input_pos)

    def greedy(self, ids: Tensor, slots: Tensor, kv_caches, slot: int, n: int, eos_id: int | None,
               finished: Tensor) -> Tensor:
        """Up to n greedy steps in one call, the first feeding ids (B, 1) at ``slot``: each marks its slot and
        takes the argmax, as ``generate``'s loop does (a row that emitted ``eos_id`` emits it again, and the
        call stops once all have; ``finished`` (B,) is updated) -> the tokens (B, k), k ≤ n."""
        return self.state(kv_caches).greedy(ids, slots, slot, n, -1 if eos_id is None else eos_id, finished)
