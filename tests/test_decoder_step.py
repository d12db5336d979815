"""qkv.decoder_step: the fused C++ decode step against the model's own forward (the reference): logits,
KV caches and tokens, for every architecture it takes; what it refuses and why; its errors."""
import dataclasses
import importlib
import pathlib
import re
import warnings

import pytest
import torch

import qkv
from qkv.kernels import fused_step as decoder_step
from qkv.kernels import build as matvec
from qkv.generation import BackendFallback
from qkv.generation.backends import last_logits, step_function
from qkv.generation.decode import StaticCache as _StaticCache

CONFIGS = {  # every norm, activation, positional encoding and head grouping the step takes
    "gpt2": dict(feed_forward=dict(activation="gelu_tanh")),
    "rope, GQA, swiglu, rmsnorm, no bias": dict(attention=dict(num_kv_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                                                position=dict(kind="rope"),
                                                feed_forward=dict(activation="swiglu", bias=False),
                                                normalization=dict(kind="rmsnorm")),
    "interleaved rope, geglu": dict(position=dict(kind="rope", interleaved=True),
                                    feed_forward=dict(activation="geglu")),
    "sinusoidal, relu, no final norm": dict(position=dict(kind="sinusoidal"), feed_forward=dict(activation="relu"),
                                            normalization=dict(final=False)),
    "no positions, silu, multi-query": dict(attention=dict(num_kv_heads=1), position=dict(kind="none"),
                                            feed_forward=dict(activation="silu")),
    "gelu, scaled embeddings": dict(feed_forward=dict(activation="gelu"), embedding=dict(scale=True),
                                    head=dict(tie=False)),
    "embedding norm, token types": dict(embedding=dict(norm=True, type_vocab_size=2)),
    # dot.h's vector paths: head_dim 80 = 64 + 16 (and d_model 160), head_dim 72 = 64 + 8 left to the reference loop
    "head_dim 80, d_model 160": dict(d_model=160, attention=dict(num_heads=2)),
    "head_dim 72, rope": dict(d_model=144, attention=dict(num_heads=2), position=dict(kind="rope")),
    # the sections' own: a head width apart from d_model / heads (Qwen3, Gemma), a bias on q, k, v only (Qwen2)
    "head_dim 16 of d_model 32 at 4 heads": dict(attention=qkv.models.AttentionConfig(num_heads=4, head_dim=16)),
    "q/k/v biased, out and MLP not, rope": dict(position=dict(kind="rope"), attention=qkv.models.AttentionConfig(
        num_heads=4, out_bias=False), feed_forward=qkv.models.FeedForwardConfig(bias=False)),
}


built = pytest.mark.usefixtures("kernels")  # tests/conftest.py: skips where they cannot be built


def tiny(seed: int = 0, **overrides) -> qkv.GPT:
    torch.manual_seed(seed)
    return qkv.GPT(qkv.ModelConfig.preset("tiny", **overrides)).eval()


def two_caches(model, ids, valid, capacity=20):
    """Two static caches after the same prefill: one for the reference step, one for the fused step."""
    caches = [_StaticCache(model, ids.size(0), capacity, device="cpu") for _ in range(2)]
    return caches, [c.prefill(ids, valid) for c in caches][0]


@built
@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("batch", [1, 3])
def test_logits_and_caches_equal_the_model_step_by_step(name, batch):
    """Six steps after a prompt (a left-padded row at batch 3): the fused step's logits and KV caches
    equal the model's forward to fp32's rounding."""
    model = tiny(**CONFIGS[name])
    ids = torch.randint(0, 64, (batch, 7), generator=torch.Generator().manual_seed(batch))
    valid = torch.ones(batch, 7, dtype=torch.bool)
    if batch > 1:
        valid[0, :3] = False  # row 0 of the batch of 3 starts with 3 pad tokens
    (ref, fused), logits = two_caches(model, ids, valid)
    step, reference = decoder_step.FusedStep(model), last_logits(model)
    with torch.no_grad():
        for slot in range(7, 13):
            tok = logits.argmax(-1)[:, None]  # (B, 1)
            for cache in (ref, fused):
                cache.slots[:, slot] = True
            input_pos = ref.slot_ids[slot:slot + 1]
            logits = reference(tok, ref.slots, ref.layers, input_pos)
            got = step(tok, fused.slots, fused.layers, input_pos)
            torch.testing.assert_close(got, logits, atol=2e-5, rtol=1e-5)
            for a, b in zip(ref.layers, fused.layers):
                torch.testing.assert_close(b.k, a.k, atol=1e-6, rtol=1e-5)
                torch.testing.assert_close(b.v, a.v, atol=1e-6, rtol=1e-5)


@built
@pytest.mark.parametrize("name", ["gpt2", "rope, GQA, swiglu, rmsnorm, no bias"])
def test_generate_gives_the_reference_tokens(name):
    """Greedy and seeded sampling, a left-padded batch, an end-of-sequence id and a window that slides
    (max_len 16: re-prefilled, then the fused step goes on): the tokens of generate without compile."""
    model = tiny(**CONFIGS[name], max_len=16)
    ids = torch.randint(0, 64, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :2] = False
    for kwargs in (dict(temperature=0), dict(temperature=0.8, top_k=20, seed=3), dict(temperature=0, eos_id=5)):
        for rows in (ids[:1], ids):
            want = model.generate(rows, 24, mask=mask[:len(rows)], **kwargs)
            assert torch.equal(model.generate(rows, 24, mask=mask[:len(rows)], compile="fused", **kwargs), want)


@built
@pytest.mark.parametrize("eos_id", [None, 7])
def test_greedy_steps_in_one_call_equal_steps_one_at_a_time(eos_id):
    """``greedy``'s n steps give the tokens, logits' argmax, KV caches, slots and finished rows of n calls of
    the step with Python's argmax and eos rule between them (a left-padded batch of 3)."""
    model = tiny(**CONFIGS["gpt2"])
    ids = torch.randint(0, 64, (3, 6), generator=torch.Generator().manual_seed(2))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, :2] = False
    (ref, fused), logits = two_caches(model, ids, valid)
    tok, step = logits.argmax(-1), decoder_step.FusedStep(model)
    finished = torch.tensor([False, True, False]) if eos_id is not None else torch.zeros(3, dtype=torch.bool)
    want, done, current = [], finished.clone(), tok
    with torch.no_grad():
        for slot in range(6, 14):
            ref.slots[:, slot] = True
            current = step(current[:, None], ref.slots, ref.layers, ref.slot_ids[slot:slot + 1]).argmax(-1)
            if eos_id is not None:
                current = torch.where(done, torch.full_like(current, eos_id), current)
                done |= current == eos_id
            want.append(current)
        got = step.greedy(tok[:, None], fused.slots, fused.layers, 6, 8, eos_id, finished)
    assert torch.equal(got, torch.stack(want, 1))
    assert torch.equal(finished, done) and torch.equal(fused.slots, ref.slots)
    for a, b in zip(ref.layers, fused.layers):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


