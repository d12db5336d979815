"""The KV cache's trade-off: multi-head (MHA), grouped-query (GQA), multi-query (MQA) and multi-head latent
attention (MLA) at one width and one parameter count, trained alike, then timed decoding alike.

DeepSeek-V2 (arXiv 2405.04434, §2.1, Tables 1 and 9) reports MLA at least as good as MHA with a far smaller
cache (93.3 % smaller than DeepSeek 67B's). Per token and layer a cache holds (Table 1)

    MHA  2·H·D      GQA  2·G·D      MQA  2·D      MLA  d_c + d_R   (absorbed: c_KV and the shared k_R)

and MLA's naive path, which caches the per-head keys and values it expands, H·(d_K + d_V) with
d_K = d_N + d_R. Here MLA's heads are D wide as MHA's (d_N = D − d_R, d_V = D), so that its naive cache is
MHA's 2·H·D; the defaults take d_c = d_model / 2 and d_R = D / 2. Every variant is a small GPT with RoPE on the embedded corpus (``qkv train``'s default),
trained by the training recipe (``qkv.training.recipe.train``) on one token budget, two seeds; the variants
with fewer attention parameters get a wider feed-forward (d_ff), so that every model holds about as many
parameters as MHA's (the table shows the counts). Held-out bits per character come from the recipe's
evaluation (non-overlapping windows of the training length over the validation split). Then each trained
model (the first seed's) decodes one token at batch 1 over 512, 2 048 and 8 192 cached tokens (random cache
contents; RoPE positions up to max_len = 8 193), every path in interleaved rounds, medians
(``qkv.generation.timing``).

Shapes: B batch, T length, C model width, H heads, G key/value heads, D head width, S cached tokens.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..checks import check_positive_int
from ..fileio import atomic_write
from ..generation.timing import decode_step_seconds, fill_random
from ..models import GPT, ModelConfig
from ..models.config import NO_BIAS
from ..training.recipe import LN2, TrainConfig, eval_starts, evaluate, train
from .pages import RESULTS, csv_bytes, finished_summary, localized, say, write_results, write_summary
from .progress import models_bar
from .runner import char_text, run_study

VARIANTS = ("mha", "gqa", "mqa", "mla")  # the models trained
PATHS = ("mha", "gqa", "mqa", "mla", "mla-naive")  # the caches timed: mla-naive is MLA's model, per-head K, V cached
CONTEXTS = (512, 2048, 8192)  # cached tokens for the decode timing
BAR = 0.90  # "a KV cache at least 90 % smaller"
DEEPSEEK = (4.0, 0.5)  # DeepSeek-V2's d_c = 4·D and d_R = D/2 (§2.1.4: d_c = 512, d_R = 64, D = 128)
OUTPUTS = ("results.csv", *RESULTS.values(), "kv.png", "summary.json")


@dataclass
class KVStudyConfig:
    """The study's settings; ``KVStudyConfig.quick()`` is the version of a few seconds."""

    d_model: int = 128
    num_heads: int = 4  # H; D = d_model / H
    num_layers: int = 4
    gqa_groups: int = 2  # G of the GQA variant
    kv_lora_rank: int | None = None  # d_c; None: d_model / 2
    qk_rope_head_dim: int | None = None  # d_R; None: D / 2
    d_ff: int | None = None  # MHA's feed-forward width; None: 4 · d_model (the others are matched to MHA)
    train_len: int = 128  # training context T
    max_tokens: int = 1 << 21  # training tokens per model (512 steps of 32 × 128)
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    eval_windows: int | None = None  # validation windows of T; None: the whole validation split
    seeds: int = 2  # models per variant: seed, seed + 1, …
    seed: int = 1337
    contexts: tuple[int, ...] = CONTEXTS
    repeats: int = 7  # timed rounds per context (median)
    inner: int = 8  # decode steps per path per round
    data: str | None = None  # None: the embedded corpus
    device: str = "auto"
    threads: int | None = None  # CPU threads; None: the cores other processes leave free, fixed for the study

    def __post_init__(self) -> None:
        for name in ("d_model", "num_heads", "num_layers", "gqa_groups", "train_len", "max_tokens", "batch_size",
                     "seeds", "repeats", "inner"):
            check_positive_int(name, getattr(self, name))
        for name in ("kv_lora_rank", "qk_rope_head_dim", "d_ff", "eval_windows", "threads"):
            check_positive_int(name, getattr(self, name), optional=True)
        if self.d_model % self.num_heads or self.num_heads % self.gqa_groups or self.gqa_groups in (1, self.num_heads):
            raise ValueError(f"need num_heads dividing d_model and 1 < gqa_groups < num_heads dividing num_heads, "
                             f"got d_model {self.d_model}, num_heads {self.num_heads}, gqa_groups {self.gqa_groups}")
        D = self.d_model // self.num_heads
        if self.rope_dim % 2 or D % 2 or self.rope_dim >= D:
            raise ValueError(f"RoPE rotates pairs: need an even head width D and an even qk_rope_head_dim below it "
                             f"(MLA's d_N = D − d_R), got D = {D} and qk_rope_head_dim {self.rope_dim}")
        self.contexts = tuple(sorted(set(self.contexts)))
        if not self.contexts or any(not isinstance(s, int) or s < 1 for s in self.contexts):
            raise ValueError(f"contexts must be positive ints of cached tokens, got {self.contexts}")

    @classmethod
    def quick(cls, **overrides) -> "KVStudyConfig":
        """Seconds: a one-layer model of width 32, 16 K training tokens, 32 validation windows, short timing."""
        return replace(cls(d_model=32, num_layers=1, train_len=32, max_tokens=16 * 1024, batch_size=8,
                           warmup_steps=4, eval_windows=32, repeats=3, inner=2), **overrides)

    @property
    def latent_rank(self) -> int:
        """d_c."""
        return self.kv_lora_rank or self.d_model // 2

    @property
    def rope_dim(self) -> int:
        """d_R."""
        return self.qk_rope_head_dim or self.d_model // self.num_heads // 2

    def model_config(self, variant: str, vocab_size: int, d_ff: int | None = None) -> ModelConfig:
        """One variant's GPT: RoPE, no biases, max_len for the longest decode. MLA's heads attend as MHA's, D wide:
        d_N + d_R = d_V = D (equal key and value widths also let the fused attention kernel run)."""
        D = self.d_model // self.num_heads
        attention = {"mha": dict(num_heads=self.num_heads), "gqa": dict(num_heads=self.num_heads,
                     num_kv_heads=self.gqa_groups), "mqa": dict(num_heads=self.num_heads, num_kv_heads=1),
                     "mla": dict(kind="mla", num_heads=self.num_heads, kv_lora_rank=self.latent_rank,
                                 qk_rope_head_dim=self.rope_dim, qk_nope_head_dim=D - self.rope_dim, v_head_dim=D)}[variant]
        return ModelConfig(vocab_size=vocab_size, d_model=self.d_model, num_layers=self.num_layers,
                           max_len=max(self.contexts[-1] + 1, self.train_len), position=dict(kind="rope"),
                           attention=attention | NO_BIAS,
                           feed_forward=dict(d_ff=d_ff or self.d_ff or 4 * self.d_model, bias=False))


