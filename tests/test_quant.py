"""qkv.kernels.quant: weight-only int8 through torchao — what is quantised (torchao's Int8Tensor in the blocks'
linears, the output head and the embedding kept), how close its logits stay to fp32's, every decode backend's
tokens equal to eager's on the int8 model (a fast path that cannot read torchao's tensors falls back, saying
why), the errors, and `qkv sample / chat / serve --weights`."""
import copy
import importlib
import re
import warnings

import pytest
import torch
from torch import nn

import qkv
from qkv.generation.backends import BackendFallback
from qkv.kernels import accelerated, quantize_weights
from qkv.kernels import linear as lin
from qkv.kernels.linear import KernelLinear
from qkv.kernels.quant import describe, quantized, targets

torchao = pytest.importorskip("torchao", reason="the quant extra: pip install -e '.[quant]'")
from torchao.quantization import Int8Tensor  # noqa: E402


def tiny(scale: float = 1.0, **kw) -> qkv.GPT:
    """A random tiny GPT; ``scale`` multiplies its matrices, so that greedy decoding varies (a fresh one repeats)."""
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", **kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return model


def test_the_blocks_linears_become_torchaos_int8_tensors_and_the_head_and_embedding_are_kept():
    model = tiny()
    names = set(targets(model))
    assert quantize_weights(model, "int8") is model  # in place, as torchao's quantize_
    assert names == {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"}
    for name, m in model.named_modules():
        if name in names:
            assert type(m) is nn.Linear and type(m.weight) is Int8Tensor  # the module's class is the reference's
            assert m.weight.qdata.dtype == torch.int8 and m.weight.qdata.shape == m.weight.shape
    assert type(model.lm_head.weight) is nn.Parameter and model.lm_head.weight is model.embed.tok.weight  # still tied
    assert set(quantized(model)) == {f"{n}.weight" for n in names}
    assert re.fullmatch(r"weights: 12 linear weights to int8 by torchao \(Int8Tensor, [\d,]+ parameters\); [\d,]+ "
                        r"parameters kept in float32, the output head among them", describe(model)), describe(model)


def test_int8_logits_stay_close_to_fp32_and_the_float_model_copied_is_untouched():
    """Per-row absmax int8 rounds each weight by at most 1/254 of its row's largest: the logits move by well under
    2% of the largest logit (a per-tensor or 4-bit scale would not stay inside)."""
    model, ids = tiny(d_model=64, attention=dict(num_heads=4)), torch.randint(0, 64, (2, 16))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantize_weights(copy.deepcopy(model), "int8")
    with torch.no_grad():
        want, got = model(ids).logits, q(ids).logits
    gap = (got - want).abs().max() / want.abs().max()
    assert 0 < gap < 0.02, gap
    assert not quantized(model) and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("backend", ["auto", "inductor", "fused"])
def test_every_backend_decodes_the_eager_int8_tokens(backend, batch, monkeypatch):
    monkeypatch.setattr(importlib.import_module("qkv.generation.backends"), "COMPILE_BACKEND", "eager")
    model = quantize_weights(tiny(scale=20.0, position=dict(kind="rope")))
    ids = torch.randint(0, 64, (batch, 6), generator=torch.Generator().manual_seed(1))
    want = model.generate(ids, 16, temperature=0, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallback)  # fused reads the int8 weights itself: no fallback
        got = model.generate(ids, 16, temperature=0, backend=backend)
    assert torch.equal(got, want) and len(set(want[0, 6:].tolist())) > 3  # tokens that vary


def test_head_true_quantises_the_output_head_too_and_leaves_the_tied_embedding_as_it_was():
    model = tiny(scale=20.0, position=dict(kind="rope"))
    table = model.embed.tok.weight.detach().clone()
    quantize_weights(model, "int8", head=True)
    assert type(model.lm_head.weight) is Int8Tensor and "lm_head.weight" in quantized(model)
    assert type(model.embed.tok.weight) is nn.Parameter and torch.equal(model.embed.tok.weight, table)  # untied
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    want = model.generate(ids, 16, temperature=0, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallback)  # fused reads the int8 head itself: no fallback
        got = model.generate(ids, 16, temperature=0, backend="fused")
    assert torch.equal(got, want) and len(set(want[0, 6:].tolist())) > 3


def test_the_servers_scheduler_decodes_the_eager_int8_tokens():
    """`qkv serve`'s batch, its rows at different lengths, on the int8 model: each answer is generate's eager one."""
    pytest.importorskip("fastapi", reason="the serve extra: pip install -e '.[serve]'")
    import threading

    from qkv.kernels import build
    from qkv.serve.scheduler import Request, Scheduler, Settings

    build.available()  # qkv's C++ kernels loaded (or found missing) before the clock below starts
    model = quantize_weights(tiny(scale=20.0, position=dict(kind="rope")))
    prompts = [torch.randint(0, 64, (n,)).tolist() for n in (3, 9, 5)]
    want = [model.generate(torch.tensor([p]), 10, temperature=0, backend="eager")[0, len(p):].tolist()
            for p in prompts]
    batcher, done = Scheduler(model, max_batch=2, max_queue=4, backend="auto").start(), threading.Semaphore(0)
    jobs = [Request(p, Settings(max_tokens=10, temperature=0), str, lambda t, f: f and done.release())
            for p in prompts]
    for job in jobs:
        batcher.submit(job)
    assert all(done.acquire(timeout=30) for _ in jobs)
    batcher.stop()
    assert [j.tokens for j in jobs] == want


def test_the_speed_layer_leaves_quantised_linears_to_torchao():
    """accelerate swaps the plain linears only; KernelLinear's product hands a quantised weight to F.linear."""
    model = quantize_weights(tiny())
    with accelerated(model):
        kinds = {name: type(m) for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert kinds.pop("lm_head") is KernelLinear and set(kinds.values()) == {nn.Linear}
    w, x = model.blocks[0].ff.up_proj.weight, torch.randn(1, 32)
    with torch.no_grad():
        assert torch.equal(lin.linear(x, w), torch.nn.functional.linear(x, w))


def test_bad_kind_and_an_already_quantised_model_are_refused():
    model = tiny()
    with pytest.raises(ValueError, match=r"must be one of \('none', 'int8'\), got 'int4'"):
        quantize_weights(model, "int4")
    assert quantize_weights(model, "none") is model and not quantized(model)
    quantize_weights(model, "int8")
    with pytest.raises(ValueError, match=r"already quantised \(blocks\.0\.attn\.q_proj\.weight: Int8Tensor, 12 such"):
        quantize_weights(model, "int8")


# --- the command ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    from qkv.cli import main

    out = tmp_path_factory.mktemp("runs") / "r"
    assert main(["train", "--preset", "tiny", "--context", "32", "--batch-size", "4", "--quiet", "--device", "cpu",
                 "--data", str(data), "--max-steps", "2", "--out", str(out), "--sample-tokens", "0"]) == 0
    return out


def test_qkv_sample_weights_int8_says_what_it_quantised(run, capsys):
    from qkv.cli import main

    argv = ["sample", "--run", str(run), "--prompt", "def f", "--max-new-tokens", "8", "--temperature", "0"]
    assert main([*argv, "--weights", "int8"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("def f") and len(out.rstrip("\n")) > len("def f")
    lines = err.strip().splitlines()
    assert lines[0].startswith("qkv: weights: 12 linear weights to int8 by torchao"), err
    assert lines[-1].startswith("qkv: decoded with the fused backend"), err


@pytest.mark.parametrize("command", ["sample", "chat", "serve"])
def test_weights_is_one_flag_of_sample_chat_and_serve_and_a_bad_value_exits_2(command, run, capsys):
    from qkv.cli import build_parser, main

    extra = ["--prompt", "x"] if command == "sample" else []
    assert build_parser().parse_args([command, "--run", str(run), *extra]).weights == "none"
    assert build_parser().parse_args([command, "--run", str(run), *extra, "--weights", "int8"]).weights == "int8"
    assert main([command, "--run", str(run), *extra, "--weights", "int4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"--weights: invalid choice: 'int4' \(choose from '?none'?, '?int8'?\)",
                                       err[0]), err
