"""qkv.kernels.training: attention in training computed as the reference computes it — q, k, v in one product, the
core in fp32 under a CPU's bf16 autocast — checked against MultiHeadAttention's own forward (loss and every
gradient, fp32 and bf16), on every variant the models build, and on everything it must refuse."""
import copy

import pytest
import torch
from torch import nn

import qkv
from qkv.kernels import accelerate_training, accelerated, restore
from qkv.kernels import training as tr
from qkv.kernels.training import TrainingAttention
from qkv.models import ModelConfig
from qkv.training.recipe import TrainConfig, train

VARIANTS = {  # ModelConfig.preset("tiny", **kw): what the model families build
    "GPT-2 (biases, learned positions)": dict(attention=dict(q_bias=True, k_bias=True, v_bias=True, out_bias=True),
                                              position=dict(kind="learned"), feed_forward=dict(bias=True)),
    "LLaMA (RoPE, grouped-query heads)": dict(attention=dict(num_kv_heads=2), position=dict(kind="rope"),
                                              normalization=dict(kind="rmsnorm")),
    "Qwen2 (q/k/v biases only)": dict(position=dict(kind="rope"),
                                      attention=dict(num_heads=4, num_kv_heads=2, q_bias=True, k_bias=True,
                                                     v_bias=True, out_bias=False)),
    "Qwen3 (QK-norm)": dict(position=dict(kind="rope"), normalization=dict(kind="rmsnorm"),
                            attention=dict(num_heads=4, head_dim=8, qk_norm=True)),
}


def gpt(**kw) -> qkv.GPT:
    torch.manual_seed(0)
    return qkv.GPT(ModelConfig.preset("tiny", **kw)).train()


def loss_and_grads(model: nn.Module, ids: torch.Tensor, bf16: bool = False) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(ids[:, :-1], targets=ids[:, 1:]).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def attention_kinds(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules() if isinstance(m, qkv.MultiHeadAttention)}


def test_accelerate_training_swaps_attention_in_place_and_restore_undoes_it():
    model = gpt()
    params, keys = list(model.parameters()), list(model.state_dict())
    assert accelerate_training(model) is model and attention_kinds(model) == {TrainingAttention}
    assert list(model.parameters()) == params and list(model.state_dict()) == keys  # same objects, same names
    assert attention_kinds(restore(model)) == {qkv.MultiHeadAttention}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_training_path_gives_the_reference_loss_and_gradients(variant):
    ref = gpt(**VARIANTS[variant])
    fast = accelerate_training(copy.deepcopy(ref))
    ids = torch.randint(0, 64, (3, 17))
    (want, want_g), (got, got_g) = loss_and_grads(ref, ids), loss_and_grads(fast, ids)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for name in want_g:
        torch.testing.assert_close(got_g[name], want_g[name], rtol=1e-5, atol=1e-6, msg=name)


def attention_errors(attn: nn.Module, x: torch.Tensor, want: torch.Tensor, want_g: list) -> list[float]:
    """The bf16 autocast output's and gradients' distances from the fp32 ones (``want``, ``want_g``)."""
    attn.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(x, is_causal=True)
    out.float().backward(torch.ones_like(want))
    got = [out.float(), x.grad, *(p.grad for p in attn.parameters())]
    return [(g - w).norm().item() for g, w in zip(got, [want, *want_g])]


def test_under_bf16_autocast_the_core_runs_in_fp32_no_further_from_fp32_than_the_reference():
    torch.manual_seed(0)
    ref = qkv.MultiHeadAttention(96, 4, rope=qkv.RotaryEmbedding(24)).train()
    fast = accelerate_training(copy.deepcopy(ref))
    x = torch.randn(4, 64, 96, requires_grad=True)
    want = ref(x, is_causal=True)  # fp32: the answer both approximate
    want.backward(torch.ones_like(want))
    want_g = [x.grad, *(p.grad.clone() for p in ref.parameters())]
    ref_err, fast_err = attention_errors(ref, x, want, want_g), attention_errors(fast, x, want, want_g)
    for r, f in zip(ref_err, fast_err):  # output, input's gradient, each weight's: bf16 rounding, no more
        assert 0 < f <= 1.1 * r, (ref_err, fast_err)