@dataclass
class KVStudyResult:
    """What ``run`` returns: one row per cache path, the verdict on DeepSeek-V2's claim, the sentences."""

    rows: list[dict]
    verdict: dict
    sentences: list[str]
    table: str  # Markdown
    config: KVStudyConfig
    seconds: float
    out: Path | None = None
    bpcs: dict[str, list[float]] = field(default_factory=dict)  # variant -> bpc of each seed

    def row(self, path: str) -> dict:
        return next(r for r in self.rows if r["path"] == path)


# --- the variants: cache sizes, parameter matching -------------------------------------------

def cache_numbers(config: ModelConfig, path: str = "") -> int:
    """Numbers one token adds to one layer's cache (per batch row): 2·G·D (MHA G = H, MQA G = 1); MLA d_c + d_R,
    its naive path (``path`` "mla-naive") H·(d_K + d_V)."""
    a = config.attention
    if a.kind != "mla":
        return 2 * config.kv_heads * config.head_dim
    if path == "mla-naive":
        return a.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
    return a.kv_lora_rank + a.qk_rope_head_dim


def parameters(config: ModelConfig) -> int:
    """The parameter count of a GPT of ``config`` (built on the meta device: nothing allocated)."""
    with torch.device("meta"):
        return GPT(config).num_parameters()


