"""qkv.training.muon: torch.optim.Muon's updates, its Newton–Schulz precision following the machine."""
import copy

import pytest
import torch

from qkv import runtime
from qkv.training import muon as muon_module
from qkv.training.muon import Muon, newton_schulz, ns_dtype_for


def weights(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((24, 8), (8, 24), (16, 16))]


def steps(opt, params, n: int = 3, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def torch_muon(params, **kw):
    return torch.optim.Muon(params, adjust_lr_fn="match_rms_adamw", **kw)


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon came in torch 2.9; this torch is older")
def test_bf16_updates_are_torch_muons_and_fp32_agrees_to_bf16_precision():
    ref, ours16, ours32 = weights(), weights(), weights()
    steps(torch_muon(ref, lr=0.02, weight_decay=0.1), ref)
    steps(Muon(ours16, lr=0.02, weight_decay=0.1, ns_dtype=torch.bfloat16), ours16)
    steps(Muon(ours32, lr=0.02, weight_decay=0.1, ns_dtype=torch.float32), ours32)
    start = weights()
    for r, a, b, w in zip(ref, ours16, ours32, start, strict=True):
        torch.testing.assert_close(a, r, rtol=0, atol=0)  # the same products in the same order
        moved = (r - w).abs().max()
        assert (b - r).abs().max() <= 0.02 * moved  # fp32 vs bf16: within bf16's ~2^-8 per product, summed
        assert not torch.equal(b, r)  # the precision did change


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon came in torch 2.9; this torch is older")
def test_state_dict_loads_torchs_and_momentum_matches():
    ref, ours = weights(), weights()
    opt_ref, opt = torch_muon(ref, lr=0.02), Muon(ours, lr=0.02, ns_dtype=torch.bfloat16)
    steps(opt_ref, ref)
    opt.load_state_dict(copy.deepcopy(opt_ref.state_dict()))  # a run saved with torch's Muon resumes with this one
    # (a copy, as from a file: load_state_dict would otherwise share the momentum tensors)
    for p, q in zip(ours, ref, strict=True):
        p.data.copy_(q.data)
    steps(opt_ref, ref, seed=2), steps(opt, ours, seed=2)
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("native", [True, False])
def test_the_newton_schulz_dtype_follows_native_bf16(monkeypatch, native):
    monkeypatch.setattr(runtime, "native_bf16", lambda device="auto": native)
    expected = torch.bfloat16 if native else torch.float32
    assert ns_dtype_for("cpu") == expected
    params = weights()
    opt = Muon(params, lr=0.02)
    assert opt.ns_dtype == expected
    seen = []
    real = muon_module.newton_schulz
    monkeypatch.setattr(muon_module, "newton_schulz", lambda g, **kw: seen.append(kw["dtype"]) or real(g, **kw))
    steps(opt, params, n=1)
    assert seen == [expected] * 3


def test_newton_schulz_orthogonalises():
    g = torch.randn(32, 12, dtype=torch.float64)
    o = newton_schulz(g, dtype=torch.float64)
    s = torch.linalg.svdvals(o)
    assert o.shape == g.shape and s.min() > 0.5 and s.max() < 1.5  # the quintic's band, not exactly 1
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    assert torch.nn.functional.cosine_similarity(o.flatten(), (u @ vh).flatten(), dim=0) > 0.95


def test_a_stack_of_matrices_steps_as_each_matrix_alone():
    """Experts (E, m, n): each matrix's update is the one Muon gives that matrix on its own (norm, orthogonal
    factor and √max(m, n) scale per matrix), in fp32 and bf16."""
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        stack = [torch.nn.Parameter(torch.randn(3, 24, 8, generator=torch.Generator().manual_seed(0)))]
        alone = [torch.nn.Parameter(m.detach().clone()) for m in stack[0]]
        g = torch.Generator().manual_seed(1)
        grads = torch.randn(2, 3, 24, 8, generator=g)
        for params, grad_of in ((stack, lambda t: [grads[t]]), (alone, lambda t: list(grads[t]))):
            opt = Muon(params, lr=0.02, weight_decay=0.1, ns_dtype=dtype)
            for t in range(2):
                for p, grad in zip(params, grad_of(t), strict=True):
                    p.grad = grad.clone()
                opt.step()
        torch.testing.assert_close(stack[0].detach(), torch.stack([m.detach() for m in alone]), rtol=tol, atol=tol)
        assert not torch.allclose(stack[0], torch.randn(3, 24, 8, generator=torch.Generator().manual_seed(0)))


def test_bad_input():
    with pytest.raises(ValueError, match=r"stacks of them \(E, m, n\) only, got parameters of shape \[\(4,\)\]"):
        Muon([torch.nn.Parameter(torch.zeros(4))])
    with pytest.raises(ValueError, match="lr must be >= 0, got -1"):
        Muon(weights(), lr=-1)
