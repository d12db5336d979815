"""What a Hugging Face config says, and what a ``ModelConfig`` must say to be written as one.

Reading appends every problem to a list instead of raising, so that one ValueError can name them all.
transformers 4.x and 5.x spell some settings differently; both are read (``rope_parameters``):

    4.x   rope_theta and partial_rotary_factor at the top level, scaling in rope_scaling
          ({"type": …} before 4.43, {"rope_type": …} after); head_dim absent before 4.45
    5.x   one rope_parameters object holding rope_type, rope_theta (and partial_rotary_factor)

Keys absent in one version take their default (head_dim: hidden_size / heads; mlp_bias: False).
torch_dtype (4.x) and dtype (5.x) are accepted and read by neither: ``from_hf(dtype=…)`` decides.

Activation names are derived from ``qkv.nn.layers.ACTIVATIONS``: HF names an elementwise function
(``HF_ACTIVATIONS``), and a family either applies it (GPT-2, BERT, Marian) or gates with it (LLaMA).
"""
from __future__ import annotations

from ...models import ModelConfig
from ...nn.layers import ACTIVATIONS
from ...nn.rope_scaling import FIELDS as ROPE_SCALING_FIELDS
from ...nn.rope_scaling import RopeScaling
from .family import config_value

HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "silu": "silu", "swish": "silu"}  # HF's ACT2FN name -> the function's qkv name (Activation.base)
ROPE_THETA = 10000.0  # RoPE's base when a config names none (HF's default_theta, RoFormer's)


def require(hf: dict, problems: list[str], **needed) -> None:
    """Settings qkv has no counterpart for must keep their default."""
    for key, want in needed.items():
        if hf.get(key, want) != want:
            problems.append(f"{key}={hf[key]!r} is not supported (qkv needs {want!r})")


def hf_to_qkv(*, gated: bool) -> dict[str, str]:
    """HF activation name -> qkv activation: the ungated function of that name (GPT-2's activation_function,
    BERT's hidden_act), or, ``gated``, the GLU variant that gates with it (LLaMA's hidden_act)."""
    by_base = {a.base: name for name, a in ACTIVATIONS.items() if a.gated == gated}
    return {hf: by_base[base] for hf, base in HF_ACTIVATIONS.items() if base in by_base}


def qkv_to_hf(*, gated: bool, prefer: tuple[str, ...] = ()) -> dict[str, str]:
    """qkv activation -> the HF name a family writes for it: the first of ``prefer``, then of
    ``HF_ACTIVATIONS``, that names its function."""
    names, out = hf_to_qkv(gated=gated), {}
    for hf in (*prefer, *HF_ACTIVATIONS):
        if hf in names:
            out.setdefault(names[hf], hf)
    return out


def read_activation(hf: dict, key: str, default: str, problems: list[str], *, gated: bool = False) -> str:
    """The qkv activation ``hf[key]`` names (see ``hf_to_qkv``); a problem when qkv has none."""
    table, name = hf_to_qkv(gated=gated), hf.get(key, default)
    if not isinstance(name, str) or name not in table:
        problems.append(f"{key}={name!r} is not supported (qkv knows {sorted(table)})")
        return next(iter(table.values()))
    return table[name]


def rope_parameters(hf: dict, problems: list[str]) -> dict:
    """RoPE's settings as transformers 5 spells them (rope_type, rope_theta, …), from either version's config."""
    given = {}
    for key in ("rope_scaling", "rope_parameters"):  # 4.x, 5.x
        value = hf.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or any(isinstance(v, dict) for v in value.values()):
            problems.append(f"{key}={value!r:.80} is not supported (expected one JSON object of RoPE settings, "
                            "the same for every layer)")
            continue
        given[key] = {("rope_type" if k == "type" else k): v for k, v in value.items()}  # "type": before 4.43
    if len(given) == 2 and any(given["rope_scaling"].get(k, v) != v for k, v in given["rope_parameters"].items()):
        problems.append(f"rope_scaling={hf['rope_scaling']!r:.80} and rope_parameters={hf['rope_parameters']!r:.80} "
                        "disagree (expected one of them, or the same settings in both)")
    rope = {**given.get("rope_scaling", {}), **given.get("rope_parameters", {})}
    rope.setdefault("rope_type", "default")
    rope.setdefault("rope_theta", hf.get("rope_theta", ROPE_THETA))  # 4.x: at the top level
    if "partial_rotary_factor" in hf:
        rope.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    return rope


