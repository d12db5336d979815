"""What defines a model's shape: ``ModelConfig``, a few component sections each validated on its own, and presets.

    ModelConfig       vocab_size, d_model, num_layers, max_len, dropout, num_decoder_layers, layer_types
      .attention      one of two kinds (qkv.models.attention_config): AttentionConfig, multi-head attention (heads,
                      key/value heads, head width, a bias per projection, QK-norm, the scores' scale and soft cap,
                      the sliding window), or LatentAttentionConfig, kind "mla" (multi-head latent attention,
                      qkv.nn.latent_attention: its latent and head widths and its decode cache)
      .position       PositionConfig: sinusoidal | learned | rope | alibi | t5 | none, its base, RoPE's pair layout
                      and rotated dims, T5's buckets
      .feed_forward   FeedForwardConfig: width, activation, bias, after attention or beside it (parallel)
      .normalization  NormConfig: LayerNorm or RMSNorm, eps, pre- or post-norm blocks, a final norm
      .embedding      EmbeddingConfig: √d_model scaling, initial std, token types, an embedding norm
      .head           HeadConfig: tied to the token embedding, a bias on the logits
      .moe            MoEConfig: a mixture-of-experts feed-forward (qkv.nn.moe) in the layers it names: experts,
                      top-k, the router's options, shared experts; num_experts None (the default): none

``layer_types`` says what each block is (Hugging Face's ``layer_types``: full_attention | sliding_attention);
None: every block the same (sliding where attention.sliding_window is set, as Mistral's).

One spelling: a setting is its section's field (``attention=AttentionConfig(num_heads=4)`` or
``attention={"num_heads": 4}``; ``config.attention.num_heads``). A config.json may hold the flat names of
``FLAT`` (``num_heads``, ``positional``, ``d_ff``, …; ``bias`` and ``final_norm`` set several fields): only
``from_dict`` reads them (``read_flat``), saying once which section field each is; elsewhere a flat name is a
TypeError that names its section field.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import asdict, dataclass, field, fields

from ..checks import check_fraction
from .attention_config import (ATTENTION_FIELDS, MAX_WIDTH, AttentionConfig, LatentAttentionConfig,
                               attention_config, check_size, replace_attention)
from .moe_config import MoEConfig
from .sections import (LAYER_TYPES, POSITIONAL, EmbeddingConfig, FeedForwardConfig, HeadConfig, NormConfig,
                       PositionConfig)

SECTIONS = {"attention": AttentionConfig, "position": PositionConfig, "feed_forward": FeedForwardConfig,
            "normalization": NormConfig, "embedding": EmbeddingConfig, "head": HeadConfig, "moe": MoEConfig}
# The flat names a config.json may hold: each is one field of a section ("bias" and "final_norm" set several:
# read_flat). Only from_dict reads them.
FLAT = {
    "num_heads": ("attention", "num_heads"), "num_kv_heads": ("attention", "num_kv_heads"),
    "positional": ("position", "kind"), "rope_base": ("position", "base"),
    "rope_interleaved": ("position", "interleaved"), "sinusoidal_layout": ("position", "sinusoidal_layout"),
    "d_ff": ("feed_forward", "d_ff"), "activation": ("feed_forward", "activation"),
    "norm": ("normalization", "kind"), "norm_eps": ("normalization", "eps"), "norm_first": ("normalization", "first"),
    "tie_embeddings": ("head", "tie"), "logits_bias": ("head", "bias"),
    "scale_embeddings": ("embedding", "scale"), "embed_init_std": ("embedding", "init_std"),
    "type_vocab_size": ("embedding", "type_vocab_size"), "embedding_norm": ("embedding", "norm"),
}
FLAT_APART = {"bias": "attention.q_bias, k_bias, v_bias, out_bias and feed_forward.bias",  # every projection's
              "final_norm": "normalization.final"}  # None or absent: as normalization.first


@dataclass(frozen=True, init=False)
class ModelConfig:
    """Everything that defines a model's shape: sizes, then one section per component. Validated on
    construction. A section is given as its dataclass or as a dict of its fields (over the defaults; in
    ``replace``, over the config's section)."""

    vocab_size: int
    d_model: int = field(metadata={"flag": "--d-model", "help": "model width"})  # C
    num_layers: int = field(metadata={"flag": "--layers", "help": "number of Transformer blocks"})  # blocks (the
    #                                                                   encoder's, in the encoder-decoder)
    max_len: int  # positions the model takes
    dropout: float
    num_decoder_layers: int | None  # encoder-decoder only; None: num_layers
    layer_types: tuple[str, ...] | None  # one of LAYER_TYPES per block; None: full attention in every block
    attention: AttentionConfig | LatentAttentionConfig
    position: PositionConfig
    feed_forward: FeedForwardConfig
    normalization: NormConfig
    embedding: EmbeddingConfig
    head: HeadConfig
    moe: MoEConfig

    def __init__(self, *, vocab_size: int = 256, d_model: int = 128, num_layers: int = 4, max_len: int = 256,
                 dropout: float = 0.0, num_decoder_layers: int | None = None,
                 layer_types: tuple[str, ...] | list[str] | None = None,
                 attention: AttentionConfig | LatentAttentionConfig | dict | None = None, position: PositionConfig | dict | None = None,
                 feed_forward: FeedForwardConfig | dict | None = None, normalization: NormConfig | dict | None = None,
                 embedding: EmbeddingConfig | dict | None = None, head: HeadConfig | dict | None = None,
                 moe: MoEConfig | dict | None = None, **unknown) -> None:
        refuse_flat("ModelConfig", unknown)
        given = dict(attention=attention, position=position, feed_forward=feed_forward,
                     normalization=normalization, embedding=embedding, head=head, moe=moe)
        for name, value in given.items():
            object.__setattr__(self, name, section_of(SECTIONS[name], value))
        top = dict(vocab_size=vocab_size, d_model=d_model, num_layers=num_layers, max_len=max_len, dropout=dropout,
                   num_decoder_layers=num_decoder_layers,
                   layer_types=None if layer_types is None else tuple(layer_types))
        for name, value in top.items():
            object.__setattr__(self, name, value)
        self.validate()

    def validate(self) -> None:
        """What no section can check alone: sizes, and the constraints between sections."""
        for name in ("vocab_size", "d_model", "num_layers", "max_len", "num_decoder_layers"):
            check_size(name, getattr(self, name), optional=name == "num_decoder_layers",
                       limit=MAX_WIDTH if name == "d_model" else MAX_WIDTH * 64)
        check_fraction("dropout", self.dropout)
        heads = self.attention.num_heads
        if self.attention.kind == "mla":
            self.attention.check_widths()
            self.check_latent_position()
        elif self.attention.head_dim is None and self.d_model % heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({heads})")
        elif self.position.kind == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim} (d_model / num_heads unless "
                             "attention.head_dim is given)")
        if self.attention.kind != "mla" and (self.position.rotary_dim or 0) > self.head_dim:
            raise ValueError(f"position.rotary_dim={self.position.rotary_dim} is more than head_dim={self.head_dim}")
        if self.position.scaling is not None:  # longrope: one factor per rotated pair
            self.position.scaling.check_dim(self.rope_dim)
        if self.feed_forward.parallel and not self.normalization.first:
            raise ValueError("feed_forward.parallel needs pre-norm blocks (normalization.first=True): a parallel "
                             "block adds both sublayers to its input")
        if self.position.kind == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal PE needs an even d_model, got {self.d_model}")
        self.check_layer_types()
        self.check_variants()
        if self.moe.layers is not None and len(self.moe.layers) != self.num_layers:
            raise ValueError(f"moe.layers must name each of the {self.num_layers} layers, got {list(self.moe.layers)}")

    def check_latent_position(self) -> None:
        """MLA rotates its own d_R dims with RoPE (decoupled RoPE): position.kind rope, all of them (any scaling;
        YaRN's mscale_all_dim also scales the scores, ``qkv.nn.latent_attention.latent_softmax_scale``)."""
        p = self.position
        if p.kind != "rope" or p.rotary_dim is not None or p.local_base is not None:
            raise ValueError(f"attention.kind 'mla' needs position.kind 'rope' rotating all qk_rope_head_dim dims "
                             f"(no rotary_dim, no local_base), got kind {p.kind!r}, rotary_dim {p.rotary_dim}, "
                             f"local_base {p.local_base}")

    def check_variants(self) -> None:
        """The attention and norm variants of today's open models, against the rest of the config."""
        a, n = self.attention, self.normalization
        if a.qk_norm and a.kind != "mha":
            raise ValueError(f"attention.qk_norm normalises q and k heads of one width D; attention.kind "
                             f"{a.kind!r} has no such heads (qk_norm needs kind 'mha')")
        if a.sliding_window is not None and a.sliding_window > self.max_len:
            raise ValueError(f"attention.sliding_window={a.sliding_window} is larger than max_len={self.max_len}")
        sliding = any(self.layer_type(i) == "sliding_attention" for i in range(self.num_layers))
        if sliding and a.sliding_window is None:
            raise ValueError("layer_types names sliding_attention layers, but attention.sliding_window is not set")
        if sliding and self.position.kind in ("alibi", "t5"):  # their biases assume key j sits at place j
            name = {"alibi": "ALiBi", "t5": "T5's relative bias"}[self.position.kind]
            raise ValueError(f"sliding_attention layers with {name} are not supported: use rope, learned, "
                             "sinusoidal or none")
        if n.post_sublayer and (n.first or n.sandwich or self.feed_forward.parallel):
            raise ValueError(f"normalization.post_sublayer needs sequential post-norm blocks, got normalization.first="
                             f"{n.first}, sandwich={n.sandwich}, feed_forward.parallel={self.feed_forward.parallel}")
        if a.qk_norm_scope == "projection" and n.kind != "rmsnorm":
            raise ValueError(f"attention.qk_norm_scope 'projection' is an RMSNorm (OLMo-2's), got normalization.kind "
                             f"{n.kind!r}")
        if any(not 0 <= i < self.num_layers for i in self.position.nope_layers or ()):
            raise ValueError(f"position.nope_layers={self.position.nope_layers} names layers outside 0 … "
                             f"{self.num_layers - 1}")
        if n.sandwich and (not n.first or self.feed_forward.parallel):
            raise ValueError(f"normalization.sandwich needs sequential pre-norm blocks, got normalization.first="
                             f"{n.first}, feed_forward.parallel={self.feed_forward.parallel}")

    def check_layer_types(self) -> None:
        types = self.layer_types
        if types is None:
            return
        if len(types) != self.num_layers or not all(isinstance(t, str) for t in types):
            raise ValueError(f"layer_types must name each of the {self.num_layers} layers, got {list(types)!r}")
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"unknown layer_types {unknown}; a layer is one of {LAYER_TYPES}")

    @property
    def head_dim(self) -> int:
        """D: attention.head_dim, or d_model / num_heads."""
        return self.attention.head_dim or self.d_model // self.attention.num_heads

    @property
    def rope_dim(self) -> int:
        """The dims RoPE rotates per head: MLA's qk_rope_head_dim, else position.rotary_dim or head_dim."""
        if self.attention.kind == "mla":
            return self.attention.qk_rope_head_dim
        return self.position.rotary_dim or self.head_dim

    @property
    def kv_heads(self) -> int:
        """G: the key/value heads (num_heads when not grouped)."""
        return self.attention.num_kv_heads or self.attention.num_heads

    @property
    def ff_width(self) -> int:
        return 4 * self.d_model if self.feed_forward.d_ff is None else self.feed_forward.d_ff

    @property
    def has_final_norm(self) -> bool:
        return self.normalization.final

    def layer_type(self, i: int) -> str:
        """What block i is (``layer_types``; when None, sliding_attention where a sliding window is set, as
        Mistral's every layer, full_attention otherwise)."""
        if self.layer_types is not None:
            return self.layer_types[i]
        return "sliding_attention" if self.attention.sliding_window is not None else "full_attention"

    def moe_layer(self, i: int) -> bool:
        """Whether block i's feed-forward is the mixture of experts (moe.layers; None: every block's, with experts)."""
        return self.moe.enabled and (self.moe.layers is None or self.moe.layers[i] == "moe")

    def replace(self, **changes) -> "ModelConfig":
        """A copy with ``changes`` applied, validated again: sizes, and sections (a section's dataclass replaces
        it; a dict sets those of its fields over this config's section)."""
        refuse_flat("ModelConfig.replace", {k: v for k, v in changes.items() if k in FLAT or k in FLAT_APART})
        for name, value in changes.items():
            if name in SECTIONS and isinstance(value, dict):
                changes[name] = replace_section(name, getattr(self, name), value)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """A JSON-ready dict: the sizes, then one object per section."""
        d = asdict(self)
        d["layer_types"] = None if self.layer_types is None else list(self.layer_types)
        d["position"]["scaling"] = None if self.position.scaling is None else self.position.scaling.to_dict()
        if not self.moe.enabled:  # no experts: no moe object
            del d["moe"]
        elif d["moe"]["layers"] is not None:
            d["moe"]["layers"] = list(d["moe"]["layers"])
        if self.position.kind != "t5":  # T5's buckets only with positional t5
            for name in ("num_buckets", "max_distance"):
                del d["position"][name]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build from a dict (config.json: sections, or the flat names of ``FLAT``, read by ``read_flat`` and
        said once), refusing unknown keys and values of the wrong type."""
        if not isinstance(d, dict):
            raise TypeError(f"a model config must be a JSON object, got {type(d).__name__}")
        top = {f.name for f in fields(cls)} - set(SECTIONS)
        unknown = sorted(set(d) - top - set(SECTIONS) - set(FLAT) - set(FLAT_APART))
        if unknown:
            raise ValueError(f"unknown ModelConfig keys: {unknown}")
        for key, value in d.items():
            if key in SECTIONS:
                check_section_dict(key, value)
            elif key in FLAT:
                section, name = FLAT[key]
                check_type(f"ModelConfig.{key}", value, getattr(SECTIONS[section](), name))
            elif key == "bias":
                check_type("ModelConfig.bias", value, True)
        flat = {k: d[k] for k in d if k in FLAT or k in FLAT_APART}
        if flat:
            say_flat(flat)
        given = {k: v for k, v in d.items() if k not in flat}
        sections = {name: section_of(SECTIONS[name], given.pop(name, None)) for name in SECTIONS}
        return cls(**given, **read_flat(sections, flat))

    @classmethod
    def preset(cls, name: str, **overrides) -> "ModelConfig":
        """Preset ``name`` with ``overrides`` applied as ``replace`` applies them."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        refuse_flat("ModelConfig.preset", {k: v for k, v in overrides.items() if k in FLAT or k in FLAT_APART})
        return PRESETS[name].replace(**overrides)


