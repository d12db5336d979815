"""Saving a matplotlib figure: the one place every PNG that qkv draws goes through.

A figure is built as a plain ``matplotlib.figure.Figure`` (no pyplot) and rendered here on
its own Agg canvas, so the global backend is never switched (``matplotlib.use``), whatever
the caller has chosen. The PNG is written atomically through ``qkv.fileio``: a reader sees the
old file or the new one, never half of one.

CJK text (the spec is a Chinese tutorial): matplotlib's default DejaVu Sans has no Chinese,
Japanese or Korean glyphs and matplotlib does not look for a font that has them. Here every
text artist (title, label, tick label, legend entry) holding CJK characters gets an installed
CJK font appended to its font family; matplotlib ≥ 3.6 falls back along that list glyph by
glyph, so Latin text keeps DejaVu. With no CJK font installed, one line on stderr says what
to install instead of one warning per missing glyph.

Shapes: none (a figure in, a PNG file out; its pixels are figsize × dpi).
"""
from __future__ import annotations

import functools
import io
import os
import re
import sys
import warnings
from pathlib import Path

from matplotlib import font_manager, rcParams
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.text import Text

from ..fileio import atomic_write
from .text import CJK, wrap_lines

DPI = 100

# Family names, best first (Simplified Chinese faces first: the spec's language); a name also
# matches its longer forms ("Noto Sans CJK" matches "Noto Sans CJK JP").
CJK_FONTS = (
    "Noto Sans CJK SC", "Noto Sans CJK", "Source Han Sans SC", "Source Han Sans CN", "Source Han Sans",
    "Noto Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Microsoft YaHei", "PingFang SC", "PingFang",
    "Hiragino Sans GB", "Heiti SC", "STHeiti", "SimHei", "AR PL UMing", "AR PL UKai", "Noto Serif CJK",
    "Source Han Serif", "Droid Sans Fallback", "Arial Unicode MS",
)
# The same fonts' file names (lower case, no '-' or '_'), for fonts installed after matplotlib cached its list.
CJK_FILES = ("notosanscjk", "notoserifcjk", "sourcehan", "notosanssc", "wqy", "msyh", "pingfang", "hiragino",
             "stheiti", "simhei", "uming", "ukai", "droidsansfallback", "arialuni")
MISSING_GLYPH = r"Glyph \d+ .*missing from font"  # matplotlib's warning, one per character
INSTALL_HINT = ("qkv: no CJK font is installed, so Chinese/Japanese/Korean text in figures shows as empty boxes; "
                "install one (Debian/Ubuntu: apt-get install fonts-noto-cjk, or the smaller fonts-wqy-microhei; "
                "Fedora: google-noto-sans-cjk-fonts) and draw again")


def save_png(fig: Figure, path: str | os.PathLike, *, dpi: int = DPI) -> Path:
    """Render ``fig`` on an Agg canvas and write it to ``path`` as a PNG (parents created); returns the path.

    The pixel size is figsize × dpi (no tight bounding box); ``Figure(layout="tight")`` lays it out.
    Text holding CJK characters is drawn with an installed CJK font (``use_cjk_font``).
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib.figure.Figure, got {type(fig).__name__}")
    if not isinstance(dpi, (int, float)) or isinstance(dpi, bool) or dpi <= 0:
        raise ValueError(f"dpi must be a positive number, got {dpi!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: rendering never touches pyplot's backend
    found = use_cjk_font(fig)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        if not found:  # INSTALL_HINT said it once
            warnings.filterwarnings("ignore", message=MISSING_GLYPH)
        fig.savefig(buf, dpi=dpi, format="png")
    atomic_write(path, buf.getvalue())
    return path


def use_cjk_font(fig: Figure) -> bool:
    """Append an installed CJK font to the family of every text artist of ``fig`` holding CJK text.

    Returns False when such text exists but no CJK font is installed (INSTALL_HINT is then printed
    on stderr, once per process), True otherwise.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MISSING_GLYPH)  # this layout pass measures with the old fonts
        fig.draw_without_rendering()  # creates the tick labels, which exist only once drawn
    texts = [t for t in fig.findobj(Text) if CJK.search(t.get_text())]
    if not texts:
        return True
    font = cjk_font()
    if font is None:
        missing_font_notice()
        return False
    for text in texts:
        text.set_fontfamily(with_cjk(text.get_fontfamily(), font))
    return True


