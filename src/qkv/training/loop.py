"""The loop of a run: one optimizer step, the losses read back, the progress shown, evaluation, the budget.

    repeat { step → [read losses → show → evaluate → save] } until the budget, ``stop_at`` or Ctrl-C
    step = the task's global batch → this rank's micro-batches → Σ (loss / divisor).backward() → clip → update

The distribution and the normalisation are the loop's alone (``micro_batches``): a task gives the whole step's
batch and a loss summed over its units; the loop cuts the batch (micro-step m of rank r takes slice (m, r)) and
divides by the units of the whole step, once. On a GPU the losses are read back every SYNC_STEPS steps, so the
device runs ahead of the host in between."""
from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..generation import paths
from .evaluator import validate
from .optim import lr_at, set_lr
from .memory import memory_line
from .progress import percent_done
from .state import Diverged, StopRequest, TrainState, parameter_counts


PEAK_STEPS = 3  # the measured peak memory is reported after this many steps (on a GPU: at the next reading)
SYNC_STEPS = 25  # on a GPU the losses are read back (the host waits for the device) every this many steps


def expert_products_line(model, *, autocast=nullcontext, compiled: bool = False) -> str | None:
    """Where the speed layer will not run a mixture-of-experts layer's expert products as ``torch._grouped_mm``:
    one line, each reason with its layers (the registry's "grouped_mm" entry, asked once before the first step,
    under the run's ``autocast`` and ``compiled`` or not); None where every layer runs them (or there is none)."""
    with autocast():
        refusals = paths.grouped_mm_refusals(model, compiling=compiled)
    layers: dict[str, list[str]] = {}
    for name, reason in refusals.items():
        layers.setdefault(reason, []).append(name)
    said = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in layers.items())
    return (f"qkv: mixture-of-experts layers train through their own dispatch, not the speed layer's grouped "
            f"products: {said}") if said else None


def train_step(model, opt, micros, loss_fn: Callable[[nn.Module, Any], Tensor], *, grad_clip: float = 0.0,
               autocast=nullcontext, sharding: str = "none", divisors: Sequence[float] | None = None) -> Tensor:
    """One optimizer step over ``grad_accum`` micro-batches: the gradients of each micro-batch's loss divided by its
    divisor (default: their count, the mean loss) are accumulated (under ddp or fsdp reduced on the last one only,
    ``gradient_sync``), clipped to ``grad_clip`` and applied. Returns the sum of the divided losses (detached)."""
    if sharding not in ("none", "ddp", "fsdp"):
        raise ValueError(f"sharding must be none, ddp or fsdp, got {sharding!r}")
    micros = list(micros)
    divisors = [len(micros)] * len(micros) if divisors is None else list(divisors)
    step_loss = None
    for m, (micro, divisor) in enumerate(zip(micros, divisors, strict=True)):
        with gradient_sync(model, sharding, m == len(micros) - 1):
            with autocast():
                loss = loss_fn(model, micro)
            (loss / divisor).backward()
        step_loss = loss.detach() / divisor if step_loss is None else step_loss + loss.detach() / divisor
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return step_loss


def step_batches(task, generator: torch.Generator, step: int, cfg, dist) -> tuple[list, list[float]]:
    """Optimizer step ``step``'s global batch of ``cfg.batch_size`` items, drawn as every rank draws it, cut into
    this rank's ``cfg.grad_accum`` micro-batches with their divisors (``micro_batches``)."""
    items = torch.as_tensor(task.draw(generator, step, cfg.batch_size))
    if items.shape != (cfg.batch_size,):
        raise ValueError(f"{type(task).__name__}.draw must give {cfg.batch_size} items, got shape {tuple(items.shape)}")
    return micro_batches(task, items, cfg.grad_accum, dist)