def matched_widths(cfg: KVStudyConfig, vocab_size: int) -> dict[str, int]:
    """Each variant's d_ff such that its parameter count is as close as an integer d_ff allows to MHA's:
    d_ff + round((P_MHA − P_variant) / (parameters per unit of d_ff))."""
    base = cfg.d_ff or 4 * cfg.d_model
    target = parameters(cfg.model_config("mha", vocab_size, base))
    unit = parameters(cfg.model_config("mha", vocab_size, base + 1)) - target  # every layer's FFN grows by one
    widths = {}
    for v in VARIANTS:
        width = base + round((target - parameters(cfg.model_config(v, vocab_size, base))) / unit)
        if width < 1:
            raise ValueError(f"{v} has {target} − d_ff·{unit} more attention parameters than MHA can give up: "
                             f"d_ff would be {width}; choose a smaller kv_lora_rank")
        widths[v] = width
    return widths


# --- the study -------------------------------------------------------------------------------

def run(config: KVStudyConfig | None = None, *, out: str | os.PathLike | None = None, corpus=None,
        progress: bool = True, overwrite: bool = True, lang: str = "en") -> KVStudyResult:
    """Train every variant (and seed), score it, time its decoding; write the results to ``out``.

    Args:
        config: the settings (default ``KVStudyConfig()``: about half an hour on two CPU cores).
        out: a directory for results.csv, results.md, kv.png, summary.json (None: none).
        corpus: a ``qkv.data.Corpus`` (default ``load_corpus(config.data)``).
        progress: a progress bar across the models.
        overwrite: replace the study's files in ``out``; False refuses a directory that has them.
        lang: the language of the table, the sentences and the results file (``rerender`` writes the other).
    """
    return run_study(_run, config or KVStudyConfig(), OUTPUTS, out=out, overwrite=overwrite, lang=lang, corpus=corpus,
                     progress=progress)


def _run(cfg: KVStudyConfig, out: Path | None, *, corpus, progress: bool, lang: str) -> KVStudyResult:
    t0 = time.perf_counter()
    corpus, tokenizer, val_ids = char_text(corpus, cfg.data)  # val_ids (N_val,)
    widths = matched_widths(cfg, tokenizer.vocab_size)
    bpcs, timed = {v: [] for v in VARIANTS}, {}
    jobs = [(seed, v) for seed in range(cfg.seed, cfg.seed + cfg.seeds) for v in VARIANTS]
    for seed, v in models_bar(jobs, desc="qkv study kv", enabled=progress, label=lambda job: f"{job[1]}, seed {job[0]}"):
        tc = TrainConfig(model=cfg.model_config(v, tokenizer.vocab_size, widths[v]), context=cfg.train_len,
                         max_tokens=cfg.max_tokens, batch_size=cfg.batch_size, lr=cfg.lr,
                         warmup_steps=cfg.warmup_steps, eval_interval=1 << 30, eval_windows=8, final_eval=False,
                         seed=seed, device=cfg.device, threads=cfg.threads, progress=False)
        model = train(tc, corpus=corpus, tokenizer=tokenizer).model
        bpcs[v].append(held_out_bpc(model, val_ids, cfg.train_len, cfg.eval_windows))
        if seed == cfg.seed:
            timed[v] = model  # the first seed's models decode
    speeds = decode_speeds(timed, cfg.contexts, repeats=cfg.repeats, inner=cfg.inner)
    rows = summarise(cfg, timed, bpcs, speeds)
    v = verdict(rows, cfg.num_heads)
    result = KVStudyResult(rows=rows, verdict=v, sentences=sentences(rows, v, lang), table=markdown_table(rows, lang),
                           config=cfg, seconds=time.perf_counter() - t0, out=out, bpcs=bpcs)
    if out is not None:
        _write(result, corpus, lang)
    return result


def held_out_bpc(model: GPT, val_ids: torch.Tensor, T: int, windows: int | None) -> float:
    """Bits per character on ``windows`` non-overlapping validation windows of T (None: all), as the
    recipe's evaluation scores them (char tokenizer: one token per character)."""
    device = next(model.parameters()).device
    nats, n = evaluate(model, val_ids, T, eval_starts(len(val_ids), T, windows), device=device)
    return nats / n / LN2


