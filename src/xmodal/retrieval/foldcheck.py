"""Which normaliser an index folds: the one that serves text -> video on the gallery it is folded into.

A run selects its normaliser on its validation split, over both directions, on a gallery of its own
size. Folded into a million-video index the same normaliser can hurt: NCL's / Sinkhorn's gallery
bias, fitted from 2,000 train queries against 1M videos (500 videos a query), lowered text -> video
R@1 from 45.00 to 32.25 (issue 34). So the index build measures before it folds
(:func:`choose_fold`): held-out train captions of the run (``banks["heldout"]``, which no normaliser
was fitted on; their videos are added to the gallery as if it held them, with the bias the fitted
scaling gives them, :func:`xmodal.retrieval.index.gallery_bias`), or a split the user names, are
ranked against the gallery with and without the fold (:func:`fold_ranks`), and the fold is kept only
when it is clear of ``none`` by the paired rule of :mod:`xmodal.retrieval.selection` (the lower end
of the paired bootstrap interval of its text -> video R@1 + R@5 + R@10 minus ``none``'s above 0), and
only on :data:`MIN_FOLD_QUERIES` captions or more (fewer could not reach p < 0.05 even if every one
of them gained).

The measurement runs on a sample of the gallery (:func:`choose_on_sample`): the candidate is fitted on
:data:`SAMPLE_ROWS` seeded rows, and the videos each caption ranks highest (about its :data:`NEIGHBOURS` best
by cosine) and its own video get the bias that fit gives them, so a candidate that is not folded is
never fitted on the whole gallery. The Sinkhorn / NCL bias of a video depends on the rest of the gallery
only through the row scaling ``alpha``, an average over the gallery's videos that a uniform sample
estimates (Park et al. 2022, sec. 3.4); the near videos keep the top of each caption's ranking, which a
uniform sample alone would thin out (a 10% sample keeps one in ten of the videos that outrank a
caption's own).

The measurement grows in stages (:data:`STAGES`): a seeded 32 of the captions on 1,000 of the sampled
rows, then 128 on 8,000, then every caption on :data:`SAMPLE_ROWS`; each stage's captions and rows are a
subset of the next's. A stage where the fold is clearly worse than ``none`` (the upper end of the paired
interval below 0) ends it with ``none``: a clear decision against a fold then costs a fit on 1,000
rows and the scores of 32 captions against each gallery block, gathered as the build embeds it
(:class:`FirstStage`: no pass of its own). A fold is kept only on the last stage's measurement, so
the stages never fold what the single measurement would not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["fold_ranks", "choose_fold", "choose_on_sample", "fold_sample", "heldout_pairs", "describe_choice",
           "SAMPLE_ROWS", "NEIGHBOURS", "STAGES", "FirstStage"]

#: Gallery rows (a seeded sample, plus the captions' own videos) the candidate is fitted and measured on.
SAMPLE_ROWS = 50_000
#: Each caption's best-scoring videos (cosine) added to the sample: the videos competing for its top ranks.
NEIGHBOURS = 50

#: Videos a bank query may stand for before the build says the bank is small for the gallery.
SMALL_BANK_RATIO = 10
#: Fewest captions the fold is measured on before it can be called clear of ``none``. The paired
#: test's p-value is the two-sided sign flip of the per-caption differences, whose smallest value with
#: ``n`` captions (every one of them better with the fold) is ``2 / 2**n``: 0.0625 at 5 captions,
#: 0.03125 at 6. Below 6 no result could reach p < 0.05, and the bootstrap interval of 1 caption has
#: no width at all (p 1.0, yet its lower end above 0), so fewer captions fold ``none``.
MIN_FOLD_QUERIES = 6


def heldout_pairs(model: Any) -> dict | None:
    """The run's held-out train captions with their videos: ``{"text": [H, D], "video": [U, D] (distinct
    rows), "text_to_video": int [H] (rows of "video")}``, or None (runs whose held-out videos are not the
    captions' own: trained before issue 34)."""
    tt = getattr(model, "test_time", None)
    banks = getattr(tt, "banks", None) or {}
    if (getattr(tt, "hparams", None) or {}).get("heldout") != "pairs" or "heldout" not in banks:
        return None
    text, video = (b.detach().float().cpu() for b in banks["heldout"])
    if not len(text) or len(text) != len(video):
        return None
    unique, t2v = np.unique(video.numpy(), axis=0, return_inverse=True)  # several captions of one video
    return {"text": text, "video": torch.from_numpy(np.ascontiguousarray(unique)),
            "text_to_video": t2v.reshape(-1).astype(np.int64)}


def _column_terms(folded: dict, rows: torch.Tensor, extra: bool, start: int = 0) -> torch.Tensor:
    """Per-video terms that turn a block's cosine scores into the fold's, up to a constant per query:
    ``bias_j`` (Sinkhorn / NCL) and, for DN, ``-lam mu_x . y_j`` (``(x - a) . (y - b)`` ranks as
    ``x . y - a . y``)."""
    terms = torch.zeros(rows.shape[0])
    shift = folded.get("query_shift")
    if shift is not None:
        terms -= rows.float() @ torch.as_tensor(shift, dtype=torch.float32)
    bias = folded.get("extra_bias" if extra else "bias")
    if bias is None:
        return terms
    return terms + torch.as_tensor(bias, dtype=torch.float32).cpu()[start:start + rows.shape[0]]


def _check_folded(folded: Any, dim: int) -> None:
    """``folded`` is :func:`xmodal.retrieval.index.fold_run_normalizer`'s record: a ``normalizer`` name and,
    where present, a ``query_shift`` of ``dim`` finite values and finite ``bias`` / ``extra_bias`` vectors."""
    from xmodal._validate import short_repr

    if not isinstance(folded, dict) or not isinstance(folded.get("normalizer"), str):
        raise TypeError(f"folded: expected fold_run_normalizer's record (a dict with 'normalizer'), got "
                        f"{short_repr(folded)}")
    for key, size in (("query_shift", dim), ("bias", None), ("extra_bias", None)):
        v = folded.get(key)
        if v is None:
            continue
        try:
            t = torch.as_tensor(np.asarray(v, dtype=np.float32))
        except (TypeError, ValueError):
            raise TypeError(f"folded[{key!r}]: expected a float vector, got {short_repr(v)}") from None
        if t.ndim != 1 or (size is not None and t.shape[0] != size) or not bool(torch.isfinite(t).all()):
            raise ValueError(f"folded[{key!r}]: expected a finite vector" + (f" of {size} values" if size else "")
                             + f", got shape {list(t.shape)}")


@torch.no_grad()
def fold_ranks(rows: Any, folded: dict, queries: Any, text_to_video: Any, *, extra: Any = None,
               block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Text -> video ranks ``(without the fold, with it)`` of ``queries`` against the gallery ``rows``
    (``[N, D]``, a tensor or a row source read in blocks) followed by the ``extra`` videos (``[U, D]``).

    Args:
        rows: the gallery's embeddings (not shifted).
        folded: :func:`xmodal.retrieval.index.fold_run_normalizer` of ``rows`` (with ``extra=``: its
            ``"extra_bias"`` is the added videos' bias).
        queries: L2-normalised caption embeddings ``[H, D]``.
        text_to_video: int ``[H]``: each caption's video, a row of the measurement gallery (``< N``:
            a gallery row; ``N + u``: row ``u`` of ``extra``).
        block_rows: gallery rows per block (default: about 4M scores a block).

    Returns:
        int64 ``[H]`` 1-based ranks, pessimistic ties (every other video scoring at least as high
        comes first), without and with the fold.

    Shape:
        rows ``[N, D]``, queries ``[H, D]``, text_to_video ``[H]``, extra ``[U, D]`` -> ``[H]``, ``[H]``.
    """
    from xmodal._validate import float_matrix, int_array, positive_int, short_repr

    q = float_matrix(queries, "queries").detach().float().cpu()
    shape = getattr(rows, "shape", None)
    if not isinstance(rows, (torch.Tensor, np.ndarray)) and not hasattr(rows, "read_rows") and \
            not (shape is not None and hasattr(rows, "__getitem__")):
        raise TypeError(f"rows: expected gallery embeddings [N, D] (a tensor, an array or a row source), "
                        f"got {short_repr(rows)}")
    if shape is None or len(shape) != 2 or int(shape[1]) != q.shape[1]:
        raise ValueError(f"rows: expected [N, {q.shape[1]}] gallery embeddings (the queries' size), got shape "
                         f"{short_repr(shape)}")
    _check_folded(folded, q.shape[1])
    n = int(shape[0])
    x = None if extra is None else float_matrix(extra, "extra").detach().float().cpu()
    if x is not None and x.shape[1] != q.shape[1]:
        raise ValueError(f"extra: expected [U, {q.shape[1]}] embeddings, got {list(x.shape)}")
    total = n + (0 if x is None else x.shape[0])
    t2v = torch.as_tensor(int_array(text_to_video, "text_to_video"))
    if t2v.shape != (q.shape[0],) or (t2v.numel() and (int(t2v.min()) < 0 or int(t2v.max()) >= total)):
        raise ValueError(f"text_to_video: expected {q.shape[0]} rows in [0, {total})")
    block_rows = positive_int(block_rows, "block_rows") if block_rows is not None else \
        max(256, (1 << 22) // max(1, q.shape[0]))

    def blocks():  # (start, raw rows, fold terms) of the measurement gallery
        for start in range(0, n, block_rows):
            g = rows[start:min(n, start + block_rows)]
            g = torch.as_tensor(g.numpy() if hasattr(g, "numpy") else np.asarray(g)).float()
            yield start, g, _column_terms(folded, g, extra=False, start=start)
        if x is not None:
            yield n, x, _column_terms(folded, x, extra=True)

    # the positives' own scores (a dot product each, the same numbers as in their block's GEMM row)
    pos = torch.empty((q.shape[0], q.shape[1]))
    pos_terms = torch.empty(q.shape[0])
    for start, g, terms in blocks():
        inside = (t2v >= start) & (t2v < start + g.shape[0])
        if bool(inside.any()):
            pos[inside] = g[t2v[inside] - start]
            pos_terms[inside] = terms[t2v[inside] - start]
    own = (q * pos).sum(1)
    counts = [torch.zeros(q.shape[0], dtype=torch.int64) for _ in range(2)]
    for start, g, terms in blocks():
        s = q @ g.T
        mine = (t2v[:, None] == torch.arange(start, start + g.shape[0])[None, :])  # each caption's own video
        for c, scores, target in ((counts[0], s, own), (counts[1], s + terms[None, :], own + pos_terms)):
            c += ((scores >= target[:, None]) & ~mine).sum(1)
    return (1 + counts[0]).numpy(), (1 + counts[1]).numpy()


def _recalls(ranks: np.ndarray) -> dict:
    return {f"R@{k}": float(100.0 * np.mean(ranks <= k)) for k in (1, 5, 10)}


def choose_fold(rows: Any, folded: dict, queries: Any, text_to_video: Any, *, extra: Any = None,
                level: float = 0.95, n_boot: int = 10000, seed: int = 0) -> dict:
    """Whether the fold ``folded`` (a candidate's index form) is clear of ``none`` for text -> video on
    this gallery: :func:`fold_ranks`, then the paired bootstrap of the per-query
    ``100 * ([r <= 1] + [r <= 5] + [r <= 10])`` (fold minus none, queries resampled).

    Returns:
        ``{"candidate", "chosen", "rule", "metric", "queries", "none": {R@1, R@5, R@10},
        "fold": {R@1, R@5, R@10}, "test": {"diff", "ci_low", "ci_high", "p_value", "clear"}}``;
        ``chosen`` is the candidate when clear, else ``"none"``. Fewer than :data:`MIN_FOLD_QUERIES`
        captions are never clear: the record's ``"too_few"`` says so in one line.
    """
    from xmodal._validate import number, whole_number
    from xmodal.metrics.paired import paired_strata_test

    level = number(level, "level")
    if not 0 < level < 1:
        raise ValueError(f"level: expected a confidence level in (0, 1), got {level}")
    n_boot = whole_number(n_boot, "n_boot", minimum=1)
    seed = whole_number(seed, "seed")
    a, b = fold_ranks(rows, folded, queries, text_to_video, extra=extra)
    if len(a) == 0:
        raise ValueError("queries: expected at least one caption to measure the fold on")
    hits = lambda r: 100.0 * sum((r <= k).astype(np.float64) for k in (1, 5, 10))  # noqa: E731
    t = paired_strata_test([(hits(a), hits(b), 1.0)], n_boot=n_boot, seed=seed, level=level)
    few = len(a) < MIN_FOLD_QUERIES
    clear = bool(t["ci_low"] > 0) and not few
    record = {"candidate": folded["normalizer"], "chosen": folded["normalizer"] if clear else "none",
              "rule": "paired", "metric": "t2v R@1+R@5+R@10", "level": float(level), "queries": int(len(a)),
              "min_queries": MIN_FOLD_QUERIES, "none": _recalls(a), "fold": _recalls(b),
              "test": {"diff": t["diff"], "ci_low": t["ci_low"], "ci_high": t["ci_high"], "p_value": t["p_value"],
                       "clear": clear}}
    if few:
        record["too_few"] = (f"{len(a)} caption{'s' if len(a) != 1 else ''} to measure {folded['normalizer']} on, "
                             f"fewer than the {MIN_FOLD_QUERIES} the paired rule needs before it can call a "
                             f"normaliser clear (none folded)")
    return record


def _checked(rows: Any, queries: Any, text_to_video: Any, added: bool, size: int, neighbours: int, seed: int):
    """``(n, queries, text_to_video, size, neighbours, seed)`` of :func:`fold_sample`'s arguments, checked."""
    from xmodal._validate import float_matrix, int_array, short_repr, whole_number

    shape = getattr(rows, "shape", None)
    if isinstance(rows, (str, bytes)) or shape is None or len(shape) != 2 or not hasattr(rows, "__getitem__") \
            or not int(shape[0]) or not int(shape[1]):
        raise TypeError(f"rows: expected gallery embeddings [N, D] (a tensor, an array or a row source), got "
                        f"{short_repr(rows)}")
    n = int(shape[0])
    q = float_matrix(queries, "queries").detach().float().cpu()
    if q.shape[1] != int(shape[1]):
        raise ValueError(f"queries: expected [H, {int(shape[1])}] embeddings (the gallery's size), got {list(q.shape)}")
    size, neighbours = whole_number(size, "size", minimum=1), whole_number(neighbours, "neighbours")
    seed = whole_number(seed, "seed")
    if not isinstance(added, bool):
        raise TypeError(f"added: expected True or False, got {short_repr(added)}")
    t2v = np.asarray(int_array(text_to_video, "text_to_video"), dtype=np.int64)
    if t2v.shape != (q.shape[0],) or (t2v.size and (t2v.min() < (n if added else 0) or (not added and t2v.max() >= n))):
        raise ValueError(f"text_to_video: expected {q.shape[0]} videos, " +
                         (f"added after the gallery (>= {n})" if added else f"gallery rows in [0, {n})"))
    return n, q, t2v, size, neighbours, seed


def _sample(rows: Any, queries: Any, text_to_video: Any, added: bool, size: int, neighbours: int, seed: int,
            uniform: np.ndarray | None = None):
    """:func:`fold_sample`'s rows, with the uniform and near rows themselves (float32 tensors); ``uniform``:
    the gallery rows to sample (sorted; default the ``size`` seeded rows of ``sample_rows``)."""
    from xmodal.retrieval.recall import sample_rows
    from xmodal.retrieval.rowstore import take_rows

    n, q, t2v, size, neighbours, seed = _checked(rows, queries, text_to_video, added, size, neighbours, seed)
    if n <= size:
        return None
    uniform = sample_rows(n, size, seed) if uniform is None else uniform
    size = len(uniform)
    part = torch.from_numpy(np.ascontiguousarray(take_rows(rows, uniform), dtype=np.float32))
    hit_ids, hit_rows = [np.zeros(0, np.int64)], [torch.zeros((0, part.shape[1]))]
    threshold = None
    if neighbours:
        # the score of each caption's neighbours-th best video, estimated from the sample's
        # (neighbours * size / n)-th best (at least its best: n / size videos a caption expected): one pass
        # over the gallery then keeps about that many a caption (and the rows themselves, read in that pass:
        # no second read), of which each caption's `neighbours` best are kept
        k = max(1, min(size, int(np.ceil(neighbours * size / n))))
        threshold = torch.topk(q @ part.T, k, dim=1).values[:, -1].reshape(1, -1)
        step = max(256, (1 << 22) // max(1, q.shape[0]))
        for start in range(0, n, step):
            g = rows[start:min(n, start + step)]
            g = torch.as_tensor(g.detach().cpu().numpy() if hasattr(g, "detach") else np.asarray(g)).float()
            s = g @ q.T  # [b, H]: a video's margins over the captions' thresholds, reduced along the row
            s.sub_(threshold)
            hit = torch.nonzero(s.amax(1) >= 0).reshape(-1)  # twice as fast as comparing every score, then any()
            hit_ids.append(start + hit.numpy().astype(np.int64))
            hit_rows.append(g[hit])
    ids, kept = np.concatenate(hit_ids), torch.cat(hit_rows)  # ids ascending
    if neighbours and len(ids) > neighbours:  # each caption's `neighbours` best of them (a low threshold keeps more)
        chunk = max(1, (1 << 24) // len(ids))
        best = [torch.topk(q[i:i + chunk] @ kept.T, neighbours, dim=1).indices.reshape(-1)
                for i in range(0, q.shape[0], chunk)]
        sel = torch.unique(torch.cat(best))
        ids, kept = ids[sel.numpy()], kept[sel]
    near = np.setdiff1d(np.concatenate([ids, t2v[t2v < n]] if not added else [ids]), uniform).astype(np.int64)
    measured = np.concatenate([uniform, near])
    if added:
        mapped = t2v - n + len(measured)
    else:
        order = np.argsort(measured, kind="stable")
        mapped = order[np.searchsorted(measured[order], t2v)].astype(np.int64)
    at = np.minimum(np.searchsorted(ids, near), max(0, len(ids) - 1))
    found = (ids[at] == near) if len(ids) else np.zeros(len(near), bool)
    near_rows = torch.empty((len(near), part.shape[1]))
    near_rows[torch.from_numpy(found)] = kept[torch.from_numpy(at[found])]
    if not found.all():  # captions' own videos no caption's pass kept
        near_rows[torch.from_numpy(~found)] = torch.from_numpy(np.ascontiguousarray(
            take_rows(rows, near[~found]), dtype=np.float32).reshape(-1, part.shape[1]))
    return uniform, part, near, near_rows, mapped, threshold


def fold_sample(rows: Any, queries: Any, text_to_video: Any, *, added: bool, size: int = SAMPLE_ROWS,
                neighbours: int = NEIGHBOURS, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The gallery rows the fold is measured on: ``(uniform, near, text_to_video)``, or None when the gallery
    has at most ``size`` rows (all of it is measured).

    ``uniform``: ``size`` seeded rows (the candidate is fitted on them); ``near``: the other rows scoring at
    least each caption's ``neighbours``-th best score (cosine; estimated from the sample's, then one pass
    over the gallery: the videos that compete for its top ranks, about ``neighbours`` a caption) and, unless
    ``added``, the captions' own videos; ``text_to_video``: each caption's video as a row of the
    measurement gallery ``[rows[uniform], rows[near], added videos]`` (``added``: the captions' videos
    follow the gallery, ``text_to_video >= N``).

    Shape:
        rows ``[N, D]``, queries ``[H, D]``, text_to_video ``[H]`` -> ``[S]``, ``[M]``, ``[H]``.
    """
    got = _sample(rows, queries, text_to_video, added, size, neighbours, seed)
    return None if got is None else (got[0], got[2], got[4])


def choose_on_sample(rows: Any, fit: Any, queries: Any, text_to_video: Any, *, extra: Any = None,
                     size: int = SAMPLE_ROWS, neighbours: int = NEIGHBOURS, seed: int = 0,
                     n_boot: int = 10000, stages: Any = None, first: Any = None) -> tuple[dict, dict | None]:
    """:func:`choose_fold` on a sample of the gallery (:func:`fold_sample`): the candidate is fitted on
    ``size`` seeded rows only (``fit(gallery_rows [S, D], further_rows [U, D] or None)``,
    :func:`xmodal.retrieval.index.fold_run_normalizer` of the candidate with ``extra``), and the captions'
    near videos and own videos get the bias the fitted scaling gives them (one column update,
    :func:`xmodal.retrieval.index.gallery_bias`'s ``extra``), so a candidate not folded costs a fit on
    ``size`` rows and one pass of the captions over the gallery, never a fit on the gallery.

    The measurement grows in ``stages`` (default :data:`STAGES`): ``(captions, rows)`` pairs, each a seeded
    subset of the next stage's captions and sampled rows, measured the same way, then all captions on
    ``size`` rows. An earlier stage ends the measurement only when the fold is clearly worse than ``none``
    there (the upper end of the paired interval below 0: ``none`` is folded); a fold clear of ``none`` or
    a straddling interval goes on to the next stage, so a fold is only ever kept on the last stage's
    measurement. A stage with as many captions or rows as the last, or fewer than
    :data:`MIN_FOLD_QUERIES` captions, is skipped. ``first``: a :class:`FirstStage` that saw the gallery's
    rows as they were embedded; its rows replace the first stage's pass over the gallery.

    Returns:
        ``(record, folded)``: :func:`choose_fold`'s record (of the stage that decided) plus
        ``"sample_rows"`` (rows fitted on: the whole gallery when it is no larger), ``"near_rows"``,
        ``"captions"`` (held-out captions available; ``"queries"`` is how many were measured) and
        ``"stages"`` (each stage measured: ``queries``, ``sample_rows``, ``near_rows``, ``diff``,
        ``ci_low``, ``ci_high``), and ``folded``, the gallery's own fit when the sample is the whole
        gallery (else None: a folded candidate is then fitted on the gallery).
    """
    from xmodal._validate import float_matrix, short_repr

    if not callable(fit):
        raise TypeError(f"fit: expected a callable (gallery rows, further rows) -> folded record, got {short_repr(fit)}")
    plan = _stages(STAGES if stages is None else stages)
    x = None if extra is None else float_matrix(extra, "extra").detach().float().cpu()
    n, q, t2v, size, neighbours, seed = _checked(rows, queries, text_to_video, x is not None, size, neighbours, seed)
    if n <= size:
        folded = fit(rows, x)
        record = choose_fold(rows, folded, queries, text_to_video, extra=x, seed=seed, n_boot=n_boot)
        record.update(sample_rows=n, near_rows=0, captions=record["queries"], stages=[_stage_entry(record)])
        return record, folded
    h_all = q.shape[0]
    history, stages_ = [], _plan(n, h_all, size, seed, plan)
    for i, (captions, uniform) in enumerate(stages_):
        last = i == len(stages_) - 1
        picked = None
        if i == 0 and first is not None and not last:  # gathered while the gallery was embedded: no pass
            picked = first.result(n, captions, uniform, rows)
        record = _measure_on(rows, fit, q[captions], t2v[captions], x, uniform, size, neighbours, seed, n_boot,
                             picked=picked)
        history.append(_stage_entry(record))
        if last or record["test"]["ci_high"] < 0:
            break
    plan = stages_
    record.update(captions=int(h_all), stages=history)
    if len(history) < len(plan):
        record["stopped_early"] = (f"{record['candidate']} clearly worse than none on {record['queries']:,} of the "
                                   f"{h_all:,} captions (stage {len(history)} of {len(plan)}): measured no further")
    return record, None


#: The earlier stages of :func:`choose_on_sample`: ``(captions, sampled rows)``, before all captions on
#: :data:`SAMPLE_ROWS` rows. A candidate clearly worse than ``none`` on a stage is measured no further.
#: The first stage fits on 1,000 rows, not 2,000: its fit is most of a clear decision's fixed cost, which
#: weighs most where embedding is cheap (``bench/fold_sample.py --videos 200000``, docs/search.md).
STAGES = ((32, 1_000), (128, 8_000))


def _stages(stages: Any) -> list[tuple[int, int]]:
    """``stages`` checked: increasing ``(captions, rows)`` pairs of positive whole numbers."""
    from xmodal._validate import short_repr, whole_number

    if isinstance(stages, (str, bytes)) or not hasattr(stages, "__iter__"):
        raise TypeError(f"stages: expected (captions, rows) pairs, got {short_repr(stages)}")
    out = []
    for pair in stages:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"stages: expected (captions, rows) pairs, got {short_repr(pair)}")
        h, r = (whole_number(v, "stages", minimum=1) for v in pair)
        if out and (h <= out[-1][0] or r < out[-1][1]):
            raise ValueError(f"stages: expected more captions and no fewer rows each stage, got {short_repr(stages)}")
        out.append((h, r))
    return out


def _plan(n: int, h_all: int, size: int, seed: int, stages: list) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(captions, uniform rows)`` of each stage measured on a gallery of ``n > size`` rows: the checked
    ``stages`` with fewer captions and rows than the last, then every caption on ``size`` seeded rows."""
    from xmodal.retrieval.recall import sample_rows

    plan = [(h, r) for h, r in stages if MIN_FOLD_QUERIES <= h < h_all and r < size]
    uniform_all = sample_rows(n, size, seed)
    row_order = np.random.default_rng([seed, 1]).permutation(len(uniform_all))  # nested: each stage's rows
    caption_order = np.random.default_rng([seed, 2]).permutation(h_all)  # are a prefix of the next's
    return [(np.sort(caption_order[:h]), np.sort(uniform_all[row_order[:r]])) for h, r in plan] + \
        [(np.arange(h_all), uniform_all)]


class FirstStage:
    """The first stage of :func:`choose_on_sample`, gathered from the gallery's blocks as they are embedded
    (:meth:`add`, the build's one pass): its sampled rows and, for each of its captions, the ``neighbours``
    best videos (exact, a running top-k) with their rows, so that stage needs no pass of its own.

    Args: as :func:`choose_on_sample` (``n``: the gallery's rows; ``added``: the captions' videos follow
    the gallery). :attr:`active` is False where no earlier stage is measured (a gallery of at most ``size``
    rows, or too few captions); :meth:`add` then does nothing.
    """

    def __init__(self, n: int, queries: Any, text_to_video: Any, *, added: bool, size: int = SAMPLE_ROWS,
                 neighbours: int = NEIGHBOURS, seed: int = 0, stages: Any = None) -> None:
        from xmodal._validate import float_matrix, int_array, whole_number

        n, size = whole_number(n, "n", minimum=1), whole_number(size, "size", minimum=1)
        neighbours, seed = whole_number(neighbours, "neighbours"), whole_number(seed, "seed")
        q = float_matrix(queries, "queries").detach().float().cpu()
        t2v = np.asarray(int_array(text_to_video, "text_to_video"), dtype=np.int64)
        if t2v.shape != (q.shape[0],):
            raise ValueError(f"text_to_video: expected {q.shape[0]} videos")
        plan = _plan(n, q.shape[0], size, seed, _stages(STAGES if stages is None else stages)) if n > size else []
        self.active = len(plan) > 1
        self.n, self.added, self._filled = n, bool(added), 0
        if not self.active:
            return
        self.captions, self.uniform = plan[0]
        self.q = q[torch.from_numpy(self.captions)]
        own = t2v[self.captions]
        self.own = np.unique(own[own < n]) if not added else np.zeros(0, np.int64)
        self.k = min(neighbours, n)
        h = self.q.shape[0]
        self.best = torch.full((self.k, h), float("-inf"))
        self.best_ids = torch.full((self.k, h), -1, dtype=torch.int64)
        self.part = self.own_rows = None

    def add(self, start: int, block: Any) -> None:
        """The gallery's rows ``start ..`` (``[b, D]`` embeddings, in order)."""
        if not self.active:
            return
        g = torch.as_tensor(block.detach().cpu().numpy() if hasattr(block, "detach") else np.asarray(block)).float()
        if start != self._filled or g.ndim != 2 or g.shape[1] != self.q.shape[1]:
            raise ValueError(f"block: expected the gallery's rows from {self._filled} on, [b, {self.q.shape[1]}]")
        stop = start + g.shape[0]
        self._filled = stop
        if self.part is None:
            self.part = torch.empty((len(self.uniform), g.shape[1]))
            self.own_rows = torch.empty((len(self.own), g.shape[1]))
        for rows_at, into in ((self.uniform, self.part), (self.own, self.own_rows)):
            lo, hi = np.searchsorted(rows_at, [start, stop])
            into[lo:hi] = g[torch.from_numpy(rows_at[lo:hi] - start)]
        if not self.k:
            return
        s = g @ self.q.T  # [b, h]; a row is a candidate where it reaches some caption's running k-th best
        hit = torch.nonzero((s - self.best[-1]).amax(1) >= 0).reshape(-1)
        if not len(hit):
            return
        # only the running best's ids: their rows are read once at the end (:meth:`result`), the few
        # thousand a stage needs, rather than copied block by block as the best changes
        ids = torch.cat([self.best_ids, (start + hit)[:, None].expand(-1, self.q.shape[0])])
        top = torch.topk(torch.cat([self.best, s[hit]]), self.k, dim=0)
        self.best, self.best_ids = top.values, torch.gather(ids, 0, top.indices)

    def result(self, n: int, captions: np.ndarray, uniform: np.ndarray, rows: Any = None):
        """:func:`_sample`'s tuple for the first stage (``captions`` / ``uniform``: the stage expected),
        or None where this collector saw another stage or not the whole gallery; ``rows``: the gallery the
        near rows are read from (the rows :meth:`add` saw; None: a stage with no near rows)."""
        if not self.active or n != self.n or self._filled != n or not np.array_equal(captions, self.captions) \
                or not np.array_equal(uniform, self.uniform):
            return None
        best = np.unique(self.best_ids.numpy())
        best = best[best >= 0]
        near = np.setdiff1d(np.concatenate([best, self.own]), self.uniform).astype(np.int64)
        d = self.part.shape[1]
        near_rows = torch.empty((len(near), d))
        mine = np.isin(near, self.own)  # the captions' own videos were kept in the pass
        if mine.any():
            near_rows[torch.from_numpy(mine)] = self.own_rows[torch.from_numpy(np.searchsorted(self.own, near[mine]))]
        if (~mine).any():
            if rows is None:
                return None
            from xmodal.retrieval.rowstore import take_rows

            got = np.ascontiguousarray(take_rows(rows, near[~mine]), dtype=np.float32).reshape(-1, d)
            near_rows[torch.from_numpy(~mine)] = torch.from_numpy(got)
        return self.uniform, self.part, near, near_rows, None, self.best[-1].reshape(1, -1)


def _stage_entry(record: dict) -> dict:
    t = record["test"]
    return {"queries": int(record["queries"]), "sample_rows": record.get("sample_rows"),
            "near_rows": record.get("near_rows", 0), "added_rows": record.get("added_rows", 0), "diff": t["diff"],
            "ci_low": t["ci_low"], "ci_high": t["ci_high"]}


def _measure_on(rows: Any, fit: Any, q: torch.Tensor, t2v: np.ndarray, x: torch.Tensor | None, uniform: np.ndarray,
                size: int, neighbours: int, seed: int, n_boot: int, picked: tuple | None = None) -> dict:
    """:func:`choose_fold` of the captions ``q`` on the gallery rows ``uniform`` and the captions' near rows,
    the candidate fitted on ``uniform`` (one stage of :func:`choose_on_sample`; ``picked``: those rows
    already gathered, :meth:`FirstStage.result`)."""
    if picked is None:
        picked = _sample(rows, q, t2v, x is not None, size, neighbours, seed, uniform=uniform)
    _, part, near, near_rows, mapped, threshold = picked
    if mapped is None:  # each caption's video as a row of [uniform, near, added videos]
        n, measured = int(rows.shape[0]), np.concatenate([uniform, near])
        order = np.argsort(measured, kind="stable")
        mapped = t2v - n + len(measured) if x is not None else \
            order[np.searchsorted(measured[order], t2v)].astype(np.int64)
    if x is not None:  # the added videos as the gallery's rows: the captions' own and those reaching a threshold
        n_measured = part.shape[0] + near_rows.shape[0]
        own = mapped - n_measured
        keep = np.unique(own)
        if threshold is not None:
            reach = torch.nonzero((q @ x.T - threshold.reshape(-1, 1)).amax(0) >= 0).reshape(-1).numpy()
            keep = np.union1d(keep, reach)
        if len(keep) < len(x):
            x, mapped = x[torch.from_numpy(keep)], n_measured + np.searchsorted(keep, own)
    further = near_rows if x is None else torch.cat([near_rows, x])
    fitted = fit(part, further if len(further) else None)
    _check_folded(fitted, part.shape[1])
    folded = {"normalizer": fitted["normalizer"], "query_shift": fitted.get("query_shift"), "bias": None}
    if fitted.get("bias") is not None:
        bias = torch.as_tensor(fitted["bias"]).float().cpu()
        more = fitted.get("extra_bias") if len(further) else torch.zeros(0)
        if more is None or len(more) != len(further):
            raise ValueError(f"fit: expected an extra_bias of {len(further)} values for the further rows")
        more = torch.as_tensor(more).float().cpu()
        folded["bias"] = torch.cat([bias, more[:len(near)]])
        if x is not None:
            folded["extra_bias"] = more[len(near):]
    record = choose_fold(torch.cat([part, near_rows]), folded, q, mapped, extra=x, seed=seed, n_boot=n_boot)
    record.update(sample_rows=int(len(uniform)), near_rows=int(len(near)), added_rows=0 if x is None else len(x))
    return record


def describe_choice(record: dict) -> str:
    """One line: how the index's normaliser was chosen (``xmodal index`` prints it, the search page shows it)."""
    if not isinstance(record, dict):
        return ""
    if "test" not in record:
        return str(record.get("why", ""))
    cand, n, f, t = record["candidate"], record["none"], record["fold"], record["test"]
    where = f"{record['queries']:,} {record.get('source', 'captions')}"
    if record.get("captions", record["queries"]) > record["queries"]:
        where = f"{record['queries']:,} of the {record['captions']:,} {record.get('source', 'captions')}"
    sample, gallery = record.get("sample_rows"), record.get("gallery", 0)
    of = f"a seeded sample of {sample:,} of the {gallery:,} gallery videos and the captions' " \
         f"{record.get('near_rows', 0):,} nearest" if sample and sample < gallery else \
        f"the {gallery:,}-video gallery"
    if record.get("added_videos"):
        used = record.get("added_rows", record["added_videos"])
        where += (f" (their {used:,} videos added to {of})" if used == record["added_videos"] else
                  f" ({used:,} of the {record['added_videos']:,} added videos, theirs and those near them, added "
                  f"to {of})")
    elif sample and sample < gallery:
        where += f" against {of} (their own videos included)"
    if record.get("too_few"):
        return f"measured on {where}: {record['too_few']}"
    verdict = (f"{cand} is clear of none, folded" if t["clear"] else
               f"{cand} is clearly worse than none, none folded (measured no further)" if record.get("stopped_early")
               else f"{cand} is not clear of none, none folded")
    return (f"measured on {where}: {cand} t2v R@1 {f['R@1']:.2f} / R@10 {f['R@10']:.2f} vs none "
            f"{n['R@1']:.2f} / {n['R@10']:.2f}; R@1+5+10 {t['diff']:+.2f} [{t['ci_low']:.2f}, {t['ci_high']:.2f}]: "
            f"{verdict}")


def bank_note(name: str, bank_rows: int, gallery: int) -> str | None:
    """A line when a Sinkhorn / NCL bank is much smaller than the gallery its bias is fitted on."""
    if name not in ("sinkhorn", "ncl") or bank_rows <= 0 or gallery <= SMALL_BANK_RATIO * bank_rows:
        return None
    return (f"the {name} bias is fitted from {bank_rows:,} stored train queries against {gallery:,} videos "
            f"({gallery // bank_rows:,} videos a query): a bank much smaller than the gallery")
