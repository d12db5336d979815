"""Order: a bidirectional Encoder, with no PE and with each PE, on a task that needs word order.

Self-attention is permutation-equivariant, so without positions the output at token i can
depend only on token i and on the *bag* of tokens around it (spec §3: "狗咬人" and "人咬狗"
look alike). Tasks, each over random sequences of ``seq_len`` symbols:

    reverse   output at position i the token at the mirrored position T − 1 − i
    shift     output at position i the token at position i − 1 (position 0 is not scored)

An order-blind model can at best guess from the bag; ``bag_baseline`` measures that ceiling
(the most frequent other token of the sequence) next to uniform chance 1/V.

Shapes: B batch, T length, C model width, V symbols.
"""
from __future__ import annotations

import csv
import io
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_positive_int
from ..fileio import atomic_json, atomic_write
from ..models import Encoder, ModelConfig
from ..models.config import NO_BIAS
from ..runtime import machine, resolve_device
from ..training.recipe import TrainConfig, build_optimizer, lr_at
from .pe import DEFAULT_SCHEMES, SCHEMES
from .pages import RESULTS, finished_summary, localized, run_stamp, say, write_results
from .progress import models_bar
from .runner import run_study

TASKS = ("reverse", "shift")
OUTPUTS = ("results.csv", *RESULTS.values(), "summary.json")


@dataclass
class OrderStudyConfig:
    """The study's settings; ``OrderStudyConfig.quick()`` is the fast version."""

    tasks: tuple[str, ...] = TASKS
    seq_len: int = 16
    vocab_size: int = 16  # symbols
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    test_size: int = 2048  # held-out sequences
    seed: int = 1337
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    device: str = "auto"
    threads: int = 1  # CPU threads: for models this small one beats a pool, and results do not depend on it

    def __post_init__(self) -> None:
        self.tasks = (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks)
        if not self.tasks or any(t not in TASKS for t in self.tasks):
            raise ValueError(f"tasks must be a non-empty subset of {TASKS}, got {self.tasks}")
        for name in ("threads", "seq_len", "vocab_size", "d_model", "num_heads", "num_layers", "steps", "batch_size",
                     "test_size"):
            check_positive_int(name, getattr(self, name))
        if self.seq_len < 2 or self.vocab_size < 2:
            raise ValueError(f"need seq_len >= 2 and vocab_size >= 2, got {self.seq_len} and {self.vocab_size}")
        self.schemes = tuple(self.schemes)
        if not self.schemes or any(s not in SCHEMES for s in self.schemes):
            raise ValueError(f"schemes must be a non-empty subset of {SCHEMES}, got {self.schemes}")

    @classmethod
    def quick(cls, **overrides) -> "OrderStudyConfig":
        """About a minute on 2 CPU cores."""
        return replace(cls(steps=300), **overrides)


