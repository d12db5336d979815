"""Argument checks that every layer of qkv shares: one wording for each kind of bad value.

A leaf module: it imports nothing from qkv, so the reference modules, the configurations and the
command can all use it.
"""
from __future__ import annotations


def is_positive_int(value) -> bool:
    """An int > 0 (a bool is not an int here, although Python says it is)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_positive_int(name: str, value, *, optional: bool = False) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int > 0 (or None, when ``optional``)."""
    if optional and value is None:
        return
    if not is_positive_int(value):
        raise ValueError(f"{name} must be a positive int{' or None' if optional else ''}, got {value!r}")


def check_fraction(name: str, value) -> None:
    """Raise ValueError unless ``value`` is a number in [0, 1) (a dropout rate, label smoothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
