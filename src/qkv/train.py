"""The training loop: AdamW, linear warmup + cosine decay, gradient clipping and accumulation,
optional bf16 autocast and ``torch.compile``, periodic validation, checkpoints, DDP.

    loss = mean cross-entropy of next-token prediction (nats per token)
    bits per character (bpc) = total nats / ln 2 / number of characters predicted

One process, or one per device under ``torchrun`` (DistributedDataParallel: gloo on CPU,
nccl on CUDA; rank 0 alone writes). Every optimizer step draws one *global* batch of
``batch_size`` windows from a seeded generator that every rank shares; micro-step m of rank r
takes its slice, so N processes see exactly the batch one process would.

Shapes: B sequences (a micro-batch), T context length, N tokens in a split, V vocabulary.
"""
from __future__ import annotations

import gzip
import json
import lzma
import math
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from . import checkpoint as ckpt
from .fileio import atomic_via
from .data import Corpus, encode_corpus, fit_tokenizer, load_corpus, load_tokenizer, tokenizer_from_json
from .models import GPT, PRESETS, ModelConfig

LN2 = math.log(2)
RUN_OUTPUTS = (*ckpt.RUN_FILES, "train_config.json", ckpt.STATE_FILE, "metrics.jsonl", "summary.json", "loss.png")
# Fields that define a run: --resume refuses to change them (the budget may grow, the rest may not).
RESUME_FIXED = ("preset", "model", "data", "tokenizer", "vocab_size", "context", "batch_size", "grad_accum", "lr",
                "min_lr_ratio", "warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip", "seed", "bf16")


# The demo trains byte-level BPE: at equal compute (1 M tokens, d_model 128, 4 layers, batch 32,
# lr 3e-3) 1024 BPE tokens reached 1.85 bits per character, 512 reached 2.04, characters 2.49;
# in 3 minutes 2048 tokens beat 1024 (README "Train and sample"). Every other preset: characters.
PRESET_TOKENIZERS = {"demo": ("bpe", 2048)}