def section_of(cls: type, value):
    """A section from its dataclass, a dict of its fields, or None (its defaults); the attention section is one
    of two kinds (``attention_config``)."""
    if cls is AttentionConfig:
        return attention_config(value)
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return cls(**value)
    raise TypeError(f"expected a {cls.__name__} or a dict of its fields, got {type(value).__name__}")


def replace_section(name: str, section, changes: dict):
    """``section`` (ModelConfig's section ``name``) with the fields of ``changes`` set over it."""
    if name == "attention":  # the attention section's kind decides its fields
        return replace_attention(section, **changes)
    return dataclasses.replace(section, **changes)


def section_spelling(key: str, value) -> str:
    """How flat name ``key`` = ``value`` is spelled in sections."""
    if key == "bias":
        return (f"bias sets attention.q_bias, k_bias, v_bias, out_bias and feed_forward.bias: pass "
                f"attention={{'q_bias': {value!r}, 'k_bias': {value!r}, 'v_bias': {value!r}, 'out_bias': {value!r}}}"
                f" and feed_forward={{'bias': {value!r}}}")
    section, name = FLAT.get(key, ("normalization", "final"))
    cls = "AttentionConfig" if section == "attention" else SECTIONS[section].__name__
    return (f"{key} is {section}.{name}: pass {section}={cls}({name}={value!r}) or "
            f"{section}={{{name!r}: {value!r}}}")


