"""Mixture-of-experts models decode through the fast backends: ``auto`` (the speed layer: the gathered dispatch
for few tokens) and ``inductor`` (the compiled one-token step) give the eager path's greedy tokens for Mixtral-,
Qwen2-MoE-, Qwen3-MoE- and DeepSeek-V3-MoE-shaped tiny random models, at batch 1 and on a left-padded batch of 2;
the compiled step is captured once (no graph break, no recompile per token); the fused C++ step refuses in one line."""
import importlib
import warnings

import pytest
import torch
from hf_models import hf_model

from qkv.generation.backends import BackendFallback, pick
from qkv.interop.hf import from_hf

pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
DEEPSEEK_V3_MOE = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
                       moe_intermediate_size=8, n_group=4, topk_group=2, n_shared_experts=2, routed_scaling_factor=2.5)
FAMILIES = {  # no sliding windows: inductor's compiled step refuses ring caches (and falls back to auto)
    "mixtral": lambda: hf_model("mixtral", sliding_window=None),
    "qwen2_moe": lambda: hf_model("qwen2_moe", use_sliding_window=False),
    "qwen3_moe": lambda: hf_model("qwen3_moe"),
    "deepseek_v3": lambda: importlib.import_module("test_interop_deepseek").hf_model(
        "v3_low_rank_q_interleaved", **DEEPSEEK_V3_MOE),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    FAMILIES[request.param]().save_pretrained(path)
    return from_hf(path).eval()


def prompts(batch: int):
    """(ids, mask): batch 1, or 2 rows with the second left-padded by 3."""
    ids = torch.randint(1, 90, (batch, 7), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1:, :3] = False
    return ids, mask


def counting_backend(monkeypatch):
    """dynamo's graph capture without code generation (fast, same guards), counting the graphs it captures."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", counter)
    torch._dynamo.reset()
    return counter


@pytest.mark.parametrize("batch", [1, 2])
def test_auto_and_inductor_give_eagers_tokens(model, batch, monkeypatch):
    counter = counting_backend(monkeypatch)
    model.__dict__.pop("_qkv_compiled_step", None)  # a step compiled by an earlier test used another backend
    ids, mask = prompts(batch)
    with torch.no_grad():
        eager = model.generate(ids, 10, temperature=0, mask=mask, backend="eager", eos_id=None)
        auto = model.generate(ids, 10, temperature=0, mask=mask, backend="auto", eos_id=None)
        with torch._dynamo.config.patch(error_on_recompile=True), warnings.catch_warnings():
            warnings.simplefilter("error", BackendFallback)  # inductor itself decodes, no fallback
            compiled = model.generate(ids, 10, temperature=0, mask=mask, backend="inductor", eos_id=None)
            again = model.generate(ids, 10, temperature=0, mask=mask, backend="inductor", eos_id=None)
    assert torch.equal(auto, eager) and torch.equal(compiled, eager) and torch.equal(again, eager)
    assert counter.frame_count == 1, f"the step was captured in {counter.frame_count} graphs (a break or recompile)"


def test_fused_step_refuses_in_one_line(model):
    chosen, why = pick(model, 1, "fused")
    assert chosen == "inductor" and "\n" not in why
    assert ("attention.kind='mla'" if model.config.attention.kind == "mla" else "mixture of experts") in why
