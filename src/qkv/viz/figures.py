"""Saving a matplotlib figure: the one place every PNG that qkv draws goes through.

A figure is built as a plain ``matplotlib.figure.Figure`` (no pyplot) and rendered here on
its own Agg canvas, so the global backend is never switched (``matplotlib.use``), whatever
the caller has chosen. The PNG is written atomically through ``qkv.fileio``: a reader sees the
old file or the new one, never half of one. Label fonts (CJK, for the spec's examples)
are to be chosen here too, so that every figure gets the same.

Shapes: none (a figure in, a PNG file out; its pixels are figsize × dpi).
"""
from __future__ import annotations

import io
import os
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..fileio import atomic_write

DPI = 100


def save_png(fig: Figure, path: str | os.PathLike, *, dpi: int = DPI) -> Path:
    """Render ``fig`` on an Agg canvas and write it to ``path`` as a PNG (parents created); returns the path.

    The pixel size is figsize × dpi (no tight bounding box); ``Figure(layout="tight")`` lays it out.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib.figure.Figure, got {type(fig).__name__}")
    if not isinstance(dpi, (int, float)) or isinstance(dpi, bool) or dpi <= 0:
        raise ValueError(f"dpi must be a positive number, got {dpi!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: rendering never touches pyplot's backend
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    atomic_write(path, buf.getvalue())
    return path
