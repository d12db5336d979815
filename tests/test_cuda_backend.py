"""The "cudagraph" decode backend (qkv.generation.cuda_graph) on a CPU: where it is chosen (a GPU mocked), why a
CPU model falls back, and its static-buffer step without the graph giving eager's tokens. The recording itself
needs a GPU: benchmarks/gpu.py's decode section runs it."""
import warnings

import pytest
import torch

import qkv
from qkv.generation import BackendFallback, backends, cuda_graph, paths
from qkv.generation.backends import backend_for, choose, last_logits


def tiny() -> qkv.GPT:
    torch.manual_seed(0)
    return qkv.GPT(qkv.ModelConfig.preset("tiny", attention=dict(num_kv_heads=2), position=dict(kind="rope"))).eval()


@pytest.fixture
def on_a_gpu(monkeypatch):
    """The decisions see a machine with a GPU and the model on it (its weights stay on the CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(paths, "model_device", lambda model: torch.device("cuda:0"))


def test_refuses_names_the_device():
    assert cuda_graph.refuses_device("cpu") == "the model is on the CPU; CUDA graphs need a CUDA device"
    assert cuda_graph.refuses_device(torch.device("meta")).startswith("the model is on the meta;")


def test_refuses_cuda_only_where_the_machine_has_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_graph.refuses_device("cuda:0") == "CUDA is not available on this machine"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_graph.refuses_device("cuda:0") is None and cuda_graph.refuses_device("cuda") is None


def test_a_cpu_model_falls_back_to_auto_saying_why():
    model = tiny()
    assert backend_for(model, 1, "auto") == ("fused" if backends.auto_fuses(model, 1) else "auto", None)  # a CPU's auto
    chosen, why = backend_for(model, 1, "cudagraph")
    assert chosen == "auto" and why == ("the CUDA-graph step cannot decode this model: the model is on the CPU; "
                                        "CUDA graphs need a CUDA device")
    with pytest.warns(BackendFallback, match="CUDA graphs need a CUDA device; decoding with the auto backend"):
        assert choose(model, 1, "cudagraph") == "auto"
    with pytest.raises(ValueError, match="backend 'cudagraph' cannot decode this model: the model is on the CPU"):
        backend_for(model, 1, "cudagraph", strict=True)


def test_auto_on_a_gpu_is_the_cuda_graph(on_a_gpu):
    model = tiny()
    assert backend_for(model, 1, "auto") == ("cudagraph", None) and backend_for(model, 4, "cudagraph") == ("cudagraph", None)
    assert backend_for(model, 1, "eager") == ("eager", None) and backend_for(model, 1, "inductor") == ("inductor", None)
    assert choose(model, 1, "auto") == "cudagraph"
    assert choose(model, 1, "auto", use_cache=False) == "auto"  # the graph replays a cached step


def test_a_model_the_recorded_step_cannot_read_stays_on_auto(on_a_gpu, monkeypatch):
    monkeypatch.setattr(paths, "refuses_compiled_step", lambda model: "a position kept in a Python int")
    assert backend_for(tiny(), 1, "auto") == ("auto", None)
    assert backend_for(tiny(), 1, "cudagraph") == ("auto", "the CUDA-graph step cannot decode this model: "
                                                    "a position kept in a Python int")


def test_a_model_that_reads_values_on_the_host_stays_on_auto(on_a_gpu):
    """Length-following RoPE (its θ from max(positions) on the host) and MoE layers (per-expert counts on the
    host): a recording cannot wait for the host, so the step is not recorded."""
    from qkv.nn.moe import MixtureOfExperts, Router, SwiGLUExperts
    from qkv.nn.rope_scaling import RopeScaling

    model = tiny()
    model.blocks[0].attn.rope.scaling = RopeScaling(type="dynamic", factor=2.0, original_max_position_embeddings=16)
    assert backend_for(model, 1, "cudagraph") == ("auto", "the CUDA-graph step cannot decode this model: its RoPE "
                                                   "scaling (dynamic) follows each input's length on the host")
    model = tiny()
    model.blocks[1].moe = MixtureOfExperts(Router(8, 4, 2), SwiGLUExperts(4, 8, 6))  # found wherever it sits
    assert backend_for(model, 1, "auto") == ("auto", None)
    assert "mixture-of-experts layers count each expert's tokens on the host" in backend_for(model, 1, "cudagraph")[1]


def greedy(model, ids, **kwargs):
    return model.generate(ids, 12, temperature=0, **kwargs)


def test_the_static_buffer_step_gives_eagers_tokens(on_a_gpu, monkeypatch):
    """The graph-free step (its own token and slot buffers, the cache's slots and layers) decodes as eager,
    through a window slide (max_len 64) and a left-padded batch."""
    model, made = tiny(), []
    monkeypatch.setattr(cuda_graph, "GraphStep",
                        lambda step, model=None: made.append(cuda_graph.StaticStep(step)) or made[-1])
    ids = torch.randint(0, 64, (2, 58), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :4] = False
    expected = greedy(model, ids, mask=mask, backend="eager")
    assert torch.equal(greedy(model, ids, mask=mask, backend="auto"), expected) and len(made) == 1
    assert made[0].ids.shape == (2, 1) and made[0].pos.shape == (1,)


def test_a_static_step_refuses_other_caches():
    model = tiny()
    step = cuda_graph.StaticStep(last_logits(model))
    caches = [model.new_kv_caches(1, 8) for _ in range(2)]
    slots = torch.ones(1, 8, dtype=torch.bool)
    tok, pos = torch.tensor([[3]]), torch.tensor([0])
    step(tok, slots, caches[0], pos)
    with pytest.raises(ValueError, match="decodes into the caches of its first call"):
        step(tok, slots, caches[1], pos)


def test_a_failed_recording_decodes_eagerly_with_one_warning(on_a_gpu, monkeypatch):
    def no_graph(self):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(cuda_graph.GraphStep, "record", no_graph)
    model, ids = tiny(), torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens = greedy(model, ids, backend="cudagraph")
    assert torch.equal(tokens, greedy(model, ids, backend="eager"))
    messages = [str(w.message) for w in caught if issubclass(w.category, BackendFallback)]
    assert messages == ["the CUDA graph could not record the step (operation not permitted when stream is "
                        "capturing); decoding with its eager steps"]


def test_the_gpu_checks_decode_section_runs_on_a_cpu(monkeypatch):
    """benchmarks.gpu's decode section on a tiny model on a CPU (no code generation: dynamo's eager backend):
    every row runs, each qkv bf16 backend gives eager's tokens, the cudagraph row says why it fell back."""
    pytest.importorskip("torchao", reason="the quant extra: pip install -e '.[quant]'")
    from benchmarks.gpu_decode import decode_rows

    monkeypatch.setattr(backends, "COMPILE_BACKEND", "eager")
    rows = {row[0]: row for row in decode_rows("cpu", tiny=True, tokens=3)}
    assert list(rows)[0].startswith("decode roofline (tiny Llama") and len(rows) == 7
    assert not [row for row in rows.values() if row[1] in ("FAILED", "not run")], rows
    for name in ("eager", "cudagraph", "inductor"):
        assert "tokens = qkv eager" in rows[f"decode: qkv {name}"][3]
    assert "CUDA graphs need a CUDA device; decoding with the auto backend" in rows["decode: qkv cudagraph"][3]
    assert "× HF static" in rows["decode: qkv eager"][3] and "× qkv cudagraph bf16" in rows[
        "decode: qkv int8 weights (default backend)"][3]
