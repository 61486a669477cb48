"""Is B better than A? Paired comparison of two runs or two groups of seeds (``xmodal compare``).

Each run's ``per_query.npz`` (:mod:`xmodal.retrieval.perquery`) holds every query's rank per
split, normaliser and direction; :func:`compare` pairs the queries of A and B **by identity** in
every direction (the query ids stored beside the ranks; by position only in a direction some file
has no ids for, written before, and only where both files list the very same split files,
``split_sha256``: ``pairing`` and the header name those directions) and runs
:func:`xmodal.metrics.paired_test` for every direction x metric (R@1, R@5, R@10, MdR, MnR, and mAP
where the split has a relevancy), Holm-correcting the p-values of each comparison's rows.

What is compared is said. By default two comparisons: the **heads alone** (``none`` vs ``none``:
the trained models) and, when some run selected a normaliser, each run **as deployed** (its own
selected normaliser; the header names every run's choice, so a side that mixes normalisers says
so). On ``val`` the header says that val also chose each run's epoch and normaliser (and that
val was taken because a run has no test split).

With one run per side the p-value is the queries' paired test (McNemar's exact test for R@K):
it asks whether *these two runs* differ on these queries. With several runs on a side the unit
is the run: the p-value and the verdict come from the seed-level permutation test
(:func:`xmodal.metrics.paired.seed_test`), and a comparison whose smallest attainable p-value
(3 + 3 seeds: 0.1) cannot reach the level after Holm says *cannot be decided with N seeds*.

Results are only paired when their protocol cards agree (:data:`xmodal.retrieval.perquery.PROTOCOL_FIELDS`:
same split files, queries, gallery, caption policy, tie rule, and neither or both normalisers
using the test queries); otherwise :func:`compare` refuses and names the fields, unless
``force``. Every file is read bounded and checked (:mod:`xmodal.retrieval.perquery_read`), and a
run's ``metrics.json`` must agree with its ``per_query.npz`` (cards and R@1).
"""

from __future__ import annotations

import glob
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from xmodal._validate import short_repr
from xmodal.metrics import format_metric
from xmodal.metrics.formatting import markdown_table
from xmodal.metrics.paired import LOWER_IS_BETTER, format_diff, format_p, holm, paired_test
from xmodal.retrieval.perquery import NAME as PER_QUERY
from xmodal.retrieval.perquery import PROTOCOL_FIELDS, card_differences
from xmodal.retrieval.perquery_read import PerQueryFile, check_card, load_json

__all__ = ["Result", "load_result", "expand", "compare", "markdown", "DEFAULT_METRICS", "MAX_RUNS",
           "MAX_VALUES"]

DEFAULT_METRICS = ("R@1", "R@5", "R@10", "MdR", "MnR", "mAP")
#: v2c: each image / video queries the classes (``xmodal classify``: a rank is the true class's rank).
DIRECTIONS = ("t2v", "v2t", "p2v", "v2p", "v2c")
#: The most runs on one side.
MAX_RUNS = 500
#: The most per-query values held for one row (runs of both sides x queries): about 200 MB as float64.
MAX_VALUES = 25_000_000
_METRICS_JSON_BYTES = 64 << 20


