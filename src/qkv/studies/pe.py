"""Length extrapolation: train identical small GPTs that differ only in positional scheme at
length L, then score the same validation text at L, 2L, 4L and 8L.

The setting of Press et al. 2022 (ALiBi, Table 2) at laptop scale: character-level, the
embedded corpus, one token budget and one seed for every scheme. Evaluation uses
*non-overlapping* windows: the validation text is cut into ``eval_chunks`` chunks of 8L + 1
characters spread evenly over it, and each chunk into windows of length T ∈ {L, 2L, 4L, 8L}
(window k predicts characters kT+1 … kT+T of the chunk), so every length predicts exactly the
same 8L characters per chunk and only the context available differs. A scheme that
extrapolates gets *lower* loss at longer T (more context on average); one that does not gets
higher loss past position L.

Only learned PE has parameters tied to max_len: it gets max_len = L and is reported as n/a
beyond it (``LearnedPositionalEmbedding`` refuses those positions); every other model gets
max_len = 8L, which changes nothing but the length check.

Shapes: N windows, T evaluation length, V vocabulary.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_positive_int
from ..fileio import atomic_write
from ..models import POSITIONAL, ModelConfig
from ..models.config import NO_BIAS
from ..training.recipe import LN2, TrainConfig, train
from .pages import RESULTS, csv_bytes, finished_summary, localized, say, write_results, write_summary
from .progress import models_bar
from .runner import char_text, run_study

SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")  # every position.kind
DEFAULT_SCHEMES = SCHEMES[:5]  # what the published results (docs/studies.md) cover; t5 with --schemes
FACTORS = (1, 2, 4, 8)  # evaluation lengths, in multiples of L
TOLERANCE = 0.10  # "stayed within 10 % of its loss at L"
OUTPUTS = ("results.csv", *RESULTS.values(), "positions.csv", "pe.png", "summary.json")
assert set(SCHEMES) == set(POSITIONAL)


@dataclass
class PEStudyConfig:
    """The study's settings; ``PEStudyConfig.quick()`` is the one-minute version."""

    train_len: int = 64  # L
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 4
    max_tokens: int = 1 << 20  # training tokens per model (512 steps of 32 × 64)
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    eval_chunks: int = 128  # validation chunks of 8L + 1 characters
    seeds: int = 1  # models per scheme: seed, seed + 1, …
    seed: int = 1337
    data: str | None = None  # None: the embedded corpus
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    device: str = "auto"
    threads: int | None = None  # CPU threads; None: the cores other processes leave free, fixed for the whole study

    def __post_init__(self) -> None:
        check_positive_int("threads", self.threads, optional=True)
        for name in ("train_len", "d_model", "num_heads", "num_layers", "max_tokens", "batch_size",
                     "eval_chunks", "seeds"):
            check_positive_int(name, getattr(self, name))
        self.schemes = tuple(self.schemes)
        bad = [s for s in self.schemes if s not in SCHEMES]
        if bad or not self.schemes:
            raise ValueError(f"schemes must be a non-empty subset of {SCHEMES}, got {self.schemes}")

    @classmethod
    def quick(cls, **overrides) -> "PEStudyConfig":
        """About a minute on 2 free CPU cores: a smaller model, 160 K training tokens, 16 chunks."""
        return replace(cls(d_model=64, num_heads=4, num_layers=2, max_tokens=160 * 1024, batch_size=16,
                           warmup_steps=10, eval_chunks=16), **overrides)

    def model_config(self, scheme: str, vocab_size: int) -> ModelConfig:
        """Identical models; only learned PE has a table sized by max_len (L), the others allow 8L.
        Token embeddings are scaled by √d_model (the paper's §3.4) so that sinusoids of amplitude 1
        do not drown N(0, 0.02) token vectors; every scheme gets the same scaling."""
        max_len = self.train_len if scheme == "learned" else self.train_len * FACTORS[-1]
        return study_model_config(scheme, vocab_size, d_model=self.d_model, num_heads=self.num_heads,
                                  num_layers=self.num_layers, max_len=max_len)


