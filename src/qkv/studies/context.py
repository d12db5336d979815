"""Long context as the papers measured it: RoPE scaled at evaluation time (position interpolation, NTK-aware,
dynamic NTK, YaRN) against ALiBi, T5's relative bias, sinusoidal PE and no PE.

``qkv study pe``'s setting (``qkv.studies.pe``: character-level GPTs on the embedded corpus, the same
non-overlapping windows, the same characters scored at every length), stretched to 16L and run at two
training lengths L (64 and 256) on the same token budget and tokens per step, over several seeds.

The rope+X rows are *one* trained rope model per (L, seed), its weights loaded into a model whose
``position`` carries the scaling for the evaluation length T, with s = T / L (s = 1 at L: unchanged):

    rope+PI           RopeScaling linear, factor s: θ_i / s (Chen et al. 2023)
    rope+NTK          static NTK-aware: position.base · s^(d/(d−2)) (bloc97 2023); a base change, not a
                      scaling type (RopeScaling's types are Hugging Face's, which has no static NTK)
    rope+dynamic NTK  RopeScaling dynamic, factor s, L₀ = L: base · (s·T/L − (s − 1))^(d/(d−2)) for the whole
                      window, as transformers computes one forward of T tokens
    rope+YaRN         RopeScaling yarn, factor s, L₀ = L: NTK-by-parts and the 0.1·ln s + 1 temperature
                      (Peng et al. 2023)

Shapes: N windows, T evaluation length, V vocabulary.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from multiprocessing import get_context
from pathlib import Path

from torch import Tensor

from ..checks import check_positive_int
from ..data import load_corpus, train_tokenizer
from ..fileio import atomic_json, atomic_write
from ..models import GPT, ModelConfig
from ..nn.rope_scaling import RopeScaling
from ..runtime import device_type, fixed_threads
from .pages import RESULTS, csv_bytes, finished_summary, localized, say, write_results, write_summary
from ..training.distributed import Dist
from ..training.finetune import Base
from ..training.recipe import Recipe
from .pe import (chunk_starts, markdown_table, plot_panels, position_losses, sentences,
                 study_model_config, study_train_config, summarise, train_model)
from .context_verdicts import reading, verdicts
from .progress import models_bar
from .runner import run_study

TRAINED = ("none", "sinusoidal", "rope", "alibi", "t5")  # one model each
SCALED = {"rope+PI": "linear", "rope+NTK": "ntk", "rope+dynamic NTK": "dynamic", "rope+YaRN": "yarn"}
SCHEMES = ("none", "sinusoidal", "rope", *SCALED, "alibi", "t5")
FINETUNED = {"rope+PI (ft 4L)": "rope+PI", "rope+YaRN (ft 4L)": "rope+YaRN"}  # row -> the scaling fine-tuned
HELD = {f"{row[:-1]}, s = 4)": row for row in FINETUNED}  # the fine-tuned model kept at its factor 4 past 4L
ROWS = (*SCHEMES, *FINETUNED, *HELD)  # the order of the tables
FT_FACTOR, FT_TOKENS, FT_LR = 4, 0.05, 0.3  # fine-tune at 4L on 5 % of the pre-training tokens, lr × 0.3
FT_STEP = 4  # the fine-tune's steps carry a quarter of pre-training's tokens (at least one 4L window)
FINETUNE = {"factor": FT_FACTOR, "token_share": FT_TOKENS, "lr_scale": FT_LR, "step_share": FT_STEP}  # in summary.json
FACTORS = (1, 2, 4, 8, 16)  # evaluation lengths, in multiples of L
OUTPUTS = ("results.csv", *RESULTS.values(), "positions.csv", "context.png", "summary.json")
EVAL_TOKENS = 4096  # tokens per evaluation batch: one window of 16 × 256, or 64 of 64


@dataclass
class ContextStudyConfig:
    """The study's settings; ``ContextStudyConfig.quick()`` is the well-under-a-minute version.

    The default trains 30 models (5 schemes × 2 L × 3 seeds) and fine-tunes 12, in ``workers`` processes
    (default: one per free core, each on ``threads / workers`` threads); results.md says how long it took."""

    train_lens: tuple[int, ...] = (64, 256)  # L, each trained on the same tokens
    eval_factors: tuple[int, ...] = FACTORS  # evaluation lengths T = f·L; must hold 1
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 4
    max_tokens: int = 3 << 18  # training tokens per model (384 steps), the same at every L
    step_tokens: int = 2048  # tokens per optimizer step at every L: batch = step_tokens / L
    lr: float = 3e-3
    warmup_steps: int = 30
    eval_chunks: int = 12  # validation chunks of 16L + 1 characters
    seeds: int = 3
    seed: int = 1337
    data: str | None = None
    schemes: tuple[str, ...] = SCHEMES
    finetune: bool = True  # add FINETUNED's rows: PI and YaRN fine-tuned at 4L from the trained rope model
    device: str = "auto"
    threads: int | None = None  # all workers together; None: the free cores (qkv.runtime.cpu_threads)
    workers: int | None = None  # processes training models side by side; None: one per thread

    def __post_init__(self) -> None:
        check_positive_int("threads", self.threads, optional=True)
        check_positive_int("workers", self.workers, optional=True)
        for name in ("d_model", "num_heads", "num_layers", "max_tokens", "step_tokens", "eval_chunks", "seeds"):
            check_positive_int(name, getattr(self, name))
        self.schemes, self.train_lens = tuple(self.schemes), tuple(self.train_lens)
        bad = [s for s in self.schemes if s not in SCHEMES]
        if bad or not self.schemes:
            raise ValueError(f"schemes must be a non-empty subset of {SCHEMES}, got {self.schemes}")
        for L in self.train_lens:
            check_positive_int("train_lens (each L)", L)
            if self.step_tokens % L:
                raise ValueError(f"step_tokens {self.step_tokens} must be a multiple of every L, got L = {L}")
        self.eval_factors = tuple(sorted(set(check_factor(f) for f in self.eval_factors)))
        if not isinstance(self.finetune, bool):
            raise ValueError(f"finetune must be True or False, got {self.finetune!r}")
        if 1 not in self.eval_factors:
            raise ValueError(f"eval_factors must include 1 (the training length L), got {self.eval_factors}")

    @classmethod
    def quick(cls, **overrides) -> "ContextStudyConfig":
        """A smoke test: a tiny model, L = 16 and 32, 16 K tokens, one seed, 2 chunks."""
        return replace(cls(train_lens=(16, 32), d_model=32, num_heads=2, num_layers=1, max_tokens=16 * 1024,
                           step_tokens=256, warmup_steps=4, eval_chunks=2, seeds=1), **overrides)

    def trained(self) -> tuple[str, ...]:
        """The models to train: each scheme, and rope for every rope+X."""
        wants_rope = self.finetune or set(SCALED) & set(self.schemes)
        return tuple(s for s in TRAINED if s in self.schemes or (s == "rope" and wants_rope))


def check_factor(f) -> int:
    """An evaluation length in multiples of L: a positive integer; ValueError otherwise."""
    if isinstance(f, bool) or not isinstance(f, (int, float)) or f <= 0:
        raise ValueError(f"an evaluation length factor must be > 0, got {f!r}")
    if f != int(f):
        raise ValueError(f"an evaluation length must be a multiple of L, got {f}L")
    return int(f)


def parse_eval_len(text: str) -> int:
    """``4L`` or ``4`` -> 4 (``check_factor``); ValueError naming the expected form otherwise."""
    try:
        value = float(text[:-1] if text.upper().endswith("L") else text)
    except ValueError:
        raise ValueError(f"an evaluation length is a multiple of L such as 4L, got {text!r}") from None
    return check_factor(value)


def scaled_config(config: ModelConfig, scheme: str, factor: float, train_len: int) -> ModelConfig:
    """``config`` (a rope model trained at ``train_len``) with ``scheme``'s scaling at ``factor`` s."""
    kind, position = SCALED[scheme], config.position
    if not factor > 0:
        raise ValueError(f"a RoPE scaling factor must be > 0, got {factor!r}")
    if kind == "ntk":  # bloc97's NTK-aware base change: θ' = θ·α^(d/(d−2))
        d = config.rope_dim
        return config.replace(position=replace(position, base=position.base * factor ** (d / (d - 2))))
    fields = {"factor": factor} | ({} if kind == "linear" else {"original_max_position_embeddings": train_len})
    return config.replace(position=replace(position, scaling=RopeScaling(type=kind, **fields)))