@dataclass
class Result:
    """One run's per-query results, read on demand from its ``per_query.npz`` (``source``) or held in
    ``results[split][normalizer][direction][rank|ap|ndcg]``; ``cards[split]`` its protocol cards,
    ``selected`` the normaliser it selected, ``metrics`` its ``metrics.json`` (when it has one)."""

    path: str
    results: dict = field(default_factory=dict)
    cards: dict = field(default_factory=dict)
    selected: str | None = None
    extra: dict = field(default_factory=dict)
    source: PerQueryFile | None = None
    metrics: dict | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise TypeError(f"path: expected the run's path, got {short_repr(self.path)}")
        for name in ("results", "cards", "extra"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name}: expected a dict, got {short_repr(getattr(self, name))}")
        if self.selected is not None and not isinstance(self.selected, str):
            raise TypeError(f"selected: expected a normaliser name or None, got {short_repr(self.selected)}")
        if self.source is not None and not isinstance(self.source, PerQueryFile):
            raise TypeError(f"source: expected a PerQueryFile or None, got {short_repr(self.source)}")
        self.path = os.fspath(self.path)

    def splits(self) -> set[str]:
        return set(self.results) | (set(self.source.entries) if self.source is not None else set())

    def normalizer(self, split: str, name: str) -> str:
        """``name`` with ``selected`` resolved to this run's choice."""
        if name != "selected":
            return name
        card = self.cards.get(split)
        chosen = self.selected or (card.get("normalizer") if isinstance(card, dict) else None)
        if not isinstance(chosen, str):
            raise ValueError(f"{self.path}: does not say which normaliser it selected; name one with --normalizer")
        return chosen

    def has(self, split: str, name: str, direction: str, kind: str = "rank") -> bool:
        name = self.normalizer(split, name)
        if self.source is not None and kind in self.source.entries.get(split, {}).get(name, {}).get(direction, ()):
            return True
        entry = self.results.get(split, {}).get(name, {}).get(direction)
        return isinstance(entry, dict) and entry.get(kind) is not None

    def values(self, split: str, name: str, direction: str, metric: str) -> np.ndarray | None:
        """The per-query ranks (``rank``) or AP / nDCG of one direction, or None when absent."""
        name = self.normalizer(split, name)
        kind = {"mAP": "ap", "nDCG": "ndcg"}.get(metric, "rank")
        key = (split, name, direction, kind)
        if key in self.extra:
            return self.extra[key]
        x = None
        if self.source is not None:
            x = self.source.array(split, name, direction, kind)
            if x is not None and kind == "rank":
                self._check_metrics_json(split, name, direction, x)
        if x is None:
            entry = self.results.get(split, {}).get(name, {}).get(direction)
            x = entry.get(kind) if isinstance(entry, dict) else None
        self.extra[key] = x
        return x

    def ids(self, split: str, direction: str) -> np.ndarray | None:
        return self.source.query_ids(split, direction) if self.source is not None else None

    def _check_metrics_json(self, split: str, name: str, direction: str, ranks: np.ndarray) -> None:
        """``metrics.json``'s R@1 of this split / normaliser / direction must be the ranks' R@1."""
        m = self.metrics or {}
        where = m.get(split, {}).get(name) if isinstance(m.get(split), dict) else None
        if where is None and isinstance(m.get("oracle"), dict) and isinstance(m["oracle"].get(split), dict):
            where = m["oracle"][split].get(name)
        stated = where.get(direction, {}).get("R@1") if isinstance(where, dict) and \
            isinstance(where.get(direction), dict) else None
        if stated is None:
            return
        mine = 100.0 * float(np.mean(ranks <= 1)) if ranks.size else 0.0
        if not isinstance(stated, (int, float)) or isinstance(stated, bool) or abs(float(stated) - mine) > 1e-6:
            raise ValueError(f"{self.path}: metrics.json gives {split} {name} {direction} R@1 {short_repr(stated)} but "
                             f"{PER_QUERY}'s ranks give {mine:.4f}: the two files are not from the same run")