# --- decode timing ---------------------------------------------------------------------------

def decode_caches(model: GPT, path: str, cached: int) -> list:
    """One cache per layer for one more token after ``cached`` ones, filled with random contents: the model's
    own (``new_kv_caches``), or for MLA its latent (path "mla") or naive ("mla-naive") cache."""
    if model.config.attention.kind == "mla":
        mode = "naive" if path == "mla-naive" else "absorbed"
        caches = [block.attn.new_cache(1, cached + 1, mode=mode) for block in model.blocks]
    else:
        caches = model.new_kv_caches(1, cached + 1)
    gen = torch.Generator().manual_seed(cached)
    return [fill_random(c, cached, generator=gen) for c in caches]


@torch.inference_mode()
def decode_speeds(models: dict[str, GPT], contexts, *, repeats: int, inner: int) -> dict[str, dict[int, float]]:
    """path -> {cached tokens: batch-1 decode tokens per second}: every path of ``PATHS`` whose model is in
    ``models`` (mla-naive uses "mla"'s), timed in interleaved rounds at each context."""
    paths = [p for p in PATHS if p.split("-")[0] in models]
    speeds: dict[str, dict[int, float]] = {p: {} for p in paths}
    for S in contexts:
        steps = {}
        for p in paths:
            model = models[p.split("-")[0]].eval()
            ids = torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device)  # (B=1, T=1)
            caches = decode_caches(model, p, S)
            steps[p] = (lambda m=model, i=ids, c=caches: m(i, kv_caches=c), caches)
        for p, seconds in decode_step_seconds(steps, S, repeats=repeats, inner=inner).items():
            speeds[p][S] = 1 / seconds
        del steps  # the caches of this context, before the next one's
    return speeds


# --- the numbers and what they say -----------------------------------------------------------

def summarise(cfg: KVStudyConfig, models: dict[str, GPT], bpcs: dict[str, list[float]],
              speeds: dict[str, dict[int, float]]) -> list[dict]:
    """One row per cache path: its model's size, the cache per token and layer, bpc (± std), tokens/s."""
    mha = cache_numbers(models["mha"].config)
    rows = []
    for p in PATHS:
        v = p.split("-")[0]
        config, runs = models[v].config, bpcs[v]
        numbers = cache_numbers(config, p)
        row = {"path": p, "variant": v, "kv_heads": config.kv_heads if v != "mla" else 0,
               "d_ff": config.ff_width, "parameters": models[v].num_parameters(), "cache_numbers": numbers,
               "cache_bytes_fp32": 4 * numbers, "cache_vs_mha": numbers / mha, "bpc": sum(runs) / len(runs),
               "bpc_std": float(torch.tensor(runs).std()) if len(runs) > 1 else math.nan, "seeds": len(runs)}
        row |= {f"tok_s_{S}": speeds[p][S] for S in cfg.contexts}
        rows.append(row)
    return rows


def verdict(rows: list[dict], heads: int) -> dict:
    """DeepSeek-V2's claim on these numbers: MLA's mean bpc no worse than MHA's and its cache ≥ 90 % smaller.
    ``noise`` is the larger seed std of the two (0 with one seed); ``beyond_noise`` says whether |Δ| exceeds it."""
    by = {r["path"]: r for r in rows}
    mla, mha = by["mla"], by["mha"]
    reduction = 1 - mla["cache_numbers"] / mha["cache_numbers"]
    noise = max(0.0 if math.isnan(r["bpc_std"]) else r["bpc_std"] for r in (mla, mha))
    diff = mla["bpc"] - mha["bpc"]
    as_good, small = diff <= 0, reduction >= BAR
    dc, dr = DEEPSEEK
    return {"holds": as_good and small, "as_good": as_good, "cache_small": small, "bar": BAR,
            "reduction": reduction, "bpc_mla": mla["bpc"], "bpc_mha": mha["bpc"], "difference": diff, "noise": noise,
            "beyond_noise": abs(diff) > noise, "seeds": mla["seeds"], "heads": heads,
            "mla_numbers": mla["cache_numbers"], "mha_numbers": mha["cache_numbers"],
            "deepseek_reduction": 1 - (dc + dr) / (2 * heads), "deepseek_reduction_128": 1 - (dc + dr) / 256}


