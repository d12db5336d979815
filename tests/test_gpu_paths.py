"""The CUDA paths' decisions, tested on a CPU: gradient sync under accumulation, what a checkpoint copies, the
device a process binds, native bf16, the compile/DDP order, the MoE layer under torch.compile, the grouped-mm
refusal, Gemma's embedding scale, the training memory estimate and SFT's decode backend (issue 57)."""
from unittest import mock

import pytest
import torch
from torch import nn

from qkv.training.loop import train_step


class SyncRecorder(nn.Linear):
    """A model with FSDP2's ``set_requires_gradient_sync`` (and DDP's ``no_sync``), recording the state at each
    backward."""

    def __init__(self) -> None:
        super().__init__(2, 1)
        self.sync, self.seen = True, []

    def set_requires_gradient_sync(self, flag: bool, *, recurse: bool = True) -> None:
        self.sync = flag

    def no_sync(self):
        import contextlib

        @contextlib.contextmanager
        def off():
            before, self.sync = self.sync, False
            yield
            self.sync = before
        return off()


def loss_of(model, micro):
    model.seen.append(model.sync)
    return model(micro).sum()


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_accumulation_reduces_gradients_on_the_last_micro_batch_only(sharding):
    model = SyncRecorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_step(model, opt, [torch.ones(1, 2)] * 3, loss_of, sharding=sharding)
    assert model.seen == [False, False, True]
    assert model.sync  # left on for whatever runs next (evaluation, the next step)


def test_one_process_never_touches_gradient_sync():
    model = SyncRecorder()
    train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), [torch.ones(1, 2)] * 2, loss_of)
    assert model.seen == [True, True]


def test_train_step_refuses_an_unknown_sharding():
    model = SyncRecorder()
    with pytest.raises(ValueError, match="sharding"):
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), [torch.ones(1, 2)], loss_of, sharding="zero")


def test_a_checkpoint_saves_the_live_tensors_without_copying_them():
    """asdict would deep-copy every weight and optimizer moment on the device before torch.save."""
    from types import SimpleNamespace

    from qkv.training.checkpointing import Checkpoints
    from qkv.training.state import TrainState

    weight, moment = torch.ones(3), torch.zeros(3)
    state = TrainState(step=5, model={"w": weight}, optimizer={"state": {0: {"exp_avg": moment}}},
                       running=[1.0, 2])
    saved = {}
    run = SimpleNamespace(save_model=lambda *a, **k: None, save_state=saved.update, discard_sharded=lambda **k: None)
    checkpoints = SimpleNamespace(run=run, cfg=SimpleNamespace(lora=0), dist=SimpleNamespace(is_main=True),
                                  engine=SimpleNamespace(sharding="none", gathered_model=lambda frozen: None),
                                  task=SimpleNamespace(tokenizer=None), last_saved=None,
                                  capture_state=lambda state, batch_gen: state)
    Checkpoints.save(checkpoints, state, None)
    assert saved["model"]["w"] is weight and saved["optimizer"]["state"][0]["exp_avg"] is moment
    assert saved["step"] == 5 and saved["running"] == [1.0, 2] and set(saved) == set(TrainState.__dataclass_fields__)


def gpus(count: int, capability=(9, 0)):
    """torch.cuda as a machine with ``count`` GPUs of ``capability`` shows it (set_device recorded)."""
    return mock.patch.multiple(torch.cuda, is_available=mock.Mock(return_value=True),
                               device_count=mock.Mock(return_value=count), set_device=mock.Mock(),
                               get_device_capability=mock.Mock(return_value=capability),
                               is_bf16_supported=mock.Mock(return_value=True))


def test_a_process_on_cuda_n_makes_it_the_current_device():
    """Streams, graphs and ``torch.cuda`` calls without a device follow the current one, not ``--device``."""
    from qkv.runtime import resolve_device

    with gpus(2):
        assert resolve_device("cuda:1") == torch.device("cuda:1")
        torch.cuda.set_device.assert_called_once_with(torch.device("cuda:1"))
    with gpus(2):
        assert resolve_device("cpu") == torch.device("cpu")
        torch.cuda.set_device.assert_not_called()


