"""One way to print a metric, in every table the product writes (trainer, ``eval``, ``bench``, the
report and the search page): R@K, mAP, nDCG, rsum and other percentages with two decimals ("15.48"),
the ranks MdR and MnR with one ("4.5", "12.3"), counts as integers, a missing value as "–"."""

from __future__ import annotations

import math
from typing import Any, Sequence

__all__ = ["format_metric", "metric_digits", "markdown_table"]

#: Decimal places of the rank metrics; every other metric has :data:`PERCENT_DIGITS`.
RANK_DIGITS = {"MdR": 1, "MnR": 1}
PERCENT_DIGITS = 2


def metric_digits(name: str) -> int:
    """Decimals of metric ``name``; a column title such as ``"t2v MdR"`` is read by its last word.

    >>> metric_digits("t2v MdR"), metric_digits("R@10")
    (1, 2)
    """
    return RANK_DIGITS.get(str(name).split()[-1] if str(name).split() else "", PERCENT_DIGITS)


def format_metric(name: str, value: Any, std: Any = None) -> str:
    """``value`` of metric ``name`` as every xmodal table prints it; ``std`` adds ``± std``.

    >>> format_metric("MdR", 4.5), format_metric("R@1", 15.4812), format_metric("MnR", 12.25, 0.5)
    ('4.5', '15.48', '12.2 ± 0.5')
    >>> format_metric("queries", 120), format_metric("R@1", None)
    ('120', '–')
    """
    if value is None or isinstance(value, bool):
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return "–"
    digits = metric_digits(name)
    text = f"{v:.{digits}f}"
    if std is not None:
        try:
            s = float(std)
        except (TypeError, ValueError):
            s = math.nan
        if not math.isnan(s):
            text += f" ± {s:.{digits}f}"
    return text


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The house table: Markdown, first column left-aligned, the others right-aligned.

    >>> print(markdown_table(["direction", "R@1"], [["t2v", "50.00"]]))
    | direction | R@1 |
    |---|---:|
    | t2v | 50.00 |
    """
    lines = ["| " + " | ".join(map(str, header)) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)
