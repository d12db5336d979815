"""The interface between the training recipe and a task.

A task declares what is its own: ``options_type``, its settings (a ``TaskOptions`` dataclass, stored in
``TrainConfig.task_options``), and ``defaults``, what a ``TrainConfig`` left None takes from it (preset,
batch, learning rate, warmup, tokenizer, the command's budget).

The run calls, in order: ``prepare`` (data, tokenizer), ``model_config`` and ``build_model`` (the model),
``check``; then per step ``draw`` (the global batch), which the loop cuts for the ranks and micro-batches, and
``batch`` + ``loss`` on each cut (``TaskBatches``); every ``eval_interval`` steps and at the end the one evaluator
sums ``eval_sums`` over ``held_out`` items (``TaskHeldOut``); ``describe``/``summary`` feed the progress header
and summary.json (``TaskProse``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor, nn

from ...data import load_tokenizer, tokenizer_from_json
from ...models import PRESETS, ModelConfig
from ..run_dir import load_base


def check_option_type(name: str, value, default) -> None:
    """``value`` has the type of the option's ``default``: a bool, a str, an int or a (finite) number."""
    if isinstance(default, bool):
        ok, expected = isinstance(value, bool), "True or False"
    elif isinstance(default, str):
        ok, expected = isinstance(value, str), "a str"
    elif isinstance(default, int):
        ok, expected = isinstance(value, int) and not isinstance(value, bool), "an int"
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        expected = "a finite number"
    else:
        return
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def option(default, help: str, *, choices: tuple[str, ...] | None = None):
    """A task option's field: its default and its help, from which `qkv train` makes the flag ``--NAME``
    (a bool: a switch; ``choices``: the values it takes)."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class TaskOptions:
    """A task's own settings, validated once when made; this base has none (language modelling needs none).

    A subclass declares each option as a field made by ``option(default, help)`` (`qkv train`'s flag is made
    from it, TRL's ``HfArgumentParser`` manner); a value must have the default's type
    (``check_option_type``), and ``__post_init__`` may check more. Options define the run: ``--resume``
    refuses to change them, except those named in ``FREE_ON_RESUME`` (they only shape the final report).
    """

    FREE_ON_RESUME: ClassVar[tuple[str, ...]] = ()
    SAVED_BEFORE: ClassVar[dict[str, Any]] = {}  # what a saved run that lacks an option meant (the option came later)

    def __post_init__(self) -> None:
        for f in fields(self):
            check_option_type(f.name, getattr(self, f.name), f.default)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, value, *, task: str) -> "TaskOptions":
        """These options from themselves, a dict of their fields (a saved run's), or None (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.names()))
            if unknown:
                takes = f"it takes {list(cls.names())}" if cls.names() else "it has none"
                raise ValueError(f"unknown options of task {task!r}: {unknown}; {takes}")
            return cls(**value)
        raise ValueError(f"task_options of task {task!r} must be a {cls.__name__} or a dict of its fields, "
                         f"got {type(value).__name__}")


# A run's optimizer, schedule, precision and compilation unless its preset sets them; NATIVE: bf16 where the device
# computes it natively (qkv.runtime.native_bf16), fp32 elsewhere.
NATIVE = "native"
RECIPE = {"optimizer": "adamw", "schedule": "cosine", "bf16": False, "compile": False}
# What every preset trained from scratch takes (but "tiny", the unit tests' AdamW model): Muon for the hidden
# matrices, warmup-stable-decay, bf16 where native. docs/training.md has the runs behind it.
SCRATCH = {"optimizer": "muon", "schedule": "wsd", "bf16": NATIVE}


@dataclass(frozen=True)
class TaskDefaults:
    """What a ``TrainConfig`` left None takes from its task, and the budget ``qkv train`` gives when none is.

    The learning rate follows one rule for every model trained from scratch (a preset or a shape of one's own):
    ``lr = min(lr, lr_width / d_model)`` — the peak shrinks as 1/width (μP's rule for hidden matrices, which
    GPT-3's table follows: 6e-4 × 768 ≈ 2e-4 × 2048 ≈ 0.4), and never exceeds the task's ``lr``, the peak
    tuned on its small default. A fine-tune takes ``lr``.
    """

    preset: str
    batch_size: int  # sequences (pairs) per optimizer step
    lr: float  # the peak learning rate of a fine-tune, and the most any run from scratch takes
    warmup_steps: int
    tokenizer: tuple[str, int | None] = ("char", None)  # (kind, BPE vocabulary) unless the preset has its own
    preset_tokenizers: dict[str, tuple[str, int]] = field(default_factory=dict)  # by preset (a preset's model only)
    minutes: float = 3.0
    data: str = "the task's default data"  # what a run without --data learns from, in words (qkv info)
    preset_recipes: dict[str, dict] = field(default_factory=dict)  # RECIPE's fields by preset, trained from scratch
    lr_width: float | None = None  # the rule above: lr = lr_width / d_model (None: ``lr`` for every run)
    gpu_preset: str | None = None  # the default preset where the run's device is a GPU (None: ``preset``)
    preset_batches: dict[str, int] = field(default_factory=dict)  # batch_size by preset (a preset's model only)

    def tokenizer_for(self, preset: str | None) -> tuple[str, int | None]:
        """(kind, vocabulary) for a run of ``preset`` (None: a model of its own shape)."""
        return self.preset_tokenizers.get(preset, self.tokenizer)

    def recipe_for(self, preset: str | None) -> dict:
        """Optimizer, schedule, precision and compilation of a run of ``preset`` trained from scratch (None: any
        other run): RECIPE with what the preset sets instead."""
        return RECIPE | self.preset_recipes.get(preset, {})

    def preset_for(self, device: str) -> str:
        """The default preset on ``device`` ("cpu" or "cuda")."""
        return self.gpu_preset if device == "cuda" and self.gpu_preset else self.preset

    def value(self, name: str, preset: str, model: ModelConfig | None, *, scratch: bool = True):
        """The default of ``name`` (preset, batch_size, lr or warmup_steps) for a run of ``preset`` or ``model``."""
        if name == "lr":
            shape = model if model is not None else PRESETS.get(preset)
            return self.lr if not scratch or self.lr_width is None or shape is None else \
                min(self.lr, float(f"{self.lr_width / shape.d_model:.3g}"))  # three digits: 7.5e-4, not 7.49…e-4
        if name == "batch_size" and model is None:
            return self.preset_batches.get(preset, self.batch_size)
        return getattr(self, name)


class TaskProse:
    """What a task says in words and numbers, for people and reports: the progress header, summary.json, the
    lines ``qkv train`` ends with, ``qkv info``. A task fills in every method below."""

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


class TaskBatches:
    """What the loop asks a task for each optimizer step. The task gives the step's *global* batch (``draw``) and
    a loss over any part of it; the loop cuts the batch for the ranks and the accumulation steps and normalises
    the loss once (``qkv.training.loop.micro_batches``), so a task never sees a rank or a micro-batch count.

    Items are the indices of a split's rows (or windows, pairs ...), whatever ``batch`` turns into model inputs."""

    # "sum": ``loss`` is a sum over the batch's ``units`` (tokens, examples, pairs), and the loop divides by the
    # units of the whole step, over every rank and micro-batch. "mean": ``loss`` is already a mean over its
    # micro-batch, and micro-batches (of equal size) weigh alike.
    reduction: ClassVar[str] = "sum"
    tokens_per_step: int = 0  # nominal tokens of one optimizer step (budgets, throughput)

    def draw(self, generator: torch.Generator, step: int, size: int) -> Tensor:
        """The ``size`` items (size,) of optimizer step ``step`` (0-based), drawn from ``generator`` (every rank
        holds the same one) or ordered by the step (``qkv.training.sampler``): the same on every rank."""
        raise NotImplementedError

    unit_counts: dict[str, Tensor] | None = None  # each split's units per item, where a task tabulates them

    def units(self, items: Tensor | list[int], split: str = "train") -> Tensor:
        """What ``loss`` sums over, per item (len(items),), read on the host: ``unit_counts[split]`` of the items
        (a token-level task's counted tokens), else one each (a mean per example)."""
        if self.unit_counts is None:
            return torch.ones(len(items), dtype=torch.long)
        return self.unit_counts[split][torch.as_tensor(items, dtype=torch.long)]

    def batch(self, items: Tensor | list[int], split: str = "train") -> Any:
        """The items of ``split`` ("train" or "val") as model inputs, on the run's device."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        """The training loss of ``batch``: summed over its ``units`` (or a mean, where ``reduction`` says)."""
        raise NotImplementedError


class TaskHeldOut:
    """What the one evaluator (``qkv.training.evaluator``) asks a task: which held-out items (``eval_sample``,
    ``eval_all``, set by ``check``), and the sums over a batch of them that make its metrics. A token-level task
    needs nothing more: its held-out loss is its ``loss`` summed and divided by its ``units``."""

    eval_fields: ClassVar[tuple[str, ...]] = ("val_loss",)  # the metrics: each a sum over items / their units
    eval_batch_size: int = 32  # held-out items per forward
    final_units: int = 0  # units the final evaluation will take (the time budget keeps that much back)
    eval_sample: list[int]  # the held-out items of each periodic validation
    eval_all: list[int]  # the held-out items of the final evaluation: the whole split

    def eval_loss(self, model: nn.Module, batch: Any) -> Tensor:
        """The held-out loss summed over ``batch``: the training loss by default (a "sum" task's)."""
        return self.loss(model, batch)

    def eval_sums(self, model: nn.Module, batch: Any, items: list[int]) -> Tensor:
        """The sums of each of ``eval_fields`` over ``batch``, then the units they are divided by: (fields + 1,)."""
        loss = self.eval_loss(model, batch).detach().double()
        return torch.stack([loss, torch.zeros_like(loss) + int(self.units(items, "val").sum())])

    def val_metrics(self, sums: list[float], *, final: bool) -> dict:
        """The metrics record's fields from the evaluator's ``sums`` (``eval_sums`` added over every item)."""
        return {name: s / max(1.0, sums[-1]) for name, s in zip(self.eval_fields, sums)}

    def decoded_metrics(self, model: nn.Module, *, autocast: Callable, dist) -> dict:
        """What the final evaluation adds beyond the held-out sums (a task that decodes: its scores)."""
        return {}


class Task(TaskBatches, TaskHeldOut, TaskProse):
    """One kind of training: its data and its loss. Subclasses fill in ``prepare``, ``check`` (setting the held-out
    items), ``draw``, ``batch``, ``loss`` and ``TaskProse``'s methods, and declare ``defaults`` (and
    ``options_type`` if the task has settings of its own)."""

    name: str = ""
    model_class: type[nn.Module]
    options_type: type[TaskOptions] = TaskOptions
    defaults: TaskDefaults
    bpe_only: bool = False  # trains a byte-level BPE alone (a conversation task: its chat markers are special tokens)

    @classmethod
    def check_config(cls, cfg) -> None:
        """Refuse general settings this task cannot train with, before the defaults fill ``cfg`` in: here a
        tokenizer other than a byte-level BPE where the task is ``bpe_only``."""
        if cls.bpe_only and cfg.tokenizer not in (None, "bpe"):
            why = f"the run {cfg.init_from} has a {cfg.tokenizer} tokenizer" if cfg.init_from else \
                f"--tokenizer {cfg.tokenizer} is for --task lm"
            raise ValueError(f"--task {cls.name} trains a byte-level BPE (its chat markers are special tokens); {why}")

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
        shape = cfg.model if cfg.model is not None else PRESETS[cfg.preset]
        return replace(shape, vocab_size=self.tokenizer.vocab_size)

    def build_model(self, mconf: ModelConfig) -> nn.Module:
        """The model training starts from: a new ``model_class(mconf)``, or a checkpoint's."""
        return self.model_class(mconf)

    def check(self, cfg, mconf: ModelConfig, dist) -> None:
        """Refuse, before training, settings the data cannot serve (a window longer than the text …); the
        device the batches go to is ``dist.device``."""

    def run_files(self) -> dict[str, str]:
        """Text files the task keeps in the run directory (name -> content), written once the run begins."""
        return {}


class DecoderTask(Task):
    """A task that trains a GPT: from a preset, a shape of its own, or a base checkpoint (``self.base``, which
    ``prepare`` loads for --init-from or --init-from-hf)."""

    base = None  # a ``qkv.training.finetune.Base``

    def read_base(self, cfg) -> None:
        """``self.base``: the checkpoint ``cfg`` starts from, if any (its weights, shape and tokenizer); on --resume
        it must be the same checkpoint (``cfg.init_sha256``), which a new run records."""
        if cfg.base_source is not None:
            self.base = load_base(cfg.base_source, expect_sha256=cfg.init_sha256)
            cfg.init_sha256 = self.base.sha256

    def model_config(self, cfg) -> ModelConfig:
        if self.base is not None:
            return self.base.model.config  # vocab_size: the checkpoint's embeddings (its tokenizer may use fewer)
        return super().model_config(cfg)

    def build_model(self, mconf: ModelConfig) -> nn.Module:
        return self.base.model if self.base is not None else super().build_model(mconf)

    @staticmethod
    def context(cfg, mconf: ModelConfig) -> int:
        """The training context T: ``--context``, else the model's max_len; ValueError where learned positions
        end before it."""
        T = cfg.context or mconf.max_len
        if T > mconf.max_len and mconf.position.kind == "learned":
            raise ValueError(f"context {T} exceeds max_len {mconf.max_len} of learned positions")
        return T

