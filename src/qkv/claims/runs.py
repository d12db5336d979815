"""Inputs for the claims that need a trained run (`qkv verify --run DIR`): the run's validation
text and windows of its token ids.

Shapes: W windows, T tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from ..data.tokens import encode_text


def validation_text(run_dir) -> str:
    """The validation split of the corpus the run was trained on (train_config.json's data; default corpus)."""
    from ..data import load_corpus

    cfg_path = Path(run_dir) / "train_config.json"
    data = None
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        data = cfg.get("data") if isinstance(cfg, dict) else None
    if data and not Path(data).exists():
        raise ValueError(f"{run_dir} was trained on {data}, which is not there any more; pass --text")
    return load_corpus(data or None).val


def run_text_ids(run, text: str | None = None, *, windows: int = 4, length: int = 128) -> Tensor:
    """(W, T) token ids for the head-diversity claim: ``text``, or W windows of the run's validation text.

    T = min(length, max_len). Windows come from evenly spaced offsets; a window holding a
    character the tokenizer lacks (possible with a character vocabulary) is skipped.
    """
    max_len = run.model.config.max_len
    if text is not None:
        ids, _ = encode_text(run.tokenizer, text, max_len=max_len)
        return torch.tensor(ids, dtype=torch.long)[None]  # (1, T)
    T, val = min(length, max_len), validation_text(run.path)
    rows, chunk = [], 8 * T  # characters per attempt: enough for T tokens of any tokenizer here
    for start in range(0, max(1, len(val) - chunk), max(1, (len(val) - chunk) // (4 * windows))):
        try:
            ids = run.tokenizer.encode(val[start:start + chunk])
        except ValueError:
            continue
        if len(ids) >= T:
            rows.append(ids[:T])
        if len(rows) == windows:
            break
    if not rows:
        raise ValueError(f"no {T}-token window of {run.path}'s validation text fits its tokenizer; pass --text")
    return torch.tensor(rows, dtype=torch.long)
