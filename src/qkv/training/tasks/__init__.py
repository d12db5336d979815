"""What a training run learns: a task says what a batch is, how the loss and the validation
metrics are computed, which model it trains and what its summary reports, and declares its own
settings (``options_type``) and defaults. The training recipe (``qkv.training.recipe``) knows
nothing else; a new task plugs in by ``register``-ing its class.

    language modelling (``lm``)   GPT, next-token cross-entropy, bits per character
    translation (``translate``)   Transformer, label-smoothed cross-entropy, BLEU / chrF (TranslationOptions)
    chat fine-tuning (``sft``)    GPT, cross-entropy on the assistant's tokens of conversations (SFTOptions)
    preferences (``dpo``)         GPT, DPO / IPO / hinge loss on chosen and rejected answers (DPOOptions)
"""
from __future__ import annotations

from dataclasses import is_dataclass

from .base import Task, TaskDefaults, TaskOptions
from .dpo import DPOOptions, DPOTask
from .language_model import LanguageModelTask
from .sft import SFTOptions, SFTTask
from .translation import TranslationOptions, TranslationTask

TASKS: dict[str, type[Task]] = {"lm": LanguageModelTask, "translate": TranslationTask, "sft": SFTTask, "dpo": DPOTask}


def register(name: str, cls: type[Task]) -> None:
    """Make task ``cls`` trainable as ``TrainConfig(task=name)``; it declares ``defaults`` and may declare
    ``options_type``, a frozen ``TaskOptions`` dataclass."""
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"a task must be a subclass of qkv.training.tasks.Task, got {cls!r}")
    options = cls.options_type
    if not (isinstance(options, type) and issubclass(options, TaskOptions) and is_dataclass(options)):
        raise TypeError(f"{cls.__name__}.options_type must be a TaskOptions dataclass, got {options!r}")
    if not isinstance(getattr(cls, "defaults", None), TaskDefaults):
        raise TypeError(f"{cls.__name__}.defaults must be a TaskDefaults, got {getattr(cls, 'defaults', None)!r}")
    TASKS[name] = cls


def task_type(name: str) -> type[Task]:
    """The class of task ``name``; ValueError naming the tasks there are."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name]


def make_task(name: str, **inputs) -> Task:
    """A new task; ``inputs`` are ready data (e.g. ``corpus``, ``tokenizer``) it would otherwise read."""
    return task_type(name)(**inputs)


def option_owners(name: str) -> list[str]:
    """The tasks with an option called ``name`` (none: no task has one)."""
    return [task for task, cls in TASKS.items() if name in cls.options_type.names()]


def task_options(task: str, given=None) -> TaskOptions:
    """The options of ``task`` from ``given``: its options dataclass, a dict of their fields (validated against
    it: an unknown name is refused, naming the options it takes) or None (the defaults)."""
    return task_type(task).options_type.of(given, task=task)


__all__ = ["TASKS", "Task", "TaskDefaults", "TaskOptions", "DPOOptions", "DPOTask", "LanguageModelTask", "SFTOptions",
           "SFTTask", "TranslationOptions", "TranslationTask", "make_task", "option_owners", "register", "task_options",
           "task_type"]
