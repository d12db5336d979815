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

import time
from contextlib import ExitStack, nullcontext

import torch
from torch import nn

from .run_dir import RunDir
from ..kernels import accelerated
from ..runtime import bf16_words, deterministic_kernels, tf32_kept, use_compile_cache
from .distributed import Dist
from .expert_load import LOAD_KEYS
from .tasks import make_task
from .checkpointing import RecipeCheckpoints
from .config import TrainConfig
from .loop import RecipeLoop
from .report import plot_losses
from .setup import RecipeSetup
from .state import Interrupted, StopRequest, TrainResult, TrainState, parameter_counts

# What the studies, benchmarks and tests import from the recipe: its parts' public names, in one place.
from ..runtime import cpu_threads  # noqa: E402
from .config import RESUME_FIXED, TASK_DEFAULTED, check_same_run, option_changes, run_changes  # noqa: E402
from .loop import PEAK_STEPS, SYNC_STEPS, train_step  # noqa: E402
from .optim import build_optimizer, lr_at  # noqa: E402
from .report import attention_words, data_info, run_info  # noqa: E402
from .state import Diverged  # noqa: E402
from .tasks.language_model import LN2, compressor_bpc, eval_starts, evaluate  # noqa: E402

__all__ = ["LN2", "PEAK_STEPS", "RESUME_FIXED", "SYNC_STEPS", "TASK_DEFAULTED", "Diverged", "Interrupted", "Recipe",
           "StopRequest", "TrainConfig", "TrainResult", "TrainState", "attention_words", "build_optimizer",
           "check_same_run", "compressor_bpc", "cpu_threads", "data_info", "eval_starts", "evaluate", "lr_at",
           "option_changes", "parameter_counts", "plot_losses", "run_changes", "run_info", "train", "train_step"]


class Recipe(RecipeSetup, RecipeCheckpoints, RecipeLoop):
    """One training run of ``cfg.task``: setup (``setup``), restore and save (``checkpointing``), step, evaluate
    and the loop (``loop``), summarise (here)."""

    def __init__(self, cfg: TrainConfig, dist: Dist, *, stop_at: int | None = None, **task_inputs) -> None:
        self.cfg, self.dist, self.stop_at = cfg, dist, stop_at
        self.task = make_task(cfg.task, **task_inputs)
        self.run = RunDir(cfg.out) if cfg.out else None
        self.state, self.records = TrainState(), []
        self.last_saved: int | None = None
        self.sharded_saved: str | None = None  # the distributed checkpoint train_state.pt names

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
        if self.records:  # the experts' load over the last evaluation's window (MoE models only)
            summary |= {k: v for k, v in self.records[-1].items() if k in LOAD_KEYS}
        n, k = parameter_counts(self.model)
        summary |= self.task.summary() | {"parameters": n, "trainable_parameters": k,
                                          "device": str(self.device), "world_size": self.dist.world,
                                          "threads": torch.get_num_threads() if self.device.type == "cpu" else None,
                                          "bf16": self.cfg.bf16, "speed_layer": self.speed_layer,
                                          "recipe": self.recipe_words()}
        if self.run is not None and self.dist.is_main:
            self.run.write_json(self.run.SUMMARY, summary)
            if self.records and s.step:  # a curve needs steps (max_steps 0 takes none)
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
        """The model the loop steps: wrapped in DDP, then compiled (``self.model`` stays the plain one). Compiled
        around DDP, dynamo splits the graph at DDP's gradient buckets (its DDPOptimizer), so each bucket's
        all-reduce overlaps the rest of the backward; DDP around a compiled model would reduce after it."""
        model = self.model
        if self.sharding == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        if self.cfg.compile:  # compiled in the first step: inside the loop, so a time budget counts the compile
            use_compile_cache()
            model = torch.compile(model, dynamic=False)
        return model

    def train(self) -> TrainResult:
        t_begin = time.perf_counter()
        saved = self.setup()
        if saved is not None:
            self.restore(saved)
        self.begin_writing()
        self.prepare_s = time.perf_counter() - t_begin  # data preparation: outside the budget
        if self.cfg.max_steps == 0:  # the starting model's numbers: the baseline a fine-tune is compared to
            return self.baseline()
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

    def baseline(self) -> TrainResult:
        """``max_steps=0``: the starting model evaluated (a metrics record at step 0) and summarised, no step taken;
        the summary is written, the weights are not (they are the starting model's)."""
        self.evaluate()
        self.model.eval()
        summary = self.summarise()
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
