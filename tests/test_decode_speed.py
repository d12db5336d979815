"""The decode fast paths give the reference path's numbers: grouped heads without copied K/V, masks
prepared once per forward, and every generation path's greedy tokens."""
import importlib
import sys
import warnings

import pytest
import torch
import torch._dynamo

import qkv
from qkv.nn.attention import attend, one_query_attention, repeat_kv, scaled_dot_product_attention
from qkv.nn.masks import PreparedMask, causal_mask, prepare_mask


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("return_weights", [False, True])
def test_enable_gqa_equals_repeated_kv_heads(return_weights):
    q, k, v = rand(2, 6, 5, 8), rand(2, 2, 7, 8, seed=1), rand(2, 2, 7, 8, seed=2)  # H 6 over G 2
    mask = rand(2, 1, 5, 7, seed=3) > -0.5
    got = scaled_dot_product_attention(q, k, v, mask=mask, enable_gqa=True, return_weights=return_weights)
    want = scaled_dot_product_attention(q, repeat_kv(q, k), repeat_kv(q, v), mask=mask, return_weights=return_weights)
    for g, w in zip(got if return_weights else [got], want if return_weights else [want]):
        torch.testing.assert_close(g, w)


def test_grouped_heads_need_enable_gqa_and_a_divisor():
    q, k = rand(1, 6, 3, 4), rand(1, 4, 3, 4)
    with pytest.raises(ValueError, match="leading dims"):
        scaled_dot_product_attention(q, rand(1, 2, 3, 4), rand(1, 2, 3, 4))  # G 2 without enable_gqa
    with pytest.raises(ValueError, match="must divide"):
        scaled_dot_product_attention(q, k, k, enable_gqa=True)  # 4 does not divide 6


def test_gqa_module_copies_kv_per_head_only_where_sdpa_cannot_group(monkeypatch):
    """MultiHeadAttention with G < H asks the kernel for grouped heads (torch >= 2.5) instead of
    repeat_interleave, which remains the fallback on torch 2.4."""
    mha = qkv.MultiHeadAttention(16, 4, num_kv_heads=2).eval()
    x = rand(2, 5, 16)
    want = mha(x)
    repeat, calls = torch.Tensor.repeat_interleave, []
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", lambda *a, **k: calls.append(1) or repeat(*a, **k))
    torch.testing.assert_close(mha(x), want)
    assert (calls == []) == qkv.nn.attention.SDPA_GQA
    monkeypatch.setattr(qkv.nn.attention, "SDPA_GQA", False)  # the torch 2.4 path, here too
    torch.testing.assert_close(mha(x), want)
    assert calls


@pytest.mark.parametrize("rows_empty", [False, True])
def test_prepared_mask_equals_the_bool_mask(rows_empty):
    q, k, v = rand(2, 3, 5, 8), rand(2, 3, 6, 8, seed=1), rand(2, 3, 6, 8, seed=2)
    allowed = rand(2, 1, 5, 6, seed=3) > 0
    allowed[..., 0] = True
    if rows_empty:
        allowed[0, 0, 1] = False  # this query keeps no key at all
    prepared = prepare_mask(allowed)
    assert isinstance(prepared, PreparedMask) and (prepared.live is None) == (not rows_empty)
    want = scaled_dot_product_attention(q, k, v, mask=allowed)
    torch.testing.assert_close(attend(q, k, v, mask=prepared), want)
    out, weights = attend(q, k, v, mask=prepared, return_weights=True)  # the reference path reads .allowed
    torch.testing.assert_close(out, want)
    assert torch.equal(weights.sum(-1) == 0, ~allowed.any(-1).expand(2, 3, 5))  # empty rows: zero weights


def test_prepared_mask_keeps_dead_rows_out_of_the_gradient():
    q = rand(1, 1, 3, 4).requires_grad_()
    allowed = torch.tensor([[True, False], [False, False], [True, True]])
    attend(q, rand(1, 1, 2, 4, seed=1), rand(1, 1, 2, 4, seed=2), mask=prepare_mask(allowed)).sum().backward()
    assert torch.all(q.grad[0, 0, 1] == 0) and torch.isfinite(q.grad).all()


