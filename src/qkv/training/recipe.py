"""The training recipe: AdamW (or Muon for the hidden matrices), linear warmup + cosine (or
warmup-stable-decay) schedule (``qkv.training.optim``), gradient clipping and accumulation,
optional bf16 autocast and ``torch.compile``, periodic validation, checkpoints, DDP — for any task.

    setup → restore → repeat { step → [evaluate → save] } → summarise

Around one ``TrainState`` (counters, weights, optimizer, RNGs), captured and applied by one pair
of methods, so a field cannot be saved and forgotten on restore. What a batch, a loss and a
validation metric are, and the task's own settings, come from the task (``qkv.training.tasks``).

One process, or one per device under ``torchrun`` (DistributedDataParallel: gloo on CPU,
nccl on CUDA; rank 0 alone writes, holding the run directory's lock). Every optimizer step draws
one *global* batch from a seeded generator that every rank shares; micro-step m of rank r takes
its slice, so N processes see exactly the batch one process would.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..checks import check_positive_int
from .run_dir import RunDir
from ..fileio import DiskFullError
from ..kernels import accelerated
from .finetune import DEFAULT_LORA_TARGETS, add_lora, keyed_as_model, model_weights, set_model_weights
from ..models import PRESETS, ModelConfig
from ..runtime import (bf16_words, cpu_threads, deterministic_kernels, device_type,  # noqa: F401  (cpu_threads:
                       native_bf16, resolve_device, use_compile_cache)  # re-exported)
from .distributed import Dist
from .optim import build_optimizer, check_optimizer_options, lr_at, set_lr  # noqa: F401  (re-exported)
from .sharded_checkpoint import load_sharded, save_sharded
from .memory import MiB, PeakMemory, available_bytes, check_fits, estimate_memory, memory_line
from .sharding import (check_sharding, checkpoint_blocks, full_weights, load_full, model_blocks, resolve_sharding,
                       shard_model, whole_from)
from .tasks import Task, TaskOptions, make_task, option_owner, task_options, task_type
from .tasks.base import NATIVE, RECIPE
from .tasks.language_model import LN2, compressor_bpc, eval_starts, evaluate  # noqa: F401  (re-exported)

# Fields that define a run: --resume refuses to change them (the budget may grow, the rest may not). The
# task's options are compared one by one, but for those its options type leaves free (FREE_ON_RESUME).
RESUME_FIXED = ("task", "task_options", "preset", "model", "init_sha256", "lora", "lora_alpha", "lora_targets",
                "data", "tokenizer", "vocab_size", "context", "batch_size", "grad_accum", "lr", "min_lr_ratio",
                "warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip", "seed", "bf16", "optimizer", "muon_lr",
                "schedule")
PEAK_STEPS = 3  # the measured peak memory is reported after this many steps (on a GPU: at the next reading)
SYNC_STEPS = 25  # on a GPU the losses are read back (the host waits for the device) every this many steps
TASK_DEFAULTED = ("preset", "batch_size", "lr", "warmup_steps")  # None: the task's (Task.defaults)


@dataclass(init=False)
class TrainConfig:
    """How to train. A budget is required: ``max_steps``, ``max_tokens`` or ``max_minutes``
    (the first reached ends the run; the schedule follows whichever is furthest along).

    What only one task uses lives in ``task_options``, that task's ``options_type`` (e.g.
    ``TranslationOptions``), validated by it. Its options' own names also construct and read a config:
    ``TrainConfig(task="translate", copy=False).copy`` is ``cfg.task_options.copy``. Fields are keywords.
    """

    task: str = "lm"  # lm (GPT, next-token prediction) | translate (Transformer); see qkv.training.tasks
    task_options: TaskOptions | dict | None = None  # None: the task's defaults (lm has none)
    preset: str | None = None  # None: the task's (Task.defaults): demo for lm, translate for translate
    model: ModelConfig | None = None  # overrides the preset; vocab_size always comes from the tokenizer
    init_from_hf: str | None = None  # lm: fine-tune this Hugging Face GPT-2/LLaMA directory (its shape, tokenizer)
    init_sha256: str | None = None  # the base's identity (SHA-256 of its weights), recorded by the run itself
    lora: int | None = None  # LoRA rank r: train low-rank adapters, the base frozen (needs init_from_hf)
    lora_alpha: float | None = None  # adapters are scaled by lora_alpha / r; None: 2 · r
    lora_targets: str | None = None  # comma-separated layer names; None: the attention projections
    data: str | None = None  # None: the task's (the embedded corpus; the system's gettext catalogs)
    out: str | None = None  # run directory; None: write nothing
    resume: bool = False
    overwrite: bool = False
    tokenizer: str | None = None  # char | bpe; None: the task's for its preset (Task.defaults), else char
    vocab_size: int | None = None  # BPE only; None: the preset's, else 1024
    context: int | None = None  # T; None: the model's max_len
    max_steps: int | None = None
    max_tokens: int | None = None
    max_minutes: float | None = None
    batch_size: int | None = None  # sequences (pairs) per optimizer step, over all ranks and micro-steps
    grad_accum: int = 1
    lr: float | None = None
    min_lr_ratio: float = 0.1  # the schedule ends at lr · min_lr_ratio
    optimizer: str | None = None  # adamw | muon (Muon for the hidden matrices, AdamW for the rest); None: the
    # task's for its preset (TaskDefaults.recipe_for: muon for the demo and translate presets from scratch), else adamw
    muon_lr: float | None = None  # muon: its peak learning rate; None: lr (its updates match AdamW's RMS)
    schedule: str | None = None  # cosine | wsd (warmup-stable-decay: constant, then linear over the last fifth);
    # None as optimizer: the preset's (wsd for the demo and translate presets from scratch), else cosine
    fused_adamw: bool = False  # AdamW's fused kernel on the CPU too (always on CUDA)
    warmup_steps: int | None = None
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    eval_interval: int = 100  # steps between evaluations (and checkpoints)
    eval_windows: int = 48  # validation windows per periodic evaluation; the final one uses all
    final_eval: bool = True  # score the whole validation text at the end (summary.json's val_bpc)
    seed: int = 1337
    bf16: bool | None = None  # bfloat16 autocast; None: the preset's (TaskDefaults.recipe_for: the demo and translate
    # presets from scratch where the device computes bf16 natively, qkv.runtime.native_bf16), else False
    compile: bool | None = None  # torch.compile the model; None: the preset's (TaskDefaults.recipe_for: the gpu
    # preset from scratch), else False
    speed_layer: bool = True  # attention through qkv.kernels.training (same function, fewer and faster calls); not fsdp
    sharding: str = "auto"  # auto (ddp under torchrun, else none) | none | ddp | fsdp (FSDP2; qkv.training.sharding)
    activation_checkpointing: bool = False  # recompute each block's activations in the backward
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | None = None  # CPU threads; None: the cores other processes leave free (see cpu_threads)
    progress: bool = True  # progress on stderr, rank 0 (qkv.training.progress: a bar, or lines in a log)

    def __init__(self, **given) -> None:
        """Every field by keyword, and the task's options by their own names (``label_smoothing=0.2``)."""
        names = {f.name for f in fields(TrainConfig)}
        flat = {k: v for k, v in given.items() if k not in names}
        for f in fields(TrainConfig):
            object.__setattr__(self, f.name, given.get(f.name, f.default))
        task = task_type(self.task)
        self.task_options = task_options(self.task, self.task_options, flat)
        self.validate(task)

    def __getattr__(self, name: str):
        """An option of the task, read by its own name (``cfg.copy`` is ``cfg.task_options.copy``)."""
        options = self.__dict__.get("task_options")
        if isinstance(options, TaskOptions) and name in options.names():
            return getattr(options, name)
        owner = option_owner(name) if not name.startswith("__") else None
        hint = f" ({name} is an option of --task {owner}, not of --task {self.__dict__.get('task')})" if owner else ""
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}{hint}")

    def __setattr__(self, name: str, value) -> None:
        """An option set by its own name replaces ``task_options`` with a copy, validated again."""
        options = self.__dict__.get("task_options")
        if isinstance(options, TaskOptions) and name in options.names():
            name, value = "task_options", replace(options, **{name: value})
        object.__setattr__(self, name, value)

    def validate(self, task: type[Task] | None = None) -> None:
        """Fill in the task's defaults, then check every field (the options checked themselves)."""
        task = task or task_type(self.task)
        if self.preset is None and self.model is None and self.init_from_hf is None:
            self.preset = task.defaults.preset_for(device_type(self.device))
        for name in TASK_DEFAULTED:
            if getattr(self, name) is None:
                setattr(self, name, task.defaults.value(name, self.preset, self.model,
                                                        scratch=self.init_from_hf is None))
        if self.model is None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        if isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)
        self.check_base()
        task.check_config(self)
        if self.tokenizer is None:
            self.tokenizer, default_vocab = task.defaults.tokenizer_for(self.preset if self.model is None else None)
            self.vocab_size = self.vocab_size or (default_vocab if self.tokenizer == "bpe" else None)
        check_sharding(self.sharding)
        scratch = self.model is None and self.init_from_hf is None and self.sharding != "fsdp"
        for name, value in task.defaults.recipe_for(self.preset if scratch else None).items():
            setattr(self, name, value if getattr(self, name) is None else getattr(self, name))
        self.bf16 = native_bf16(self.device) if self.bf16 == NATIVE else self.bf16
        self.check_device()
        check_optimizer_options(self)
        if self.tokenizer not in ("char", "bpe"):
            raise ValueError(f"tokenizer must be 'char' or 'bpe', got {self.tokenizer!r}")
        for name in ("max_steps", "max_tokens", "vocab_size", "context", "threads"):
            check_positive_int(name, getattr(self, name), optional=True)
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

    def check_device(self) -> None:
        """bf16 asked for on a GPU without it: refused here, before anything is read or written (a bad device
        name or a GPU the machine lacks is ``resolve_device``'s to refuse, at setup)."""
        if self.bf16 is True and device_type(self.device) == "cuda" and torch.cuda.is_available() \
                and not torch.cuda.is_bf16_supported():
            raise ValueError(f"--bf16: {torch.cuda.get_device_name()} does not compute bfloat16; train with --no-bf16")

    def check_base(self) -> None:
        """--init-from-hf: the checkpoint brings the model's shape and its own byte-level BPE; --lora adapts it."""
        self.check_lora()
        if self.init_from_hf is None:
            return
        if self.task != "lm":
            raise ValueError(f"--init-from-hf fine-tunes a decoder (task lm), not task {self.task!r}")
        if self.model is not None:
            raise ValueError("--init-from-hf takes the model's shape from the checkpoint; drop the shape flags")
        if self.tokenizer not in (None, "bpe") or self.vocab_size is not None:
            raise ValueError("--init-from-hf keeps the checkpoint's own tokenizer; drop --tokenizer and --vocab-size")
        self.tokenizer = "bpe"
        self.init_from_hf = os.path.abspath(self.init_from_hf)  # found again from any working directory

    def check_lora(self) -> None:
        """``--lora R [--lora-alpha A] [--lora-targets NAMES]`` adapts a checkpoint; defaults α = 2r, attention."""
        if self.lora is None:
            if self.lora_alpha is not None or self.lora_targets is not None:
                raise ValueError("--lora-alpha and --lora-targets shape LoRA adapters: give --lora R too")
            return
        check_positive_int("lora (the adapters' rank)", self.lora)
        if self.init_from_hf is None:
            raise ValueError("--lora adapts a checkpoint: give --init-from-hf DIR too")
        self.lora_alpha = 2.0 * self.lora if self.lora_alpha is None else self.lora_alpha
        if not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.lora_alpha}")
        self.lora_targets = self.lora_targets or DEFAULT_LORA_TARGETS

    def to_dict(self) -> dict:
        """A JSON-ready dict: the general fields, the task's options as one object, the model's sections."""
        d = asdict(self)
        d["model"] = None if self.model is None else self.model.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from a saved train_config.json: today's (the options in ``task_options``), or the flat one
        written before tasks owned their options, which carried the translation options in every run (another
        task's are dropped). An option a run saved before it existed takes its ``SAVED_BEFORE`` value."""
        if not isinstance(d, dict):
            raise TypeError(f"a train config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        options_type = task_type(d.get("task", "lm")).options_type
        flat = {k: v for k, v in d.items() if k not in known}
        stray = [k for k in flat if option_owner(k) is None or "task_options" in d]
        if stray:
            raise ValueError(f"unknown TrainConfig keys: {sorted(stray)}")
        saved = d.get("task_options") or {k: v for k, v in flat.items() if k in options_type.names()}
        if not isinstance(saved, dict):
            raise ValueError(f"task_options must be a JSON object, got {type(saved).__name__}")
        general = RECIPE | {k: v for k, v in d.items() if k in known}  # a run saved before muon: its recipe
        return cls(**(general | {"task_options": options_type.SAVED_BEFORE | saved}))

    @classmethod
    def for_resume(cls, out: str | os.PathLike, **overrides) -> "TrainConfig":
        """The saved config of run ``out`` with ``overrides`` applied (train() refuses changes
        to the fields that define the run; the budget and the device may change)."""
        run = RunDir(out)
        path = run / run.TRAIN_CONFIG
        if not path.is_file():
            run.check()
            raise ValueError(f"{out} has no {run.TRAIN_CONFIG}: it cannot be resumed")
        try:
            saved = cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise ValueError(f"{path} is corrupt: {e}") from None
        saved.__dict__.update(out=str(out), resume=True, overwrite=False)
        _check_same_run(saved, overrides)
        return replace(saved, **overrides)

    @property
    def budget(self) -> str:
        parts = [f"{self.max_steps} steps" if self.max_steps else "",
                 f"{self.max_tokens} tokens" if self.max_tokens else "",
                 f"{self.max_minutes:g} min" if self.max_minutes else ""]
        return " / ".join(p for p in parts if p)


def run_changes(saved: TrainConfig, new: dict | TrainConfig) -> list[tuple[str, Any, Any]]:
    """(name, saved value, new value) of each field of RESUME_FIXED that ``new`` changes: the model's fields
    that differ, the task's options by their own names (a dict ``new`` may name them so, as ``copy=True``)."""
    new = new if isinstance(new, dict) else {k: getattr(new, k) for k in RESUME_FIXED}
    changes = []
    for k in RESUME_FIXED:
        if k == "task_options":
            changes += option_changes(saved.task_options, new)
        elif k in new and new[k] != getattr(saved, k):
            old, cur = getattr(saved, k), new[k]
            if k == "model" and old is not None and cur is not None:
                old, cur = old.to_dict(), cur.to_dict()
                keys = [f for f in old if old[f] != cur[f]]
                old, cur = {f: old[f] for f in keys}, {f: cur[f] for f in keys}
            changes.append((k, old, cur))
    return changes


def option_changes(saved: TaskOptions, new: dict) -> list[tuple[str, Any, Any]]:
    """The options ``new`` changes (its ``task_options``, then options by name), but for the free ones;
    none when ``new`` holds another task's options (the task's change says it)."""
    given = new.get("task_options")
    if is_dataclass(given) and type(given) is not type(saved):
        return []
    cur = asdict(given) if is_dataclass(given) else dict(given or {})
    cur |= {k: v for k, v in new.items() if k in saved.names() and v is not None}
    return [(k, getattr(saved, k), cur[k]) for k in saved.names()
            if k in cur and k not in saved.FREE_ON_RESUME and cur[k] != getattr(saved, k)]


def _check_same_run(saved: TrainConfig, new: dict | TrainConfig) -> None:
    diffs = [f"{k}: {old!r} -> {cur!r}" for k, old, cur in run_changes(saved, new)]
    if diffs:
        raise ValueError(f"--resume with a changed config ({'; '.join(diffs)}); "
                         "start a new run (--out elsewhere, or --overwrite) to train differently")


@dataclass
class TrainResult:
    """What ``train`` returns."""

    model: nn.Module  # the trained model, in eval mode
    tokenizer: object
    config: ModelConfig
    metrics: list[dict] = field(default_factory=list)  # one record per evaluation
    summary: dict = field(default_factory=dict)  # final numbers (empty when stopped early)
    path: Path | None = None


@dataclass
class TrainState:
    """Everything a checkpoint restores: counters, weights, optimizer and RNG states.

    The weights are saved here too, beside model.safetensors: a kill between the two files
    still resumes from one consistent snapshot. Under fsdp ``model`` and ``optimizer`` are None and
    ``sharded`` names the distributed checkpoint that holds them (written before this file, by every rank).
    """

    step: int = 0
    elapsed: float = 0.0  # wall-clock seconds of training so far (rank 0's clock)
    train_time: float = 0.0  # seconds spent in optimizer steps (throughput)
    tokens: int = 0  # training tokens consumed
    running: list = field(default_factory=lambda: [0.0, 0])  # training-loss sum and count since the last evaluation
    eval_cost: float = 0.0  # seconds per validation unit, from the latest evaluation
    model: dict | None = None
    optimizer: dict | None = None
    batch_rng: Tensor | None = None
    torch_rng: Tensor | None = None
    cuda_rng: Tensor | None = None
    sharded: str | None = None  # fsdp: the run's DCP checkpoint of weights and optimizer (RunDir.sharded_name)
    threads: int | None = None  # CPU threads the run trained with (a resume keeps them, see Recipe.run_threads)

    @classmethod
    def from_dict(cls, d: dict, *, where: str) -> "TrainState":
        known = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or not {"step", "model", "optimizer"} <= set(d) or set(d) - known:
            raise ValueError(f"{where} is not a qkv training state (fields {sorted(d) if isinstance(d, dict) else d})")
        return cls(**d)


# --- pieces ----------------------------------------------------------------------------

def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(all parameters, those that train): fewer train when LoRA freezes the base."""
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.parameters() if p.requires_grad)


def train_step(model, opt, micros, loss_fn: Callable[[nn.Module, Any], Tensor], *, grad_clip: float = 0.0,
               autocast=nullcontext, ddp: bool = False) -> Tensor:
    """One optimizer step over ``grad_accum`` micro-batches: gradients of the mean loss are accumulated
    (DDP syncs on the last one only), clipped to ``grad_clip`` and applied. Returns the mean loss (detached)."""
    micros = list(micros)
    step_loss = None
    for m, micro in enumerate(micros):
        with model.no_sync() if ddp and m < len(micros) - 1 else nullcontext():
            with autocast():
                loss = loss_fn(model, micro)
            (loss / len(micros)).backward()
        step_loss = loss.detach() / len(micros) if step_loss is None else step_loss + loss.detach() / len(micros)
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return step_loss


def plot_losses(path: Path, records: list[dict], summary: dict | None = None) -> None:
    """Loss curves (nats per token) and, for language modelling, validation bpc beside gzip's and xz's."""
    from matplotlib.figure import Figure

    from ..viz.figures import save_png

    steps, bpc = [r["step"] for r in records], "val_bpc" in records[-1]
    fig = Figure(figsize=(10 if bpc else 5, 4), layout="tight")
    axes = fig.subplots(1, 2 if bpc else 1)
    a = axes[0] if bpc else axes
    a.plot(steps, [r["train_loss"] for r in records], label="train")
    a.plot(steps, [r["val_loss"] for r in records], label="validation")
    a.set(xlabel="step", ylabel="loss (nats / token)", title="cross-entropy")
    a.legend()
    if bpc:
        b = axes[1]
        b.plot(steps, [r["val_bpc"] for r in records], label="model (validation)")
        for key, label, style in (("gzip_bpc", "gzip -9", "--"), ("xz_bpc", "xz -9e", ":")):
            if summary and key in summary:
                b.axhline(summary[key], color="gray", linestyle=style, label=f"{label} ({summary[key]:.2f})")
        b.set(xlabel="step", ylabel="bits per character", title="validation bits per character")
        b.legend()
    save_png(fig, path, dpi=100)


class Diverged(ValueError):
    """The loss became NaN or infinite: the run stops and keeps its last good checkpoint."""


class StopRequest:
    """Ctrl-C (SIGINT) asks the loop to stop at the next step boundary, save a checkpoint and exit.

    A second Ctrl-C interrupts at once (the last checkpoint on disk stays as it was).
    """

    def __init__(self) -> None:
        self.requested, self._previous = False, None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Interrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C after saving a checkpoint."""



# --- the recipe ----------------------------------------------------------------------------

class Recipe:
    """One training run of ``cfg.task``: setup, restore, step, evaluate, save, summarise."""

    def __init__(self, cfg: TrainConfig, dist: Dist, *, stop_at: int | None = None, **task_inputs) -> None:
        self.cfg, self.dist, self.stop_at = cfg, dist, stop_at
        self.task = make_task(cfg.task, **task_inputs)
        self.run = RunDir(cfg.out) if cfg.out else None
        self.state, self.records = TrainState(), []
        self.last_saved: int | None = None
        self.sharded_saved: str | None = None  # the distributed checkpoint train_state.pt names

    # --- setup ---------------------------------------------------------------------------
    def check_out(self) -> TrainState | None:
        """Refuse a run directory that cannot take this run, before anything is read or written;
        on --resume, the saved state (None when the run stopped before its first checkpoint)."""
        cfg, run = self.cfg, self.run
        if run is None:
            return None
        if not cfg.resume:
            if run.path.exists() and not run.path.is_dir():
                raise ValueError(f"--out {run} exists and is not a directory")
            if not run.is_empty() and not cfg.overwrite:
                raise ValueError(f"{run} already exists; pass --resume to continue it or --overwrite to start again")
            return None
        if not run.has(run.TRAIN_CONFIG) or run.has(run.STATE):
            run.check()  # names what is missing; a run stopped before its first checkpoint passes
        _check_same_run(TrainConfig.for_resume(run.path), self.cfg)
        if run.has(run.STATE):
            return TrainState.from_dict(run.load_state(), where=str(run / run.STATE))
        if self.dist.is_main:
            print(f"qkv: {run} has no checkpoint yet (stopped before its first one): starting from step 0",
                  file=sys.stderr)
        return None

    def setup(self) -> TrainState | None:
        """Device, data and tokenizer (the task), threads, model and optimizer."""
        cfg, dist = self.cfg, self.dist
        self.device = dist.device = resolve_device(cfg.device, dist.local_rank, dist.local_world)
        if self.device.type == "cuda":  # fp32 products on tensor cores (TF32), as PyTorch's own examples train
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        self.sharding = resolve_sharding(cfg.sharding, dist.world)
        self.speed_layer = cfg.speed_layer and self.sharding != "fsdp"  # built and tested unsharded and under DDP
        saved = self.check_out()
        self.task.prepare(cfg, self.run, dist)
        if self.device.type == "cpu":  # after the data preparation: the cores free when training starts
            torch.set_num_threads(self.run_threads(saved))
        self.mconf = self.task.model_config(cfg)
        if saved is not None and self.run.read_config() != self.mconf:
            old, new = self.run.read_config().to_dict(), self.mconf.to_dict()
            raise ValueError(f"--resume with a changed model config: "
                             f"{ {k: (v, new[k]) for k, v in old.items() if new[k] != v} }")
        if cfg.batch_size % (dist.world * cfg.grad_accum):
            raise ValueError(f"batch_size {cfg.batch_size} must divide into {dist.world} processes x "
                             f"{cfg.grad_accum} accumulation steps")
        self.task.check(cfg, self.mconf, dist)
        self.max_steps = cfg.max_steps
        if cfg.max_tokens:
            by_tokens = math.ceil(cfg.max_tokens / self.task.tokens_per_step)
            self.max_steps = min(self.max_steps, by_tokens) if self.max_steps else by_tokens
        torch.manual_seed(cfg.seed)
        self.memory, available = PeakMemory(self.device), available_bytes(self.device, dist.local_world)
        self.model = self.task.build_model(self.mconf)
        if cfg.lora:
            add_lora(self.model, r=cfg.lora, alpha=cfg.lora_alpha, targets=cfg.lora_targets)
        self.check_memory(available)
        self.model.to(self.device)
        self.shard()
        self.opt = build_optimizer(self.model, cfg, self.device)
        self.batch_gen = torch.Generator().manual_seed(cfg.seed)
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if cfg.bf16 else nullcontext
        return saved

    def check_memory(self, available: int | None) -> None:
        """The estimate per rank (``self.estimate``), refused when it exceeds what the device has free; rank 0's
        reading decides for all, so that every rank stops together."""
        cfg, world = self.cfg, self.dist.world
        self.estimate = estimate_memory(
            self.model, self.mconf, sharding=self.sharding, world=world, checkpointed=cfg.activation_checkpointing,
            rows=cfg.batch_size // (world * cfg.grad_accum), T=getattr(self.task, "T", self.mconf.max_len),
            blocks=len(model_blocks(self.model)), bf16=cfg.bf16, device=self.device)
        if self.dist.world > 1 and available is not None:
            available = int(self.dist.from_main(float(available)))
        check_fits(self.estimate, available, self.device)

    def report_peak(self, bar, steps: int) -> None:
        """The peak measured over the first ``steps`` steps, the most of the ranks, beside the estimate."""
        from .progress import note

        peak = self.memory.peak()
        if peak is None:
            return
        self.peak_bytes = int(self.dist.max(float(peak)))
        if bar is not None:
            note(bar, f"qkv: measured peak over the first {steps} step(s): {self.peak_bytes / MiB:.1f} MiB per rank "
                      f"(the most of {self.dist.world}; {self.memory.how} since before the model was built), "
                      f"estimated {self.estimate.total / MiB:.1f} MiB")

    def run_threads(self, saved: TrainState | None) -> int:
        """CPU threads: --threads; else, where qkv chooses (one process, no OMP_NUM_THREADS), the ones a resumed
        run trained with (inductor's kernels and some eager ops sum in an order set by the count: bit for bit),
        else the cores free now; under torchrun the launcher's count."""
        if self.cfg.threads:
            return self.cfg.threads
        if self.dist.world > 1 or os.environ.get("OMP_NUM_THREADS"):
            return torch.get_num_threads()
        return saved.threads if saved is not None and saved.threads else cpu_threads()

    def shard(self) -> None:
        """Activation checkpointing, then FSDP2: ``self.model`` becomes the sharded one, and no rank keeps a
        whole copy (evaluation runs the shards, see ``eval_dist``; saving gathers, see ``gathered_model``)."""
        self.model_type = type(self.model)  # before fully_shard swaps the class
        if self.cfg.activation_checkpointing:
            checkpoint_blocks(self.model)
        if self.sharding == "fsdp":
            shard_model(self.model, self.device, self.dist.world, bf16=self.cfg.bf16)

    def eval_dist(self) -> Dist:
        """The ranks as evaluation sees them: under fsdp each rank alone, scoring every window itself, for a
        sharded forward is a collective (every rank runs the same ones, in the same order); else ``self.dist``."""
        if self.sharding != "fsdp":
            return self.dist
        alone = Dist()
        alone.device = self.device
        return alone

    def resharded(self) -> None:
        """Under fsdp, drop the root's gathered weights that a forward without a backward leaves behind."""
        if self.sharding == "fsdp":
            self.model.reshard()

    def gathered_model(self, *, frozen: bool = True) -> nn.Module | None:
        """The model with all its weights: ``self.model``, or under fsdp one built on rank 0 alone around the
        weights gathered there into CPU memory (None on the other ranks; a collective, every rank calls it).
        ``frozen=False`` gathers only what trains (a LoRA run's adapters, all it saves)."""
        if self.sharding != "fsdp":
            return self.model
        weights = full_weights(self.model, frozen=frozen)
        if not self.dist.is_main:
            return None
        with torch.device("meta"):
            skeleton = self.model_type(self.mconf)
            if self.cfg.lora:
                add_lora(skeleton, r=self.cfg.lora, alpha=self.cfg.lora_alpha, targets=self.cfg.lora_targets)
        return whole_from(skeleton, weights, self.model, strict=frozen)

    def progress(self) -> float:
        """Fraction of the budget spent; a time budget keeps back what the final evaluation will take."""
        s, by_time = self.state, 0.0
        if self.cfg.max_minutes:
            budget_s = self.cfg.max_minutes * 60
            reserve = min(0.5 * budget_s, s.eval_cost * self.task.final_units)
            by_time = s.elapsed / (budget_s - reserve)
        return max(s.step / self.max_steps if self.max_steps else 0.0, by_time)

    # --- the one pair that saves and restores ----------------------------------------------------
    def capture_state(self) -> TrainState:
        """Counters and RNGs; the weights and optimizer in it, or under fsdp in the distributed checkpoint
        every rank writes now (a collective)."""
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        weights, optimizer, sharded = None, None, None
        if self.sharding == "fsdp":
            sharded = self.save_sharded()
        else:
            weights, optimizer = model_weights(self.model), self.opt.state_dict()
        threads = torch.get_num_threads() if self.device.type == "cpu" else None
        return replace(self.state, model=weights, optimizer=optimizer, sharded=sharded, threads=threads,
                       batch_rng=self.batch_gen.get_state(), torch_rng=torch.get_rng_state(), cuda_rng=cuda)

    def save_sharded(self) -> str:
        """Every rank writes its shards of the weights and optimizer into this step's folder (what a killed
        run left there is removed first; the complete checkpoint train_state.pt names is kept)."""
        name = self.run.sharded_name(self.state.step)
        if self.dist.is_main:
            self.run.discard_sharded(keep=self.sharded_saved)
        self.dist.barrier()
        save_sharded(self.model, self.opt, self.run / name)
        return name

    def restore(self, saved: TrainState) -> None:
        """Weights (checked against model.safetensors' checksum first), optimizer, RNGs, counters, metrics."""
        from .run_dir import check_weights, load_weights

        if self.sharding == "fsdp":  # no rank holds the whole model: the file is read one tensor at a time
            check_weights(self.run.path)
        else:
            load_weights(self.model, self.run.path, device=self.device)  # refuses a damaged model.safetensors
        try:  # then the weights saved with the optimizer: one consistent snapshot, even if a kill split the files
            self.restore_training(saved)
        except (ValueError, KeyError, RuntimeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__  # one line
            raise ValueError(f"{self.run / self.run.STATE} does not match the model: {first}") from None
        self.sharded_saved = saved.sharded
        self.batch_gen.set_state(saved.batch_rng)
        torch.set_rng_state(saved.torch_rng)
        if self.device.type == "cuda" and saved.cuda_rng is not None:
            torch.cuda.set_rng_state(saved.cuda_rng, self.device)
        live = {k: None for k in ("model", "optimizer", "batch_rng", "torch_rng", "cuda_rng", "threads")}
        self.state = replace(saved, running=list(saved.running), **live)  # the live objects hold the rest
        self.records = self.run.read_metrics(saved.step)
        self.last_saved = saved.step
        if self.progress() >= 1:
            raise ValueError(f"{self.run} already finished its budget ({self.cfg.budget}) at step {saved.step}; "
                             "raise --max-steps or --max-minutes to train further")

    def restore_training(self, saved: TrainState) -> None:
        """The trained weights and the optimizer: from a distributed checkpoint (resharded to this world size),
        else from the whole state dicts in ``saved`` (under fsdp each rank keeps its shards of them)."""
        where = str(self.run / self.run.STATE)
        if saved.sharded is not None:
            load_sharded(self.model, self.opt, self.run / saved.sharded)
        elif self.sharding == "fsdp":  # a LoRA run's state holds the adapters alone: the base is in the model
            weights = keyed_as_model(self.model, saved.model, where=where)
            load_full(self.model, self.opt, weights, saved.optimizer, strict=not self.cfg.lora)
        else:
            set_model_weights(self.model, saved.model, where=where)
            self.opt.load_state_dict(saved.optimizer)

    def save(self) -> None:
        """The model files, then the training state (rank 0); a full disk keeps the last complete checkpoint."""
        if self.run is None:
            return
        whole = self.gathered_model(frozen=not self.cfg.lora)  # fsdp: rank 0's alone, freed once written
        state = self.capture_state() if self.dist.is_main or self.sharding == "fsdp" else None
        if not self.dist.is_main:
            return
        try:
            self.run.save_model(whole, self.task.tokenizer, step=self.state.step)
            self.run.save_state(asdict(state))  # last: it names the complete distributed checkpoint, if any
            self.sharded_saved = state.sharded
            self.run.discard_sharded(keep=self.sharded_saved)
        except DiskFullError as e:
            kept = "no checkpoint was written yet" if self.last_saved is None else \
                f"the last complete checkpoint (step {self.last_saved}) is kept; after freeing space, continue " \
                f"with: qkv train --resume --out {self.run}"
            raise ValueError(f"{e}; {kept}") from None
        self.last_saved = self.state.step

    def begin_writing(self) -> None:
        if self.run is None or not self.dist.is_main:
            return
        if self.cfg.overwrite:
            self.run.clear()
        self.run.write_json(self.run.TRAIN_CONFIG, self.cfg.to_dict() | {"resume": False, "overwrite": False})
        self.run.write_metrics(self.records)

    # --- step and evaluate -------------------------------------------------------------------
    def step(self, model: nn.Module) -> Tensor:
        """One optimizer step at the scheduled learning rate; its mean loss stays on the device (``read_losses``)."""
        cfg, s, t0 = self.cfg, self.state, time.perf_counter()
        set_lr(self.opt, lr_at(cfg, s.step, self.progress()))
        micros = self.task.draw(self.batch_gen, cfg, self.dist)
        loss = self.dist.mean(train_step(model, self.opt, micros, self.task.loss, grad_clip=cfg.grad_clip,
                                         autocast=self.autocast, ddp=self.sharding == "ddp"))
        s.step += 1
        s.tokens += self.task.tokens_per_step
        s.train_time += time.perf_counter() - t0
        return loss

    def read_losses(self, pending: list[Tensor]) -> float:
        """The losses of the steps since the last reading, read back in one transfer (on a GPU the one wait for the
        device; its time counts as training); the last of them. Diverged on a NaN/Inf loss (every rank sees the
        same averaged losses)."""
        s, t0 = self.state, time.perf_counter()
        values = torch.stack(pending).tolist()
        pending.clear()
        s.train_time += time.perf_counter() - t0
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is not None:
            kept = "no checkpoint was written yet" if self.last_saved is None else \
                f"the last good checkpoint (step {self.last_saved}) in {self.run} is kept"
            raise Diverged(f"the training loss became {values[bad]} at step {s.step - len(values) + bad + 1}: "
                           f"stopped; {kept}. Try a lower --lr or a smaller --batch-size")
        s.running = [s.running[0] + sum(values), s.running[1] + len(values)]
        return values[-1]

    def due(self) -> bool:
        """Whether this step reads the losses back, checks the clock and may stop, log or save: every step on a CPU
        (nothing to wait for); on a GPU every SYNC_STEPS steps, at evaluations and at the step budget's end, so
        that the device runs ahead of the host in between."""
        step = self.state.step
        return self.device.type == "cpu" or step % SYNC_STEPS == 0 or step % self.cfg.eval_interval == 0 \
            or step == self.stop_at or (self.max_steps is not None and step >= self.max_steps)

    def evaluate(self) -> None:
        """Validate on the task's sample, append a metrics record and write metrics.jsonl."""
        s, t0, dist = self.state, time.perf_counter(), self.eval_dist()
        fields_, units = self.task.evaluate(self.model, autocast=self.autocast, dist=dist)
        self.resharded()
        s.eval_cost = self.dist.from_main((time.perf_counter() - t0) * dist.world / max(1, units))
        self.records.append({"step": s.step, "train_loss": s.running[0] / max(1, s.running[1])} | fields_ |
                            {"lr": self.opt.param_groups[0]["lr"], "tokens": s.tokens, "elapsed_s": round(s.elapsed, 2)})
        s.running = [0.0, 0]
        if self.run is not None and self.dist.is_main:
            self.run.write_metrics(self.records)

    def header(self) -> str:
        c, (n, k), kind = self.cfg, parameter_counts(self.model), self.model_type
        threads = f" with {torch.get_num_threads()} thread(s)" if self.device.type == "cpu" else ""
        source = f"from {c.init_from_hf}" if c.init_from_hf else c.preset if c.model is None else "custom"
        trains = f", {k:,} of them trained ({100 * k / n:.2f} %: LoRA rank {c.lora})" if c.lora else ""
        precision = ("bf16 autocast" if c.bf16 else "fp32") + (", speed layer" if self.speed_layer else "")
        return (f"qkv: training a {n / 1e6:.2f} M-parameter {kind.__name__}{trains} "
                f"({source}, {self.task.describe()}; prepared in "
                f"{self.prepare_s:.0f} s; budget {c.budget}; {self.dist.world} process(es) on {self.device}{threads}"
                f", {precision} -> {self.run or '(not saved)'}")

    def progress_bar(self):
        if not (self.cfg.progress and self.dist.is_main):
            return None
        from .progress import progress_bar

        print(self.header(), file=sys.stderr)
        print(memory_line(self.estimate), file=sys.stderr)
        return progress_bar(100.0, initial=round(100 * self.progress(), 2), desc="qkv train", unit="%",
                            bar_format="{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]")

    # --- the loop --------------------------------------------------------------------------------
    def loop(self, model: nn.Module, stop: "StopRequest") -> bool:
        """Step until the budget, ``stop_at`` or Ctrl-C; True when the budget was reached."""
        s, cfg, bar = self.state, self.cfg, self.progress_bar()
        clock, start_elapsed, first = time.perf_counter(), s.elapsed, s.step
        finished = done = reported = False
        pending: list[Tensor] = []
        model.train()
        try:
            while not done:
                pending.append(self.step(model))
                if s.step == first + 1:  # the first step compiles (--compile): steady_tokens_per_s leaves it out
                    self.first_step = (s.train_time, s.tokens)
                if not self.due():
                    continue
                loss = self.read_losses(pending)
                s.elapsed = self.dist.from_main(start_elapsed + time.perf_counter() - clock)
                finished = self.progress() >= 1
                done = finished or s.step == self.stop_at or self.dist.any(stop.requested)
                if not reported and (s.step - first >= PEAK_STEPS or done):
                    self.report_peak(bar, s.step - first)
                    reported = True
                self.show(bar, loss)
                if finished or s.step % cfg.eval_interval == 0:  # an interruption (stop_at) logs nothing extra
                    self.evaluate()
                if done or s.step % cfg.eval_interval == 0:
                    self.save()
                    s.elapsed = self.dist.from_main(start_elapsed + time.perf_counter() - clock)
        finally:
            if bar is not None:
                bar.close()
        return finished

    def show(self, bar, loss: float) -> None:
        if bar is not None:
            s = self.state
            bar.update(min(100.0, round(100 * self.progress(), 2)) - bar.n)
            bar.set_postfix_str(f"step {s.step}, loss {loss:.3f}, {s.tokens / max(s.train_time, 1e-9):.0f} tok/s",
                                refresh=False)

    def summarise(self) -> dict:
        """Final metrics on the whole validation split, the task's numbers; summary.json and loss.png."""
        s, cfg = self.state, self.cfg
        summary = {"task": self.task.name, "steps": s.step, "tokens": s.tokens,
                   "tokens_per_s": s.tokens / max(s.train_time, 1e-9), "steady_tokens_per_s": self.steady_rate(),
                   "train_seconds": round(s.train_time, 2),
                   "elapsed_seconds": round(s.elapsed, 2), "prepare_seconds": round(self.prepare_s, 2),
                   "train_loss": self.records[-1]["train_loss"] if self.records else None}
        if cfg.final_eval:
            summary |= self.final_metrics()
        elif self.records:
            summary |= {k: v for k, v in self.records[-1].items() if k.startswith("val_")}
        n, k = parameter_counts(self.model)
        summary |= self.task.summary() | {"parameters": n, "trainable_parameters": k,
                                          "device": str(self.device), "world_size": self.dist.world,
                                          "threads": torch.get_num_threads() if self.device.type == "cpu" else None,
                                          "bf16": self.cfg.bf16, "speed_layer": self.speed_layer,
                                          "recipe": self.recipe_words()}
        if self.run is not None and self.dist.is_main:
            self.run.write_json(self.run.SUMMARY, summary)
            if self.records:
                plot_losses(self.run / self.run.LOSS_PLOT, self.records, summary)
        return summary

    def steady_rate(self) -> float | None:
        """Tokens per second of this session's steps after its first (which holds the compile), if it took more."""
        (t1, n1), s = getattr(self, "first_step", (0.0, 0)), self.state
        return (s.tokens - n1) / (s.train_time - t1) if n1 and s.tokens > n1 and s.train_time > t1 else None

    def recipe_words(self) -> dict:
        """Which recipe ran and why (summary.json): optimizer, schedule, peak lr, precision and the machine's word
        on bf16 that chose it, Muon's Newton–Schulz precision."""
        c = self.cfg
        words = {"optimizer": c.optimizer, "schedule": c.schedule, "lr": c.lr, "batch_size": c.batch_size,
                 "warmup_steps": c.warmup_steps, "compile": bool(c.compile), "bf16": c.bf16,
                 "bf16_because": bf16_words(self.device.type)}
        muon = getattr(self.opt, "parts", {}).get("muon")
        if muon is not None:
            words["muon_newton_schulz"] = str(muon.ns_dtype).removeprefix("torch.")
        return words

    def final_metrics(self) -> dict:
        """The task's numbers on the whole validation split, on the sharded model itself under fsdp (every rank
        alike; a task that decodes, translate, refuses fsdp)."""
        metrics = self.task.final_metrics(self.model, autocast=self.autocast, dist=self.eval_dist(),
                                          progress=self.cfg.progress and self.dist.is_main)
        self.resharded()
        return metrics

    def wrapped(self) -> nn.Module:
        """The model the loop steps: compiled and/or wrapped in DDP (``self.model`` stays the plain one)."""
        model = self.model
        if self.cfg.compile:  # compiled in the first step: inside the loop, so a time budget counts the compile
            use_compile_cache()
            model = torch.compile(model, dynamic=False)
        if self.sharding == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        return model

    def train(self) -> TrainResult:
        t_begin = time.perf_counter()
        saved = self.setup()
        if saved is not None:
            self.restore(saved)
        self.begin_writing()
        self.prepare_s = time.perf_counter() - t_begin  # data preparation: outside the budget
        exact = self.cfg.compile and self.device.type == "cpu"  # bit-for-bit resumes of compiled CPU runs
        with StopRequest() as stop, deterministic_kernels() if exact else nullcontext(), \
                accelerated(self.model, training=True) if self.speed_layer else nullcontext():
            finished = self.loop(self.wrapped(), stop)  # compiled in the first step: deterministic kernels
        if stop.requested and not finished:
            saved_msg = f"checkpoint saved; continue with: qkv train --resume --out {self.run}" if self.run \
                else "nothing saved (no --out)"
            raise Interrupted(f"interrupted at step {self.state.step}, {saved_msg}")
        self.model.eval()
        summary = self.summarise() if finished else {}  # else stopped early (stop_at): resume to finish
        self.resharded()
        return TrainResult(model=self.final_model(), tokenizer=self.task.tokenizer, config=self.mconf,
                           metrics=self.records, summary=summary, path=self.run.path if self.run else None)

    def final_model(self) -> nn.Module:
        """What ``train`` returns, in eval mode: ``self.model``; under fsdp, on rank 0, a whole model built
        after training from the weights gathered there (the other ranks return their shards, ``self.model``)."""
        whole = self.gathered_model()
        return (self.model if whole is None else whole.to(self.device)).eval()


def train(cfg: TrainConfig, *, corpus: object | None = None, tokenizer: object | None = None,
          stop_at: int | None = None) -> TrainResult:
    """Train as ``cfg`` says (task, model, data, budget, run directory) and return the model, its metrics
    and a summary.

    Args:
        cfg: the task, model, data, budget and run directory.
        corpus: ready data for the task (a ``qkv.data.Corpus``, or a translation task's pairs); default: read
            as ``cfg`` says.
        tokenizer: a ready tokenizer; default: fitted or loaded as ``cfg`` says.
        stop_at: stop after this step as an interruption would (checkpoint, no summary), keeping the
            schedule of the full budget; resume later with ``resume=True``.
    """
    if not (cfg.max_steps or cfg.max_tokens or cfg.max_minutes):
        raise ValueError("give a budget: max_steps, max_tokens or max_minutes")
    dist = Dist.from_env(cfg.device)
    threads = torch.get_num_threads()
    inputs = {k: v for k, v in (("corpus", corpus), ("tokenizer", tokenizer)) if v is not None}
    recipe = Recipe(cfg, dist, stop_at=stop_at, **inputs)
    try:
        with ExitStack() as stack:
            if recipe.run is not None and dist.is_main:
                stack.enter_context(_writer(recipe.run, cfg))
            return recipe.train()
    finally:
        torch.set_num_threads(threads)
        dist.close()


def _writer(run: RunDir, cfg: TrainConfig):
    """The run's lock, taken before anything is written; a directory this call created is removed again
    if training fails before writing into it (bad data, bad settings: nothing is left behind)."""
    created = not run.path.exists()
    stack = ExitStack()
    if created:
        stack.callback(lambda: run.is_empty() and _remove_empty(run))
    stack.enter_context(run.lock())
    return stack


def _remove_empty(run: RunDir) -> None:
    (run / run.LOCK).unlink(missing_ok=True)
    try:
        run.path.rmdir()
    except OSError:
        pass


def run_info(path: str | os.PathLike) -> dict:
    """What ``qkv info`` shows: model, tokenizer, training progress and results of a run."""
    run = RunDir(path)
    loaded = run.load()
    c, n = loaded.config, sum(p.numel() for p in loaded.model.parameters())
    info = {"run": str(run), "model": f"{type(loaded.model).__name__}, {n / 1e6:.3f} M parameters: "
            f"d_model={c.d_model}, num_heads={c.num_heads}, num_layers={c.num_layers}, d_ff={c.ff_width}, "
            f"max_len={c.max_len}, positional={c.positional}, norm_first={c.norm_first}, activation={c.activation}, "
            f"attention={attention_words(c)}",
            "tokenizer": f"{loaded.tokenizer.kind}, {loaded.tokenizer.vocab_size} tokens",
            "step": int(run.weights_metadata().get("step", 0))}
    t, s = run.read_json(run.TRAIN_CONFIG), run.read_json(run.SUMMARY)
    if isinstance(t, dict):
        info["data"] = data_info(t, s if isinstance(s, dict) else {})
        info["training"] = (f"task={t.get('task', 'lm')}, batch_size={t.get('batch_size')}, lr={t.get('lr')}, "
                            f"seed={t.get('seed')}, budget: steps={t.get('max_steps')}, "
                            f"minutes={t.get('max_minutes')}, tokens={t.get('max_tokens')}")
        if t.get("init_from_hf"):
            info["base"] = f"{t['init_from_hf']} (weights SHA-256 {str(t.get('init_sha256'))[:16]}…)"
        if t.get("lora"):
            info["lora"] = (f"rank {t['lora']}, alpha {t['lora_alpha']:g}, on {t['lora_targets']} "
                            f"({run.ADAPTERS} over the base, merged on loading)")
    if isinstance(s, dict):
        for key, value in make_task(s.get("task", "lm")).info(s).items():
            info[key] = f"{value} after {s['steps']} steps, {s['tokens_per_s']:.0f} tokens/s"
    else:
        info["status"] = "unfinished (continue with qkv train --resume --out RUN)"
    return info


def attention_words(c) -> str:
    """A config's attention kind in a few words: mha (with its KV heads), mla (its latent widths), a window."""
    a = c.attention
    if a.kind == "mla":
        words = f"mla (kv_lora_rank={a.kv_lora_rank}, qk_rope_head_dim={a.qk_rope_head_dim})"
    else:
        words = a.kind + (f" (num_kv_heads={a.num_kv_heads})" if a.num_kv_heads not in (None, a.num_heads) else "")
    return words + (f", sliding_window={a.sliding_window}" if a.sliding_window else "")


def data_info(train_config: dict, summary: dict) -> str:
    """What a run learned from, in words: its --data, else what the summary read (the corpus's own name:
    the catalogs' place and language), else the task's default."""
    task = train_config.get("task", "lm")
    given = train_config.get("data") or train_config.get("pairs")
    source = given or summary.get("corpus") or task_type(task).defaults.data
    lang = summary.get("target_lang") or (train_config.get("task_options") or {}).get("target_lang")
    if task == "translate" and lang:
        source += f", target language {lang}"
    return source if given else f"{source} (the default: no --data given)"
