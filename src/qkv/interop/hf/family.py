"""``Family``: everything that is particular to one Hugging Face ``model_type``, as data.

The loader (``load.from_hf``) and the exporter (``export.to_hf``) hold no family's name: each reads
the family's config mapping, rule table, ignored keys and class names from here. A family is one
module of ``qkv.interop.hf.families`` that builds a ``Family`` and is registered there.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...generation.beam_search import Special
from ...models import ModelConfig
from .rules import HEAD, Rule, no_copies


@dataclass(frozen=True)
class Not:
    """An ``export_when`` value met by anything but ``value`` (Mistral: a sliding window, whichever)."""

    value: object

    def __repr__(self) -> str:
        return f"not {self.value!r}"


def config_value(c: ModelConfig, name: str):
    """A ModelConfig field: a size ("d_model") or a section's field ("attention.qk_norm")."""
    section, _, field = name.rpartition(".")
    return getattr(getattr(c, section), field) if section else getattr(c, name)


def meets(c: ModelConfig, name: str, want) -> bool:
    value = config_value(c, name)
    return value != want.value if isinstance(want, Not) else value == want


def as_stored(tensors: dict, config: ModelConfig, problems: list[str]) -> dict:
    """A family whose checkpoints hold each tensor as its rules name it."""
    return tensors


def same_name(key: str) -> str:
    """A family whose checkpoints need no key renamed."""
    return key


@dataclass(frozen=True)
class Family:
    """How one HF model_type maps onto qkv, in both directions."""

    model_type: str  # HF's config.model_type ("gpt2")
    name: str  # for messages ("GPT-2")
    model: type  # qkv.GPT, qkv.Encoder or qkv.Transformer
    base: str  # the base model's attribute in HF's task models (GPT2LMHeadModel.transformer, …)
    config: Callable[[dict, list[str]], dict]  # HF config -> ModelConfig arguments, appending problems
    rules: Callable[[ModelConfig], list[Rule]]  # the weight table, both directions
    ignored: re.Pattern  # keys that are no weights of qkv's model: buffers, heads qkv does not model
    hf_classes: tuple[str, str]  # transformers' config class and the model class to_hf builds (or from_hf reads)
    copies: Callable[[ModelConfig], dict[str, str]] = no_copies  # tied key -> the rule key it must equal
    top_level: tuple[str, ...] = (HEAD,)  # rule keys outside the base model
    rename: Callable[[str], str] = same_name  # a checkpoint's key -> today's name (TF-era spellings, 4.x names);
    #                                           to_hf writes each key as the installed transformers spells it
    merge: Callable[[dict, ModelConfig, list[str]], dict] = as_stored  # a checkpoint's tensors (renamed) -> those
    #                                           the rules name, appending problems (MoE: per-expert -> fused)
    export: Callable[[ModelConfig, list[str]], dict] | None = None  # ModelConfig -> HF config fields; None: no to_hf
    # (flat ModelConfig name or "section.field", value or Not(value)) choosing it among one model's families, or
    # several such pairs that must all hold (GPT-NeoX for RoPE + LayerNorm, LLaMA for RoPE + RMSNorm, Qwen3 for
    # those + attention.qk_norm); of the families a model meets, the one with the most pairs is written;
    # None: the model class alone
    export_when: tuple[str, object] | tuple[tuple[str, object], ...] | None = None
    special: Callable[[Path], Special] | None = None  # an encoder-decoder's decoding tokens, from its directory

    def export_conditions(self) -> tuple[tuple[str, object], ...]:
        """``export_when`` as (ModelConfig field, value) pairs, all of which a model must meet."""
        when = self.export_when
        if when is None:
            return ()
        return (when,) if isinstance(when[0], str) else tuple(when)

    def full_key(self, key: str, prefix: str) -> str:
        """A rule's key as it appears in the task model's state dict."""
        return key if key in self.top_level else prefix + key