def _read_metrics_json(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read(_METRICS_JSON_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{path}: unreadable ({exc.strerror or exc})") from None
    m = load_json(data, str(path), max_bytes=_METRICS_JSON_BYTES)
    if not isinstance(m, dict):
        raise ValueError(f"{path}: not the metrics.json 'xmodal train' writes (not a JSON object)")
    if "normalizer" in m and not isinstance(m["normalizer"], str):
        raise ValueError(f"{path}: 'normalizer' must name the selected normaliser, got {short_repr(m['normalizer'])}")
    return m


def load_result(path: str | Path) -> Result:
    """A run directory (its ``per_query.npz`` and ``metrics.json``, which must agree) or a
    ``per_query.npz`` file, opened for :func:`compare` (arrays are read when compared)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a run directory or a per-query file, got {short_repr(path)}")
    p = Path(path)
    if p.is_dir():
        f = p / PER_QUERY
        if not f.is_file():
            raise ValueError(f"{path}: has no {PER_QUERY} (a run not finished, or trained before per-query "
                             f"results were written: re-run it, or write one with 'xmodal eval --run {path} "
                             f"--data DIR --split S --per-query FILE.npz')")
        source = PerQueryFile(f)
        metrics = None
        mpath = p / "metrics.json"
        if mpath.is_file():
            metrics = _read_metrics_json(mpath)
            for split, card in source.cards.items():
                entry = metrics.get(split)
                if not isinstance(entry, dict) or "protocol" not in entry:
                    continue
                theirs = check_card(entry["protocol"], f"{mpath} ({split} card)")
                differ = [k for k in (*PROTOCOL_FIELDS, "normalizer") if theirs.get(k) != card.get(k)]
                if differ:
                    raise ValueError(f"{path}: metrics.json and {PER_QUERY} give different {split} protocol cards "
                                     f"({', '.join(differ)}): the two files are not from the same run")
        selected = metrics.get("normalizer") if metrics else None
        return Result(str(path), cards=source.cards, selected=selected, source=source, metrics=metrics)
    if p.is_file():
        source = PerQueryFile(p)
        return Result(str(path), cards=source.cards, source=source)
    raise FileNotFoundError(f"{path}: no such run directory or per-query file")


def expand(pattern: str, flag: str) -> list[str]:
    """Paths a run argument names: itself when it exists, else its glob matches (sorted) that are
    run directories or ``.npz`` files (``runs/x_s*`` also matches a sweep's ``x_s0.log``)."""
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
    if len(found) > MAX_RUNS:
        raise ValueError(f"{flag}: {pattern!r} matches {len(found)} runs, more than the {MAX_RUNS} compared")
    return found


def _split(a: Sequence[Result], b: Sequence[Result], split: str | None) -> tuple[str, str | None]:
    """``(split, note)``: the split compared and, when val was taken by default, why."""
    runs = (*a, *b)
    if split is not None:
        for r in runs:
            if split not in r.splits():
                raise ValueError(f"--split: {r.path} has no {split!r} results "
                                 f"(it has {', '.join(sorted(r.splits())) or 'none'})")
        return split, None
    if all("test" in r.splits() for r in runs):
        return "test", None
    if all("val" in r.splits() for r in runs):
        without = [r.path for r in runs if "test" not in r.splits()]
        return "val", ("defaulted to val: " + (f"{without[0]} has no test split" if len(without) == 1 else
                                               f"{len(without)} runs have no test split, e.g. {without[0]}"))
    names = "; ".join(f"{r.path}: {', '.join(sorted(r.splits())) or 'none'}" for r in runs[:4])
    raise ValueError(f"--split: the results share no split ({names}); name one with --split "
                     f"(a file of 'xmodal eval --per-query' names its split as the run does: val / test)")


def _differences(a: Sequence[Result], b: Sequence[Result], split: str, norm_a: str, norm_b: str) -> list[str]:
    """Protocol-card differences of every run against A's first, as ``"A_PATH (A) vs PATH (B): field:
    A's value vs B's value"`` (names and values in the same order)."""
    ref = a[0]
    out = []
    for side, runs, name in (("A", a, norm_a), ("B", b, norm_b)):
        for r in runs:
            if r is ref and side == "A":
                continue
            for d in card_differences(ref.cards.get(split), r.cards.get(split),
                                      normalizer_a=ref.normalizer(split, norm_a),
                                      normalizer_b=r.normalizer(split, name)):
                out.append(f"{ref.path} (A) vs {r.path} ({side}): {_short(d)}")
    return out


def _short(line: str) -> str:
    """Shorten 64-hex digests in a difference line to 12 characters."""
    return re.sub(r"([0-9a-f]{12})[0-9a-f]{52}", r"\1…", line)


def _keys(ids: np.ndarray) -> np.ndarray:
    """Sort order of ``uint8 [Q, 16]`` ids (stable: equal ids keep their order)."""
    words = np.ascontiguousarray(ids).view(">u8").reshape(-1, 2)
    return np.lexsort((words[:, 1], words[:, 0]))


def _alignment(ref: Result, r: Result, split: str, direction: str,
               force: bool) -> tuple[np.ndarray | None, str | None]:
    """``(order, without_ids)``: the index array putting ``r``'s queries in ``ref``'s query order (None:
    already in it), matched by query id; by position only where both list the same split files, and
    then ``without_ids`` names the file that stores no ids for ``direction`` (None when paired by ids)."""
    ia, ib = ref.ids(split, direction), r.ids(split, direction)
    if ia is not None and ib is not None:
        if ia.shape != ib.shape:
            raise ValueError(f"{ref.path} (A) vs {r.path}: {ia.shape[0]} vs {ib.shape[0]} {direction} queries on "
                             f"{split}: they cannot be paired, even with --force")
        if np.array_equal(ia, ib):
            return None, None
        oa, ob = _keys(ia), _keys(ib)
        if not np.array_equal(ia[oa], ib[ob]):
            missing = int(np.count_nonzero(~np.isin(ia.view(">u8").reshape(-1, 2)[:, 0],
                                                    ib.view(">u8").reshape(-1, 2)[:, 0])))
            raise ValueError(f"{ref.path} (A) vs {r.path}: the {split} {direction} queries differ ({missing} of A's "
                             f"{ia.shape[0]} are not among B's): they cannot be paired, even with --force")
        perm = np.empty(ia.shape[0], dtype=np.int64)
        perm[oa] = ob
        return perm, None
    sa, sb = (x.cards.get(split, {}).get("split_sha256") for x in (ref, r))
    no_ids = ref.path if ia is None else r.path
    if sa is None or sa != sb:
        raise ValueError(f"{ref.path} (A) vs {r.path}: the split files differ (split_sha256) and {no_ids} stores no "
                         f"query ids (written before xmodal stored them), so the {direction} queries cannot be paired "
                         f"by identity, even with --force; re-run it (or 'xmodal eval --per-query') with this version")
    return None, no_ids


def _side(runs: Sequence[Result], split: str, name: str) -> dict:
    return {"runs": [r.path for r in runs], "normalizers": [r.normalizer(split, name) for r in runs]}


def _check_sides(a: Any, b: Any) -> None:
    for side, name in ((a, "a"), (b, "b")):
        if isinstance(side, (str, bytes, dict)) or not isinstance(side, Sequence) or \
                not all(isinstance(r, Result) for r in side):
            raise TypeError(f"{name}: expected a list of load_result(...) results, got {short_repr(side)}")
        if len(side) > MAX_RUNS:
            raise ValueError(f"{name}: {len(side)} runs, more than the {MAX_RUNS} compared")
    if not a or not b:
        raise ValueError("compare: give at least one run on each side")


def compare(a: Sequence[Result], b: Sequence[Result], *, split: str | None = None, normalizer: str | None = None,
            normalizer_b: str | None = None, metrics: Sequence[str] | None = None,
            directions: Sequence[str] | None = None, n_boot: int = 10000, seed: int = 0, level: float = 0.95,
            force: bool = False) -> dict:
    """Paired tests of B against A for every direction x metric both have.

    Args:
        a, b: the runs of each side (several: seeds).
        split: the split compared (default ``test`` when every run has it, else ``val``, said in
            ``split_note``).
        normalizer: A's normaliser (``selected``: each run's own choice; ``none``: the heads alone); B's
            too unless ``normalizer_b``. Default (None): two comparisons, the heads alone (``none`` vs
            ``none``) and, when some run selected another normaliser, each run as deployed.
        metrics: rows per direction; default :data:`DEFAULT_METRICS`, whose ``mAP`` is left out where the
            split has no relevancy (a metric named explicitly must be there).
        directions: default every one of t2v, v2t, p2v, v2p that all runs have.
        n_boot, seed, level: of :func:`xmodal.metrics.paired_test`.
        force: compare even when the protocol cards differ (the differences are still returned); the
            queries are still paired by identity, never by position across different split files.

    Returns:
        ``{"split", "split_note", "a", "b", "comparisons", "rows", "protocol_differences", "card", "pairing",
        "paired_by_position", "unit", "n_boot", "seed", "level"}``. ``pairing``: how the queries were
        paired, in words (``"query ids (t2v, v2t, p2v, v2p)"``, or which directions by position and why
        that is safe); ``paired_by_position``: those directions. ``comparisons``: one dict per
        comparison (``label``, ``normalizer_a``, ``normalizer_b``, ``a`` / ``b`` (runs and each run's
        normaliser), ``rows``).
        ``rows``: every comparison's rows, each :func:`~xmodal.metrics.paired_test`'s dict plus
        ``direction``, ``compared`` (the comparison's label), ``p_holm`` (Holm over the comparison's
        rows) and ``verdict``: ``"B better"`` / ``"A better"`` (Holm p below ``1 - level`` and the
        interval clear of 0), ``"no clear difference"``, or with seeds ``"cannot be decided with
        N + M seeds"`` (the same N runs on both sides: ``"with N paired runs"``) where the seed-level test cannot reach ``1 - level`` after Holm whatever the
        runs score.
    """
    _check_sides(a, b)
    for value, label in ((normalizer, "normalizer"), (normalizer_b, "normalizer_b"), (split, "split")):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{label}: expected a name, got {short_repr(value)}")
    for value, label in ((metrics, "metrics"), (directions, "directions")):
        if value is not None and (isinstance(value, str) or not isinstance(value, Sequence)
                                  or not all(isinstance(x, str) for x in value)):
            raise TypeError(f"{label}: expected a list of names, got {short_repr(value)}")
    if not isinstance(force, bool):
        raise TypeError(f"force: expected True or False, got {short_repr(force)}")
    split, note = _split(a, b, split)
    if normalizer is None and normalizer_b is None:
        plans = [("heads alone", "none", "none")]
        chosen = {r.normalizer(split, "selected") for r in (*a, *b)}
        if chosen != {"none"}:
            plans.append(("as deployed", "selected", "selected"))
    else:
        na = normalizer or "selected"
        plans = [("as asked", na, normalizer_b or na)]
    same_runs = [os.path.realpath(r.path) for r in a] == [os.path.realpath(r.path) for r in b]
    comparisons, diffs = [], []
    without: dict[str, str | None] = {}  # direction -> a file without its ids (paired by position), or None
    for label, na, nb in plans:
        block_diffs = _differences(a, b, split, na, nb)
        if block_diffs and not force:
            raise ValueError("the protocol cards differ, so the queries cannot be paired: " + "; ".join(block_diffs[:6])
                             + (f"; ... ({len(block_diffs)} in all)" if len(block_diffs) > 6 else "")
                             + " (--force compares anyway)")
        diffs += [d for d in block_diffs if d not in diffs]
        rows = _rows(a, b, split, na, nb, metrics, directions, n_boot, seed, level, force, same_runs, without)
        for r in rows:
            r["compared"] = label
        _verdicts(rows, level)
        comparisons.append({"label": label, "normalizer_a": na, "normalizer_b": nb, "a": _side(a, split, na),
                            "b": _side(b, split, nb), "rows": rows})
    seeds = len(a) > 1 or len(b) > 1
    pairing = _pairing(without, a[0].cards.get(split))
    return {"split": split, "split_note": note, "a": comparisons[-1]["a"], "b": comparisons[-1]["b"],
            "comparisons": comparisons, "rows": [r for c in comparisons for r in c["rows"]],
            "protocol_differences": diffs, "card": a[0].cards.get(split), "pairing": pairing["text"],
            "paired_by_position": pairing["position"],
            "unit": "seeds" if seeds else "queries", "paired_seeds": bool(same_runs and seeds),
            "n_boot": n_boot, "seed": seed, "level": level}


def _rows(a: Sequence[Result], b: Sequence[Result], split: str, na: str, nb: str, metrics: Sequence[str] | None,
          directions: Sequence[str] | None, n_boot: int, seed: int, level: float, force: bool,
          same_runs: bool, without: dict[str, str | None]) -> list[dict]:
    """The rows of one comparison; ``without`` gets, per direction, the file paired by position for lack of
    ids (None: paired by ids)."""
    optional = ("mAP",) if metrics is None else ()
    metrics = DEFAULT_METRICS if metrics is None else tuple(metrics)
    sides = ((a, na), (b, nb))
    dirs = list(directions) if directions else [
        d for d in DIRECTIONS if all(r.has(split, n, d) for rs, n in sides for r in rs)]
    if not dirs:
        raise ValueError(f"--normalizer: no direction has per-query ranks for {na!r} / {nb!r} in every run ({split})")
    for d in dirs:
        missing = [r.path for rs, n in sides for r in rs if not r.has(split, n, d)]
        if missing:
            raise ValueError(f"--directions: {d} has no per-query ranks under this normaliser in {missing[0]} "
                             f"({split}; p2v / v2p exist only on a split with groups)")
    ref = a[0]
    rows = []
    for d in dirs:
        aligned = {id(r): _alignment(ref, r, split, d, force) for r in (*a, *b) if r is not ref}
        order = {k: v[0] for k, v in aligned.items()}
        without[d] = next((v[1] for v in aligned.values() if v[1] is not None),
                          None if aligned or ref.ids(split, d) is not None else ref.path)
        for m in metrics:
            va, vb = ([r.values(split, n, d, m) for r in rs] for rs, n in sides)
            if any(v is None for v in (*va, *vb)):
                if m in optional:
                    continue  # no relevancy on this split: the default metrics just skip mAP
                raise ValueError(f"--metrics: {m} of {d} is missing from some run's per-query results ({split})")
            sizes = {v.shape[0] for v in (*va, *vb)}
            if len(sizes) != 1:
                raise ValueError(f"the runs have different numbers of {d} queries ({', '.join(map(str, sorted(sizes)))}) "
                                 f"on {split}: they cannot be paired, even with --force")
            if (len(va) + len(vb)) * sizes.pop() > MAX_VALUES:
                raise ValueError(f"{len(va)} + {len(vb)} runs x {va[0].shape[0]} {d} queries is more than the "
                                 f"{MAX_VALUES} per-query values compared at once; compare fewer runs")
            va = [v if order.get(id(r)) is None else v[order[id(r)]] for r, v in zip(a, va)]
            vb = [v if order.get(id(r)) is None else v[order[id(r)]] for r, v in zip(b, vb)]
            t = paired_test(va if len(va) > 1 else va[0], vb if len(vb) > 1 else vb[0], metric=m, n_boot=n_boot,
                            seed=seed, level=level, paired_seeds=same_runs and len(va) > 1)
            rows.append({"direction": d, **t, "paired_by": "query ids" if without[d] is None else "position",
                         "paired_seeds": bool(same_runs and len(va) > 1)})
    return rows


def _pairing(without: dict[str, str | None], card: dict | None) -> dict:
    """``{"text", "position"}``: how the compared directions' queries were paired, in words, and the
    directions paired by position (``without[d]``: the file without their ids; the same split files
    everywhere, or :func:`_alignment` refused)."""
    ids = [d for d, f in without.items() if f is None]
    pos = [d for d, f in without.items() if f is not None]
    if not pos:
        return {"text": "query ids" + (f" ({', '.join(ids)})" if ids else ""), "position": []}
    sha = str((card or {}).get("split_sha256"))[:12]
    files: dict[str, list[str]] = {}
    for d in pos:
        files.setdefault(without[d], []).append(d)
    why = "; ".join(f"{f} stores no {' / '.join(ds)} query ids" for f, ds in files.items())
    text = (f"query ids ({', '.join(ids)}); " if ids else "") + f"{', '.join(pos)} by position ({why}, written " \
        f"before xmodal stored them): safe because every file lists the very same split files (split_sha256 " \
        f"{sha}…), whose queries come in one order, so the i-th query is the same query in every file"
    return {"text": text, "position": pos}


def _verdicts(rows: list[dict], level: float) -> None:
    """Holm over the rows of one comparison, then each row's verdict."""
    alpha = 1.0 - level
    adjusted = holm([r["p_value"] for r in rows])
    reachable = len(rows) * min((r["p_value_min"] for r in rows), default=0.0) <= alpha
    for r, p in zip(rows, adjusted):
        r["p_holm"] = p
        gain = -r["diff"] if r["lower_is_better"] else r["diff"]
        lo, hi = (-r["ci_high"], -r["ci_low"]) if r["lower_is_better"] else (r["ci_low"], r["ci_high"])
        if r["unit"] == "seeds" and (not reachable or r["p_value_min"] > alpha):
            r["verdict"] = (f"cannot be decided with {r['seeds_a']} paired runs" if r.get("paired_seeds")
                            else f"cannot be decided with {r['seeds_a']} + {r['seeds_b']} seeds")
        else:
            r["verdict"] = ("B better" if p < alpha and lo > 0 and gain > 0 else
                            "A better" if p < alpha and hi < 0 and gain < 0 else "no clear difference")


def _cell(metric: str, value: float, std: float) -> str:
    return format_metric(metric, value, None if math.isnan(std) else std)


def _who(side: dict, label: str) -> str:
    names = side["normalizers"]
    runs = side["runs"]
    if len(set(names)) == 1:
        return f"{', '.join(runs)} (normaliser {names[0]}" + (f"; {len(runs)} seeds)" if len(runs) > 1 else ")")
    each = ", ".join(f"{r} ({n})" for r, n in zip(runs, names))
    return f"{each}; {len(runs)} seeds that MIX normalisers ({', '.join(sorted(set(names)))}): " \
           f"these rows compare the runs {'as deployed' if label == 'as deployed' else 'so'}, not one normaliser"


def _table(rows: list[dict], level: str) -> str:
    seeds = any(r["unit"] == "seeds" for r in rows)
    head = ["direction", "metric", "A", "B", "B − A", f"{level} CI", "p" + (" (seeds)" if seeds else ""),
            "p (Holm)"] + (["p, these runs (queries)"] if seeds else []) + ["verdict"]
    body = []
    for r in rows:
        digits = 1 if r["metric"] in LOWER_IS_BETTER else 2
        ends = (r["ci_low"], r["ci_high"])
        cells = [r["direction"], r["metric"], _cell(r["metric"], r["a"], r["std_a"]),
                 _cell(r["metric"], r["b"], r["std_b"]), format_diff(r["diff"], digits, ends),
                 "[" + ", ".join(format_diff(x, digits, (r["diff"], *ends)) for x in ends) + "]",
                 format_p(r["p_value"], r["p_floor"]), format_p(r["p_holm"], r["p_floor"])]
        if seeds:
            cells.append(format_p(r["p_value_queries"], r.get("p_floor_queries", False))
                         if "p_value_queries" in r else "–")
        body.append(cells + [r["verdict"]])
    return markdown_table(head, body)


def markdown(out: dict) -> str:
    """The comparison as Markdown: what is compared (runs, normalisers, split, pairing), one table per
    comparison, and how to read it."""
    if not isinstance(out, dict) or not {"comparisons", "level", "split", "n_boot", "seed"} <= set(out) or \
            not isinstance(out["comparisons"], list) or not all(
                isinstance(c, dict) and isinstance(c.get("rows"), list) for c in out["comparisons"]):
        raise TypeError(f"out: expected the dict compare() returns, got {short_repr(out)}")
    level = f"{100 * out['level']:.0f}%"
    card = out.get("card") or {}
    q = card.get("num_queries", {})
    lines = [f"split {out['split']}: " + ", ".join(f"{d} {n} queries" for d, n in q.items())
             + (f"; ties {card.get('tie_rule')}, v2t {card.get('v2t')}, split sha256 "
                f"{str(card.get('split_sha256'))[:12]}…" if card else "")
             + f"; queries paired by {out.get('pairing', 'position')}"]
    if out["split"] == "val":
        lines.append("NOTE: val chose each run's epoch (early stopping) and its normaliser on these same queries: "
                     "every number here is biased upward, and the as-deployed rows compare normalisers picked on them"
                     + (f" ({out['split_note']})" if out.get("split_note") else "") + ".")
    if out.get("protocol_differences"):
        lines.append("WARNING (--force): the protocol cards differ: " + "; ".join(out["protocol_differences"]))
    for c in out["comparisons"]:
        title = {"heads alone": "Heads alone: none vs none (the trained models, no test-time normaliser)",
                 "as deployed": "As deployed: each run with the normaliser it selected on val"}.get(
                     c["label"], f"{c['normalizer_a']} vs {c['normalizer_b']}")
        lines += ["", f"### {title}", "", f"A: {_who(c['a'], c['label'])}", f"B: {_who(c['b'], c['label'])}", "",
                  _table(c["rows"], level)]
    rows = [r for c in out["comparisons"] for r in c["rows"]]
    seeds = any(r["unit"] == "seeds" for r in rows)
    lines.append("")
    lines.append(f"B − A: a gain of B is > 0 for R@K / mAP and < 0 for MdR / MnR. CI: paired bootstrap over the "
                 f"queries ({out['n_boot']} resamples, seed {out['seed']}"
                 + ("; each side's seeds resampled as clusters" if seeds else "")
                 + f"). Holm over the {len(out['comparisons'][0]['rows'])} rows of each table. "
                 f"Verdict: Holm p < {1 - out['level']:.2f} and the CI clear of 0. '< x': no resample reached the "
                 "observed statistic, x = 1/(resamples + 1) is a bound, not a value.")
    if seeds:
        r = next(r for r in rows if r["unit"] == "seeds")
        lines.append(f"p (seeds): {r['test']}: the recipe is the unit, so the verdict says whether another run of "
                     f"the same recipes would likely go the same way; its smallest attainable value here is "
                     f"{r['p_value_min']:.3g}. 'cannot be decided': that floor, times the {len(c['rows'])} rows of a "
                     f"table (Holm), stays above {1 - out['level']:.2f} whatever the runs score: train more seeds, or "
                     f"ask one question (--metrics R@1 --directions t2v). 'p, these runs (queries)': the sign flip of "
                     f"the seed-averaged per-query values, the trained runs held fixed (are these runs different on "
                     f"these queries?), which says nothing about other seeds.")
    elif rows:
        lines.append("p: McNemar's exact test for R@K, the paired sign flip over queries otherwise. One run per side: "
                     "the verdict is about these two runs on these queries, not about the recipes (another seed may "
                     "go the other way; compare seed groups for that).")
    return "\n".join(lines)