def study_model_config(scheme: str, vocab_size: int, *, d_model: int, num_heads: int, num_layers: int,
                       max_len: int) -> ModelConfig:
    """The studies' GPT: no biases, token embeddings × √d_model (Vaswani §3.4), position kind ``scheme``."""
    return ModelConfig(vocab_size=vocab_size, d_model=d_model,
                       attention=dict(num_heads=num_heads, **NO_BIAS),
                       position=dict(kind=scheme), feed_forward=dict(bias=False), embedding=dict(scale=True),
                       num_layers=num_layers, max_len=max_len)


@dataclass
class PEStudyResult:
    """What ``run`` returns: one row per (scheme, eval_len), per-position losses, sentences."""

    rows: list[dict]
    positions: dict[tuple[str, int], list[float]]  # (scheme, eval_len) -> mean nats at each position
    sentences: list[str]
    table: str  # Markdown
    config: PEStudyConfig
    seconds: float
    parameters: dict[str, int] = field(default_factory=dict)
    out: Path | None = None

    def bpc(self, scheme: str, eval_len: int) -> float:
        """Mean validation bits per character (NaN where n/a)."""
        return next(r["bpc"] for r in self.rows if r["scheme"] == scheme and r["eval_len"] == eval_len)


# --- evaluation ------------------------------------------------------------------------------

def chunk_starts(n_tokens: int, chunk: int, count: int) -> list[int]:
    """Starts of ``count`` chunks of ``chunk`` + 1 tokens spread evenly over a split (fewer if short)."""
    last = n_tokens - chunk - 1
    if last < 0:
        raise ValueError(f"validation text is {n_tokens} tokens; need at least {chunk + 1} for one chunk of 8L + 1")
    idx = torch.linspace(0, last, min(count, last + 1)).round().long().unique()
    return idx.tolist()


@torch.no_grad()
def position_losses(model, ids: Tensor, starts: list[int], chunk: int, T: int, *, batch_size: int = 32) -> Tensor:
    """Mean next-token cross-entropy (nats) at each position 0 … T−1 of the non-overlapping windows
    of length T that tile each chunk ``ids[s : s + chunk + 1]``; returns (T,) float64."""
    if chunk % T:
        raise ValueError(f"the chunk length {chunk} must be a multiple of the window length {T}")
    device = next(model.parameters()).device
    wins = torch.stack([ids[s + k:s + k + T + 1] for s in starts for k in range(0, chunk, T)])  # (N, T+1)
    total = torch.zeros(T, dtype=torch.float64)
    model.eval()
    for lo in range(0, len(wins), batch_size):
        rows = wins[lo:lo + batch_size].to(device)  # (B, T+1)
        logits = model(rows[:, :-1]).logits.float()  # (B, T, V)
        nats = F.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none")  # (B, T)
        total += nats.sum(0).double().cpu()
    return total / len(wins)


# --- the study -------------------------------------------------------------------------------

def run(config: PEStudyConfig | None = None, *, out: str | os.PathLike | None = None, corpus=None,
        progress: bool = True, overwrite: bool = True, lang: str = "en") -> PEStudyResult:
    """Train one GPT per scheme (and seed), score it at L, 2L, 4L, 8L; write the results to ``out``.

    Args:
        config: the settings (default ``PEStudyConfig()``: tens of minutes on two CPU cores).
        out: a directory for results.csv, results.md, positions.csv, pe.png, summary.json (None: none).
        corpus: a ``qkv.data.Corpus`` (default ``load_corpus(config.data)``).
        progress: a progress bar across the schemes.
        overwrite: replace the study's files in ``out``; False refuses a directory that has them.
        lang: the language of the table, the sentences and the results file (en: results.md, zh:
            results.zh.md; ``rerender`` writes the other one later from summary.json).
    """
    return run_study(_run, config or PEStudyConfig(), OUTPUTS, out=out, overwrite=overwrite, lang=lang, corpus=corpus,
                     progress=progress)


