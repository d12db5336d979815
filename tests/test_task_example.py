"""The "Adding a task" example of docs/training.md is a whole token-level task in one file that the loop trains
unchanged: the block runs and its held-out loss falls, and the loop cuts its batch into micro-batches and
normalises its summed loss as it does the built-in tasks' (the same step with --grad-accum 4 as with 1)."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def example_code(page: str = "docs/training.md", heading: str = "### Adding a task") -> str:
    """The first python block after ``heading`` on ``page``."""
    section = (ROOT / page).read_text(encoding="utf-8").split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def example():
    """The docs' block run as pasted (it registers its task and trains it), its names; the task unregistered after."""
    from qkv.training.tasks import TASKS

    module = sys.modules["docs_training_example"] = types.ModuleType("docs_training_example")  # for @dataclass
    try:
        exec(compile(example_code(), "docs/training.md", "exec"), module.__dict__)
        yield module.__dict__
    finally:
        TASKS.pop("changes", None)
        del sys.modules["docs_training_example"]


def test_the_docs_task_trains_with_the_loop_unchanged(example):
    losses = [m["val_loss"] for m in example["result"].metrics]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.05, losses
    assert example["result"].summary["val_loss"] == pytest.approx(losses[-1])


def test_the_loop_cuts_the_docs_task_for_accumulation(example):
    """The task knows no micro-batch: 4 of 4 strings take the step of 1 of 16, as for the built-in tasks."""
    from qkv.training import TrainConfig
    from qkv.training.recipe import train

    code = example_code()
    assert not any(word in code for word in ("grad_accum", ".rank", ".world", "backward("))  # the loop's business
    runs = [train(TrainConfig(task="changes", task_options=example["ChangesOptions"](length=16), max_steps=3,
                              eval_interval=1, grad_accum=accum, progress=False)) for accum in (1, 4)]
    for one, cut in zip(runs[0].metrics, runs[1].metrics, strict=True):
        assert one["train_loss"] == pytest.approx(cut["train_loss"], abs=1e-5)
        assert one["val_loss"] == pytest.approx(cut["val_loss"], abs=1e-5)
