"""A progress bar over a study's models (tqdm), shared by the studies.

Shapes: none.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence, TypeVar

Job = TypeVar("Job")


def models_bar(jobs: Sequence[Job], *, desc: str, enabled: bool, label: Callable[[Job], str]) -> Iterator[Job]:
    """Yield each job; when ``enabled``, a bar counts them (unit: model) and shows ``label(job)``."""
    if not enabled:
        yield from jobs
        return
    from tqdm.auto import tqdm

    with tqdm(total=len(jobs), unit="model", desc=desc, dynamic_ncols=True) as bar:
        for job in jobs:
            bar.set_postfix_str(label(job))
            yield job
            bar.update(1)
