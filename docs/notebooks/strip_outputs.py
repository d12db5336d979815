"""Strip the notebooks' outputs so that the repository holds only their source (readable diffs).

    python docs/notebooks/strip_outputs.py              # every notebook beside this file, in place
    python docs/notebooks/strip_outputs.py --check      # exit 1 naming the notebooks that hold outputs
    python docs/notebooks/strip_outputs.py a.ipynb ...  # only these

Clears each code cell's outputs and execution count, the per-run cell metadata Jupyter adds
(timings, scroll state) and the notebook metadata that differs between machines (the Python
version in ``language_info``). ``tests/test_notebooks.py`` fails while a notebook holds outputs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
RUN_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled")  # written by a run, not by the author


def strip(nb: nbformat.NotebookNode) -> bool:
    """Strip ``nb`` in place; True when anything changed."""
    before = nbformat.writes(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in RUN_METADATA:
            cell.metadata.pop(key, None)
    nb.metadata = nbformat.from_dict({
        "kernelspec": nb.metadata.get("kernelspec", {"display_name": "Python 3", "language": "python",
                                                     "name": "python3"}),
        "language_info": {"name": "python"},
    })
    return nbformat.writes(nb) != before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Strip outputs from Jupyter notebooks.")
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: every *.ipynb beside this script)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook needs stripping")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(HERE.glob("*.ipynb"))
    dirty = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if strip(nb):
            dirty.append(path)
            if not args.check:
                nbformat.write(nb, path)
    for path in dirty:
        print(f"{'needs stripping' if args.check else 'stripped'}: {path}")
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
