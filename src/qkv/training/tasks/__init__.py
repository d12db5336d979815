"""What a training run learns: a task says what a batch is, how the loss and the validation
metrics are computed, which model it trains and what its summary reports. The training recipe
(``qkv.training.recipe``) knows nothing else; a new task plugs in here.

    language modelling (``lm``)   GPT, next-token cross-entropy, bits per character
    translation (``translate``)   Transformer, label-smoothed cross-entropy, BLEU / chrF
"""
from __future__ import annotations

from .base import Task
from .language_model import LanguageModelTask
from .translation import TranslationTask

TASKS: dict[str, type[Task]] = {"lm": LanguageModelTask, "translate": TranslationTask}


def register(name: str, cls: type[Task]) -> None:
    TASKS[name] = cls


def make_task(name: str, **inputs) -> Task:
    """A new task; ``inputs`` are ready data (e.g. ``corpus``, ``tokenizer``) it would otherwise read."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name](**inputs)


__all__ = ["TASKS", "Task", "LanguageModelTask", "TranslationTask", "make_task", "register"]
