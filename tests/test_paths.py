"""qkv.generation.paths: one entry per fast path, each giving the reason its own check gives (the predicates the
paths' modules define), and the backend choice built on them."""
import pytest
import torch

import qkv
from qkv.generation import backends, cuda_graph, paged, paths
from qkv.generation.plan import plan_serving
from qkv.kernels import fused_step, linear, moe, moe_training, quant
from qkv.kernels.moe_training import TrainingMixtureOfExperts
from qkv.nn.moe import MixtureOfExperts, Router, SwiGLUExperts


def tiny(positional="rope", **change):
    torch.manual_seed(0)
    return qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=40, max_len=32, position=dict(kind=positional)).replace(**change)).eval()


def moe_layer(**experts) -> MixtureOfExperts:
    torch.manual_seed(0)
    return MixtureOfExperts(Router(16, 4, 2), SwiGLUExperts(4, 16, 8, **experts))


def test_every_path_is_one_entry_that_says_what_it_accepts():
    assert set(paths.PATHS) == {"fused", "inductor", "cudagraph", "moe_kernel", "grouped_mm", "int8", "paged",
                                "packed"}
    assert all(p.name == name and p.accepts for name, p in paths.PATHS.items())
    with pytest.raises(ValueError, match=r"path must be one of \('fused'.*got 'flash'"):
        paths.refuses("flash", tiny())


@pytest.mark.parametrize("batch", [1, fused_step.MAX_ROWS + 1])
def test_the_fused_entry_gives_the_fused_steps_reason(batch):
    for model in (tiny(), tiny(positional="alibi"), qkv.Encoder(qkv.ModelConfig.preset("tiny", vocab_size=40))):
        assert paths.refuses("fused", model, batch=batch) == fused_step.refuses(model, batch)
    assert paths.refuses("fused", tiny(positional="alibi")).startswith("config field position.kind='alibi'")


def test_the_cuda_graph_entry_gives_the_device_then_the_model_reason(monkeypatch):
    model = tiny()
    assert paths.refuses("cudagraph", model) == cuda_graph.refuses_device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(paths, "model_device", lambda model: torch.device("cuda:0"))
    assert paths.refuses("cudagraph", model) is None and paths.refuses("inductor", model) is None
    layer = moe_layer()
    model.blocks[0].ff = layer
    assert paths.refuses("cudagraph", model) == cuda_graph.refuses_model(model) == (
        "its mixture-of-experts layers count each expert's tokens on the host")


def test_the_moe_entries_give_their_layers_reasons():
    layer, x = moe_layer(), torch.randn(1, 3, 16)
    with torch.no_grad():
        assert paths.refuses("moe_kernel", layer, x=x) == moe.refuses(layer.experts, x.reshape(3, 16))
        assert paths.refuses("grouped_mm", layer, x=x) == moe_training.refuses(layer, x) == (
            "autograd is not recording (the layer's own grouped dispatch serves inference)")
    assert paths.refuses("moe_kernel", layer, x=torch.randn(1, 3, 16, dtype=torch.float64)) == (
        "it runs fp32 tokens on a CPU, got torch.float64 on cpu")
    biased = moe_layer(bias=True)
    assert paths.refuses("grouped_mm", biased, x=x) in ("biased experts", "this torch has no _grouped_mm")
    reference = moe_layer()
    reference.dispatch = "reference"
    assert paths.refuses("grouped_mm", reference, x=x) == "the layer asks for the reference dispatch"


def test_the_grouped_mm_entry_is_the_check_the_training_layer_records():
    layer, x = moe_layer(), torch.randn(2, 3, 16)
    layer.__class__ = TrainingMixtureOfExperts
    layer.train()
    layer(x)
    assert layer.grouped_mm_fallback == paths.refuses("grouped_mm", layer, x=x)


def test_the_int8_entry_says_why_a_model_cannot_be_quantised():
    model = tiny()
    assert paths.refuses("int8", model) in (None, "torchao is not installed (pip install 'qkv[quant]')")
    assert paths.refuses("int8", torch.nn.Sequential(torch.nn.ReLU())) == (
        "Sequential has no linear layer to quantise (the output head is kept)")
    if paths.refuses("int8", model) is None:
        quant.quantize_weights(model, "int8")
        assert paths.refuses("int8", model).startswith("the model is already quantised (")


