"""Training mixtures of experts (qkv.training.expert_load): expert load logged, aux-loss-free balancing."""
import json

import pytest
import torch

from qkv.cli import main
from qkv.data import Corpus
from qkv.models import ModelConfig
from qkv.nn.moe import MixtureOfExperts, Router, SwiGLUExperts
from qkv.training.expert_load import ExpertLoad, max_violation, step_hooks
from qkv.training.recipe import TrainConfig, train

TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(300))
CORPUS = Corpus(train=TEXT[:-2000], val=TEXT[-2000:], source="test")
MOE = dict(num_experts=4, d_expert=16)


pytestmark = pytest.mark.usefixtures("one_thread")


def skewed_layer(E=4, C=8) -> MixtureOfExperts:
    """An MoE layer whose router sends almost every token to expert 0 (its logit leads by a wide margin)."""
    torch.manual_seed(0)
    layer = MixtureOfExperts(Router(C, E, 1, correction_bias=True), SwiGLUExperts(E, C, 6)).train()
    with torch.no_grad():
        layer.router.weight.normal_(0, 0.1)
        layer.router.weight[0] += 0.6  # x ~ N(0, 1) plus a constant feature: expert 0 wins most tokens
    return layer


def tokens(n=256, C=8) -> torch.Tensor:
    x = torch.randn(1, n, C)
    x += 1.0  # a constant feature the skewed router reads
    return x


def test_max_violation():
    assert max_violation(torch.tensor([[2, 2, 2, 2], [8, 0, 0, 0]])).tolist() == [0.0, 3.0]
    assert max_violation(torch.zeros(4)).item() == 0.0


def test_aux_free_bias_moves_toward_balance():
    layer, x = skewed_layer(), tokens()
    load = ExpertLoad(layer, speed=0.05)
    layer(x)
    first = max_violation(load.step_load[0]).item()
    load.after_step()
    for _ in range(30):
        layer(x)
        load.after_step()
    layer(x)
    last = max_violation(load.step_load[0]).item()
    assert first > 1.0 and last < 0.5 * first, (first, last)
    assert layer.router.correction_bias[0] < 0  # the overloaded expert is pushed down
    m = load.metrics()
    assert len(m["expert_tokens"]) == 1 and sum(m["expert_tokens"][0]) == 31 * 256 and m["maxvio_mean"] > 0


def test_aux_free_bias_chooses_but_never_weighs():
    layer, x = skewed_layer(), tokens(64)
    params = {n: p.clone() for n, p in layer.named_parameters()}
    load = ExpertLoad(layer, speed=0.3)
    layer(x)
    load.after_step()
    assert layer.router.correction_bias.abs().sum() > 0
    assert all(torch.equal(p, params[n]) for n, p in layer.named_parameters())  # no weight moved
    flat = x.reshape(-1, 8)
    routing = layer.router(flat)
    scores = routing.logits.softmax(-1).gather(-1, routing.experts)  # the unbiased scores of the chosen experts
    torch.testing.assert_close(routing.weights, scores / scores.sum(-1, keepdim=True))


def test_no_hooks_for_a_dense_model_and_bias_needed():
    assert step_hooks(torch.nn.Linear(2, 2), 0.1) == []
    plain = MixtureOfExperts(Router(8, 4, 1), SwiGLUExperts(4, 8, 6))
    with pytest.raises(ValueError, match="correction bias"):
        ExpertLoad(plain, speed=0.1)


def cfg(moe, **kw) -> TrainConfig:
    model = ModelConfig(d_model=16,
                        attention=dict(num_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                        position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False),
                        normalization=dict(kind="rmsnorm"), num_layers=2, max_len=32, moe=moe)
    base = dict(model=model, max_steps=4, batch_size=4, eval_interval=2, eval_windows=2, lr=1e-2, threads=1,
                warmup_steps=1, progress=False, final_eval=False)
    return TrainConfig(**(base | kw))


def test_summary_has_expert_load_for_moe_only(tmp_path):
    train(cfg(MOE | dict(bias_update_speed=0.01), out=str(tmp_path / "moe")), corpus=CORPUS)
    s = json.loads((tmp_path / "moe" / "summary.json").read_text())
    assert len(s["expert_tokens"]) == 2 and len(s["expert_tokens"][0]) == 4 and len(s["maxvio"]) == 2
    assert s["maxvio_mean"] == pytest.approx(sum(s["maxvio"]) / 2, abs=1e-3)
    records = [json.loads(line) for line in (tmp_path / "moe" / "metrics.jsonl").read_text().splitlines()]
    assert all("maxvio_mean" in r for r in records)
    train(cfg(None, out=str(tmp_path / "dense")), corpus=CORPUS)
    dense = json.loads((tmp_path / "dense" / "summary.json").read_text())
    assert not {"expert_tokens", "maxvio", "maxvio_mean"} & set(dense)


