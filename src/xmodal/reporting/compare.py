"""Is B better than A? Paired comparison of two runs or two groups of seeds (``xmodal compare``).

Each run's ``per_query.npz`` (:mod:`xmodal.retrieval.perquery`) holds every query's rank
per split, normaliser and direction; :func:`compare` pairs the queries of A and B and runs
:func:`xmodal.metrics.paired_test` for every direction x metric (R@1, R@5, R@10, MdR,
MnR, and mAP where the split has a relevancy), then Holm-corrects the p-values of all the
rows shown. Results are only paired when their protocol cards agree
(:data:`xmodal.retrieval.perquery.PROTOCOL_FIELDS`: same split files, queries, gallery,
caption policy, tie rule, and neither or both normalisers using the test queries);
otherwise :func:`compare` refuses and names the fields, unless ``force``.
"""

from __future__ import annotations

import glob
import os
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from xmodal._validate import short_repr
from xmodal.metrics import format_metric
from xmodal.metrics.formatting import markdown_table
from xmodal.metrics.paired import LOWER_IS_BETTER, format_p, holm, paired_test
from xmodal.retrieval.perquery import NAME as PER_QUERY
from xmodal.retrieval.perquery import card_differences, read_per_query

__all__ = ["Result", "load_result", "expand", "compare", "markdown", "DEFAULT_METRICS"]

DEFAULT_METRICS = ("R@1", "R@5", "R@10", "MdR", "MnR", "mAP")
DIRECTIONS = ("t2v", "v2t", "p2v", "v2p")


@dataclass
class Result:
    """One run's per-query results: ``results[split][normalizer][direction][rank|ap|ndcg]``."""

    path: str
    results: dict
    cards: dict
    selected: str | None = None
    extra: dict = field(default_factory=dict)

    def normalizer(self, split: str, name: str) -> str:
        """``name`` with ``selected`` resolved to this run's choice."""
        if name != "selected":
            return name
        chosen = self.selected or (self.cards.get(split) or {}).get("normalizer")
        if chosen is None:
            raise ValueError(f"{self.path}: does not say which normaliser it selected; name one with --normalizer")
        return chosen

    def values(self, split: str, name: str, direction: str, metric: str) -> np.ndarray | None:
        entry = self.results.get(split, {}).get(self.normalizer(split, name), {}).get(direction)
        if entry is None:
            return None
        key = {"mAP": "ap", "nDCG": "ndcg"}.get(metric, "rank")
        return entry.get(key)


def load_result(path: str | Path) -> Result:
    """A run directory (its ``per_query.npz`` and ``metrics.json``) or a ``per_query.npz`` file."""
    p = Path(path)
    if p.is_dir():
        f = p / PER_QUERY
        if not f.is_file():
            raise ValueError(f"{path}: has no {PER_QUERY} (a run not finished, or trained before per-query "
                             f"results were written: re-run it, or write one with 'xmodal eval --run {path} "
                             f"--data DIR --split S --per-query FILE.npz')")
        results, cards = read_per_query(f)
        selected = None
        metrics = p / "metrics.json"
        if metrics.is_file():
            try:
                selected = json.loads(metrics.read_text(encoding="utf-8")).get("normalizer")
            except (ValueError, UnicodeDecodeError, AttributeError):
                raise ValueError(f"{metrics}: not valid JSON written by 'xmodal train'") from None
        return Result(str(path), results, cards, selected)
    if p.is_file():
        results, cards = read_per_query(p)
        return Result(str(path), results, cards)
    raise FileNotFoundError(f"{path}: no such run directory or per-query file")


def expand(pattern: str, flag: str) -> list[str]:
    """Paths a run argument names: itself when it exists, else its glob matches (sorted) that are
    run directories or ``.npz`` files (``runs/x_s*`` also matches a sweep's ``x_s0.log``)."""
    from xmodal._validate import short_repr

    if not isinstance(flag, str):
        raise TypeError(f"flag: expected the flag's name, got {short_repr(flag)}")
    if not isinstance(pattern, (str, os.PathLike)):
        raise TypeError(f"{flag}: expected a path or glob pattern, got {short_repr(pattern)}")
    pattern = os.fspath(pattern)
    if Path(pattern).exists():
        return [pattern]
    found = [p for p in sorted(glob.glob(pattern)) if Path(p).is_dir() or p.endswith(".npz")]
    if not found:
        raise ValueError(f"{flag}: no run directory or .npz matches {pattern!r}")
    return found


def _split(a: Sequence[Result], b: Sequence[Result], split: str | None) -> str:
    have = [set(r.results) for r in (*a, *b)]
    if split is not None:
        for r, s in zip((*a, *b), have):
            if split not in s:
                raise ValueError(f"--split: {r.path} has no {split!r} results "
                                 f"(it has {', '.join(sorted(s)) or 'none'})")
        return split
    for s in ("test", "val"):
        if all(s in h for h in have):
            return s
    raise ValueError("--split: the results share no split; name one")