def rope_base_and_share(hf: dict, problems: list[str]) -> tuple[float, object]:
    """RoPE's θ base and the share of each head it rotates (partial_rotary_factor, 1.0 when absent);
    RoPE scaling (llama3, yarn, linear, dynamic, …) is a problem."""
    rope = rope_parameters(hf, problems)
    if rope["rope_type"] != "default":
        problems.append(f"RoPE scaling {rope['rope_type']!r} is not supported (qkv implements plain RoPE: "
                        "rope_type 'default')")
    return rope["rope_theta"], rope.get("partial_rotary_factor", 1.0)


def whole_head(partial, problems: list[str]) -> None:
    if partial != 1.0:
        problems.append(f"partial_rotary_factor={partial!r} is not supported (qkv rotates the whole head: 1.0)")


def plain_rope_base(hf: dict, problems: list[str]) -> float:
    """RoPE's θ base; RoPE scaling and partial rotation are problems (a family that rotates whole heads)."""
    base, partial = rope_base_and_share(hf, problems)
    whole_head(partial, problems)
    return base


def rope_base_and_scaling(hf: dict, problems: list[str]) -> tuple[float, dict | None]:
    """RoPE's θ base and its scaling as ``position.scaling`` (``RopeScaling.to_dict()``; None: plain RoPE), from
    either spelling (4.x rope_scaling with "type" or "rope_type", 5.x rope_parameters); partial rotation is a
    problem (a family that rotates whole heads)."""
    rope = rope_parameters(hf, problems)
    whole_head(rope.get("partial_rotary_factor", 1.0), problems)
    return rope["rope_theta"], read_rope_scaling(rope, hf, problems)


def read_rope_scaling(rope: dict, hf: dict, problems: list[str]) -> dict | None:
    """``rope_parameters``' scaling as RopeScaling fields, with the lengths transformers fills in: L₀ is the
    top-level original_max_position_embeddings (Phi-3), else rope's, else max_position_embeddings; dynamic
    rescales past max_position_embeddings; a missing yarn/longrope factor is max_position_embeddings / L₀.
    Keys the type does not read are ignored, as transformers ignores them."""
    kind, top = rope["rope_type"], hf.get("max_position_embeddings", 2048)
    if kind == "default":
        return None
    if kind not in ROPE_SCALING_FIELDS:
        problems.append(f"RoPE scaling {kind!r} is not supported (qkv knows rope_type "
                        f"{', '.join(repr(k) for k in ROPE_SCALING_FIELDS)})")
        return None
    needed, optional = ROPE_SCALING_FIELDS[kind]
    fields = {k: rope[k] for k in needed + optional if rope.get(k) is not None}
    if kind == "dynamic":
        fields["original_max_position_embeddings"] = top
    elif "original_max_position_embeddings" in needed:
        fields["original_max_position_embeddings"] = (hf.get("original_max_position_embeddings")
                                                      or fields.get("original_max_position_embeddings", top))
    if kind in ("yarn", "longrope") and "factor" not in fields and isinstance(top, int):
        fields["factor"] = top / fields["original_max_position_embeddings"]
    try:
        return RopeScaling(type=kind, **fields).to_dict()
    except (TypeError, ValueError) as e:
        problems.append(f"rope_type {kind!r}: {e}")
        return None