def test_bias_saved_and_resumed(tmp_path, monkeypatch):
    from qkv.training import expert_load
    from qkv.training.run_dir import RunDir

    run, moe = str(tmp_path / "r"), MOE | dict(bias_update_speed=0.05)
    train(cfg(moe, out=run, max_steps=3), corpus=CORPUS, stop_at=1)
    saved = RunDir(run).load().model.blocks[0].ff.router.correction_bias.clone()
    assert saved.abs().sum() > 0  # one step moved it by ±γ
    seen = []
    update = expert_load.update_bias
    monkeypatch.setattr(expert_load, "update_bias", lambda b, load, speed: (seen.append(b.clone()),
                                                                             update(b, load, speed)))
    train(cfg(moe, out=run, max_steps=3, resume=True), corpus=CORPUS)
    assert torch.equal(seen[0], saved)  # the resumed run's first update starts from the saved bias


def test_bad_input_errors_clearly(tmp_path, capsys):
    with pytest.raises(ValueError, match="bias_update_speed"):
        ModelConfig(moe=MOE | dict(bias_update_speed=-0.1))
    with pytest.raises(ValueError, match="need moe.num_experts"):
        ModelConfig(moe=dict(aux_loss_coef=0.01))
    out = tmp_path / "r"
    for flags, words in ((["--model", "moe.enabled=true"], "moe.num_experts"),
                         (["--model", "moe.aux_loss_coef=0.01"], "need moe.num_experts"),
                         (["--model", "moe.num_experts=4", "--model", "moe.bias_update_speed=-1"], "bias_update")):
        assert main(["train", "--preset", "tiny", "--max-steps", "1", "--quiet", "--out", str(out), *flags]) == 2
        assert words in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_from_hf_reads_router_aux_loss_coef_as_hf_applies_it(family):
    import importlib

    config = importlib.import_module(f"qkv.interop.hf.families.{family}").config
    hf = dict(hidden_size=16, num_attention_heads=2, num_hidden_layers=2, vocab_size=40, intermediate_size=32,
              num_experts=4, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02)
    assert config(hf | dict(output_router_logits=True), [])["moe"]["aux_loss_coef"] == 0.02
    assert "aux_loss_coef" not in config(hf | dict(output_router_logits=False), [])["moe"]  # HF adds no loss then


def test_study_moe_quick_writes_its_table(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "moe", "--quick", "--max-tokens", "1024", "--quiet", "--out", str(out)]) == 0
    text = (out / "results.md").read_text()
    for name in ("| dense |", "| moe-active |", "| moe-active-noaux |", "| moe-aux-free |", "| moe-total |"):
        assert name in text
    assert (out / "moe.png").stat().st_size > 0 and "MaxVio" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["model"]: r for r in summary["rows"]}
    assert rows["moe-active"]["active_parameters"] - rows["dense"]["active_parameters"] < 1000  # the router only
    assert main(["study", "moe", "--from-results", str(out), "--lang", "zh"]) == 0
    assert "| 模型 |" in (out / "results.zh.md").read_text()


def test_qkv_train_swaps_the_moe_layers_for_the_speed_layer_and_still_counts_their_load(monkeypatch):
    """The expert-load hooks sit on the routers, not the layers: a hooked layer would keep its own forward, and
    qkv train would never run the training speed layer's grouped products."""
    from qkv.kernels import moe_training

    seen, forward = [], moe_training.TrainingMixtureOfExperts.forward

    def spy(self, x):
        y = forward(self, x)
        seen.append(self.grouped_mm_fallback)
        return y
    monkeypatch.setattr(moe_training.TrainingMixtureOfExperts, "forward", spy)
    summary = train(cfg(MOE, max_steps=2), corpus=CORPUS).summary
    took = 2 * 2 if hasattr(torch, "_grouped_mm") else 0  # two layers, two steps (evaluation: the layer's own)
    assert seen and seen.count(None) == took, seen
    assert [sum(layer) for layer in summary["expert_tokens"]] == [2 * 4 * 32 * 2] * 2  # steps · B · T · k
