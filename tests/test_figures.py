"""qkv.viz.figures: one Agg canvas, atomic PNG writes, and the global backend left alone."""
import struct

import matplotlib
import pytest
from matplotlib.figure import Figure

from qkv.viz.figures import save_png


def drawn(figsize=(3, 2)):
    fig = Figure(figsize=figsize, layout="tight")
    ax = fig.subplots()
    ax.plot([0, 1, 2], [1, 0, 1])
    ax.set_title("dog bites man")
    return fig


def test_png_of_figsize_times_dpi_written_atomically(tmp_path):
    backend = dict.__getitem__(matplotlib.rcParams, "backend")  # raw: reading it must not resolve it
    path = save_png(drawn(), tmp_path / "new" / "f.png")
    assert path == tmp_path / "new" / "f.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (300, 200)
    assert struct.unpack(">II", save_png(drawn(), path, dpi=50).read_bytes()[16:24]) == (150, 100)  # replaced
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.png"]  # no temporary file left
    assert dict.__getitem__(matplotlib.rcParams, "backend") == backend


def test_bad_input(tmp_path):
    with pytest.raises(TypeError, match="matplotlib.figure.Figure, got str"):
        save_png("figure", tmp_path / "x.png")
    with pytest.raises(ValueError, match="dpi must be a positive number, got 0"):
        save_png(drawn(), tmp_path / "x.png", dpi=0)
    assert not list(tmp_path.iterdir())