def label(path: str, lang: str) -> str:
    return say(f"kv.{path}", lang)


def sentences(rows: list[dict], v: dict, lang: str = "en") -> list[str]:
    """What the numbers say, in ``lang``: bpc per variant, cache per variant, decode speed, the verdict."""
    sep, by = say("sep", lang), {r["path"]: r for r in rows}
    models = [r for r in rows if r["path"] != "mla-naive"]
    spread = "" if models[0]["seeds"] < 2 else say("kv.std", lang)
    bpc = sep.join(f"{label(r['path'], lang)} {r['bpc']:.3f}" + (f" ± {r['bpc_std']:.3f}" if spread else "")
                   for r in models)
    best = min(models, key=lambda r: r["bpc"])
    cache = sep.join(f"{label(r['path'], lang)} {r['cache_numbers']} ({100 * r['cache_vs_mha']:.0f} %)" for r in rows)
    S = max(int(k[6:]) for k in rows[0] if k.startswith("tok_s_"))
    speed = sep.join(f"{label(r['path'], lang)} {r[f'tok_s_{S}']:.0f}" for r in rows)
    out = [say("kv.bpc", lang, seeds=models[0]["seeds"], spread=spread, bpc=bpc, best=label(best["path"], lang)),
           say("kv.cache", lang, cache=cache),
           say("kv.speed", lang, S=S, speed=speed, naive=by["mla"][f"tok_s_{S}"] / by["mla-naive"][f"tok_s_{S}"],
               mha=by["mla"][f"tok_s_{S}"] / by["mha"][f"tok_s_{S}"])]
    return out + [verdict_sentence(v, lang)]


def verdict_sentence(v: dict, lang: str) -> str:
    """Whether "MLA at least as good as MHA with a ≥ 90 % smaller cache" holds here, and why not if not."""
    noise = say("kv.noise beyond" if v["beyond_noise"] else "kv.noise within", lang, noise=v["noise"]) \
        if v["seeds"] > 1 else say("kv.one seed", lang)
    numbers = dict(mla=v["bpc_mla"], mha=v["bpc_mha"], diff=v["difference"], noise=noise,
                   reduction=100 * v["reduction"], bar=100 * v["bar"])
    if v["holds"]:
        return say("kv.holds", lang, **numbers)
    reasons = []
    if not v["cache_small"]:
        reasons.append(say("kv.reason cache", lang, reduction=100 * v["reduction"], bar=100 * v["bar"],
                           mla_n=v["mla_numbers"], mha_n=v["mha_numbers"], H=v["heads"],
                           ds=100 * v["deepseek_reduction"], ds128=100 * v["deepseek_reduction_128"]))
    if not v["as_good"]:
        reasons.append(say("kv.reason worse", lang, diff=v["difference"], noise=noise))
    return say("kv.fails", lang, **numbers, reasons=say("clauses", lang).join(reasons))


def markdown_table(rows: list[dict], lang: str = "en") -> str:
    """Cache paths × (size, cache per token and layer, bpc, decode tokens/s at each context)."""
    contexts = sorted(int(k[6:]) for k in rows[0] if k.startswith("tok_s_"))
    head = [say(k, lang) for k in ("kv.path", "kv.kv heads", "kv.d_ff", "kv.parameters", "kv.numbers", "kv.bytes",
                                   "kv.vs mha", "kv.bpc col")] + [say("kv.tok_s", lang, S=S) for S in contexts]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        bpc = f"{r['bpc']:.3f}" + ("" if math.isnan(r["bpc_std"]) else f" ± {r['bpc_std']:.3f}")
        kv = str(r["kv_heads"]) if r["kv_heads"] else say("kv.latent", lang)
        cells = [label(r["path"], lang), kv, str(r["d_ff"]), f"{r['parameters']:,}", str(r["cache_numbers"]),
                 str(r["cache_bytes_fp32"]), f"{100 * r['cache_vs_mha']:.0f} %", bpc]
        lines.append("| " + " | ".join(cells + [f"{r[f'tok_s_{S}']:.0f}" for S in contexts]) + " |")
    return "\n".join(lines)


# --- output ----------------------------------------------------------------------------------

COLUMNS = ["path", "variant", "kv_heads", "d_ff", "parameters", "cache_numbers", "cache_bytes_fp32", "cache_vs_mha",
           "bpc", "bpc_std", "seeds"]


