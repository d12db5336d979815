"""Sliding-window models under each decode backend: the same tokens as the reference, and a fallback that says
why where a backend cannot decode them (inductor's compiled step would freeze a ring cache's position)."""
import pytest
import torch

import qkv
from qkv.generation.backends import BackendFallback, compiled_step_refuses, pick
from test_attention_variants import gemma_like


def sliding_model() -> qkv.GPT:
    """Gemma-2-shaped: with its guards skipped, a compiled step froze the ring caches (tokens differed by the 8th)."""
    torch.manual_seed(0)
    return qkv.GPT(gemma_like(max_len=96)).eval()


@pytest.mark.parametrize("backend", ["inductor", "fused"])
def test_a_sliding_model_decodes_past_its_window_with_the_references_tokens(backend):
    model, ids = sliding_model(), torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model.generate(ids, 24, temperature=0, backend="eager")
        with pytest.warns(BackendFallback, match="ring cache whose position is a Python int"):
            got = model.generate(ids, 24, temperature=0, backend=backend)
    assert torch.equal(got, want)


def test_the_compiled_step_refuses_sliding_layers_only():
    assert "ring cache" in compiled_step_refuses(sliding_model())
    full = qkv.GPT(qkv.ModelConfig(vocab_size=64, d_model=32, num_layers=2, max_len=32, positional="rope",
                                   num_heads=4))
    assert compiled_step_refuses(full) is None
    assert pick(full, 1, "inductor") == ("inductor", None)
    chosen, why = pick(sliding_model(), 1, "fused")
    assert chosen == "auto" and why.startswith("the fused step cannot") and "compiled step cannot" in why
