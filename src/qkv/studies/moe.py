"""Mixture of experts at CPU scale: a dense GPT against MoE GPTs, with and without balancing.

Models (the same trunk, tokens, seed and budget; only the feed-forward differs; F the dense SwiGLU width):

    dense            SwiGLU of width F
    moe-active       E experts of width F/k, k per token: as many active feed-forward parameters as dense
                     (the router aside), E/k times its total; load-balancing loss (Fedus et al. 2021) × aux_coef
    moe-active-noaux the same without any balancing
    moe-aux-free     the same with DeepSeek-V3's aux-loss-free bias (arXiv 2412.19437 §2.1.2; Wang et al. 2024,
                     arXiv 2408.15664), γ = bias_speed
    moe-total        E experts of width F/E, k per token: as many total feed-forward parameters as dense;
                     load-balancing loss × aux_coef

Measured: validation bits per character (the recipe's evaluation windows), training tokens per second, and
MaxVio = max load / mean load − 1 of the training batches between evaluations (``qkv.training.expert_load``),
the mean over layers. Shapes: none (whole models).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..checks import check_positive_int
from ..models import ModelConfig
from ..models.config import NO_BIAS
from ..training.recipe import TrainConfig, train
from .pages import RESULTS, csv_bytes, finished_summary, localized, say, write_results, write_summary
from .progress import models_bar
from .runner import char_text, run_study

MODELS = ("dense", "moe-active", "moe-active-noaux", "moe-aux-free", "moe-total")
OUTPUTS = ("results.csv", *RESULTS.values(), "moe.png", "summary.json")
COLUMNS = ["model", "parameters", "active_parameters", "val_bpc", "tokens_per_s", "maxvio_first", "maxvio_last"]


@dataclass
class MoEStudyConfig:
    """The study's settings; ``MoEStudyConfig.quick()`` is the seconds-long smoke test."""

    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 256  # F, the dense SwiGLU width
    num_experts: int = 8  # E
    top_k: int = 2  # k
    aux_coef: float = 0.01  # the load-balancing loss's coefficient (Switch: 0.01)
    bias_speed: float = 0.001  # γ of the aux-loss-free bias (DeepSeek-V3: 0.001)
    context: int = 64
    max_tokens: int = 1 << 20  # training tokens per model
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 30
    evals: int = 8  # evaluations over training (the MaxVio and bpc curves)
    eval_windows: int = 64
    seed: int = 1337
    data: str | None = None
    device: str = "auto"
    threads: int | None = None

    def __post_init__(self) -> None:
        check_positive_int("threads", self.threads, optional=True)
        for name in ("d_model", "num_heads", "num_layers", "d_ff", "num_experts", "top_k", "context", "max_tokens",
                     "batch_size", "evals", "eval_windows"):
            check_positive_int(name, getattr(self, name))
        if self.top_k > self.num_experts or self.d_ff % self.num_experts:
            raise ValueError(f"need top_k <= num_experts and num_experts dividing d_ff, got top_k={self.top_k}, "
                             f"num_experts={self.num_experts}, d_ff={self.d_ff}")

    @classmethod
    def quick(cls, **overrides) -> "MoEStudyConfig":
        """Seconds on 2 CPU cores: a smaller model and budget (a smoke test)."""
        return replace(cls(d_model=32, num_heads=2, num_layers=1, d_ff=64, num_experts=4, max_tokens=4096,
                           batch_size=8, context=32, warmup_steps=2, evals=2, eval_windows=4), **overrides)

    def model_config(self, name: str, vocab_size: int) -> ModelConfig:
        """The GPT of ``name`` (MODELS): one trunk, the feed-forward as the module notes say."""
        base = dict(vocab_size=vocab_size, d_model=self.d_model,
                    attention=dict(num_heads=self.num_heads, **NO_BIAS),
                    position=dict(kind="rope"), feed_forward=dict(activation="swiglu", bias=False, d_ff=self.d_ff),
                    normalization=dict(kind="rmsnorm"), num_layers=self.num_layers, max_len=self.context)
        if name == "dense":
            return ModelConfig(**base)
        width = self.d_ff // self.num_experts if name == "moe-total" else self.d_ff // self.top_k
        moe = dict(num_experts=self.num_experts, top_k=self.top_k, d_expert=width)
        moe |= {"moe-active-noaux": {}, "moe-aux-free": dict(bias_update_speed=self.bias_speed)}.get(
            name, dict(aux_loss_coef=self.aux_coef))
        return ModelConfig(**base, moe=moe)


@dataclass
class MoEStudyResult:
    rows: list[dict]
    curves: dict[str, list[dict]]  # model -> [{step, val_bpc, maxvio}] at each evaluation
    sentences: list[str]
    table: str
    config: MoEStudyConfig
    seconds: float
    out: Path | None = None


def active_parameters(model) -> int:
    """Parameters one token uses: all but the routed experts' (E − k) unchosen ones."""
    total = sum(p.numel() for p in model.parameters())
    for block in model.blocks:
        ff = block.ff
        if hasattr(ff, "experts"):
            per = sum(p.numel() for p in ff.experts.parameters()) // ff.router.num_experts
            total -= per * (ff.router.num_experts - ff.router.top_k)
    return total


def run(config: MoEStudyConfig | None = None, *, out: str | os.PathLike | None = None, corpus=None,
        progress: bool = True, overwrite: bool = True, lang: str = "en") -> MoEStudyResult:
    """Train each of MODELS on the same tokens; write results.csv, the results file, moe.png, summary.json."""
    return run_study(run_models, config or MoEStudyConfig(), OUTPUTS, out=out, overwrite=overwrite, lang=lang, corpus=corpus,
                     progress=progress)


