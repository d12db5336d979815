"""``to_hf``: a qkv model as the ``transformers`` model of the family that can hold it, with exact copies
of its weights (the family's rule table, read backwards).

Which family: the ones whose qkv model class matches, told apart by config values
(``Family.export_when``: GPT-2 for learned PE, LLaMA for RoPE with RMSNorm, GPT-NeoX for RoPE with
LayerNorm). Whatever that family has no counterpart for is listed in one ValueError before
``transformers`` is imported.
"""
from __future__ import annotations

from torch import Tensor, nn

from ...models import GPT, ModelConfig, Transformer
from ...models.pointer import PointerTransformer
from .families import FAMILIES
from .family import Family, config_value, meets


def exporting_families() -> list[Family]:
    return [f for f in FAMILIES.values() if f.export is not None]


def families_to_write(model_class: type, c: ModelConfig) -> list[Family]:
    """The families whose ``export_when`` ``c`` meets, the most specific (most conditions) first, equals in
    registration order; TypeError/ValueError naming the choices where there is none."""
    mine = [f for f in exporting_families() if issubclass(model_class, f.model)]
    if not mine:
        offers = {}
        for f in exporting_families():
            offers.setdefault(f.model.__name__, []).append(f.name)
        raise TypeError("to_hf converts " + " or ".join(f"a qkv.{cls} (to {' or '.join(names)})"
                                                        for cls, names in offers.items())
                        + f", got {model_class.__name__}")
    chosen = [f for f in mine if all(meets(c, name, value) for name, value in f.export_conditions())]
    if not chosen:
        wants = " or ".join(" and ".join(f"{name}={value!r}" for name, value in f.export_conditions()) + f" ({f.name})"
                            for f in mine)
        names = dict.fromkeys(name for f in mine for name, _ in f.export_conditions())
        raise ValueError(f"to_hf needs {wants}; got " + ", ".join(f"{name}={config_value(c, name)!r}"
                                                                   for name in names))
    return sorted(chosen, key=lambda f: -len(f.export_conditions()))  # stable: the first of equals first


def hf_config(c: ModelConfig, model_class: type = GPT) -> tuple[Family, dict]:
    """The most specific family able to hold a ``model_class`` of config ``c`` (Mistral before LLaMA, a SmolLM3
    with a window before Mistral, which has no NoPE layers) and the HF config fields ``to_hf`` writes for it;
    ValueError listing what the nearest family (fewest problems, then most specific) has no counterpart for, where
    none can hold it."""
    refusals = []
    for family in families_to_write(model_class, c):
        problems = []
        fields = family.export(c, problems)
        if not problems:
            return family, fields
        refusals.append((family, problems))
    family, problems = min(refusals, key=lambda r: len(r[1]))  # the nearest: fewest problems, then most specific
    raise ValueError(f"no Hugging Face {family.name} counterpart for this model: " + "; ".join(problems))


def hf_state(model: nn.Module, family: Family, hf: nn.Module) -> dict[str, Tensor]:
    """The HF model's state dict, every weight from ``model`` through the family's rules."""
    c, own, prefix = model.config, model.state_dict(), family.base + "."
    state = {family.full_key(r.hf, prefix): r.to_hf(tuple(own[q] for q in r.qkv)).contiguous() for r in family.rules(c)}
    state |= {family.full_key(k, prefix): state[family.full_key(src, prefix)]
              for k, src in family.copies(c).items()}  # tied names
    theirs = hf.state_dict()
    state |= {k: v for k, v in theirs.items() if family.ignored.fullmatch(k)}  # tables HF computes itself
    spelled = {family.rename(k): k for k in theirs}  # today's name -> this transformers' (4.x GPT-NeoX: embed_out)
    return {spelled.get(k, k): v for k, v in state.items()}


def generation_fields(model: nn.Module, fields: dict) -> dict:
    """The special-token ids of ``model.generation_config`` that the family's HF config has a field for."""
    config = getattr(model, "generation_config", None)
    hf = config.to_hf() if config is not None else {}
    return {k: v for k, v in hf.items() if k in fields and k.endswith("token_id")}


def to_hf(model: GPT | Transformer, **config_kwargs) -> nn.Module:
    """A ``transformers`` GPT2LMHeadModel, LlamaForCausalLM, GPTNeoXForCausalLM or MarianMTModel holding exact
    copies of ``model``'s weights.

    learned PE + LayerNorm → GPT-2; RoPE + RMSNorm + swiglu/geglu → LLaMA (interleaved RoPE is
    stored half-split, q/k rows permuted; its head_dim and attention/MLP biases as they are);
    RoPE + LayerNorm + an ungated activation → GPT-NeoX (partial rotation, a sequential or parallel
    feed-forward; no MLP bias: zeros there); a post-LN Transformer with split sinusoids → Marian
    (no logits bias: a zero final_logits_bias).
    ``config_kwargs`` go to the HF config (e.g. ``eos_token_id=…``, ``attn_implementation="eager"``);
    special-token ids default to ``model.generation_config``'s, else None. The model's ``generation_config``
    (a checkpoint's, from ``from_hf``) becomes the HF model's, which ``save_pretrained`` writes as
    generation_config.json.
    """
    if isinstance(model, PointerTransformer):
        raise TypeError(f"{type(model).__name__}'s copy mechanism has no Hugging Face counterpart; "
                        "to_hf converts a plain qkv.Transformer (train with --no-copy)")
    family, fields = hf_config(getattr(model, "config", None), type(model))
    import transformers

    config_name, model_name = family.hf_classes
    hf_fields = {**fields, **generation_fields(model, fields), **config_kwargs}
    hf = getattr(transformers, model_name)(getattr(transformers, config_name)(**hf_fields))
    if getattr(model, "generation_config", None) is not None:
        hf.generation_config = transformers.GenerationConfig(**model.generation_config.to_hf())
    try:
        hf.load_state_dict(hf_state(model, family, hf), strict=True)
    except RuntimeError as e:  # an older transformers whose config lacks a field written here (head_dim < 4.45)
        raise ValueError(f"transformers {transformers.__version__}'s {model_name} cannot hold this model: "
                         f"{str(e).splitlines()[-1].strip()}") from None
    return hf.to(device=model.lm_head.weight.device, dtype=model.lm_head.weight.dtype).eval()
