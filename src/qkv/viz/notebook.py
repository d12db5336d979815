"""The attention explorer inside Jupyter: ``show(source, text)`` returns an object a notebook
displays inline — the page ``qkv explore --html`` writes, in a sandboxed iframe.

    source → (model, tokenizer) → explorer.text_data → explorer.page → <iframe srcdoc=…>

A translation run (a ``qkv.Transformer``) translates the text first and the page has three views:
the encoder's self-attention, the decoder's (causal) and the cross-attention (target × source).

The page travels HTML-escaped in ``srcdoc``, so no character of it can end the attribute, and
``sandbox="allow-scripts"`` gives it an opaque origin: its scripts run, but cannot reach the
notebook, its kernel or its cookies. Nothing is fetched: scripts, styles and data are inline and
the page's Content-Security-Policy forbids network loads.

Shapes: T tokens (target), S source tokens.
"""
from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from ..training.run_dir import Run, load_run
from .experts import expert_load_data
from .explorer import page, text_data, write_html

HEIGHT = 760  # pixels: the heatmap, the head grid and the entropy table without scrolling on a laptop


class ExplorerView:
    """An explorer page that Jupyter shows inline (``_repr_html_``); ``.html`` is the page itself."""

    def __init__(self, page: str, *, height: int = HEIGHT) -> None:
        if not isinstance(height, int) or isinstance(height, bool) or not 100 <= height <= 10_000:
            raise ValueError(f"height must be an int in 100 … 10000 (pixels), got {height!r}")
        self.html, self.height = page, height

    def _repr_html_(self) -> str:
        return (f'<iframe sandbox="allow-scripts" referrerpolicy="no-referrer" title="qkv attention explorer" '
                f'style="width: 100%; height: {self.height}px; border: 1px solid #ddd" '
                f'srcdoc="{html.escape(self.html, quote=True)}"></iframe>')

    def save(self, path: str | os.PathLike) -> Path:
        """Write the page as a standalone HTML file (atomically)."""
        return write_html(path, self.html)

    def __repr__(self) -> str:
        return f"ExplorerView({len(self.html):,} characters of HTML; display it in Jupyter or .save(path))"


def show(source: Any, text: str, *, tokenizer: Any = None, title: str = "qkv explorer", height: int = HEIGHT,
         target: str | None = None, num_beams: int = 4) -> ExplorerView:
    """The attention explorer on ``text``, shown inline when a notebook cell ends with it.

    ``source``: a qkv model (with ``tokenizer=``), a ``Run``, a run directory (with the expert-load panel
    when it trained a mixture of experts) or a Hugging Face directory; ``tokenizer`` overrides theirs;
    ``height`` is the frame's, in pixels. An encoder-decoder translates ``text`` (``num_beams``; 1: greedy),
    or reads the given ``target`` translation.
    """
    model, tokenizer = load_source(source, tokenizer=tokenizer)
    data = text_data(model, tokenizer, text, title=title, target=target, num_beams=num_beams)
    run = source.path if isinstance(source, Run) else source if isinstance(source, (str, os.PathLike)) else None
    experts = expert_load_data(run, model) if run is not None else None  # a mixture of experts' training log
    return ExplorerView(page(data, title=title, experts=experts), height=height)


def load_source(source: Any, *, tokenizer: Any = None) -> tuple[nn.Module, Any]:
    """(model, tokenizer) from a model (+ ``tokenizer``), a Run, a run directory or a Hugging Face directory."""
    if isinstance(source, nn.Module):
        model, own = source, None
    elif isinstance(source, Run):
        model, own = source.model, source.tokenizer
    elif isinstance(source, (str, os.PathLike)):
        model, own = _load_directory(Path(source))
    else:
        raise TypeError("source must be a qkv model, a Run, or the path of a run or Hugging Face directory, "
                        f"got {type(source).__name__}")
    tokenizer = own if tokenizer is None else tokenizer
    if tokenizer is None:
        raise ValueError("expected a tokenizer to read the text, got none: pass show(model, text, tokenizer=…)")
    return model, tokenizer


def _load_directory(path: Path) -> tuple[nn.Module, Any]:
    """A run directory, or a Hugging Face one (its config.json names a ``model_type``)."""
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"expected a qkv run directory or a Hugging Face model directory, got {path}: "
                         + ("no config.json in it" if path.is_dir() else "no such directory"))
    try:
        is_hf = "model_type" in json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, TypeError):
        is_hf = False  # load_run says what is wrong with it
    if is_hf:
        from ..interop.hf import load_pretrained

        model, tokenizer = load_pretrained(path)
        return model.eval(), tokenizer
    run = load_run(path)
    return run.model, run.tokenizer
