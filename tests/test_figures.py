"""qkv.viz.figures: one Agg canvas, atomic PNG writes, the global backend left alone, CJK text drawn."""
import struct
import warnings

import matplotlib
import matplotlib.image
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qkv.viz import figures
from qkv.viz.figures import save_png
from qkv.viz.text import wrap_lines


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


# ---- CJK text: drawn with an installed CJK font, or one line saying what to install ----------

@pytest.fixture
def cjk():
    """The installed CJK font's family name; `make test` installs fonts-wqy-microhei where it can."""
    font = figures.cjk_font()
    if font is None:
        pytest.skip("no CJK font installed (Debian: apt-get install fonts-wqy-microhei; `make test` does it "
                    "where apt-get and root are available)")
    return font


def worded(text, fontsize=32):
    fig = Figure(figsize=(3, 1))
    fig.text(0.5, 0.5, text, fontsize=fontsize, ha="center", va="center")
    return fig


def pixels(fig):
    """The figure drawn on a plain Agg canvas, as save_png would without choosing fonts (RGB array)."""
    FigureCanvasAgg(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3]


def test_cjk_text_is_drawn_with_a_cjk_font(cjk, tmp_path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        path = save_png(worded("注意力"), tmp_path / "zh.png")
    assert not [w for w in seen if "missing from font" in str(w.message)]
    drawn = (matplotlib.image.imread(path)[..., :3] * 255).round().astype(np.uint8)
    boxes = pixels(worded("注意力"))  # DejaVu Sans alone: three empty .notdef boxes
    assert drawn.shape == boxes.shape and (drawn != boxes).any(axis=-1).sum() > 300
    assert (drawn < 128).any(axis=-1).sum() > 300  # dark strokes drawn, not a blank
    # Without the CJK font every Han character is the same box; with it, each its own glyph.
    assert (pixels(worded("注")) == pixels(worded("意"))).all()
    one, other = (matplotlib.image.imread(save_png(worded(c), tmp_path / f"{c}.png")) for c in "注意")
    assert (one != other).any(axis=-1).sum() > 100


def test_only_cjk_texts_get_the_fallback_font(cjk, tmp_path):
    fig = drawn()
    ax = fig.axes[0]
    ax.set_xticks([0, 1, 2], ["狗", "咬", "人"])
    ax.set_ylabel("注意力 weight")
    save_png(fig, tmp_path / "f.png")
    assert ax.yaxis.label.get_fontfamily() == ["sans-serif", cjk]  # Latin letters stay DejaVu Sans
    assert all(t.get_fontfamily() == ["sans-serif", cjk] for t in ax.get_xticklabels())
    assert ax.title.get_fontfamily() == ["sans-serif"]  # "dog bites man": untouched


def test_without_a_cjk_font_one_line_says_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(figures, "cjk_font", lambda: None)
    figures.missing_font_notice.cache_clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        save_png(worded("多头注意力"), tmp_path / "a.png")
        save_png(worded("位置编码"), tmp_path / "b.png")
    figures.missing_font_notice.cache_clear()
    assert not [w for w in seen if "missing from font" in str(w.message)]  # no warning per glyph
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no CJK font" in err[0] and "fonts-noto-cjk" in err[0], err


def test_latin_figures_never_look_for_a_font(monkeypatch, tmp_path):
    monkeypatch.setattr(figures, "cjk_font", lambda: pytest.fail("searched for a CJK font"))
    save_png(drawn(), tmp_path / "f.png")


def test_wrap_lines_break_at_spaces_between_cjk_characters_and_inside_long_words():
    width_of = len  # one unit per character
    assert wrap_lines("the dog bites man", width_of, 8) == ["the dog", "bites", "man"]
    assert wrap_lines("on “狗咬人咬狗”", width_of, 5) == ["on “狗", "咬人咬狗”"]
    assert wrap_lines("abcdefghij", width_of, 4) == ["abcd", "efgh", "ij"]


def test_fit_heading_wraps_then_shrinks_to_the_figure_width():
    fig = Figure(figsize=(3, 2))
    title, height = figures.fit_heading(fig, "word " * 12, fontsize=12, margin=0.1, max_lines=3, min_fontsize=12)
    renderer = fig.canvas.get_renderer()
    assert title.get_text().count("\n") >= 1 and title.get_window_extent(renderer).width <= 2.8 * fig.dpi
    assert height == pytest.approx(title.get_window_extent(renderer).height / fig.dpi)
    small, _ = figures.fit_heading(Figure(figsize=(3, 2)), "word " * 12, fontsize=12, max_lines=1, min_fontsize=6)
    assert small.get_fontsize() < 12 and small.get_text().count("\n") <= title.get_text().count("\n")
