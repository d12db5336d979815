"""The explorer's expert-load panel (qkv.viz.experts): a mixture-of-experts run's MaxVio per layer over training
and tokens per expert, read back from metrics.jsonl, and the panel in a real browser; a dense run has none."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from qkv.data import Corpus
from qkv.models import ModelConfig
from qkv.training.recipe import TrainConfig, train
from qkv.training.run_dir import load_run
from qkv.viz import explorer
from qkv.viz.experts import MAX_SNAPSHOTS, expert_load_data, load_records
from test_explorer import ARTIFACTS, Watch, boot_json, browser, open_page  # noqa: F401  (the headless chromium)

TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(300))


def _train(out, moe) -> None:
    """A tiny run (2 blocks, the first dense when ``moe`` has layers) evaluated at steps 2 and 4."""
    model = ModelConfig(d_model=16,
                        attention=dict(num_heads=2, q_bias=False, k_bias=False, v_bias=False, out_bias=False),
                        position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False),
                        normalization=dict(kind="rmsnorm"), num_layers=3, max_len=32, moe=moe)
    cfg = TrainConfig(model=model, max_steps=4, batch_size=4, eval_interval=2, eval_windows=2, lr=1e-2, threads=1,
                      warmup_steps=1, progress=False, final_eval=False, out=str(out))
    train(cfg, corpus=Corpus(train=TEXT[:-2000], val=TEXT[-2000:], source="test"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An MoE run (block 0 dense, blocks 1–2 of 4 experts, aux-loss-free balancing) and a dense one."""
    d = tmp_path_factory.mktemp("runs")
    _train(d / "moe", dict(num_experts=4, d_expert=16, bias_update_speed=0.01, layers=("dense", "moe", "moe")))
    _train(d / "dense", None)
    return d / "moe", d / "dense"


def test_panel_data_is_the_runs_metrics(runs):
    moe, dense = runs
    x = expert_load_data(moe, load_run(moe).model)
    records = [json.loads(line) for line in (moe / "metrics.jsonl").read_text().splitlines()]
    assert x["layers"] == ["block 1", "block 2"] and x["experts"] == 4 and x["steps"] == [2, 4]
    assert x["maxvio"] == [r["maxvio"] for r in records]
    assert [s["step"] for s in x["snapshots"]] == [2, 4]
    summary = json.loads((moe / "summary.json").read_text())
    assert x["snapshots"][-1]["tokens"] == summary["expert_tokens"]
    assert sum(map(sum, x["snapshots"][0]["tokens"])) == 2 * 2 * 4 * 32 * 2  # 2 steps × 2 layers × B·T × top-2
    assert expert_load_data(moe)["layers"] == ["MoE layer 0", "MoE layer 1"]  # no model: layers by number
    assert expert_load_data(dense) is None  # metrics.jsonl without expert load: no panel


def test_many_evaluations_keep_every_maxvio_and_spread_snapshots(tmp_path):
    lines = [{"step": 10 * n, "expert_tokens": [[n, 1, 1]], "maxvio": [0.5]} for n in range(1, 201)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    x = expert_load_data(tmp_path)
    assert len(x["steps"]) == 200 and len(x["maxvio"]) == 200
    steps = [s["step"] for s in x["snapshots"]]
    assert len(steps) == MAX_SNAPSHOTS and steps[0] == 10 and steps[-1] == 2000 and steps == sorted(steps)
    assert expert_load_data(tmp_path / "nowhere") is None


@pytest.mark.parametrize("line, words", [
    ("{not json", "line 2 is not JSON"),
    ('{"step": 4, "expert_tokens": [[1, 2, 3]], "maxvio": [0.5]}', "line 2: expected expert_tokens as 2 × 4"),
    ('{"step": 4, "expert_tokens": [[1, 2, 3, 4], [1, 2, 3, -4]], "maxvio": [0.1, 0.2]}', "counts"),
    ('{"step": 4, "expert_tokens": [[1, 2, 3, 4], [1, 2, 3, 4]], "maxvio": [0.1]}', "one number per layer"),
    ('{"step": 4, "expert_tokens": [[1, 2, 3, 4], [1, 2, 3, 4]], "maxvio": [0.1, NaN]}', "one number per layer"),
])
def test_bad_metrics_are_refused_naming_the_line(tmp_path, line, words):
    good = {"step": 2, "expert_tokens": [[1, 2, 3, 4], [4, 3, 2, 1]], "maxvio": [0.6, 0.6]}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(good) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=words):
        load_records(tmp_path / "metrics.jsonl")


