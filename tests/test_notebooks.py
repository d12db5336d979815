"""The chapter notebooks in docs/notebooks: each runs top to bottom without a cell error, and each
is committed with its outputs stripped (``python docs/notebooks/strip_outputs.py``).

Select with ``pytest -k notebooks``. Executing needs the ``notebooks`` extra (nbclient, nbformat,
ipykernel) and matplotlib; the kernel is this interpreter (docs/hooks/execute_notebooks.py). The docs
build (tests/test_docs.py, which runs first) executes them into this session's directory, and the
copies found there are checked here rather than executed again.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra: pip install -e '.[notebooks]'")

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "docs" / "notebooks"
HOOKS = NOTEBOOK_DIR.parent / "hooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CHAPTERS = {"01_self_attention", "02_multi_head_attention", "03_positional_encoding", "04_transformer_block",
            "05_train_and_inspect"}


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
def execute(tmp_path_factory):
    """Executes a notebook into the session's directory, or finds the docs build's copy there."""
    pytest.importorskip("nbclient", reason="the notebooks extra: pip install -e '.[notebooks]'")
    pytest.importorskip("ipykernel", reason="the notebooks extra: pip install -e '.[notebooks]'")
    pytest.importorskip("matplotlib", reason="the train extra")
    sys.path.insert(0, str(HOOKS))
    try:
        import execute_notebooks
    finally:
        sys.path.remove(str(HOOKS))
    shared = tmp_path_factory.getbasetemp() / execute_notebooks.SESSION_DIR
    return lambda path: execute_notebooks.execute(path, shared)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_execute(path, execute):
    executed, seconds = execute(path)  # raises CellExecutionError, naming the cell, on any error
    print(f"{path.name}: {seconds:.1f} s" if seconds else f"{path.name}: executed by the docs build")
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