def _write(result: KVStudyResult, corpus, lang: str) -> None:
    out, cfg = result.out, result.config
    columns = COLUMNS + [f"tok_s_{S}" for S in cfg.contexts]
    atomic_write(out / "results.csv", csv_bytes(result.rows, columns))
    plot(result.rows, out / "kv.png")
    fields = {"config": asdict(cfg), "rows": result.rows, "verdict": result.verdict, "bpcs": result.bpcs,
              "sentences": result.sentences, "seconds": round(result.seconds, 1)}
    write_summary(out, fields, corpus.source, results_text, lang)


def results_text(summary: dict, lang: str) -> str:
    """The results file (results.md's text) of a run's summary.json, in ``lang``."""
    cfg, rows = summary["config"], summary["rows"]
    seeds = cfg["seeds"]
    D = cfg["d_model"] // cfg["num_heads"]
    mla = KVStudyConfig(**{k: tuple(x) if k == "contexts" else x for k, x in cfg.items()})
    counts = [r["parameters"] for r in rows]
    return "\n".join([
        say("kv.title", lang), "", say("kv.intro", lang, contexts=", ".join(f"{S:,}" for S in cfg["contexts"])), "",
        markdown_table(rows, lang), "", *[f"- {s}" for s in sentences(rows, summary["verdict"], lang)], "",
        say("kv.models", lang, d_model=cfg["d_model"], heads=cfg["num_heads"], D=D, layers=cfg["num_layers"],
            G=cfg["gqa_groups"], dc=mla.latent_rank, dr=mla.rope_dim, dn=D - mla.rope_dim, tokens=cfg["max_tokens"],
            batch=cfg["batch_size"], T=cfg["train_len"], seed=cfg["seed"], last=cfg["seed"] + seeds - 1,
            max_len=cfg["contexts"][-1] + 1),
        say("kv.matched", lang, lo=min(counts), hi=max(counts), spread=100 * (max(counts) - min(counts)) / max(counts)),
        say("kv.timing", lang, repeats=cfg["repeats"], inner=cfg["inner"]),
        say("corpus", lang, corpus=localized(summary["corpus"], lang)),
        say("machine", lang, machine=localized(summary["machine"], lang)),
        say("kv.wall", lang, minutes=summary["seconds"] / 60), say("stamp", lang, **summary["run"]), ""])


def rerender(folder: str | os.PathLike, lang: str) -> tuple[Path, str, list[str]]:
    """A finished run's results file written again in ``lang`` from its summary.json, no training:
    (the file written, the table, the sentences)."""
    summary = finished_summary(folder)
    path = write_results(folder, results_text(summary, lang), lang)
    return path, markdown_table(summary["rows"], lang), sentences(summary["rows"], summary["verdict"], lang)


def plot(rows: list[dict], path: Path) -> Path:
    """Left: bpc (± std) against cache numbers per token and layer. Right: decode tokens/s against context."""
    from matplotlib.figure import Figure

    from ..viz.figures import save_png

    fig = Figure(figsize=(10, 3.8), layout="tight")
    a, b = fig.subplots(1, 2)
    contexts = sorted(int(k[6:]) for k in rows[0] if k.startswith("tok_s_"))
    for r in rows:
        std = 0 if math.isnan(r["bpc_std"]) else r["bpc_std"]
        naive = r["path"] == "mla-naive"
        a.errorbar(r["cache_numbers"], r["bpc"], yerr=std, marker="o", capsize=3, label=label(r["path"], "en"),
                   mfc="none" if naive else None, linestyle="none")
        b.plot(contexts, [r[f"tok_s_{S}"] for S in contexts], marker="o", label=label(r["path"], "en"),
               linestyle="--" if naive else "-")
    a.set_xscale("log", base=2)
    a.set(xlabel="KV cache numbers per token per layer", ylabel="held-out bits per character",
          title="quality against cache size (naive MLA: same model)")
    a.legend(fontsize=8)
    b.set_xscale("log", base=2)
    b.set_xticks(contexts, [f"{S:,}" for S in contexts])
    b.set(xlabel="cached tokens", ylabel="decode tokens / s (batch 1)", title="decode speed against context")
    b.legend(fontsize=8)
    return save_png(fig, path, dpi=80)