def run_models(cfg: MoEStudyConfig, out: Path | None, *, corpus, progress: bool, lang: str) -> MoEStudyResult:
    t0 = time.perf_counter()
    corpus, tokenizer, _ = char_text(corpus, cfg.data)
    steps = max(1, cfg.max_tokens // (cfg.batch_size * cfg.context))
    rows, curves = [], {}
    for name in models_bar(MODELS, desc="qkv study moe", enabled=progress, label=str):
        tc = TrainConfig(model=cfg.model_config(name, tokenizer.vocab_size), context=cfg.context,
                         max_steps=steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                         eval_interval=max(1, steps // cfg.evals), eval_windows=cfg.eval_windows, final_eval=False,
                         seed=cfg.seed, device=cfg.device, threads=cfg.threads, progress=False)
        result = train(tc, corpus=corpus, tokenizer=tokenizer)
        s, records = result.summary, result.metrics
        curves[name] = [{"step": r["step"], "val_bpc": r["val_bpc"], "maxvio": r.get("maxvio_mean")} for r in records]
        vio = [c["maxvio"] for c in curves[name] if c["maxvio"] is not None]
        rows.append({"model": name, "parameters": s["parameters"], "active_parameters": active_parameters(result.model),
                     "val_bpc": s["val_bpc"], "tokens_per_s": s["tokens_per_s"],
                     "maxvio_first": vio[0] if vio else float("nan"), "maxvio_last": vio[-1] if vio else float("nan")})
    res = MoEStudyResult(rows=rows, curves=curves, sentences=sentences(rows, lang), table=markdown_table(rows, lang),
                         config=cfg, seconds=time.perf_counter() - t0, out=out)
    if out is not None:
        (out / "results.csv").write_bytes(csv_bytes(rows, COLUMNS))
        plot(curves, out / "moe.png")
        write_summary(out, {"rows": rows, "curves": curves, "config": asdict(cfg), "seconds": res.seconds},
                      corpus.source, results_text, lang)
    return res


def text(key: str, lang: str, **values) -> str:
    """The study's sentence ``moe.KEY`` in ``lang`` (``qkv.studies.pages.say``)."""
    return say(f"moe.{key}", lang, **values)


def markdown_table(rows: list[dict], lang: str = "en") -> str:
    lines = [text("header", lang), "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['parameters']:,} | {r['active_parameters']:,} | {r['val_bpc']:.3f} | "
                     f"{r['tokens_per_s']:,.0f} | {vio(r['maxvio_first'])} | {vio(r['maxvio_last'])} |")
    return "\n".join(lines)


def vio(value: float) -> str:
    return "—" if value != value else f"{value:.2f}"  # NaN: a dense model has no experts


def sentences(rows: list[dict], lang: str = "en") -> list[str]:
    by = {r["model"]: r for r in rows}
    best = min(rows, key=lambda r: r["val_bpc"])
    sep = say("sep", lang)
    ratios = sep.join(f"{r['model']} {r['tokens_per_s'] / by['dense']['tokens_per_s']:.2f}×" for r in rows
                      if r["model"] != "dense")
    return [text("best", lang, best=best["model"], bpc=best["val_bpc"], dense=by["dense"]["val_bpc"]),
            text("balance", lang, noaux=by["moe-active-noaux"]["maxvio_last"], aux=by["moe-active"]["maxvio_last"],
                 free=by["moe-aux-free"]["maxvio_last"]),
            text("speed", lang, ratios=ratios), text("scale", lang), text("anchors", lang)]


def results_text(summary: dict, lang: str) -> str:
    """The results file of ``lang`` from a finished run's summary.json."""
    c, rows = summary["config"], summary["rows"]
    parts = [text("title", lang), "", text("intro", lang, tokens=f"{c['max_tokens']:,}"), "",
             text("models", lang, d_model=c["d_model"], heads=c["num_heads"], layers=c["num_layers"], d_ff=c["d_ff"],
                  E=c["num_experts"], k=c["top_k"], aux=c["aux_coef"], gamma=c["bias_speed"], seed=c["seed"]), "",
             markdown_table(rows, lang), "", *[s + "\n" for s in sentences(rows, lang)],
             "![MoE study](study-moe.png)", "", text("wall", lang, minutes=summary["seconds"] / 60),
             say("corpus", lang, corpus=localized(summary["corpus"], lang)),
             say("machine", lang, machine=localized(summary["machine"], lang)),
             say("stamp", lang, **summary["run"])]
    return "\n".join(parts) + "\n"


def rerender(folder: str | os.PathLike, lang: str) -> tuple[Path, str, list[str]]:
    """A finished run's results file written again in ``lang`` from its summary.json (no training)."""
    summary = finished_summary(folder)
    path = write_results(folder, results_text(summary, lang), lang)
    return path, markdown_table(summary["rows"], lang), sentences(summary["rows"], lang)


def plot(curves: dict[str, list[dict]], path: Path) -> Path:
    """Validation bpc and MaxVio against the step, one line per model."""
    from matplotlib.figure import Figure

    from ..viz.figures import save_png

    fig = Figure(figsize=(10, 4), layout="tight")
    a, b = fig.subplots(1, 2)
    for i, (name, points) in enumerate(curves.items()):
        steps, color = [p["step"] for p in points], f"C{i}"  # one colour per model in both panels
        a.plot(steps, [p["val_bpc"] for p in points], label=name, color=color)
        if any(p["maxvio"] is not None for p in points):
            b.plot(steps, [p["maxvio"] for p in points], label=name, color=color)
    a.set(xlabel="step", ylabel="bits per character", title="validation bpc")
    b.set(xlabel="step", ylabel="MaxVio (mean over layers)", title="expert load imbalance (training batches)")
    a.legend()
    b.legend()
    save_png(fig, path, dpi=100)
    return path
