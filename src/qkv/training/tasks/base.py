"""The interface between the training recipe and a task.

The recipe calls, in order: ``prepare`` (data, tokenizer), ``model_config`` and ``build_model``
(the model), then per step ``draw`` + ``loss``, every ``eval_interval`` steps ``evaluate``, at the
end ``final_metrics``; ``describe``/``summary`` feed the progress header and summary.json.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from ...data import load_tokenizer, tokenizer_from_json
from ...models import ModelConfig


class Task:
    """One kind of training. Subclasses fill in every method below."""

    name: str = ""
    model_class: type[nn.Module]

    def __init__(self, *, corpus: Any = None, tokenizer: Any = None) -> None:
        """``corpus``, ``tokenizer``: ready data the task would otherwise read or fit."""
        self.corpus, self.tokenizer = corpus, tokenizer

    def ready_tokenizer(self, cfg, run, dist, fit: Callable[[], Any]) -> Any:
        """The tokenizer given; on --resume the run's own (absent when it stopped before a checkpoint);
        else ``fit()`` — on rank 0, shared with the other ranks."""
        if self.tokenizer is not None:
            return self.tokenizer
        if cfg.resume and run is not None and run.has(run.TOKENIZER):
            return load_tokenizer(run.path)
        return fit() if dist.world == 1 else tokenizer_from_json(dist.share(lambda: fit().to_json()))

    def prepare(self, cfg, run, dist) -> None:
        """Read the data and fit (or, on resume, reload from ``run``) the tokenizer."""
        raise NotImplementedError

    def model_config(self, cfg) -> ModelConfig:
        """The model's shape: the preset or ``cfg.model``, with this task's vocabulary."""
        raise NotImplementedError

    def build_model(self, mconf: ModelConfig) -> nn.Module:
        """The model training starts from: a new ``model_class(mconf)``, or a checkpoint's."""
        return self.model_class(mconf)

    def check(self, cfg, mconf: ModelConfig, dist) -> None:
        """Refuse, before training, settings the data cannot serve (a window longer than the text …)."""

    tokens_per_step: int = 0  # nominal tokens of one optimizer step (budgets, throughput)

    def draw(self, generator: torch.Generator, cfg, dist) -> Any:
        """This rank's micro-batches of one optimizer step, drawn from ``generator`` (shared by every
        rank, so N processes see exactly the batch one process would): an iterable of ``grad_accum``."""
        raise NotImplementedError

    def loss(self, model: nn.Module, micro: Any) -> Tensor:
        """Mean training loss of one micro-batch (what is back-propagated)."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, *, autocast: Callable, dist) -> tuple[dict, int]:
        """Periodic validation on a sample: (fields of the metrics record, units evaluated)."""
        raise NotImplementedError

    final_units: int = 0  # units the final evaluation will take (the time budget keeps that much back)

    def final_metrics(self, model: nn.Module, *, autocast: Callable, dist, progress: bool) -> dict:
        """The summary's measured numbers, on the whole validation split."""
        raise NotImplementedError

    def describe(self) -> str:
        """The data in one phrase for the progress header."""
        raise NotImplementedError

    def summary(self) -> dict:
        """What the summary reports about the data and tokenizer."""
        raise NotImplementedError

    def result_lines(self, summary: dict) -> list[str]:
        """The lines ``qkv train`` prints at the end."""
        raise NotImplementedError

    def info(self, summary: dict) -> dict[str, str]:
        """What ``qkv info`` shows of a finished run's summary, by label."""
        raise NotImplementedError
