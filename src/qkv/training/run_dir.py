"""The run directory: one object owns its layout, its writes and its lock.

A run directory holds::

    config.json         the ModelConfig
    model.safetensors   the weights (safetensors: no code runs when it is read); its metadata
                        names the architecture (GPT, Encoder, Transformer), the step and a SHA-256
    adapters.safetensors  instead of model.safetensors in a LoRA run: the adapters alone, the same
                        metadata; the base they apply to is named in train_config.json (qkv.finetune)
    tokenizer.json      the tokenizer (qkv.data)
    train_config.json   how it was trained            (training only)
    train_state.pt      optimizer + RNG state, step  (training only; read with weights_only=True)
    train_state.dcp/    an fsdp run's weights and optimizer state as a distributed checkpoint, one folder per
                        step (step-00000040/: each rank's shards, then DCP's index); train_state.pt, written
                        last, names the complete one to resume (qkv.training.sharded_checkpoint)
    metrics.jsonl, summary.json, loss.png
    .lock               held (flock) by the one process that writes the run

Every file is written atomically (``qkv.fileio``): a crash, a kill or a full disk leaves either
the old file or the new one. One writer at a time: ``RunDir.lock()`` takes an exclusive OS lock
that dies with its process, even under SIGKILL. The names, the lock, the JSON files and the metrics log are
``RunFiles``' (qkv.training.run_files); ``RunDir`` adds the model and the training state.

A run is also a base to fine-tune (``load_base``: a finished decoder run, or a Hugging Face directory), and a
LoRA run loads its base to apply its adapters (``adapted_base``): the one recursion, kept in this module.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from ..fileio import atomic_json, atomic_via, atomic_write
from ..models import GPT, Encoder, ModelConfig, Transformer
from ..models.pointer import PointerTransformer
from .run_files import RunFiles, RunLocked  # noqa: F401  (RunLocked: raised by RunDir.lock)

if TYPE_CHECKING:
    from .finetune import Base, BaseSource

ARCHITECTURES: dict[str, type[nn.Module]] = {"GPT": GPT, "Encoder": Encoder, "Transformer": Transformer,
                                             "PointerTransformer": PointerTransformer}


class RunDir(RunFiles):
    """One run on disk: its files (``RunFiles``), and the model and the training state written into them."""

    # --- model -------------------------------------------------------------------------------
    def save_model(self, model: nn.Module, tokenizer, *, step: int = 0) -> None:
        """config.json, model.safetensors (adapters.safetensors for a LoRA model) and tokenizer.json, each atomically."""
        from safetensors.torch import save_file, save_model as st_save

        from .finetune import has_lora, model_weights

        self.path.mkdir(parents=True, exist_ok=True)
        atomic_json(self / self.CONFIG, model.config.to_dict())
        meta = {"format": "pt", "step": str(step), "architecture": type(model).__name__}
        if has_lora(model):
            adapters = {k: v.contiguous() for k, v in model_weights(model).items()}
            meta["sha256"] = tensors_digest(adapters)
            atomic_via(self / self.ADAPTERS, lambda tmp: save_file(adapters, str(tmp), metadata=meta))
        else:
            meta["sha256"] = state_digest(model)
            atomic_via(self / self.WEIGHTS, lambda tmp: st_save(model, str(tmp), metadata=meta))  # ties stored once
        tokenizer.save(self.path)

    def weights_metadata(self) -> dict:
        from safetensors import safe_open

        path = self / (self.ADAPTERS if self.has(self.ADAPTERS) else self.WEIGHTS)
        try:
            with safe_open(str(path), framework="pt") as f:
                return f.metadata() or {}
        except Exception as e:  # noqa: BLE001 - SafetensorError for a damaged header, OSError
            raise ValueError(f"{path} is corrupt or truncated "
                             f"({str(e).strip()[:200] or type(e).__name__})") from None

    def architecture(self) -> type[nn.Module]:
        name = self.weights_metadata().get("architecture", "GPT")  # metadata without one: GPT
        if name not in ARCHITECTURES:
            raise ValueError(f"{self / self.WEIGHTS} names an unknown architecture {name!r}; "
                             f"expected one of {sorted(ARCHITECTURES)}")
        return ARCHITECTURES[name]

    def read_config(self) -> ModelConfig:
        path = self / self.CONFIG
        try:
            return ModelConfig.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path} is not a valid qkv model config: {e}") from None

    def load(self, *, device: str | torch.device = "cpu") -> "Run":
        """The trained model (eval mode) and tokenizer; ValueError for anything corrupt or mismatched."""
        from ..data import load_tokenizer

        self.check()
        config = self.read_config()
        tokenizer = load_tokenizer(self.path)
        if tokenizer.vocab_size != config.vocab_size and not self.padded_vocabulary(tokenizer, config):
            raise ValueError(f"{self.path}: tokenizer has {tokenizer.vocab_size} tokens but config.json says "
                             f"vocab_size={config.vocab_size}")
        cls = self.architecture()
        if self.has(self.ADAPTERS):  # LoRA: the base, the run's adapters, merged into plain nn.Linear layers
            from .finetune import merge_lora

            model = adapted_base(self, config)
            load_weights(model, self.path)
            return Run(model=merge_lora(model).to(device).eval(), tokenizer=tokenizer, config=config, path=self.path)
        check_shapes(self / self.WEIGHTS, config, cls)  # before allocating: config.json may ask for absurd sizes
        model = cls(config).to(device)
        load_weights(model, self.path, device=device)
        return Run(model=model.eval(), tokenizer=tokenizer, config=config, path=self.path)

    def padded_vocabulary(self, tokenizer, config: ModelConfig) -> bool:
        """A run fine-tuned from a checkpoint may hold more embeddings than its tokenizer uses (padded
        vocabularies); every other run's tokenizer and embeddings match one to one."""
        from .finetune import base_source

        fine_tuned = base_source(self.read_json(self.TRAIN_CONFIG) or {}) is not None
        return fine_tuned and tokenizer.vocab_size < config.vocab_size

    # --- training --------------------------------------------------------------------------
    def save_state(self, state: dict) -> None:
        """Optimizer state, RNG states and counters; only tensors and plain Python values.

        Serialised in memory first, so a full disk fails at the write (ENOSPC), never mid-archive.
        """
        buf = io.BytesIO()
        torch.save(state, buf)
        atomic_write(self / self.STATE, buf.getvalue())

    def sharded_name(self, step: int) -> str:
        """Where the distributed checkpoint of ``step`` goes, relative to the run (train_state.pt names it)."""
        return f"{self.SHARDED}/step-{step:08d}"

    def discard_sharded(self, keep: str | None = None) -> None:
        """Remove the distributed checkpoints but ``keep``: older ones, and any a killed run left half-written."""
        folder = self / self.SHARDED
        for old in sorted(folder.iterdir()) if folder.is_dir() else []:
            if f"{self.SHARDED}/{old.name}" != keep:
                shutil.rmtree(old, ignore_errors=True)

    def load_state(self) -> dict:
        path = self / self.STATE
        if not path.is_file():
            raise ValueError(f"{self.path} has no {self.STATE}: it cannot be resumed")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)  # never unpickle arbitrary objects
        except Exception as e:  # noqa: BLE001 - torch raises many types for a damaged file
            raise ValueError(f"{path} is corrupt or truncated ({type(e).__name__})") from None


