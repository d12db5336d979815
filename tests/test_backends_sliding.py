"""Sliding-window models under each decode backend: the same tokens as the reference, and a fallback that says
why where a backend cannot decode them. The compiled step runs without its guards, so a ring cache whose
position were a Python int would be frozen at its first value: these decode past the window and compare."""
import contextlib
import importlib
import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import qkv
from qkv.generation import paths
from qkv.generation.backends import BackendFallback, backend_for
from test_attention_variants import gemma_like

backends = importlib.import_module("qkv.generation.backends")


def sliding_model() -> qkv.GPT:
    """Gemma-2-shaped: with its guards skipped, a compiled step froze the ring caches (tokens differed by the 8th)."""
    torch.manual_seed(0)
    return qkv.GPT(gemma_like(max_len=96)).eval()


def mistral_like(window: int, max_len: int = 64) -> qkv.GPT:
    """Mistral-shaped: every layer slides, grouped heads, RoPE, SwiGLU, RMSNorm, no soft cap."""
    torch.manual_seed(0)
    return qkv.GPT(qkv.ModelConfig(
        vocab_size=64, d_model=32, num_layers=2, max_len=max_len,
        attention=dict(num_heads=4, num_kv_heads=2, sliding_window=window), position=dict(kind="rope"),
        feed_forward=dict(d_ff=64, activation="swiglu"), normalization=dict(kind="rmsnorm", first=True))).eval()


@pytest.fixture
def captured(monkeypatch):
    """The compiled step through dynamo's capture without code generation (fast; the same guards and the same
    unguarded runs), its cache of graphs emptied first."""
    monkeypatch.setattr(backends, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()


def prompt(batch: int, length: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (B, T) and mask (B, T): row 0 left-padded by ``pad``."""
    ids = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, :pad] = False
    return ids, mask


CASES = {  # model, batch, prompt length, left padding of row 0, new tokens
    "Gemma 2: prompt longer than the window": (sliding_model, 1, 10, 0, 24),
    "Mistral: window 1": (lambda: mistral_like(1), 1, 4, 0, 12),
    "Mistral: window larger than the prompt": (lambda: mistral_like(16), 1, 3, 0, 30),
    "Mistral: batch 2, a row left-padded": (lambda: mistral_like(5), 2, 7, 3, 20),
    "Gemma 2: past max_len (the window slides, re-prefilled)": (lambda: qkv.GPT(gemma_like(max_len=16)).eval(),
                                                                2, 6, 2, 30),
}


@pytest.mark.parametrize("case", CASES)
def test_the_compiled_step_decodes_sliding_models_with_the_references_tokens(case, captured):
    build, batch, length, pad, new = CASES[case]
    model, (ids, mask) = build(), prompt(batch, length, pad)
    with torch.inference_mode():
        want = model.generate(ids, new, temperature=0, mask=mask, backend="eager")
        got = model.generate(ids, new, temperature=0, mask=mask, backend="inductor")
    assert torch.equal(got, want)
    assert torch.equal(want, model.generate(ids, new, temperature=0, mask=mask, use_cache=False))


@pytest.mark.usefixtures("kernels")  # tests/conftest.py: skips where qkv's C++ kernels cannot be built
@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("Mistral")])
def test_the_fused_step_decodes_mistral_shaped_models_with_the_references_tokens(case):
    """Every layer sliding: the C++ step writes a ring of W rows and attends over it; no fallback."""
    build, batch, length, pad, new = CASES[case]
    model, (ids, mask) = build(), prompt(batch, length, pad)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallback)
        got = model.generate(ids, new, temperature=0, mask=mask, backend="fused")
    assert torch.equal(got, model.generate(ids, new, temperature=0, mask=mask, backend="eager"))


def test_the_compiled_sliding_step_compiles_once_with_its_guards_checked_every_step(captured, monkeypatch):
    """With every step's guards evaluated, a step that read a Python int which changes per token would
    recompile at the next token: dynamo raises on a recompile, and one graph is compiled for 20 steps."""
    monkeypatch.setattr(backends, "unguarded", lambda skip: contextlib.nullcontext())
    model, (ids, mask) = mistral_like(4), prompt(1, 6)
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True), torch.inference_mode():
        got = model.generate(ids, 20, temperature=0, backend="inductor")
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.equal(got, model.generate(ids, 20, temperature=0, backend="eager"))


def test_inductor_itself_decodes_a_sliding_model():
    """The real backend (inductor's generated code), once, on a tiny Mistral-shaped model past its window."""
    torch._dynamo.reset()
    model, (ids, _) = mistral_like(3, max_len=32), prompt(1, 5)
    with torch._dynamo.config.patch(error_on_recompile=True), torch.inference_mode():
        got = model.generate(ids, 10, temperature=0, backend="inductor")
    assert torch.equal(got, model.generate(ids, 10, temperature=0, backend="eager"))


def test_the_compiled_step_takes_sliding_layers_and_the_fused_step_names_the_gemma_setting_it_refuses():
    assert paths.refuses("inductor", sliding_model()) is None
    assert backend_for(sliding_model(), 1, "inductor") == ("inductor", None)
    chosen, why = backend_for(sliding_model(), 1, "fused")
    assert chosen == "auto" and "compiled step" not in why
    assert why == "the fused step cannot decode this model at batch 1: config field attention.query_scalar=12.0, " \
                  "which the fused step does not declare"
