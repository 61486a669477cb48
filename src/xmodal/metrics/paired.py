"""Is a difference real? Paired tests of two retrieval results on the same queries.

Two results on one split are *paired*: each query has a value under A and under B (its
rank of the first positive, or its AP / nDCG). :func:`paired_test` gives the difference
``B - A`` of one metric, a percentile bootstrap confidence interval and a two-sided
sign-flip permutation p-value; :func:`holm` corrects a family of p-values.

* **Bootstrap** (Efron & Tibshirani 1993, ch. 13, percentile interval): queries are
  resampled with replacement, the same indices for A and B (paired). With several seeds
  on a side, that side's seeds are resampled too (seeds as clusters: a two-stage
  bootstrap, seeds then queries), so the interval carries the seed-to-seed spread as
  well as the query sampling. With 2-3 seeds the seed stage is crude (a resample of 3
  values); it is still wider than pretending the seeds were one run.
* **Permutation** (paired sign flip, Good 2005, sec. 3.6.2): under the null of no
  difference, A's and B's values of a query are exchangeable, so each query's pair is
  swapped with probability 1/2. For a mean-type metric (R@K, MnR, mAP, nDCG) that flips
  the sign of the query's difference. For R@K of one run per side this is McNemar's exact
  test (the discordant queries are Binomial(m, 1/2) under the null), computed exactly
  from the binomial distribution whatever ``m``. Otherwise all ``2^m`` sign patterns are
  enumerated when that is at most ``n_perm`` (``m`` = queries whose values differ), else
  ``n_perm`` random ones give ``p = (1 + #{|T*| >= |T|}) / (1 + n_perm)``, which is never
  below the true p-value's Monte-Carlo estimate (a valid test); when no random pattern
  reaches the observed statistic, ``p_floor`` is True and the p-value is the resampling
  floor ``1 / (1 + n_perm)`` (tables print it as ``< 1/(B+1)``, not as a value).
* **Seeds** (the recipe as the unit): with several runs on a side, the question is whether
  the *training recipes* differ, and the unit of that question is the run. The p-value is
  then the permutation test of the run labels (:func:`seed_test`): each run's metric, the
  labels A / B permuted among the runs (exactly, every labelling, up to
  :data:`EXACT_LABELINGS` of them; Monte-Carlo beyond, the bound stated in ``test``); for the
  same runs under two normalisers (``paired_seeds``), the signs of each run's difference are
  flipped instead. Its smallest attainable value (``p_value_min``) depends only on the
  number of runs: 0.1 for 3 + 3 seeds (20 labellings), 0.25 for 3 paired runs, so such a
  comparison *cannot be decided* at 0.05 whatever the runs score. The query-level sign flip
  of the seed-averaged values (``p_value_queries``) is still given: it holds the trained
  runs fixed and asks whether these runs differ on these queries.
* **Holm** (1979): step-down adjustment controlling the family-wise error rate over
  the metrics shown.

Per-query values of each metric: ``R@K`` is ``100 * [rank <= K]`` (its mean is the
R@K of :func:`xmodal.metrics.retrieval` under the rank's tie rule), ``MnR`` the rank,
``MdR`` the median rank (not a mean: the bootstrap and the swap work on medians),
``mAP`` / ``nDCG`` the query's AP / nDCG in percent (NaN for a query that has none:
such queries are dropped from both sides, as ``empty="skip"`` does).
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from itertools import chain, combinations
from typing import Any, Sequence

import numpy as np

from xmodal._validate import short_repr

__all__ = ["paired_test", "paired_strata_test", "seed_test", "bootstrap_interval", "holm", "query_values",
           "format_p", "format_diff", "LOWER_IS_BETTER", "MAX_RESAMPLES", "EXACT_LABELINGS"]

#: Metrics where a smaller value is better (a negative difference B - A is a gain).
LOWER_IS_BETTER = ("MdR", "MnR")
_VALUE_METRICS = ("mAP", "nDCG")
_CHUNK_ELEMS = 1 << 21  # bootstrap / permutation work in blocks of about 2M values
#: Largest ``n_boot`` / ``n_perm`` accepted (time grows with it; memory does not: resamples run in blocks).
MAX_RESAMPLES = 1_000_000
#: Seed-level tests enumerate every labelling (or sign pattern) up to this many, else draw ``n_perm`` at random.
EXACT_LABELINGS = 100_000


def _metric(metric: Any) -> str:
    if not isinstance(metric, str) or not (re.fullmatch(r"R@[1-9][0-9]*", metric)
                                           or metric in ("MdR", "MnR", *_VALUE_METRICS)):
        raise ValueError(f"metric: expected R@K, MdR, MnR, mAP or nDCG, got {short_repr(metric)}")
    return metric


def query_values(x: Any, metric: str) -> np.ndarray:
    """Per-query values whose mean (median for ``MdR``) over queries is ``metric``.

    Args:
        x: per-query ranks (1-based; for R@K, MdR, MnR) or AP / nDCG in percent (mAP, nDCG).
        metric: ``R@K``, ``MdR``, ``MnR``, ``mAP`` or ``nDCG``.

    >>> query_values(np.array([1, 3, 12]), "R@5")
    array([100., 100.,   0.])
    """
    metric = _metric(metric)
    v = np.asarray(x, dtype=np.float64)
    if metric.startswith("R@"):
        return 100.0 * (v <= int(metric[2:]))
    return v


def _numbers(x: Any, name: str) -> np.ndarray:
    """float64 copy of an array of real numbers (strings, objects and complex values refused, never cast)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected an array of numbers, got {short_repr(x)}") from None
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected real numbers, got an array of {arr.dtype}")
    return arr.astype(np.float64)


