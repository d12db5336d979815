"""The decode plan (qkv.generation.plan): backend, dtype and cache chosen once, with reasons, for generate, beam
search, chat and serve."""
import warnings

import pytest
import torch

import qkv
from qkv.generation import BackendFallback, backends, generate
from qkv.generation.plan import plan_beams, plan_decode, plan_serving
from qkv.kernels import fused_step


def tiny(**change) -> qkv.GPT:
    torch.manual_seed(0)
    return qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=40, max_len=32, position=dict(kind="rope")).replace(**change)).eval()


def test_generate_chooses_its_backend_once_and_a_given_plan_is_not_chosen_again(monkeypatch):
    model, ids = tiny(), torch.tensor([[1, 2, 3]])
    picks = []
    real_choice = backends.backend_for
    monkeypatch.setattr(backends, "backend_for", lambda *a, **k: picks.append(a[2]) or real_choice(*a, **k))
    want = generate(model, ids, 6, temperature=0, backend="eager")
    assert picks == ["eager"]  # not again for the static cache's step
    plan = plan_decode(model, 1, "eager")
    picks.clear()
    assert torch.equal(generate(model, ids, 6, temperature=0, plan=plan), want) and picks == []


def test_the_plan_says_what_it_chose_and_why():
    model = tiny()
    plan = plan_decode(model, 2, "auto", capacity=20)  # on a CPU, auto is the fused step where it accepts the model
    fuses = fused_step.refuses(model, 2) is None
    assert (plan.backend, plan.cache, plan.dtype) == ("fused" if fuses else "auto", "static", torch.float32)
    assert str(plan).startswith(f"the {plan.backend} backend (") and "2 rows × 20 slots" in str(plan)
    with pytest.warns(BackendFallback, match="the CUDA-graph step cannot decode this model: the model is on the CPU"):
        fallback = plan_decode(model, 1, "cudagraph")
    assert fallback.backend == "auto" and "on the CPU" in fallback.why and fallback.why in str(fallback)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan_decode(model, 1, "cudagraph", warn=False).why == fallback.why  # the caller says it
    assert plan_decode(model, 1, use_cache=False).cache == "none"
    served = plan_serving(model.to(torch.bfloat16), max_batch=2, max_model_len=32, block_size=8)
    assert (served.cache, served.dtype, served.num_blocks) == ("paged", torch.bfloat16, 2 * 4)
    assert "8 blocks of 8 tokens" in str(served) and "capped at max_batch × max_model_len" in str(served)


def test_plans_refuse_what_their_decoder_cannot_run():
    model = tiny()
    with pytest.raises(ValueError, match="'fused' compiles the cached decode step: it needs use_cache=True"):
        plan_decode(model, 1, "fused", use_cache=False)
    with pytest.raises(ValueError, match="backend must be 'auto' or 'eager' for the encoder-decoder, got 'fused'"):
        plan_beams(model, 4, 10, "fused")
    with pytest.raises(ValueError, match="the server's backend must be auto or eager, got 'inductor'"):
        plan_serving(model, backend="inductor", max_batch=1, max_model_len=32)
    paged = plan_serving(model, max_batch=1, max_model_len=32)
    with pytest.raises(ValueError, match="got a paged cache's plan with use_cache=True"):
        generate(model, torch.tensor([[1]]), 2, plan=paged)
    with pytest.raises(ValueError, match="got a static cache's plan with use_cache=False"):
        generate(model, torch.tensor([[1]]), 2, plan=plan_decode(model, 1), use_cache=False)
