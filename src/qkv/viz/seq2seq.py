"""Figures of the encoder-decoder's attention: the cross-attention grid — rows = target tokens,
columns = source tokens, the alignment figure of the paper's appendix — and, on request, the
encoder's or the decoder's self-attention drawn the same way.

    text → maps.translation_attention → (N, H, T, S) → one heatmap per (layer, head) → save_png

``qkv plot attention`` on a ``qkv.Transformer`` comes here (``plots.plot_attention`` draws one
id sequence's square maps, for a GPT or an Encoder). Like every figure of qkv, it is drawn on its
own ``Figure`` (no pyplot) and written by ``figures.save_png`` (CJK tick labels get a CJK font).

Shapes: N layers, H heads, T target tokens (START first), S source tokens (EOS last).
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from torch import Tensor

from ..models import Transformer
from .figures import fit_heading, quoted_text, save_png
from .maps import TranslationAttention, translation_attention

# kind -> (what it is, row axis, column axis)
KINDS = {
    "cross": ("Cross-attention", "target token (decoder input)", "source token"),
    "encoder": ("Encoder self-attention", "source token (query)", "source token (key)"),
    "decoder": ("Decoder self-attention (causal)", "target token (query)", "target token (key)"),
}
LEFT, RIGHT, BOTTOM, TOP, TITLE = 1.2, 0.7, 1.2, 0.75, 0.35  # inches: labels, colour bar, heading, panel titles
MAX_TICKS = 64  # label every token up to this many, then every k-th


def tick_label(token: str, width: int = 10) -> str:
    """A token as a tick label: whitespace visible, '$' escaped for mathtext, at most ``width`` characters."""
    shown = "".join({" ": "␣", "\n": "↵", "\t": "⇥"}.get(c, c if c.isprintable() else "·") for c in token) or "∅"
    shown = shown if len(shown) <= width else shown[:width - 1] + "…"
    return shown.replace("$", r"\$")


def grid_size(layers: int, heads: int, rows: int, cols: int) -> tuple[float, float, float, float]:
    """(figure width, figure height, panel width, panel height) in inches: ``layers`` × ``heads``
    heatmaps of rows × cols tokens, a token's cell square unless a side would be under 1.2 in."""
    unit = min(max(2.3, 0.1 * max(rows, cols) + 0.9), 7.5) / max(rows, cols)  # inches per token
    panel_w, panel_h = max(1.2, cols * unit), max(1.2, rows * unit)
    return heads * panel_w + LEFT + RIGHT, layers * (panel_h + TITLE) + BOTTOM + TOP, panel_w, panel_h


def _chosen(att: TranslationAttention, kind: str,
            layer: int | None) -> tuple[Tensor, list[str], list[str], list[int]]:
    """(maps (N, H, rows, cols), row labels, column labels, layer numbers) for ``kind`` and ``layer``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    maps, queries, keys = att.views()[kind]
    N = maps.size(0)
    if layer is None:
        return maps, queries, keys, list(range(N))
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < N:
        raise ValueError(f"layer must be an int in [0, {N}) (the {kind} maps' layers) or None for all, got {layer!r}")
    return maps[layer:layer + 1], queries, keys, [layer]


def _heading(att: TranslationAttention, kind: str) -> str:
    """What the grid shows, then on its own line the text → its translation, as written (``fit_heading`` wraps it)."""
    what, rows, cols = KINDS[kind]
    pair = f"“{quoted_text(att.text)}” → “{quoted_text(att.translation)}”" if att.text or att.translation \
        else "(token ids given)"
    return f"{what} per layer (rows) and head (columns): row = {rows}, column = {cols}, colour = weight (√ scale)" \
        f"\n{pair}"


def _ticks(labels: list[str]) -> tuple[list[int], list[str]]:
    step = max(1, -(-len(labels) // MAX_TICKS))  # ceil
    ticks = list(range(0, len(labels), step))
    return ticks, [tick_label(labels[i]) for i in ticks]


def plot_cross_attention(att: TranslationAttention, path: str | os.PathLike, *, layer: int | None = None,
                         kind: str = "cross") -> Path:
    """One heatmap per (layer, head) of ``att``'s cross-attention — rows = target tokens, columns = source
    tokens — or of its ``kind`` = "encoder" / "decoder" self-attention; ``layer``: that layer's heads only."""
    maps, queries, keys, layers = _chosen(att, kind, layer)
    N, H, R, C = maps.shape
    width, height, panel_w, panel_h = grid_size(N, H, R, C)
    fig = Figure(figsize=(width, height))
    heading, heading_h = fit_heading(fig, _heading(att, kind), fontsize=11, margin=0.1, max_lines=2,
                                     min_fontsize=8)  # smaller type before a third line
    top_in = max(TOP, 0.1 + heading_h + 0.25)  # inches: the title, then room for the panels' titles
    height += top_in - TOP
    fig.set_size_inches(width, height)
    heading.set_y(1 - 0.1 / height)
    axes = fig.subplots(N, H, squeeze=False)
    (rt, rn), (ct, cn) = _ticks(queries), _ticks(keys)
    font = min(9.0, max(5.0, min(panel_w / len(ct), panel_h / len(rt)) * 72 / 1.4))  # points: labels fit
    norm = PowerNorm(gamma=0.5, vmin=0, vmax=1)  # √ scale: small weights stay visible beside a weight of 1
    for n, h in itertools.product(range(N), range(H)):
        ax = axes[n, h]
        im = ax.imshow(maps[n, h].numpy(), cmap="viridis", norm=norm, interpolation="nearest", aspect="auto")
        ax.set_title(f"layer {layers[n]}, head {h}", fontsize=9)
        ax.set_xticks(ct, cn if n == N - 1 else [], rotation=90, fontsize=font)
        ax.set_yticks(rt, rn if h == 0 else [], fontsize=font)
    axes[-1, 0].set_xlabel(KINDS[kind][2], fontsize=9)
    axes[-1, 0].set_ylabel(KINDS[kind][1], fontsize=9)
    left, right, bottom, top = LEFT / width, 1 - RIGHT / width, BOTTOM / height, 1 - top_in / height
    fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top, wspace=0.12,
                        hspace=TITLE / panel_h)
    cax = fig.add_axes((right + 0.15 / width, bottom, 0.12 / width, top - bottom))  # colour bar in the right margin
    fig.colorbar(im, cax=cax, ticks=[0, 0.05, 0.2, 0.5, 1]).ax.tick_params(labelsize=8)
    return save_png(fig, path)


def plot_translation_attention(model: Transformer, tokenizer: Any, text: str, path: str | os.PathLike, *,
                               target: str | None = None, num_beams: int = 4, layer: int | None = None,
                               kind: str = "cross") -> Path:
    """Translate ``text`` (or take ``target``) and draw its cross-attention grid (see ``plot_cross_attention``)."""
    att = translation_attention(model, tokenizer, text, target=target, num_beams=num_beams)
    return plot_cross_attention(att, path, layer=layer, kind=kind)