@built
def test_greedy_steps_stop_once_every_row_has_emitted_eos():
    """With every row but one finished, the call stops at the step where the last one emits eos."""
    model = tiny(**CONFIGS["gpt2"])
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    (_, fused), logits = two_caches(model, ids, torch.ones_like(ids, dtype=torch.bool))
    step, tok = decoder_step.FusedStep(model), logits.argmax(-1)
    with torch.no_grad():
        free = step.greedy(tok[:, None], fused.slots.clone(), fused.layers, 5, 10, None, torch.zeros(2, dtype=torch.bool))
        (_, fused), _ = two_caches(model, ids, torch.ones_like(ids, dtype=torch.bool))
        eos = int(free[0, 3])  # row 0 emits it at its 4th step (or earlier, if it comes up before)
        finished = torch.tensor([False, True])
        got = step.greedy(tok[:, None], fused.slots, fused.layers, 5, 10, eos, finished)
    k = int((free[0] == eos).nonzero()[0]) + 1
    assert got.shape == (2, k) and bool(finished.all()) and (got[1] == eos).all()
    assert torch.equal(got[0], free[0, :k])


@built
def test_generate_takes_its_greedy_tokens_in_calls_of_many_steps(monkeypatch):
    """Greedy decoding with the fused step: one call a window's worth of tokens (two here: the window
    slides once at max_len 16), the reference tokens, and a prompt alone for max_new_tokens=0."""
    model = tiny(**CONFIGS["gpt2"], max_len=16)
    calls, real = [], decoder_step.FusedStep.greedy
    monkeypatch.setattr(decoder_step.FusedStep, "greedy", lambda self, *a: calls.append(a[4]) or real(self, *a))
    ids = torch.randint(0, 64, (1, 6))
    got = model.generate(ids, 20, temperature=0, compile="fused")
    assert calls == [10, 8]  # 6 + 1 + 10 fill the 16 slots' window; after the slide (8 kept), 1 + 8 more
    assert torch.equal(got, model.generate(ids, 20, temperature=0, backend="eager"))
    assert torch.equal(model.generate(ids, 0, temperature=0, compile="fused"), ids)


