"""Figures a reader would rather look at than read: the sinusoidal PE, softmax saturation
against d_k, a model's attention, layer by layer and head by head, and attention's time and
memory against sequence length (FAQ Q4).

Each function draws on its own matplotlib ``Figure`` (no pyplot), writes one PNG of a fixed
size (figsize × DPI) through ``figures.save_png``, and returns its path.

Shapes: N layers, B batch, H heads, T tokens, C model width.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import torch
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from torch import Tensor, nn

from ..nn.attention import scaled_dot_product_attention
from ..claims import Claim, format_markdown, seeded
from ..claims.measure import fit_exponent
from ..claims.report import words
from ..claims.self_attention import softmax_stats, unit_qk
from ..fileio import atomic_text
from ..nn.positional import SinusoidalPositionalEncoding
from ..data.tokens import encode_text  # noqa: F401  (text -> (ids, labels) for `qkv plot attention`)
from .figures import fit_heading, quoted_text, save_png
from .maps import attention_maps


MAX_PE_CELLS = 1 << 22  # more PE values than a figure can show, and bounded memory


def plot_pe(path: str | os.PathLike, *, d_model: int = 128, length: int = 256, base: float = 10000.0) -> Path:
    """The sinusoidal PE matrix as a heatmap (positions × dimensions), and a few dimensions against position."""
    if not isinstance(length, int) or not 2 <= length <= MAX_PE_CELLS:
        raise ValueError(f"length must be an int in [2, {MAX_PE_CELLS}] (positions to draw), got {length!r}")
    if not isinstance(d_model, int) or not 2 <= d_model <= 4096 or length * d_model > MAX_PE_CELLS:
        raise ValueError(f"need an even d_model in [2, 4096] and length × d_model <= {MAX_PE_CELLS} "
                         f"(a readable picture), got d_model={d_model!r}, length={length}")
    table = SinusoidalPositionalEncoding(d_model, base)(length)  # (T, C)
    fig = Figure(figsize=(14, 5.5))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.15, 1]})
    im = left.imshow(table.T.numpy(), aspect="auto", origin="lower", cmap="RdBu_r", vmin=-1, vmax=1,
                     extent=(-0.5, length - 0.5, -0.5, d_model - 0.5), interpolation="nearest")
    left.set(xlabel="position", ylabel="dimension (even: sin, odd: cos)", title=f"PE matrix ({length} × {d_model})")
    fig.colorbar(im, ax=left, label="PE value")
    shown = min(length, 128)  # more positions make the fastest dimension an unreadable block of colour
    for i in sorted({0, d_model // 16, (5 * d_model) // 32, d_model // 2 - 1}):  # pair i: dimensions 2i, 2i+1
        wavelength = 2 * math.pi * base ** (2 * i / d_model)
        right.plot(table[:shown, 2 * i].numpy(), lw=1.6, label=f"dim {2 * i} (sin), wavelength {wavelength:,.1f}")
    right.set(xlabel="position", ylabel="PE value", ylim=(-1.15, 1.5),
              title=f"sin dimensions against position (first {shown})")
    right.legend(loc="upper right", fontsize=8.5, ncol=2)
    right.grid(alpha=0.3)
    fig.suptitle(f"Sinusoidal positional encoding, d_model = {d_model}: PE(pos, 2i) = sin(pos / {base:g}^(2i/d)), "
                 f"PE(pos, 2i+1) = cos(…); wavelengths 2π … {base:g}^(1−2/d)·2π", fontsize=11)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.11, top=0.86, wspace=0.18)
    return save_png(fig, path)


def scaling_curves(d_ks: Sequence[int], *, seed: int = 0) -> dict:
    """softmax statistics (see ``qkv.claims.self_attention.softmax_stats``) per d_k, with and without 1/√d_k."""
    curves = {"scaled": [], "unscaled": []}
    with seeded(seed):
        for d_k in d_ks:
            q, k = unit_qk(d_k)
            curves["scaled"].append(softmax_stats(scaled_dot_product_attention, q, k))
            curves["unscaled"].append(softmax_stats(scaled_dot_product_attention, q, k, scale=1.0))
    return curves


def plot_scaling(path: str | os.PathLike, *, d_ks: Sequence[int] = (4, 8, 16, 32, 64, 128, 256, 512, 1024),
                 seed: int = 0) -> Path:
    """Softmax saturation against d_k: mean max weight, entropy, and the gradient reaching the scores."""
    curves = scaling_curves(d_ks, seed=seed)
    n = unit_qk(1)[1].size(1)
    panels = [("max_weight", "mean max weight per row", (0, 1.02)),
              ("entropy", "mean entropy per row (nats)", (0, math.log(n) * 1.08)),
              ("grad_median", "median ‖∂L/∂scores‖ per row (log scale)", None)]
    fig = Figure(figsize=(15, 4.8))
    axes = fig.subplots(1, 3)
    styles = {"scaled": ("softmax(QKᵀ/√d_k) — qkv, the paper", "tab:blue", "o"),
              "unscaled": ("softmax(QKᵀ) — no scaling", "tab:red", "s")}
    for ax, (key, label, ylim) in zip(axes, panels):
        for way, (name, color, marker) in styles.items():
            ax.plot(d_ks, [s[key] for s in curves[way]], marker=marker, color=color, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(d_ks), [str(d) for d in d_ks])
        ax.set(xlabel="d_k", title=label)
        if ylim:
            ax.set_ylim(*ylim)
        else:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[1].axhline(math.log(n), color="gray", ls="--", lw=1, label=f"uniform over {n} keys (ln {n})")
    axes[0].legend(loc="upper left", fontsize=9)
    axes[1].legend(loc="center right", fontsize=9)
    fig.suptitle(f"Softmax saturation against d_k, with and without the 1/√d_k scaling (§1.3): q, k ~ N(0, 1), "
                 f"{n} keys per query", fontsize=11)
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.13, top=0.85, wspace=0.22)
    return save_png(fig, path)


def plot_complexity(rows: Sequence[dict], path: str | os.PathLike) -> Path:
    """Time and peak memory against n on log-log axes, one line per path, its fitted exponent in the legend.

    ``rows``: {n, path, seconds, peak_mb} per (n, path), None where skipped — as
    ``qkv.claims.measure_complexity`` (or ``benchmarks.complexity.run``) returns them.
    """
    need = {"n", "path", "seconds", "peak_mb"}
    if not rows or not all(isinstance(r, dict) and need <= set(r) for r in rows):
        got = sorted(rows[0]) if rows and isinstance(rows[0], dict) else rows
        raise ValueError(f"expected rows of dicts with keys {sorted(need)}, got {got!r:.200}")
    lengths = sorted({r["n"] for r in rows})
    fig = Figure(figsize=(13, 5))
    axes = fig.subplots(1, 2)
    panels = [("seconds", 1e3, "time per call (ms)"), ("peak_mb", 1.0, "peak memory (MB)")]
    for ax, (key, scale, label) in zip(axes, panels):
        for name in dict.fromkeys(r["path"] for r in rows):
            mine = [(r["n"], r[key]) for r in rows if r["path"] == name and r[key] is not None and r[key] > 0]
            if mine:
                ns, ys = zip(*mine)
                ax.plot(ns, [y * scale for y in ys], marker="o", label=f"{name}: ∝ n^{fit_exponent(ns, ys):.2f}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths], minor=False)
        ax.set_yscale("log")
        ax.set(xlabel="sequence length n", ylabel=label, title=f"{label} against n (log-log)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=9)
    fig.suptitle("FAQ Q4: attention's cost against sequence length, with the fitted exponent of each path "
                 "(2 = quadratic, 1 = linear)", fontsize=11)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12, top=0.86, wspace=0.2)
    return save_png(fig, path)


def _label(token: str) -> str:
    """A token as a readable tick label: whitespace made visible, matplotlib's mathtext '$' escaped."""
    shown = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    text = "".join(shown.get(c, c if c.isprintable() else f"\\x{ord(c):02x}") for c in token)
    return text.replace("$", r"\$") or "∅"


