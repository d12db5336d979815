"""Fine-tuning a real checkpoint: the base a run starts from, its identity, and LoRA adapters.

    base      a Hugging Face decoder directory (GPT-2, LLaMA, GPT-NeoX, Qwen2, Qwen3, Mistral, Gemma 2 …: any
              decoder family of ``qkv.interop.hf``): weights through ``from_hf``, its own
              tokenizer kept unchanged (byte-level BPE, stored in the run as tokenizer.json);
              or a finished qkv run of a decoder (``--init-from``): its final weights, config and tokenizer;
              ``BaseSource`` says which, ``qkv.training.run_dir.load_base`` loads either (a run loads its
              own base in turn when it is a LoRA run: loading a run and loading a base recurse, so both live there)
    identity  the SHA-256 of its weight files, recorded in train_config.json: ``--resume`` (and a
              LoRA run, which stores only its adapters) refuses any other base
    LoRA      h = W x + (α / r) · B A x, W frozen, A (r × in) and B (out × r, zero at the start)
              trained, in the blocks' nn.Linear layers that ``targets`` name (Hu et al. 2021);
              ``peft`` injects them into qkv's own module tree; a run stores A and B only
              (adapters.safetensors) and loading merges them: W ← W + (α / r) · B A
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, NamedTuple

from torch import Tensor, nn

from ..data import BPETokenizer, CharTokenizer, tokenizer_from_json
from ..models import GPT

DEFAULT_LORA_TARGETS = "attn"  # every projection of the self-attention (LoRA paper): q, k, v, out; MLA's q, kv_a, kv_b, o


class BaseSource(NamedTuple):
    """Where a fine-tune's base is: ``kind`` "hf" (a Hugging Face directory, --init-from-hf) or "run" (a qkv run
    directory, --init-from), at ``path``."""

    kind: str
    path: str

    @property
    def flag(self) -> str:
        return "--init-from" if self.kind == "run" else "--init-from-hf"


def base_source(t: Mapping) -> BaseSource | None:
    """The base a train config (a ``TrainConfig``'s fields, or its saved train_config.json) names; None from scratch."""
    if t.get("init_from"):
        return BaseSource("run", t["init_from"])
    return BaseSource("hf", t["init_from_hf"]) if t.get("init_from_hf") else None


@dataclass
class Base:
    """A checkpoint to fine-tune: model (qkv.GPT), the run's tokenizer, and the weights' SHA-256."""

    model: GPT
    tokenizer: BPETokenizer | CharTokenizer
    sha256: str
    path: str


def weights_sha256(path: str | os.PathLike) -> str:
    """SHA-256 over a checkpoint directory's ``*.safetensors`` files (by name, then content)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no .safetensors weights")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def run_tokenizer(tokenizer, where: str) -> BPETokenizer:
    """A checkpoint's tokenizer (``qkv.interop.hf.Tokenizer``) as a qkv BPETokenizer, which a run
    saves as tokenizer.json; ValueError for one that is not BPE (WordPiece, Unigram …)."""
    backend = tokenizer.backend
    fast = getattr(backend, "backend_tokenizer", backend)  # transformers' fast tokenizer, or tokenizers' own
    if not hasattr(fast, "to_str"):
        raise ValueError(f"the tokenizer in {where} has no fast (tokenizer.json) form; a run keeps BPE tokenizers")
    text = fast.to_str()
    kind = json.loads(text).get("model", {}).get("type")
    if kind != "BPE":
        raise ValueError(f"the tokenizer in {where} is {kind}; a run keeps BPE tokenizers (GPT-2's, LLaMA's)")
    return tokenizer_from_json(text)


def hf_base(where: str) -> tuple[GPT, BPETokenizer]:
    """(qkv model, qkv tokenizer) of a Hugging Face directory; ValueError for one without a tokenizer."""
    from ..interop.hf import load_pretrained

    model, tokenizer = load_pretrained(where)
    check_decoder(model, where)
    if tokenizer is None:
        raise ValueError(f"the base {where} has no tokenizer files (tokenizer.json …): a run needs its tokenizer")
    return model, run_tokenizer(tokenizer, where)


def check_decoder(model: nn.Module, where: str) -> GPT:
    """``model``, if it is a decoder (qkv.GPT); ValueError otherwise (an encoder-decoder of --task translate …)."""
    if not isinstance(model, GPT):
        raise ValueError(f"the base {where} is not a decoder (it loads as qkv.{type(model).__name__}); "
                         "fine-tuning starts from a decoder-only checkpoint (GPT-2, LLaMA, Qwen2, Mistral …, "
                         "or a qkv run of --task lm, sft or dpo)")
    return model


# --- LoRA ---------------------------------------------------------------------------------------

def lora_layers(model: nn.Module, targets: str) -> list[str]:
    """The blocks' nn.Linear layers that the comma-separated ``targets`` name: a layer (``q_proj``), a dotted
    run of names (``ff.up_proj``) or a module, for every linear in it (``attn``, ``ff``); ValueError for a
    target matching none."""
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("blocks.")]
    wanted = [t.strip() for t in targets.split(",") if t.strip()]
    hits = {t: [n for n in linears if f".{t}." in f".{n}."] for t in wanted}
    unmatched = [t for t in wanted if not hits[t]]
    if unmatched or not wanted:
        names = sorted({n.split(".", 2)[2] for n in linears})  # blocks.0.attn.q_proj -> attn.q_proj
        raise ValueError(f"--lora-targets {','.join(unmatched) if unmatched else '(none)'}: no linear layer of "
                         f"the model's blocks has that name; choose among {', '.join(names)}")
    return sorted({n for t in wanted for n in hits[t]})


def add_lora(model: nn.Module, *, r: int, alpha: float, targets: str = DEFAULT_LORA_TARGETS) -> nn.Module:
    """``model`` with rank-``r`` adapters on the ``targets`` layers (in place); every other weight frozen."""
    from peft import LoraConfig, inject_adapter_in_model

    layers = lora_layers(model, targets)
    inject_adapter_in_model(LoraConfig(r=r, lora_alpha=alpha, target_modules=layers, lora_dropout=0.0), model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def has_lora(model: nn.Module) -> bool:
    return any(hasattr(m, "lora_A") for m in model.modules())


def model_weights(model: nn.Module) -> dict[str, Tensor]:
    """What a run saves of ``model``: its LoRA adapters (A, B) when it has some, else every weight."""
    if not has_lora(model):
        return model.state_dict()
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def set_model_weights(model: nn.Module, state: dict[str, Tensor], *, where: str) -> None:
    """The inverse of ``model_weights``; ValueError when ``state`` is not this model's."""
    if not has_lora(model):
        model.load_state_dict(state)
        return
    from peft import set_peft_model_state_dict

    expected = model_weights(model)
    wrong = set(state) ^ set(expected)  # missing or unexpected, then wrong shapes
    wrong |= {k for k in set(state) & set(expected) if state[k].shape != expected[k].shape}
    if wrong:
        raise ValueError(f"{where} does not hold this model's LoRA adapters ({', '.join(sorted(wrong)[:3])} …)")
    set_peft_model_state_dict(model, state)


def keyed_as_model(model: nn.Module, state: dict[str, Tensor], *, where: str) -> dict[str, Tensor]:
    """``model_weights``' dict keyed as ``model.state_dict()`` is (peft's keys of the adapters leave out the
    adapter's name, ``default``); ValueError when ``state`` does not hold this model's adapters."""
    if not has_lora(model):
        return state
    named = {k.replace(".default", ""): k for k in model.state_dict() if ".lora_" in k}
    wrong = set(state) ^ set(named)
    if wrong:
        raise ValueError(f"{where} does not hold this model's LoRA adapters ({', '.join(sorted(wrong)[:3])} …)")
    return {named[k]: v for k, v in state.items()}


def merge_lora(model: nn.Module) -> nn.Module:
    """``model`` with each adapter folded into its layer (W ← W + (α / r) · B A) and the plain nn.Linear
    put back: the same outputs, qkv's own module tree again."""
    for name, module in list(model.named_modules()):
        if hasattr(module, "lora_A"):
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module.get_base_layer())
    if hasattr(model, "peft_config"):  # peft's record of the adapters merged: a later add_lora would see them as
        del model.peft_config          # present ("Already found a `peft_config`") and stack a second set
    return model