@built
def test_the_same_bits_on_one_two_and_three_threads():
    """Each output is one thread's sum in one order, whichever thread takes its row and whatever the thread
    count (same caches, same token); 3 threads on this 2-core machine, one often descheduled, make the
    others take over its rows."""
    model = tiny(**CONFIGS["gpt2"])
    ids = torch.randint(0, 64, (2, 5))
    (_, cache), logits = two_caches(model, ids, torch.ones_like(ids, dtype=torch.bool))
    cache.slots[:, 5] = True
    kept = [(layer.k.clone(), layer.v.clone()) for layer in cache.layers]
    threads, runs = torch.get_num_threads(), []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            for layer, (k, v) in zip(cache.layers, kept):
                layer.k.copy_(k), layer.v.copy_(v)
            with torch.no_grad():
                runs.append(decoder_step.FusedStep(model)(logits.argmax(-1)[:, None], cache.slots, cache.layers,
                                                          cache.slot_ids[5:6]))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(runs[0], run) for run in runs[1:])


@built
def test_compile_true_takes_the_fused_step_where_it_can(monkeypatch):
    """compile=True: the fused step for a supported model at up to MAX_ROWS rows, inductor's otherwise;
    "inductor" always compiles; "fused" names why it cannot."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    model = tiny()
    assert isinstance(step_function(model, 1, True), decoder_step.FusedStep)
    assert isinstance(step_function(model, decoder_step.MAX_ROWS, "fused"), decoder_step.FusedStep)
    assert not isinstance(step_function(model, decoder_step.MAX_ROWS + 1, True), decoder_step.FusedStep)
    assert not isinstance(step_function(model, 1, "inductor"), decoder_step.FusedStep)
    with pytest.raises(ValueError, match=r"compile='fused' cannot decode this model at batch 5: batch 5 > 4 rows"):
        step_function(model, 5, "fused")
    with pytest.raises(ValueError, match=r"compile must be one of \(False, True, 'fused', 'inductor'\), got 'fast'"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 2, compile="fast")


def hooked(model):
    model.blocks[0].ff.register_forward_hook(lambda *args: None)
    return model


def strided(model):
    """A down projection whose weight is a transposed view (the same values, not contiguous)."""
    down = model.blocks[1].ff.down_proj
    down.weight.data = down.weight.data.t().contiguous().t()
    return model


def affine_free(model):
    model.final_norm = torch.nn.LayerNorm(model.config.d_model, elementwise_affine=False)
    return model


@pytest.mark.parametrize("model, reason", [
    (lambda: tiny(position=dict(kind="alibi")), "config field position.kind='alibi'"),
    (lambda: tiny(normalization=dict(first=False, final=False)), "config field normalization.first=False"),
    (lambda: tiny().to(torch.float16), "torch.float16 weights on cpu"),
    (lambda: hooked(tiny()), "blocks.0.ff has hooks"),
    (lambda: strided(tiny()), "a weight that is not a contiguous float32 or bfloat16 CPU tensor"),
    (lambda: affine_free(tiny()), "final_norm is a norm without weights"),
    (lambda: qkv.Transformer(qkv.ModelConfig.preset("tiny")), "it decodes qkv.GPT models, not Transformer"),
])
def test_what_it_refuses_is_named_and_decoded_the_reference_way(model, reason, monkeypatch):
    """Each model it cannot run gets a reason; generate(compile=True) then uses auto's forward (never a compile),
    saying why in one warning."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    model = model()
    assert reason in decoder_step.refuses(model, 1)
    if isinstance(model, qkv.GPT):
        ids = torch.randint(0, 64, (1, 4))
        with pytest.warns(BackendFallback, match=re.escape(reason)) as said:
            got = model.generate(ids, 4, temperature=0, compile=True)
        assert len(said) == 1 and "decoding with the auto backend" in str(said[0].message)
        assert torch.equal(got, model.generate(ids, 4, temperature=0))


