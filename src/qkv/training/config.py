"""How to train: ``TrainConfig`` (a task, a model, data, a budget, the recipe's settings; validated, saved with a run,
read back for ``--resume``) and what a resume may not change."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any

import torch

from ..checks import check_positive_int
from .run_dir import RunDir, run_base_tokenizer
from .finetune import DEFAULT_LORA_TARGETS, BaseSource, base_source
from ..models import PRESETS, ModelConfig
from ..runtime import device_type, native_bf16
from .optim import OPTIMIZERS, SCHEDULES, check_optimizer_options, default_warmup, ratio_warmup
from .sharding import check_sharding
from .tasks import TASKS, Task, TaskOptions, option_owners, task_options, task_type
from .tasks.base import NATIVE, RECIPE


# Fields that define a run: --resume refuses to change them (the budget may grow, the rest may not). The
# task's options are compared one by one, but for those its options type leaves free (FREE_ON_RESUME).
RESUME_FIXED = ("task", "task_options", "preset", "model", "init_sha256", "lora", "lora_alpha", "lora_targets",
                "data", "tokenizer", "vocab_size", "context", "batch_size", "grad_accum", "lr", "min_lr_ratio",
                "warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip", "seed", "bf16", "optimizer", "muon_lr",
                "schedule")
TASK_DEFAULTED = ("preset", "batch_size", "lr", "warmup_steps")  # None: the task's (Task.defaults)


def setting(default, help: str, *, group: str, choices=None, also: dict[str, str] | None = None):
    """A TrainConfig field that `qkv train` makes the flag --NAME of (``qkv.cli.train.train_flags``, TRL's
    ``HfArgumentParser`` manner): its type from the annotation (a bool: a switch, --no-NAME too unless it defaults
    to False), ``help``, the ``group`` of `qkv train --help` it is listed in, the values it takes (``choices``: any
    container, read when the parser is made) and ``also``: another flag for it -> that flag's help."""
    return field(default=default, metadata={"help": help, "group": group, "choices": choices, "also": also or {}})