def test_prepared_mask_bad_input():
    with pytest.raises(TypeError, match="bool mask"):
        prepare_mask(torch.ones(2, 2))
    with pytest.raises(ValueError, match="is_causal=False"):
        attend(rand(1, 2, 4), rand(1, 2, 4), rand(1, 2, 4), mask=prepare_mask(causal_mask(2)), is_causal=True)


def test_model_prepares_masks_once_per_forward(monkeypatch):
    calls = []
    real = qkv.models.trunk.prepare_mask
    monkeypatch.setattr(qkv.models.trunk, "prepare_mask", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", num_layers=3)).eval()
    model(torch.randint(0, 64, (2, 5)), mask=torch.ones(2, 5, dtype=torch.bool))
    assert len(calls) == 1  # not one per layer


@pytest.mark.parametrize("preset", [dict(), dict(attention=dict(num_kv_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                                                 position=dict(kind="rope"),
                                                 feed_forward=dict(bias=False, activation="swiglu"),
                                                 normalization=dict(kind="rmsnorm"))])
def test_every_decode_path_gives_the_reference_tokens(preset, monkeypatch):
    """Greedy tokens: full forward per token (no cache) = static cache = fused step = compiled step (graph capture)."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")  # dynamo's capture, without code generation
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", **preset)).eval()
    ids = torch.randint(0, 64, (3, 6))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :2] = False  # a left-padded row
    reference = model.generate(ids, 10, temperature=0, use_cache=False, mask=mask)
    assert torch.equal(model.generate(ids, 10, temperature=0, mask=mask), reference)
    assert torch.equal(model.generate(ids, 10, temperature=0, mask=mask, compile=True), reference)  # fused
    assert torch.equal(model.generate(ids, 10, temperature=0, mask=mask, compile="inductor"), reference)


def test_a_copy_compiles_its_own_step_and_a_compiled_model_pickles(monkeypatch, tmp_path):
    """The compiled step calls the model it was made for: a deepcopy (changed afterwards) must not run
    the original's, and torch.save(model) must not try to pickle compiled code."""
    import copy

    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=61)).eval()
    ids = torch.randint(0, 61, (1, 5))
    model.generate(ids, 6, temperature=0, compile="inductor")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(-1.0)
    assert torch.equal(twin.generate(ids, 6, temperature=0, compile="inductor"), twin.generate(ids, 6, temperature=0))
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert torch.equal(loaded.generate(ids, 6, temperature=0, compile="inductor"), model.generate(ids, 6, temperature=0))


