"""The training recipe: AdamW (or Muon for the hidden matrices), linear warmup + cosine (or
warmup-stable-decay) schedule (``qkv.training.optim``), gradient clipping and accumulation,
optional bf16 autocast and ``torch.compile``, periodic validation, checkpoints, DDP — for any task.

    setup → restore → repeat { step → [evaluate → save] } → summarise

A run is composed of collaborators: the task (data and loss, ``qkv.training.tasks``), the engine (device,
model, optimizer, sharding: ``setup``), the checkpoints (``checkpointing``) and the loop (counters, steps,
evaluation: ``loop``, ``evaluator``). Around one ``TrainState`` (counters, weights, optimizer, RNGs), captured
and applied by one pair of methods, so a field cannot be saved and forgotten on restore.

One process, or one per device under ``torchrun`` (DistributedDataParallel: gloo on CPU,
nccl on CUDA; rank 0 alone writes, holding the run directory's lock). Every optimizer step draws
one *global* batch from a seeded generator that every rank shares; micro-step m of rank r takes
its slice, so N processes see exactly the batch one process would.
"""
from __future__ import annotations

import time
from contextlib import ExitStack, nullcontext

import torch

from .run_dir import RunDir
from ..kernels import accelerated
from ..runtime import bf16_words, deterministic_kernels, tf32_kept
from .distributed import Dist
from .evaluator import final_metrics
from .expert_load import LOAD_KEYS
from .tasks import make_task
from .checkpointing import Checkpoints
from .config import TrainConfig
from .loop import Loop
from .report import plot_losses
from .setup import Engine
from .state import Interrupted, StopRequest, TrainResult, TrainState, parameter_counts

# What the studies, benchmarks and tests import from the recipe: its parts' public names, in one place.
from ..runtime import cpu_threads  # noqa: E402
from .loop import train_step  # noqa: E402
from .optim import build_optimizer, lr_at  # noqa: E402
from .report import data_info, run_info  # noqa: E402
from .tasks.language_model import LN2, compressor_bpc, eval_starts, evaluate  # noqa: E402

__all__ = ["LN2", "Recipe", "TrainConfig", "TrainResult", "build_optimizer", "compressor_bpc", "cpu_threads",
           "data_info", "eval_starts", "evaluate", "lr_at", "run_info", "train", "train_step"]


