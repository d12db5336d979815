"""Runs on disk: save and load model, config, tokenizer and training state.

A run directory holds::

    config.json         the ModelConfig
    model.safetensors   the weights (safetensors: no code runs when it is read)
    tokenizer.json      the tokenizer (qkv.data)
    train_config.json   how it was trained            (training only)
    train_state.pt      optimizer + RNG state, step  (training only; read with weights_only=True)
    metrics.jsonl, summary.json, loss.png

Every file is written atomically: to a temporary file in the same directory, then renamed
over the old one, so a crash leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .fileio import atomic_json, atomic_via, atomic_write  # noqa: F401  (atomic_write: re-exported)
from .models import GPT, ModelConfig

CONFIG_FILE, WEIGHTS_FILE, STATE_FILE = "config.json", "model.safetensors", "train_state.pt"
RUN_FILES = (CONFIG_FILE, WEIGHTS_FILE, "tokenizer.json")


def save_model(directory: str | os.PathLike, model: GPT, tokenizer, *, step: int = 0) -> None:
    """Write config.json, model.safetensors and tokenizer.json (each atomically)."""
    from safetensors.torch import save_model as st_save

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    atomic_json(d / CONFIG_FILE, model.config.to_dict())
    # save_model handles the tied embedding / LM-head weight (stored once).
    meta = {"format": "pt", "step": str(step), "sha256": state_digest(model)}
    atomic_via(d / WEIGHTS_FILE, lambda tmp: st_save(model, tmp, metadata=meta))
    tokenizer.save(d)


def state_digest(model: nn.Module) -> str:
    """SHA-256 of every state_dict tensor's bytes, by name: safetensors has no checksum of its own,
    so a bit flip in the weights would otherwise load silently."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _check_shapes(path: Path, model_config: ModelConfig) -> None:
    """Compare the file's header with the model config on the meta device, before allocating anything:
    a config.json that asks for a huge model fails here unless the file really holds those weights."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - SafetensorError for a damaged header, OSError
        raise ValueError(f"{path} is corrupt or truncated ({str(e).strip()[:200] or type(e).__name__})") from None
    c = model_config
    at_least = c.num_layers * (2 * c.d_model**2 + 2 * c.d_model * c.ff_width) + c.vocab_size * c.d_model  # parameters
    if 2 * at_least > path.stat().st_size:  # 2 bytes: the smallest dtype a checkpoint uses
        raise ValueError(f"{path} does not match config.json: the config describes at least {at_least:,} parameters, "
                         f"the file holds {path.stat().st_size:,} bytes")
    with torch.device("meta"):
        skeleton = GPT(model_config)
    expected = skeleton.state_dict(keep_vars=True)
    stored = {id(expected[k]) for k in found if k in expected}  # a tied weight is stored under one name
    missing = sorted(k for k, t in expected.items() if k not in found and id(t) not in stored)
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(f"{k} {found[k]} vs config {tuple(expected[k].shape)}" for k in found
                   if k in expected and found[k] != tuple(expected[k].shape))
    if missing or unexpected or wrong:
        raise ValueError(f"{path} does not match config.json: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                         f"wrong shapes {wrong[:3]}")


def save_train_state(directory: str | os.PathLike, state: dict) -> None:
    """Optimizer state, RNG states and counters; only tensors and plain Python values."""
    atomic_via(Path(directory) / STATE_FILE, lambda tmp: torch.save(state, tmp))


def load_train_state(directory: str | os.PathLike) -> dict:
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise ValueError(f"{directory} has no {STATE_FILE}: it cannot be resumed")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)  # never unpickle arbitrary objects
    except Exception as e:  # noqa: BLE001 - torch raises many types for a damaged file
        raise ValueError(f"{path} is corrupt or truncated ({type(e).__name__})") from None


def weights_step(directory: str | os.PathLike) -> int:
    """The training step recorded in model.safetensors' metadata."""
    from safetensors import safe_open

    with safe_open(str(Path(directory) / WEIGHTS_FILE), framework="pt") as f:
        return int((f.metadata() or {}).get("step", 0))


def read_config(directory: str | os.PathLike) -> ModelConfig:
    path = Path(directory) / CONFIG_FILE
    try:
        return ModelConfig.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a valid qkv model config: {e}") from None