def state_digest(model: nn.Module) -> str:
    """SHA-256 of every state_dict tensor's bytes, by name: safetensors has no checksum of its own,
    so a bit flip in the weights would otherwise load silently."""
    return tensors_digest(model.state_dict())


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the tensors' bytes, by name."""
    return streamed_digest(tensors, tensors.__getitem__)


def streamed_digest(names, tensor: Callable[[str], torch.Tensor]) -> str:
    """``tensors_digest`` of the tensors ``tensor(name)`` gives for ``names``, asked for one at a time."""
    h = hashlib.sha256()
    for name in sorted(names):
        h.update(name.encode())
        h.update(tensor(name).detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_weights(directory: str | os.PathLike) -> None:
    """model.safetensors (adapters.safetensors) against the checksum saved with it, read one tensor at a time,
    without a model (an fsdp run holds none whole); ValueError when it is damaged."""
    from safetensors import safe_open

    run = RunDir(directory)
    path = run / (run.ADAPTERS if run.has(run.ADAPTERS) else run.WEIGHTS)
    meta = run.weights_metadata()  # ValueError for a damaged header
    try:
        with safe_open(str(path), framework="pt") as f:
            stored = set(f.keys())  # a tied matrix once: its other names map to the stored one in the metadata
            names = stored | {alias for alias, kept in meta.items() if kept in stored}
            digest = streamed_digest(names, lambda n: f.get_tensor(n if n in stored else meta[n]))
    except Exception as e:  # noqa: BLE001 - SafetensorError for truncated data, OSError
        raise ValueError(f"{path} is corrupt or truncated ({str(e).strip()[:200] or type(e).__name__})") from None
    if meta.get("sha256") not in (None, digest):
        raise ValueError(f"{path} is corrupt: its weights do not match the checksum saved with them")


def check_shapes(path: Path, model_config: ModelConfig, cls: type[nn.Module] = GPT) -> None:
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
        skeleton = cls(model_config)
    expected = skeleton.state_dict(keep_vars=True)
    stored = {id(expected[k]) for k in found if k in expected}  # a tied weight is stored under one name
    missing = sorted(k for k, t in expected.items() if k not in found and id(t) not in stored)
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(f"{k} {found[k]} vs config {tuple(expected[k].shape)}" for k in found
                   if k in expected and found[k] != tuple(expected[k].shape))
    if missing or unexpected or wrong:
        raise ValueError(f"{path} does not match config.json: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                         f"wrong shapes {wrong[:3]}")


def load_weights(model: nn.Module, directory: str | os.PathLike, *, device="cpu") -> None:
    """Fill ``model`` from model.safetensors (a LoRA model: its adapters from adapters.safetensors);
    ValueError for a corrupt file or mismatched shapes."""
    from safetensors.torch import load_model as st_load

    if RunDir(directory).has(RunDir.ADAPTERS):
        load_adapters(model, directory, device=device)
        return
    path = Path(directory) / RunDir.WEIGHTS
    try:
        missing, unexpected = st_load(model, str(path), strict=False, device=str(device))
    except Exception as e:  # noqa: BLE001 - SafetensorError, RuntimeError (shapes), OSError
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is corrupt or truncated, or does not match config.json ({msg[:200]})") from None
    if missing or unexpected:
        raise ValueError(f"{path} does not match config.json: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    digest = RunDir(directory).weights_metadata().get("sha256")
    if digest is not None and digest != state_digest(model):
        raise ValueError(f"{path} is corrupt: its weights do not match the checksum saved with them")


def load_adapters(model: nn.Module, directory: str | os.PathLike, *, device="cpu") -> None:
    """Fill a LoRA ``model``'s adapters from adapters.safetensors, checked against their saved SHA-256."""
    from safetensors.torch import load_file

    from .finetune import set_model_weights

    path = Path(directory) / RunDir.ADAPTERS
    digest = RunDir(directory).weights_metadata().get("sha256")  # ValueError for a damaged header
    try:
        adapters = load_file(str(path), device=str(device))
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError
        raise ValueError(f"{path} is corrupt or truncated ({str(e).strip()[:200] or type(e).__name__})") from None
    if digest != tensors_digest(adapters):
        raise ValueError(f"{path} is corrupt: its adapters do not match the checksum saved with them")
    set_model_weights(model, adapters, where=str(path))


@dataclass
class Run:
    """A trained model loaded from a run directory."""

    model: nn.Module  # GPT, Encoder or Transformer, in eval mode
    tokenizer: object  # qkv.data.CharTokenizer or BPETokenizer
    config: ModelConfig
    path: Path

    def sample(self, prompt: str, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None) -> str:
        """The prompt followed by ``max_new_tokens`` sampled tokens, as text."""
        from ..generation import generate_text

        return generate_text(self.model, self.tokenizer, prompt, max_new_tokens, temperature=temperature,
                             top_k=top_k, top_p=top_p, seed=seed)


# --- the functions of earlier releases, kept: each is one RunDir method ----------------------
CONFIG_FILE, WEIGHTS_FILE, STATE_FILE = RunDir.CONFIG, RunDir.WEIGHTS, RunDir.STATE
RUN_FILES = RunDir.MODEL_FILES


def save_model(directory: str | os.PathLike, model: nn.Module, tokenizer, *, step: int = 0) -> None:
    RunDir(directory).save_model(model, tokenizer, step=step)


def save_train_state(directory: str | os.PathLike, state: dict) -> None:
    RunDir(directory).save_state(state)


def load_train_state(directory: str | os.PathLike) -> dict:
    return RunDir(directory).load_state()


def weights_step(directory: str | os.PathLike) -> int:
    """The training step recorded in model.safetensors' metadata."""
    return int(RunDir(directory).weights_metadata().get("step", 0))


def read_config(directory: str | os.PathLike) -> ModelConfig:
    return RunDir(directory).read_config()


def check_run_dir(directory: str | os.PathLike) -> Path:
    """The directory, if it holds a qkv run; ValueError naming what is missing otherwise."""
    return RunDir(directory).check().path


def load_run(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> Run:
    """Load a run directory (``qkv train``'s output) for inference; ValueError with a clear message for
    a directory that is not a qkv run, or whose config, weights or tokenizer are corrupt or truncated."""
    return RunDir(path).load(device=device)


# --- a base to fine-tune: a finished run of a decoder, or a Hugging Face directory (qkv.training.finetune) ---

def finished_run(path: str | os.PathLike) -> RunDir:
    """The run at ``path`` given as a base (--init-from), if it holds final weights (its summary.json is written
    when it finishes); ValueError naming what is missing otherwise."""
    run = RunDir(path)
    try:
        run.check()
    except ValueError as e:
        raise ValueError(f"the base run (--init-from) {e}") from None
    if not run.has(run.SUMMARY):
        raise ValueError(f"the base run (--init-from) {path}: the run has not finished (no {run.SUMMARY}; its weights are a "
                         f"checkpoint): finish it with qkv train --resume --out {path}")
    return run


def run_base_tokenizer(path: str | os.PathLike) -> str:
    """The tokenizer kind (char | bpe) of the run at ``path``, checked to be a finished decoder run first."""
    run = finished_run(path)
    if not issubclass(run.architecture(), GPT):
        raise ValueError(f"--init-from {path} holds a qkv.{run.architecture().__name__}, not a decoder (a --task "
                         "translate run is an encoder-decoder); fine-tuning starts from a run of --task lm, sft or dpo")
    from ..data import load_tokenizer

    return load_tokenizer(run.path).kind


def load_base(source: BaseSource, *, expect_sha256: str | None = None) -> Base:
    """The checkpoint ``source`` names, to fine-tune; ValueError for anything but a decoder with a matching
    BPE tokenizer (a run's own tokenizer, whatever its kind), or for weights whose SHA-256 is not
    ``expect_sha256`` (when given)."""
    from .finetune import Base, check_decoder, hf_base, weights_sha256

    where = str(source.path)
    if not Path(where).is_dir():
        raise ValueError(f"the base {where}: no such directory")
    if source.kind == "run":
        loaded = finished_run(where).load()
        model, tokenizer = check_decoder(loaded.model, where), loaded.tokenizer
    else:
        model, tokenizer = hf_base(where)
    sha = weights_sha256(where)
    if expect_sha256 is not None and sha != expect_sha256:
        raise ValueError(f"{where} is not the base this run was trained from: its weights' SHA-256 "
                         f"is {sha[:16]}…, the run's base had {expect_sha256[:16]}…")
    return Base(model=model, tokenizer=tokenizer, sha256=sha, path=where)


def adapted_base(run: RunDir, config: ModelConfig) -> GPT:
    """A LoRA run's base (found by train_config.json, checked by SHA-256) with empty adapters, ready for
    the run's adapters (``checkpoint.load_weights``) and then ``merge_lora``."""
    from .finetune import add_lora, base_source

    t = run.read_json(run.TRAIN_CONFIG) or {}
    source = base_source(t)
    if not (source and t.get("init_sha256") and t.get("lora")):
        raise ValueError(f"{run} holds LoRA adapters, but its {run.TRAIN_CONFIG} does not name their base")
    base = load_base(source, expect_sha256=t["init_sha256"])
    if base.model.config != config:
        raise ValueError(f"{run}'s config.json does not describe its base {base.path}")
    return add_lora(base.model, r=t["lora"], alpha=t["lora_alpha"], targets=t["lora_targets"])