def _run(cfg: PEStudyConfig, out: Path | None, *, corpus, progress: bool, lang: str) -> PEStudyResult:
    t0 = time.perf_counter()
    corpus, tokenizer, val_ids = char_text(corpus, cfg.data)  # val_ids (N_val,)
    L, lengths = cfg.train_len, [cfg.train_len * f for f in FACTORS]
    starts = chunk_starts(len(val_ids), lengths[-1], cfg.eval_chunks)
    jobs = [(seed, s) for seed in range(cfg.seed, cfg.seed + cfg.seeds) for s in cfg.schemes]
    per_seed: dict[tuple[str, int], list[Tensor | None]] = {(s, T): [] for s in cfg.schemes for T in lengths}
    params: dict[str, int] = {}
    for seed, scheme in models_bar(jobs, desc="qkv study pe", enabled=progress,
                                   label=lambda job: f"{job[1]}, seed {job[0]}"):
        model = train_model(cfg, cfg.model_config(scheme, tokenizer.vocab_size), seed, corpus, tokenizer,
                            context=L, batch_size=cfg.batch_size)
        params[scheme] = model.num_parameters()
        for T in lengths:
            per_seed[(scheme, T)].append(_score(model, val_ids, starts, lengths[-1], T))
    rows, positions = summarise(per_seed, L, cfg.seeds)
    result = PEStudyResult(rows=rows, positions=positions, sentences=sentences(rows, L, lang), table="",
                           config=cfg, seconds=time.perf_counter() - t0, parameters=params, out=out)
    result.table = markdown_table(rows, L, cfg.seeds, lang)
    if out is not None:
        _write(result, corpus, len(starts), lang)
    return result


def study_train_config(cfg, mconf: ModelConfig, seed: int, *, context: int, batch_size: int) -> TrainConfig:
    """The recipe's settings for one study model: ``cfg``'s budget and optimizer (any study config with
    max_tokens, lr, warmup_steps, device, threads), no evaluation while training."""
    return TrainConfig(model=mconf, context=context, max_tokens=cfg.max_tokens, batch_size=batch_size, lr=cfg.lr,
                       warmup_steps=cfg.warmup_steps, eval_interval=1 << 30, eval_windows=8, final_eval=False,
                       seed=seed, device=cfg.device, threads=cfg.threads, progress=False)


def train_model(cfg, mconf: ModelConfig, seed: int, corpus, tokenizer, *, context: int, batch_size: int):
    """One model trained by the recipe (``qkv.training.recipe.train``) as ``study_train_config`` says."""
    tc = study_train_config(cfg, mconf, seed, context=context, batch_size=batch_size)
    return train(tc, corpus=corpus, tokenizer=tokenizer).model


def _score(model, val_ids: Tensor, starts: list[int], chunk: int, T: int) -> Tensor | None:
    """Per-position loss (T,), or None where the model cannot run (learned PE past max_len)."""
    try:
        return position_losses(model, val_ids, starts, chunk, T)
    except ValueError:
        if model.config.position.kind == "learned" and T > model.config.max_len:
            return None  # n/a: no embedding exists for those positions
        raise


def summarise(per_seed: dict, train_len: int, seeds: int) -> tuple[list[dict], dict]:
    """Rows {scheme, eval_len, bpc[, bpc_std, seeds], ratio_to_L} and mean per-position losses of
    ``per_seed`` ((scheme, T) -> one (T,) loss per seed, None where n/a)."""
    rows, positions = [], {}
    for (scheme, T), runs in per_seed.items():
        if any(r is None for r in runs):
            bpcs = [math.nan] * len(runs)
        else:
            bpcs = [float(r.mean()) / LN2 for r in runs]  # char tokenizer: bits per token = per character
            positions[(scheme, T)] = torch.stack(runs).mean(0).tolist()
        mean = sum(bpcs) / len(bpcs)
        row = {"scheme": scheme, "eval_len": T, "bpc": mean}
        if seeds > 1:
            row |= {"bpc_std": float(torch.tensor(bpcs).std()) if not math.isnan(mean) else math.nan,
                    "seeds": seeds}
        rows.append(row)
    for row in rows:
        at_l = next(r["bpc"] for r in rows if r["scheme"] == row["scheme"] and r["eval_len"] == train_len)
        row["ratio_to_L"] = row["bpc"] / at_l
    return rows, positions