def check_run_dir(directory: str | os.PathLike) -> Path:
    """The directory, if it holds a qkv run; ValueError naming what is missing otherwise."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"{d} is not a qkv run: no such directory")
    missing = [f for f in RUN_FILES if not (d / f).is_file()]
    if missing:
        raise ValueError(f"{d} is not a qkv run: missing {', '.join(missing)}")
    return d


def load_weights(model: nn.Module, directory: str | os.PathLike, *, device="cpu") -> None:
    """Fill ``model`` from model.safetensors; ValueError for a corrupt file or mismatched shapes."""
    from safetensors.torch import load_model as st_load

    path = Path(directory) / WEIGHTS_FILE
    try:
        missing, unexpected = st_load(model, str(path), strict=False, device=str(device))
    except Exception as e:  # noqa: BLE001 - SafetensorError, RuntimeError (shapes), OSError
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is corrupt or truncated, or does not match config.json ({msg[:200]})") from None
    if missing or unexpected:
        raise ValueError(f"{path} does not match config.json: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        digest = (f.metadata() or {}).get("sha256")
    if digest is not None and digest != state_digest(model):
        raise ValueError(f"{path} is corrupt: its weights do not match the checksum saved with them")


@dataclass
class Run:
    """A trained model loaded from a run directory."""

    model: GPT  # in eval mode
    tokenizer: object  # qkv.data.CharTokenizer or BPETokenizer
    config: ModelConfig
    path: Path

    def sample(self, prompt: str, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None) -> str:
        """The prompt followed by ``max_new_tokens`` sampled tokens, as text."""
        from .generate import generate_text

        return generate_text(self.model, self.tokenizer, prompt, max_new_tokens, temperature=temperature,
                             top_k=top_k, top_p=top_p, seed=seed)


def load_run(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> Run:
    """Load a run directory (``qkv train``'s output) for inference.

    Raises ValueError with a clear message for a directory that is not a qkv run, or whose
    config, weights or tokenizer are corrupt or truncated.
    """
    from .data import load_tokenizer

    d = check_run_dir(path)
    config = read_config(d)
    tokenizer = load_tokenizer(d)
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"{d}: tokenizer has {tokenizer.vocab_size} tokens but config.json says "
                         f"vocab_size={config.vocab_size}")
    _check_shapes(d / WEIGHTS_FILE, config)  # before allocating: config.json may ask for absurd sizes
    model = GPT(config).to(device)  # random init is cheap at these sizes and builds every buffer
    load_weights(model, d, device=device)
    return Run(model=model.eval(), tokenizer=tokenizer, config=config, path=d)



def run_info(path: str | os.PathLike) -> dict:
    """What ``qkv info`` shows: model, tokenizer, training progress and results of a run."""
    run = load_run(path)
    c = run.config
    info = {
        "run": str(run.path),
        "model": f"GPT, {run.model.num_parameters() / 1e6:.3f} M parameters: d_model={c.d_model}, "
                 f"num_heads={c.num_heads}, num_layers={c.num_layers}, d_ff={c.ff_width}, max_len={c.max_len}, "
                 f"positional={c.positional}, norm_first={c.norm_first}, activation={c.activation}",
        "tokenizer": f"{run.tokenizer.kind}, {run.tokenizer.vocab_size} tokens",
        "step": weights_step(run.path),
    }
    tc = run.path / "train_config.json"
    if tc.is_file():
        t = json.loads(tc.read_text(encoding="utf-8"))
        info["data"] = t.get("data") or "Python standard library (embedded corpus)"
        info["training"] = (f"batch_size={t.get('batch_size')}, lr={t.get('lr')}, seed={t.get('seed')}, "
                            f"budget: steps={t.get('max_steps')}, minutes={t.get('max_minutes')}, "
                            f"tokens={t.get('max_tokens')}")
    summary = run.path / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text(encoding="utf-8"))
        info["val_bpc"] = (f"{s['val_bpc']:.4f} (gzip -9 {s['gzip_bpc']:.4f}, xz -9e {s['xz_bpc']:.4f}) "
                           f"after {s['steps']} steps, {s['tokens_per_s']:.0f} tokens/s")
    else:
        info["status"] = "unfinished (continue with qkv train --resume --out RUN)"
    return info