def test_each_rank_seeing_one_gpu_takes_it():
    """torchrun with CUDA_VISIBLE_DEVICES set per rank: LOCAL_RANK 1 sees one GPU, its cuda:0."""
    from qkv.runtime import local_gpu, resolve_device

    assert local_gpu(1, 4, "") == 1 and local_gpu(3, 1, "5") == 0 and local_gpu(0, 1, "") == 0
    with pytest.raises(ValueError, match="LOCAL_RANK 3 .* 2 GPU"):
        local_gpu(3, 2, "0,1")
    with pytest.raises(ValueError, match="LOCAL_RANK 1 sees 1 GPU"):  # two processes on one GPU, nothing split
        local_gpu(1, 1, "")
    with gpus(1), mock.patch.dict("os.environ", {"CUDA_VISIBLE_DEVICES": "1"}):
        assert resolve_device("cuda", local_rank=1, local_world=2) == torch.device("cuda:0")


def test_the_process_group_binds_its_gpu_and_waits_for_a_long_save():
    from datetime import timedelta

    from qkv.training.distributed import DIST_TIMEOUT, process_group_options

    cuda = process_group_options(cuda=True, local_rank=1, gpus=2)
    assert cuda == {"backend": "nccl", "device_id": torch.device("cuda:1"), "timeout": DIST_TIMEOUT}
    with mock.patch.dict("os.environ", {"CUDA_VISIBLE_DEVICES": "1"}):
        assert process_group_options(cuda=True, local_rank=1, gpus=1)["device_id"] == torch.device("cuda:0")
    assert process_group_options(cuda=False, local_rank=1, gpus=0) == {"backend": "gloo", "timeout": DIST_TIMEOUT}
    assert DIST_TIMEOUT > timedelta(minutes=10)  # NCCL's default, which a large rank-0 checkpoint write outlasts


@pytest.mark.parametrize("capability, native", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_bf16_is_native_from_compute_capability_8(capability, native):
    """V100 (7.0) and T4 (7.5) report bf16 "supported" (emulated, slow): neither is a native bf16 GPU."""
    from qkv.runtime import native_bf16
    from qkv.training.muon import ns_dtype_for
    from qkv.training.sharding import has_bf16

    with gpus(1, capability):
        assert native_bf16("cuda") is native
        assert has_bf16(torch.device("cuda:0")) is native
        assert ns_dtype_for(torch.device("cuda:0")) == (torch.bfloat16 if native else torch.float32)


@pytest.mark.parametrize("sharding", ["ddp", "none"])
def test_the_compiler_sees_the_ddp_wrapper(sharding):
    """torch.compile over DDP (dynamo's DDPOptimizer splits the graph at DDP's buckets), so that each bucket's
    all-reduce overlaps the rest of the backward; DDP over a compiled model reduces only after the whole backward."""
    from types import SimpleNamespace

    from qkv.training.setup import Engine

    class FakeDDP(nn.Module):
        def __init__(self, module, device_ids=None):
            super().__init__()
            self.module = module

    plain = nn.Linear(2, 2)
    recipe = SimpleNamespace(model=plain, cfg=SimpleNamespace(compile=True), sharding=sharding,
                             device=torch.device("cpu"))
    with mock.patch("torch.nn.parallel.DistributedDataParallel", FakeDDP), \
            mock.patch("torch.compile", side_effect=lambda m, **kw: ("compiled", m)), \
            mock.patch("qkv.training.setup.use_compile_cache"):
        kind, inner = Engine.wrapped(recipe)
    assert kind == "compiled"
    assert (isinstance(inner, FakeDDP) and inner.module is plain) if sharding == "ddp" else inner is plain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gemma_embedding_scale_copies_nothing_to_the_device(dtype):
    """Gemma multiplies by √C rounded to the activations' dtype; a tensor made on the device for it inside a
    recorded CUDA graph step is a host-to-device copy, which fails the capture. The product is unchanged."""
    from qkv.models import ModelConfig
    from qkv.models.trunk import Embeddings

    config = ModelConfig.from_dict({"vocab_size": 50, "d_model": 40, "attention": {"num_heads": 2}, "num_layers": 1,
                                    "max_len": 16, "embedding": {"scale": True, "scale_in_dtype": True}})
    embeddings = Embeddings(config).to(dtype)
    ids = torch.randint(0, 50, (2, 5))
    made = []
    real = torch.tensor

    def spy(*args, **kwargs):
        made.append(kwargs.get("device"))
        return real(*args, **kwargs)
    with mock.patch("torch.tensor", spy):
        out = embeddings.to("meta")(ids.to("meta"), torch.arange(5, device="meta"))
    assert out.is_meta and not [d for d in made if d is not None and torch.device(d).type != "cpu"]
    for p in embeddings.to_empty(device="cpu").parameters():
        p.data.normal_()
    positions = torch.arange(5)
    expected = embeddings.tok(ids) * torch.tensor(config.d_model ** 0.5, dtype=dtype)  # HF Gemma's normalizer
    assert torch.equal(embeddings(ids, positions), expected + embeddings.pos(positions))


def tiny_moe(E=4, k=2, C=8, I=8):
    from qkv.nn.moe import MixtureOfExperts, Router, SwiGLUExperts

    torch.manual_seed(0)
    experts = SwiGLUExperts(E, C, I)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.5)
    return MixtureOfExperts(Router(C, E, k, bias=True), experts)


