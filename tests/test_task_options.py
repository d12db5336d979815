"""Each task owns its settings: ``TrainConfig.task_options`` (the task's options dataclass) and the task's
defaults; an option is given and read there only (by its own name TrainConfig refuses it, naming
``task_options``), and every train_config.json written flat before (tests/data/train_config_flat_*.json, by
2-step ``qkv train`` runs of the code of then) loads, resumes and refuses a changed run."""
import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
pytestmark = pytest.mark.usefixtures("one_thread")
from test_translation import pairs_file  # noqa: F401  (a fixture)

from qkv.cli import build_parser, main
from qkv.cli.train import train_config
from qkv.data import Corpus
from qkv.models import ModelConfig
from qkv.training.recipe import TrainConfig, train
from qkv.training.tasks import (TASKS, LanguageModelTask, TaskDefaults, TaskOptions, TranslationOptions, register,
                                task_options)
from qkv.training.tasks.base import option

DATA = Path(__file__).parent / "data"
TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(300))


def test_each_task_brings_its_options_and_defaults():
    lm, tr = TrainConfig(max_steps=1000), TrainConfig(task="translate", max_steps=1000)  # warmup: the task's
    assert lm.task_options == TaskOptions() and TaskOptions.names() == ()  # language modelling has none
    assert tr.task_options == TranslationOptions(target_lang="zh_CN", label_smoothing=0.1, copy=True, num_beams=4,
                                                 length_penalty=0.6)
    # the defaults of before (recipe.TASK_DEFAULTS, PRESET_TOKENIZERS), now Task.defaults
    assert (lm.preset, lm.batch_size, lm.lr, lm.warmup_steps, lm.tokenizer, lm.vocab_size) == \
        ("demo", 16, 6e-3, 50, "bpe", 2048)
    assert (tr.preset, tr.batch_size, tr.lr, tr.warmup_steps, tr.tokenizer, tr.vocab_size) == \
        ("translate", 32, 2e-3, 40, "bpe", 8000)
    assert TrainConfig(preset="tiny", max_steps=1).tokenizer == "char"
    assert TrainConfig(preset="translate", max_steps=1).vocab_size == 8000
    command = lambda *argv: train_config(build_parser().parse_args(["train", *argv]))  # noqa: E731
    assert command().max_minutes == 3.0 and command("--task", "translate").max_minutes == 10.0


def test_options_are_given_and_read_in_task_options():
    given = TranslationOptions(target_lang="de", label_smoothing=0.2, copy=False)
    cfg = TrainConfig(task="translate", task_options=given, max_steps=1)
    assert cfg.task_options == TranslationOptions(target_lang="de", label_smoothing=0.2, copy=False)
    opts = cfg.task_options
    assert (opts.target_lang, opts.label_smoothing, opts.copy, opts.num_beams) == ("de", 0.2, False, 4)
    assert not hasattr(cfg, "num_beams")  # one spelling: cfg.task_options.num_beams
    cfg.task_options = replace(cfg.task_options, num_beams=2)  # the options are frozen: a copy, checked again
    assert cfg.task_options.num_beams == 2
    assert replace(cfg, lr=1e-3).task_options == cfg.task_options
    as_dict = TrainConfig(task="translate", task_options={"copy": False}, max_steps=1)
    assert as_dict.task_options == TranslationOptions(copy=False)
    saved = cfg.to_dict()
    assert saved["task_options"] == {"target_lang": "de", "label_smoothing": 0.2, "copy": False, "num_beams": 2,
                                     "length_penalty": 0.6}
    assert not {"target_lang", "copy"} & set(saved) and TrainConfig.from_dict(saved) == cfg


def test_an_option_by_its_own_name_is_refused_naming_task_options():
    with pytest.raises(TypeError, match=r"task's options go in task_options, not by their own names: "
                                        r"TrainConfig\(task='translate', task_options=\{'label_smoothing': 0.2\}\)"):
        TrainConfig(task="translate", label_smoothing=0.2, max_steps=1)
    with pytest.raises(TypeError, match=r"copy is an option of --task translate, not of --task lm \(a task's "
                                        r"options go in task_options\)"):
        TrainConfig(task="lm", copy=True, max_steps=1)
    with pytest.raises(TypeError, match="label_smoothing is an option of --task translate or dpo, not of --task sft"):
        TrainConfig(task="sft", label_smoothing=0.1, max_steps=1)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['beams'\]"):
        TrainConfig(task="translate", beams=2, max_steps=1)


def test_another_tasks_option_is_refused_unless_it_asks_for_nothing():
    command = lambda *argv: train_config(build_parser().parse_args(["train", *argv]))  # noqa: E731
    with pytest.raises(ValueError, match="copy is an option of --task translate, not of --task lm"):
        command("--task", "lm", "--copy")
    assert command("--task", "lm", "--no-copy").task_options == TaskOptions()  # nothing to switch off
    with pytest.raises(ValueError, match=r"unknown options of task 'lm': \['copy'\]; it has none"):
        TrainConfig(task="lm", task_options={"copy": True}, max_steps=1)