HEADING_MARGIN = 0.15  # inches above the title


def attention_figure(model: nn.Module, ids: Tensor | Sequence[int], labels: Sequence[str], *,
                     title: str | None = None, text: str | None = None) -> Figure:
    """The figure ``plot_attention`` saves. ``text``: the text named in the default title, as written
    (default: the labels joined); the title is wrapped (and if need be shrunk) to the figure's width."""
    ids = torch.as_tensor(ids)
    if len(labels) != ids.numel():
        raise ValueError(f"expected one label per token ({ids.numel()}), got {len(labels)}")
    att = attention_maps(model, ids)  # (N, H, T, T)
    N, H, T, _ = att.shape
    cell = min(max(2.3, 0.1 * T + 0.9), 7.5)  # inches per heatmap: room for T tick labels
    width = H * cell + 1.6  # + 1 in for the query labels, 0.6 in for the colour bar
    body = N * (cell + 0.4) + 1.0  # 0.4 in per row for panel titles, 1 in for the key labels
    fig = Figure(figsize=(width, body + 1.0))
    shown = quoted_text("".join(labels) if text is None else text)
    heading, heading_h = fit_heading(fig, title or (
        f"Attention weights per layer (rows) and head (columns) on “{shown}”: row = query, column = key, "
        f"colour = weight (√ scale)"), fontsize=12, margin=HEADING_MARGIN)
    top_margin = HEADING_MARGIN + heading_h + 0.3  # inches: the title, then room for the panels' titles
    height = body + top_margin
    fig.set_size_inches(width, height)
    heading.set_y(1 - HEADING_MARGIN / height)
    axes = fig.subplots(N, H, squeeze=False)
    im = draw_heads(axes, att, labels, cell)
    left, right, bottom, top = 1.0 / width, 1 - 0.6 / width, 1.0 / height, 1 - top_margin / height
    fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top, wspace=0.12, hspace=0.4 / cell)
    cax = fig.add_axes((right + 0.12 / width, bottom, 0.12 / width, top - bottom))  # colour bar in the right margin
    fig.colorbar(im, cax=cax, ticks=[0, 0.05, 0.2, 0.5, 1])
    cax.tick_params(labelsize=8)
    return fig