def test_the_grouped_dispatch_compiles_once_whatever_the_experts_loads():
    """Each expert's row count is read on the host; traced, every new split of the rows would be a new graph until
    dynamo's recompile limit, then eager. The per-expert loop runs outside the graph: its shapes stay static."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    layer, counter = tiny_moe(), CompileCounter()
    compiled = torch.compile(layer, backend=counter, dynamic=False)
    loads = set()
    for seed in range(6):
        torch.manual_seed(seed)
        x = torch.randn(2, 5, 8, requires_grad=True)
        y = compiled(x)
        loads.add(tuple(layer.expert_counts.tolist()))
        torch.testing.assert_close(y, layer.reference_forward(x), atol=1e-6, rtol=1e-6)
        y.sum().backward()
        if seed == 0:
            first = counter.frame_count
    assert len(loads) > 2 and counter.frame_count == first


@pytest.mark.parametrize("device, dtype, capability, refusal", [
    ("cpu", torch.float32, None, None), ("cpu", torch.bfloat16, None, None),
    ("cuda", torch.bfloat16, (9, 0), None), ("cuda", torch.bfloat16, (10, 0), None),
    ("cuda", torch.float32, (9, 0), "a cuda torch.float32 product: _grouped_mm's CUDA kernel takes bf16"),
    ("cuda", torch.bfloat16, (8, 0), "compute capability 8.0: _grouped_mm's CUDA kernel needs 9.0 or more"),
    ("cpu", torch.float64, None, "a cpu torch.float64 product, not a CPU fp32 or bf16 one"),
    ("mps", torch.float32, None, "a mps torch.float32 product, not a CPU or CUDA one"),
])
def test_grouped_mm_is_taken_on_a_gpu_that_has_its_kernel(device, dtype, capability, refusal):
    from qkv.kernels.moe_training import refuses_device

    assert refuses_device(device, dtype, capability) == refusal


def tiny_gpt():
    from qkv.models import GPT, ModelConfig

    return GPT(ModelConfig(vocab_size=64, d_model=16, attention=dict(num_heads=2), num_layers=2, max_len=32))


def estimate_for(task, sharding="none", world=1):
    """``Engine.check_memory``'s estimate of a tiny GPT for ``task`` (any size fits: nothing is refused)."""
    from types import SimpleNamespace

    from qkv.training.setup import Engine

    model = tiny_gpt()
    recipe = SimpleNamespace(cfg=SimpleNamespace(batch_size=4 * world, grad_accum=1, activation_checkpointing=False,
                                                 bf16=False), dist=SimpleNamespace(world=world), mconf=model.config,
                             model=model, sharding=sharding, task=task, device=torch.device("cpu"))
    Engine.check_memory(recipe, None)
    return recipe.estimate, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("sharding, world", [("none", 1), ("fsdp", 2)])
