"""A run directory's files: their names, what is there, the one writer's lock, JSON files and the metrics log.

``qkv.training.run_dir.RunDir`` is a ``RunFiles`` that also writes and loads the model and the training state.
Every file is written atomically (``qkv.fileio``). One writer at a time: ``lock()`` takes an exclusive OS lock
that dies with its process, even under SIGKILL.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from ..fileio import atomic_json, atomic_write


class RunLocked(ValueError):
    """Another process is writing this run directory."""


class RunFiles:
    """The layout of one run on disk: its file names, what is there, the writer's lock, its JSON files and
    metrics log (``RunDir`` adds the model and the training state)."""

    CONFIG = "config.json"
    WEIGHTS = "model.safetensors"
    ADAPTERS = "adapters.safetensors"  # a LoRA run's weights: adapters over a base (qkv.finetune)
    TOKENIZER = "tokenizer.json"
    TRAIN_CONFIG = "train_config.json"
    STATE = "train_state.pt"
    SHARDED = "train_state.dcp"  # a folder: an fsdp run's distributed checkpoints, one per step
    METRICS = "metrics.jsonl"
    SUMMARY = "summary.json"
    LOSS_PLOT = "loss.png"
    LOCK = ".lock"
    MODEL_FILES = (CONFIG, WEIGHTS, TOKENIZER)  # what inference needs
    OUTPUTS = (*MODEL_FILES, ADAPTERS, TRAIN_CONFIG, STATE, METRICS, SUMMARY, LOSS_PLOT)  # what training writes

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __str__(self) -> str:
        return str(self.path)

    # --- what is there ---------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def is_empty(self) -> bool:
        return not self.path.is_dir() or not any(p.name != self.LOCK for p in self.path.iterdir())

    def check(self) -> "RunFiles":
        """Self, if it holds a model; ValueError naming what is missing otherwise."""
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"{self.path} is not a qkv run: it is a file, and a run is the directory qkv train "
                             f"writes ({', '.join(self.MODEL_FILES)}, …)")
        if not self.path.is_dir():
            raise ValueError(f"{self.path} is not a qkv run: no such directory")
        weights = self.ADAPTERS if self.has(self.ADAPTERS) else self.WEIGHTS  # a LoRA run: adapters instead
        missing = [f for f in (self.CONFIG, weights, self.TOKENIZER) if not self.has(f)]
        if missing:
            raise ValueError(f"{self.path} is not a qkv run: missing {', '.join(missing)}")
        return self

    def clear(self) -> None:
        """--overwrite: remove the files a run writes (and only those)."""
        for name in self.OUTPUTS:
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self / self.SHARDED, ignore_errors=True)

    # --- one writer ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self) -> Iterator["RunFiles"]:
        """Hold the run's exclusive write lock; RunLocked names the process that holds it.

        The lock file is removed on release; after a SIGKILL it stays, unlocked, and is reused.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        fd = acquire_lock(self.path / self.LOCK, self.path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield self
        finally:
            (self.path / self.LOCK).unlink(missing_ok=True)  # while still held: no one can have it half-way
            os.close(fd)  # closing releases the lock; the kernel does it too if the process dies

    def read_json(self, name: str) -> dict | None:
        path = self / name
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is corrupt: {e}") from None

    def write_json(self, name: str, obj) -> None:
        atomic_json(self / name, obj)

    def read_metrics(self, upto: int) -> list[dict]:
        path = self / self.METRICS
        if not path.is_file():
            return []
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [r for r in records if r["step"] <= upto]

    def write_metrics(self, records: list[dict]) -> None:
        atomic_write(self / self.METRICS, "".join(json.dumps(r) + "\n" for r in records).encode())


def acquire_lock(path: Path, run: Path) -> int:
    """An open descriptor of ``path`` holding its exclusive flock; RunLocked (naming ``run`` and the holder's
    process) when another process holds it."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunLocked(f"{run} is being written by process {holder}: one writer at a time "
                                "(wait for it to finish, or choose another --out)") from None
            raise
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd  # not removed by a releasing holder between our open and our flock
        except FileNotFoundError:
            pass
        os.close(fd)
