import json
import math

import pytest
import torch

from qkv.training import run_dir as ckpt
from qkv.data import Corpus
from qkv.models import ModelConfig
from qkv.training.recipe import TrainConfig, compressor_bpc, eval_starts, evaluate, lr_at, train

TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))
CORPUS = Corpus(train=TEXT[:-2000], val=TEXT[-2000:], source="test")
TINY = ModelConfig(d_model=32, attention=dict(num_heads=2), position=dict(kind="rope"), num_layers=2, max_len=32,
                   dropout=0.1)


pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(**kw) -> TrainConfig:
    base = dict(model=TINY, max_steps=6, batch_size=4, eval_interval=2, eval_windows=4, lr=1e-2, threads=1,
                warmup_steps=2, progress=False, final_eval=False)
    return TrainConfig(**(base | kw))


def test_lr_schedule_warms_up_then_follows_a_cosine():
    c = cfg(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    assert [lr_at(c, s, s / 20) for s in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert lr_at(c, 12, 0.6) == pytest.approx(0.55)  # halfway from the warmup's end to the budget's
    assert lr_at(c, 20, 1.0) == pytest.approx(0.1)


def test_compressors_and_eval_windows():
    c = compressor_bpc("abc" * 1000)
    assert 0 < c["xz_bpc"] < 1 and 0 < c["gzip_bpc"] < 1
    assert eval_starts(101, 10, None) == list(range(0, 100, 10))
    assert eval_starts(101, 10, 3) == [0, 40, 90]


def test_evaluate_scores_every_token_once():
    model = torch.nn.Module()
    vocab = 5

    class Uniform(torch.nn.Module):  # uniform predictions: exactly ln V nats per token
        config = TINY

        def forward(self, ids):
            return type("O", (), {"logits": torch.zeros(*ids.shape, vocab)})()

    model = Uniform()
    ids = torch.randint(0, vocab, (103,))
    nats, n = evaluate(model, ids, 10, eval_starts(len(ids), 10, None))
    assert n == 102 and nats == pytest.approx(102 * math.log(vocab))


def test_train_learns_and_reports(tmp_path):
    r = train(cfg(max_steps=30, eval_interval=10, final_eval=True), corpus=CORPUS)
    assert [m["step"] for m in r.metrics] == [10, 20, 30]
    assert r.metrics[-1]["val_loss"] < r.metrics[0]["val_loss"] < math.log(r.config.vocab_size)
    assert set(r.metrics[0]) >= {"step", "train_loss", "val_loss", "val_bpc"}
    s = r.summary
    assert s["steps"] == 30 and s["tokens"] == 30 * 4 * 32 and s["tokens_per_s"] > 0
    assert s["val_bpc"] == pytest.approx(s["val_loss"] / math.log(2), rel=1e-3)  # one token per character
    assert {"gzip_bpc", "xz_bpc"} <= set(s) and r.path is None and not r.model.training


def test_train_writes_a_run(tmp_path):
    out = tmp_path / "run"
    r = train(cfg(out=str(out), final_eval=True), corpus=CORPUS)
    names = {p.name for p in out.iterdir()}
    assert names == {"config.json", "model.safetensors", "tokenizer.json", "train_config.json", "train_state.pt",
                     "metrics.jsonl", "summary.json", "loss.png"}
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4, 6] and lines == r.metrics
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    run = ckpt.load_run(out)
    ids = torch.randint(0, r.config.vocab_size, (1, 8))
    torch.testing.assert_close(run.model(ids).logits, r.model(ids).logits)


def test_refuses_to_overwrite_a_run(tmp_path):
    out = tmp_path / "run"
    train(cfg(out=str(out), max_steps=2), corpus=CORPUS)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match="already exists; pass --resume .* or --overwrite"):
        train(cfg(out=str(out), max_steps=2), corpus=CORPUS)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    train(cfg(out=str(out), max_steps=2, seed=5, overwrite=True), corpus=CORPUS)
    assert (out / "model.safetensors").read_bytes() != before["model.safetensors"]