def sentences(rows: list[dict], L: int, lang: str = "en") -> list[str]:
    """A few sentences read off the numbers, in ``lang``: the best at L, who stayed within 10 % of its
    loss at L, who did not, who is n/a."""
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    longest = max(r["eval_len"] for r in rows)
    by = {(r["scheme"], r["eval_len"]): r for r in rows}
    kept, broke, na = [], [], []
    for s in schemes:
        ratios = [(r["eval_len"], r["ratio_to_L"]) for r in rows if r["scheme"] == s and r["eval_len"] > L]
        if any(math.isnan(x) for _, x in ratios):
            na.append(s)
        elif all(x <= 1 + TOLERANCE for _, x in ratios):
            kept.append(s)
        else:
            first = next(T for T, x in ratios if x > 1 + TOLERANCE)
            broke.append(say("pe.broke one", lang, scheme=s, rise=100 * (by[(s, first)]["ratio_to_L"] - 1),
                             first=first, bpc=by[(s, longest)]["bpc"], longest=longest))
    sep, tol = say("sep", lang), 100 * TOLERANCE
    best = min((r for r in rows if r["eval_len"] == L), key=lambda r: r["bpc"])
    others = sep.join(f"{r['scheme']} {r['bpc']:.3f}" for r in rows if r["eval_len"] == L and r is not best)
    out = [say("pe.best", lang, L=L, best=best["scheme"], bpc=best["bpc"], others=others)]
    if kept:
        change = sep.join(f"{s} {100 * (by[(s, longest)]['ratio_to_L'] - 1):+.1f} %" for s in kept)
        out.append(say("pe.kept", lang, tol=tol, factor=longest // L, longest=longest, kept=sep.join(kept),
                       change=change))
    else:
        out.append(say("pe.none kept", lang, tol=tol, longest=longest))
    if broke:
        out.append(say("pe.broke", lang, tol=tol, broke=say("clauses", lang).join(broke)))
    if na:
        out.append(say("pe.na", lang, na=sep.join(na), L=L))
    return out


def markdown_table(rows: list[dict], L: int, seeds: int = 1, lang: str = "en") -> str:
    """Schemes × evaluation lengths, bits per character (± std over seeds), and the ratio at the longest."""
    lengths = sorted({r["eval_len"] for r in rows})
    by = {(r["scheme"], r["eval_len"]): r for r in rows}
    na = say("n/a", lang)

    def cell(r: dict) -> str:
        if math.isnan(r["bpc"]):
            return na
        return f"{r['bpc']:.3f}" + (f" ± {r['bpc_std']:.3f}" if seeds > 1 else "")

    head = f"| {say('scheme', lang)} | " + " | ".join(f"{T} ({T // L}L)" for T in lengths) + f" | {lengths[-1]} / {L} |"
    lines = [head, "|" + "---|" * (len(lengths) + 2)]
    for s in dict.fromkeys(r["scheme"] for r in rows):
        ratio = by[(s, lengths[-1])]["ratio_to_L"]
        lines.append(f"| {s} | " + " | ".join(cell(by[(s, T)]) for T in lengths)
                     + f" | {na if math.isnan(ratio) else f'{ratio:.2f}'} |")
    return "\n".join(lines)


# --- output ----------------------------------------------------------------------------------

def _write(result: PEStudyResult, corpus, n_chunks: int, lang: str) -> None:
    out, cfg = result.out, result.config
    columns = ["scheme", "eval_len", "bpc"] + (["bpc_std", "seeds"] if cfg.seeds > 1 else []) + ["ratio_to_L"]
    atomic_write(out / "results.csv", csv_bytes(result.rows, columns))
    pos_rows = [{"scheme": s, "eval_len": T, "position": i, "loss_nats": v}
                for (s, T), losses in result.positions.items() for i, v in enumerate(losses)]
    atomic_write(out / "positions.csv", csv_bytes(pos_rows, ["scheme", "eval_len", "position", "loss_nats"]))
    plot(result, out / "pe.png")
    fields = {"config": asdict(cfg), "rows": result.rows, "sentences": result.sentences,
              "parameters": result.parameters, "seconds": round(result.seconds, 1), "eval_chunks": n_chunks}
    write_summary(out, fields, corpus.source, results_text, lang)


