"""The claims' registry: the ``Claim`` record, the ``check`` decorator that seeds a check and
registers it, the rows for what cannot be measured, and running checks by name.

A new check is a function in the module of its chapter, decorated with ``@check(name, section,
claim, claim_zh=...)``, returning (measured, holds, summary), the summary a ``messages.say(...)``
(rendered here in every language) or plain text. Four kinds, run in this order:
fast checks (``CHECKS``, every ``qkv verify``), heavy ones (``FULL_CHECKS``, ``full=True``:
``qkv verify --full``), checks on a trained model (``RUN_CHECKS``, ``--run DIR``) and claims
that cannot be measured here (``NOT_MEASURABLE``, ``holds`` None, the reason as summary).
Within a kind the registry keeps the order of definition; ``qkv.claims`` imports the chapter
modules in the spec's order.

Shapes: ids (B, T) for the checks that need a trained model.
"""
from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

from ..runtime import fixed_threads
from .measure import plain
from .messages import Joined, Message, render


@dataclass
class Claim:
    """One claim of the spec, what was measured, and whether it holds."""

    name: str  # short id for `qkv verify --only`
    claim: str
    section: str  # the spec's section or FAQ number
    measured: dict
    holds: bool | None  # None: not measurable here; the summary says why
    summary: str  # the measured numbers in one line (or the reason)
    claim_zh: str = ""  # the spec's own sentence, quoted from the seed file (`--lang zh`)
    summary_zh: str = ""  # the summary in Chinese (its template's twin in qkv.claims.messages; the same numbers)

    def to_dict(self) -> dict:
        return asdict(self)


CHECKS: dict[str, Callable[..., Claim]] = {}  # name -> check(), in the spec's order
FULL_CHECKS: dict[str, Callable[..., Claim]] = {}  # name -> check(): minutes of timing, only with full=True
RUN_CHECKS: dict[str, Callable[..., Claim]] = {}  # name -> check(model, ids): needs a trained model (--run DIR)
NOT_MEASURABLE: dict[str, Claim] = {}  # name -> a row with holds None and the reason
STUDY_ROWS: dict[str, Callable[[Claim], Claim]] = {}  # name (in NOT_MEASURABLE) -> its row as a study's results say


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seeded, on one intra-op thread, leaving the caller's RNG and thread count as they were.

    The checks' tensors are tiny: one thread beats a thread pool (above all on a busy machine) and
    makes the numbers independent of the core count.
    """
    with fixed_threads(1), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _registered(name: str) -> None:
    if any(name in kind for kind in (CHECKS, FULL_CHECKS, RUN_CHECKS, NOT_MEASURABLE)):
        raise ValueError(f"claim {name!r} is registered twice; choose another name")


def check(name: str, section: str, claim: str, *, claim_zh: str = "", needs_run: bool = False, full: bool = False):
    """Register a check. The function returns (measured, holds, summary); this seeds it and builds the record.

    ``needs_run``: the check takes (trained model, ids (B, T)) and runs only when they are given.
    ``full``: a heavy measurement (timing over long sequences), run only with ``run_claims(full=True)``
    or by name. ``claim_zh``: the spec's sentence, in its own words.
    """
    _registered(name)

    def register(fn):
        @functools.wraps(fn)
        def run(*args, seed: int = 0, **kwargs) -> Claim:
            with seeded(seed):
                measured, holds, summary = fn(*args, **kwargs)
            zh = render(summary, "zh") if isinstance(summary, (Message, Joined)) else ""
            return Claim(name, claim, section, plain(measured), bool(holds), render(summary, "en"), claim_zh, zh)

        run.claim_name, run.section, run.claim, run.claim_zh = name, section, claim, claim_zh
        (RUN_CHECKS if needs_run else FULL_CHECKS if full else CHECKS)[name] = run
        return run

    return register


def not_measurable(name: str, section: str, claim: str, reason: str, *, claim_zh: str = "",
                   reason_zh: str = "") -> Claim:
    """Register a claim that ``qkv verify`` cannot measure, with the reason; its row has ``holds`` None."""
    _registered(name)
    row = Claim(name, claim, section, {"reason": reason}, None, reason, claim_zh, reason_zh)
    NOT_MEASURABLE[name] = row
    return row


def measured_by_study(name: str, section: str, claim: str, reason: str, read: Callable[[Claim], Claim], *,
                      claim_zh: str = "", reason_zh: str = "") -> Claim:
    """A claim that verify cannot measure but a ``qkv study`` does: a ``not_measurable`` row (``reason``: how to run
    the study) that each run re-reads with ``read(row)``, which returns the row with the study's numbers and verdict
    once its results exist. ``holds`` stays None: a paper's claim at this machine's scale, not qkv's correctness."""
    row = not_measurable(name, section, claim, reason, claim_zh=claim_zh, reason_zh=reason_zh)
    STUDY_ROWS[name] = read
    return row


def study_summary(name: str) -> dict | None:
    """The summary.json of a finished ``qkv study NAME`` in its default --out, runs/study-NAME (here, else in the
    source checkout), else the one its docs page was written from (the checkout's docs/generated/study-NAME.json);
    None where none exists or it holds no verdict."""
    checkout, folder = Path(__file__).resolve().parents[3], Path("runs") / f"study-{name}"
    for path in (Path.cwd() / folder / "summary.json", checkout / folder / "summary.json",
                 checkout / "docs" / "generated" / f"study-{name}.json"):
        if path.is_file():
            summary = json.loads(path.read_text(encoding="utf-8"))
            return summary if isinstance(summary.get("verdict"), dict) else None
    return None


def claim_names() -> list[str]:
    return list(CHECKS) + list(FULL_CHECKS) + list(RUN_CHECKS) + list(NOT_MEASURABLE)


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


def run_claims(names: list[str] | None = None, *, full: bool = False, unmeasurable: bool = False,
               model: nn.Module | None = None, ids: Tensor | None = None, seed: int = 0) -> list[Claim]:
    """Run the named checks, or by default every fast check; in the order fast, full, run, not measurable.

    ``full``: add the heavy checks (FULL_CHECKS). ``unmeasurable``: add the rows of claims that
    cannot be measured (holds None). ``model`` and its ``ids`` (B, T): add the checks on a
    trained model (RUN_CHECKS). A named check runs whatever the flags say.
    """
    needing = [n for n in names or [] if n in RUN_CHECKS]
    if model is None and needing:
        raise ValueError(f"claim {needing[0]!r} needs a trained model: pass --run DIR")
    if names is None:
        names = list(CHECKS) + (list(FULL_CHECKS) if full else []) + (list(RUN_CHECKS) if model is not None else [])
        names += list(NOT_MEASURABLE) if unmeasurable else []
    results = [fn(seed=seed) for n, fn in {**CHECKS, **FULL_CHECKS}.items() if n in names]
    if model is not None:
        results += [fn(model, ids, seed=seed) for n, fn in RUN_CHECKS.items() if n in names]
    rows = [STUDY_ROWS[n](row) if n in STUDY_ROWS else row for n, row in NOT_MEASURABLE.items() if n in names]
    return results + rows


def all_hold(results: list[Claim]) -> bool:
    """True when every measured claim holds; rows that could not be measured (holds None) do not count."""
    return all(r.holds is not False for r in results)
