"""A progress bar over a study's models, shared by the studies (``qkv.training.progress``: a tqdm bar on a
terminal, a line per model in a log).

Shapes: none.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, TypeVar

Job = TypeVar("Job")


def models_bar(jobs: Iterable[Job], *, desc: str, enabled: bool, label: Callable[[Job], str],
               total: int | None = None) -> Iterator[Job]:
    """Yield each job; when ``enabled``, a bar counts them (unit: model, ``total`` or ``len(jobs)``) and shows
    ``label(job)``."""
    if not enabled:
        yield from jobs
        return
    from ..training.progress import progress_bar

    with progress_bar(len(jobs) if total is None else total, unit="model", desc=desc, interval=0) as bar:
        for job in jobs:
            bar.set_postfix_str(label(job))
            yield job
            bar.update(1)