def results_text(summary: dict, lang: str) -> str:
    """The results file (results.md's text) of a run's summary.json, in ``lang``."""
    cfg, rows = summary["config"], summary["rows"]
    L, seeds = cfg["train_len"], cfg["seeds"]
    seed_range = say("pe.seeds", lang, last=cfg["seed"] + seeds - 1) if seeds > 1 else ""
    counts = say("sep", lang).join(f"{k} {v:,}" for k, v in summary["parameters"].items())
    return "\n".join([
        say("pe.title", lang, L=L), "", say("pe.intro", lang, chunks=summary["eval_chunks"], chars=FACTORS[-1] * L), "",
        markdown_table(rows, L, seeds, lang), "", *[f"- {s}" for s in sentences(rows, L, lang)], "",
        say("pe.models", lang, d_model=cfg["d_model"], heads=cfg["num_heads"], layers=cfg["num_layers"],
            tokens=cfg["max_tokens"], batch=cfg["batch_size"], L=L, seed=cfg["seed"], seeds=seed_range,
            longest=FACTORS[-1] * L),
        say("pe.parameters", lang, counts=counts), say("corpus", lang, corpus=localized(summary["corpus"], lang)),
        say("machine", lang, machine=localized(summary["machine"], lang)),
        say("pe.wall", lang, minutes=summary["seconds"] / 60), say("stamp", lang, **summary["run"]), ""])


def rerender(folder: str | os.PathLike, lang: str) -> tuple[Path, str, list[str]]:
    """A finished run's results file written again in ``lang`` from its summary.json, no training:
    (the file written, the table, the sentences)."""
    summary = finished_summary(folder)
    rows, L, seeds = summary["rows"], summary["config"]["train_len"], summary["config"]["seeds"]
    path = write_results(folder, results_text(summary, lang), lang)
    return path, markdown_table(rows, L, seeds, lang), sentences(rows, L, lang)


def plot(result: PEStudyResult, path: Path) -> Path:
    """Left: bpc against evaluation length, one line per scheme. Right: loss per position at 8L."""
    from matplotlib.figure import Figure

    from ..viz.figures import save_png

    fig = Figure(figsize=(10, 3.8), layout="tight")
    a, b = fig.subplots(1, 2)
    plot_panels(a, b, result.rows, result.positions, result.config.train_len)
    return save_png(fig, path, dpi=80)


def plot_panels(a, b, rows: list[dict], positions: dict, L: int) -> None:
    """On axes ``a``: bpc against evaluation length, one line per scheme; on ``b``: loss per position
    at the longest length (buckets of L/8 positions)."""
    lengths = sorted({r["eval_len"] for r in rows})
    bpc = {(r["scheme"], r["eval_len"]): r["bpc"] for r in rows}
    for s in dict.fromkeys(r["scheme"] for r in rows):
        ys = [bpc[(s, T)] for T in lengths]
        line, = a.plot(lengths, ys, marker="o", label=s)
        if (s, lengths[-1]) in positions:
            losses = torch.tensor(positions[(s, lengths[-1])]) / LN2  # bits per character
            k = max(1, L // 8)  # average over buckets of L/8 positions
            xs = torch.arange(0, len(losses), k).float() + (k - 1) / 2
            b.plot(xs, losses[: len(losses) // k * k].view(-1, k).mean(1), color=line.get_color(), label=s)
    a.set_xscale("log", base=2)
    a.set_xticks(lengths, [f"{T}\n({T // L}L)" for T in lengths])
    a.set(xlabel="evaluation length", ylabel="validation bits per character", title=f"trained at L = {L}")
    a.legend(fontsize=8)
    b.axvline(L, color="gray", linestyle="--", linewidth=1)
    b.annotate(f" L = {L}", (L, 1), xycoords=("data", "axes fraction"), va="top", fontsize=8, color="gray")
    b.set(xlabel="position in the window", ylabel="bits per character",
          title=f"loss per position, windows of {lengths[-1]}")
    b.legend(fontsize=8)