@dataclass
class TrainConfig:
    """How to train. A budget is required: ``max_steps``, ``max_tokens`` or ``max_minutes``
    (the first reached ends the run; the cosine schedule follows whichever is furthest along)."""

    preset: str = "demo"
    model: ModelConfig | None = None  # overrides the preset; vocab_size always comes from the tokenizer
    data: str | None = None  # None: the embedded standard-library corpus
    out: str | None = None  # run directory; None: write nothing
    resume: bool = False
    overwrite: bool = False
    tokenizer: str | None = None  # char | bpe; None: the preset's (PRESET_TOKENIZERS), else char
    vocab_size: int | None = None  # BPE only; None: the preset's, else 1024
    context: int | None = None  # T; None: the model's max_len
    max_steps: int | None = None
    max_tokens: int | None = None
    max_minutes: float | None = None
    batch_size: int = 16  # sequences per optimizer step, over all ranks and micro-steps
    grad_accum: int = 1
    lr: float = 6e-3
    min_lr_ratio: float = 0.1  # the cosine ends at lr · min_lr_ratio
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    eval_interval: int = 100  # steps between evaluations (and checkpoints)
    eval_windows: int = 48  # validation windows per periodic evaluation; the final one uses all
    final_eval: bool = True  # score the whole validation text at the end (summary.json's val_bpc)
    seed: int = 1337
    bf16: bool = False  # bfloat16 autocast
    compile: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | None = None  # CPU threads; None: the cores other processes leave free (see cpu_threads)
    progress: bool = True  # tqdm progress bar (rank 0)

    def __post_init__(self) -> None:
        if self.model is None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        if isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)
        if self.tokenizer is None:
            self.tokenizer, default_vocab = PRESET_TOKENIZERS.get(self.preset if self.model is None else "", ("char", None))
            self.vocab_size = self.vocab_size or (default_vocab if self.tokenizer == "bpe" else None)
        if self.tokenizer not in ("char", "bpe"):
            raise ValueError(f"tokenizer must be 'char' or 'bpe', got {self.tokenizer!r}")
        for name in ("max_steps", "max_tokens", "vocab_size", "context", "threads"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("batch_size", "grad_accum", "eval_interval", "eval_windows"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"max_minutes must be > 0, got {self.max_minutes}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need lr > 0 and 0 <= min_lr_ratio <= 1, got lr={self.lr}, min_lr_ratio={self.min_lr_ratio}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("warmup_steps, weight_decay and grad_clip must be >= 0")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite contradict each other; pass one")
        if self.resume and not self.out:
            raise ValueError("--resume needs --out (the run directory to continue)")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["model"] = None if self.model is None else self.model.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig keys: {unknown}")
        return cls(**d)

    @classmethod
    def for_resume(cls, out: str | os.PathLike, **overrides) -> "TrainConfig":
        """The saved config of run ``out`` with ``overrides`` applied (train() refuses changes
        to the fields that define the run; the budget and the device may change)."""
        path = Path(out) / "train_config.json"
        if not path.is_file():
            ckpt.check_run_dir(out)
            raise ValueError(f"{out} has no train_config.json: it cannot be resumed")
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


def _check_same_run(saved: TrainConfig, new: dict | TrainConfig) -> None:
    new = new if isinstance(new, dict) else {k: getattr(new, k) for k in RESUME_FIXED}
    diffs = []
    for k in RESUME_FIXED:
        if k in new and new[k] != getattr(saved, k):
            old, cur = getattr(saved, k), new[k]
            if k == "model" and old is not None and cur is not None:
                old, cur = old.to_dict(), cur.to_dict()
                keys = [f for f in old if old[f] != cur[f]]
                old, cur = {f: old[f] for f in keys}, {f: cur[f] for f in keys}
            diffs.append(f"{k}: {old!r} -> {cur!r}")
    if diffs:
        raise ValueError(f"--resume with a changed config ({'; '.join(diffs)}); "
                         "start a new run (--out elsewhere, or --overwrite) to train differently")


@dataclass
class TrainResult:
    """What ``train`` returns."""

    model: GPT  # the trained model, in eval mode
    tokenizer: object
    config: ModelConfig
    metrics: list[dict] = field(default_factory=list)  # one record per evaluation
    summary: dict = field(default_factory=dict)  # final numbers (empty when stopped early)
    path: Path | None = None


# --- pieces ----------------------------------------------------------------------------

def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warmup over ``warmup_steps``, then cosine from lr to lr · min_lr_ratio over the budget."""
    warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * warm * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def compressor_bpc(text: str) -> dict[str, float]:
    """Bits per character of gzip -9 and xz -9e on ``text``: the floor a language model should beat."""
    raw = text.encode("utf-8")
    n = max(1, len(text))
    return {"gzip_bpc": 8 * len(gzip.compress(raw, compresslevel=9, mtime=0)) / n,
            "xz_bpc": 8 * len(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)) / n}


def eval_starts(n_tokens: int, T: int, count: int | None) -> list[int]:
    """Starts of non-overlapping windows over a split: every window (count None, the last one may be
    shorter) or ``count`` full windows spread evenly over it."""
    if count is None:
        return list(range(0, n_tokens - 1, T))
    full = (n_tokens - 1) // T
    if full == 0:
        return [0]
    idx = torch.linspace(0, full - 1, min(count, full)).round().long().unique()
    return (idx * T).tolist()


@torch.no_grad()
def evaluate(model, ids: Tensor, T: int, starts: list[int], *, batch_size: int = 32, device="cpu",
             autocast=nullcontext, rank: int = 0, world: int = 1) -> tuple[float, int]:
    """Summed next-token cross-entropy (nats) and token count over the windows at ``starts``."""
    was = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # nats, tokens
    mine = starts[rank::world]
    for lo in range(0, len(mine), batch_size):
        chunk = mine[lo:lo + batch_size]
        full = [s for s in chunk if s + T < len(ids)]
        groups = [torch.stack([ids[s:s + T + 1] for s in full])] if full else []  # (B, T+1)
        groups += [ids[s:][None] for s in chunk if s + T >= len(ids)]  # the last, shorter window (1, t+1)
        for rows in groups:
            rows = rows.to(device)
            with autocast():
                logits = model(rows[:, :-1]).logits  # (B, T, V)
            total[0] += F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten(), reduction="sum").double()
            total[1] += rows[:, 1:].numel()
    if world > 1:
        torch.distributed.all_reduce(total)
    model.train(was)
    return float(total[0]), int(total[1])


def _resolve_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: CUDA is not available on this machine (use --device cpu or auto)")
        if name == "cuda":
            name = f"cuda:{local_rank}"
    elif name != "cpu":
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {name!r}")
    return torch.device(name)


def cpu_threads() -> int:
    """Threads for CPU training: the cores that other processes leave free (at least one).

    On a busy machine OpenMP's threads wait on each other at every operation: two threads on two
    cores shared with other jobs ran 10x slower than one thread here. OMP_NUM_THREADS wins if set.
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cores, round(cores - busy)))


