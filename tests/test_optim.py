"""qkv.training.optim: which weights Muon takes, the schedules, the pair's state, the checks."""
import pytest
import torch

from qkv.models import GPT, ModelConfig
from qkv.training.muon import Muon
from qkv.training.optim import WSD_DECAY, OptimizerPair, build_optimizer, lr_at, muon_matrices, set_lr
from qkv.training.recipe import TrainConfig

TINY = ModelConfig(vocab_size=40, d_model=16, attention=dict(num_heads=2), num_layers=2, max_len=16)
CPU = torch.device("cpu")


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**(dict(model=TINY, max_steps=10, lr=1.0, warmup_steps=4, min_lr_ratio=0.1) | kw))


def test_wsd_holds_the_peak_then_decays_linearly():
    c = cfg(schedule="wsd")
    assert [lr_at(c, s, s / 10) for s in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]  # the same warmup as cosine
    assert lr_at(c, 10, 0.3) == 1.0 and lr_at(c, 10, 1 - WSD_DECAY) == pytest.approx(1.0)
    assert lr_at(c, 10, 1 - WSD_DECAY / 2) == pytest.approx(0.55)  # halfway down from 1 to 0.1
    assert lr_at(c, 10, 1.0) == lr_at(c, 10, 1.5) == pytest.approx(0.1)


def scheduled(c, steps: int) -> list[float]:
    return [lr_at(c, s, s / steps) for s in range(steps)]


@pytest.mark.parametrize("steps, warmup", [(30, 3), (30, 0), (7, 2), (4, 4), (5, 9)])
def test_cosine_is_transformers_schedule_at_every_step(steps, warmup):
    transformers = pytest.importorskip("transformers")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
    plain = transformers.get_cosine_schedule_with_warmup(opt, warmup, steps)
    want = []
    for _ in range(steps):
        want.append(opt.param_groups[0]["lr"])
        opt.step()
        plain.step()
    got = scheduled(cfg(lr=2e-4, warmup_steps=warmup, min_lr_ratio=0.0, max_steps=steps), steps)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-18)
    if warmup < steps:
        assert max(got) == pytest.approx(2e-4)  # the warmup reaches --lr


def test_cosine_with_a_floor_is_transformers_min_lr_schedule():
    transformers = pytest.importorskip("transformers")
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, 4, 20, min_lr_rate=0.1)
    want = []
    for _ in range(20):
        want.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert scheduled(cfg(max_steps=20), 20) == pytest.approx(want, rel=1e-12)


def test_a_time_budget_decays_over_what_the_warmup_leaves():
    c = cfg(warmup_steps=4, min_lr_ratio=0.0)
    assert lr_at(c, 4, 0.2) == 1.0  # the peak right after the warmup, whatever the budget's unit
    assert lr_at(c, 12, 0.6) == pytest.approx(0.5)  # halfway from the warmup's end (0.2) to the budget's (1)
    assert lr_at(c, 20, 1.0) == pytest.approx(0.0)


def test_warmup_defaults_and_ratio():
    assert cfg(warmup_steps=None, max_steps=30, task="sft").warmup_steps == 3  # a 30-step run peaks at step 3
    assert cfg(warmup_steps=None, max_steps=1000, task="sft").warmup_steps == 20  # the task's
    assert cfg(warmup_steps=None, max_steps=None, max_minutes=1.0, task="dpo").warmup_steps == 10
    c = cfg(warmup_steps=None, warmup_ratio=0.1, max_steps=25)
    assert (c.warmup_steps, c.warmup_ratio) == (3, None)  # ⌈2.5⌉, as transformers' get_warmup_steps
    assert cfg(warmup_steps=3, warmup_ratio=0.1, max_steps=25).warmup_steps == 3  # the same, said twice
    with pytest.raises(ValueError, match="disagree"):
        cfg(warmup_steps=5, warmup_ratio=0.1, max_steps=25)
    with pytest.raises(ValueError, match="needs|give --max-steps"):
        cfg(warmup_steps=None, warmup_ratio=0.1, max_steps=None, max_minutes=1.0)
    for bad in (1.0, -0.1, "0.1"):
        with pytest.raises(ValueError, match="warmup_ratio must be"):
            cfg(warmup_steps=None, warmup_ratio=bad)


@pytest.mark.parametrize("tie", [True, False])
def test_muon_takes_the_hidden_matrices_only(tie):
    model = GPT(ModelConfig(**(TINY.to_dict() | {"head": {"tie": tie}})))
    names = {id(p): n for n, p in model.named_parameters()}
    taken = sorted(names[id(p)] for p in muon_matrices(model))
    assert taken == sorted(n for n in names.values() if n.startswith("blocks.") and n.endswith("proj.weight"))
    opt = build_optimizer(model, cfg(optimizer="muon"), CPU)
    assert isinstance(opt, OptimizerPair) and isinstance(opt.parts["muon"], Muon)
    held = [id(p) for group in opt.param_groups for p in group["params"]]
    assert sorted(held) == sorted(names)  # every weight in exactly one part (the tied head once)


def test_muon_takes_the_experts_weights_and_adamw_their_router_and_biases():
    model = GPT(ModelConfig(**(TINY.to_dict() | {"moe": {"num_experts": 4, "top_k": 2, "d_expert": 8}})))
    names = {id(p): n for n, p in model.named_parameters()}
    taken = {names[id(p)] for p in muon_matrices(model)}
    experts = {n for n in names.values() if ".experts." in n}
    assert experts and experts <= taken and not any("router" in n for n in taken)
    opt = build_optimizer(model, cfg(optimizer="muon"), CPU)
    model(torch.randint(0, 40, (2, 8)), targets=torch.randint(0, 40, (2, 8))).loss.backward()
    opt.step()  # the stacks step through Muon


