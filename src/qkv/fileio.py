"""Atomic file writes: a temporary file in the same directory, then a rename over the target.

A crash, a kill or a full disk leaves either the old file or the new one, never half of one.
New files get the mode any file the user creates would get (0666 less the umask: 0644
under the usual 022), not mkstemp's private 0600.

A leaf module: it imports nothing from qkv, so everything else may import it.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable, Iterator


class DiskFullError(OSError):
    """A file could not be written because its filesystem is full; the old file, if any, is untouched."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(errno.ENOSPC, f"the disk is full: could not write {path} (free some space and try again)")
        self.path = Path(path)

    def __str__(self) -> str:
        return self.strerror


def current_umask() -> int:
    """The process umask (read by setting and restoring it: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _is_disk_full(exc: BaseException, directory: Path) -> bool:
    """ENOSPC, however the writing library reported it (torch's zip writer says only 'unexpected pos')."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    if "No space left" in text or "os error 28" in text:
        return True
    try:
        return os.statvfs(directory).f_bavail == 0
    except OSError:
        return False


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed over ``path``.

    For libraries that insist on writing a file name themselves (safetensors, torch.save, savefig).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        full = isinstance(e, Exception) and not isinstance(e, DiskFullError) and _is_disk_full(e, path.parent)
        Path(tmp).unlink(missing_ok=True)  # after the check: removing it frees the space
        if full:
            raise DiskFullError(path) from None
        raise


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def atomic_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, text.encode("utf-8"))


def atomic_json(path: str | os.PathLike, obj) -> None:
    atomic_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def atomic_via(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` writes the file under a temporary name; then it is renamed to ``path``."""
    with atomic_path(path) as tmp:
        write(tmp)


def check_free_dir(path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """``path`` as a Path, if it may become a new directory: missing, empty, or ``overwrite``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(f"{path} already exists and is not empty; pass --overwrite to replace it")
    return path


def atomic_dir(path: str | os.PathLike, write: Callable[[Path], object], *, overwrite: bool = False) -> Path:
    """``write(tmp)`` fills a temporary sibling directory, which then takes ``path``'s place (a non-empty
    ``path`` only with ``overwrite``): a failure at any point leaves ``path`` as it was."""
    path = check_free_dir(path, overwrite=overwrite)
    made = [p for p in path.absolute().parents if not p.exists()]  # the folders created here, innermost first
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    old = tmp.with_suffix(".old")
    try:
        write(tmp)
        os.chmod(tmp, 0o777 & ~current_umask())
        if path.exists():
            path.rename(old)  # then the rename below cannot meet a non-empty directory
        try:
            tmp.rename(path)
        except BaseException:
            if old.exists():
                old.rename(path)
            raise
    except BaseException as e:
        full = isinstance(e, Exception) and not isinstance(e, DiskFullError) and _is_disk_full(e, path.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:
            with suppress(OSError):
                folder.rmdir()
        if full:
            raise DiskFullError(path) from None
        raise
    shutil.rmtree(old, ignore_errors=True)
    return path
