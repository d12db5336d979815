"""The attention section of ``ModelConfig``: one of two kinds, each with its own fields.

    AttentionConfig         multi-head attention (kind "mha", "sink" or a registered kind): heads, key/value heads,
                            head width, a bias per projection, QK-norm, the scores' scale and soft cap, the window
    LatentAttentionConfig   multi-head latent attention (kind "mla", qkv.nn.latent_attention): heads, one bias,
                            the scores' scale, the latent and head widths, the decode cache

``attention_config`` builds the right one from a section, a dict of its fields (config.json) or None. Each kind
reads the other's fields as their absent values (a latent config's ``num_kv_heads`` None and ``qk_norm`` False, a
multi-head config's ``kv_lora_rank`` None), so code that asks about a sliding window or a latent width needs no
case for the kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..checks import check_positive_int
from ..nn.layers import check_softcap

MAX_WIDTH = 1 << 16  # sanity bound on widths read from untrusted configs
LATENT_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")  # kind mla
QK_NORM_SCOPES = ("head", "projection")  # what QK-norm normalises at once: one head's D, or the projection's H·D
LATENT_CACHES = ("absorbed", "naive")  # qkv.nn.latent_attention.CACHE_MODES
LATENT_KIND = "mla"


def check_size(name: str, value, *, optional: bool = False, limit: int = MAX_WIDTH * 64) -> None:
    """A positive int no larger than ``limit`` (configs come from files: refuse absurd sizes before allocating)."""
    check_positive_int(name, value, optional=optional)
    if value is not None and value > limit:
        raise ValueError(f"{name}={value} is absurdly large (limit {limit})")


@dataclass(frozen=True)
class AttentionConfig:
    """Multi-head self-attention of every block (and the encoder-decoder's cross-attention)."""

    kind: str = "mha"  # the class the factory builds: mha = qkv.MultiHeadAttention (grouped heads included); sink =
    #                    qkv.nn.sink_attention.SinkAttention (MHA with a learned sink logit per head: gpt-oss)
    num_heads: int = field(default=4, metadata={  # H
        "flag": "--heads", "help": "attention heads (must divide --d-model)"})
    num_kv_heads: int | None = field(default=None, metadata={  # G, dividing H; None: H (no grouping)
        "flag": "--kv-heads", "help": "key/value heads: grouped-query attention (must divide --heads)"})
    head_dim: int | None = None  # D; None: d_model / H
    q_bias: bool = True
    k_bias: bool = True
    v_bias: bool = True
    out_bias: bool = True
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3), the model's norm kind
    qk_norm_scope: str = "head"  # QK-norm over each head's D | "projection": over all H·D (G·D) at once (OLMo-2)
    query_scalar: float | None = None  # scores × query_scalar^-½ instead of D^-½ (Gemma's query_pre_attn_scalar)
    softcap: float | None = None  # scores ← cap·tanh(scores / cap) before the mask (Gemma 2's attn_logit_softcapping)
    sliding_window: int | None = None  # W: a sliding layer's query p sees keys p − W < j ≤ p (Mistral, Gemma)

    # latent attention's fields, read as absent (class attributes, not fields)
    kv_lora_rank = q_lora_rank = qk_rope_head_dim = qk_nope_head_dim = v_head_dim = None
    latent_cache = "absorbed"

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError(f"attention.kind must name an attention kind, got {self.kind!r}")
        if self.kind == LATENT_KIND:
            raise ValueError("attention.kind 'mla' is LatentAttentionConfig's (qkv.models.attention_config."
                             "attention_config builds it from a dict), got AttentionConfig(kind='mla')")
        check_size("attention.num_heads", self.num_heads)
        check_size("attention.num_kv_heads", self.num_kv_heads, optional=True)
        check_size("attention.head_dim", self.head_dim, optional=True, limit=MAX_WIDTH)
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        check_softcap("attention.softcap", self.softcap)
        check_softcap("attention.query_scalar", self.query_scalar)  # a positive number or None, as a cap
        check_size("attention.sliding_window", self.sliding_window, optional=True)
        if self.qk_norm_scope not in QK_NORM_SCOPES or (self.qk_norm_scope != "head" and not self.qk_norm):
            raise ValueError(f"attention.qk_norm_scope must be one of {QK_NORM_SCOPES} ('projection' with qk_norm="
                             f"True), got {self.qk_norm_scope!r} with qk_norm={self.qk_norm}")

    @property
    def biases(self) -> tuple[bool, bool, bool, bool]:
        """(q, k, v, out), as ``qkv.MultiHeadAttention(bias=...)`` takes them."""
        return self.q_bias, self.k_bias, self.v_bias, self.out_bias