def test_inductor_compiled_step_gives_the_reference_tokens():
    """The real backend (inductor with its C++ wrapper), once, on a tiny model."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny")).eval()
    ids = torch.randint(0, 64, (1, 4))
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = model.generate(ids, 6, temperature=0, compile="inductor")
    assert torch.equal(got, model.generate(ids, 6, temperature=0, use_cache=False))


def test_one_query_attention_equals_the_fused_kernel():
    """Under torch.compile one query's attention is the written-out formula; it equals SDPA's answer,
    grouped heads and a query with no key included."""
    q, k, v = rand(2, 6, 1, 8), rand(2, 2, 7, 8, seed=1), rand(2, 2, 7, 8, seed=2)  # H 6 over G 2
    allowed = rand(2, 1, 1, 7, seed=3) > 0
    allowed[1] = False  # the second row's query keeps no key
    prepared = prepare_mask(allowed)
    want = attend(q, k, v, mask=prepared)
    got = one_query_attention(q, k, v, prepared.bias, 8 ** -0.5) * prepared.live
    torch.testing.assert_close(got, want)
    traced = []

    def backend(gm, example_inputs):
        traced.extend(str(n.target) for n in gm.graph.nodes)
        return gm.forward

    compiled = torch.compile(lambda q, k, v: attend(q, k, v, mask=prepared), backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), want)
    assert "softmax" in str(traced) and "scaled_dot_product_attention" not in str(traced)


@pytest.mark.parametrize("has_stance", [True, False])
def test_compiled_steps_skip_guards_only_after_the_first(has_stance, monkeypatch):
    """Each generate call evaluates its first compiled step's guards (a new cache size or batch may need
    another compiled graph); the steps after it skip them — where torch has set_stance (>= 2.6); without
    it (has_stance False: what torch 2.4 and 2.5 do) every step evaluates them. Tokens equal the reference."""
    gen = importlib.import_module("qkv.generation.backends")
    monkeypatch.setattr(gen, "COMPILE_BACKEND", "eager")
    skipped, real = [], getattr(torch.compiler, "set_stance", None)
    if has_stance and real is None:
        pytest.skip("this torch (< 2.6) has no torch.compiler.set_stance; the has_stance=False case is what it runs")
    if has_stance:
        monkeypatch.setattr(torch.compiler, "set_stance", lambda *a, **k: skipped.append(k) or real(*a, **k))
    else:
        monkeypatch.delattr(torch.compiler, "set_stance", raising=False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny")).eval()
    for batch, length in [(1, 4), (2, 7), (1, 4)]:  # other shapes, then the first again
        ids = torch.randint(0, 64, (batch, length))
        skipped.clear()
        got = model.generate(ids, 6, temperature=0, compile="inductor")
        assert torch.equal(got, model.generate(ids, 6, temperature=0, use_cache=False))
        # 5 steps after the prefill: all but the first skip their guards, where torch can
        assert skipped == ([{"skip_guard_eval_unsafe": True}] * 4 if has_stance else [])


@pytest.mark.skipif(not hasattr(torch.compiler, "set_stance"), reason="torch < 2.6 has no set_stance: no guards are skipped")
def test_a_step_past_the_recompile_limit_runs_with_its_guards(monkeypatch):
    """Past torch._dynamo's recompile limit (here 1: a second cache size is never compiled) a step without
    its guards finds no code and dynamo raises; generate then evaluates the guards for the rest of the
    call, and the tokens equal the reference."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny")).eval()
    ids = torch.randint(0, 64, (1, 4))
    with torch._dynamo.config.patch(recompile_limit=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's "hit config.recompile_limit"
        for new in (3, 6):  # caches of 7 slots, then of 10
            got = model.generate(ids, new, temperature=0, compile="inductor")
            assert torch.equal(got, model.generate(ids, new, temperature=0, use_cache=False))
    torch._dynamo.reset()


def test_with_an_eos_the_host_looks_at_the_rows_every_few_steps_and_the_tokens_stay(monkeypatch):
    """Issue 57: ``bool(finished.all())`` waited for the device on every token. On an accelerator the loop now looks
    every ``EOS_CHECK_EVERY`` steps (on a CPU, and with a streamer, every step) and cuts off the steps taken after
    every row finished: the same tokens, fewer host syncs (counted here as tensor-to-bool conversions)."""
    from qkv.generation import decode

    assert decode.eos_check_interval(torch.device("cuda"), streaming=False) == decode.EOS_CHECK_EVERY > 1
    assert decode.eos_check_interval(torch.device("cpu"), streaming=False) == 1
    assert decode.eos_check_interval(torch.device("cuda"), streaming=True) == 1
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=8, max_len=64)).eval()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    counted = []
    real_bool = torch.Tensor.__bool__

    def counting(t):  # the looks of the decode loop itself
        counted[-1] += sys._getframe(1).f_code.co_filename == decode.__file__
        return real_bool(t)

    monkeypatch.setattr(torch.Tensor, "__bool__", counting)
    runs = []
    for every in (1, 4):
        monkeypatch.setattr(decode, "eos_check_interval", lambda device, streaming: every)
        counted.append(0)
        runs.append(decode.generate(model, ids, 40, temperature=1.0, seed=3, eos_id=0, backend="eager"))
    monkeypatch.undo()
    steps = runs[0].size(1) - 3
    assert (runs[0][:, 3:] == 0).any(dim=1).all() and steps < 40  # both rows ended before 40 tokens
    assert torch.equal(runs[1], runs[0])
    assert counted == [steps, steps // 4]  # a look every step; every fourth step
