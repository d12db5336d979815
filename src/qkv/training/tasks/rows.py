"""The rows the conversation tasks (sft, dpo) train on, typed: one conversation, a pack of them, a preference
pair. Shapes: L tokens of a row."""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class Row(NamedTuple):
    """One conversation: its ids (L,), which of them the loss counts (L,) bool, and where it was read."""

    ids: Tensor
    trained: Tensor
    where: str


class PackedRow(NamedTuple):
    """Conversations concatenated into one row: as ``Row``, with each token's document (L,), the first's ``where``."""

    ids: Tensor
    trained: Tensor
    where: str
    docs: Tensor


class Pair(NamedTuple):
    """A preference pair: the prompt with its chosen answer, and with its rejected one (``trained``: the answer)."""

    chosen: Row
    rejected: Row

    @property
    def where(self) -> str:
        return self.chosen.where


def sequences(row: Row | PackedRow | Pair) -> tuple[Row | PackedRow, ...]:
    """The sequences the model reads for ``row``: itself, or a pair's two."""
    return (row.chosen, row.rejected) if isinstance(row, Pair) else (row,)


def targets_trained(row: Row | PackedRow) -> int:
    """The targets of ``row`` the loss counts (its first token is no target)."""
    return int(row.trained[1:].sum())