def _differences(a: Sequence[Result], b: Sequence[Result], split: str, norm_a: str, norm_b: str) -> list[str]:
    ref = a[0]
    out = []
    for side, runs, name in (("A", a, norm_a), ("B", b, norm_b)):
        for r in runs:
            if r is ref:
                continue
            for d in card_differences(ref.cards.get(split), r.cards.get(split),
                                      normalizer_a=ref.normalizer(split, norm_a),
                                      normalizer_b=r.normalizer(split, name)):
                out.append(f"{r.path} ({side}) vs {ref.path}: {_short(d)}")
    return out


def _short(line: str) -> str:
    """Shorten 64-hex digests in a difference line to 12 characters."""
    import re

    return re.sub(r"([0-9a-f]{12})[0-9a-f]{52}", r"\1…", line)


def compare(a: Sequence[Result], b: Sequence[Result], *, split: str | None = None, normalizer: str = "selected",
            normalizer_b: str | None = None, metrics: Sequence[str] | None = None,
            directions: Sequence[str] | None = None, n_boot: int = 10000, seed: int = 0, level: float = 0.95,
            force: bool = False) -> dict:
    """Paired tests of B against A for every direction x metric both have.

    Args:
        a, b: the runs of each side (several: seeds, resampled as clusters).
        split: the split compared (default ``test`` when every run has it, else ``val``).
        normalizer: A's normaliser (``selected``: each run's own choice); B's too unless ``normalizer_b``.
        metrics: rows per direction; default :data:`DEFAULT_METRICS`, whose ``mAP`` is left out where the
            split has no relevancy (a metric named explicitly must be there).
        directions: default every one of t2v, v2t, p2v, v2p that all runs have.
        n_boot, seed, level: of :func:`xmodal.metrics.paired_test`.
        force: compare even when the protocol cards differ (the differences are still returned).

    Returns:
        ``{"split", "a": {...}, "b": {...}, "protocol_differences": [...], "rows": [...], ...}``;
        each row is :func:`~xmodal.metrics.paired_test`'s dict plus ``direction``, ``p_holm`` and
        ``verdict`` (``"B better"``, ``"A better"`` or ``"no clear difference"``: the Holm p-value
        below ``1 - level`` and the interval clear of 0, or not).
    """
    for side, name in ((a, "a"), (b, "b")):
        if isinstance(side, (str, bytes, dict)) or not isinstance(side, Sequence) or \
                not all(isinstance(r, Result) for r in side):
            raise TypeError(f"{name}: expected a list of load_result(...) results, got {short_repr(side)}")
    if not a or not b:
        raise ValueError("compare: give at least one run on each side")
    for value, label in ((normalizer, "normalizer"), (normalizer_b, "normalizer_b"), (split, "split")):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{label}: expected a name, got {short_repr(value)}")
    for value, label in ((metrics, "metrics"), (directions, "directions")):
        if value is not None and (isinstance(value, str) or not isinstance(value, Sequence)
                                  or not all(isinstance(x, str) for x in value)):
            raise TypeError(f"{label}: expected a list of names, got {short_repr(value)}")
    norm_b = normalizer if normalizer_b is None else normalizer_b
    optional = ("mAP",) if metrics is None else ()
    metrics = DEFAULT_METRICS if metrics is None else tuple(metrics)
    split = _split(a, b, split)
    diffs = _differences(a, b, split, normalizer, norm_b)
    if diffs and not force:
        raise ValueError("the protocol cards differ, so the queries cannot be paired: " + "; ".join(diffs[:6])
                         + (f"; ... ({len(diffs)} in all)" if len(diffs) > 6 else "") + " (--force compares anyway)")
    dirs = list(directions) if directions else [
        d for d in DIRECTIONS if all(r.values(split, n, d, "R@1") is not None
                                     for rs, n in ((a, normalizer), (b, norm_b)) for r in rs)]
    if not dirs:
        raise ValueError(f"--normalizer: no direction has per-query ranks for {normalizer!r} / {norm_b!r} "
                         f"in every run ({split})")
    for d in dirs:
        missing = [r.path for rs, n in ((a, normalizer), (b, norm_b)) for r in rs
                   if r.values(split, n, d, "R@1") is None]
        if missing:
            raise ValueError(f"--directions: {d} has no per-query ranks under this normaliser in {missing[0]} "
                             f"({split}; "
                             f"p2v / v2p exist only on a split with groups)")
    rows = []
    for d in dirs:
        for m in metrics:
            va = [r.values(split, normalizer, d, m) for r in a]
            vb = [r.values(split, norm_b, d, m) for r in b]
            if any(v is None for v in (*va, *vb)):
                if m in optional:
                    continue  # no relevancy on this split: the default metrics just skip mAP
                raise ValueError(f"--metrics: {m} of {d} is missing from some run's per-query results ({split})")
            sizes = {v.shape[0] for v in (*va, *vb)}
            if len(sizes) != 1:
                raise ValueError(f"the runs have different numbers of {d} queries "
                                 f"({', '.join(map(str, sorted(sizes)))}) "
                                 f"on {split}: they cannot be paired, even with --force")
            t = paired_test(va if len(va) > 1 else va[0], vb if len(vb) > 1 else vb[0], metric=m, n_boot=n_boot,
                            seed=seed, level=level)
            rows.append({"direction": d, **t})
    adjusted = holm([r["p_value"] for r in rows])
    alpha = 1.0 - level
    for r, p in zip(rows, adjusted):
        r["p_holm"] = p
        gain = -r["diff"] if r["lower_is_better"] else r["diff"]
        lo, hi = (-r["ci_high"], -r["ci_low"]) if r["lower_is_better"] else (r["ci_low"], r["ci_high"])
        r["verdict"] = ("B better" if p < alpha and lo > 0 and gain > 0 else
                        "A better" if p < alpha and hi < 0 and gain < 0 else "no clear difference")
    side = lambda runs, n: {"runs": [r.path for r in runs],  # noqa: E731
                            "normalizers": [r.normalizer(split, n) for r in runs]}
    return {"split": split, "a": side(a, normalizer), "b": side(b, norm_b), "protocol_differences": diffs,
            "card": a[0].cards.get(split), "rows": rows, "n_boot": n_boot, "seed": seed, "level": level}


