"""Mixture-of-experts models decode through the fast backends: the speed layer's forward (qkv's MoE kernel for
few tokens), ``auto`` (the fused C++ step where it accepts the model), ``inductor`` (the compiled one-token step)
and ``fused`` give the eager path's greedy tokens for Mixtral-, Qwen2-MoE-, Qwen3-MoE-, DeepSeek-V3-MoE- and
gpt-oss-shaped tiny random models, at batch 1 and on a left-padded batch of 2; the compiled step is captured once
(no graph break, no recompile per token); a path that refuses a model says why in one line."""
import copy
import importlib
import warnings

import pytest
import torch
from hf_models import hf_model

from qkv.generation.backends import BackendFallback, backend_for
from qkv.interop.hf import from_hf
from qkv.kernels import accelerated, build
from qkv.kernels import moe as moe_kernel
from qkv.kernels.moe import kernel_dispatch
from qkv.nn.moe import Router, SwiGLUExperts, reference_dispatch

pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
DEEPSEEK_V3_MOE = dict(num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
                       moe_intermediate_size=8, n_group=4, topk_group=2, n_shared_experts=2, routed_scaling_factor=2.5)
FAMILIES = {
    "mixtral": lambda: hf_model("mixtral", sliding_window=None),
    "qwen2_moe": lambda: hf_model("qwen2_moe", use_sliding_window=False),
    "qwen3_moe": lambda: hf_model("qwen3_moe"),
    "deepseek_v3": lambda: importlib.import_module("test_interop_deepseek").hf_model(
        "v3_low_rank_q_interleaved", **DEEPSEEK_V3_MOE),
    "gpt_oss": lambda: hf_model("gpt_oss"),  # biased, clamped experts; sinks; sliding layers
}
FUSED = {"mixtral", "qwen3_moe", "qwen2_moe"}  # the families the fused step decodes; the others it refuses, naming why
REFUSED_FOR = {"deepseek_v3": "attention.kind='mla'", "gpt_oss": "config field"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    FAMILIES[request.param]().save_pretrained(path)
    model = from_hf(path).eval()
    model.family = request.param
    return model


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


@pytest.mark.parametrize("batch", [1, 2])
def test_the_speed_layers_forward_and_fused_give_eagers_tokens(model, batch):
    ids, mask = prompts(batch)
    with torch.no_grad():
        eager = model.generate(ids, 10, temperature=0, mask=mask, backend="eager", eos_id=None)
        with accelerated(model):  # the forward with the speed layer: DecodeMixtureOfExperts, auto's non-fused path
            forward = model.generate(ids, 10, temperature=0, mask=mask, backend="eager", eos_id=None)
        with warnings.catch_warnings(record=True):  # the refused families fall back to auto, saying why
            fused = model.generate(ids, 10, temperature=0, mask=mask, backend="fused", eos_id=None)
    assert torch.equal(forward, eager) and torch.equal(fused, eager)


def test_auto_runs_the_fused_step_where_it_accepts_the_model_and_refusals_take_one_line(model):
    fused, why = backend_for(model, 1, "fused")
    if model.family in FUSED:
        assert (fused, why) == ("fused", None) and backend_for(model, 1, "auto") == ("fused", None)
    else:
        assert fused == "auto" and "\n" not in why and REFUSED_FOR[model.family] in why
        assert backend_for(model, 1, "auto") == ("auto", None)
    assert backend_for(model, 5, "auto") == ("auto", None)  # past the fused step's rows: the forward


def test_the_moe_kernel_equals_the_reference_and_says_why_it_refuses():
    router, experts = Router(16, 6, 2), SwiGLUExperts(6, 16, 64)
    x = torch.randn(3, 16)
    with torch.no_grad():
        routing = router(x)
        assert moe_kernel.refuses(experts, x) is None
        torch.testing.assert_close(kernel_dispatch(x, routing, experts), reference_dispatch(x, routing, experts),
                                   rtol=1e-5, atol=1e-6)
        assert "at most 4 tokens, got 5" in moe_kernel.refuses(experts, torch.randn(5, 16))
        clamped = SwiGLUExperts(6, 16, 8, activation="swiglu_clamped")
        assert "swiglu experts, got swiglu_clamped" in moe_kernel.refuses(clamped, x)
        assert "without biases" in moe_kernel.refuses(SwiGLUExperts(6, 16, 8, bias=True), x)
    assert moe_kernel.refuses(experts, x).endswith("got grad mode on")  # not x's dtype and device, which fit
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert moe_kernel.refuses(experts, x).endswith("got CPU autocast on")
    assert moe_kernel.refuses(experts, x.double()).endswith("got torch.float64 on cpu")
    with pytest.raises(RuntimeError, match=r"experts must lie in \[0, 6\), got 6"):
        torch.ops.qkv.moe_swiglu(x, torch.full((3, 2), 6), routing.weights, experts.gate_proj.detach(),
                                 experts.up_proj.detach(), experts.down_proj.detach())


def test_the_moe_kernel_takes_no_tokens():
    assert build.available(), build.WHY_NOT  # torch.ops.qkv loaded
    experts = SwiGLUExperts(6, 16, 64).requires_grad_(False)  # a grain once divided by the (zero) groups: SIGFPE
    y = torch.ops.qkv.moe_swiglu(torch.randn(0, 16), torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2),
                                 experts.gate_proj, experts.up_proj, experts.down_proj)
    assert y.shape == (0, 16)



