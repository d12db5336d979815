"""The claims' registry: the ``Claim`` record, the ``check`` decorator that seeds a check and
registers it, and running checks by name.

A new check is a function in the module of its chapter, decorated with ``@check(name, section,
claim)``, returning (measured, holds, summary). The registry keeps the order in which checks are
defined; ``qkv.claims`` imports the chapter modules in the spec's order, which is what
``qkv verify`` prints.

Shapes: ids (B, T) for the checks that need a trained model.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import asdict, dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

from ..runtime import fixed_threads
from .measure import plain


@dataclass
class Claim:
    """One claim of the spec, what was measured, and whether it holds."""

    name: str  # short id for `qkv verify --only`
    claim: str
    section: str  # the spec's section or FAQ number
    measured: dict
    holds: bool
    summary: str  # the measured numbers in one line

    def to_dict(self) -> dict:
        return asdict(self)


CHECKS: dict[str, Callable[..., Claim]] = {}  # name -> check(), in the spec's order
RUN_CHECKS: dict[str, Callable[..., Claim]] = {}  # name -> check(model, ids): needs a trained model (--run DIR)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seeded, on one intra-op thread, leaving the caller's RNG and thread count as they were.

    The checks' tensors are tiny: one thread beats a thread pool (4× faster on a busy 2-core
    machine) and makes the numbers independent of the core count.
    """
    with fixed_threads(1), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def check(name: str, section: str, claim: str, *, needs_run: bool = False):
    """Register a check. The function returns (measured, holds, summary); this seeds it and builds the record.

    ``needs_run``: the check takes (trained model, ids (B, T)) and runs only when they are given.
    """
    if name in CHECKS or name in RUN_CHECKS:
        raise ValueError(f"claim {name!r} is registered twice; choose another name")

    def register(fn):
        @functools.wraps(fn)
        def run(*args, seed: int = 0, **kwargs) -> Claim:
            with seeded(seed):
                measured, holds, summary = fn(*args, **kwargs)
            return Claim(name, claim, section, plain(measured), bool(holds), summary)

        run.claim_name = name
        (RUN_CHECKS if needs_run else CHECKS)[name] = run
        return run

    return register


def claim_names() -> list[str]:
    return list(CHECKS) + list(RUN_CHECKS)


def resolve_names(only: list[str] | None) -> list[str] | None:
    """Comma-separated or repeated names -> list; ValueError naming the unknown ones."""
    if not only:
        return None
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in claim_names()]
    if unknown or not names:
        raise ValueError(f"unknown claim {', '.join(map(repr, unknown)) or repr('')}; "
                         f"choose from: {', '.join(claim_names())}")
    return names


def run_claims(names: list[str] | None = None, *, model: nn.Module | None = None, ids: Tensor | None = None,
               seed: int = 0) -> list[Claim]:
    """Run the named checks (all by default), in the spec's order; those in RUN_CHECKS (head-diversity)
    when a trained ``model`` and its ``ids`` (B, T) are given."""
    wanted = claim_names() if names is None else names
    needing = [n for n in names or [] if n in RUN_CHECKS]
    if model is None and needing:
        raise ValueError(f"claim {needing[0]!r} needs a trained model: pass --run DIR")
    results = [fn(seed=seed) for n, fn in CHECKS.items() if n in wanted]
    if model is not None:
        results += [fn(model, ids, seed=seed) for n, fn in RUN_CHECKS.items() if n in wanted]
    return results