def micro_batches(task, items: Tensor, accum: int, dist) -> tuple[list, list[float]]:
    """This rank's micro-batches of the global batch ``items`` (B,) — micro-step m of rank r takes slice (m, r) —
    and the divisor of each one's loss, so that the step's gradient is the mean over the whole batch once the
    ranks' gradients are averaged (DDP, FSDP): a "sum" task's loss over the units of every rank and micro-batch,
    a "mean" task's over its ``accum`` micro-batches."""
    cut = items.view(accum, dist.world, -1)  # (accum, world, B / (accum · world))
    micros = [task.batch(cut[m, dist.rank]) for m in range(accum)]
    if task.reduction == "mean":
        return micros, [accum] * accum
    if task.reduction != "sum":
        raise ValueError(f"{type(task).__name__}.reduction must be 'sum' or 'mean', got {task.reduction!r}")
    units = max(1, int(task.units(items).sum()))  # every rank counts the whole step's units
    return micros, [units / dist.world] * accum


@contextmanager
def gradient_sync(model, sharding: str, last: bool) -> Iterator[None]:
    """Inside, the backward reduces gradients over the ranks only on a step's ``last`` micro-batch: DDP's
    ``no_sync`` before it; FSDP2's ``set_requires_gradient_sync(False)`` (its reduce-scatter skipped, the
    unsharded gradients accumulated), switched back on for the last. One process: nothing to reduce."""
    if sharding == "ddp" and not last:
        with model.no_sync():
            yield
        return
    if sharding == "fsdp":
        model.set_requires_gradient_sync(last)
    yield


