"""The fused C++ decode step on bfloat16 and int8 weights (qkv.kernels.fused_step) against the model's own forward,
on both of its ISAs; ``auto`` choosing it; the fallback saying why; inductor compiling once whatever the prompt."""
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import qkv
from qkv.generation import BackendFallback, backends
from qkv.generation.decode import StaticCache
from qkv.kernels import build, fused_step
from qkv.kernels.quant import int8_rows, quantize_weights

built = pytest.mark.usefixtures("kernels")  # tests/conftest.py: skips where they cannot be built
LLAMA = dict(attention=dict(num_kv_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
             position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False),
             normalization=dict(kind="rmsnorm"))
ODD = dict(d_model=72, attention=dict(num_heads=2))  # K = 64 + 8, D = 36: the loads' tails, left to the reference loops


def tiny(dtype=torch.float32, int8=False, seed=0, **overrides) -> qkv.GPT:
    torch.manual_seed(seed)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", **LLAMA).replace(**overrides)).eval().to(dtype)
    return quantize_weights(model) if int8 else model


def stepped_logits(model, steps: int = 6, batch: int = 2):
    """(the fused step's logits, the forward's) for ``steps`` tokens after a left-padded prompt, both fed the
    forward's greedy tokens; each (steps, B, V) float32."""
    ids = torch.randint(0, 64, (batch, 7), generator=torch.Generator().manual_seed(1))
    valid = torch.ones(batch, 7, dtype=torch.bool)
    valid[0, :3] = False
    caches = [StaticCache(model, batch, 20, device="cpu") for _ in range(2)]
    for c in caches:
        c.prefill(ids, valid)
    fused, forward = fused_step.FusedStep(model), backends.last_logits(model)
    tok, got, want = ids[:, -1:].contiguous(), [], []
    for slot in range(7, 7 + steps):
        for c in caches:
            c.slots[:, slot] = True
        pos = torch.tensor([slot])
        got.append(fused(tok, caches[0].slots, caches[0].layers, pos))
        want.append(forward(tok, caches[1].slots, caches[1].layers, pos).float())
        tok = want[-1].argmax(-1, keepdim=True)
    return torch.stack(got), torch.stack(want)


@built
@pytest.mark.parametrize("qk_norm", [False, True])
def test_bf16_logits_are_the_bf16_forwards_within_its_rounding(qk_norm):
    """bf16 weights and caches: the step sums in fp32 where the forward rounds each op to bf16, so the logits
    agree to bf16's rounding, not bit for bit; the caches hold bf16 keys and values either way."""
    model = tiny(torch.bfloat16, attention=dict(qk_norm=qk_norm))
    check_bf16(model)


@built
def test_bf16_with_odd_widths():
    check_bf16(tiny(torch.bfloat16, **ODD))


def check_bf16(model):
    got, want = stepped_logits(model)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)
    assert (got - want).abs().mean() < 0.01


@built
@pytest.mark.parametrize("dtype, shape", [
    (torch.float32, {}), (torch.bfloat16, {}), (torch.float32, ODD), (torch.bfloat16, ODD),
    (torch.float32, dict(moe=dict(num_experts=4, top_k=2))),  # int8 attention beside fp32 experts
])
def test_int8_logits_equal_torchaos_product(dtype, shape):
    """int8 weights as quantize_weights makes them (torchao's Int8Tensor): the step reads Q and the scales, and
    gives the quantised model's forward (torchao's product) to the float type's rounding."""
    model = tiny(dtype, int8=True, **shape)
    assert int8_rows(model.blocks[0].attn.q_proj.weight) is not None and fused_step.refuses(model, 1) is None
    got, want = stepped_logits(model)
    tol = 1e-4 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@built
def test_int8_weights_differ_from_float_by_their_rounding_only():
    """The int8 step against the float model it was quantised from: close (the weights' rounding), not equal."""
    quantised, model = tiny(int8=True), tiny()
    got, _ = stepped_logits(quantised)
    _, reference = stepped_logits(model)
    assert 0 < (got - reference).abs().max() < 0.1


@built
def test_auto_fuses_a_llama_shaped_model_with_eagers_tokens():
    """auto runs the fused step on a CPU for a model it accepts (fp32: eager's tokens), in bf16 and int8 too."""
    model = tiny()
    ids = torch.randint(0, 64, (1, 5))
    assert backends.choose(model, 1, "auto") == "fused" and backends.choose(model, 1, "auto", use_cache=False) == "auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        assert torch.equal(model.generate(ids, 12, temperature=0), model.generate(ids, 12, temperature=0,
                                                                                  backend="eager"))
    for other in (tiny(torch.bfloat16), tiny(int8=True)):
        assert backends.backend_for(other, 1, "auto") == ("fused", None)
    assert backends.backend_for(model, fused_step.MAX_ROWS + 1, "auto") == ("auto", None)