@pytest.mark.parametrize("bad, message", [
    (dict(label_smoothing=1.5), r"label_smoothing must be in \[0, 1\), got 1.5"),
    (dict(num_beams=0), "num_beams must be a positive int, got 0"),
    (dict(num_beams=2.5), "num_beams must be an int, got 2.5"),
    (dict(copy="yes"), "copy must be True or False, got 'yes'"),
    (dict(length_penalty="long"), "length_penalty must be a finite number, got 'long'"),
    (dict(target_lang=3), "target_lang must be a str, got 3"),
    (dict(target_lang=""), "target_lang must name a locale such as 'zh_CN', got ''"),
    (dict(beam=3), r"unknown options of task 'translate': \['beam'\]; it takes \['target_lang'"),
    ([1], "must be a TranslationOptions or a dict of its fields, got list"),
])
def test_bad_options_name_the_expected_and_the_actual(bad, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(task="translate", max_steps=1, task_options=bad)


def test_the_command_turns_a_bad_option_into_one_line(tmp_path, capsys):
    assert main(["train", "--task", "translate", "--num-beams", "0", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_beams must be a positive int, got 0" in err[0]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("task", ["lm", "translate"])
def test_a_flat_train_config_of_before_loads(task):
    flat = json.loads((DATA / f"train_config_flat_{task}.json").read_text())
    cfg = TrainConfig.from_dict(flat)
    assert cfg.task_options == task_options(task, {k: flat[k] for k in cfg.task_options.names()})
    for name, value in flat.items():  # every flat value reads back the same, the other task's options aside
        if name in cfg.task_options.names():
            assert getattr(cfg.task_options, name) == value, name
        elif name not in TranslationOptions.names():
            # the model section: the same config (sections gain fields at their defaults as qkv grows)
            expected = ModelConfig.from_dict(value) if name == "model" and value else value
            assert getattr(cfg, name) == expected, name
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_a_flat_run_of_before_resumes_and_refuses_a_changed_run(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "train_config.json").write_text((DATA / "train_config_flat_translate.json").read_text())
    assert TrainConfig.for_resume(run).task_options.copy is True
    scoring = {"num_beams": 3, "length_penalty": 1.0}  # they only score
    assert TrainConfig.for_resume(run, task_options=scoring).task_options.num_beams == 3
    for change, message in [(dict(task_options={"copy": False}), r"copy: True -> False"),
                            (dict(lr=0.5), r"lr: 0.002 -> 0.5"),
                            (dict(task_options={"label_smoothing": 0.0, "target_lang": "de"}),
                             r"target_lang: 'zh_CN' -> 'de'; label_smoothing: 0.1 -> 0.0"),
                            (dict(task_options=TranslationOptions(copy=False, num_beams=2)), r"copy: True -> False\)")]:
        with pytest.raises(ValueError, match=r"--resume with a changed config \(" + message):
            TrainConfig.for_resume(run, **change)


def test_the_flags_of_a_resumed_flat_run_fill_its_own_tasks_options(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "train_config.json").write_text((DATA / "train_config_flat_translate.json").read_text())
    resume = ["train", "--resume", "--out", str(run)]
    command = lambda *argv: train_config(build_parser().parse_args([*resume, *argv]))  # noqa: E731
    assert command("--num-beams", "3").task_options == TranslationOptions(num_beams=3)  # no --task: the run's
    with pytest.raises(ValueError, match=r"--resume with a changed config \(copy: True -> False\)"):
        command("--no-copy")
    with pytest.raises(ValueError, match="beta is an option of --task dpo, not of --task translate"):
        command("--beta", "0.2")


@pytest.mark.parametrize("task", ["lm", "translate"])
def test_a_run_with_a_flat_train_config_of_before_resumes_and_shows_its_info(task, pairs_file, tmp_path, capsys):
    data = pairs_file if task == "translate" else tmp_path / "corpus.txt"
    if task == "lm":
        data.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "run"
    flat = json.loads((DATA / f"train_config_flat_{task}.json").read_text()) | {"data": str(data), "out": str(out)}
    train(TrainConfig.from_dict(flat), stop_at=1)  # the run, as today's code starts it
    (out / "train_config.json").write_text(json.dumps(flat))  # ... as the code of before wrote its config
    assert main(["train", "--resume", "--out", str(out), "--quiet", "--sample-tokens", "0"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == flat["max_steps"]
    assert main(["info", "--run", str(out)]) == 0
    assert f"task={task}, batch_size={flat['batch_size']}" in capsys.readouterr().out


# --- a task plugs in without an edit to the recipe ---------------------------------------------------------------

@dataclass(frozen=True)
class ScaledOptions(TaskOptions):
    loss_scale: float = option(1.0, "the loss is multiplied by this")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.loss_scale > 0:
            raise ValueError(f"loss_scale must be > 0, got {self.loss_scale!r}")


class ScaledLossTask(LanguageModelTask):
    """Language modelling with its loss scaled: a task with an option and defaults of its own."""

    name = "scaled"
    options_type = ScaledOptions
    defaults = TaskDefaults(preset="tiny", batch_size=4, lr=1e-2, warmup_steps=2, minutes=0.5)

    def check(self, cfg, mconf, dist) -> None:
        super().check(cfg, mconf, dist)
        self.scale = cfg.task_options.loss_scale

    def loss(self, model, micro):
        return super().loss(model, micro) * self.scale


@pytest.fixture
def scaled():
    register("scaled", ScaledLossTask)
    yield
    TASKS.pop("scaled")


def test_a_registered_task_brings_its_options_and_defaults(scaled, tmp_path):
    corpus = Corpus(train=TEXT[:-2000], val=TEXT[-2000:], source="test")
    run = dict(task="scaled", context=32, max_steps=1, eval_interval=1, final_eval=False, progress=False)
    cfg = TrainConfig(**run, task_options={"loss_scale": 2.0}, out=str(tmp_path / "r"))
    assert (cfg.preset, cfg.batch_size, cfg.tokenizer, cfg.task_options.loss_scale) == ("tiny", 4, "char", 2.0)
    twice, once = train(cfg, corpus=corpus), train(TrainConfig(**run), corpus=corpus)
    assert twice.metrics[0]["train_loss"] == pytest.approx(2 * once.metrics[0]["train_loss"], rel=1e-5)
    assert json.loads((tmp_path / "r" / "train_config.json").read_text())["task_options"] == {"loss_scale": 2.0}
    with pytest.raises(ValueError, match=r"changed config \(loss_scale: 2.0 -> 3.0\)"):
        TrainConfig.for_resume(tmp_path / "r", task_options={"loss_scale": 3.0})
    with pytest.raises(ValueError, match="loss_scale must be > 0, got 0"):
        TrainConfig(task="scaled", task_options={"loss_scale": 0}, max_steps=1)
    with pytest.raises(TypeError, match="copy is an option of --task translate, not of --task scaled"):
        TrainConfig(task="scaled", copy=True, max_steps=1)


def test_a_registered_tasks_option_is_a_flag_of_qkv_train_with_its_help(scaled, tmp_path):
    from qkv.cli import build_parser
    from qkv.cli.train import task_flags, train_config

    flags = task_flags()
    assert flags["--loss-scale"].help == "scaled: the loss is multiplied by this"
    assert flags["--chat-template"].help.startswith("sft, dpo: ")  # one option of two tasks: one flag
    assert flags["--label-smoothing"].help.startswith("translate: label smoothing") and "; dpo: " in flags[
        "--label-smoothing"].help
    assert flags["--copy"].negatable and not flags["--packing"].negatable
    args = build_parser().parse_args(["train", "--task", "scaled", "--loss-scale", "2.5", "--max-steps", "1",
                                      "--out", str(tmp_path / "r")])
    assert train_config(args).task_options.loss_scale == 2.5
    args = build_parser().parse_args(["train", "--task", "translate", "--no-copy", "--max-steps", "1",
                                      "--out", str(tmp_path / "t")])
    assert train_config(args).task_options.copy is False


def test_register_refuses_what_is_not_a_task():
    with pytest.raises(TypeError, match="subclass of qkv.training.tasks.Task"):
        register("x", object)
    with pytest.raises(TypeError, match="defaults must be a TaskDefaults, got None"):
        register("x", type("NoDefaults", (LanguageModelTask,), {"defaults": None}))
    assert "x" not in TASKS


def test_translation_refuses_fsdp_in_one_line():
    from qkv.training.recipe import TrainConfig

    with pytest.raises(ValueError, match="--task translate trains with --sharding ddp or none, not fsdp"):
        TrainConfig(task="translate", sharding="fsdp").validate()


def test_the_learning_rate_follows_the_width_rule_and_the_device_picks_the_preset(monkeypatch):
    from qkv import runtime

    # lr = min(task lr, lr_width / d_model) from scratch; a fine-tune keeps the task's lr
    assert [TrainConfig(preset=p, max_steps=1).lr for p in ("tiny", "demo", "gpu", "gpt2")] == [6e-3, 6e-3, 1.5e-3, 7.5e-4]
    assert TrainConfig(task="translate", preset="paper-base", max_steps=1).lr == 5e-4
    assert TrainConfig(preset="gpt2", lr=1e-3, max_steps=1).lr == 1e-3  # a given lr wins
    gpu = TrainConfig(preset="gpu", max_steps=1, device="cpu")
    assert (gpu.batch_size, gpu.optimizer, gpu.schedule, gpu.compile) == (128, "muon", "wsd", True)
    assert TrainConfig(preset="tiny", max_steps=1).optimizer == "adamw"  # the unit tests' preset keeps AdamW
    assert TrainConfig(max_steps=1, device="cpu").preset == "demo"
    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime.torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(runtime.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert TrainConfig(max_steps=1).preset == "gpu" and TrainConfig(max_steps=1, device="cuda:0").preset == "gpu"
    assert TrainConfig(max_steps=1, device="cpu").preset == "demo"
    assert TrainConfig(task="translate", max_steps=1, device="cuda").preset == "translate"  # no GPU preset of its own
