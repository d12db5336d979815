"""SmolLM3 (Hugging Face 2025): LLaMA whose attention has no position at all on some layers (NoPE, Kazemnejad
et al. 2023), a tied head and RoPE θ 2·10⁶ by default.

    no_rope_layers          one flag per layer: 1 = this layer rotates (RoPE), 0 = a NoPE layer; absent, every
                            ``no_rope_layer_interval``-th layer (the 4th, 8th, …) is NoPE. qkv: position.nope_layers
    use_sliding_window      with sliding_window, HF's default layer_types make the NoPE layers slide; what counts
                            is layer_types (each sliding layer's mask is a window of sliding_window keys)
"""
from __future__ import annotations

from ....models import GPT, ModelConfig
from ..family import Family, Not
from ..rules import tied_head
from ..settings import export_layer_types, read_layer_types
from . import llama

DEFAULTS = dict(rope_theta=2_000_000.0, tie_word_embeddings=True, rms_norm_eps=1e-6, no_rope_layer_interval=4)


def rope_flags(hf: dict, problems: list[str]) -> list[int]:
    """Each layer's RoPE flag (1 rotates, 0 NoPE): no_rope_layers, or every interval-th layer NoPE as HF derives."""
    n, flags = hf.get("num_hidden_layers", 36), hf.get("no_rope_layers")
    if flags is None:
        interval = hf["no_rope_layer_interval"]
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            problems.append(f"no_rope_layer_interval={interval!r} (expected a positive int)")
            return [1] * n
        return [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(flags, (list, tuple)) or len(flags) < n or any(f not in (0, 1) for f in flags[:n]):
        problems.append(f"no_rope_layers={flags!r:.80} (expected a 0 or 1 for each of the {n} layers)")
        return [1] * n
    return [int(f) for f in flags[:n]]


def config(hf: dict, problems: list[str]) -> dict:
    """SmolLM3Config -> ModelConfig arguments."""
    hf = {**DEFAULTS, **{k: v for k, v in hf.items() if v is not None or k not in DEFAULTS}}
    out = llama.config(hf, problems)
    flags = rope_flags(hf, problems)
    slides = hf.get("use_sliding_window", False) and hf.get("sliding_window") is not None
    window, types = read_layer_types(hf, problems, ["sliding_attention" if slides and not f else "full_attention"
                                                    for f in flags])
    nope = [i for i, f in enumerate(flags) if not f]
    return out | dict(layer_types=types, attention=out["attention"] | dict(sliding_window=window),
                      position=out["position"] | dict(nope_layers=nope or None))


def export(c: ModelConfig, problems: list[str]) -> dict:
    """ModelConfig -> SmolLM3Config fields."""
    a, nope = c.attention, set(c.position.nope_layers or ())
    if len(set(a.biases)) > 1:
        problems.append(f"attention biases (q, k, v, out) = {a.biases} differ (SmolLM3's attention_bias sets all four)")
    fields = llama.decoder_export(c, problems, "SmolLM3",
                                  allowed=("position.nope_layers", "attention.sliding_window", "layer_types"))
    types = export_layer_types(c)
    return fields | dict(attention_bias=a.q_bias, no_rope_layers=[int(i not in nope) for i in range(c.num_layers)],
                         use_sliding_window="sliding_attention" in types, sliding_window=a.sliding_window,
                         layer_types=types)


FAMILY = Family(
    model_type="smollm3", name="SmolLM3", model=GPT, base="model", config=config, rules=llama.rules,
    ignored=llama.IGNORED, hf_classes=("SmolLM3Config", "SmolLM3ForCausalLM"),
    copies=tied_head("embed_tokens.weight"), export=export,
    export_when=(("position.kind", "rope"), ("normalization.kind", "rmsnorm"), ("position.nope_layers", Not(None))),
)
