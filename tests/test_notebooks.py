"""The chapter notebooks in docs/notebooks: each runs top to bottom without a cell error, and each
is committed with its outputs stripped (``python docs/notebooks/strip_outputs.py``).

Select with ``pytest -k notebooks``. Executing needs the ``notebooks`` extra (nbclient, nbformat,
ipykernel) and matplotlib; the kernel is this interpreter, through a kernel spec in a temporary
Jupyter data directory, so nothing is registered with Jupyter and no other Python is picked up.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra: pip install -e '.[notebooks]'")

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "docs" / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CHAPTERS = {"01_self_attention", "02_multi_head_attention", "03_positional_encoding", "04_transformer_block",
            "05_train_and_inspect"}
KERNEL = "qkv-test-python"  # a name no user has registered


def test_notebooks_one_per_chapter():
    assert CHAPTERS <= {p.stem for p in NOTEBOOKS}, f"missing: {sorted(CHAPTERS - {p.stem for p in NOTEBOOKS})}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, (f"{path.name}: code cells {dirty} hold outputs or execution counts; "
                       f"run python docs/notebooks/strip_outputs.py")


@pytest.fixture(scope="module")
def jupyter_path(tmp_path_factory):
    """A Jupyter data directory holding one kernel spec: this interpreter's ipykernel."""
    pytest.importorskip("nbclient", reason="the notebooks extra: pip install -e '.[notebooks]'")
    pytest.importorskip("ipykernel", reason="the notebooks extra: pip install -e '.[notebooks]'")
    pytest.importorskip("matplotlib", reason="the train extra")
    data = tmp_path_factory.mktemp("jupyter")
    (data / "kernels" / KERNEL).mkdir(parents=True)
    (data / "kernels" / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "qkv tests (this interpreter)",
        "language": "python",
    }))
    return data


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_execute(path, jupyter_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_path))  # searched first; the client starts and stops the kernel
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name=KERNEL, timeout=240, resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