def test_dpo_counts_its_reference_copy_and_both_answers_of_each_pair(sharding, world):
    """DPO's policy scores a chosen and a rejected sequence per pair (twice the rows' activations) and keeps a frozen
    copy of the starting weights (4 B per parameter; sharded like the model under fsdp)."""
    from types import SimpleNamespace

    plain, n = estimate_for(SimpleNamespace(T=16), sharding, world)
    dpo, _ = estimate_for(SimpleNamespace(T=16, sequences_per_row=2, reference=tiny_gpt()), sharding, world)
    assert dpo.states == plain.states + 4 * n // world
    assert dpo.activations == 2 * plain.activations


def fsdp_sharded(module: nn.Module) -> nn.Module:
    """``module`` with the class ``fully_shard`` gives it (an ``FSDPModule``), without a process group."""
    from torch.distributed.fsdp import FSDPModule

    module.__class__ = type(f"FSDP{type(module).__name__}", (FSDPModule, type(module)), {})
    return module


def test_a_sharded_model_decodes_eagerly():
    """FSDP's all-gathers run in every forward: a CUDA graph or a compiled step must not record them."""
    from qkv.training.sharding import decode_backend

    assert decode_backend(tiny_gpt()) == "auto"
    assert decode_backend(fsdp_sharded(tiny_gpt())) == "eager"
    inner = tiny_gpt()
    fsdp_sharded(inner.lm_head)
    assert decode_backend(inner) == "eager"


@pytest.mark.parametrize("sharded", [False, True])
def test_sft_final_answers_pick_the_backend_for_the_sharded_model(sharded):
    from types import SimpleNamespace

    from qkv.training.tasks.sft import greedy_answers

    model = fsdp_sharded(tiny_gpt()) if sharded else tiny_gpt()
    conversation = SimpleNamespace(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                                   raw=False)
    task = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids: "a"), val_set=[conversation], T=8,
                           chat=SimpleNamespace(render=lambda messages, **kw: ""), device=torch.device("cpu"),
                           options=SimpleNamespace(eval_generate=64))
    decode = mock.Mock(return_value=torch.tensor([[1, 2, 3]]))
    with mock.patch("qkv.training.tasks.sft.plain_ids", return_value=[1, 2]), \
            mock.patch("qkv.generation.generate", decode):
        assert greedy_answers.__wrapped__(task, model, lambda: torch.no_grad())["val_exact_match"] == 100
    assert decode.call_args.kwargs.get("backend", "auto") == ("eager" if sharded else "auto")