def test_without_the_kernels_compile_true_falls_back(monkeypatch):
    """Where qkv's kernels cannot be built, compile=True is inductor's step, with the reference's tokens."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(matvec, "LOADED", False)
    model = tiny()
    assert decoder_step.refuses(model, 1) == "qkv's C++ kernels are not available here (the warning said why)"
    ids = torch.randint(0, 64, (1, 4))
    with pytest.warns(BackendFallback, match="C\\+\\+ kernels are not available") as said:
        got = model.generate(ids, 4, temperature=0, compile=True)
    assert len(said) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the reference path says nothing
        assert torch.equal(got, model.generate(ids, 4, temperature=0))
    with pytest.raises(ValueError, match="the fused decode step cannot run this model: qkv's C"):
        decoder_step.FusedStep(model)


@built
def test_bad_input_is_named():
    """The state and the op check what they are given and say what they expected; a refused step writes
    nothing."""
    model = tiny()
    ids = torch.randint(0, 64, (1, 4))
    (_, cache), _ = two_caches(model, ids, torch.ones_like(ids, dtype=torch.bool))
    step = decoder_step.FusedStep(model)
    caches = [t for layer in cache.layers for t in (layer.k, layer.v)]
    before = [t.clone() for t in caches]
    state = matvec.MODULE.DecoderState
    args = (step.weights, caches, torch.empty(0), step.shape + [20] + step.experts, 1e-5, 1.0)  # M = 20 slots
    no_up = step.weights[:5 + 12] + [torch.empty(0)] + step.weights[5 + 13:]  # layer 0 without its up product
    bad_states = [
        ((step.weights[:-1], *args[1:]),
         r"expected 68 weights and as many scales for 2 layers \(a k and a v cache each\), got 67"),
        ((no_up, *args[1:]), r"layer 0 must hand in a dense feed-forward \(up, down\) or a mixture of experts"),
        ((step.weights[:7] + [step.weights[7][:-1]] + step.weights[8:], *args[1:]),
         r"weight 7 must be a contiguous float32 CPU tensor .* of 1024 elements, got Float \[31, 32\]"),
        ((step.weights[:2] + [torch.ones(32).double()] + step.weights[3:], *args[1:]),
         r"weight 2 must be .* of 32 elements \(or none\), got Double \[32\]"),
        ((args[0], caches[:1] + [c[:, :, :5] for c in caches[1:]], *args[2:]),
         r"each cache must be contiguous float32 or bfloat16, all alike \(1, 4, rows, 8\), 1 <= rows <= 20, "
         r"a layer's k and v alike, "
         r"got Float \[1, 4, 20, 8\] beside \[1, 4, 5, 8\]"),
        ((args[0], [torch.zeros(1, 4, 21, 8)] * len(caches), *args[2:]), r"1 <= rows <= 20, .* got Float \[1, 4, 21"),
        ((*args[:3], step.shape + [20], 1e-5, 1.0), r"shape must hold 16 ints, got 11"),
        ((*args[:3], [32, 4, 3, *step.shape[3:], 20] + step.experts, 1e-5, 1.0),
         r"G dividing H and D even, got \(32, 4, 3, 8, 128, 64, 20\)"),
        ((*args[:3], step.shape + [20, 4, 5, 8, 1, 0], 1e-5, 1.0),
         r"1 <= k <= E, I > 0 and S >= 0, got \(4, 5, 8, 0\)"),
    ]
    for bad, message in bad_states:
        with pytest.raises(RuntimeError, match=message):
            state(*bad)
    pos, good, tok = cache.slot_ids[4:5], state(*args), torch.tensor([[3]])
    cases = [
        ((tok.int(), cache.slots, pos), r"ids must be contiguous int64 \(1, 1\), one new token a row, got Int"),
        ((torch.tensor([[3, 4]]), cache.slots, pos), r"ids must be .* got Long \[1, 2\]"),
        ((torch.tensor([[64]]), cache.slots, pos), r"token ids must lie in \[0, 64\), got 64"),
        ((tok, cache.slots[:, :5], pos), r"slots must be contiguous bool \(1, 20\), got Bool \[1, 5\]"),
        ((tok, cache.slots, torch.tensor([20])), r"the slot must lie in \[0, 20\), got 20"),
    ]
    for bad, message in cases:
        with pytest.raises(RuntimeError, match=message):
            good.step(*bad)
    greedy_cases = [
        ((tok, cache.slots, 15, 6, -1, torch.zeros(1, dtype=torch.bool)), r"got 15 and the 5 after it"),
        ((tok, cache.slots, 4, 2, -1, torch.zeros(2, dtype=torch.bool)), r"finished must be contiguous bool \(1,\)"),
        ((tok, cache.slots, 4, 2, 64, torch.zeros(1, dtype=torch.bool)), r"eos 64 must lie in the embedding's 64"),
    ]
    for bad, message in greedy_cases:
        with pytest.raises(RuntimeError, match=message):
            good.greedy(*bad)
    assert all(torch.equal(a, b) for a, b in zip(before, caches))


@built
def test_positions_past_the_table_are_refused():
    """A learned position table of max_len rows: a cache that holds more tokens than that is refused by
    name rather than read past the table's end."""
    model = tiny(max_len=8)
    cache = _StaticCache(model, 1, 12, device="cpu")
    cache.slots[:, :10] = True
    with pytest.raises(RuntimeError, match=r"position 9 is past the position table's 8 rows"):
        decoder_step.FusedStep(model)(torch.tensor([[1]]), cache.slots, cache.layers, cache.slot_ids[9:10])