def test_command_adds_the_panel_for_an_moe_run_only(runs, tmp_path, capsys):
    from qkv import cli

    for run, has in zip(runs, (True, False)):
        out = tmp_path / f"{run.name}.html"
        assert cli.main(["explore", "--run", str(run), "--text", "def f", "--out", str(out)]) == 0
        assert ("experts" in boot_json(out.read_text())) is has
        assert ("expert load of 2 MoE layers" in capsys.readouterr().out) is has
    (runs[0] / "metrics.jsonl").rename(tmp_path / "kept.jsonl")  # a damaged log: one line, exit 2
    try:
        (runs[0] / "metrics.jsonl").write_text("{oops\n")
        assert cli.main(["explore", "--run", str(runs[0]), "--text", "def f", "--out", str(out)]) == 2
        assert "metrics.jsonl line 1 is not JSON" in capsys.readouterr().err
    finally:
        (tmp_path / "kept.jsonl").replace(runs[0] / "metrics.jsonl")


def test_notebook_view_has_the_panel_for_an_moe_run(runs):
    from qkv.viz.notebook import show

    moe, dense = runs
    for source in (moe, str(moe), load_run(moe)):
        assert boot_json(show(source, "def f").html)["experts"]["layers"] == ["block 1", "block 2"]
    assert "experts" not in boot_json(show(dense, "def f").html)


def test_panel_in_browser_draws_load_and_maxvio(browser, runs, tmp_path):  # noqa: F811
    moe, dense = runs
    run = load_run(moe)
    x = expert_load_data(moe, run.model)
    data = explorer.text_data(run.model, run.tokenizer, "def f(x):")
    page, watch = open_page(browser, tmp_path, explorer.page(data, title="moe run", experts=x))
    assert page.locator("#experts").is_visible() and "0 when every expert" in page.text_content("#experts")
    assert page.eval_on_selector("#xl-maxvio", "c => [c.dataset.lines, c.dataset.points]") == ["2", "2"]
    assert page.locator("#xl-keys span").all_text_contents() == ["block 1", "block 2"]
    grid = page.locator("#xl-map")
    assert grid.evaluate("c => [c.dataset.step, c.dataset.rows, c.dataset.cols]") == ["4", "2", "4"]
    latest = grid.evaluate("c => c.toDataURL()")
    page.select_option("#xl-step", "0")  # the evaluation at step 2
    assert grid.get_attribute("data-step") == "2" and grid.evaluate("c => c.toDataURL()") != latest
    cs = min(28, 520 // 4, 360 // 2)
    margin = grid.evaluate("c => c.width / (window.devicePixelRatio || 1)") - 4 * cs - 90  # the layer labels
    page.hover("#xl-map", position={"x": margin + 2 * cs + cs / 2, "y": 30 + cs + cs / 2})  # block 2, expert 2
    tokens = x["snapshots"][0]["tokens"][1][2]
    assert page.text_content("#xl-tip").startswith(f"block 2, expert 2\n{tokens} tokens")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#experts").screenshot(path=str(ARTIFACTS / "explorer-experts.png"))
    assert watch.errors == [] and watch.dialogs == []
    page.close()
    page, watch = open_page(browser, tmp_path, explorer.page(data, title="dense run", experts=None))
    assert not page.locator("#experts").is_visible() and page.locator("#xl-map").get_attribute("data-step") is None
    assert watch.errors == []
    page.close()


def test_served_page_keeps_the_panel_across_texts(browser, runs):  # noqa: F811
    from playwright.sync_api import expect

    run = load_run(runs[0])
    srv = explorer.make_server(run.model, run.tokenizer, port=0, experts=expert_load_data(runs[0], run.model))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()
        watch = Watch(page)
        page.goto(srv.url)
        assert page.locator("#experts").is_visible() and page.locator("#empty").is_visible()  # before any text
        page.fill("#text", "def f(x)")
        page.click("#run")
        expect(page.locator("#main")).to_be_visible()
        assert not page.locator("#empty").is_visible() and page.locator("#tokens .tok").count() > 0
        assert page.locator("#experts").is_visible() and page.locator("#xl-map").get_attribute("data-step") == "4"
        assert watch.errors == []
        page.close()
    finally:
        srv.shutdown()
        srv.server_close()