def test_a_recorded_step_under_autocast_reads_linear_weights_cast_once():
    """A CUDA graph recorded under autocast without its weight cache recasts every weight in every replay: the
    linears' weights are cast once before recording instead (not a tied embedding's, nor a norm's: those are read
    uncast), and the products are the same."""
    from qkv.generation.cuda_graph import autocast_linears, swapped

    model = tiny_gpt().eval()
    assert autocast_linears(model, "cpu") == []  # outside autocast
    ids = torch.randint(0, 64, (2, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        pairs = autocast_linears(model, "cpu")
        linears = {id(p) for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters()}
        tied = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
        assert tied & linears and {id(p) for p, _ in pairs} == linears - tied
        assert all(cast.dtype == torch.bfloat16 for _, cast in pairs)
        expected = model(ids).logits
        with swapped(pairs):
            assert all(p.dtype == torch.bfloat16 for p, _ in pairs)
            got = model(ids).logits
    assert torch.equal(got, expected) and all(p.dtype == torch.float32 for p, _ in pairs)


def test_a_recorded_step_under_autocast_keeps_the_caches_in_autocast_dtype():
    from qkv.generation.cuda_graph import autocast_caches
    from qkv.nn.kv_cache import KVCache

    caches = [KVCache(1, 2, 4, 8), KVCache(1, 2, 4, 8)]
    caches[0].k.normal_()
    autocast_caches(caches, "cpu")
    assert caches[0].k.dtype == torch.float32  # outside autocast
    before = caches[0].k.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast_caches(caches, "cpu")
    assert all(c.k.dtype == c.v.dtype == torch.bfloat16 for c in caches)
    assert torch.equal(caches[0].k, before.to(torch.bfloat16))
    caches[1].write(torch.tensor([1]), torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))  # writes cast on the way in
    assert caches[1].k[0, 0, 1, 0] == 1


def test_decode_rows_time_the_steady_steps_apart_from_each_calls_recording():
    """Each ``generate`` records its own CUDA graph: a timed call includes a recording. The steps a call of n tokens
    takes beyond one of n/2 are the steady ones; the once-a-call cost cancels."""
    from benchmarks.gpu_decode import steady_seconds

    per_call, per_token = 0.5, 0.01  # a recording and prefill, then each step
    short, long = per_call + 64 * per_token, per_call + 128 * per_token
    assert steady_seconds(short, long, 64, 128) == pytest.approx(128 * per_token)
    assert steady_seconds(1.0, 0.9, 64, 128) == 0.9  # noise: the long call's whole time
    with pytest.raises(ValueError, match="more steps"):
        steady_seconds(1.0, 2.0, 8, 8)


def test_the_int8_rows_roofline_counts_int8_bytes():
    """A torchao Int8Tensor reports its float type's element size: counted by its inner tensors, an int8 linear
    weight is about half its bf16 bytes."""
    pytest.importorskip("torchao", reason="the quant extra: pip install -e '.[quant]'")
    from benchmarks.gpu_decode import weight_bytes
    from qkv.kernels.quant import quantize_weights

    from qkv.models import GPT, ModelConfig

    model = GPT(ModelConfig(vocab_size=64, d_model=128, attention=dict(num_heads=2), num_layers=2, max_len=32)).to(torch.bfloat16)
    plain = weight_bytes(model)
    quantised = weight_bytes(quantize_weights(model, "int8"))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear) and m is not model.lm_head)
    assert plain - quantised == pytest.approx(linear, rel=0.05)  # 2 B -> 1 B (+ one scale a row) each


def test_the_gpu_check_runs_its_sections_one_after_another(monkeypatch, tmp_path):
    """The recipe runs once started beside the commands section: verify and the timings measured under load."""
    import argparse

    from benchmarks import gpu

    log, running = [], []

    def section(name):
        def run(*args, **kwargs):
            assert not running, f"{name} started while {running} ran"
            running.append(name)
            log.append(name)
            running.remove(name)
            return [[name, "passed", "", ""]]
        return run

    def recipe(kind, steps, out):
        section(f"recipe {kind}")()
        return 1
    monkeypatch.setattr(gpu, "command_rows", section("commands"))
    monkeypatch.setattr(gpu, "recipe_process", recipe)
    monkeypatch.setattr(gpu, "default_rows", section("default"))
    monkeypatch.setattr(gpu, "step_rows", section("step"))
    monkeypatch.setattr(gpu, "decode_rows", section("decode"))
    args = argparse.Namespace(only=list(gpu.SECTIONS), pairs=None, recipe_steps=3, minutes=1.0, nanogpt=None,
                              device="cuda", tiny=False, decode_tokens=4, json=None)
    results = gpu.run_sections(args, tmp_path)
    assert log == ["commands", "recipe qkv", "recipe nanogpt", "default", "step", "decode"]
    assert results["recipe"][0][1] == "FAILED"  # its process's exit status, said in its row