@built
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu", "swiglu"])
def test_activations_far_outside_exp_range_give_their_limits(activation):
    """Inner activations of ±hundreds (the vectorised exp clamps its argument): the model's tokens, and
    no inf or NaN in the logits."""
    model = tiny(feed_forward=dict(activation=activation))
    with torch.no_grad():
        for p in model.blocks[0].ff.up_proj.parameters():
            p.mul_(500)
    ids = torch.randint(0, 64, (1, 5))
    assert torch.equal(model.generate(ids, 6, temperature=0, compile="fused"), model.generate(ids, 6, temperature=0))
    (_, cache), logits = two_caches(model, ids, torch.ones_like(ids, dtype=torch.bool))
    cache.slots[:, 5] = True
    with torch.no_grad():
        got = decoder_step.FusedStep(model)(logits.argmax(-1)[:, None], cache.slots, cache.layers, cache.slot_ids[5:6])
    assert torch.isfinite(got).all()


# --- the allow-list: what the step was not built for falls back, decoded the reference way -------------------

class ScaledAttention(qkv.MultiHeadAttention):
    """The same weights, the output scaled: what a user's variant of a block's attention looks like."""

    def forward(self, x, *args, **kwargs):
        out = super().forward(x, *args, **kwargs)
        return (out[0] * 30, out[1]) if isinstance(out, tuple) else out * 30