def _init_distributed(device_name: str) -> tuple[int, int, int, bool]:
    """(rank, world size, local rank, whether this call started the process group)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0, False
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    started = False
    if not dist.is_initialized():
        cuda = device_name != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if cuda else "gloo")
        started = True
    return dist.get_rank(), dist.get_world_size(), local, started


def _prepare_out(cfg: TrainConfig, rank: int) -> Path | None:
    """Check the run directory before anything is trained or written."""
    if not cfg.out:
        return None
    out = Path(cfg.out)
    if cfg.resume:
        if not (out / "train_config.json").is_file() or (out / ckpt.STATE_FILE).is_file():
            ckpt.check_run_dir(out)  # names what is missing; a run stopped before its first checkpoint passes
        if not (out / "train_config.json").is_file():
            raise ValueError(f"{out} has no train_config.json: it cannot be resumed")
        return out
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not cfg.overwrite:
        raise ValueError(f"{out} already exists; pass --resume to continue it or --overwrite to start again")
    return out


def _clear_out(out: Path) -> None:
    """--overwrite: remove the files a run writes (and only those)."""
    for name in RUN_OUTPUTS:
        (out / name).unlink(missing_ok=True)


def build_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (weights, embeddings), none on biases and norm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type == "cuda" or None)


def _model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    base = cfg.model if cfg.model is not None else PRESETS[cfg.preset]
    return replace(base, vocab_size=vocab_size)


def _get_tokenizer(cfg: TrainConfig, corpus: Corpus, out: Path | None, rank: int, world: int):
    """Resume: the run's. Otherwise fitted to the corpus (rank 0 fits; the others receive it)."""
    if cfg.resume and (out / "tokenizer.json").is_file():  # absent when stopped before the first checkpoint
        return load_tokenizer(out)
    text = corpus.train + corpus.val if cfg.tokenizer == "char" else corpus.train
    if world == 1:
        return fit_tokenizer(cfg.tokenizer, text, vocab_size=cfg.vocab_size)
    import torch.distributed as dist

    box = [fit_tokenizer(cfg.tokenizer, text, vocab_size=cfg.vocab_size).to_json() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return tokenizer_from_json(box[0])


def _read_metrics(out: Path, upto: int) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in records if r["step"] <= upto]


def _write_metrics(out: Path, records: list[dict]) -> None:
    ckpt.atomic_write(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())