def test_muon_lr_scales_its_groups_and_the_pair_round_trips():
    model = GPT(TINY)
    opt = build_optimizer(model, cfg(optimizer="muon", lr=0.01, muon_lr=0.02), CPU)
    set_lr(opt, 0.005)
    assert [g["lr"] for g in opt.param_groups] == [0.005, 0.005, 0.01]  # AdamW's two groups, then Muon's
    model(torch.randint(0, 40, (2, 8)), targets=torch.randint(0, 40, (2, 8))).loss.backward()
    opt.step()
    again = build_optimizer(model, cfg(optimizer="muon", lr=0.01, muon_lr=0.02), CPU)
    again.load_state_dict(opt.state_dict())
    momentum = lambda o: [s["momentum_buffer"] for s in o.parts["muon"].state.values()]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(momentum(opt), momentum(again), strict=True))
    with pytest.raises(ValueError, match=r"holds \['param_groups', 'state'\], expected the parts \['adamw', 'muon'\]"):
        again.load_state_dict(torch.optim.AdamW(model.parameters()).state_dict())


def test_fused_adamw_takes_nearly_the_same_steps():
    torch.manual_seed(0)
    models = [GPT(TINY), GPT(TINY)]
    models[1].load_state_dict(models[0].state_dict())
    x = torch.randint(0, 40, (2, 9))
    for model, fused in zip(models, (False, True)):
        opt = build_optimizer(model, cfg(lr=1e-2, fused_adamw=fused), CPU)
        assert opt.defaults["fused"] is (True if fused else None)
        for _ in range(3):
            model(x[:, :-1], targets=x[:, 1:]).loss.backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)  # a hundredth of one step (lr 1e-2): not bit for bit


@pytest.mark.parametrize("bad, message", [
    (dict(optimizer="sgd"), "optimizer must be one of adamw, muon, got 'sgd'"),
    (dict(schedule="linear"), "schedule must be one of cosine, wsd, got 'linear'"),
    (dict(muon_lr=0.02), "muon_lr is Muon's learning rate: it needs optimizer 'muon', got 'adamw'"),
    (dict(optimizer="muon", muon_lr=0.0), "muon_lr must be > 0, got 0.0"),
    (dict(optimizer="muon", sharding="fsdp"), "sharding 'fsdp' splits them"),
])
def test_bad_optimizer_options(bad, message):
    with pytest.raises(ValueError, match=message):
        cfg(**bad)


def test_muon_lowers_the_loss_of_a_batch():
    torch.manual_seed(0)
    model, x = GPT(TINY), torch.randint(0, 40, (4, 9))
    opt = build_optimizer(model, cfg(optimizer="muon", lr=1e-2), CPU)
    losses = []
    for _ in range(5):
        loss = model(x[:, :-1], targets=x[:, 1:]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1


def test_the_demo_and_translate_presets_from_scratch_train_with_muon_and_wsd_other_runs_adamw_and_cosine():
    from qkv.models import ModelConfig
    from qkv.training.recipe import TrainConfig

    def recipe(**kw):
        c = TrainConfig(**kw)
        c.validate()
        return c.optimizer, c.schedule

    assert recipe() == ("muon", "wsd")  # qkv train's default: the demo preset
    assert recipe(optimizer="adamw") == ("adamw", "wsd") and recipe(schedule="cosine") == ("muon", "cosine")
    assert recipe(task="translate") == ("muon", "wsd")  # qkv train --task translate's default
    assert recipe(task="translate", preset="tiny") == ("adamw", "cosine")
    assert recipe(preset="tiny") == ("adamw", "cosine")
    assert recipe(model=ModelConfig(vocab_size=50, d_model=16, attention=dict(num_heads=2), num_layers=1, max_len=16)) == \
        ("adamw", "cosine")
    old = TrainConfig.from_dict({"task": "lm", "preset": "demo"})  # saved before either option existed
    assert (old.optimizer, old.schedule) == ("adamw", "cosine")


def test_the_demo_and_translate_presets_from_scratch_train_in_bf16_where_the_hardware_has_it(monkeypatch):
    from qkv.training import config as r  # TrainConfig reads native_bf16 there

    for native in (True, False):
        monkeypatch.setattr(r, "native_bf16", lambda device, native=native: native)
        assert r.TrainConfig().bf16 is native  # qkv train's default: the demo preset
        assert r.TrainConfig(bf16=False).bf16 is False and r.TrainConfig(preset="tiny", bf16=True).bf16 is True
        assert r.TrainConfig(task="translate").bf16 is native  # qkv train --task translate's default
        assert r.TrainConfig(preset="tiny").bf16 is False and r.TrainConfig(task="translate", preset="tiny").bf16 is False
    assert r.TrainConfig.from_dict({"task": "lm", "preset": "demo", "bf16": False}).bf16 is False  # a saved run's


def test_native_bf16_asks_the_gpu_or_the_cpus_probes(monkeypatch):
    from qkv import runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for avx512_bf16, amx, want in ((True, False, True), (False, True, True), (False, False, False)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        assert runtime.native_bf16("auto") is want and runtime.native_bf16("cpu") is want
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert runtime.native_bf16("cpu") is False  # an older torch without the probes: fp32


def test_the_warmup_flags_reach_the_config():
    from qkv.cli import build_parser
    from qkv.cli.train import train_config

    command = lambda *argv: train_config(build_parser().parse_args(["train", "--preset", "tiny", *argv]))  # noqa: E731
    assert command("--max-steps", "40", "--warmup-ratio", "0.05").warmup_steps == 2
    assert command("--max-steps", "40", "--warmup-steps", "7").warmup_steps == 7
    assert command("--max-steps", "40").warmup_steps == 4  # lm's 50, at most a tenth of the steps