def test_a_gpt_under_bf16_autocast_takes_the_fp32_core_in_every_layer(monkeypatch):
    ref = gpt(position=dict(kind="rope"))
    fast = accelerate_training(copy.deepcopy(ref))
    ids, cores, real = torch.randint(0, 64, (4, 33)), [], tr.fp32_core
    monkeypatch.setattr(tr, "fp32_core", lambda q, k: cores.append(real(q, k)) or cores[-1])
    (want, _), (got, _) = loss_and_grads(ref, ids, bf16=True), loss_and_grads(fast, ids, bf16=True)
    assert cores == [True, True]  # one per layer
    torch.testing.assert_close(got, want, rtol=0, atol=1e-2)


@pytest.mark.parametrize("shape, autocast, want", [
    ((2, 4, 128, 24), True, True), ((2, 4, 256, 64), True, True),
    ((2, 4, 128, 24), False, False),  # no autocast: the reference's own dtype
    ((2, 4, 128, 128), True, False),  # wide heads: bf16's kernel is as fast
    ((2, 4, 512, 64), True, False),  # long keys: likewise
])
def test_the_fp32_core_is_taken_only_where_it_was_measured_faster(shape, autocast, want):
    q = torch.zeros(shape, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        assert tr.fp32_core(q, q) is want
    assert not tr.fp32_core(q.float(), q.float())  # fp32 q, k: nothing to do


class Adapted(nn.Linear):
    """A projection that is not a plain nn.Linear (as a LoRA layer is)."""

    def forward(self, x):
        return super().forward(x) * 2


def test_projections_it_cannot_pack_are_the_references_three_products():
    model = gpt(attention=dict(q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                feed_forward=dict(bias=False))
    attn = model.blocks[0].attn
    attn.q_proj = Adapted(32, 32, bias=False)
    model.blocks[1].attn.k_proj.register_forward_hook(lambda m, i, o: o + 1)
    ids = torch.randint(0, 64, (2, 9))
    want, _ = loss_and_grads(model, ids)
    with accelerated(model, training=True):
        assert not tr.packable(attn) and not tr.packable(model.blocks[1].attn)
        got, _ = loss_and_grads(model, ids)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    mixed = qkv.MultiHeadAttention(32, 4, bias=(True, False, True, True))
    assert not tr.packable(mixed)  # a bias on q and v but not on k: three products


def test_a_module_with_hooks_is_not_swapped_and_cached_decoding_answers_as_the_reference():
    model = gpt(position=dict(kind="rope")).eval()
    model.blocks[0].attn.register_forward_pre_hook(lambda m, args: None)
    prompt = torch.randint(0, 64, (1, 5))
    want = model.generate(prompt, 6, temperature=0)
    with accelerated(model, training=True):
        assert type(model.blocks[0].attn) is qkv.MultiHeadAttention
        assert type(model.blocks[1].attn) is TrainingAttention
        torch.testing.assert_close(model.generate(prompt, 6, temperature=0, backend="eager"), want)


def test_cross_attention_and_padding_masks_answer_as_the_reference():
    torch.manual_seed(0)
    ref = qkv.Transformer(ModelConfig.preset("tiny", normalization=dict(first=True))).train()
    fast = accelerate_training(copy.deepcopy(ref))
    src, tgt = torch.randint(1, 64, (2, 7)), torch.randint(1, 64, (2, 6))
    src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    losses = [m(src, tgt[:, :-1], src_mask=src_mask, targets=tgt[:, 1:]).loss for m in (ref, fast)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)


def test_qkv_train_applies_it_says_so_and_gives_the_models_classes_back(tmp_path):
    common = dict(max_steps=3, batch_size=4, context=32, eval_interval=100, final_eval=False, progress=False,
                  model=ModelConfig.preset("tiny", max_len=32), tokenizer="char", threads=1)
    fast, ref = train(TrainConfig(**common)), train(TrainConfig(speed_layer=False, **common))
    assert fast.summary["speed_layer"] is True and ref.summary["speed_layer"] is False
    assert attention_kinds(fast.model) == {qkv.MultiHeadAttention}  # restored after the loop
    assert fast.summary["train_loss"] == pytest.approx(ref.summary["train_loss"], rel=1e-5)
