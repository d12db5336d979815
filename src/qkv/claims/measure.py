"""The small measuring tools every check uses: a float tolerance, a relative error, numbers in
one line, an error as a string, measured values as JSON-ready numbers, and the cost of a call
(FLOPs per module, the largest tensor it creates, a fitted log-log exponent).

Shapes: none of its own; tensors of any shape.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

FLOAT_TOL = 1e-5  # "exact up to float error" in fp32 at these sizes


def rel_err(a: Tensor, b: Tensor) -> float:
    """max |a − b| / max |b|: 0 for equal tensors, about 1 for unrelated ones."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def fmt(xs: Iterable[float]) -> str:
    """Numbers to 3 significant digits (ints in full), comma-separated."""
    return ", ".join(str(x) if isinstance(x, int) else f"{x:.3g}" for x in xs)


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


class LargestTensor(TorchFunctionMode):
    """Records the bytes of the largest tensor any torch function returns inside it: what a path
    must hold at once, at least (a kernel's internal buffers are not seen). Works on meta tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor):
                self.bytes = max(self.bytes, t.numel() * t.element_size())
        return out


def cost(fn: Callable[[], object], by: str = "module") -> tuple[dict[str, int], int]:
    """({module name: FLOPs}, or with by="op" {op name such as "aten.mm": FLOPs}, bytes of the largest
    tensor) of ``fn()``, by FlopCounterMode ("Global" = all). On meta tensors nothing is computed:
    the counts come from shapes alone."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter, LargestTensor() as largest:
        fn()
    counts = counter.get_flop_counts()
    flops = {"Global": 0} | {name: sum(ops.values()) for name, ops in counts.items()}
    if by == "op":
        flops = {"Global": flops["Global"]} | {str(op): f for op, f in counts.get("Global", {}).items()}
    return flops, largest.bytes


def fit_exponent(ns: Iterable[float], ys: Iterable[float | None]) -> float:
    """Least-squares slope of log y against log n (y ≈ c·n^slope): 2 for quadratic cost, 1 for linear.

    Points with y None or ≤ 0 (skipped measurements) are left out; NaN with fewer than two.
    """
    pts = [(n, y) for n, y in zip(ns, ys) if y is not None and y > 0]
    if len(pts) < 2:
        return math.nan
    logs = torch.tensor(pts, dtype=torch.float64).log()  # (P, 2): log n, log y
    x, y = (logs - logs.mean(0)).T  # centred
    return float((x * y).sum() / (x * x).sum())
