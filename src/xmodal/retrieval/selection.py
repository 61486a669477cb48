"""Which test-time normaliser a run keeps: one that replaces ``none`` only when its gain is clear.

The trainer fits every candidate normaliser once and scores each on the validation split
by ``train.metric``. Picking the best score (``test_time.selection: best``, the rule before
issue 26) chases noise: on an 84-video val split it chose QB-Norm, which lowered test R@1.
The ``paired`` rule (default) asks of each candidate the question ``xmodal compare`` asks:
is its val score above ``none``'s by more than the per-query bootstrap spread? A candidate
is *clear* when the lower end of the paired bootstrap interval (``level``, queries resampled;
each direction's queries a stratum, :func:`xmodal.metrics.paired_strata_test`) of its
score minus ``none``'s is above 0. The run keeps the best-scoring clear candidate, else
``none``. Normalisers that use the test queries (DSL, the oracle) are never candidates.

An index (``xmodal index --normalizer selected``) can hold only the normalisers of
:data:`xmodal.retrieval.index.FOLDABLE`; the same rule restricted to them names the one an
index folds (``index_normalizer``), and ``index_note`` says why it differs from the selected
one. The trainer writes both into ``metrics.json`` and ``model.pt`` (``test_time.selection``),
and ``xmodal index`` reads them, so the run's summary and its index name the same normaliser
or both say why not.
"""

from __future__ import annotations

from typing import Any

from xmodal.metrics.paired import format_diff, format_p, paired_strata_test
from xmodal.retrieval.evaluate import score, score_terms
from xmodal.retrieval.index import FOLDABLE
from xmodal.retrieval.testtime import uses_test_queries

__all__ = ["RULES", "select_normalizer"]

RULES = ("paired", "best")


def _best(names: list[str], val: dict, metric: str) -> str:
    """Highest score; ties prefer ``none``, then the earlier name."""
    if len(names) == 1:
        return names[0]
    order = {n: i for i, n in enumerate(names)}
    return max(names, key=lambda n: (score(val[n], metric), n == "none", -order[n]))


def select_normalizer(names: list[str] | tuple[str, ...], val: dict, per_query: dict | None, metric: str, *,
                      rule: str = "paired", level: float = 0.95, n_boot: int = 10000, seed: int = 0) -> dict:
    """The selection record of a run.

    Args:
        names: the fitted normalisers (``test_time.names``).
        val: validation metrics per name (:func:`xmodal.retrieval.evaluate.evaluate_normalizers`).
        per_query: validation per-query results per name (its ``per_query=``); needed by ``paired``.
        metric: ``train.metric`` (``rsum``, ``r1``, ``map``, ``p2v_rsum``).
        rule: ``paired`` (a candidate must be clear of ``none``) or ``best`` (the highest score).
        level, n_boot, seed: the paired bootstrap's confidence level, resamples and seed.

    Returns:
        ``{"rule", "metric", "level", "selected", "index_normalizer", "index_note", "tests"}``;
        ``tests[name]``: the paired test of ``name`` against ``none`` on val (``diff``, ``ci_low``,
        ``ci_high``, ``p_value``, ``clear``), for every candidate but ``none``.
    """
    from xmodal._validate import number, positive_int, short_repr

    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"rule: expected one of {', '.join(RULES)}, got {short_repr(rule)}")
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names: expected a list of normaliser names, got {short_repr(names)}")
    if not isinstance(val, dict) or not all(isinstance(v, dict) for v in val.values()):
        raise TypeError(f"val: expected {{normaliser: metrics}}, got {short_repr(val)}")
    if per_query is not None and not isinstance(per_query, dict):
        raise TypeError(f"per_query: expected {{normaliser: per-query results}} or None, got {short_repr(per_query)}")
    if not isinstance(metric, str):
        raise TypeError(f"metric: expected a metric name, got {short_repr(metric)}")
    level = number(level, "level")
    if not 0 < level < 1:
        raise ValueError(f"level: must lie in (0, 1), got {level}")
    n_boot = positive_int(n_boot, "n_boot")
    candidates = [n for n in dict.fromkeys(["none", *names]) if not uses_test_queries(n) and n in val]
    record: dict[str, Any] = {"rule": rule, "metric": metric, "level": level, "tests": {}}
    if not candidates:
        candidates = ["none"]
    if rule == "paired" and "none" in val and per_query is not None and "none" in per_query:
        base = score_terms(per_query["none"], metric)
        for n in candidates:
            if n == "none":
                continue
            strata = [(a, b, w) for (a, w), (b, _) in zip(base, score_terms(per_query[n], metric))]
            t = paired_strata_test(strata, n_boot=n_boot, seed=seed, level=level)
            record["tests"][n] = {k: t[k] for k in ("diff", "ci_low", "ci_high", "p_value", "p_floor")}
            record["tests"][n]["clear"] = bool(t["ci_low"] > 0)
        eligible = ["none"] + [n for n in candidates if record["tests"].get(n, {}).get("clear")]
    else:
        if rule == "paired":
            record["rule"] = "best"
            record["note"] = "no per-query results of 'none' on val: the highest score was taken"
        eligible = candidates
    selected = _best(eligible, val, metric)
    index_name = selected if selected in FOLDABLE else _best([n for n in eligible if n in FOLDABLE] or ["none"],
                                                             val, metric)
    record.update(selected=selected, index_normalizer=index_name, index_note=None)
    if index_name != selected:
        why = ("the best foldable normaliser clear of none on val" if rule == "paired" and index_name != "none"
               else "no foldable normaliser is clear of none on val" if rule == "paired"
               else "the best foldable normaliser on val")
        record["index_note"] = (f"{selected} depends on each query's scores against the whole gallery and cannot be "
                                f"folded into an index; 'xmodal index --normalizer selected' folds {index_name} "
                                f"({why})")
    return record


def describe(record: dict) -> list[str]:
    """One line per candidate: ``"sinkhorn: val rsum +12.34 [8.10, 16.52] vs none, clear"``."""
    lines = []
    m = record.get("metric", "score")
    for n, t in record.get("tests", {}).items():
        ends = (t["ci_low"], t["ci_high"])
        lines.append(f"{n}: val {m} {format_diff(t['diff'], 2, ends)} "
                     f"[{', '.join(format_diff(x, 2, (t['diff'],)) for x in ends)}] vs none "
                     f"(p {format_p(t['p_value'], t.get('p_floor', False))}), {'clear' if t['clear'] else 'not clear'}")
    return lines
