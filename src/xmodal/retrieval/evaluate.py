"""Evaluating a trained model on a split: embeddings -> test-time normaliser -> retrieval metrics.

Kept out of the training loop (open_clip's ``evaluate``): the trainer, ``xmodal eval``
and users call the same functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xmodal._validate import as_tensor, duck, option, positive_int, short_repr

__all__ = ["embed_split", "retrieval_metrics", "query_results", "score", "score_terms", "evaluate",
           "evaluate_normalizers", "group_metrics", "group_ranks", "mean_pooled_groups"]


def _check_inputs(model, split, batch_size) -> int:
    """``TypeError`` naming ``model`` / ``split`` when they are not a model and a split; the batch size."""
    duck(model, "model", "a model (encode_video, encode_text)", ("encode_video", "encode_text"))
    duck(split, "split", "a PairedSplit", ("video_input",), ("text", "text_to_video"))
    return positive_int(batch_size, "batch_size")


@torch.no_grad()
def embed_split(model, split, batch_size: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """(text embeddings ``[M, D]``, video embeddings ``[N, D]``), L2-normalised, float32.

    The split's frame mask and experts (``split.video_input()``) go to ``encode_video``, its
    token mask (``split.text_input()``, token features) to ``encode_text``.
    """
    batch_size = _check_inputs(model, split, batch_size)
    video = model.encode_video(*split.video_input(), batch_size=batch_size)
    text, text_mask = split.text_input() if hasattr(split, "text_input") else (split.text, None)
    return model.encode_text(text, text_mask, batch_size=batch_size), video


def retrieval_metrics(sim_t2v: torch.Tensor, sim_v2t: torch.Tensor | None, text_to_video: np.ndarray,
                      relevancy: np.ndarray | None = None, *, ks=(1, 5, 10, 50), ties: str = "pessimistic",
                      v2t: str = "all-captions", block_size: int | None = None) -> dict:
    """``{"t2v": {...}, "v2t": {...}}`` as ``xmodal.metrics.text_video``, where each direction
    may come from its own (normalised) similarity matrix ``[M, N]`` / ``[N, M]``
    (``sim_v2t=None``: the transpose of ``sim_t2v``). This is the protocol of the trainer's
    ``metrics.json`` and of ``xmodal eval --run`` (the defaults are the trainer's); ``ks``,
    ``ties``, ``v2t`` (``all-captions`` or ``max-over-captions``) and ``block_size`` as in
    :func:`xmodal.metrics.text_video`.

    With ``relevancy`` ``[M, N]`` (texts x videos, e.g. ``split.mir_relevancy()``) each
    direction also gets ``"mAP"`` and ``"nDCG"`` (EPIC-100 MIR, :func:`xmodal.metrics.mir`;
    v2t on the transposed relevancy), the metrics TS++ reports (thesis Table 5.1).

    >>> sim = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    >>> m = retrieval_metrics(sim, None, np.array([0, 1]), np.eye(2))
    >>> m["t2v"]["R@1"], m["t2v"]["mAP"], m["v2t"]["nDCG"]
    (100.0, 100.0, 100.0)
    """
    from xmodal.metrics import mir, retrieval, text_video

    opts = {"ks": ks, "ties": ties, "block_size": block_size}
    sim_t2v = as_tensor(sim_t2v, "sim_t2v")
    if sim_t2v.ndim != 2:
        raise ValueError(f"sim_t2v: expected 2 dimensions [texts, videos], got shape {tuple(sim_t2v.shape)}")
    v2t = option(v2t, "v2t", ("all-captions", "max-over-captions"))
    if sim_v2t is not None:
        sim_v2t = as_tensor(sim_v2t, "sim_v2t")
        if sim_v2t.ndim != 2:
            raise ValueError(f"sim_v2t: expected 2 dimensions [videos, texts], got shape {tuple(sim_v2t.shape)}")
    if sim_v2t is None:
        out = text_video(sim_t2v, text_to_video, v2t=v2t, **opts)
    elif v2t == "all-captions":
        t2v = as_tensor(text_to_video, "text_to_video")
        if t2v.ndim != 1 or t2v.dtype == torch.bool or t2v.is_floating_point() or t2v.is_complex():
            raise TypeError(f"text_to_video: expected integer video indices [texts], got {t2v.dtype} "
                            f"of shape {tuple(t2v.shape)}")
        t2v_metrics = retrieval(sim_t2v, t2v, **opts)  # checks sim_t2v / text_to_video before they are combined
        own = t2v[None, :] == torch.arange(sim_v2t.shape[0])[:, None]
        out = {"t2v": t2v_metrics, "v2t": retrieval(sim_v2t, own.to(sim_v2t.device), **opts)}
    else:  # text_video ranks the transpose of its input for v2t: give it the v2t scores transposed
        out = {"t2v": retrieval(sim_t2v, as_tensor(text_to_video, "text_to_video"), **opts),
               "v2t": text_video(sim_v2t.T, text_to_video, v2t=v2t, **opts)["v2t"]}
    if relevancy is not None:
        if ties not in ("pessimistic", "optimistic"):  # a string: retrieval checked it
            raise ValueError(f"ties: mAP / nDCG support pessimistic or optimistic, got {short_repr(ties)}")
        rel = torch.as_tensor(np.asarray(relevancy, dtype=np.float32))
        v2t_sim = sim_t2v.T if sim_v2t is None else sim_v2t
        for direction, sim, r in (("t2v", sim_t2v, rel), ("v2t", v2t_sim, rel.T)):
            out[direction].update(mir(sim, r.contiguous().to(sim.device), ties=ties))
    return out


def query_results(sim_t2v: torch.Tensor, sim_v2t: torch.Tensor | None, text_to_video: np.ndarray,
                  relevancy: np.ndarray | None = None, *, ties: str = "pessimistic",
                  v2t: str = "all-captions") -> dict:
    """The per-query values behind :func:`retrieval_metrics` (same arguments, same protocol):
    ``{"t2v": {"rank": int32 [M]}, "v2t": {"rank": int32 [N]}}``, each rank 1-based (the rank of
    the query's best-ranked correct item under ``ties``), and with ``relevancy`` each direction's
    ``"ap"`` / ``"ndcg"`` (float32, percent, NaN for a query without one). ``R@K`` of
    :func:`retrieval_metrics` is ``100 * mean(rank <= K)``, ``MnR`` / ``MdR`` the mean / median
    rank, ``mAP`` / ``nDCG`` the NaN-skipping mean: what ``RUN/per_query.npz`` stores and
    :func:`xmodal.metrics.paired_test` compares.

    >>> sim = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.6]])
    >>> r = query_results(sim, None, np.array([0, 1, 1]))
    >>> r["t2v"]["rank"].tolist(), r["v2t"]["rank"].tolist()
    ([1, 1, 2], [1, 1])
    """
    from xmodal.metrics import mir_per_query, query_ranks, text_video_ranks

    sim_t2v = as_tensor(sim_t2v, "sim_t2v")
    v2t = option(v2t, "v2t", ("all-captions", "max-over-captions"))
    ties = option(ties, "ties", ("pessimistic", "optimistic"))  # one integer rank per query
    if sim_v2t is None:
        ranks = text_video_ranks(sim_t2v, text_to_video, ties=ties, v2t=v2t)
    else:
        sim_v2t = as_tensor(sim_v2t, "sim_v2t")
        if sim_v2t.ndim != 2:
            raise ValueError(f"sim_v2t: expected 2 dimensions [videos, texts], got shape {tuple(sim_v2t.shape)}")
        t2v = as_tensor(text_to_video, "text_to_video")
        if t2v.ndim != 1:
            raise ValueError(f"text_to_video: expected one video index per text [M], got shape {tuple(t2v.shape)}")
        if v2t == "all-captions":
            own = t2v[None, :] == torch.arange(sim_v2t.shape[0])[:, None]
            ranks = {"t2v": query_ranks(sim_t2v, t2v, ties), "v2t": query_ranks(sim_v2t, own.to(sim_v2t.device), ties)}
        else:
            ranks = {"t2v": query_ranks(sim_t2v, t2v, ties),
                     "v2t": text_video_ranks(sim_v2t.T, text_to_video, ties=ties, v2t=v2t)["v2t"]}
    out = {d: {"rank": r.astype(np.int32)} for d, r in ranks.items()}
    if relevancy is not None:
        rel = np.asarray(relevancy, dtype=np.float32)
        v2t_sim = sim_t2v.T if sim_v2t is None else sim_v2t
        for direction, sim, r in (("t2v", sim_t2v, rel), ("v2t", v2t_sim, rel.T)):
            for key, values in mir_per_query(sim, np.ascontiguousarray(r), ties=ties).items():
                out[direction][key] = values.astype(np.float32)
    return out


METRICS = ("rsum", "r1", "map", "p2v_rsum")


def score(metrics: dict, metric: str) -> float:
    """Early-stopping / selection score: ``rsum`` (sum of R@1,5,10 both ways), ``r1``
    (mean of t2v and v2t R@1), ``map`` (mAP T->V: TS++ "the best iteration is selected
    based on mAP T->V metric", thesis Table 5.1; needs metrics with relevancy) or
    ``p2v_rsum`` (sum of R@1,5,10 of p2v and v2p; needs a split with groups)."""
    from xmodal._validate import short_repr

    if not isinstance(metric, str) or metric not in METRICS:
        raise ValueError(f"metric: unknown value {short_repr(metric)}; expected one of {', '.join(METRICS)}")
    if not (isinstance(metrics, dict) and all(isinstance(metrics.get(d), dict) for d in ("t2v", "v2t"))):
        raise TypeError("metrics: expected {'t2v': {...}, 'v2t': {...}} as retrieval_metrics returns")
    if metric == "map":
        if "mAP" not in metrics["t2v"]:
            raise ValueError("metric: 'map' needs mAP, i.e. a split with relevancy (or video labels)")
        return float(metrics["t2v"]["mAP"])
    if metric == "p2v_rsum":
        if "p2v" not in metrics:
            raise ValueError("metric: 'p2v_rsum' needs a validation split with groups (S_video_to_group.npy)")
        return sum(metrics[d][f"R@{k}"] for d in ("p2v", "v2p") for k in (1, 5, 10))
    if metric == "r1":
        return 0.5 * (metrics["t2v"]["R@1"] + metrics["v2t"]["R@1"])
    return sum(metrics[d][f"R@{k}"] for d in ("t2v", "v2t") for k in (1, 5, 10))


def score_terms(per_query: dict, metric: str) -> list[tuple[np.ndarray, float]]:
    """:func:`score` as per-query terms: ``[(values [Q_s], weight), ...]`` with
    ``score == sum(weight * values.mean())`` (each direction's queries one stratum), the
    input of :func:`xmodal.metrics.paired_strata_test` (normaliser selection).

    Args:
        per_query: one normaliser's :func:`query_results` (``{"t2v": {"rank": ...}, ...}``).
        metric: as :func:`score`.

    >>> pq = {"t2v": {"rank": np.array([1, 11])}, "v2t": {"rank": np.array([2])}}
    >>> [(v.tolist(), w) for v, w in score_terms(pq, "rsum")]
    [([300.0, 0.0], 1.0), ([200.0], 1.0)]
    """
    from xmodal._validate import short_repr

    if not isinstance(metric, str) or metric not in METRICS:
        raise ValueError(f"metric: unknown value {short_repr(metric)}; expected one of {', '.join(METRICS)}")

    def hits(direction: str) -> np.ndarray:
        if direction not in per_query:
            raise ValueError(f"metric: {metric!r} needs per-query {direction} ranks")
        r = np.asarray(per_query[direction]["rank"])
        return 100.0 * sum((r <= k).astype(np.float64) for k in (1, 5, 10))

    if metric == "map":
        ap = per_query.get("t2v", {}).get("ap")
        if ap is None:
            raise ValueError("metric: 'map' needs per-query AP, i.e. a split with relevancy")
        ap = np.asarray(ap, dtype=np.float64)
        return [(ap[~np.isnan(ap)], 1.0)]
    if metric == "r1":
        return [(100.0 * (np.asarray(per_query[d]["rank"]) <= 1), 0.5) for d in ("t2v", "v2t")]
    return [(hits(d), 1.0) for d in (("p2v", "v2p") if metric == "p2v_rsum" else ("t2v", "v2t"))]


def evaluate_normalizers(names: list[str], test_time: Any, model, split, batch_size: int = 8192,
                         per_query: dict | None = None) -> dict[str, dict]:
    """Metrics of ``split`` under each normaliser: ``{name: {"t2v": ..., "v2t": ...}}``.

    ``test_time``: a :class:`~xmodal.retrieval.testtime.TestTime` (or the dict form of older runs).
    With a relevancy (``split.mir_relevancy()``: a relevancy file or video labels) each
    direction also holds ``mAP`` and ``nDCG``. ``per_query``: a dict filled with each name's
    per-query values (:func:`query_results`, plus ``p2v`` / ``v2p`` ranks on a split with groups).
    """
    from xmodal._validate import short_repr
    from xmodal.retrieval.testtime import TestTime

    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names: expected a list of normaliser names, got {short_repr(names)}")
    _check_inputs(model, split, batch_size)
    tt = test_time if isinstance(test_time, TestTime) else TestTime.from_state_dict(test_time)
    text, video = embed_split(model, split, batch_size)
    rel = split.mir_relevancy() if hasattr(split, "mir_relevancy") else None
    if per_query is not None and not isinstance(per_query, dict):
        raise TypeError(f"per_query: expected a dict to fill or None, got {type(per_query).__name__}")
    # p2v / v2p: the same under every normaliser (see group_metrics)
    groups = group_metrics(model, split, batch_size)
    pooled = group_ranks(model, split, batch_size) if per_query is not None else {}
    out = {}
    for name in names:
        sims = tt.similarities(text, video, name)
        out[name] = {**retrieval_metrics(*sims, split.text_to_video, rel), **groups}
        if per_query is not None:
            per_query[name] = {**query_results(*sims, split.text_to_video, rel), **pooled}
    return out


@torch.no_grad()
def group_metrics(model, split, batch_size: int = 8192, **kwargs: Any) -> dict:
    """``{"p2v": ..., "v2p": ...}`` (paragraph -> video, video -> paragraph; the keys of
    ``t2v``) on a split with groups (``video_to_group``), else ``{}``; a hierarchical model
    also gets ``"p2v_flat"`` / ``"v2p_flat"``, the flat reference: its own clip (sentence)
    embeddings mean-pooled, so a user sees whether the global level helps.

    Queries and gallery are the groups that have a paragraph (at least one text); each
    paragraph's one correct video is its own. Embeddings: a hierarchical model's global
    towers (:meth:`~xmodal.models.hierarchy.HierarchicalTwoTower.encode_groups`); any other
    model's normalised clip (sentence) embeddings averaged over the group (paragraph) and
    renormalised ("mean-pooled clips"). Scores are cosine similarities: the run's test-time
    normalisers are fitted on clip/sentence embeddings and are not applied at the paragraph
    level, so every normaliser entry of ``metrics.json`` holds the same ``p2v``/``v2p``.
    ``kwargs`` go to :func:`xmodal.metrics.text_video` (``ks``, ``ties``).
    """
    from xmodal.metrics import text_video

    if getattr(split, "video_to_group", None) is None:
        return {}
    paragraph, video = mean_pooled_groups(model, split, batch_size)
    flat = text_video(paragraph @ video.T, np.arange(paragraph.shape[0]), **kwargs)
    if not hasattr(model, "encode_groups"):
        return {"p2v": flat["t2v"], "v2p": flat["v2t"]}
    paragraph, video, _ = model.encode_groups(*split.video_input(), split.text, split.text_to_video,
                                              split.video_to_group, batch_size=batch_size,
                                              text_mask=getattr(split, "text_mask", None))
    out = text_video(paragraph @ video.T, np.arange(paragraph.shape[0]), **kwargs)
    return {"p2v": out["t2v"], "v2p": out["v2t"], "p2v_flat": flat["t2v"], "v2p_flat": flat["v2t"]}


@torch.no_grad()
def group_ranks(model, split, batch_size: int = 8192) -> dict:
    """Per-query ranks of :func:`group_metrics` (same embeddings, pessimistic ties):
    ``{"p2v": {"rank": int32 [P]}, "v2p": {"rank": int32 [P]}}``, ``{}`` without groups."""
    from xmodal.metrics import text_video_ranks

    if getattr(split, "video_to_group", None) is None:
        return {}
    if hasattr(model, "encode_groups"):
        paragraph, video, _ = model.encode_groups(*split.video_input(), split.text, split.text_to_video,
                                                  split.video_to_group, batch_size=batch_size,
                                                  text_mask=getattr(split, "text_mask", None))
    else:
        paragraph, video = mean_pooled_groups(model, split, batch_size)
    ranks = text_video_ranks(paragraph @ video.T, np.arange(paragraph.shape[0]))
    return {"p2v": {"rank": ranks["t2v"].astype(np.int32)}, "v2p": {"rank": ranks["v2t"].astype(np.int32)}}


@torch.no_grad()
def mean_pooled_groups(model, split, batch_size: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """``(paragraphs [P, D], videos [P, D])``: the mean of the normalised clip (sentence)
    embeddings of each group that has a paragraph, renormalised (the flat model's
    paragraph-level baseline)."""
    from torch.nn import functional as F

    _check_inputs(model, split, batch_size)
    if getattr(split, "video_to_group", None) is None:
        raise ValueError("split: has no groups (video_to_group); mean-pooled paragraphs need them")
    text, video = embed_split(model, split, batch_size)
    g = torch.as_tensor(split.video_to_group, device=video.device)
    tg = g[torch.as_tensor(split.text_to_video, device=video.device)]
    have = torch.unique(tg)
    n = int(g.max()) + 1
    pool = lambda x, owner: x.new_zeros(n, x.shape[1]).index_add_(0, owner, x)[have]  # noqa: E731
    return F.normalize(pool(text, tg), dim=-1), F.normalize(pool(video, g), dim=-1)


def evaluate(model, split, normalizer: str | None = None, batch_size: int = 8192) -> dict:
    """Metrics of a loaded model on a split with its selected (or the given) normaliser."""
    if normalizer is not None and not isinstance(normalizer, str):
        raise TypeError(f"normalizer: expected a normaliser name or None, got {type(normalizer).__name__}")
    _check_inputs(model, split, batch_size)
    duck(model, "model", "a loaded model (with test_time)", attrs=("test_time",))
    name = normalizer or "selected"
    return evaluate_normalizers([name], model.test_time, model, split, batch_size)[name]