def with_cjk(families: list[str], font: str | None) -> list[str]:
    """``families`` with the CJK ``font`` last: DejaVu (or the caller's font) first, CJK glyphs from ``font``."""
    return list(families) if font is None or font in families else [*families, font]


def fit_heading(fig: Figure, text: str, *, fontsize: float = 12, margin: float = 0.15, max_lines: int = 3,
                min_fontsize: float = 7) -> tuple[Text, float]:
    """``fig.suptitle(text)`` wrapped so that every line fits the figure's width less ``margin`` inches
    each side, as measured with the renderer (the CJK font included, so Chinese is measured at its real
    width); smaller type, down to ``min_fontsize``, when more than ``max_lines`` lines would be needed.

    Lines break where ``text`` has newlines, at spaces, between CJK characters, or inside a word too
    long for a line. Returns the
    title (top-centred ``margin`` inches below the figure's top) and its height in inches.
    """
    FigureCanvasAgg(fig)  # measuring needs a renderer; save_png attaches its own canvas again
    width = fig.get_figwidth() - 2 * margin
    families = rcParams["font.family"]
    if CJK.search(text):
        families = with_cjk(families, cjk_font())
    size = float(fontsize)
    while True:
        prop = FontProperties(family=families, size=size)
        lines = [line for para in text.split("\n") for line in wrap_lines(para, lambda s: text_width(fig, s, prop), width)]
        if len(lines) <= max_lines or size <= min_fontsize:
            break
        size = max(min_fontsize, size * 0.9)
    title = fig.suptitle("\n".join(lines), fontsize=size, fontfamily=families, va="top",
                         y=1 - margin / fig.get_figheight())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MISSING_GLYPH)
        height = title.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi
    return title, height


def quoted_text(text: str, limit: int = 120) -> str:
    """The text as the reader wrote it, for a title: other whitespace as spaces, other unprintable
    characters as ``\\x00``, '$' escaped for mathtext, over ``limit`` characters cut with '…'."""
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    shown = "".join(" " if c.isspace() else c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return shown.replace("$", r"\$")


def text_width(fig: Figure, text: str, prop: FontProperties) -> float:
    """The width in inches of one line of ``text`` drawn in ``prop`` on ``fig``'s canvas."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MISSING_GLYPH)
        w, _, _ = fig.canvas.get_renderer().get_text_width_height_descent(text, prop, ismath=False)
    return w / fig.dpi


@functools.cache  # searched once per process
def cjk_font() -> str | None:
    """The family name of an installed CJK font (best of CJK_FONTS), or None when there is none."""
    name = _installed_family()
    if name is None and _register_cjk_files():  # installed after matplotlib cached its font list
        name = _installed_family()
    return name


@functools.cache  # said once per process
def missing_font_notice() -> None:
    print(INSTALL_HINT, file=sys.stderr, flush=True)


def _installed_family() -> str | None:
    """The first of CJK_FONTS that matplotlib's font manager knows (exactly, else its shortest longer form)."""
    names = {f.name for f in font_manager.fontManager.ttflist}
    for want in CJK_FONTS:
        longer = sorted((n for n in names if n.startswith(want)), key=lambda n: (len(n), n))
        if longer:
            return longer[0]  # `want` itself when present: it is the shortest
    return None


def _register_cjk_files() -> int:
    """Add the system's CJK font files to matplotlib's font manager; how many were added."""
    added = 0
    for path in font_manager.findSystemFonts():
        if any(hint in re.sub("[-_ ]", "", Path(path).name.lower()) for hint in CJK_FILES):
            try:
                font_manager.fontManager.addfont(path)
                added += 1
            except (OSError, RuntimeError, ValueError):  # unreadable or not a font matplotlib can use
                continue
    return added