@pytest.mark.parametrize("options", [{}, dict(optimizer="muon", schedule="wsd", fused_adamw=True), dict(compile=True)])
def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path, options):
    full = train(cfg(out=str(tmp_path / "a"), **options), corpus=CORPUS)
    stopped = train(cfg(out=str(tmp_path / "b"), **options), corpus=CORPUS, stop_at=3)  # interrupted mid-interval
    assert [m["step"] for m in stopped.metrics] == [2] and not stopped.summary
    resumed = train(TrainConfig.for_resume(tmp_path / "b", progress=False), corpus=CORPUS)
    drop_time = lambda ms: [{k: v for k, v in m.items() if k != "elapsed_s"} for m in ms]  # noqa: E731
    assert drop_time(resumed.metrics) == drop_time(full.metrics)  # same losses, bit for bit
    for (name, p), q in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="already finished"):
        train(TrainConfig.for_resume(tmp_path / "b", progress=False), corpus=CORPUS)


def test_resume_refuses_a_changed_config(tmp_path):
    out = tmp_path / "run"
    train(cfg(out=str(out)), corpus=CORPUS, stop_at=2)
    with pytest.raises(ValueError, match=r"changed config \(lr: 0.01 -> 0.02\)"):
        TrainConfig.for_resume(out, lr=0.02)
    with pytest.raises(ValueError, match=r"changed config \(optimizer: 'adamw' -> 'muon'\)"):
        TrainConfig.for_resume(out, optimizer="muon")
    with pytest.raises(ValueError, match="changed config .*num_layers"):
        train(cfg(out=str(out), resume=True, model=ModelConfig(**(TINY.to_dict() | {"num_layers": 3}))), corpus=CORPUS)
    state = (out / ckpt.STATE_FILE).read_bytes()
    (out / ckpt.STATE_FILE).write_bytes(state[: len(state) // 3])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        train(TrainConfig.for_resume(out, progress=False), corpus=CORPUS)


def test_gradient_accumulation_matches_one_big_batch():
    no_dropout = ModelConfig(**(TINY.to_dict() | {"dropout": 0.0}))
    one = train(cfg(max_steps=3, eval_interval=1, model=no_dropout), corpus=CORPUS)
    acc = train(cfg(max_steps=3, eval_interval=1, grad_accum=2, model=no_dropout), corpus=CORPUS)
    for a, b in zip(one.metrics, acc.metrics, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-5)


def test_time_budget_ends_the_run():
    r = train(cfg(max_steps=None, max_minutes=0.02, eval_interval=1000), corpus=CORPUS)
    assert r.summary["steps"] >= 1 and r.summary["elapsed_seconds"] >= 1.2
    assert r.metrics[-1]["step"] == r.summary["steps"]  # the last step is always evaluated


@pytest.mark.parametrize("bad, message", [
    (dict(preset="huge", model=None), "unknown preset 'huge'"),
    (dict(tokenizer="words"), "'char' or 'bpe'"),
    (dict(max_steps=-1), "max_steps must be an int >= 0 \\(0: evaluate the starting model\\), got -1"),
    (dict(resume=True, overwrite=True, out="x"), "contradict"),
    (dict(resume=True), "needs --out"),
])
def test_bad_train_configs(bad, message):
    with pytest.raises(ValueError, match=message):
        cfg(**bad)


def test_bad_budgets_and_batches():
    with pytest.raises(ValueError, match="give a budget"):
        train(cfg(max_steps=None), corpus=CORPUS)
    with pytest.raises(ValueError, match="batch_size 4 must divide"):
        train(cfg(grad_accum=3), corpus=CORPUS)
    with pytest.raises(ValueError, match="shorter than one window"):
        train(cfg(), corpus=Corpus(train="abc", val="abc", source="t"))


def test_ddp_two_processes_match_one_process(tmp_path, ddp_matches_one_process):
    """torchrun --nproc_per_node 2 (gloo on CPU) reaches the losses of one process, same global batch."""
    (tmp_path / "data.txt").write_text(TEXT, encoding="utf-8")
    _, two = ddp_matches_one_process(["train", "--preset", "tiny", "--data", str(tmp_path / "data.txt"),
                                      "--max-steps", "3", "--eval-interval", "1", "--batch-size", "4", "--context",
                                      "32", "--quiet", "--sample-tokens", "0", "--device", "cpu"])
    assert two["world_size"] == 2 and two["steps"] == 3


def test_bf16_autocast_trains_and_device_is_checked():
    r = train(cfg(max_steps=2, bf16=True), corpus=CORPUS)
    assert math.isfinite(r.metrics[-1]["val_loss"]) and r.model.lm_head.weight.dtype == torch.float32
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            train(cfg(device="cuda"), corpus=CORPUS)
    with pytest.raises(ValueError, match="device must be"):
        train(cfg(device="tpu"), corpus=CORPUS)


def test_threads_are_respected_and_recorded(monkeypatch):
    from qkv.training import setup  # the recipe's setup chooses the threads

    assert train(cfg(max_steps=1, threads=1), corpus=CORPUS).summary["threads"] == 1
    monkeypatch.setattr(setup, "cpu_threads", lambda: 2)  # no --threads: what is free now
    assert train(cfg(max_steps=1, threads=None), corpus=CORPUS).summary["threads"] == 2
    assert torch.get_num_threads() == 1  # the caller's count comes back


def test_a_gpu_runs_state_resumes_on_a_cpu_exactly(tmp_path):
    """What a GPU run saves that a CPU run does not (its CUDA RNG state, its device in train_config.json) is set
    aside on a CPU: the resumed run continues exactly as the uninterrupted one."""
    from qkv.training.run_dir import RunDir

    full = train(cfg(out=str(tmp_path / "a")), corpus=CORPUS)
    train(cfg(out=str(tmp_path / "b")), corpus=CORPUS, stop_at=3)
    run = RunDir(tmp_path / "b")
    state = run.load_state()
    state["cuda_rng"] = torch.zeros(16, dtype=torch.uint8)  # as a GPU run's checkpoint holds one
    run.save_state(state)
    config = json.loads((run.path / run.TRAIN_CONFIG).read_text())
    (run.path / run.TRAIN_CONFIG).write_text(json.dumps(config | {"device": "cuda"}))
    resumed = train(TrainConfig.for_resume(tmp_path / "b", device="cpu", progress=False), corpus=CORPUS)
    drop_time = lambda ms: [{k: v for k, v in m.items() if k != "elapsed_s"} for m in ms]  # noqa: E731
    assert drop_time(resumed.metrics) == drop_time(full.metrics)
    for p, q in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("task", ["lm", "translate"])
def test_max_steps_zero_summarises_the_starting_model(tmp_path, task):
    """Every task: no step, one evaluation at step 0, the summary written (the baseline a fine-tune is compared to)."""
    if task == "lm":
        config, inputs = cfg(max_steps=0, out=str(tmp_path / "r"), final_eval=True), {"corpus": CORPUS}
    else:
        from qkv.data.catalogs import PairCorpus

        pairs = [(f"open file {i}", f"打开文件 {i}") for i in range(40)]
        inputs = {"corpus": PairCorpus(train=pairs[:32], val=pairs[32:], source="test", target_lang="zh_CN")}
        config = TrainConfig(task="translate", preset="tiny", max_steps=0, batch_size=4, vocab_size=300, threads=1,
                             progress=False, out=str(tmp_path / "r"))
    result = train(config, **inputs)
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["steps"] == 0 and [m["step"] for m in result.metrics] == [0] and s["val_loss"] > 0
    assert result.metrics[0]["train_loss"] is None
