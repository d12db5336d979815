"""qkv.kernels.accelerate: the speed layer applied on top of a model, and everything that must not notice it
(the answer, the state dict, safetensors, .to(), deepcopy, hooks, LoRA, training) — and the reference model
left untouched by generate."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qkv
from qkv.kernels import accelerate, accelerated, restore
from qkv.kernels import linear as lin
from qkv.kernels.linear import KernelLinear


def tiny(**kw) -> qkv.GPT:
    torch.manual_seed(0)
    return qkv.GPT(qkv.ModelConfig.preset("tiny", **kw)).eval()


def kinds(model) -> set[type]:
    return {type(m) for m in model.modules() if isinstance(m, nn.Linear)}


def test_the_reference_model_holds_plain_linears_and_accelerate_swaps_them_in_place():
    model = tiny()
    assert kinds(model) == {nn.Linear}
    params = list(model.parameters())
    assert accelerate(model) is model
    assert kinds(model) == {KernelLinear}
    assert list(model.parameters()) == params  # the same objects: an optimiser keeps them
    assert kinds(restore(model)) == {nn.Linear}


def test_accelerated_gives_the_reference_answer_and_restores_after(monkeypatch):
    monkeypatch.setattr(lin, "ONEDNN_MIN_WEIGHT", 0)  # tiny weights take oneDNN too, where the build has it
    model, ids = tiny(), torch.randint(0, 64, (3, 9))
    with torch.no_grad():
        want = model(ids).logits
        with accelerated(model) as fast:
            assert kinds(fast) == {KernelLinear}
            got = fast(ids).logits
    assert kinds(model) == {nn.Linear}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_accelerated_restores_on_an_error():
    model = tiny()
    with pytest.raises(RuntimeError, match="inside"):
        with accelerated(model):
            raise RuntimeError("inside")
    assert kinds(model) == {nn.Linear}


def test_generate_leaves_the_model_as_it_was():
    model = tiny()
    model.generate(torch.zeros(1, 3, dtype=torch.long), 4, temperature=0)
    assert kinds(model) == {nn.Linear}


def test_hooked_or_subclassed_linears_keep_their_own_forward():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = tiny()
    seen = []
    model.blocks[0].attn.q_proj.register_forward_hook(lambda mod, args, out: seen.append(out))
    model.blocks[1].ff.up_proj.__class__ = Scaled
    with accelerated(model), torch.no_grad():
        assert type(model.blocks[0].attn.q_proj) is nn.Linear and type(model.blocks[1].ff.up_proj) is Scaled
        model(torch.zeros(1, 3, dtype=torch.long))
    assert len(seen) == 1


def test_state_dict_safetensors_to_and_deepcopy_see_nothing(tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    accelerate(model)
    state = model.state_dict()
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)
    save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, tmp_path / "m.safetensors")
    fresh = tiny()
    fresh.load_state_dict(load_file(tmp_path / "m.safetensors") | {"lm_head.weight": state["lm_head.weight"]})
    twin = copy.deepcopy(model).to(torch.float64)
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(twin(ids).logits, fresh(ids).logits.double(), rtol=1e-5, atol=1e-5)


def test_an_accelerated_model_trains_as_the_reference_does():
    """Under autograd every product is F.linear's: the same loss and the same gradients."""
    ref, fast = tiny(), accelerate(tiny())
    ids = torch.randint(0, 64, (2, 8))
    for m in (ref, fast):
        m.train()
        m(ids, targets=ids).loss.backward()
    for (name, a), b in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_lora_wraps_an_accelerated_linear():
    pytest.importorskip("peft", reason="the lora extra: pip install -e '.[lora]'")
    from qkv.training.finetune import add_lora, merge_lora

    model = accelerate(tiny())
    add_lora(model, r=2, alpha=4.0, targets="q_proj,v_proj")
    model.train()
    ids = torch.randint(0, 64, (2, 8))
    model(ids, targets=ids).loss.backward()
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    merged = merge_lora(model)
    assert all(type(m) in (nn.Linear, KernelLinear) for m in merged.modules() if isinstance(m, nn.Linear))


def test_a_kernel_linear_is_f_linear_outside_inference():
    layer = KernelLinear(5, 7)
    x = torch.randn(3, 5, requires_grad=True)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
