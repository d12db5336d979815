"""The small measuring tools every check uses: a float tolerance, a relative error, numbers in
one line, an error as a string, and measured values as JSON-ready numbers.

Shapes: none of its own; tensors of any shape.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch import Tensor

FLOAT_TOL = 1e-5  # "exact up to float error" in fp32 at these sizes


def rel_err(a: Tensor, b: Tensor) -> float:
    """max |a − b| / max |b|: 0 for equal tensors, about 1 for unrelated ones."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def fmt(xs: Iterable[float]) -> str:
    """Numbers to 3 significant digits, comma-separated."""
    return ", ".join(f"{x:.3g}" for x in xs)


def error_of(fn: Callable[[], object]) -> str:
    """What calling ``fn()`` raises, as 'Type: message'; 'unclear …' for anything but ValueError/TypeError."""
    try:
        fn()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - an IndexError or AssertionError is not a clear error
        return f"unclear {type(e).__name__}: {e}"
    return "no error"


def plain(x):
    """Measured values as JSON-ready numbers (6 significant digits), lists and strings."""
    if isinstance(x, Tensor):
        x = x.tolist()
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, torch.Size)):
        return [plain(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    x = float(x)
    return float(f"{x:.6g}") if math.isfinite(x) else str(x)
