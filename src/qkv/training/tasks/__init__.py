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

from dataclasses import is_dataclass, replace

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


def option_owner(name: str) -> str | None:
    """The first task with an option called ``name`` (None: no task has one)."""
    return next((task for task, cls in TASKS.items() if name in cls.options_type.names()), None)


def task_options(task: str, given=None, flat: dict | None = None) -> TaskOptions:
    """The options of ``task``: ``given`` (its options, a dict of their fields, or None: the defaults) with
    ``flat`` applied, options by their own names (``copy=False``). A None value keeps the default; another
    task's option is refused unless None or False (it then asks for nothing)."""
    cls, flat = task_type(task).options_type, flat or {}
    unknown = sorted(k for k in flat if option_owner(k) is None)
    if unknown:
        raise TypeError(f"TrainConfig got unexpected keyword arguments {unknown}")
    for name, value in flat.items():
        if name not in cls.names() and value is not None and value is not False:
            raise ValueError(f"{name} is an option of --task {option_owner(name)}, not of --task {task}")
    changes = {k: v for k, v in flat.items() if k in cls.names() and v is not None}
    options = cls.of(given, task=task)
    return replace(options, **changes) if changes else options


__all__ = ["TASKS", "Task", "TaskDefaults", "TaskOptions", "DPOOptions", "DPOTask", "LanguageModelTask", "SFTOptions",
           "SFTTask",
           "TranslationOptions",
           "TranslationTask", "make_task", "option_owner", "register", "task_options", "task_type"]