def plot_attention(model: nn.Module, ids: Tensor | Sequence[int], labels: Sequence[str], path: str | os.PathLike,
                   *, title: str | None = None, text: str | None = None) -> Path:
    """A grid of heatmaps, one per (layer, head): row = query token, column = key token, colour = weight.

    ``labels``: one per token (``qkv.viz.labels.readable_labels`` names byte pieces of a character
    狗₁ 狗₂ 狗₃); ``text``: the text as written, for the title (default: the labels joined)."""
    return save_png(attention_figure(model, ids, labels, title=title, text=text), path)


def draw_heads(axes, att: Tensor, labels: Sequence[str], cell: float):
    """One heatmap per (layer, head) of att (N, H, T, T) into the grid ``axes``, ticks labelled; the last image."""
    N, H, T, _ = att.shape
    step = max(1, math.ceil(T / 64))  # label every token up to 64, then every step-th
    ticks = list(range(0, T, step))
    names = [_label(labels[i]) for i in ticks]
    font = min(9.0, max(5.0, cell * 72 / (1.5 * len(ticks))))  # points: the labels fit along one side
    rotation = 0 if all(len(n) <= 2 for n in names) else 90
    norm = PowerNorm(gamma=0.5, vmin=0, vmax=1)  # √ scale: small weights stay visible beside a weight of 1
    for layer in range(N):
        for head in range(H):
            ax = axes[layer, head]
            im = ax.imshow(att[layer, head].numpy(), cmap="viridis", norm=norm, interpolation="nearest")
            ax.set_title(f"layer {layer}, head {head}", fontsize=min(12.0, 6.5 + cell))
            ax.set_xticks(ticks, names if layer == N - 1 else [], rotation=rotation, fontsize=font)
            ax.set_yticks(ticks, names if head == 0 else [], fontsize=font)
            if layer == N - 1:
                ax.set_xlabel("key (attended to)", fontsize=9)
            if head == 0:
                ax.set_ylabel("query", fontsize=9)
    return im


def plot_head_diversity(claim: Claim, path: str | os.PathLike) -> Path:
    """Q3: per layer, the mean pairwise distance between heads, trained against initialisation."""
    t, i = claim.measured["trained_per_layer"], claim.measured["init_per_layer"]
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    x = torch.arange(len(t)).tolist()
    ax.bar([v - 0.2 for v in x], t, width=0.4, label="trained", color="tab:blue")
    ax.bar([v + 0.2 for v in x], i, width=0.4, label="same architecture at initialisation", color="tab:gray")
    ax.set_xticks(x, [f"layer {v}" for v in x])
    ax.set(ylabel="mean pairwise TV distance between heads", ylim=(0, 1))
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Q3: do heads attend differently? Total-variation distance between heads' attention rows", fontsize=11)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.1, top=0.88)
    return save_png(fig, path)


def write_report(results: list[Claim], path: str | os.PathLike, *, model: nn.Module | None = None,
                 ids: Tensor | None = None, labels: Sequence[str] | None = None, lang: str = "en") -> Path:
    """A Markdown report of the claims with the figures embedded, in ``lang`` (en, zh: the table and
    the captions); PNGs are written next to it."""
    path, caption = Path(path), words(lang)["figures"]
    stem = path.stem
    figures = {caption["pe"]: plot_pe(path.with_name(f"{stem}-pe.png")),
               caption["scaling"]: plot_scaling(path.with_name(f"{stem}-scaling.png"))}
    diversity = next((r for r in results if r.name == "head-diversity"), None)
    if diversity is not None:
        figures[caption["heads"]] = plot_head_diversity(diversity, path.with_name(f"{stem}-heads.png"))
    if model is not None and ids is not None and labels is not None:
        figures[caption["attention"]] = plot_attention(model, ids, labels, path.with_name(f"{stem}-attention.png"))
    atomic_text(path, format_markdown(results, {k: p.name for k, p in figures.items()}, lang=lang))
    return path