def shared_experts(model) -> list:
    """The mixture-of-experts layers of ``model`` that have a shared expert."""
    return [block.ff for block in model.blocks if getattr(block.ff, "shared", None) is not None]


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory):
    """The Qwen2-MoE model with its shared experts' down products × 40, so that they and their gates decide tokens
    (at the checkpoint's scale they do not, and a step that left them out would pass)."""
    path = tmp_path_factory.mktemp("qwen2_moe_shared")
    FAMILIES["qwen2_moe"]().save_pretrained(path)
    model = from_hf(path).eval()
    with torch.no_grad():
        for moe in shared_experts(model):
            moe.shared.down_proj.weight.mul_(40)
    return model


@pytest.mark.parametrize("batch", [1, 2])
def test_the_fused_step_adds_the_gated_shared_expert(qwen2_moe, batch):
    ids, mask = prompts(batch)
    decode = lambda: qwen2_moe.generate(ids, 10, temperature=0, mask=mask, backend="eager", eos_id=None)
    assert backend_for(qwen2_moe, batch, "fused") == ("fused", None)
    with torch.no_grad():
        eager = decode()
        fused = qwen2_moe.generate(ids, 10, temperature=0, mask=mask, backend="fused", eos_id=None)
        gates = [moe.shared_gate.weight.clone() for moe in shared_experts(qwen2_moe)]
        others = []
        for w_s in (-1e4, 1e4):  # σ(x·w_s) = 0, the shared experts off; = 1, their gates left out
            for moe in shared_experts(qwen2_moe):
                moe.shared_gate.weight.fill_(w_s)
            others.append(decode())
        for moe, gate in zip(shared_experts(qwen2_moe), gates):
            moe.shared_gate.weight.copy_(gate)
    assert torch.equal(fused, eager)
    assert not any(torch.equal(other, eager) for other in others), "the test would not see the shared experts"


def test_a_shared_expert_with_biases_is_refused_by_name(qwen2_moe):
    model = copy.deepcopy(qwen2_moe)
    up = shared_experts(model)[0].shared.up_proj
    up.bias = torch.nn.Parameter(torch.zeros(up.out_features))  # not from a config: the step must still see it
    chosen, why = backend_for(model, 1, "fused")
    assert chosen == "auto" and "a shared expert with biases or another activation" in why