def refuse_flat(where: str, given: dict) -> None:
    """TypeError for keywords that are not ModelConfig's: a flat name, with its section spelling."""
    if not given:
        return
    flat = [section_spelling(k, v) for k, v in given.items() if k in FLAT or k in FLAT_APART]
    others = sorted(k for k in given if k not in FLAT and k not in FLAT_APART)
    if others:
        raise TypeError(f"{where} got unexpected keyword arguments {others}")
    raise TypeError(f"{where} takes each setting in its section: " + "; ".join(flat))


SAID_FLAT: set[str] = set()  # the flat names from_dict has said the section spelling of, in this process


def say_flat(flat: dict) -> None:
    """One warning per flat name a process reads (``from_dict``), naming its section field."""
    new = [k for k in flat if k not in SAID_FLAT]
    if new:
        SAID_FLAT.update(new)
        where = ", ".join(f"{k} -> {FLAT_APART.get(k) or '.'.join(FLAT[k])}" for k in new)
        warnings.warn(f"a model config with flat names, read as their section fields ({where}); saving the "
                      f"config again writes the sections", FlatConfigNames, stacklevel=3)


class FlatConfigNames(UserWarning):
    """A model config (config.json) held flat names: read, and said once per name (``say_flat``)."""


def read_flat(sections: dict, flat: dict) -> dict:
    """The sections with the flat names of a config.json applied: a ``FLAT`` name sets its section's field,
    ``bias`` every projection's, ``final_norm`` the final norm (None or absent: as normalization.first)."""
    changes = {name: {} for name in sections}
    for key, value in flat.items():
        if key in FLAT:
            section, name = FLAT[key]
            changes[section][name] = value
    if "bias" in flat:
        changes["attention"].update(q_bias=flat["bias"], k_bias=flat["bias"], v_bias=flat["bias"],
                                    out_bias=flat["bias"])
        changes["feed_forward"]["bias"] = flat["bias"]
    if "norm_first" in flat or "final_norm" in flat:  # final_norm None (or absent): as norm_first
        first = changes["normalization"].get("first", sections["normalization"].first)
        final = flat.get("final_norm")
        changes["normalization"]["final"] = first if final is None else final
    return {name: replace_section(name, sections[name], c) if c else sections[name] for name, c in changes.items()}