def dynamic_context(top: int, factor: float) -> int:
    """qkv's max_len for dynamic scaling by s past L₀ = max_position_embeddings: s·L₀, the context it stretches
    to (generate slides its window past max_len; Hugging Face has no such limit)."""
    return int(top * factor)


def scaled_max_len(hf: dict, scaling: dict | None) -> int:
    """The positions a qkv model of this config takes: max_position_embeddings, or ``dynamic_context``."""
    top = hf.get("max_position_embeddings", 2048)
    if scaling is None or scaling["type"] != "dynamic":
        return top
    return dynamic_context(scaling["original_max_position_embeddings"], scaling["factor"])


def export_rope_scaling(c: ModelConfig, problems: list[str]) -> dict:
    """``c.position.scaling`` as HF config fields: rope_scaling (rope_type, factor, …; rope_theta apart), and
    for dynamic max_position_embeddings = L₀ (transformers rescales past it; qkv reads max_len back as
    ``dynamic_context``); {} for plain RoPE."""
    s = c.position.scaling
    if s is None or s.type == "default":
        return {}
    scaling = {("rope_type" if k == "type" else k): v for k, v in s.to_dict().items()}
    if s.type != "dynamic":
        return dict(rope_scaling=scaling)
    top = scaling.pop("original_max_position_embeddings")
    if c.max_len != dynamic_context(top, s.factor):
        problems.append(f"max_len={c.max_len} with dynamic RoPE scaling (Hugging Face keeps max_position_embeddings="
                        f"{top}, which is read back as max_len = factor × {top} = {dynamic_context(top, s.factor)})")
    return dict(rope_scaling=scaling, max_position_embeddings=top)


def expect_plain_rope(c: ModelConfig, problems: list[str], family: str) -> None:
    """No RoPE scaling: a family whose export writes plain RoPE."""
    if c.position.scaling is not None and c.position.scaling.type != "default":
        problems.append(f"position.scaling type {c.position.scaling.type!r} ({family} is written with plain RoPE)")


def uniform_biases(bias: bool) -> dict[str, bool]:
    """The attention section's four bias fields set alike (HF's attention_bias and its GPT-2/BERT/Marian)."""
    return dict(q_bias=bias, k_bias=bias, v_bias=bias, out_bias=bias)


# --- writing: a ModelConfig's settings that a family has no counterpart for --------------------------

def expect(c: ModelConfig, problems: list[str], needed: dict[str, object]) -> None:
    """ModelConfig fields, "section.field" (``{"normalization.first": True}``), that must have these values."""
    problems += [f"{k}={config_value(c, k)!r} (needs {want!r})" for k, want in needed.items()
                 if config_value(c, k) != want]


# Variants of today's open models (QK-norm, windows, soft caps, Gemma's norms): a classic family has none, so a
# model with any of them is refused rather than written without it.
LATER_VARIANTS = (("attention", "qk_norm"), ("attention", "query_scalar"), ("attention", "softcap"),
                  ("attention", "sliding_window"), ("position", "local_base"), ("normalization", "sandwich"),
                  ("embedding", "scale_in_dtype"), ("head", "softcap"), ("attention", "qk_norm_scope"),
                  ("position", "nope_layers"), ("normalization", "post_sublayer"))


def expect_plain_blocks(c: ModelConfig, problems: list[str], allowed: tuple[str, ...] = ()) -> None:
    """Every block qkv's multi-head attention over the whole sequence: what HF's classic families are made of.
    ``allowed``: the ``LATER_VARIANTS`` ("attention.qk_norm", …) a family has, "layer_types" (sliding layers) and
    "attention.kind" (DeepSeek's latent attention), "moe" (a mixture-of-experts feed-forward)."""
    if c.moe.enabled and "moe" not in allowed:
        problems.append(f"moe.num_experts={c.moe.num_experts} (a mixture of experts; needs a dense feed-forward)")
    if c.attention.kind != "mha" and "attention.kind" not in allowed:
        problems.append(f"attention.kind={c.attention.kind!r} (needs 'mha')")
    if "layer_types" not in allowed and c.layer_types and set(c.layer_types) != {"full_attention"}:
        problems.append(f"layer_types={sorted(set(c.layer_types))} (needs full_attention in every layer)")
    for section, name in LATER_VARIANTS:
        value, default = getattr(getattr(c, section), name), getattr(type(getattr(c, section))(), name)
        if value != default and f"{section}.{name}" not in allowed:
            problems.append(f"{section}.{name}={value!r} (needs {default!r})")