class ScaledFeedForward(qkv.FeedForward):
    def forward(self, x):
        return 30 * super().forward(x)


class NormedFeedForward(torch.nn.Module):
    """A feed-forward behind an added norm (in the spirit of a QK-norm or a sandwich norm)."""

    def __init__(self, ff, d_model):
        super().__init__()
        self.norm, self.ff = torch.nn.LayerNorm(d_model), ff

    def forward(self, x):
        return 30 * self.ff(self.norm(x))


def subclassed_attention(model):
    model.blocks[1].attn.__class__ = ScaledAttention
    return model


def subclassed_feed_forward(model):
    model.blocks[0].ff.__class__ = ScaledFeedForward
    return model


def added_norm(model):
    model.blocks[0].ff = NormedFeedForward(model.blocks[0].ff, model.config.d_model)
    return model


def extra_module(model):
    model.blocks[0].attn.probe = torch.nn.RMSNorm(model.config.head_dim)  # held, though this forward ignores it
    return model


@built
@pytest.mark.parametrize("change, reason", [
    (subclassed_attention, "blocks.1.attn is a ScaledAttention where a qkv.GPT of this config has a MultiHeadAttention"),
    (subclassed_feed_forward, "blocks.0.ff is a ScaledFeedForward where a qkv.GPT of this config has a FeedForward"),
    (added_norm, "blocks.0.ff is a NormedFeedForward where a qkv.GPT of this config has a FeedForward"),
    (extra_module, "blocks.0.attn.probe is a RMSNorm where a qkv.GPT of this config has nothing of the kind"),
])
def test_a_module_it_does_not_know_falls_back_to_the_reference_tokens(change, reason, monkeypatch):
    """The issue's experiment: a block's attention or feed-forward subclassed (same weights, output scaled), or a
    norm added. A deny-list decoded these as the unmodified model; the allow-list refuses them, generate says why
    once, and the greedy tokens are the model's own."""
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()  # a model of an earlier case may have had this one's id: dynamo would reuse its graph
    plain, model = tiny(), change(tiny())
    ids = torch.randint(0, 64, (1, 5))
    assert decoder_step.refuses(model, 1) == reason
    want = model.generate(ids, 12, temperature=0)
    assert change is extra_module or not torch.equal(want, plain.generate(ids, 12, temperature=0))  # really another model
    with pytest.warns(BackendFallback, match=re.escape(reason)):
        assert torch.equal(model.generate(ids, 12, temperature=0, compile=True), want)
    assert decoder_step.refuses(plain, 1) is None


@dataclasses.dataclass(frozen=True)
class AttentionWithANewField(qkv.models.AttentionConfig):
    """A ModelConfig section that has grown a field (as a later issue will add one)."""

    future_option: bool = False


@built
def test_a_config_field_it_does_not_declare_is_refused_until_it_does(monkeypatch):
    new = qkv.models.ModelConfig.preset("tiny", attention=AttentionWithANewField(num_heads=4, future_option=True))
    assert decoder_step.refuses(qkv.GPT(new), 1) == (
        "config field attention.future_option=True, which the fused step does not declare")
    at_default = new.replace(attention=AttentionWithANewField(num_heads=4))
    assert decoder_step.refuses(qkv.GPT(at_default), 1) is None  # its default: what the step computes
    monkeypatch.setitem(decoder_step.CONFIG, "attention.future_option", {True})
    assert decoder_step.refuses(qkv.GPT(new), 1) is None  # declared: accepted


@built
def test_every_config_field_is_declared_or_at_its_default():
    """The fused step's CONFIG names no field that ModelConfig lacks, and every field it leaves out is one
    whose default value it computes."""
    fields = decoder_step.config_fields(qkv.models.ModelConfig())
    assert set(decoder_step.CONFIG) <= set(fields), set(decoder_step.CONFIG) - set(fields)


