"""qkv.nn.moe: the grouped and gathered dispatches (and the training speed layer's, qkv.kernels.moe_training) equal the
reference loop, routing as hand-computed and as Hugging Face's MoE blocks compute it given the same weights, the
auxiliary losses, and bad input refused in one error."""
import math
import warnings

import pytest
import torch

from qkv.kernels import accelerate_training
from qkv.models import GPT, ModelConfig
from qkv.nn.moe import (MixtureOfExperts, Router, SwiGLUExperts, gathered_dispatch, load_balancing_loss,
                        reference_dispatch, router_z_loss)
from qkv.nn.layers import FeedForward


def moe(E=4, k=2, C=8, I=6, *, shared=False, gate=False, bias=False, activation="swiglu", **router):
    torch.manual_seed(0)
    experts = SwiGLUExperts(E, C, I, bias=bias, activation=activation)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.5)
    return MixtureOfExperts(Router(C, E, k, bias=True, **router), experts, FeedForward(C, 5, "swiglu", bias=False)
                            if shared else None, torch.nn.Linear(C, 1, bias=False) if gate else None)


@pytest.mark.parametrize("E,k,options", [
    (4, 2, {}), (4, 1, {}), (4, 4, {}),  # k = 1, k = E
    (6, 2, dict(shared=True, gate=True, bias=True)),
    (4, 2, dict(activation="swiglu_clamped", bias=True, top_k_first=True)),
    (8, 3, dict(score="sigmoid", n_group=4, topk_group=2, correction_bias=True, scaling=2.5, norm_topk_prob=True)),
])
@pytest.mark.parametrize("dispatch", ["grouped", "grouped_mm", "gathered"])
def test_fast_dispatch_equals_reference(E, k, options, dispatch, monkeypatch):
    """Outputs and the gradients of x and of every parameter, an expert left without a token (unless k = E);
    grouped through its loop over experts and, as the training speed layer swaps it in, through one
    torch._grouped_mm per product where that takes the experts (no biases)."""
    m = moe(E, k, I=8, **options)  # I = 8: rows 16-byte aligned for _grouped_mm
    m.dispatch = dispatch.removesuffix("_mm")
    calls = []
    if dispatch == "grouped_mm":
        accelerate_training(m)
        if hasattr(torch, "_grouped_mm"):
            monkeypatch.setattr(torch, "_grouped_mm", lambda *a, g=torch._grouped_mm, **kw: calls.append(1) or g(*a, **kw))
    with torch.no_grad():  # expert 0 receives no token: the router never scores it high
        m.router.bias[0] = -100.0 if k < E else 0.0
    x = torch.randn(3, 5, 8, requires_grad=True)  # a batch of 3 × 5 (padding rows are rows like any other)
    y = m(x)
    assert m.fallback is None and y.shape == x.shape
    assert bool(calls) == (dispatch == "grouped_mm" and hasattr(torch, "_grouped_mm") and not options.get("bias"))
    assert int(m.expert_counts.sum()) == 15 * k and (k == E or int(m.expert_counts[0]) == 0)
    ref = m.reference_forward(x)
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=1e-6)
    inputs = [x, *m.parameters()]
    grads, refs = (torch.autograd.grad(out.square().sum(), inputs) for out in (y, ref))
    # the fast paths sum in other orders (over the k choices, inside batched and grouped products), and gradients
    # here reach hundreds, so 1e-6 of the largest (a few fp32 roundings; k = 1's router gradient is such rounding)
    scale = max(float(g.abs().max()) for g in refs)
    for name, g, g_ref in zip(["x"] + [n for n, _ in m.named_parameters()], grads, refs):
        torch.testing.assert_close(g, g_ref, atol=1e-6 * scale, rtol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_grouped_mm_under_bf16_autocast_runs_its_products_in_bf16(monkeypatch):
    """Under CPU autocast the training speed layer's grouped products run in bf16 as F.linear's would: the
    reference's answer to within summation order, gradients to within bf16 rounding."""
    m, calls = accelerate_training(moe(4, 2, I=8)), []
    if hasattr(torch, "_grouped_mm"):
        monkeypatch.setattr(torch, "_grouped_mm", lambda *a, g=torch._grouped_mm, **kw: calls.append(1) or g(*a, **kw))
    x = torch.randn(3, 5, 8, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        y, ref = m(x), m.reference_forward(x)
    assert y.dtype == ref.dtype and bool(calls) == hasattr(torch, "_grouped_mm")
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    inputs = [x, *m.parameters()]
    for g, g_ref in zip(*(torch.autograd.grad(out.square().sum(), inputs) for out in (y, ref))):
        torch.testing.assert_close(g, g_ref, atol=1e-2 * float(g_ref.abs().max()), rtol=1e-2)


class CastCount(torch.overrides.TorchFunctionMode):
    """Records the name of each of ``weights`` (name -> tensor) that ``Tensor.to`` is called on."""

    def __init__(self, weights: dict) -> None:
        super().__init__()
        self.names, self.casts = {id(w): n for n, w in weights.items()}, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.to and args and id(args[0]) in self.names:
            self.casts.append(self.names[id(args[0])])
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
def test_grouped_training_casts_each_stacked_weight_once_under_autocast():
    """Recording gradients under bf16 autocast, the training speed layer casts each stacked expert weight to bf16
    once per forward, not once per expert (the casts, and their gradients' casts back, cost per parameter)."""
    m = accelerate_training(moe(4, 2, I=8))
    x = torch.randn(3, 5, 8, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16), CastCount(dict(m.experts.named_parameters())) as count:
        m(x).float().square().sum().backward()
    assert sorted(count.casts) == ["down_proj", "gate_proj", "up_proj"]


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
def test_the_grouped_products_say_why_they_refuse_experts():
    from qkv.kernels.moe_training import refuses_experts

    x, experts = torch.randn(2, 8), SwiGLUExperts(4, 8, 8)
    assert refuses_experts(experts, x) is None
    assert refuses_experts(SwiGLUExperts(4, 8, 8, bias=True), x) == "biased experts"
    assert refuses_experts(SwiGLUExperts(4, 8, 6), x) == "rows not 16-byte aligned"  # 6 fp32 = 24 bytes
    assert refuses_experts(experts, x.bfloat16()) == "tokens in torch.bfloat16, weights in torch.float32"
    assert refuses_experts(experts.double(), x.double()) == "a cpu torch.float64 product, not a CPU fp32 or bf16 one"
    with torch.autocast("cpu", torch.bfloat16):  # autocast leaves float64 to F.linear: its products stay float64
        assert refuses_experts(experts.double(), x.double()) == "a cpu torch.float64 product, not a CPU fp32 or " \
            "bf16 one"


def test_training_swap_says_why_it_keeps_the_layers_dispatch():
    """The swapped-in layer records why a forward kept the layer's own dispatch; ``restore`` undoes the swap."""
    from qkv.kernels import restore
    from qkv.kernels.moe_training import TrainingMixtureOfExperts

    m = accelerate_training(moe(4, 2, I=8))
    assert type(m) is TrainingMixtureOfExperts
    x = torch.randn(2, 3, 8)
    m(x)
    assert m.grouped_mm_fallback == (None if hasattr(torch, "_grouped_mm") else "this torch has no _grouped_mm")
    with torch.no_grad():
        m(x)
    assert m.grouped_mm_fallback.startswith("autograd is not recording")
    m.dispatch = "reference"
    m(x)
    assert m.grouped_mm_fallback == "the layer asks for the reference dispatch"
    biased = accelerate_training(moe(4, 2, I=8, bias=True))
    biased(x)
    assert biased.grouped_mm_fallback in ("biased experts", "this torch has no _grouped_mm")
    assert type(restore(m)) is MixtureOfExperts


def test_training_swap_inside_torch_compile_keeps_the_layers_dispatch():
    """qkv train --compile: inside torch.compile the layer keeps its own grouped dispatch (torch's fake
    _grouped_mm on a CPU takes bf16 only, so tracing fp32 products would fail), with the reference's answer."""
    torch._dynamo.reset()
    m = accelerate_training(moe(4, 2, I=8))
    x = torch.randn(2, 3, 8, requires_grad=True)
    y = torch.compile(m, backend="eager")(x)
    assert m.grouped_mm_fallback.startswith("inside torch.compile")
    torch.testing.assert_close(y, m.reference_forward(x), atol=1e-6, rtol=1e-6)


def router_of(E, k, **options):
    """A router whose logits are its input (W_r = I): x (N, E) reads as logits."""
    r = Router(E, E, k, **options)
    with torch.no_grad():
        r.weight.copy_(torch.eye(E))
    return r


def test_softmax_topk_renormalised_or_not():
    x = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    w, e, _ = router_of(4, 2)(x)
    assert e.tolist() == [[0, 1]]
    torch.testing.assert_close(w, torch.tensor([[math.e / (math.e + 1), 1 / (math.e + 1)]]))
    w, _, _ = router_of(4, 2, norm_topk_prob=False)(x)
    torch.testing.assert_close(w, torch.softmax(x, -1)[:, :2])


def test_top_k_first_softmax_over_the_k_logits():
    r = router_of(4, 2, top_k_first=True, bias=True)
    with torch.no_grad():
        r.bias.copy_(torch.tensor([0.0, 0.0, 3.0, 0.0]))
    w, e, _ = r(torch.tensor([[2.0, 1.0, 0.0, -1.0]]))  # logits 2, 1, 3, -1
    assert e.tolist() == [[2, 0]]
    torch.testing.assert_close(w, torch.tensor([[1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))]]))