def _cell(metric: str, value: float, std: float) -> str:
    return format_metric(metric, value, None if math.isnan(std) else std)


def markdown(out: dict) -> str:
    """The comparison as Markdown: who A and B are, the table, and how to read it."""
    if not isinstance(out, dict) or not {"rows", "level", "a", "b", "split"} <= set(out) or \
            not isinstance(out["rows"], list) or not all(isinstance(r, dict) for r in out["rows"]):
        raise TypeError(f"out: expected the dict compare() returns, got {short_repr(out)}")
    rows = out["rows"]
    seeds = any("p_value_seeds" in r for r in rows)
    level = f"{100 * out['level']:.0f}%"
    head = ["direction", "metric", "A", "B", "B − A", f"{level} CI", "p", "p (Holm)"] + \
        (["p (seed labels)"] if seeds else []) + ["verdict"]
    body = []
    for r in rows:
        digits = 1 if r["metric"] in LOWER_IS_BETTER else 2
        cells = [r["direction"], r["metric"], _cell(r["metric"], r["a"], r["std_a"]),
                 _cell(r["metric"], r["b"], r["std_b"]), f"{r['diff']:+.{digits}f}",
                 f"[{r['ci_low']:+.{digits}f}, {r['ci_high']:+.{digits}f}]", format_p(r["p_value"]),
                 format_p(r["p_holm"])]
        if seeds:
            cells.append(f"{r['p_value_seeds']:.2f} (min {r['p_value_seeds_min']:.2f})" if "p_value_seeds" in r
                         else "–")
        body.append(cells + [r["verdict"]])

    def who(side: dict) -> str:
        names = sorted(set(side["normalizers"]))
        return (f"{', '.join(side['runs'])} (normaliser {', '.join(names)}"
                + (f"; {len(side['runs'])} seeds" if len(side["runs"]) > 1 else "") + ")")

    card = out.get("card") or {}
    q = card.get("num_queries", {})
    lines = [f"A: {who(out['a'])}", f"B: {who(out['b'])}",
             f"split {out['split']}: " + ", ".join(f"{d} {n} queries" for d, n in q.items())
             + (f"; ties {card.get('tie_rule')}, v2t {card.get('v2t')}, split sha256 "
                f"{str(card.get('split_sha256'))[:12]}…" if card else "")]
    if out["protocol_differences"]:
        lines.append("WARNING (--force): the protocol cards differ: " + "; ".join(out["protocol_differences"]))
    lines += ["", markdown_table(head, body), ""]
    lines.append(f"B − A: a gain of B is > 0 for R@K / mAP and < 0 for MdR / MnR. CI: paired bootstrap over the "
                 f"queries ({out['n_boot']} resamples, seed {out['seed']}"
                 + ("; each side's seeds resampled as clusters" if len(out["a"]["runs"]) > 1 or
                    len(out["b"]["runs"]) > 1 else "") + "). p: two-sided paired sign-flip permutation"
                 + (" of the seed-averaged per-query values (the runs held fixed)" if len(out["a"]["runs"]) > 1 or
                    len(out["b"]["runs"]) > 1 else "")
                 + f"; Holm over the {len(rows)} rows. Verdict: Holm p < {1 - out['level']:.2f} and the CI clear of 0.")
    if seeds:
        lines.append("p (seed labels): exact permutation of the run labels (is the recipe better, seeds as the "
                     "unit); it cannot go below its min with this many seeds.")
    return "\n".join(lines)