@dataclass(init=False)
class TrainConfig:
    """How to train. A budget is required: ``max_steps``, ``max_tokens`` or ``max_minutes``
    (the first reached ends the run; the schedule follows whichever is furthest along).

    What only one task uses lives in ``task_options``, that task's ``options_type`` (e.g.
    ``TranslationOptions``), validated by it: given as that dataclass or a dict of its fields
    (``TrainConfig(task="translate", task_options={"copy": False})``), read as ``cfg.task_options.copy``.
    Fields are keywords; those made by ``setting`` are also `qkv train`'s flags, their help said once, here.
    """

    task: str = setting("lm", "lm (a GPT learns the next token; default), translate (the paper's encoder-decoder "
                        "learns English -> --target-lang from sentence pairs) or sft (a GPT learns the assistant's "
                        "turns of conversations: --data FILE.jsonl in messages, sharegpt or alpaca form) or dpo "
                        "(preference pairs: prompt, chosen, rejected)", group="task", choices=TASKS)
    task_options: TaskOptions | dict | None = None  # None: the task's defaults (lm has none)
    preset: str | None = setting(None, "model preset, listed below (default: demo for lm, translate for translate)",
                                 group="task")  # None: the task's (Task.defaults)
    model: ModelConfig | None = None  # overrides the preset; vocab_size always comes from the tokenizer
    init_from: str | None = setting(None, "lm, sft, dpo: fine-tune this finished qkv run directory (one with "
                                    "summary.json): its final weights, model shape, tokenizer and (an sft or dpo "
                                    "run's) chat template, with no export round trip; no --preset, shape flags, "
                                    "--vocab-size or another --tokenizer (the run has them); --out must be another "
                                    "directory", group="task")
    init_from_hf: str | None = setting(None, "lm, sft, dpo: fine-tune this Hugging Face decoder directory (GPT-2, "
                                       "LLaMA, GPT-NeoX, Qwen2, Qwen3, Mistral, Gemma 2 …; save_pretrained: "
                                       "config.json, model.safetensors, its tokenizer, kept unchanged)", group="task")
    init_sha256: str | None = None  # the base's identity (SHA-256 of its weights), recorded by the run itself
    lora: int | None = setting(None, "with --init-from or --init-from-hf: train rank-R LoRA adapters, the checkpoint "
                               "frozen", group="task")
    lora_alpha: float | None = setting(None, "LoRA scale numerator: adapters add (alpha / R) · B A (default 2R)",
                                       group="task")
    lora_targets: str | None = setting(None, "comma-separated layers to adapt (default attn: every projection of "
                                       "the self-attention, q_proj,k_proj,v_proj,out_proj or MLA's; also up_proj, "
                                       "down_proj, gate_proj, ff)", group="task")
    data: str | None = setting(None, "lm: a UTF-8 text file or a directory of them (default: the Python standard "
                               "library); translate: tab-separated 'source<TAB>target' lines or a directory of "
                               ".po/.mo catalogs (default: the system's gettext catalogs)", group="data",
                               also={"--pairs": "translate: the same as --data"})
    out: str | None = None  # run directory; None: write nothing
    resume: bool = False
    overwrite: bool = False
    tokenizer: str | None = setting(None, "char or bpe (byte-level BPE, Hugging Face tokenizers); default: the demo "
                                    "preset's bpe, char for every other preset", group="data", choices=("char", "bpe"))
    vocab_size: int | None = setting(None, "BPE vocabulary size (default: the preset's, else 1024)", group="data")
    context: int | None = setting(None, "training context length (default: the preset's max_len)", group="data")
    max_steps: int | None = setting(None, "optimizer steps (0: evaluate the starting model and write the summary)",
                                    group="budget")
    max_tokens: int | None = setting(None, "training tokens", group="budget")
    max_minutes: float | None = setting(None, "wall-clock training budget (default when no budget is given: 3 for "
                                        "lm, 10 for translate)", group="budget")
    batch_size: int | None = setting(None, "sequences per optimizer step, over all processes", group="optimizer")
    grad_accum: int = setting(1, "micro-batches per optimizer step", group="optimizer")
    lr: float | None = setting(None, "peak learning rate", group="optimizer")
    min_lr_ratio: float = 0.1  # the schedule ends at lr · min_lr_ratio
    optimizer: str | None = setting(None, "muon (Muon for the attention and feed-forward matrices, AdamW for "
                                    "embeddings, the output head, norms and biases; the default for the demo and "
                                    "translate presets trained from scratch) or adamw (every weight; the default for "
                                    "every other run, and those presets' before)", group="optimizer",
                                    choices=OPTIMIZERS)
    muon_lr: float | None = setting(None, "with --optimizer muon: Muon's peak learning rate (default: --lr; its "
                                    "updates are scaled to AdamW's size)", group="optimizer")
    schedule: str | None = setting(None, "wsd (warmup-stable-decay: warmup, constant, then linear decay over the last "
                                   "fifth of the budget; the default for the demo and translate presets trained from "
                                   "scratch) or cosine (warmup, then cosine decay over the rest of the budget; the "
                                   "default for every other run)", group="optimizer", choices=SCHEDULES)
    fused_adamw: bool = setting(False, "AdamW's fused kernel on the CPU too (always used on CUDA)", group="optimizer")
    warmup_steps: int | None = setting(None, "steps of linear warmup from 0 to --lr before the decay (default: the "
                                       "task's, 50 for lm, 40 translate, 20 sft, 10 dpo, and at most a tenth of "
                                       "--max-steps)", group="optimizer")
    warmup_ratio: float | None = setting(None, "warmup over this share of --max-steps, rounded up (as transformers' "
                                         "warmup_ratio); instead of --warmup-steps", group="optimizer")
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    eval_interval: int = setting(100, "steps between validations and checkpoints", group="run")
    eval_windows: int = 48  # validation windows per periodic evaluation; the final one uses all
    final_eval: bool = True  # score the whole validation text at the end (summary.json's val_bpc)
    seed: int = setting(1337, "seed of initialisation, batches and dropout (default 1337)", group="run")
    bf16: bool | None = setting(None, "bfloat16 autocast: products in bf16, weights and optimizer state in fp32 "
                                "(default: on for the demo and translate presets trained from scratch where the "
                                "hardware computes bf16 natively — AVX-512 BF16 or AMX on a CPU, a bf16 GPU — and off "
                                "for every other run)", group="machine")  # None: TaskDefaults.recipe_for's
    compile: bool | None = setting(None, "torch.compile the model (in the first step: the compile counts against "
                                   "--max-minutes; kernels kept in qkv's cache for the next run; default: on for the "
                                   "gpu preset trained from scratch)", group="machine")
    speed_layer: bool = setting(True, "attention through qkv's training path: q, k, v in one product, and with --bf16 "
                                "on a CPU the attention core in fp32 where that is faster (default: on, but under "
                                "fsdp; the same function)", group="machine")  # qkv.kernels.training
    sharding: str = setting("auto", "auto (default: ddp under torchrun, none in one process), none, ddp or fsdp "
                            "(FSDP2: weights, gradients and AdamW state split over the torchrun processes); ddp and "
                            "fsdp need torchrun --nproc_per_node N >= 2 (in one process they stop with exit status "
                            "2); fsdp saves its resume state as a distributed checkpoint that --resume reshards to "
                            "any number of processes (--sharding none: one)", group="machine")
    activation_checkpointing: bool = setting(False, "recompute each block's activations in the backward: less "
                                             "memory, about a third more compute", group="machine")
    device: str = setting("auto", "auto (default), cpu, cuda or cuda:N", group="machine")
    threads: int | None = setting(None, "CPU threads (default: the cores other processes leave free)",
                                  group="machine")
    progress: bool = True  # progress on stderr, rank 0 (qkv.training.progress: a bar, or lines in a log)

    def __init__(self, **given) -> None:
        """Every field by keyword; the task's options in ``task_options`` (TypeError for one by its own name)."""
        names = {f.name for f in fields(TrainConfig)}
        stray = [k for k in given if k not in names]
        if stray:
            raise keyword_error(given.get("task", "lm"), {k: given[k] for k in stray})
        for f in fields(TrainConfig):
            setattr(self, f.name, given.get(f.name, f.default))
        task = task_type(self.task)
        self.task_options = task_options(self.task, self.task_options)
        self.validate(task)

    def validate(self, task: type[Task] | None = None) -> None:
        """Fill in the task's defaults, then check every field (the options checked themselves)."""
        task = task or task_type(self.task)
        if self.preset is None and self.model is None and self.init_from_hf is None and self.init_from is None:
            self.preset = task.defaults.preset_for(device_type(self.device))
        self.resolve_warmup(task)
        for name in TASK_DEFAULTED:  # a run's base leaves the preset None: the run has the shape
            if getattr(self, name) is None and not (name == "preset" and self.init_from):
                setattr(self, name, task.defaults.value(name, self.preset, self.model,
                                                        scratch=self.base_source is None))
        if self.model is None and self.init_from is None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        if isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)
        check_base(self)
        task.check_config(self)
        if self.tokenizer is None:
            self.tokenizer, default_vocab = task.defaults.tokenizer_for(self.preset if self.model is None else None)
            self.vocab_size = self.vocab_size or (default_vocab if self.tokenizer == "bpe" else None)
        check_sharding(self.sharding)
        scratch = self.model is None and self.base_source is None and self.sharding != "fsdp"
        for name, value in task.defaults.recipe_for(self.preset if scratch else None).items():
            setattr(self, name, value if getattr(self, name) is None else getattr(self, name))
        self.bf16 = native_bf16(self.device) if self.bf16 == NATIVE else self.bf16
        self.check_device()
        check_optimizer_options(self)
        if self.tokenizer not in ("char", "bpe"):
            raise ValueError(f"tokenizer must be 'char' or 'bpe', got {self.tokenizer!r}")
        for name in ("max_tokens", "vocab_size", "context", "threads"):
            check_positive_int(name, getattr(self, name), optional=True)
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 0):
            raise ValueError(f"max_steps must be an int >= 0 (0: evaluate the starting model), got {self.max_steps!r}")
        for name in ("batch_size", "grad_accum", "eval_interval", "eval_windows"):
            check_positive_int(name, getattr(self, name))
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"max_minutes must be > 0, got {self.max_minutes}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need lr > 0 and 0 <= min_lr_ratio <= 1, got lr={self.lr}, min_lr_ratio={self.min_lr_ratio}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(f"warmup_steps, weight_decay and grad_clip must be >= 0, got {self.warmup_steps}, "
                             f"{self.weight_decay} and {self.grad_clip}")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite contradict each other; pass one")
        if self.resume and not self.out:
            raise ValueError("--resume needs --out (the run directory to continue)")

    def resolve_warmup(self, task: type[Task]) -> None:
        """``warmup_steps`` from ``warmup_ratio`` (then None), else the task's default for the step budget."""
        if self.warmup_ratio is not None:
            steps = ratio_warmup(self.warmup_ratio, self.max_steps)
            if self.warmup_steps is not None and self.warmup_steps != steps:
                raise ValueError(f"--warmup-steps {self.warmup_steps} and --warmup-ratio {self.warmup_ratio} "
                                 f"({steps} steps of {self.max_steps}) disagree; give one")
            self.warmup_steps, self.warmup_ratio = steps, None
        elif self.warmup_steps is None:
            self.warmup_steps = default_warmup(task.defaults.warmup_steps, self.max_steps)

    def check_device(self) -> None:
        """bf16 asked for on a GPU without it: refused here, before anything is read or written (a bad device
        name or a GPU the machine lacks is ``resolve_device``'s to refuse, at setup)."""
        if self.bf16 is True and device_type(self.device) == "cuda" and torch.cuda.is_available() \
                and not torch.cuda.is_bf16_supported():
            raise ValueError(f"--bf16: {torch.cuda.get_device_name()} does not compute bfloat16; train with --no-bf16")

    @property
    def base_source(self) -> BaseSource | None:
        """The checkpoint a fine-tune starts from (--init-from's run, --init-from-hf's directory); None from scratch."""
        return base_source({"init_from": self.init_from, "init_from_hf": self.init_from_hf})

    def to_dict(self) -> dict:
        """A JSON-ready dict: the general fields, the task's options as one object, the model's sections."""
        d = asdict(self)
        d["model"] = None if self.model is None else self.model.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from a saved train_config.json: the task's options in ``task_options``. The one place a config
        is read with them flat beside the general fields, as qkv wrote it before ``task_options`` (this task's
        options are read, any other task's dropped). An option the file lacks takes its ``SAVED_BEFORE`` value,
        a recipe setting the file lacks its ``RECIPE`` value."""
        if not isinstance(d, dict):
            raise TypeError(f"a train config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        options_type = task_type(d.get("task", "lm")).options_type
        flat = {k: v for k, v in d.items() if k not in known}
        stray = [k for k in flat if not option_owners(k) or "task_options" in d]
        if stray:
            raise ValueError(f"unknown TrainConfig keys: {sorted(stray)}")
        saved = d.get("task_options") or {k: v for k, v in flat.items() if k in options_type.names()}
        if not isinstance(saved, dict):
            raise ValueError(f"task_options must be a JSON object, got {type(saved).__name__}")
        general = RECIPE | {k: v for k, v in d.items() if k in known}
        return cls(**(general | {"task_options": options_type.SAVED_BEFORE | saved}))

    @classmethod
    def for_resume(cls, out: str | os.PathLike, **overrides) -> "TrainConfig":
        """The saved config of run ``out`` with ``overrides`` applied (train() refuses changes
        to the fields that define the run; the budget and the device may change). A dict ``task_options``
        changes the saved options it names; an options dataclass replaces them."""
        run = RunDir(out)
        path = run / run.TRAIN_CONFIG
        if not path.is_file():
            run.check()
            raise ValueError(f"{out} has no {run.TRAIN_CONFIG}: it cannot be resumed")
        try:
            saved = cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise ValueError(f"{path} is corrupt: {e}") from None
        saved.out, saved.resume, saved.overwrite = str(out), True, False
        given = overrides.get("task_options")
        if isinstance(given, dict) and overrides.get("task", saved.task) == saved.task:
            overrides["task_options"] = task_options(saved.task, asdict(saved.task_options) | given)
        check_same_run(saved, overrides)
        return replace(saved, **overrides)

    @property
    def budget(self) -> str:
        parts = [f"{self.max_steps} steps" if self.max_steps else "",
                 f"{self.max_tokens} tokens" if self.max_tokens else "",
                 f"{self.max_minutes:g} min" if self.max_minutes else ""]
        return " / ".join(p for p in parts if p)


def check_base(cfg: TrainConfig) -> None:
    """--init-from, --init-from-hf: the checkpoint brings the model's shape and its own tokenizer (a Hugging
    Face directory's byte-level BPE, a run's own); --lora adapts it."""
    check_lora(cfg)
    source = cfg.base_source
    if source is None:
        return
    if cfg.init_from and cfg.init_from_hf:
        raise ValueError("--init-from (a qkv run) and --init-from-hf (a Hugging Face directory) both name the "
                         "base; give one")
    if cfg.task not in ("lm", "sft", "dpo"):
        raise ValueError(f"{source.flag} fine-tunes a decoder (task lm, sft or dpo), not task {cfg.task!r}")
    if cfg.model is not None:
        raise ValueError(f"{source.flag} takes the model's shape from the checkpoint; drop the shape flags")
    own = run_base_tokenizer(cfg.init_from) if source.kind == "run" else "bpe"
    if cfg.tokenizer not in (None, own) or cfg.vocab_size is not None:
        raise ValueError(f"{source.flag} keeps the checkpoint's own tokenizer; drop --tokenizer and --vocab-size")
    cfg.tokenizer = own
    if source.kind == "run":
        check_run_base(cfg)
    else:
        cfg.init_from_hf = os.path.abspath(cfg.init_from_hf)  # found again from any working directory


def check_run_base(cfg: TrainConfig) -> None:
    """--init-from RUN: no preset (the run has the shape), and never the run it writes (--out)."""
    if cfg.preset is not None:
        raise ValueError(f"--init-from takes the model's shape from the run; drop --preset {cfg.preset}")
    cfg.init_from = os.path.abspath(cfg.init_from)
    if cfg.out and os.path.realpath(cfg.out) == os.path.realpath(cfg.init_from):
        raise ValueError(f"--init-from {cfg.init_from} is also --out: the run would overwrite its own base; "
                         "write the fine-tune elsewhere")


def check_lora(cfg: TrainConfig) -> None:
    """``--lora R [--lora-alpha A] [--lora-targets NAMES]`` adapts a checkpoint; defaults α = 2r, attention."""
    if cfg.lora is None:
        if cfg.lora_alpha is not None or cfg.lora_targets is not None:
            raise ValueError("--lora-alpha and --lora-targets shape LoRA adapters: give --lora R too")
        return
    check_positive_int("lora (the adapters' rank)", cfg.lora)
    if cfg.base_source is None:
        raise ValueError("--lora adapts a checkpoint: give --init-from-hf DIR or --init-from RUN too")
    cfg.lora_alpha = 2.0 * cfg.lora if cfg.lora_alpha is None else cfg.lora_alpha
    if not cfg.lora_alpha > 0:
        raise ValueError(f"lora_alpha must be > 0, got {cfg.lora_alpha}")
    cfg.lora_targets = cfg.lora_targets or DEFAULT_LORA_TARGETS


def keyword_error(task: str, stray: dict) -> TypeError:
    """What TrainConfig says of keywords that are none of its fields: a task's option is pointed to
    ``task_options`` (and, another task's, to the task that has it)."""
    unknown = sorted(k for k in stray if not option_owners(k))
    words = [f"TrainConfig got unexpected keyword arguments {unknown}"] if unknown else []
    own = {k: v for k, v in stray.items() if task in option_owners(k)}
    if own:
        words.append(f"a task's options go in task_options, not by their own names: "
                     f"TrainConfig(task={task!r}, task_options={own!r})")
    words += [f"{k} is an option of --task {' or '.join(option_owners(k))}, not of --task {task} (a task's "
              f"options go in task_options)" for k in stray if option_owners(k) and k not in own]
    return TypeError("; ".join(words))


def run_changes(saved: TrainConfig, new: dict | TrainConfig) -> list[tuple[str, Any, Any]]:
    """(name, saved value, new value) of each field of RESUME_FIXED that ``new`` changes: the model's fields
    that differ, the task's options one by one."""
    new = new if isinstance(new, dict) else {k: getattr(new, k) for k in RESUME_FIXED}
    changes = []
    for k in RESUME_FIXED:
        if k == "task_options":
            changes += option_changes(saved.task_options, new.get("task_options"))
        elif k in new and new[k] != getattr(saved, k):
            old, cur = getattr(saved, k), new[k]
            if k == "model" and old is not None and cur is not None:
                old, cur = old.to_dict(), cur.to_dict()
                keys = [f for f in old if old[f] != cur[f]]
                old, cur = {f: old[f] for f in keys}, {f: cur[f] for f in keys}
            changes.append((k, old, cur))
    return changes


def option_changes(saved: TaskOptions, given: TaskOptions | dict | None) -> list[tuple[str, Any, Any]]:
    """The options ``given`` (the task's options, or a dict of some) changes, but for the free ones; none
    when it holds another task's options (the task's change says it)."""
    if is_dataclass(given) and type(given) is not type(saved):
        return []
    cur = asdict(given) if is_dataclass(given) else dict(given or {})
    return [(k, getattr(saved, k), cur[k]) for k in saved.names()
            if k in cur and k not in saved.FREE_ON_RESUME and cur[k] != getattr(saved, k)]


def check_same_run(saved: TrainConfig, new: dict | TrainConfig) -> None:
    diffs = [f"{k}: {old!r} -> {cur!r}" for k, old, cur in run_changes(saved, new)]
    if diffs:
        raise ValueError(f"--resume with a changed config ({'; '.join(diffs)}); "
                         "start a new run (--out elsewhere, or --overwrite) to train differently")