class OrderModel(nn.Module):
    """qkv.Encoder and a linear head: ids (B, T) -> logits (B, T, V)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.encoder = Encoder(config)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.encoder(ids).last_hidden_state)  # (B, T, V)


def task_targets(ids: Tensor, task: str) -> Tensor:
    """The answer for each position of ids (B, T); -100 where nothing is scored."""
    if task == "reverse":
        return ids.flip(1)  # (B, T): position i holds token T − 1 − i
    if task == "shift":
        out = ids.roll(1, dims=1)  # (B, T): position i holds token i − 1
        out[:, 0] = -100
        return out
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def bag_baseline(ids: Tensor, targets: Tensor) -> float:
    """Accuracy of the best order-blind guess: the most frequent token of the sequence other than
    the one at the position itself (ties: the smallest id)."""
    V = int(ids.max()) + 1
    counts = F.one_hot(ids, V).sum(1, keepdim=True) - F.one_hot(ids, V)  # (B, T, V): the bag minus self
    guess = counts.argmax(-1)  # (B, T)
    scored = targets != -100
    return float((guess == targets)[scored].float().mean())


@torch.no_grad()
def accuracy(model: nn.Module, ids: Tensor, targets: Tensor, *, batch_size: int = 512) -> float:
    """Fraction of scored positions where the argmax equals the target."""
    model.eval()
    device = next(model.parameters()).device
    hits = total = 0
    for lo in range(0, len(ids), batch_size):
        x, y = ids[lo:lo + batch_size].to(device), targets[lo:lo + batch_size].to(device)
        pred = model(x).argmax(-1)  # (B, T)
        hits += int(((pred == y) & (y != -100)).sum())
        total += int((y != -100).sum())
    return hits / total


def train_one(cfg: OrderStudyConfig, task: str, scheme: str, test: Tensor) -> tuple[float, float]:
    """Train an OrderModel on ``task`` with positional scheme ``scheme``; (test accuracy, last training loss)."""
    device = resolve_device(cfg.device)
    mconf = ModelConfig(vocab_size=cfg.vocab_size, d_model=cfg.d_model, num_layers=cfg.num_layers, max_len=cfg.seq_len,
                        attention=dict(num_heads=cfg.num_heads, **NO_BIAS), position=dict(kind=scheme),
                        feed_forward=dict(bias=False),
                        embedding=dict(scale=True))  # as in study pe: sinusoids must not drown the tokens
    torch.manual_seed(cfg.seed)
    model = OrderModel(mconf).to(device)
    # The training issue's optimizer (AdamW, decay on matrices only) and warmup + cosine schedule.
    tc = TrainConfig(model=mconf, lr=cfg.lr, warmup_steps=cfg.warmup_steps, max_steps=cfg.steps)
    opt = build_optimizer(model, tc, device)
    gen = torch.Generator().manual_seed(cfg.seed)  # the same batches for every scheme
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(tc, step, step / cfg.steps)
        ids = torch.randint(cfg.vocab_size, (cfg.batch_size, cfg.seq_len), generator=gen).to(device)  # (B, T)
        logits = model(ids)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), task_targets(ids, task).flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return accuracy(model, test, task_targets(test, task)), float(loss.detach())


@dataclass
class OrderStudyResult:
    rows: list[dict]  # task, scheme, accuracy, train_loss
    chance: float  # 1 / V
    bag_baseline: dict[str, float]  # task -> the best order-blind guess on the test set
    sentences: list[str]
    config: OrderStudyConfig
    seconds: float
    out: Path | None = None
    table: str = ""  # markdown_table of the rows, in the run's language

    def accuracy(self, scheme: str, task: str | None = None) -> float:
        task = task or self.config.tasks[0]
        return next(r["accuracy"] for r in self.rows if r["scheme"] == scheme and r["task"] == task)


def run(config: OrderStudyConfig | None = None, *, out: str | os.PathLike | None = None,
        progress: bool = True, overwrite: bool = True, lang: str = "en") -> OrderStudyResult:
    """Train one encoder per task and scheme; write results.csv, the results file of ``lang``
    (results.md, results.zh.md), summary.json to ``out`` (checked before any training;
    ``overwrite=False`` refuses a directory that has them). The sentences are in ``lang``."""
    return run_study(_run, config or OrderStudyConfig(), OUTPUTS, out=out, overwrite=overwrite, lang=lang,
                     progress=progress)


def _run(cfg: OrderStudyConfig, out: Path | None, *, progress: bool, lang: str) -> OrderStudyResult:
    t0 = time.perf_counter()
    test = torch.randint(cfg.vocab_size, (cfg.test_size, cfg.seq_len),
                         generator=torch.Generator().manual_seed(cfg.seed + 1))  # (N, T), unseen in training
    rows = []
    jobs = [(task, scheme) for task in cfg.tasks for scheme in cfg.schemes]
    for task, scheme in models_bar(jobs, desc="qkv study order", enabled=progress, label=", ".join):
        acc, loss = train_one(cfg, task, scheme, test)
        rows.append({"task": task, "scheme": scheme, "accuracy": acc, "train_loss": loss})
    bags = {task: bag_baseline(test, task_targets(test, task)) for task in cfg.tasks}
    chance = 1 / cfg.vocab_size
    result = OrderStudyResult(rows=rows, chance=chance, bag_baseline=bags, sentences=all_sentences(rows, chance, bags, lang),
                              config=cfg, seconds=time.perf_counter() - t0,
                              table=markdown_table(rows, chance, bags, lang))
    if out is not None:
        result.out = out
        _write(result, lang)
    return result


def sentences(rows: list[dict], chance: float, bag: float, task: str, lang: str = "en") -> list[str]:
    """What the numbers say about order, in ``lang``: does each scheme beat the best order-blind guess?"""
    out = [say("order.task", lang, task=task, chance=chance, bag=bag)]
    none = next((r for r in rows if r["scheme"] == "none"), None)
    if none is not None:
        verdict = say("order.stays" if none["accuracy"] < bag + 0.1 else "order.rises", lang)
        out.append(say("order.none", lang, accuracy=none["accuracy"], verdict=verdict))
    sep = say("sep", lang)
    learned = [r for r in rows if r["scheme"] != "none" and r["accuracy"] >= 0.9]
    weak = [r for r in rows if r["scheme"] != "none" and r["accuracy"] < 0.9]
    if learned:
        out.append(say("order.learned", lang, rows=sep.join(f"{r['scheme']} {r['accuracy']:.3f}" for r in learned)))
    if weak:
        out.append(say("order.below", lang, rows=sep.join(f"{r['scheme']} {r['accuracy']:.3f}" for r in weak)))
    return out


def all_sentences(rows: list[dict], chance: float, bags: dict[str, float], lang: str = "en") -> list[str]:
    """``sentences`` for each task of ``bags`` (in its order)."""
    return [s for task, bag in bags.items() for s in sentences([r for r in rows if r["task"] == task], chance, bag,
                                                                 task, lang)]


def markdown_table(rows: list[dict], chance: float, bags: dict[str, float], lang: str = "en") -> str:
    """Schemes × tasks, test accuracy, with chance and the order-blind ceiling as the last rows."""
    tasks = list(bags)
    acc = {(r["scheme"], r["task"]): r["accuracy"] for r in rows}
    lines = [f"| {say('scheme', lang)} | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    lines += [f"| {s} | " + " | ".join(f"{acc[(s, t)]:.3f}" for t in tasks) + " |"
              for s in dict.fromkeys(r["scheme"] for r in rows)]
    lines.append(f"| {say('order.chance', lang)} | " + " | ".join(f"{chance:.3f}" for _ in tasks) + " |")
    lines.append(f"| {say('order.bag', lang)} | " + " | ".join(f"{bags[t]:.3f}" for t in tasks) + " |")
    return "\n".join(lines)


def _write(result: OrderStudyResult, lang: str) -> None:
    out, cfg = result.out, result.config
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["scheme", "task", "accuracy", "train_loss"])
    for r in result.rows:
        w.writerow([r["scheme"], r["task"], f"{r['accuracy']:.6f}", f"{r['train_loss']:.6f}"])
    atomic_write(out / "results.csv", buf.getvalue().encode())
    summary = {"config": asdict(cfg), "rows": result.rows, "chance": result.chance,
               "bag_baseline": result.bag_baseline, "sentences": result.sentences,
               "seconds": round(result.seconds, 1), "machine": machine(), "run": run_stamp()}
    atomic_json(out / "summary.json", summary)
    write_results(out, results_text(summary, lang), lang)


def results_text(summary: dict, lang: str) -> str:
    """The results file (results.md's text) of a run's summary.json, in ``lang``."""
    cfg, rows, chance, bags = summary["config"], summary["rows"], summary["chance"], summary["bag_baseline"]
    tasks = say("clauses", lang).join(say(f"order.{t}", lang) for t in bags)
    return "\n".join([
        say("order.title", lang), "", say("order.intro", lang, tasks=tasks), "",
        markdown_table(rows, chance, bags, lang), "", *[f"- {s}" for s in all_sentences(rows, chance, bags, lang)], "",
        say("order.encoder", lang, d_model=cfg["d_model"], heads=cfg["num_heads"], layers=cfg["num_layers"],
            steps=cfg["steps"], batch=cfg["batch_size"], seq_len=cfg["seq_len"], vocab=cfg["vocab_size"],
            test=cfg["test_size"], seed=cfg["seed"]),
        say("machine", lang, machine=localized(summary["machine"], lang)),
        say("order.wall", lang, seconds=summary["seconds"]), say("stamp", lang, **summary["run"]), ""])


def rerender(folder: str | os.PathLike, lang: str) -> tuple[Path, str, list[str]]:
    """A finished run's results file written again in ``lang`` from its summary.json, no training:
    (the file written, the table, the sentences)."""
    summary = finished_summary(folder)
    rows, chance, bags = summary["rows"], summary["chance"], summary["bag_baseline"]
    path = write_results(folder, results_text(summary, lang), lang)
    return path, markdown_table(rows, chance, bags, lang), all_sentences(rows, chance, bags, lang)
