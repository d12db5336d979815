"""The chapter notebooks executed top to bottom by this interpreter, into a directory of copies.

Shared by the docs build (docs/hooks/notebooks.py) and tests/test_notebooks.py, so that a test session
executes each notebook once. Needs the ``notebooks`` extra (nbclient, nbformat, ipykernel), not mkdocs.
The kernel is this interpreter's ipykernel, through a kernel spec in a temporary Jupyter data directory,
so nothing is registered with Jupyter and no other Python is picked up.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

KERNEL = "qkv-docs-python"  # a name no user has registered
TIMEOUT_S = 240  # per cell
SESSION_DIR = "executed-notebooks"  # under pytest's base temporary directory: one per test session


def kernel_dir(parent: Path) -> Path:
    """A Jupyter data directory under ``parent`` holding one kernel spec: this interpreter's ipykernel."""
    data = Path(tempfile.mkdtemp(prefix="jupyter-", dir=parent))
    (data / "kernels" / KERNEL).mkdir(parents=True)
    (data / "kernels" / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "qkv docs (this interpreter)",
        "language": "python",
    }))
    return data


def execute(source: Path, dest_dir: Path) -> tuple[Path, float]:
    """(``dest_dir/source.name``, seconds): the notebook executed, run in its own directory.

    An existing copy is reused (0 seconds). Raises nbclient's CellExecutionError, naming the cell, on
    any error; then nothing is written.
    """
    import nbformat
    from nbclient import NotebookClient

    dest = dest_dir / source.name
    if dest.exists():
        return dest, 0.0
    dest_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(source, as_version=4)
    previous = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(kernel_dir(dest_dir))  # searched first; the client starts and stops the kernel
    try:
        start = time.perf_counter()
        NotebookClient(nb, kernel_name=KERNEL, timeout=TIMEOUT_S,
                       resources={"metadata": {"path": str(source.parent)}}).execute()
        seconds = time.perf_counter() - start
    finally:
        if previous is None:
            del os.environ["JUPYTER_PATH"]
        else:
            os.environ["JUPYTER_PATH"] = previous
    partial = dest.with_name(dest.name + ".partial")
    nbformat.write(nb, partial)
    partial.replace(dest)  # a reader never sees half a notebook
    return dest, seconds