def _runs(x: Any, name: str, metric: str) -> np.ndarray:
    """``[seeds, queries]`` float64 from one run's per-query array or a list of them (seeds)."""
    if isinstance(x, (str, bytes, dict)):
        raise TypeError(f"{name}: expected per-query values (an array) or a list of them (seeds), got "
                        f"{short_repr(x)}")
    if isinstance(x, (list, tuple)):
        if not x:
            raise ValueError(f"{name}: an empty list of runs")
        rows = [_numbers(r, name) for r in x]
        if any(r.ndim != 1 for r in rows):
            raise ValueError(f"{name}: each run must be a 1-D array of per-query values")
        if len({r.shape[0] for r in rows}) != 1:
            raise ValueError(f"{name}: the runs have different numbers of queries "
                             f"({', '.join(str(r.shape[0]) for r in rows)}); seeds must share the queries")
        arr = np.stack(rows)
    else:
        arr = _numbers(x, name)
        if arr.ndim == 1:
            arr = arr[None, :]
        elif arr.ndim != 2:
            raise ValueError(f"{name}: expected [queries] or [seeds, queries], got shape {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError(f"{name}: no queries")
    if metric in _VALUE_METRICS:
        if np.isinf(arr).any():
            raise ValueError(f"{name}: {metric} values must be finite (NaN marks a query without one)")
    else:
        if not np.isfinite(arr).all():
            raise ValueError(f"{name}: ranks must be finite numbers")
        if (arr < 1).any():
            raise ValueError(f"{name}: ranks are 1-based; got a value {arr.min():g} < 1")
    return arr


def _stat(v: np.ndarray, median: bool, axis: int = -1) -> np.ndarray:
    return np.median(v, axis=axis) if median else v.mean(axis=axis)


def _chunks(total: int, width: int):
    step = max(1, _CHUNK_ELEMS // max(1, width))
    for start in range(0, total, step):
        yield min(step, total - start)


def _bootstrap(fa: np.ndarray, fb: np.ndarray, median: bool, n_boot: int, rng: np.random.Generator,
               paired_seeds: bool = False) -> np.ndarray:
    """``n_boot`` bootstrap differences: seeds of a side with several resampled (clusters; the same
    draws for both sides when ``paired_seeds``), queries resampled with the same indices for both sides."""
    (ka, n), kb = fa.shape, fb.shape[0]

    def seeds(k: int, c: int) -> np.ndarray:  # [c, k] chosen seed rows (all of them for one seed)
        return rng.integers(0, k, size=(c, k)) if k > 1 else np.zeros((c, 1), dtype=np.int64)

    def both(c: int) -> tuple[np.ndarray, np.ndarray]:
        sb = seeds(kb, c)
        return (sb if paired_seeds else seeds(ka, c)), sb

    def weights(chosen: np.ndarray, k: int) -> np.ndarray:  # [c, k] share of each seed in a resample
        return (chosen[:, :, None] == np.arange(k)).sum(1) / chosen.shape[1]

    if not median:
        # Queries with the same values on every run are interchangeable: resampling n queries is
        # drawing multinomial counts of these types (R@K has at most 2^(ka+kb) of them).
        types, counts = np.unique(np.vstack([fa, fb]), axis=1, return_counts=True)
        if types.shape[1] <= n // 4:
            ta, tb, share, out = types[:ka], types[ka:], counts / n, []
            for c in _chunks(n_boot, types.shape[1] * max(ka, kb, 2)):
                drawn = rng.multinomial(n, share, size=c)
                sa, sb = both(c)
                g = weights(sb, kb) @ tb - weights(sa, ka) @ ta
                out.append((drawn * g).sum(1) / n)
            return np.concatenate(out)
        if ka == 1 and kb == 1:
            return _boot_mean(fb[0] - fa[0], n_boot, rng)
    out = []
    for c in _chunks(n_boot, n * max(ka, kb, 2)):
        sa, sb = both(c)
        idx = rng.integers(0, n, size=(c, n))
        if not median:  # mean over the chosen seeds, then over the chosen queries
            g = weights(sb, kb) @ fb - weights(sa, ka) @ fa
            d = np.take_along_axis(g, idx, axis=1).mean(1)
        else:  # mean over the chosen seeds of each seed's median over the chosen queries
            va = np.mean([np.median(fa[sa[:, j][:, None], idx], axis=1) for j in range(sa.shape[1])], axis=0)
            vb = np.mean([np.median(fb[sb[:, j][:, None], idx], axis=1) for j in range(sb.shape[1])], axis=0)
            d = vb - va
        out.append(d)
    return np.concatenate(out)


def _flip_sum(c: np.ndarray, observed: float, n_perm: int, rng: np.random.Generator
              ) -> tuple[float, bool, bool]:
    """``(two-sided p, exact, at the floor)`` of ``observed = sum(c)`` under independent random signs
    of the non-zero contributions ``c``: every pattern when ``2^m <= n_perm``, else ``n_perm``
    random ones (binomial counts per distinct magnitude when there are few, as for R@K)."""
    c = c[c != 0]
    m = c.size
    if m == 0:
        return 1.0, True, False
    tol = 1e-9 * max(1.0, abs(observed))  # the observed pattern itself counts, despite rounding
    if m <= 20 and (1 << m) <= n_perm:
        signs = 1.0 - 2.0 * ((np.arange(1 << m)[:, None] >> np.arange(m)[None, :]) & 1)
        return float(np.mean(np.abs(signs @ c) >= abs(observed) - tol)), True, False
    sizes, counts = np.unique(np.abs(c), return_counts=True)
    hits = 0
    if sizes.size <= 256:  # the flipped sum only needs how many of each magnitude turn positive
        for k in _chunks(n_perm, sizes.size):
            up = rng.binomial(counts, 0.5, size=(k, sizes.size))
            hits += int(np.count_nonzero(np.abs((2 * up - counts) @ sizes) >= abs(observed) - tol))
    else:
        for k in _chunks(n_perm, m):
            signs = rng.integers(0, 2, size=(k, m), dtype=np.int8) * 2 - 1
            hits += int(np.count_nonzero(np.abs(signs @ c) >= abs(observed) - tol))
    return (1 + hits) / (1 + n_perm), False, hits == 0


def _mcnemar(a: np.ndarray, b: np.ndarray) -> float:
    """McNemar's exact two-sided p-value of paired 0/100 hits: ``2 P(X <= min(n01, n10))``, X ~
    Binomial(n01 + n10, 1/2), at most 1 (the sign-flip test of R@K, computed exactly)."""
    from scipy.stats import binom

    up, down = int(np.count_nonzero(b > a)), int(np.count_nonzero(b < a))
    if up + down == 0:
        return 1.0
    return float(min(1.0, 2.0 * binom.cdf(min(up, down), up + down, 0.5)))


def _boot_mean(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` bootstrap means of ``d`` (multinomial counts of its distinct values when few)."""
    n = d.size
    values, counts = np.unique(d, return_counts=True)
    if values.size <= n // 4:
        return np.concatenate([rng.multinomial(n, counts / n, size=k) @ values / n
                               for k in _chunks(n_boot, values.size)])
    return np.concatenate([d[rng.integers(0, n, size=(k, n))].mean(1) for k in _chunks(n_boot, n)])


def _sign_flip(a: np.ndarray, b: np.ndarray, median: bool, n_perm: int, rng: np.random.Generator
               ) -> tuple[float, float, bool, bool]:
    """``(observed statistic, two-sided p-value, exact, at the floor)`` of the paired swap test on
    per-query values ``a``, ``b`` ``[n]``: exact enumeration when ``2^m <= n_perm``."""
    observed = float(_stat(b, median) - _stat(a, median))
    differ = np.flatnonzero(a != b)
    m = differ.size
    if m == 0:
        return observed, 1.0, True, False
    tol = 1e-9 * max(1.0, abs(observed))  # the observed pattern itself counts, despite rounding
    exact = m <= 20 and (1 << m) <= n_perm
    if not median:
        p, exact, floor = _flip_sum((b - a)[differ] / a.size, observed, n_perm, rng)
        return observed, p, exact, floor
    if exact:
        swap = ((np.arange(1 << m)[:, None] >> np.arange(m)[None, :]) & 1).astype(bool)
        parts = [swap]
    else:
        parts = (rng.integers(0, 2, size=(c, m)).astype(bool) for c in _chunks(n_perm, a.size))
    hits = 0
    for swap in parts:
        aa = np.broadcast_to(a, (swap.shape[0], a.size)).copy()
        bb = np.broadcast_to(b, (swap.shape[0], b.size)).copy()
        sa, sb = aa[:, differ], bb[:, differ]
        aa[:, differ], bb[:, differ] = np.where(swap, sb, sa), np.where(swap, sa, sb)
        hits += int(np.count_nonzero(np.abs(np.median(bb, 1) - np.median(aa, 1)) >= abs(observed) - tol))
    if exact:
        return observed, hits / (1 << m), True, False
    return observed, (1 + hits) / (1 + n_perm), False, hits == 0


@lru_cache(maxsize=4)
def _labelings(n: int, k: int) -> np.ndarray:
    """Every way of choosing ``k`` of ``n`` positions, ``[C(n, k), k]`` (at most
    :data:`EXACT_LABELINGS` rows; cached: every row of a comparison has the same runs)."""
    out = np.fromiter(chain.from_iterable(combinations(range(n), k)), dtype=np.int64, count=math.comb(n, k) * k)
    out = out.reshape(-1, k)
    out.setflags(write=False)
    return out


def seed_test(a: Any, b: Any, *, paired: bool = False, n_perm: int = 10000, seed: int = 0) -> dict:
    """Permutation test over runs (seeds): is B's recipe better than A's, the run as the unit?

    ``paired=False`` (two groups of independently trained runs): the statistic is ``mean(b) -
    mean(a)`` and the labels A / B are permuted among the ``ka + kb`` runs. ``paired=True`` (run
    ``i`` of A and of B belong together, e.g. one trained model under two normalisers): the signs
    of the differences ``b_i - a_i`` are flipped. Every labelling (sign pattern) is enumerated when
    there are at most :data:`EXACT_LABELINGS`, else ``n_perm`` random ones give ``(1 + hits) / (1 +
    n_perm)``. Memory and time are bounded by these two numbers, never by the number of runs'
    labellings.

    Args:
        a, b: one value per run (e.g. each run's R@1), ``[ka]`` and ``[kb]``.
        paired: the runs are paired (``ka == kb``).
        n_perm: random labellings when there are more than :data:`EXACT_LABELINGS`.
        seed: seed of those draws.

    Returns:
        ``{"p_value", "p_value_min", "exact", "labelings", "p_floor", "test"}``: ``p_value_min`` is the
        smallest p-value any outcome of these runs could give (the share of labellings at the most
        extreme statistic: ``2 / C(ka + kb, ka)`` for two groups of ``k`` distinct values, ``2 / 2^k``
        for ``k`` pairs; the floor ``1 / (1 + n_perm)`` when sampled), ``labelings`` the number of
        labellings (sign patterns).

    >>> seed_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])["p_value"]  # 2 of the C(6, 3) = 20 labellings
    0.1
    """
    ra, rb = _numbers(a, "a"), _numbers(b, "b")
    if ra.ndim != 1 or rb.ndim != 1 or ra.size == 0 or rb.size == 0:
        raise ValueError("a, b: expected one value per run, two non-empty 1-D arrays")
    if not (np.isfinite(ra).all() and np.isfinite(rb).all()):
        raise ValueError("a, b: values must be finite")
    if not isinstance(paired, (bool, np.bool_)):
        raise TypeError(f"paired: expected True or False, got {short_repr(paired)}")
    n_perm = _check_count(n_perm, "n_perm", maximum=MAX_RESAMPLES)
    seed = _check_count(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    if paired:
        if ra.size != rb.size:
            raise ValueError(f"b: {rb.size} runs, but a has {ra.size}; paired runs come in pairs")
        d = rb - ra
        observed, k = float(d.mean()), d.size
        total = 1 << k if k < 63 else math.inf
        exact = total <= EXACT_LABELINGS

        def null_blocks():
            if exact:
                for start in range(0, int(total), 8192):
                    codes = np.arange(start, min(int(total), start + 8192))
                    yield 1.0 - 2.0 * ((codes[:, None] >> np.arange(k)[None, :]) & 1)
            else:
                for c in _chunks(n_perm, k):
                    yield rng.integers(0, 2, size=(c, k)) * 2.0 - 1.0

        stats = (signs @ d / k for signs in null_blocks())
        what = "paired runs: signs of each run's difference flipped"
    else:
        pooled = np.concatenate([ra, rb])
        n, k = pooled.size, ra.size
        total_sum = pooled.sum()
        observed = float(rb.mean() - ra.mean())
        total = math.comb(n, k)
        exact = total <= EXACT_LABELINGS

        def chosen_blocks():
            if exact:
                every = _labelings(n, k)
                for start in range(0, every.shape[0], 16384):
                    yield every[start:start + 16384]
            else:
                for c in _chunks(n_perm, n):
                    yield np.argsort(rng.random((c, n)), axis=1)[:, :k]

        def label_stats():
            for idx in chosen_blocks():
                picked = pooled[idx].sum(1)
                yield (total_sum - picked) / (n - k) - picked / k

        stats = label_stats()
        what = "run labels permuted"
    tol = 1e-9 * max(1.0, abs(observed), float(np.abs(np.concatenate([ra, rb])).max()))
    hits = count = at_max = 0
    top = -math.inf
    for t in stats:
        t = np.abs(t)
        hits += int(np.count_nonzero(t >= abs(observed) - tol))
        count += t.size
        m = float(t.max())
        if m > top + tol:
            top, at_max = m, int(np.count_nonzero(t >= m - tol))
        elif m >= top - tol:
            at_max += int(np.count_nonzero(t >= top - tol))
    sizes = f"{ra.size} + {rb.size} runs" if not paired else f"{ra.size} paired runs"
    if exact:
        out = {"p_value": hits / count, "p_value_min": at_max / count, "exact": True, "labelings": int(total),
               "p_floor": False, "test": f"{what}, exact ({int(total)} {'patterns' if paired else 'labellings'} of "
                                         f"{sizes})"}
    else:
        out = {"p_value": (1 + hits) / (1 + n_perm), "p_value_min": 1 / (1 + n_perm), "exact": False,
               "labelings": float(total), "p_floor": hits == 0,
               "test": f"{what}, Monte-Carlo: {n_perm} random of the {total:.3g} "
                       f"{'patterns' if paired else 'labellings'} of {sizes} (exact up to {EXACT_LABELINGS})"}
    return out


def _check_count(value: Any, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum or \
            (maximum is not None and value > maximum):
        bound = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise ValueError(f"{name}: expected an integer {bound}, got {short_repr(value)}")
    return int(value)


def paired_test(a: Any, b: Any, *, metric: str = "R@1", n_boot: int = 10000, seed: int = 0,
                n_perm: int | None = None, level: float = 0.95, paired_seeds: bool = False) -> dict:
    """Difference ``B - A`` of ``metric`` on the same queries, with a paired bootstrap interval
    and a p-value (see the module docstring): the queries' paired test for one run per side
    (McNemar's exact test for R@K, else the sign flip), the seed-level test (:func:`seed_test`)
    as soon as a side has several runs.

    Args:
        a, b: per-query ranks (1-based) or, for ``mAP`` / ``nDCG``, per-query AP / nDCG in percent
            (NaN: the query has none); one array ``[queries]`` per run, or a list of them (or a
            ``[seeds, queries]`` array) for several seeds. Every run covers the same queries in the
            same order.
        metric: ``R@K`` (any K), ``MdR``, ``MnR``, ``mAP`` or ``nDCG``.
        n_boot: bootstrap resamples (at most :data:`MAX_RESAMPLES`).
        seed: seed of the resampling (results are reproducible).
        n_perm: random sign patterns / labellings for the p-value (default ``n_boot``); all of them
            when there are few enough.
        level: confidence level of the interval.
        paired_seeds: run ``i`` of A and run ``i`` of B are the same trained model (or share their
            seed on purpose): seeds are resampled together and the seed-level test flips signs.

    Returns:
        ``{"diff", "ci_low", "ci_high", "p_value"}`` and ``"a"``, ``"b"`` (each side's metric:
        mean over seeds), ``"std_a"``, ``"std_b"`` (over seeds, NaN for one), ``"metric"``,
        ``"num_queries"``, ``"seeds_a"``, ``"seeds_b"``, ``"level"``, ``"test"`` (the test behind
        ``p_value``, in words), ``"unit"`` (``"queries"`` or ``"seeds"``), ``"exact"``, ``"p_floor"``
        (``p_value`` is the Monte-Carlo floor ``1 / (1 + n_perm)``: the true p-value is below it),
        ``"p_value_min"`` (the smallest p-value the test can give here), ``"lower_is_better"``; with
        several seeds also ``"p_value_queries"`` (the sign flip of the seed-averaged per-query
        values: these runs held fixed) and ``"p_value_seeds"`` / ``"p_value_seeds_min"`` (=
        ``p_value`` / ``p_value_min``).

    Shape:
        a: [Q] or [Sa, Q]; b: [Q] or [Sb, Q].

    >>> r = paired_test(np.array([1, 2, 1, 5]), np.array([1, 1, 1, 1]), metric="R@1")
    >>> r["diff"], r["p_value"], r["test"]
    (50.0, 0.5, 'McNemar exact')
    """
    metric = _metric(metric)
    n_boot = _check_count(n_boot, "n_boot", maximum=MAX_RESAMPLES)
    n_perm = n_boot if n_perm is None else _check_count(n_perm, "n_perm", maximum=MAX_RESAMPLES)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {short_repr(seed)}")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {short_repr(level)}")
    if not isinstance(paired_seeds, (bool, np.bool_)):
        raise TypeError(f"paired_seeds: expected True or False, got {short_repr(paired_seeds)}")
    fa, fb = _runs(a, "a", metric), _runs(b, "b", metric)
    if fa.shape[1] != fb.shape[1]:
        raise ValueError(f"b: {fb.shape[1]} queries, but a has {fa.shape[1]}; a paired test needs the same "
                         f"queries on both sides")
    if paired_seeds and fa.shape[0] != fb.shape[0]:
        raise ValueError(f"paired_seeds: a has {fa.shape[0]} runs and b {fb.shape[0]}; paired runs come in pairs")
    if metric in _VALUE_METRICS:  # queries without an AP / nDCG on any run are left out (empty="skip")
        keep = ~(np.isnan(fa).any(0) | np.isnan(fb).any(0))
        if not keep.any():
            raise ValueError(f"a: no query has a defined {metric} on every run")
        fa, fb = fa[:, keep], fb[:, keep]
    fa, fb = query_values(fa, metric), query_values(fb, metric)
    median = metric == "MdR"
    rng = np.random.default_rng(int(seed))
    per_run_a, per_run_b = _stat(fa, median), _stat(fb, median)
    diff = float(per_run_b.mean() - per_run_a.mean())
    boot = _bootstrap(fa, fb, median, n_boot, rng, paired_seeds=bool(paired_seeds))
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    single = fa.shape[0] == 1 and fb.shape[0] == 1
    if single and metric.startswith("R@"):
        p, exact, floor, test = _mcnemar(fa[0], fb[0]), True, False, "McNemar exact"
    else:
        _, p, exact, floor = _sign_flip(fa.mean(0), fb.mean(0), median, n_perm, rng)
        test = "sign flip over queries, " + ("exact" if exact else f"Monte-Carlo ({n_perm} patterns)")
    out = {"diff": diff, "ci_low": float(lo), "ci_high": float(hi), "p_value": float(p),
           "a": float(per_run_a.mean()), "b": float(per_run_b.mean()),
           "std_a": float(per_run_a.std(ddof=1)) if fa.shape[0] > 1 else math.nan,
           "std_b": float(per_run_b.std(ddof=1)) if fb.shape[0] > 1 else math.nan,
           "metric": metric, "num_queries": int(fa.shape[1]), "seeds_a": int(fa.shape[0]),
           "seeds_b": int(fb.shape[0]), "level": float(level), "exact": bool(exact), "p_floor": bool(floor),
           "p_value_min": 1.0 / (1 + n_perm) if not exact else 0.0, "test": test, "unit": "queries",
           "lower_is_better": metric in LOWER_IS_BETTER}
    if not single:
        s = seed_test(per_run_a, per_run_b, paired=bool(paired_seeds), n_perm=n_perm, seed=int(seed))
        out.update(p_value_queries=out["p_value"], p_floor_queries=out["p_floor"], test_queries=test,
                   p_value=s["p_value"], p_value_min=s["p_value_min"], exact=s["exact"], p_floor=s["p_floor"],
                   test=s["test"], unit="seeds", p_value_seeds=s["p_value"], p_value_seeds_min=s["p_value_min"])
    return out


def paired_strata_test(strata: Sequence[tuple[Any, Any, float]], *, n_boot: int = 10000, seed: int = 0,
                       n_perm: int | None = None, level: float = 0.95) -> dict:
    """The paired test of a weighted sum of per-stratum means, ``sum_s w_s mean(b_s - a_s)``:
    a score made of several query sets, such as rsum (t2v and v2t R@1 + R@5 + R@10) or the mean
    of t2v and v2t R@1. Each stratum's queries are resampled (bootstrap) and sign-flipped
    (permutation) on their own, one run per side.

    Args:
        strata: ``(a_values [Q_s], b_values [Q_s], weight)`` per stratum: per-query values whose
            mean is the stratum's term (e.g. ``100 * ([r <= 1] + [r <= 5] + [r <= 10])``).
        n_boot, seed, n_perm, level: as :func:`paired_test`.

    Returns:
        ``{"diff", "ci_low", "ci_high", "p_value", "p_floor", "a", "b", "level"}`` (``p_floor``: the
        p-value is the Monte-Carlo floor, see :func:`format_p`).

    >>> t = paired_strata_test([(np.zeros(4), np.full(4, 100.0), 0.5), (np.zeros(2), np.zeros(2), 0.5)])
    >>> t["diff"], t["ci_low"], t["p_value"]
    (50.0, 50.0, 0.125)
    """
    n_boot = _check_count(n_boot, "n_boot", maximum=MAX_RESAMPLES)
    n_perm = n_boot if n_perm is None else _check_count(n_perm, "n_perm", maximum=MAX_RESAMPLES)
    if isinstance(strata, (str, bytes)) or not isinstance(strata, Sequence) or not strata:
        raise TypeError(f"strata: expected a non-empty list of (a, b, weight), got {short_repr(strata)}")
    parts = []
    for i, s in enumerate(strata):
        if not isinstance(s, (tuple, list)) or len(s) != 3:
            raise TypeError(f"strata[{i}]: expected (a, b, weight), got {short_repr(s)}")
        a, b = (np.asarray(x, dtype=np.float64) for x in s[:2])
        if a.ndim != 1 or a.shape != b.shape or a.size == 0 or not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ValueError(f"strata[{i}]: a and b must be finite 1-D arrays of the same, non-zero length")
        parts.append((a, b, float(s[2])))
    rng = np.random.default_rng(int(seed))
    diff = sum(w * float((b - a).mean()) for a, b, w in parts)
    boot = sum(w * _boot_mean(b - a, n_boot, rng) for a, b, w in parts)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    p, _, floor = _flip_sum(np.concatenate([w * (b - a) / a.size for a, b, w in parts]), diff, n_perm, rng)
    return {"diff": float(diff), "ci_low": float(lo), "ci_high": float(hi), "p_value": float(p), "p_floor": floor,
            "a": sum(w * float(a.mean()) for a, _, w in parts), "b": sum(w * float(b.mean()) for _, b, w in parts),
            "level": float(level)}


def bootstrap_interval(x: Any, *, metric: str = "R@1", n_boot: int = 10000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float, float]:
    """``(value, low, high)``: one result's ``metric`` and its percentile bootstrap interval over
    the queries (one run; ``x`` as one side of :func:`paired_test`).

    >>> bootstrap_interval(np.array([1, 1, 1, 1]), metric="R@1")
    (100.0, 100.0, 100.0)
    """
    metric = _metric(metric)
    n_boot = _check_count(n_boot, "n_boot", maximum=MAX_RESAMPLES)
    f = _runs(x, "x", metric)
    if f.shape[0] != 1:
        raise ValueError("x: one run's per-query values (for seeds, compare them with paired_test)")
    v = query_values(f[0], metric)
    v = v[~np.isnan(v)]
    if v.size == 0:
        raise ValueError(f"x: no query has a defined {metric}")
    rng = np.random.default_rng(int(seed))
    if metric == "MdR":
        boot = np.concatenate([np.median(v[rng.integers(0, v.size, size=(k, v.size))], axis=1)
                               for k in _chunks(n_boot, v.size)])
        value = float(np.median(v))
    else:
        boot, value = _boot_mean(v, n_boot, rng), float(v.mean())
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    return value, float(lo), float(hi)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control), in the input order.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(list(p_values), dtype=np.float64)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"p_values: expected probabilities in [0, 1], got {short_repr(p_values)}")
    order = np.argsort(p, kind="stable")
    m = p.size
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return [float(f"{x:.12g}") for x in out]  # 12 significant digits: a tiny exact p-value stays > 0


def format_p(p: float, floor: bool = False) -> str:
    """A p-value as the tables print it: three decimals, or two significant digits below 0.001;
    ``floor`` (no resample reached the observed statistic): ``< p``, the resampling floor, which is
    a bound and not a value. A p-value that underflowed to 0 prints as ``< 1e-300``.

    >>> format_p(0.04321), format_p(0.0001), format_p(1.0), format_p(1 / 10001, floor=True)
    ('0.043', '1.0e-04', '1.000', '< 1.0e-04')
    """
    from xmodal._validate import flag, short_repr

    try:
        p = float(p)
    except (TypeError, ValueError, RuntimeError, OverflowError):  # RuntimeError: a tensor of several values
        raise TypeError(f"p: expected a p-value, got {short_repr(p)}") from None
    floor = False if floor is None else flag(floor, "floor")
    if p != p:  # an undefined test (no query pairs) prints as before
        return "nan"
    if not 0 <= p <= 1 + 1e-9:  # a Holm product may round a hair above 1
        raise ValueError(f"p: expected a p-value in [0, 1], got {p}")
    if p == 0:
        return "< 1e-300"
    text = f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"
    return f"< {text}" if floor else text


def _digits_for(values: Sequence[float], digits: int) -> int:
    """The fewest decimals >= ``digits`` (at most ``digits + 2``) at which no value that is not zero
    at ``digits + 2`` decimals rounds to zero."""
    vals = [float(v) for v in values if round(float(v), digits + 2) != 0]
    for d in range(digits, digits + 3):
        if all(round(v, d) != 0 for v in vals):
            return d
    return digits + 2


def format_diff(x: float, digits: int = 2, like: Sequence[float] = ()) -> str:
    """A signed difference with ``digits`` decimals, more (up to ``digits + 2``) when it would round to
    zero, and ``0`` printed unsigned: never ``-0.0``. ``like``: other numbers printed beside it (an
    interval's ends) that must share its decimals.

    >>> format_diff(-0.04, 1), format_diff(-1e-12, 1), format_diff(2.345), format_diff(-0.0, 1)
    ('-0.04', '0.0', '+2.35', '0.0')
    """
    d = _digits_for([x, *like], digits)
    x = float(x)
    return f"{0.0:.{d}f}" if round(x, d) == 0 else f"{x:+.{d}f}"