def scaled_model(model: GPT, scheme: str, factor: float, train_len: int) -> GPT:
    """A GPT with ``model``'s weights and ``scheme``'s scaling at ``factor`` (``scaled_config``)."""
    out = GPT(scaled_config(model.config, scheme, factor, train_len)).to(next(model.parameters()).device)
    out.load_state_dict(model.state_dict())
    return out.eval()


@dataclass
class ContextStudyResult:
    """What ``run`` returns: rows {train_len, scheme, eval_len, bpc, …}, per-position losses, sentences."""

    rows: list[dict]
    positions: dict[tuple[int, str, int], list[float]]  # (L, scheme, T) -> mean nats at each position
    sentences: list[str]
    table: str
    config: ContextStudyConfig
    seconds: float
    parameters: dict[str, int] = field(default_factory=dict)
    out: Path | None = None

    def bpc(self, train_len: int, scheme: str, eval_len: int) -> float:
        return next(r["bpc"] for r in self.rows
                    if (r["train_len"], r["scheme"], r["eval_len"]) == (train_len, scheme, eval_len))


def run(config: ContextStudyConfig | None = None, *, out: str | os.PathLike | None = None, corpus=None,
        progress: bool = True, overwrite: bool = True, lang: str = "en") -> ContextStudyResult:
    """Train each scheme at each L (and seed), score it (and rope's scalings) at every f·L; write to ``out``.

    Args as ``qkv.studies.pe.run``; ``out`` receives results.csv, results.md (or results.zh.md),
    positions.csv, context.png and summary.json.
    """
    return run_study(_run, config or ContextStudyConfig(), OUTPUTS, out=out, overwrite=overwrite, lang=lang,
                     corpus=corpus, progress=progress)


