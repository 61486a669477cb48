"""Argument checks shared by the loss modules."""

from __future__ import annotations

from xmodal._validate import positive_number


def optional_positive(v, name: str) -> float | None:
    """``None`` or a positive finite float."""
    return None if v is None else positive_number(v, name)


def non_negative(v, name: str) -> float:
    """A finite float >= 0 (margins)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a number, got {v!r}") from None
    if not (f >= 0.0 and f != float("inf")):
        raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
    return f
