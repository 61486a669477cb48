"""Which setting of an approximate index's measured curve it keeps: never one another row beats.

A build measures recall@10 and queries/s at several search settings (``nprobe`` / ``efSearch``) and,
for the kinds that keep their vectors (``ivf``, ``hnsw``), at an exact scan. A kept setting must not
be *dominated*: no other row of the curve may be at least as accurate and faster. Queries/s carry
timing noise, so two rates within :data:`RATE_NOISE` of each other count as equal (a row dominates
only when it is faster by more than that), and each rate is the best of :data:`RATE_PASSES` timed
passes over the same queries (the pass least disturbed by other load).

>>> rows = [{"nprobe": 4, "recall_at_10": 0.96, "queries_per_s": 900.0},
...         {"nprobe": 8, "recall_at_10": 0.99, "queries_per_s": 500.0},
...         {"nprobe": None, "exact": True, "recall_at_10": 1.0, "queries_per_s": 2000.0}]
>>> keep(rows, 0.95)["exact"]
True
>>> dominating(rows[0], rows)["exact"]
True
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["keep", "dominating", "RATE_NOISE", "RATE_PASSES"]  # timed_rate: the build's clock (tests replace it)

#: Two queries/s within this fraction of each other are equal (timing noise of a shared machine).
RATE_NOISE = 0.1
#: Timed passes per curve row; the rate stored is the best.
RATE_PASSES = 3
#: A pass longer than this many seconds is not repeated: it averages the machine's load over itself, and
#: at 10M clips a pass over every cell takes minutes.
LONG_PASS_S = 2.0


def _check(curve: Any) -> list[dict]:
    if not isinstance(curve, (list, tuple)) or not curve or not all(
            isinstance(r, dict) and isinstance(r.get("recall_at_10"), (int, float))
            and isinstance(r.get("queries_per_s"), (int, float)) for r in curve):
        raise ValueError("curve: expected a non-empty list of rows with recall_at_10 and queries_per_s")
    return list(curve)


def dominating(row: dict, curve: list[dict], noise: float = RATE_NOISE) -> dict | None:
    """The first row of ``curve`` that dominates ``row`` (recall@10 at least ``row``'s and queries/s
    above ``row``'s by more than ``noise``), or None."""
    for other in _check(curve):
        if other is not row and other["recall_at_10"] >= row["recall_at_10"] and \
                other["queries_per_s"] > row["queries_per_s"] * (1 + noise):
            return other
    return None


def keep(curve: list[dict], threshold: float, noise: float = RATE_NOISE) -> dict:
    """The row an index keeps: among the rows whose recall@10 reaches ``threshold`` (the target, or,
    when none reaches it, the best recall less a tolerance), the first in ``curve``'s order (cheapest
    setting first, the exact scan last) whose queries/s is within ``noise`` of the fastest of them.

    No row dominates the one kept (:func:`dominating`): a row at least as accurate also reaches the
    threshold, so it is at most the fastest, which is within ``noise`` of the kept one.

    Raises:
        ValueError: no row reaches ``threshold``.
    """
    rows = [r for r in _check(curve) if r["recall_at_10"] >= threshold]
    if not rows:
        raise ValueError(f"threshold: no row of the curve reaches recall@10 {threshold}")
    fastest = max(r["queries_per_s"] for r in rows)
    return next(r for r in rows if r["queries_per_s"] * (1 + noise) >= fastest)


def timed_rate(run: Callable[[], Any], n_queries: int, setting: dict, passes: int = RATE_PASSES) -> float:
    """Queries/s of ``run()`` (one search of ``n_queries`` queries at ``setting``): the best of ``passes``
    timed passes (one when a pass takes over :data:`LONG_PASS_S`). ``setting`` names the row (a test
    replaces this function by a cost model of it)."""
    del setting  # the wall clock needs only the search
    best = float("inf")
    for _ in range(max(1, int(passes))):
        start = time.perf_counter()
        run()
        took = time.perf_counter() - start
        best = min(best, took)
        if took > LONG_PASS_S:
            break
    return float(n_queries / max(best, 1e-9))