def study_workers(asked: int | None, threads: int, device: str) -> int:
    """Processes training side by side: ``asked``, else one per thread on a CPU; on a GPU one (the models are
    small, and each process would take its own CUDA context on the same device), unless asked for more."""
    if asked is None and device_type(device) == "cuda":
        return 1
    return min(asked or threads, threads)


def _run(cfg: ContextStudyConfig, out: Path | None, *, corpus, progress: bool, lang: str) -> ContextStudyResult:
    t0 = time.perf_counter()
    cfg = replace(cfg, workers=study_workers(cfg.workers, cfg.threads, cfg.device))  # cfg.threads: those fixed
    corpus = corpus if corpus is not None else load_corpus(cfg.data)
    jobs = [(L, seed, s) for L in cfg.train_lens for seed in range(cfg.seed, cfg.seed + cfg.seeds)
            for s in cfg.trained()]
    done = run_jobs(cfg, corpus, jobs, progress)
    per_seed: dict[int, dict] = {L: {} for L in cfg.train_lens}
    params: dict[str, int] = {}
    for job in jobs:  # in seed order, whatever order the workers finished in
        scores, params[job[2]] = done[job]
        for name, losses in scores.items():
            per_seed[job[0]].setdefault(name, []).append(losses)
    rows, positions = [], {}
    for L in cfg.train_lens:
        order = {k: per_seed[L][k] for k in sorted(per_seed[L], key=lambda k: (ROWS.index(k[0]), k[1]))}
        got, pos = summarise(order, L, cfg.seeds)
        rows += [{"train_len": L} | r for r in got]
        positions |= {(L, s, T): v for (s, T), v in pos.items()}
    result = ContextStudyResult(rows=rows, positions=positions, sentences=all_sentences(rows, lang), table="",
                                config=cfg, seconds=time.perf_counter() - t0, parameters=params, out=out)
    result.table = tables(rows, cfg.seeds, lang)
    if out is not None:
        _write(result, corpus, lang)
    return result