class Recipe:
    """One training run of ``cfg.task``, composed of its collaborators: the task (data and loss), the engine (device,
    model, optimizer: ``setup``), the checkpoints (``checkpointing``) and the loop (``loop``: counters, steps,
    evaluation). Here: the order they act in, and the summary."""

    def __init__(self, cfg: TrainConfig, dist: Dist, *, stop_at: int | None = None, **task_inputs) -> None:
        self.cfg, self.dist = cfg, dist
        self.task = make_task(cfg.task, **task_inputs)
        self.run = RunDir(cfg.out) if cfg.out else None
        self.engine = Engine(cfg, dist, self.task)
        self.checkpoints = Checkpoints(cfg, dist, self.run, self.engine, self.task)
        self.loop = Loop(cfg, dist, self.task, self.engine, self.checkpoints, stop_at=stop_at)

    def setup(self) -> TrainState | None:
        """Device, the run directory checked, data and tokenizer (the task), model and optimizer, the budget;
        on --resume the saved state (None: none yet)."""
        self.engine.place()
        saved = self.checkpoints.check_out()
        self.task.prepare(self.cfg, self.run, self.dist)
        self.engine.build(self.run, saved)
        self.loop.budget()
        return saved

    def restore(self, saved: TrainState) -> None:
        """Weights, optimizer, RNGs, counters and metrics from ``saved``; a run whose budget is spent is refused."""
        self.loop.state, self.loop.records = self.checkpoints.restore(saved, self.loop.batch_gen)
        if self.loop.progress() >= 1:
            raise ValueError(f"{self.run} already finished its budget ({self.cfg.budget}) at step {saved.step}; "
                             "raise --max-steps or --max-minutes to train further")

    def summarise(self) -> dict:
        """Final metrics on the whole validation split, the task's numbers; summary.json and loss.png."""
        s, cfg, e, records = self.loop.state, self.cfg, self.engine, self.loop.records
        summary = {"task": self.task.name, "steps": s.step, "tokens": s.tokens,
                   "tokens_per_s": s.tokens / max(s.train_time, 1e-9), "steady_tokens_per_s": self.steady_rate(),
                   "train_seconds": round(s.train_time, 2),
                   "elapsed_seconds": round(s.elapsed, 2), "prepare_seconds": round(self.loop.prepare_s, 2),
                   "train_loss": records[-1]["train_loss"] if records else None}
        if cfg.final_eval:
            summary |= self.final_metrics()
        elif records:
            summary |= {k: v for k, v in records[-1].items() if k.startswith("val_")}
        if records:  # the experts' load over the last evaluation's window (MoE models only)
            summary |= {k: v for k, v in records[-1].items() if k in LOAD_KEYS}
        n, k = parameter_counts(e.model)
        summary |= self.task.summary() | {"parameters": n, "trainable_parameters": k,
                                          "device": str(e.device), "world_size": self.dist.world,
                                          "threads": torch.get_num_threads() if e.device.type == "cpu" else None,
                                          "bf16": cfg.bf16, "speed_layer": e.speed_layer,
                                          "recipe": self.recipe_words()}
        if self.run is not None and self.dist.is_main:
            self.run.write_json(self.run.SUMMARY, summary)
            if records and s.step:  # a curve needs steps (max_steps 0 takes none)
                plot_losses(self.run / self.run.LOSS_PLOT, records, summary)
        return summary

    def steady_rate(self) -> float | None:
        """Tokens per second of this session's steps after its first (which holds the compile), if it took more."""
        (t1, n1), s = getattr(self.loop, "first_step", (0.0, 0)), self.loop.state
        return (s.tokens - n1) / (s.train_time - t1) if n1 and s.tokens > n1 and s.train_time > t1 else None

    def recipe_words(self) -> dict:
        """Which recipe ran and why (summary.json): optimizer, schedule, peak lr, precision and the machine's word
        on bf16 that chose it, Muon's Newton–Schulz precision."""
        c = self.cfg
        words = {"optimizer": c.optimizer, "schedule": c.schedule, "lr": c.lr, "batch_size": c.batch_size,
                 "warmup_steps": c.warmup_steps, "compile": bool(c.compile), "bf16": c.bf16,
                 "bf16_because": bf16_words(self.engine.device.type)}
        muon = getattr(self.engine.opt, "parts", {}).get("muon")
        if muon is not None:
            words["muon_newton_schulz"] = str(muon.ns_dtype).removeprefix("torch.")
        return words

    def final_metrics(self) -> dict:
        """The task's numbers on the whole validation split, on the sharded model itself under fsdp (every rank
        alike; a task that decodes, translate, refuses fsdp)."""
        e = self.engine
        metrics = final_metrics(self.task, e.model, autocast=e.autocast, dist=e.eval_dist())
        e.resharded()
        return metrics

    def train(self) -> TrainResult:
        t_begin = time.perf_counter()
        saved = self.setup()
        if saved is not None:
            self.restore(saved)
        self.checkpoints.begin_writing(self.loop.records)
        self.loop.prepare_s = time.perf_counter() - t_begin  # data preparation: outside the budget
        if self.cfg.max_steps == 0:  # the starting model's numbers: the baseline a fine-tune is compared to
            self.loop.evaluate()
            self.engine.model.eval()
            return self.result(self.summarise())
        e = self.engine
        exact = self.cfg.compile and e.device.type == "cpu"  # bit-for-bit resumes of compiled CPU runs
        with StopRequest() as stop, deterministic_kernels() if exact else nullcontext(), \
                accelerated(e.model, training=True) if e.speed_layer else nullcontext():
            finished = self.loop.run(e.wrapped(), stop)  # compiled in the first step: deterministic kernels
        if stop.requested and not finished:
            saved_msg = f"checkpoint saved; continue with: qkv train --resume --out {self.run}" if self.run \
                else "nothing saved (no --out)"
            raise Interrupted(f"interrupted at step {self.loop.state.step}, {saved_msg}")
        e.model.eval()
        summary = self.summarise() if finished else {}  # else stopped early (stop_at): resume to finish
        e.resharded()
        return self.result(summary)

    def result(self, summary: dict) -> TrainResult:
        """What ``train`` returns: the model in eval mode (under fsdp rank 0's gathered whole), its metrics records,
        the summary (empty when stopped early; ``max_steps=0``: the starting model's, its weights not written)."""
        return TrainResult(model=self.engine.final_model(), tokenizer=self.task.tokenizer, config=self.engine.mconf,
                           metrics=self.loop.records, summary=summary, path=self.run.path if self.run else None)


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
    if cfg.max_steps is None and not (cfg.max_tokens or cfg.max_minutes):
        raise ValueError("give a budget: max_steps, max_tokens or max_minutes")
    dist = Dist.from_env(cfg.device)
    threads = torch.get_num_threads()
    inputs = {k: v for k, v in (("corpus", corpus), ("tokenizer", tokenizer)) if v is not None}
    recipe = Recipe(cfg, dist, stop_at=stop_at, **inputs)
    try:
        with ExitStack() as stack:
            stack.enter_context(tf32_kept())  # setup turns TF32 on for a GPU's fp32 products: for this run only
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