def test_correction_bias_chooses_but_does_not_weigh():
    r = router_of(4, 2, score="sigmoid", correction_bias=True, scaling=2.5)
    r.correction_bias.copy_(torch.tensor([5.0, 0.0, 0.0, 0.0]))
    w, e, _ = r(torch.tensor([[0.0, 0.0, 1.0, 2.0]]))
    assert sorted(e[0].tolist()) == [0, 3]
    s0, s3 = 0.5, 1 / (1 + math.exp(-2))  # sigmoid(0), sigmoid(2): unbiased
    want = {0: s0 / (s0 + s3) * 2.5, 3: s3 / (s0 + s3) * 2.5}
    torch.testing.assert_close(w[0], torch.tensor([want[i] for i in e[0].tolist()]))


def test_group_limited_routing_keeps_the_best_groups():
    r = router_of(4, 2, score="sigmoid", n_group=2, topk_group=1)
    logits = torch.logit(torch.tensor([[0.9, 0.1, 0.6, 0.6]]))  # groups {0, 1}: 1.0, {2, 3}: 1.2
    _, e, _ = r(logits)
    assert sorted(e[0].tolist()) == [2, 3]  # expert 0 scores best, but its group is dropped
    v2 = router_of(4, 2, score="sigmoid", n_group=2, topk_group=1, group_score="max")  # DeepSeek-V2: a group's best
    assert sorted(v2(logits).experts[0].tolist()) == [0, 1]  # {0, 1} scores 0.9, {2, 3} 0.6
    with pytest.raises(ValueError, match=r"group_score must be one of \('top2', 'max'\), got 'sum'"):
        router_of(4, 2, n_group=2, topk_group=1, group_score="sum")