def check_type(where: str, value, default) -> None:
    """``value`` has the type of the field's ``default`` (bools, strings and numbers are not mixed up)."""
    if isinstance(default, bool) and not isinstance(value, bool):
        raise TypeError(f"{where} must be a bool, got {value!r}")
    if isinstance(default, str) and not isinstance(value, str):
        raise TypeError(f"{where} must be a str, got {value!r}")
    if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TypeError(f"{where} must be a number, got {value!r}")


def check_section_dict(name: str, d) -> None:
    """A section read from JSON: an object of that section's known fields, each of its type."""
    if not isinstance(d, dict):
        raise TypeError(f"ModelConfig.{name} must be a JSON object, got {type(d).__name__}")
    known = {f.name: f for f in section_fields(name)}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"unknown ModelConfig.{name} keys: {unknown}")
    for key, value in d.items():
        check_type(f"ModelConfig.{name}.{key}", value, known[key].default)


def section_fields(name: str) -> tuple:
    """The fields a section's JSON object may hold: its dataclass's; the attention section's, either kind's."""
    return ATTENTION_FIELDS if name == "attention" else fields(SECTIONS[name])


NO_BIAS = dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False)  # attention's four projections

PRESETS: dict[str, ModelConfig] = {  # why each is shaped so: docs/design-notes.md
    "tiny": ModelConfig(vocab_size=64, d_model=32, num_layers=2, max_len=64,  # unit tests
                        attention=AttentionConfig(num_heads=4)),
    # `qkv train`'s default, trained for 3 minutes on two CPU cores with a 2048-token byte-level BPE
    # (vocab_size always comes from the tokenizer).
    "demo": ModelConfig(vocab_size=2048, d_model=96, num_layers=4, max_len=128,
                        attention=AttentionConfig(num_heads=4, **NO_BIAS), position=PositionConfig(kind="rope"),
                        feed_forward=FeedForwardConfig(bias=False)),
    # The paper's base model (Vaswani et al. Table 3): d=512, h=8, N=6, d_ff=2048, post-LN.
    "paper-base": ModelConfig(vocab_size=37000, d_model=512, num_layers=6, max_len=512,
                              attention=AttentionConfig(num_heads=8), position=PositionConfig(kind="sinusoidal"),
                              feed_forward=FeedForwardConfig(d_ff=2048, activation="relu"),
                              normalization=NormConfig(first=False, final=False), embedding=EmbeddingConfig(scale=True)),
    # `qkv train --task translate`: the paper's encoder-decoder at CPU size (a shared 8000-token BPE vocabulary),
    # token embeddings starting at the paper's scale d^-0.5.
    "translate": ModelConfig(vocab_size=8000, d_model=128, num_layers=2, max_len=96,
                             attention=AttentionConfig(num_heads=4), position=PositionConfig(kind="sinusoidal"),
                             feed_forward=FeedForwardConfig(d_ff=512, activation="relu"),
                             embedding=EmbeddingConfig(scale=True, init_std=128 ** -0.5)),
    # `qkv train`'s default on a GPU: 3 minutes on one GPU with a 4096-token byte-level BPE; the default corpus
    # (about 3 M tokens) is seen many times over, hence dropout.
    "gpu": ModelConfig(vocab_size=4096, d_model=384, num_layers=8, max_len=256, dropout=0.1,
                       attention=AttentionConfig(num_heads=6, **NO_BIAS), position=PositionConfig(kind="rope"),
                       feed_forward=FeedForwardConfig(bias=False)),
    # GPT-2 small's shape (124 M parameters with its 50257-token vocabulary).
    "gpt2": ModelConfig(vocab_size=50257, d_model=768, num_layers=12, max_len=1024,
                        attention=AttentionConfig(num_heads=12), feed_forward=FeedForwardConfig(activation="gelu_tanh")),
}