def plot_losses(path: Path, records: list[dict], summary: dict | None = None) -> None:
    """Loss curves (nats per token) and validation bpc beside gzip's and xz's, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(steps, [r["train_loss"] for r in records], label="train")
    a.plot(steps, [r["val_loss"] for r in records], label="validation")
    a.set(xlabel="step", ylabel="loss (nats / token)", title="cross-entropy")
    a.legend()
    b.plot(steps, [r["val_bpc"] for r in records], label="model (validation)")
    for key, label, style in (("gzip_bpc", "gzip -9", "--"), ("xz_bpc", "xz -9e", ":")):
        if summary and key in summary:
            b.axhline(summary[key], color="gray", linestyle=style, label=f"{label} ({summary[key]:.2f})")
    b.set(xlabel="step", ylabel="bits per character", title="validation bits per character")
    b.legend()
    fig.tight_layout()
    atomic_via(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)


# --- the loop ----------------------------------------------------------------------------

def train_step(model, opt, batches: Tensor, *, grad_clip: float = 0.0, autocast=nullcontext,
               ddp: bool = False) -> Tensor:
    """One optimizer step over micro-batches (accum, B, T + 1): gradients of the mean loss are
    accumulated (DDP syncs on the last one only), clipped to ``grad_clip`` and applied.
    Returns the mean loss (detached)."""
    accum = batches.size(0)
    step_loss = torch.zeros((), device=batches.device)
    for m, batch in enumerate(batches):  # batch (B, T + 1)
        with model.no_sync() if ddp and m < accum - 1 else nullcontext():
            with autocast():
                loss = model(batch[:, :-1], targets=batch[:, 1:]).loss
            (loss / accum).backward()
        step_loss += loss.detach() / accum
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return step_loss


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


def train(cfg: TrainConfig, *, corpus: Corpus | None = None, tokenizer=None, stop_at: int | None = None) -> TrainResult:
    """Train a GPT as ``cfg`` says and return the model, its metrics and a summary.

    Args:
        cfg: hyperparameters, budget, output directory (None: nothing is written).
        corpus: training/validation text; default ``qkv.data.load_corpus(cfg.data)``.
        tokenizer: a ready tokenizer; default one fitted to the corpus (``cfg.tokenizer``).
        stop_at: stop after this step as an interruption would (checkpoint, no summary),
            keeping the schedule of the full budget; resume later with ``resume=True``.
    """
    if not (cfg.max_steps or cfg.max_tokens or cfg.max_minutes):
        raise ValueError("give a budget: max_steps, max_tokens or max_minutes")
    rank, world, local_rank, started_pg = _init_distributed(cfg.device)
    threads = torch.get_num_threads()
    try:
        return _train(cfg, corpus, tokenizer, stop_at, rank, world, local_rank)
    finally:
        torch.set_num_threads(threads)
        if started_pg:
            torch.distributed.destroy_process_group()


def _train(cfg, corpus, tokenizer, stop_at, rank, world, local_rank) -> TrainResult:
    t_begin = time.perf_counter()
    device = _resolve_device(cfg.device, local_rank)
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads or (cpu_threads() if world == 1 else torch.get_num_threads()))
    out = _prepare_out(cfg, rank)
    saved_state = None
    if cfg.resume:
        saved_cfg = TrainConfig.for_resume(out)
        _check_same_run(saved_cfg, cfg)
        if (out / ckpt.STATE_FILE).is_file():
            saved_state = ckpt.load_train_state(out)
        elif rank == 0:  # stopped before its first checkpoint: nothing to continue from
            print(f"qkv: {out} has no checkpoint yet (stopped before its first one): starting from step 0",
                  file=sys.stderr)
    corpus = corpus if corpus is not None else load_corpus(cfg.data)
    tokenizer = tokenizer if tokenizer is not None else _get_tokenizer(cfg, corpus, out, rank, world)
    mconf = _model_config(cfg, tokenizer.vocab_size)
    if saved_state is not None:
        saved_mconf = ckpt.read_config(out)
        if saved_mconf != mconf:
            diff = {k: (v, mconf.to_dict()[k]) for k, v in saved_mconf.to_dict().items() if mconf.to_dict()[k] != v}
            raise ValueError(f"--resume with a changed model config: {diff}")
    T = cfg.context or mconf.max_len
    if T > mconf.max_len and mconf.positional == "learned":
        raise ValueError(f"context {T} exceeds max_len {mconf.max_len} of learned positions")
    train_ids = encode_corpus(tokenizer, corpus.train)  # (N,)
    val_ids = encode_corpus(tokenizer, corpus.val)  # (N_val,)
    if len(train_ids) < T + 1:
        raise ValueError(f"training text is {len(train_ids)} tokens, shorter than one window of context {T} + 1")
    if len(val_ids) < 2:
        raise ValueError(f"validation text is {len(val_ids)} tokens; need at least 2")
    if cfg.batch_size % (world * cfg.grad_accum):
        raise ValueError(f"batch_size {cfg.batch_size} must divide into {world} processes x "
                         f"{cfg.grad_accum} accumulation steps")
    max_steps = cfg.max_steps
    if cfg.max_tokens:
        by_tokens = math.ceil(cfg.max_tokens / (cfg.batch_size * T))
        max_steps = min(max_steps, by_tokens) if max_steps else by_tokens
    budget_s = cfg.max_minutes * 60 if cfg.max_minutes else None
    n_final = len(eval_starts(len(val_ids), T, None)) if cfg.final_eval else 0
    eval_cost = 0.0  # seconds per validation window, from the latest evaluation (rank 0's clock)

    def progress(step: int, elapsed: float) -> float:
        """Fraction of the budget spent; a time budget keeps back what the final evaluation will take."""
        by_time = 0.0
        if budget_s:
            reserve = min(0.5 * budget_s, eval_cost * n_final)
            by_time = elapsed / (budget_s - reserve)
        return max(step / max_steps if max_steps else 0.0, by_time)

    # Model, optimizer, RNG: from the seed, or from the checkpoint.
    torch.manual_seed(cfg.seed)
    model = GPT(mconf).to(device)
    opt = build_optimizer(model, cfg, device)
    batch_gen = torch.Generator().manual_seed(cfg.seed)
    step, elapsed, train_time, running = 0, 0.0, 0.0, [0.0, 0]
    records: list[dict] = []
    if saved_state is not None:
        ckpt.load_weights(model, out, device=device)  # refuses a damaged model.safetensors (checksum, shapes)
        try:  # then the weights saved with the optimizer: one consistent snapshot, even if a kill split the files
            model.load_state_dict(saved_state["model"])
            opt.load_state_dict(saved_state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise ValueError(f"{out}/{ckpt.STATE_FILE} does not match the model: {e}") from None
        batch_gen.set_state(saved_state["batch_rng"])
        torch.set_rng_state(saved_state["torch_rng"])
        if device.type == "cuda" and saved_state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(saved_state["cuda_rng"], device)
        step, elapsed, train_time = saved_state["step"], saved_state["elapsed"], saved_state["train_time"]
        eval_cost = saved_state.get("eval_cost", 0.0)
        running = list(saved_state["running"])
        records = _read_metrics(out, step)
        if progress(step, elapsed) >= 1:
            raise ValueError(f"{out} already finished its budget ({cfg.budget}) at step {step}; "
                             "raise --max-steps or --max-minutes to train further")
    compressors = compressor_bpc(corpus.val)
    val_chars = len(corpus.val) - len(tokenizer.decode(val_ids[:1]))  # characters of the predicted tokens
    chars_per_token = val_chars / (len(val_ids) - 1)
    if out is not None and rank == 0:
        if cfg.overwrite:
            _clear_out(out)
        out.mkdir(parents=True, exist_ok=True)
        ckpt.atomic_json(out / "train_config.json", cfg.to_dict() | {"resume": False, "overwrite": False})
        _write_metrics(out, records)

    raw = model
    if cfg.compile:
        model = torch.compile(model)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if cfg.bf16 else nullcontext
    windows = train_ids.unfold(0, T + 1, 1)  # (N - T, T + 1), a view
    val_sample = eval_starts(len(val_ids), T, cfg.eval_windows)
    micro = cfg.batch_size // (world * cfg.grad_accum)
    tokens_per_step = cfg.batch_size * T

    def save(step_now: int) -> None:
        if out is None or rank != 0:
            return
        ckpt.save_model(out, raw, tokenizer, step=step_now)
        ckpt.save_train_state(out, {
            "step": step_now, "elapsed": elapsed, "train_time": train_time, "running": running, "eval_cost": eval_cost,
            "model": raw.state_dict(), "optimizer": opt.state_dict(),
            "batch_rng": batch_gen.get_state(), "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        })

    prepare_s = time.perf_counter() - t_begin  # tokenizer, encoding: data preparation, outside the budget
    bar = None
    if cfg.progress and rank == 0:
        from tqdm.auto import tqdm

        print(f"qkv: training a {raw.num_parameters() / 1e6:.2f} M-parameter GPT ({cfg.preset if cfg.model is None else 'custom'}"
              f", {tokenizer.kind} tokenizer, {tokenizer.vocab_size} tokens, context {T}) on {corpus.source}: "
              f"{len(train_ids) / 1e6:.2f} M training tokens, {len(corpus.val) / 1e6:.2f} M validation characters; "
              f"prepared in {prepare_s:.0f} s; budget {cfg.budget}; {world} process(es) on {device}"
              f"{f' with {torch.get_num_threads()} thread(s)' if device.type == 'cpu' else ''} -> {out or '(not saved)'}",
              file=sys.stderr)

        bar = tqdm(total=100.0, initial=round(100 * progress(step, elapsed), 2), unit="%", dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]")
    model.train()
    start_clock, start_elapsed = time.perf_counter(), elapsed
    done = finished = False
    last_saved = step if saved_state is not None else None
    with StopRequest() as stop:
        try:
            while not done:
                t0 = time.perf_counter()
                for group in opt.param_groups:
                    group["lr"] = lr_at(cfg, step, progress(step, elapsed))
                starts = torch.randint(len(windows), (cfg.batch_size,), generator=batch_gen)  # the global batch
                mine = starts.view(cfg.grad_accum, world, micro)[:, rank]  # (accum, B): this rank's slices
                batches = windows[mine].to(device, non_blocking=True)  # (accum, B, T + 1)
                step_loss = train_step(model, opt, batches, grad_clip=cfg.grad_clip, autocast=autocast, ddp=world > 1)
                if world > 1:
                    torch.distributed.all_reduce(step_loss, op=torch.distributed.ReduceOp.AVG)
                if not math.isfinite(float(step_loss)):  # every rank sees the same averaged loss
                    kept = "no checkpoint was written yet" if last_saved is None else \
                        f"the last good checkpoint (step {last_saved}) in {out} is kept"
                    raise Diverged(f"the training loss became {float(step_loss)} at step {step + 1}: stopped; {kept}. "
                                   "Try a lower --lr or a smaller --batch-size")
                running[0] += float(step_loss)
                running[1] += 1
                step += 1
                train_time += time.perf_counter() - t0
                elapsed = _from_rank0(start_elapsed + time.perf_counter() - start_clock, world, device)
                finished = progress(step, elapsed) >= 1
                done = finished or step == stop_at or _agree(stop.requested, world, device)
                if bar is not None:
                    bar.update(min(100.0, round(100 * progress(step, elapsed), 2)) - bar.n)
                    bar.set_postfix_str(f"step {step}, loss {float(step_loss):.3f}, "
                                        f"{tokens_per_step * step / max(train_time, 1e-9):.0f} tok/s", refresh=False)
                if finished or step % cfg.eval_interval == 0:  # an interruption (stop_at) logs nothing extra
                    t_eval = time.perf_counter()
                    nats, n = evaluate(raw, val_ids, T, val_sample, device=device, autocast=autocast,
                                       rank=rank, world=world)
                    eval_cost = _from_rank0((time.perf_counter() - t_eval) * world / len(val_sample), world, device)
                    records.append({"step": step, "train_loss": running[0] / running[1], "val_loss": nats / n,
                                    "val_bpc": nats / n / LN2 / chars_per_token, "lr": opt.param_groups[0]["lr"],
                                    "tokens": step * tokens_per_step, "elapsed_s": round(elapsed, 2)})
                    running = [0.0, 0]
                    if out is not None and rank == 0:
                        _write_metrics(out, records)
                if done or step % cfg.eval_interval == 0:
                    save(step)
                    last_saved = step
                    elapsed = _from_rank0(start_elapsed + time.perf_counter() - start_clock, world, device)
        finally:
            if bar is not None:
                bar.close()
    if stop.requested and not finished:
        saved = f"checkpoint saved; continue with: qkv train --resume --out {out}" if out else "nothing saved (no --out)"
        raise Interrupted(f"interrupted at step {step}, {saved}")
    raw.eval()
    result = TrainResult(model=raw, tokenizer=tokenizer, config=mconf, metrics=records, path=out)
    if not finished:
        return result  # stopped early (stop_at): resume to finish
    summary = {"steps": step, "tokens": step * tokens_per_step,
               "tokens_per_s": step * tokens_per_step / max(train_time, 1e-9), "train_seconds": round(train_time, 2),
               "elapsed_seconds": round(elapsed, 2), "prepare_seconds": round(prepare_s, 2),
               "train_loss": records[-1]["train_loss"] if records else None}
    if cfg.final_eval:
        nats, n = evaluate(raw, val_ids, T, eval_starts(len(val_ids), T, None), device=device, autocast=autocast,
                           rank=rank, world=world)
        summary |= {"val_loss": nats / n, "val_bpc": nats / LN2 / val_chars}
    elif records:
        summary |= {"val_loss": records[-1]["val_loss"], "val_bpc": records[-1]["val_bpc"]}
    summary |= compressors | {
        "val_chars": len(corpus.val), "train_chars": len(corpus.train), "corpus": corpus.source,
        "tokenizer": tokenizer.kind, "vocab_size": tokenizer.vocab_size, "context": T,
        "parameters": raw.num_parameters(), "device": str(device), "world_size": world}
    result.summary = summary
    if out is not None and rank == 0:
        ckpt.atomic_json(out / "summary.json", summary)
        if records:
            plot_losses(out / "loss.png", records, summary)
    return result


def _agree(flag: bool, world: int, device: torch.device) -> bool:
    """True on every rank when any rank's flag is set (so all stop at the same step)."""
    if world == 1:
        return flag
    t = torch.tensor(float(flag), device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())


def _from_rank0(value: float, world: int, device: torch.device) -> float:
    """Rank 0's value (a clock reading), so that every rank computes the same learning rate and stops together."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.broadcast(t, src=0)
    return float(t)
