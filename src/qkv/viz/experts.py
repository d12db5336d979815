"""Expert load for the explorer: what ``qkv train`` logged about a mixture of experts, read back from a run.

    metrics.jsonl (one record per evaluation: expert_tokens L × E, maxvio L) → expert_load_data → the page's
    expert-load panel: MaxVio per layer over training, tokens per expert (layers × experts) at an evaluation

MaxVio = max load / mean load − 1 (``qkv.training.expert_load``; 0 is balanced). A dense run logs neither,
and gets no panel.

Shapes: L MoE layers, E experts per layer, N evaluations.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from torch import nn

from ..nn.moe import MixtureOfExperts
from ..training.run_dir import RunDir

MAX_SNAPSHOTS = 64  # evaluations whose L × E tokens the page carries (MaxVio keeps every evaluation)


def moe_layer_names(model: nn.Module | None, L: int) -> list[str]:
    """What the page calls the L MoE layers: "block i" when the model says which blocks they are."""
    blocks = getattr(model, "blocks", None) or []
    found = [f"block {i}" for i, b in enumerate(blocks) if any(isinstance(m, MixtureOfExperts) for m in b.modules())]
    return found if len(found) == L else [f"MoE layer {i}" for i in range(L)]


def load_records(path: str | os.PathLike) -> list[tuple[int, list[list[int]], list[float]]]:
    """(step, expert_tokens L × E, maxvio L) of each evaluation in ``path`` (metrics.jsonl) that logged them,
    checked: the same L and E throughout; ValueError naming the line otherwise. No file: []."""
    path, out = Path(path), []
    if not path.is_file():
        return out
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path} line {n} is not JSON: {e}") from None
        if not isinstance(record, dict) or "expert_tokens" not in record:
            continue  # a dense run's record, or an evaluation before expert load was logged
        shape = (len(out[0][1]), len(out[0][1][0])) if out else None  # (L, E) of the first such record
        tokens, vio = record["expert_tokens"], record.get("maxvio")
        if not well_formed(tokens, vio, shape):
            want = "L × E" if shape is None else f"{shape[0]} × {shape[1]}"
            raise ValueError(f"{path} line {n}: expected expert_tokens as {want} counts and maxvio as one number "
                             f"per layer, got {json.dumps(tokens)[:80]} and {json.dumps(vio)[:80]}")
        out.append((int(record.get("step", 0)), tokens, [float(v) for v in vio]))
    return out


def well_formed(tokens: Any, vio: Any, shape: tuple[int, int] | None) -> bool:
    """tokens: L × E counts (of ``shape`` when given), vio: L finite numbers."""
    def counts(row: Any) -> bool:
        return isinstance(row, list) and bool(row) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                           for v in row)
    if not (isinstance(tokens, list) and tokens and all(counts(r) and len(r) == len(tokens[0]) for r in tokens)):
        return False
    numbers = isinstance(vio, list) and len(vio) == len(tokens) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vio)
    return numbers and shape in (None, (len(tokens), len(tokens[0])))


def expert_load_data(run: str | os.PathLike, model: nn.Module | None = None) -> dict[str, Any] | None:
    """The page's expert-load panel for run directory ``run`` (``model``: its model, to name the layers by
    block), or None when the run logged no expert load (a dense model, or no evaluation yet).

    Returns:
        dict with layers (L names), experts E, steps (N), maxvio (N × L), and snapshots: up to MAX_SNAPSHOTS
        evaluations, the last always among them, each {"step", "tokens": L × E}.
    """
    records = load_records(RunDir(run) / RunDir.METRICS)
    if not records:
        return None
    N, L, E = len(records), len(records[0][1]), len(records[0][1][0])
    keep = sorted({round(i * (N - 1) / (MAX_SNAPSHOTS - 1)) for i in range(MAX_SNAPSHOTS)}) if N > MAX_SNAPSHOTS \
        else range(N)  # evenly spread, first and last included
    return {"layers": moe_layer_names(model, L), "experts": E,
            "steps": [step for step, _, _ in records], "maxvio": [vio for _, _, vio in records],
            "snapshots": [{"step": records[i][0], "tokens": records[i][1]} for i in keep]}