def hf_experts(hf, m):
    """Copy a transformers MoE block's router and fused experts into a qkv MixtureOfExperts."""
    with torch.no_grad():
        m.router.weight.copy_(hf.gate.weight)
        gate, up = hf.experts.gate_up_proj.chunk(2, dim=1)  # (E, 2I, C) -> 2 × (E, I, C)
        m.experts.gate_proj.copy_(gate), m.experts.up_proj.copy_(up)
        m.experts.down_proj.copy_(hf.experts.down_proj)


def hf_block(name, config_name, **fields):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    config = getattr(transformers, config_name)(hidden_size=8, **fields)
    module = __import__(f"transformers.models.{name}.modeling_{name}", fromlist=["x"])
    block_class = {"mixtral": "MixtralSparseMoeBlock", "qwen2_moe": "Qwen2MoeSparseMoeBlock",
                   "deepseek_v3": "DeepseekV3MoE"}[name]
    hf = getattr(module, block_class)(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.5)
    return hf


def test_as_mixtral_block():
    hf = hf_block("mixtral", "MixtralConfig", intermediate_size=6, num_local_experts=5, num_experts_per_tok=2)
    m = moe(5, 2)
    hf_experts(hf, m)
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(m(x), hf(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", [False, True])
def test_as_qwen2_moe_block(norm):
    hf = hf_block("qwen2_moe", "Qwen2MoeConfig", moe_intermediate_size=6, shared_expert_intermediate_size=5,
                  num_experts=6, num_experts_per_tok=3, norm_topk_prob=norm)
    m = moe(6, 3, shared=True, gate=True, norm_topk_prob=norm)
    hf_experts(hf, m)
    with torch.no_grad():
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(m.shared, name).weight.copy_(getattr(hf.shared_expert, name).weight)
        m.shared_gate.weight.copy_(hf.shared_expert_gate.weight)
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(m(x), hf(x), atol=1e-5, rtol=1e-5)


def test_as_deepseek_v3_block():
    """Group-limited sigmoid routing, the correction bias and a shared expert: the component DeepSeek-V3 needs."""
    hf = hf_block("deepseek_v3", "DeepseekV3Config", moe_intermediate_size=6, n_routed_experts=8, num_experts_per_tok=3,
                  n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True)
    m = MixtureOfExperts(Router(8, 8, 3, score="sigmoid", n_group=4, topk_group=2, correction_bias=True, scaling=2.5),
                         SwiGLUExperts(8, 8, 6), FeedForward(8, 6, "swiglu", bias=False))
    hf_experts(hf, m)
    with torch.no_grad():
        hf.gate.e_score_correction_bias.normal_(0, 0.5)
        m.router.correction_bias.copy_(hf.gate.e_score_correction_bias)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(m.shared, name).weight.copy_(getattr(hf.shared_experts, name).weight)
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(m(x), hf(x), atol=1e-5, rtol=1e-5)


def test_load_balancing_loss_as_mixtral_and_z_loss():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    torch.manual_seed(0)
    layers, mask = (torch.randn(10, 4), torch.randn(10, 4)), torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    torch.testing.assert_close(load_balancing_loss(torch.cat(layers), 2, mask.bool().repeat(2, 1)),
                               load_balancing_loss_func(layers, 4, 2, mask))
    balanced = torch.zeros(8, 4)
    assert float(load_balancing_loss(balanced, 2)) == pytest.approx(2.0)  # k where balanced
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert float(router_z_loss(logits)) == pytest.approx(math.log(4.0) ** 2)


def test_router_logits_come_back_in_the_output_where_asked_and_stay_off_the_module():
    m, x = moe().eval(), torch.randn(1, 3, 8)
    y = m(x)
    assert isinstance(y, torch.Tensor) and not hasattr(m, "router_logits")
    y2, logits = m.train()(x, return_router_logits=True)
    torch.testing.assert_close(y2, y)
    assert logits.shape == (3, 4) and logits.requires_grad and not hasattr(m, "router_logits")


def test_fallback_says_why_and_keeps_the_answer():
    class Logged(SwiGLUExperts):
        pass

    m = moe()
    m.experts.__class__ = Logged
    x = torch.randn(2, 3, 8)
    with pytest.warns(UserWarning, match="reference dispatch: experts are a Logged"):
        y = m(x)
    assert m.fallback.startswith("experts are a Logged")
    torch.testing.assert_close(y, m.reference_forward(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per module
        m(x)


def test_bad_input_in_one_error():
    with pytest.raises(ValueError, match=r"top_k=5 is larger than num_experts=4; score must be one of"):
        Router(8, 4, 5, score="cosine")
    with pytest.raises(ValueError, match="n_group=3 must divide.*topk_group=4 is larger than n_group=3"):
        Router(8, 8, 2, n_group=3, topk_group=4)
    with pytest.raises(ValueError, match="dispatch must be one of"):
        MixtureOfExperts(Router(8, 4, 2), SwiGLUExperts(4, 8, 6), dispatch="fast")
    with pytest.raises(ValueError, match="moe: top_k=9 is larger than num_experts=8; expert activation"):
        ModelConfig(moe=dict(num_experts=8, top_k=9, activation="gelu"))
    with pytest.raises(ValueError, match="moe.layers must name each of the 2 layers"):
        ModelConfig(num_layers=2, moe=dict(num_experts=4, layers=["moe"]))


def test_config_section_builds_and_round_trips():
    c = ModelConfig(vocab_size=40, d_model=16,
                    attention=dict(num_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                    position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False, d_ff=20),
                    normalization=dict(kind="rmsnorm"), num_layers=3,
                    moe=dict(num_experts=4, d_expert=8, d_shared=12, shared_gate=True, layers=["dense", "moe", "moe"]))
    model = GPT(c)
    assert type(model.blocks[0].ff) is FeedForward and type(model.blocks[1].ff) is MixtureOfExperts
    assert model.blocks[1].ff.experts.gate_proj.shape == (4, 8, 16)
    assert ModelConfig.from_dict(c.to_dict()) == c and "moe" not in ModelConfig().to_dict()
    ids = torch.randint(0, 40, (2, 6))
    out = model(ids, targets=ids)
    out.loss.backward()
    assert model.blocks[1].ff.router.weight.grad is not None
    assert torch.equal(model.generate(ids[:1, :3], 4, temperature=0.0), model.generate(ids[:1, :3], 4,
                                                                                        temperature=0.0, use_cache=False))


def test_reference_dispatch_is_the_per_expert_sum():
    m = moe(3, 2, C=4, I=3)
    x = torch.randn(5, 4)
    routing = m.router(x)
    want = torch.stack([sum(routing.weights[n, j] * m.experts(x[n:n + 1], int(routing.experts[n, j]))[0]
                            for j in range(2)) for n in range(5)])
    torch.testing.assert_close(reference_dispatch(x, routing, m.experts), want)


def test_model_flags_turn_experts_on():
    from qkv.cli.model_flags import apply_overrides
    from qkv.models.config import PRESETS

    c = apply_overrides(PRESETS["tiny"], {"moe.num_experts": 4, "moe.layers": ["dense", "moe"]})
    assert c.moe.num_experts == 4 and [c.moe_layer(i) for i in range(2)] == [False, True]


def test_training_loss_adds_the_router_losses():
    from qkv.models.trunk import token_cross_entropy

    c = ModelConfig(vocab_size=40, d_model=16,
                    attention=dict(num_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                    position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False),
                    normalization=dict(kind="rmsnorm"), num_layers=2,
                    moe=dict(num_experts=4, d_expert=8, aux_loss_coef=0.01,
                                                              z_loss_coef=0.001))
    model = GPT(c).train()
    ids = torch.randint(0, 40, (2, 6))
    targets = ids.clone()
    targets[0, :2] = -100  # ignored tokens count in neither loss
    out = model(ids, targets=targets)
    logits = torch.cat(out.router_logits)
    mask = (targets != -100).reshape(-1).repeat(2)
    want = (token_cross_entropy(out.logits, targets) + 0.01 * load_balancing_loss(logits, 2, mask)
            + 0.001 * router_z_loss(logits, mask))
    torch.testing.assert_close(out.loss, want)
    out.loss.backward()
    model.eval()  # evaluation: cross-entropy alone
    with torch.no_grad():
        out = model(ids, targets=targets)
    torch.testing.assert_close(out.loss, token_cross_entropy(out.logits, targets))


def test_the_model_output_carries_each_moe_layers_router_logits_where_asked():
    c = ModelConfig(vocab_size=40, d_model=16,
                    attention=dict(num_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                    position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False),
                    normalization=dict(kind="rmsnorm"), num_layers=3,
                    moe=dict(num_experts=4, d_expert=8, layers=["dense", "moe", "moe"]))
    model, ids = GPT(c).eval(), torch.randint(0, 40, (2, 5))
    plain, routed = model(ids), model(ids, return_router_logits=True)
    assert plain.router_logits is None and len(routed.router_logits) == 2
    assert all(r.shape == (10, 4) for r in routed.router_logits)
    torch.testing.assert_close(routed.logits, plain.logits)
    assert not any(hasattr(m, "router_logits") for m in model.modules())


def test_speed_layer_gathers_inside_torch_compile_only(monkeypatch):
    """qkv.kernels.accelerate swaps a MoE layer's class: at inference inside torch.compile it runs gathered_dispatch
    (static shapes), outside it the layer's own; the answer is the reference's either way, and restore gives the
    class back."""
    from qkv.kernels import accelerated
    from qkv.kernels import moe as kernel_moe

    m = moe(8, 2, shared=True, gate=True, bias=True).eval()
    used = []
    monkeypatch.setattr(kernel_moe, "gathered_dispatch", lambda *a: used.append(1) or gathered_dispatch(*a))
    x = torch.randn(2, 3, 8)
    with torch.no_grad(), accelerated(m):
        assert type(m) is kernel_moe.DecodeMixtureOfExperts
        for compiling in (False, True):
            monkeypatch.setattr(torch.compiler, "is_compiling", lambda c=compiling: c)
            used[:] = []
            torch.testing.assert_close(m(x), m.reference_forward(x), atol=1e-6, rtol=1e-6)
            assert bool(used) == compiling
    assert type(m) is MixtureOfExperts