class Loop:
    """The loop of one run, a collaborator of the run (``qkv.training.recipe.Recipe``): it holds the counters
    (``state``), the metrics ``records`` and the generator every rank draws batches from, steps the model of
    ``engine`` (``qkv.training.setup.Engine``), evaluates and asks ``checkpoints`` to save."""

    def __init__(self, cfg, dist, task, engine, checkpoints, *, stop_at: int | None = None) -> None:
        self.cfg, self.dist, self.task, self.engine, self.checkpoints = cfg, dist, task, engine, checkpoints
        self.stop_at, self.max_steps = stop_at, cfg.max_steps
        self.state, self.records = TrainState(), []
        self.batch_gen = torch.Generator().manual_seed(cfg.seed)
        self.prepare_s = 0.0  # seconds the run took to prepare (the header says)

    def budget(self) -> None:
        """The step budget: --max-steps, or fewer where --max-tokens ends first (the task's tokens per step)."""
        if self.cfg.max_tokens:
            by_tokens = math.ceil(self.cfg.max_tokens / self.task.tokens_per_step)
            self.max_steps = min(self.max_steps, by_tokens) if self.max_steps is not None else by_tokens

    def save(self) -> None:
        self.checkpoints.save(self.state, self.batch_gen)

    def progress(self) -> float:
        """Fraction of the budget spent; a time budget keeps back what the final evaluation will take."""
        s, by_time = self.state, 0.0
        if self.cfg.max_minutes:
            budget_s = self.cfg.max_minutes * 60
            reserve = min(0.5 * budget_s, s.eval_cost * self.task.final_units)
            by_time = s.elapsed / (budget_s - reserve)
        return max(s.step / self.max_steps if self.max_steps else 0.0, by_time)

    # --- step and evaluate -------------------------------------------------------------------
    def step(self, model: nn.Module) -> Tensor:
        """One optimizer step at the scheduled learning rate; its mean loss stays on the device (``read_losses``)."""
        cfg, s, t0 = self.cfg, self.state, time.perf_counter()
        e = self.engine
        set_lr(e.opt, lr_at(cfg, s.step, self.progress()))
        micros, divisors = step_batches(self.task, self.batch_gen, s.step, cfg, self.dist)
        loss = self.dist.mean(train_step(model, e.opt, micros, self.task.loss, grad_clip=cfg.grad_clip,
                                         autocast=e.autocast, sharding=e.sharding, divisors=divisors))
        for hook in e.step_hooks:  # after optimizer.step(): e.g. the experts' load and balancing bias
            hook.after_step()
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
            last = self.checkpoints.last_saved
            kept = "no checkpoint was written yet" if last is None else \
                f"the last good checkpoint (step {last}) in {self.checkpoints.run} is kept"
            raise Diverged(f"the training loss became {values[bad]} at step {s.step - len(values) + bad + 1}: "
                           f"stopped; {kept}. Try a lower --lr or a smaller --batch-size")
        s.running = [s.running[0] + sum(values), s.running[1] + len(values)]
        return values[-1]

    def due(self) -> bool:
        """Whether this step reads the losses back, checks the clock and may stop, log or save: every step on a CPU
        (nothing to wait for); on a GPU every SYNC_STEPS steps, at evaluations and at the step budget's end, so
        that the device runs ahead of the host in between."""
        step = self.state.step
        return self.engine.device.type == "cpu" or step % SYNC_STEPS == 0 or step % self.cfg.eval_interval == 0 \
            or step == self.stop_at or (self.max_steps is not None and step >= self.max_steps)

    def evaluate(self) -> None:
        """Validate on the task's sample, append a metrics record and write metrics.jsonl."""
        e, s, t0 = self.engine, self.state, time.perf_counter()
        dist = e.eval_dist()
        fields_, units = validate(self.task, e.model, autocast=e.autocast, dist=dist)
        for hook in e.step_hooks:  # what the steps since the last evaluation measured (expert loads)
            fields_ = fields_ | hook.metrics()
        e.resharded()
        s.eval_cost = self.dist.from_main((time.perf_counter() - t0) * dist.world / max(1, units))
        train_loss = s.running[0] / s.running[1] if s.running[1] else None  # None: no step since (max_steps 0)
        self.records.append({"step": s.step, "train_loss": train_loss} | fields_ |
                            {"lr": e.opt.param_groups[0]["lr"], "tokens": s.tokens, "elapsed_s": round(s.elapsed, 2)})
        s.running = [0.0, 0]
        run = self.checkpoints.run
        if run is not None and self.dist.is_main:
            run.write_metrics(self.records)

    def header(self) -> str:
        e, c = self.engine, self.cfg
        (n, k), kind = parameter_counts(e.model), e.model_type
        threads = f" with {torch.get_num_threads()} thread(s)" if e.device.type == "cpu" else ""
        base = c.base_source
        source = f"from {base.path}" if base else c.preset if c.model is None else "custom"
        trains = f", {k:,} of them trained ({100 * k / n:.2f} %: LoRA rank {c.lora})" if c.lora else ""
        precision = ("bf16 autocast" if c.bf16 else "fp32") + (", speed layer" if e.speed_layer else "")
        return (f"qkv: training a {n / 1e6:.2f} M-parameter {kind.__name__}{trains} "
                f"({source}, {self.task.describe()}; prepared in "
                f"{self.prepare_s:.0f} s; budget {c.budget}; {self.dist.world} process(es) on {e.device}{threads}"
                f", {precision} -> {self.checkpoints.run or '(not saved)'}")

    def progress_bar(self):
        if not (self.cfg.progress and self.dist.is_main):
            return None
        from .progress import progress_bar

        print(self.header(), file=sys.stderr)
        print(memory_line(self.engine.estimate), file=sys.stderr)
        e = self.engine
        if e.speed_layer and (line := expert_products_line(e.model, autocast=e.autocast, compiled=self.cfg.compile)):
            print(line, file=sys.stderr)
        return progress_bar(100.0, initial=percent_done(self.progress()), desc="qkv train", unit="%",
                            bar_format="{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]")

    # --- the loop --------------------------------------------------------------------------------
    def run(self, model: nn.Module, stop: "StopRequest") -> bool:
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
                    self.engine.report_peak(bar, s.step - first)
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
            bar.update(percent_done(self.progress()) - bar.n)
            bar.set_postfix_str(f"step {s.step}, loss {loss:.3f}, {s.tokens / max(s.train_time, 1e-9):.0f} tok/s",
                                refresh=False)