def test_the_cudnn_row_allows_cudnn_attention_alone():
    """Disabling flash alone leaves SDPA free to take the memory-efficient kernel: that row timed no cuDNN."""
    from benchmarks.gpu import SDPA_FLAGS, sdpa_only

    def flags():
        return {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in SDPA_FLAGS}
    before = flags()
    with sdpa_only("cudnn"):
        assert flags() == {"flash": False, "mem_efficient": False, "math": False, "cudnn": True}
    assert flags() == before
    with pytest.raises(ValueError, match="kernel must be one of"):
        with sdpa_only("triton"):
            pass


def test_mfu_is_given_against_the_measured_peak_and_the_spec_sheet():
    from benchmarks.gpu import mfu_words, spec_bf16_tflops

    assert spec_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.4 and spec_bf16_tflops("NVIDIA H100 PCIe") == 756.0
    assert spec_bf16_tflops("NVIDIA H200") == 989.4 and spec_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert spec_bf16_tflops("Tesla V100-SXM2-16GB") is None
    words = mfu_words(1e5, 6e9, 600.0, "NVIDIA H100 80GB HBM3")  # 600 TFLOP/s of model FLOPs
    assert words == ("MFU 100.0 % of the measured 600 TFLOP/s bf16 matmul, 60.6 % of the spec sheet's 989.4")
    assert mfu_words(1e5, 6e9, 600.0, "Tesla V100").endswith("no spec sheet figure for Tesla V100")


def test_training_on_a_gpu_leaves_the_callers_tf32_switches_as_they_were(monkeypatch):
    """The recipe turns TF32 on for its fp32 products on a GPU; a caller in the same process (a test, a notebook,
    the next run) gets its own switches back."""
    from qkv.data import Corpus
    from qkv.training.recipe import TrainConfig, train
    from qkv.training.setup import Engine

    place = Engine.place

    def as_on_a_gpu(self):
        place(self)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # what setup does on cuda
    monkeypatch.setattr(Engine, "place", as_on_a_gpu)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
    try:
        text = "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(60))
        train(TrainConfig(preset="tiny", max_steps=1, eval_interval=1, batch_size=2, context=16, device="cpu",
                          progress=False, final_eval=False, threads=1),
              corpus=Corpus(train=text, val=text[:400], source="t"))
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_gemma_embeddings_build_on_the_meta_device():
    """A checkpoint's skeleton is built on the meta device first: the rounded scales are made on the CPU."""
    from qkv.models import ModelConfig
    from qkv.models.trunk import Embeddings

    config = ModelConfig.from_dict({"vocab_size": 50, "d_model": 40, "attention": {"num_heads": 2}, "num_layers": 1,
                                    "max_len": 16, "embedding": {"scale": True, "scale_in_dtype": True}})
    with torch.device("meta"):
        embeddings = Embeddings(config)
    assert embeddings.scales[torch.bfloat16] == torch.tensor(40 ** 0.5, dtype=torch.bfloat16).item()


def test_dpos_reference_is_sharded_and_stays_sharded_after_its_forwards(tmp_path):
    """shard_frozen in a one-process gloo group: the reference's weights are shards (DTensors) before and after a
    forward without gradients (FSDP2 would keep its root's gathered for a backward that never comes), its logits
    the whole model's, and it decodes eagerly."""
    import copy

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from qkv.training.sharding import decode_backend, shard_frozen

    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = tiny_gpt().eval()
        reference = shard_frozen(copy.deepcopy(model).requires_grad_(False), torch.device("cpu"), 1)
        ids = torch.randint(0, 64, (2, 5))
        with torch.no_grad():
            for _ in range(2):
                assert torch.equal(reference(ids).logits, model(ids).logits)
                assert all(isinstance(p, DTensor) for p in reference.parameters())
        assert decode_backend(reference) == "eager"
    finally:
        dist.destroy_process_group()