@dataclass(frozen=True)
class LatentAttentionConfig:
    """DeepSeek-V2/V3's multi-head latent attention (``qkv.nn.MultiHeadLatentAttention``), by their names."""

    kind: str = LATENT_KIND
    num_heads: int = 4  # H
    q_bias: bool = True  # q_a_proj, kv_a_proj_with_mqa and o_proj share one bias setting (Hugging Face's
    k_bias: bool = True  # attention_bias): the four agree, so that ``biases`` reads as multi-head attention's
    v_bias: bool = True
    out_bias: bool = True
    query_scalar: float | None = None  # scores × query_scalar^-½ instead of d_K^-½
    kv_lora_rank: int | None = None  # d_c: the cached latent c_KV
    q_lora_rank: int | None = None  # d_q: the query's low-rank path; None: one q_proj
    qk_rope_head_dim: int | None = None  # d_R: the rotated part of q and the shared RoPE key (even)
    qk_nope_head_dim: int | None = None  # d_N: the unrotated part of each query and key head
    v_head_dim: int | None = None  # d_V: each value head
    latent_cache: str = "absorbed"  # generate's cache: absorbed (c_KV and k_R only) | naive (per-head K and V)

    # multi-head attention's fields that latent attention has not, read as absent (class attributes, not fields)
    num_kv_heads = None
    head_dim = None
    qk_norm = False
    qk_norm_scope = "head"
    softcap = None
    sliding_window = None

    def __post_init__(self) -> None:
        if self.kind != LATENT_KIND:
            raise ValueError(f"LatentAttentionConfig is attention.kind 'mla', got kind {self.kind!r}")
        if self.latent_cache not in LATENT_CACHES:
            raise ValueError(f"attention.latent_cache must be one of {LATENT_CACHES}, got {self.latent_cache!r}")
        for name in LATENT_FIELDS:  # the ones given (check_widths: the ones a model needs)
            if getattr(self, name) is not None:
                check_size(f"attention.{name}", getattr(self, name), limit=MAX_WIDTH)
        if (self.qk_rope_head_dim or 0) % 2:
            raise ValueError(f"attention.qk_rope_head_dim must be even (RoPE rotates pairs), got {self.qk_rope_head_dim}")
        if len(set(self.biases)) > 1:
            raise ValueError(f"attention.kind 'mla' has one bias setting (q_a_proj, kv_a_proj_with_mqa, o_proj: "
                             f"Hugging Face's attention_bias): q/k/v/out_bias must agree, got {self.biases}")
        check_size("attention.num_heads", self.num_heads)
        check_softcap("attention.query_scalar", self.query_scalar)

    def check_widths(self) -> None:
        """The widths a model needs, each given (q_lora_rank may be None: one q_proj); the bare section, all None,
        is the fields' defaults (what ``type(section)()`` compares against), not a model's attention."""
        for name in LATENT_FIELDS:
            check_size(f"attention.{name}", getattr(self, name), optional=name == "q_lora_rank", limit=MAX_WIDTH)

    @property
    def biases(self) -> tuple[bool, bool, bool, bool]:
        """(q, k, v, out): one setting, four times."""
        return self.q_bias, self.k_bias, self.v_bias, self.out_bias


ATTENTION_KINDS = (AttentionConfig, LatentAttentionConfig)
MULTI_HEAD_ONLY = tuple(f.name for f in fields(AttentionConfig) if f.name not in
                        {g.name for g in fields(LatentAttentionConfig)})
ATTENTION_FIELDS = (*fields(AttentionConfig), *(f for f in fields(LatentAttentionConfig)
                                                if f.name not in {g.name for g in fields(AttentionConfig)}))


def attention_config(value) -> AttentionConfig | LatentAttentionConfig:
    """The attention section from a section, a dict of its fields (kind "mla": latent; any other: multi-head), or
    None (multi-head's defaults). Each kind refuses the other's fields by name; a latent dict may carry the
    multi-head fields at their absent values (``LatentAttentionConfig`` reads them so)."""
    if value is None:
        return AttentionConfig()
    if isinstance(value, ATTENTION_KINDS):
        return value
    if not isinstance(value, dict):
        raise TypeError(f"expected an AttentionConfig, a LatentAttentionConfig or a dict of their fields, got "
                        f"{type(value).__name__}")
    if value.get("kind", "mha") != LATENT_KIND:
        given = {k: v for k, v in value.items() if k in LATENT_FIELDS and v is not None}
        if given or value.get("latent_cache", "absorbed") != "absorbed":
            raise ValueError(f"attention fields {sorted(given) or ['latent_cache']} belong to kind 'mla', "
                             f"got kind {value.get('kind', 'mha')!r}")
        return AttentionConfig(**{k: v for k, v in value.items() if k not in (*LATENT_FIELDS, "latent_cache")})
    check_latent_extras(value)
    return LatentAttentionConfig(**{k: v for k, v in value.items() if k not in MULTI_HEAD_ONLY})


def check_latent_extras(d: dict) -> None:
    """A latent dict's multi-head fields: absent or at their absent values (num_kv_heads may equal num_heads)."""
    if d.get("qk_norm"):
        raise ValueError("attention.qk_norm normalises q and k heads of one width D; attention.kind 'mla' has "
                         "no such heads (qk_norm needs kind 'mha')")
    heads = d.get("num_heads", LatentAttentionConfig.num_heads)
    if d.get("num_kv_heads") not in (None, heads):
        raise ValueError(f"attention.kind 'mla' has no grouped heads: num_kv_heads must be None or num_heads "
                         f"({heads}), got {d['num_kv_heads']}")
    unused = {k: d[k] for k in ("head_dim", "softcap", "sliding_window") if d.get(k) is not None}
    if d.get("qk_norm_scope", "head") != "head":
        unused["qk_norm_scope"] = d["qk_norm_scope"]
    if unused:
        raise ValueError(f"attention.kind 'mla' takes no {', '.join(unused)} (its widths are kv_lora_rank, "
                         f"qk_rope/qk_nope/v_head_dim), got {unused}")


def replace_attention(section, **changes) -> AttentionConfig | LatentAttentionConfig:
    """``section`` with ``changes`` (either kind's fields), checked as a dict is."""
    return attention_config({f.name: getattr(section, f.name) for f in fields(section)} | changes)