# --- sliding layers: HF's layer_types, or the settings each family derived them from before ------------------

def read_layer_types(hf: dict, problems: list[str], default: list[str]) -> tuple[int | None, list[str] | None]:
    """(attention.sliding_window, layer_types) from ``hf["layer_types"]`` (5.x) or ``default`` (the family's
    older rule); no sliding layer: (None, None), so the model is the plain one."""
    n, given = hf.get("num_hidden_layers", 32), hf.get("layer_types")
    types = list(given) if given is not None else default
    if not isinstance(given, (list, tuple, type(None))) or len(types) != n:
        problems.append(f"layer_types={given!r:.80} (expected a list of {n} layer types, one per layer)")
        return None, None
    if "sliding_attention" not in types:
        return None, None
    window = hf.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        problems.append(f"sliding_window={window!r} with sliding_attention layers (expected a positive int)")
        return None, None
    return window, types


def export_layer_types(c: ModelConfig) -> list[str]:
    """Each layer's type as HF's layer_types lists them."""
    return [c.layer_type(i) for i in range(c.num_layers)]



def expect_sequential_blocks(c: ModelConfig, problems: list[str], family: str) -> None:
    """Blocks that add attention, then the feed-forward, to the residual one after the other."""
    if c.feed_forward.parallel:
        problems.append(f"feed_forward.parallel=True ({family}'s blocks are sequential; GPT-NeoX has the parallel "
                        "residual)")


def expect_whole_heads(c: ModelConfig, problems: list[str], family: str) -> None:
    """No grouped K/V heads and D = C / H: a family whose attention has neither."""
    if c.kv_heads != c.attention.num_heads:
        problems.append(f"attention.num_kv_heads={c.attention.num_kv_heads} ({family} has none)")
    if c.head_dim * c.attention.num_heads != c.d_model:
        problems.append(f"head_dim={c.head_dim} with {c.attention.num_heads} heads (needs d_model / num_heads = "
                        f"{c.d_model // c.attention.num_heads} in {family})")


def expect_biases(c: ModelConfig, problems: list[str], family: str) -> None:
    """A bias on every projection, attention's and the feed-forward's."""
    named = dict(zip(("q_bias", "k_bias", "v_bias", "out_bias"), c.attention.biases), ff_bias=c.feed_forward.bias)
    missing = [name for name, has in named.items() if not has]
    if len(missing) == len(named):
        problems.append(f"attention.q_bias, k_bias, v_bias, out_bias and feed_forward.bias=False ({family} has biases)")
    elif missing:
        problems.append(f"no {', '.join(missing)} ({family} has a bias on every projection)")


def expect_no_mlp_bias(c: ModelConfig, problems: list[str], family: str) -> None:
    """A family whose MLP has no bias setting (Qwen, Mistral, Gemma: LLaMA's mlp_bias is not read)."""
    if c.feed_forward.bias:
        problems.append(f"feed_forward.bias=True ({family}'s MLP has no bias)")


def export_activation(c: ModelConfig, problems: list[str], *, gated: bool, prefer: tuple[str, ...] = ()) -> str:
    """The HF name a family writes for ``c``'s activation (see ``qkv_to_hf``); a problem when it has none."""
    names = qkv_to_hf(gated=gated, prefer=prefer)
    if c.feed_forward.activation not in names:
        problems.append(f"feed_forward.activation={c.feed_forward.activation!r} (needs one of {sorted(names)})")
        return ""
    return names[c.feed_forward.activation]