def run_jobs(cfg: ContextStudyConfig, corpus, jobs: list[tuple], progress: bool) -> dict:
    """{(L, seed, scheme): (``score_rows``' losses, parameters)} of each job, trained in ``cfg.workers``
    processes of ``cfg.threads // cfg.workers`` threads (one worker: in this process), longest jobs first."""
    def label(job):
        return f"{job[2]} at L = {job[0]}, seed {job[1]}"
    bar = partial(models_bar, desc="qkv study context", enabled=progress, total=len(jobs))
    if cfg.workers == 1:
        return {job: model_scores(cfg, corpus, job)[1] for job in bar(jobs, label=label)}
    each = replace(cfg, threads=max(1, cfg.threads // cfg.workers), workers=1)
    order = sorted(jobs, key=lambda job: (job[2] != "rope", -job[0]))  # rope carries its scalings and fine-tunes
    with ProcessPoolExecutor(cfg.workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(model_scores, each, corpus, job) for job in order]
        try:
            return dict(bar((f.result() for f in as_completed(futures)), label=lambda done: label(done[0])))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # the jobs not started; the running ones end first
            raise


def model_scores(cfg: ContextStudyConfig, corpus, job: tuple) -> tuple[tuple, tuple[dict, int]]:
    """(job, (losses of every row the model gives, its parameters)): train the job's (L, seed, scheme) model,
    score it and its variants at every f·L on ``cfg.threads`` threads."""
    L, seed, scheme = job
    with fixed_threads(cfg.threads):
        tokenizer = train_tokenizer("char", corpus.train + corpus.val)
        mconf = study_model_config(scheme, tokenizer.vocab_size, d_model=cfg.d_model, num_heads=cfg.num_heads,
                                   num_layers=cfg.num_layers, max_len=L * cfg.eval_factors[-1])
        model = train_model(cfg, mconf, seed, corpus, tokenizer, context=L, batch_size=cfg.step_tokens // L)
        rows = variants(model, scheme, cfg, seed, corpus, tokenizer, L)
        return job, (score_rows(rows, cfg, tokenizer.encode_tensor(corpus.val), L), model.num_parameters())


def variants(model: GPT, scheme: str, cfg: ContextStudyConfig, seed: int, corpus, tokenizer, L: int) -> list:
    """(row, weights, scaling row or None, factor of f) for each row a model trained as ``scheme`` at L gives:
    itself; for rope each rope+X at s = f, and with ``cfg.finetune`` PI and YaRN fine-tuned at 4L, scored at
    s = max(4, f) and, as a fine-tuned checkpoint is used, at its own s = 4 (``HELD``)."""
    out = [(scheme, model, None, None)] if scheme in cfg.schemes else []
    if scheme == "rope":
        out += [(name, model, name, lambda f: f) for name in SCALED if name in cfg.schemes]
    if scheme == "rope" and cfg.finetune:
        for (row, name), held in zip(FINETUNED.items(), HELD):
            tuned = finetune(model, name, cfg, seed, corpus, tokenizer, L)
            out += [(row, tuned, name, lambda f: max(FT_FACTOR, f)), (held, tuned, name, lambda f: FT_FACTOR)]
    return out


def score_rows(rows: list, cfg: ContextStudyConfig, val_ids: Tensor, L: int) -> dict:
    """{(row, T): per-position loss (T,)} of ``variants``' rows at every T = f·L of ``cfg``."""
    chunk = L * cfg.eval_factors[-1]
    starts = chunk_starts(len(val_ids), chunk, cfg.eval_chunks)
    out = {}
    for name, model, scaling, factor in rows:
        for f in cfg.eval_factors:
            scored = model if scaling is None else scaled_model(model, scaling, factor(f), L)
            out[(name, f * L)] = position_losses(scored, val_ids, starts, chunk, f * L,
                                                 batch_size=max(1, EVAL_TOKENS // (f * L)))
    return out


def ft_tokens(max_tokens: int, share: float = FT_TOKENS) -> int:
    """The fine-tune's budget: ``share`` (5 %) of the pre-training tokens (at least one)."""
    return max(1, round(share * max_tokens))


def finetune(model: GPT, scheme: str, cfg: ContextStudyConfig, seed: int, corpus, tokenizer, L: int) -> GPT:
    """``model`` (rope, trained at L) with ``scheme``'s scaling at factor 4, trained further on windows of 4L
    for 5 % of the pre-training tokens in steps of a quarter of pre-training's tokens (at least one window) at
    0.3 × its lr, as PI (Chen et al. 2023, 1000 steps) and YaRN (Peng et al. 2023, 400 steps) fine-tune: the recipe's own loop, starting from these weights as it
    starts from a checkpoint's (the language-model task's ``base``)."""
    start = scaled_model(model, scheme, FT_FACTOR, L).train()
    T = FT_FACTOR * L
    budget = replace(cfg, max_tokens=ft_tokens(cfg.max_tokens), lr=cfg.lr * FT_LR, warmup_steps=0)
    tc = study_train_config(budget, start.config, seed, context=T, batch_size=max(1, cfg.step_tokens // (FT_STEP * T)))
    dist = Dist.from_env(tc.device)
    recipe = Recipe(tc, dist, corpus=corpus, tokenizer=tokenizer)
    recipe.task.base = Base(model=start, tokenizer=tokenizer, sha256="in memory", path=f"the rope model at L = {L}")
    try:
        return recipe.train().model.eval()
    finally:
        dist.close()


def by_train_len(rows: list[dict]) -> dict[int, list[dict]]:
    """The rows of each training length, without their train_len (pe's row form)."""
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(r["train_len"], []).append({k: v for k, v in r.items() if k != "train_len"})
    return out


def all_sentences(rows: list[dict], lang: str = "en") -> list[str]:
    """pe's sentences (best at L, who stayed within 10 %, who rose) for each L, each prefixed with its L."""
    return [f"L = {L}: {s}" for L, got in by_train_len(rows).items() for s in sentences(got, L, lang)]


def tables(rows: list[dict], seeds: int, lang: str = "en") -> str:
    """One pe table per training length, under its heading."""
    return "\n\n".join(say("context.trained", lang, L=L) + "\n\n" + markdown_table(got, L, seeds, lang)
                       for L, got in by_train_len(rows).items())


def _write(result: ContextStudyResult, corpus, lang: str) -> None:
    out, cfg = result.out, result.config
    columns = ["train_len", "scheme", "eval_len", "bpc"] + (["bpc_std", "seeds"] if cfg.seeds > 1 else [])
    atomic_write(out / "results.csv", csv_bytes(result.rows, columns + ["ratio_to_L"]))
    pos_rows = [{"train_len": L, "scheme": s, "eval_len": T, "position": i, "loss_nats": v}
                for (L, s, T), losses in result.positions.items() for i, v in enumerate(losses)]
    atomic_write(out / "positions.csv", csv_bytes(pos_rows, ["train_len", "scheme", "eval_len", "position",
                                                             "loss_nats"]))
    plot(result, out / "context.png")
    fields = {"config": asdict(cfg), "finetune": FINETUNE, "rows": result.rows,
              "verdict": verdicts(result.rows, cfg.seeds),
              "sentences": result.sentences,
              "parameters": result.parameters, "seconds": round(result.seconds, 1)}
    write_summary(out, fields, corpus.source, results_text, lang)


def results_text(summary: dict, lang: str) -> str:
    """The results file of a run's summary.json, in ``lang``."""
    cfg, rows = summary["config"], summary["rows"]
    seeds = cfg["seeds"]
    counts = say("sep", lang).join(f"{k} {v:,}" for k, v in summary["parameters"].items())
    return "\n".join([
        say("context.title", lang), "",
        say("context.intro", lang, chunks=cfg["eval_chunks"], factor=cfg["eval_factors"][-1]), "",
        tables(rows, seeds, lang), "", *[f"- {s}" for s in all_sentences(rows, lang)], "", *reading(rows, lang), "",
        say("context.models", lang, d_model=cfg["d_model"], heads=cfg["num_heads"], layers=cfg["num_layers"],
            tokens=cfg["max_tokens"], step=cfg["step_tokens"], seed=cfg["seed"], last=cfg["seed"] + seeds - 1,
            std=say("context.std", lang) if seeds > 1 else ""),
        *([finetune_text(summary.get("finetune", FINETUNE), cfg["max_tokens"], lang)] if cfg.get("finetune") else []),
        say("pe.parameters", lang, counts=counts), say("corpus", lang, corpus=localized(summary["corpus"], lang)),
        say("machine", lang, machine=localized(summary["machine"], lang)),
        say("pe.wall", lang, minutes=summary["seconds"] / 60), say("stamp", lang, **summary["run"]), ""])


def finetune_text(ft: dict, max_tokens: int, lang: str) -> str:
    """The sentence on the fine-tuned rows, from the settings a run recorded (``FINETUNE``)."""
    return say("context.ft", lang, ft=ft["factor"], tokens=ft_tokens(max_tokens, ft["token_share"]),
               pct=100 * ft["token_share"], step=ft["step_share"], lr=ft["lr_scale"])


def rerender(folder: str | os.PathLike, lang: str) -> tuple[Path, str, list[str]]:
    """A finished run's results file written again in ``lang`` from its summary.json, no training; the verdicts
    in summary.json computed again from its rows (a run of an older qkv may lack them)."""
    summary = finished_summary(folder)
    rows = summary["rows"]
    atomic_json(Path(folder) / "summary.json", summary | {"verdict": verdicts(rows, summary["config"]["seeds"])})
    path = write_results(folder, results_text(summary, lang), lang)
    return path, tables(rows, summary["config"]["seeds"], lang), all_sentences(rows, lang)


def plot(result: ContextStudyResult, path: Path) -> Path:
    """One row per training length: bpc against evaluation length (a line per scheme), loss per position
    at the longest length (pe's panels)."""
    from matplotlib.figure import Figure

    from ..viz.figures import save_png

    groups = by_train_len(result.rows)
    fig = Figure(figsize=(11, 4 * len(groups)), layout="tight")
    axes = fig.subplots(len(groups), 2, squeeze=False)
    for (a, b), (L, rows) in zip(axes, groups.items()):
        positions = {(s, T): v for (k, s, T), v in result.positions.items() if k == L}
        plot_panels(a, b, rows, positions, L)
    return save_png(fig, path, dpi=80)