def test_the_backend_choice_falls_back_with_the_registrys_reason():
    model = tiny(positional="alibi")
    why = paths.refuses("fused", model, batch=2)
    assert backends.backend_for(model, 2, "fused") == ("auto", f"the fused step cannot decode this model at batch 2: "
                                                               f"{why}")
    with pytest.raises(ValueError, match="compile='fused' cannot decode this model at batch 2: config field"):
        backends.backend_for(model, 2, "fused", strict=True)
    assert backends.backend_for(model, 1, "cudagraph") == (
        "auto", f"the CUDA-graph step cannot decode this model: {paths.refuses('cudagraph', model)}")
    with pytest.raises(ValueError, match="backend 'cudagraph' cannot decode this model: the model is on the CPU"):
        backends.backend_for(model, 1, "cudagraph", strict=True)
    assert backends.backend_for(model, 1, "eager") == ("eager", None)
    assert backends.backend_for(model, 1, "inductor") == ("inductor", None)


def test_training_asks_once_which_mixture_of_experts_layers_keep_their_own_dispatch():
    model = tiny(moe=dict(num_experts=4, top_k=2, d_expert=8))
    assert paths.grouped_mm_refusals(tiny()) == {}
    if not hasattr(torch, "_grouped_mm"):
        return
    assert paths.grouped_mm_refusals(model) == {}
    model.blocks[1].ff.dispatch = "reference"
    assert paths.grouped_mm_refusals(model) == {"blocks.1.ff": "the layer asks for the reference dispatch"}


def test_training_says_in_one_line_which_layers_keep_their_own_dispatch_and_why():
    from qkv.training.loop import expert_products_line

    model = tiny(moe=dict(num_experts=4, top_k=2, d_expert=8))
    assert expert_products_line(tiny()) is None
    if not hasattr(torch, "_grouped_mm"):
        return
    assert expert_products_line(model) is None
    said = "qkv: mixture-of-experts layers train through their own dispatch, not the speed layer's grouped products: "
    assert expert_products_line(model, compiled=True) == (
        f"{said}blocks.0.ff, blocks.1.ff (inside torch.compile (whose fake _grouped_mm on a CPU takes bf16 only))")
    model.blocks[1].ff.dispatch = "reference"
    assert expert_products_line(model) == f"{said}blocks.1.ff (the layer asks for the reference dispatch)"
    model.blocks[0].ff.experts.gate_bias = torch.nn.Parameter(torch.zeros(4, 8))
    assert expert_products_line(model) == (f"{said}blocks.0.ff (biased experts); blocks.1.ff (the layer asks for the "
                                           "reference dispatch)")


def test_the_paged_entry_is_the_servers_one_question():
    for model in (tiny(), tiny(positional="alibi")):
        assert paths.refuses("paged", model) == paged.refuses(model)
    assert paths.refuses("paged", tiny()) is None
    with pytest.raises(ValueError, match="position.kind alibi is a bias over shared key places: not served"):
        plan_serving(tiny(positional="alibi"), max_batch=1, max_model_len=32)



def test_the_servers_plan_says_whether_its_linears_read_blocked_weights_and_why_not():
    small, large = tiny(), tiny(d_model=512)  # the tiny preset's linears: under ONEDNN_MIN_WEIGHT
    for model, backend in ((small, "auto"), (large, "auto"), (large, "eager")):
        plan = plan_serving(model, backend=backend, max_batch=4, max_model_len=32)
        assert plan.weights and f"; {plan.weights}; a paged cache" in str(plan)
    assert plan.weights == "weights as they are (eager)"
    assert plan_serving(small, max_batch=4, max_model_len=32).weights == (
        f"weights as they are: {paths.refuses('packed', small)}")
    with qkv.kernels.accelerated(large):
        packs = any(linear.packable(m) for m in large.modules())
    assert (paths.refuses("packed", large) is None) == packs
    if packs:
        assert plan_serving(large, max_batch=4, max_model_len=32).weights == (
            "large linears' weights also in oneDNN's blocked layout for 4 rows")
    assert paths.refuses("packed", small).startswith("no linear it packs") or not linear.ONEDNN