def mapping_of(address: int) -> dict[str, str] | None:
    """The /proc/self/smaps fields of the mapping that holds ``address`` ({"AnonHugePages": "8192 kB", "VmFlags":
    "rd wr mr mw me ac hg", ...}); None where there is no such file or mapping."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    fields = None
    for line in lines:
        head, _, rest = line.partition(" ")
        if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
            if fields is not None:
                return fields
            start, end = (int(v, 16) for v in head.split("-"))
            fields = {} if start <= address < end else None
        elif fields is not None:
            fields[head.rstrip(":")] = rest.strip()
    return fields


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_moved_onto_huge_pages_keep_their_values_ties_and_logits(dtype, monkeypatch):
    """A FusedStep moves the model's weights onto a mapping asked for 2 MB pages before it was touched: the same
    parameters, values and ties, the same logits bits as a step on the memory as it was, nothing moved again by
    the next step; where THP is not off, the 8 MB token table lies on 2 MB pages at once (no waiting)."""
    model = tiny(**CONFIGS["rope, GQA, swiglu, rmsnorm, no bias"], vocab_size=32768).to(dtype)
    table, head = model.embed.tok.weight, model.lm_head.weight
    kept, before = {n: t.clone() for n, t in model.state_dict().items()}, table.data_ptr()
    ids = torch.randint(0, 64, (1, 5))
    runs = []
    for thp in ("/nonexistent", decoder_step.THP):  # no THP to read: nothing moves
        monkeypatch.setattr(decoder_step, "THP", pathlib.Path(thp))
        (_, cache), logits = two_caches(model, ids, torch.ones_like(ids, dtype=torch.bool))
        cache.slots[:, 5] = True
        runs.append(decoder_step.FusedStep(model)(logits.argmax(-1)[:, None], cache.slots, cache.layers,
                                                 cache.slot_ids[5:6]))
        assert table.data_ptr() == before or decoder_step.thp_mode() not in (None, "never")
    assert torch.equal(runs[0], runs[1]) and model.lm_head.weight is head and head is table
    assert all(torch.equal(t, kept[n]) for n, t in model.state_dict().items())
    assert decoder_step.onto_huge_pages(decoder_step.FusedStep(model).weights) == 0  # moved once, kept there
    mode, fields = decoder_step.thp_mode(), mapping_of(table.data_ptr())
    if mode in (None, "never") or fields is None:
        pytest.skip(f"no transparent huge pages here (THP {mode!r}, /proc/self/smaps {fields is not None})")
    assert table.data_ptr() != before and "hg" in fields["VmFlags"].split()  # asked for 2 MB pages
    if int(fields["AnonHugePages"].split()[0]) == 0:
        pytest.skip("Linux gave no 2 MB page for the mapping asked for them (its free memory too fragmented)")
    assert int(fields["AnonHugePages"].split()[0]) * 1024 >= table.numel() * table.element_size() - (4 << 20)


@built
def test_huge_pages_fall_back_silently_where_thp_is_off_and_warn_once_where_linux_refuses(monkeypatch, tmp_path):
    """THP "never" (or no THP file): nothing moved, nothing asked, no warning; a mapping Linux refuses (-1):
    nothing moved, one warning however many steps ask."""
    calls, weight = [], torch.ones(1 << 16)
    monkeypatch.setattr(matvec.MODULE, "onto_huge_pages", lambda tensors, least: calls.append(least) or -1)
    monkeypatch.setattr(decoder_step, "WARNED", set())
    thp = tmp_path / "enabled"
    for mode, said in (("always madvise [never]", 0), ("always [madvise] never", 1)):
        thp.write_text(mode)
        monkeypatch.setattr(decoder_step, "THP", thp)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert decoder_step.onto_huge_pages([weight]) == 0 and decoder_step.onto_huge_pages([weight]) == 0
        assert len(caught) == said and (not said or "refused" in str(caught[0].message)), [str(w.message) for w in caught]
    assert calls == [decoder_step.HUGE_MIN_BYTES] * 2