@pytest.mark.parametrize("model, reason", [
    (lambda: tiny(torch.float16), "torch.float16 weights on cpu"),
    (lambda: tiny(position=dict(kind="alibi")), "config field position.kind='alibi'"),
])
def test_what_it_refuses_falls_back_to_auto_saying_why(model, reason):
    """backend="fused" on a model it refuses: one warning naming why, then auto's forward (never a compile)."""
    model = model()
    ids = torch.randint(0, 64, (1, 4))
    with pytest.warns(BackendFallback, match=reason) as said:
        got = model.generate(ids, 3, temperature=0, backend="fused")
    assert len(said) == 1 and str(said[0].message).endswith("decoding with the auto backend")
    assert torch.equal(got, model.generate(ids, 3, temperature=0, backend="auto"))
    with pytest.raises(ValueError, match=reason):
        model.generate(ids, 3, temperature=0, compile="fused")


def test_bf16_mixture_of_experts_is_refused_by_name():
    model = tiny(torch.bfloat16, moe=dict(num_experts=4, top_k=2))
    assert "decodes those in float32 only" in fused_step.refuses(model, 1)


@built
def test_bad_scales_are_named():
    """An int8 matrix needs a float32 scale a row; a float one takes none."""
    model = tiny(int8=True)
    step = fused_step.FusedStep(model)
    caches = model.new_kv_caches(1, 8)
    buffers = [t for c in caches for t in (c.k, c.v)]
    args = (step.weights, buffers, step.rope_table(8), step.shape + [8] + step.experts, step.eps, step.scale)
    i = next(i for i, w in enumerate(step.weights) if w.dtype == torch.int8)
    for broken in ([*step.scales[:i], step.scales[i][:-1], *step.scales[i + 1:]],  # a scale short
                   [*step.scales[:i], torch.empty(0), *step.scales[i + 1:]],  # none
                   [torch.ones(3)] + step.scales[1:]):  # one on a float table
        with pytest.raises(RuntimeError, match="int8 with a float32 scale a row"):
            build.MODULE.DecoderState(*args, broken)
    with pytest.raises(RuntimeError, match="as many scales"):
        build.MODULE.DecoderState(*args, step.scales[:-1])


def test_inductor_compiles_once_whatever_the_prompt_length(monkeypatch):
    """Two prompt lengths, one compile (dynamo's graph capture without code generation): the cache's size is
    rounded up to a power of two, the same for both."""
    monkeypatch.setattr(backends, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    model = tiny(max_len=512)
    assert backends.cache_capacity(9, 512, "inductor") == backends.cache_capacity(70, 512, "inductor") == 256
    assert backends.cache_capacity(300, 512, "inductor") == 512 and backends.cache_capacity(9, 512, "auto") == 9
    torch._dynamo.utils.counters.clear()
    for length in (5, 23):
        ids = torch.randint(0, 64, (1, length))
        got = model.generate(ids, 4, temperature=0, backend="inductor")
        assert torch.equal(got, model.generate(ids, 4, temperature=0, backend="eager"))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


AVX2_CHECK = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    from qkv.kernels import build
    import test_fused_precision as t
    assert build.available() and build.isa() == "avx2", build.why_not()
    for shape in ({}, t.ODD):
        for model in (t.tiny(torch.bfloat16, **shape), t.tiny(int8=True, **shape)):
            got, want = t.stepped_logits(model)
            torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)
    print("ok")
""")


@pytest.mark.skipif(not {"avx2", "fma", "avx512f"} <= build.cpu_flags() or build.missing_tools() != "",
                    reason="needs an AVX-512 CPU (to force its AVX2 path) and a C++ compiler")
def test_the_avx2_path_decodes_bf16_and_int8():
    """QKV_KERNELS_ISA=avx2 (built once per machine, as the AVX-512 variant): the same checks on the AVX2 loads."""
    env = os.environ | {build.ISA_ENV: "avx2", "OMP_NUM_THREADS": "2",
                        "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    env.pop(build.OFF, None)
    done = subprocess.run([sys.executable, "-c", AVX2_CHECK, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
