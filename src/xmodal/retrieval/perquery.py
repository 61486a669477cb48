"""Per-query results and the protocol card of an evaluation: what ``xmodal compare`` reads.

``RUN/per_query.npz`` (written by ``xmodal train``, ``xmodal eval --run --per-query`` and
``xmodal bench``'s runs) holds plain arrays, no pickle:

* ``"{split}/{normalizer}/{direction}/rank"``: int32, each query's 1-based rank of its
  best-ranked correct item (pessimistic ties), ``direction`` in ``t2v``, ``v2t`` and, on a
  split with groups, ``p2v``, ``v2p``;
* ``"{split}/{normalizer}/{direction}/ap"`` and ``.../ndcg``: float32, percent, NaN for a
  query without one, where the split has a relevancy;
* ``"{split}/protocol"``: the split's protocol card as JSON text (a 0-d unicode array), the
  same dict as ``metrics.json[split]["protocol"]``;
* ``"{split}/query_id/{direction}"``: uint8 ``[Q, 16]``, each query's identity for every
  direction, p2v / v2p included (:func:`query_ids`: a digest of the query's features and of its
  correct items' features), so that two files are paired query by query whatever order their
  splits list the queries in;
* ``"xmodal"``: the writer's mark, JSON ``{"writer": "xmodal train" | "xmodal eval --per-query",
  "format": 2}`` (``eval --per-query`` replaces only a file that carries its own mark).

Files are read back by :func:`xmodal.retrieval.perquery_read.read_per_query` (bounded, checked).

The **protocol card** (:func:`protocol_card`) says how a split's numbers were made:
``num_queries`` and ``gallery_size`` per direction, ``chance_r1`` (the R@1 in percent of a
random ranking), ``caption_policy`` (``all`` captions as queries, or ``one-per-video`` when
every video has one), ``v2t`` (the video -> text protocol), ``tie_rule``, the selected
``normalizer`` with its ``bank_source`` and ``uses_test_queries`` (and both for every
normaliser of the split under ``normalizers``), ``split_sha256`` (:func:`split_sha256`)
and the code's ``git_revision`` / ``git_dirty``. Two results are comparable when the fields
of :data:`PROTOCOL_FIELDS` agree (:func:`card_differences`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from xmodal._validate import duck, int_array, short_repr

__all__ = ["PROTOCOL_FIELDS", "split_sha256", "arrays_sha256", "protocol_card", "bank_source",
           "write_per_query", "card_differences", "normalizer_card", "query_ids"]

NAME = "per_query.npz"
#: What a per-query entry holds: 1-based ranks, AP and nDCG in percent.
KINDS = ("rank", "ap", "ndcg")
#: The entry holding the writer's mark.
WRITER_KEY = "xmodal"
FORMAT = 2
#: Fields of two protocol cards that must agree for a paired comparison.
PROTOCOL_FIELDS = ("num_queries", "gallery_size", "chance_r1", "caption_policy", "v2t", "tie_rule",
                   "split_sha256", "uses_test_queries")
_ROW_BYTES = 1 << 24


def arrays_sha256(arrays: dict[str, Any]) -> str:
    """SHA-256 over named arrays (name, dtype, shape and bytes of each, in sorted name order;
    ``None`` entries skipped; a dict value is hashed as ``name:key`` entries). Memory-mapped
    arrays are read in blocks of rows, never copied whole. Real floating arrays are hashed as the
    float32 numbers the models read (a float16 layout and its float32 copy in memory hash alike).

    >>> arrays_sha256({"a": np.arange(3)}) == arrays_sha256({"a": np.arange(3), "b": None})
    True
    """
    if not isinstance(arrays, dict) or not all(isinstance(k, str) for k in arrays):
        raise TypeError(f"arrays: expected {{name: array}}, got {short_repr(arrays)}")
    flat: dict[str, np.ndarray] = {}
    for name, x in arrays.items():
        if isinstance(x, dict) and not all(isinstance(k, str) for k in x):
            raise TypeError(f"arrays[{name!r}]: expected {{name: array}}, got {short_repr(x)}")
        if isinstance(x, dict):
            flat.update({f"{name}:{k}": v for k, v in x.items() if v is not None})
        elif x is not None:
            flat[name] = x
    h = hashlib.sha256()
    for name in sorted(flat):
        x = flat[name]
        x = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
        if x.dtype.kind not in "biufc":
            raise TypeError(f"arrays[{name!r}]: expected a numeric array, got {x.dtype}")
        as_f32 = x.dtype.kind == "f"
        h.update(f"{name}|{np.dtype(np.float32).str if as_f32 else x.dtype.str}|{x.shape}\n".encode())
        rows = max(1, _ROW_BYTES // max(1, x[:1].nbytes)) if x.ndim else 1
        for start in range(0, max(1, x.shape[0] if x.ndim else 1), rows):
            block = x[start:start + rows] if x.ndim else x
            h.update(np.ascontiguousarray(block, dtype=np.float32 if as_f32 else None).tobytes())
    return h.hexdigest()


def split_sha256(split: Any) -> str:
    """SHA-256 of what a split's evaluation depends on: video features (every expert) and their
    masks, text features and token mask, the text -> video map, the relevancy used for mAP /
    nDCG and the groups. The same arrays read from a layout or given by flags hash alike."""
    duck(split, "split", "a PairedSplit", ("video_input",), ("text", "text_to_video"))
    video, mask = split.video_input()
    text, text_mask = split.text_input() if hasattr(split, "text_input") else (split.text, None)
    rel = split.mir_relevancy() if hasattr(split, "mir_relevancy") else None
    return arrays_sha256({"video": video, "video_mask": mask, "text": text, "text_mask": text_mask,
                          "text_to_video": np.asarray(split.text_to_video), "relevancy": rel,
                          "video_to_group": getattr(split, "video_to_group", None)})


def _row_digests(x: Any, mask: Any = None) -> list[bytes]:
    """16-byte BLAKE2b digest of each row of ``x`` ``[N, ...]`` as float32 numbers (real floats) or as
    stored, over the real frames / tokens only when ``mask`` ``[N, F]`` is given (padding never
    changes an embedding, so it does not change an identity). Read in blocks of rows."""
    x = x.detach().cpu().numpy() if hasattr(x, "detach") else x
    n = int(x.shape[0])
    rows = max(1, _ROW_BYTES // max(1, int(np.prod(x.shape[1:], dtype=np.int64)) * 4))
    out: list[bytes] = []
    for start in range(0, n, rows):
        block = np.asarray(x[start:start + rows])
        block = np.ascontiguousarray(block, dtype=np.float32 if block.dtype.kind == "f" else None)
        keep = None
        if mask is not None and block.ndim >= 3:
            keep = np.asarray(mask[start:start + rows]).astype(bool)
        for i in range(block.shape[0]):
            row = block[i] if keep is None else block[i][keep[i]]
            out.append(hashlib.blake2b(np.ascontiguousarray(row).tobytes(), digest_size=16).digest())
    return out


def _side_digests(features: Any, mask: Any) -> list[bytes]:
    """Per-row digests of one side's input: an array, or ``{expert: array}`` with ``{expert: mask}``."""
    if not isinstance(features, dict):
        return _row_digests(features, mask)
    masks = mask if isinstance(mask, dict) else {}
    parts = [_row_digests(features[k], masks.get(k)) for k in sorted(features)]
    return [hashlib.blake2b(b"".join(p), digest_size=16).digest() for p in zip(*parts)]


def query_ids(split: Any) -> dict[str, np.ndarray]:
    """Each query's identity, ``{"t2v": uint8 [T, 16], "v2t": uint8 [V, 16]}`` and, on a split with
    groups (``video_to_group``), ``"p2v"`` / ``"v2p"`` ``uint8 [P, 16]``: a text query is the digest
    of its features and its video's; a video query the digest of its features and the sorted digests
    of its texts; a paragraph (and its group's video, the v2p query) the digest of the group's clips
    in clip order, each followed by its texts in text order (the order a paragraph is read in,
    :func:`xmodal.data.groups.paragraph_texts`), one per group that has a paragraph, in group order
    (the queries of :func:`xmodal.retrieval.evaluate.group_ranks`). Two results whose splits hold
    the same queries in another order are paired by these ids (``xmodal compare``); equal ids mean
    equal inputs and ground truth.

    Args:
        split: a :class:`~xmodal.data.PairedSplit` (or anything with ``video_input()``,
            ``text_input()`` or ``text``, ``text_to_video`` and optionally ``video_to_group``).

    >>> from xmodal.data import PairedSplit
    >>> s = PairedSplit.from_arrays(video=np.eye(2), text=[[1, 0], [0, 1], [0, 1]], text_to_video=[0, 1, 1])
    >>> ids = query_ids(s)  # texts 1 and 2 are the same caption of the same video: one identity
    >>> ids["t2v"].shape, ids["v2t"].dtype.name, bool((ids["t2v"][1] == ids["t2v"][2]).all())
    ((3, 16), 'uint8', True)
    >>> album = PairedSplit.from_arrays(video=np.eye(2), text=np.eye(2), text_to_video=[0, 1], video_to_group=[0, 0])
    >>> {d: x.shape for d, x in query_ids(album).items()}  # one album of two clips: one paragraph
    {'t2v': (2, 16), 'v2t': (2, 16), 'p2v': (1, 16), 'v2p': (1, 16)}
    """
    duck(split, "split", "a PairedSplit", ("video_input",), ("text_to_video",))
    video, vmask = split.video_input()
    text, tmask = split.text_input() if hasattr(split, "text_input") else (split.text, None)
    t2v = int_array(split.text_to_video, "split.text_to_video")
    vd, td = _side_digests(video, vmask), _side_digests(text, tmask)
    if len(td) != t2v.size or (t2v.size and (t2v.min() < 0 or t2v.max() >= len(vd))):
        raise ValueError("split: text_to_video does not fit the text and video rows")
    t_ids = [hashlib.blake2b(b"t2v" + td[i] + vd[v], digest_size=16).digest() for i, v in enumerate(t2v.tolist())]
    own: list[list[bytes]] = [[] for _ in vd]
    for i, v in enumerate(t2v.tolist()):
        own[v].append(td[i])
    v_ids = [hashlib.blake2b(b"v2t" + vd[j] + b"".join(sorted(own[j])), digest_size=16).digest()
             for j in range(len(vd))]
    out = {"t2v": t_ids, "v2t": v_ids}
    groups = getattr(split, "video_to_group", None)
    if groups is not None:
        out.update(_group_ids(vd, td, t2v, groups))
    return {d: np.frombuffer(b"".join(ids), dtype=np.uint8).reshape(len(ids), 16).copy() for d, ids in out.items()}


def _group_ids(vd: list[bytes], td: list[bytes], t2v: np.ndarray, video_to_group: Any) -> dict[str, list[bytes]]:
    """``{"p2v": [...], "v2p": [...]}``: one digest per group that has a paragraph, in group order, over
    its clips in clip order, each clip's digest followed by its number of texts and their digests in
    text order (so neither a clip's texts nor the clips' order can be confused with another group's)."""
    from xmodal.data.groups import check_groups, group_rows

    g = check_groups(video_to_group, len(vd), "split.video_to_group")
    texts: list[list[bytes]] = [[] for _ in vd]
    for i, v in enumerate(t2v.tolist()):
        texts[v].append(td[i])
    p_ids, v_ids = [], []
    for rows in group_rows(g):
        if not any(texts[c] for c in rows.tolist()):
            continue  # no paragraph: neither a query nor in the gallery
        body = b"".join(vd[c] + len(texts[c]).to_bytes(4, "little") + b"".join(texts[c]) for c in rows.tolist())
        p_ids.append(hashlib.blake2b(b"p2v" + body, digest_size=16).digest())
        v_ids.append(hashlib.blake2b(b"v2p" + body, digest_size=16).digest())
    return {"p2v": p_ids, "v2p": v_ids}


def bank_source(test_time: Any, name: str) -> str:
    """Where normaliser ``name``'s statistics come from, in words (for the card)."""
    from xmodal.retrieval.testtime import _METHODS, _canonical

    key = _canonical(name)
    bank = _METHODS[key][1]
    if bank is None:
        return "none"
    if bank == "queries":
        return "the evaluated queries themselves"
    if key == "dn":
        return "validation split" if test_time.hparams.get("dn_source") == "val" else "training query banks"
    pair = test_time.banks.get(bank)
    sizes = f" ({len(pair[0])} texts / {len(pair[1])} videos)" if pair is not None else ""
    return ("the NCL loss's query queues" if bank == "ncl" else "random training queries") + sizes


def normalizer_card(test_time: Any, name: str) -> dict:
    """``{"bank_source", "uses_test_queries"}`` of one normaliser."""
    from xmodal.retrieval.testtime import uses_test_queries

    return {"bank_source": bank_source(test_time, name), "uses_test_queries": bool(uses_test_queries(name))}


def protocol_card(split: Any, test_time: Any, names: list[str], *, selected: str, ties: str = "pessimistic",
                  v2t: str = "all-captions", sha256: str | None = None, git: tuple = (None, None),
                  per_query: dict | None = None) -> dict:
    """The protocol card of one split (see the module docstring).

    Args:
        split: the evaluated :class:`~xmodal.data.PairedSplit` (or anything with ``text_to_video``,
            ``num_videos``, ``video_input``, ``text_input``).
        test_time: the run's :class:`~xmodal.retrieval.testtime.TestTime`.
        names: the normalisers evaluated on this split.
        selected: the normaliser the card's top-level ``normalizer`` names (the run's headline).
        ties, v2t: the rank protocol.
        sha256: :func:`split_sha256` when already known.
        git: ``(revision, dirty)`` of the code (``xmodal.training.provenance.git_revision()``).
        per_query: the split's per-query results (adds ``p2v`` / ``v2p`` query counts).
    """
    duck(split, "split", "a PairedSplit", ("video_input",), ("text_to_video", "num_videos"))
    duck(test_time, "test_time", "a TestTime", (), ("banks", "hparams"))
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names: expected a list of normaliser names, got {short_repr(names)}")
    for value, label in ((selected, "selected"), (ties, "ties"), (v2t, "v2t")):
        if not isinstance(value, str):
            raise TypeError(f"{label}: expected a string, got {short_repr(value)}")
    if sha256 is not None and not isinstance(sha256, str):
        raise TypeError(f"sha256: expected a hex string or None, got {short_repr(sha256)}")
    if not isinstance(git, (tuple, list)) or len(git) != 2:
        raise TypeError(f"git: expected (revision, dirty), got {short_repr(git)}")
    if per_query is not None and not isinstance(per_query, dict):
        raise TypeError(f"per_query: expected {{normaliser: {{direction: ...}}}} or None, got {short_repr(per_query)}")
    t2v = int_array(split.text_to_video, "split.text_to_video")
    n_videos = int(split.num_videos)
    counts = np.bincount(t2v, minlength=n_videos)
    rev, dirty = git
    queried = counts[counts > 0]
    card = {"num_queries": {"t2v": int(t2v.size), "v2t": n_videos},
            "gallery_size": {"t2v": n_videos, "v2t": int(t2v.size)},
            "chance_r1": {"t2v": round(100.0 / n_videos, 6),
                          "v2t": round(float(100.0 * (queried / t2v.size).mean()), 6) if v2t.startswith("all-captions")
                          else round(100.0 / n_videos, 6)},
            "caption_policy": "one-per-video" if bool((counts == 1).all()) else "all",
            "captions_per_video": round(float(t2v.size / max(1, n_videos)), 4),
            "v2t": v2t, "tie_rule": ties, "normalizer": selected,
            **normalizer_card(test_time, selected),
            "normalizers": {n: normalizer_card(test_time, n) for n in names},
            "split_sha256": sha256 if sha256 is not None else split_sha256(split),
            "git_revision": rev, "git_dirty": dirty}
    groups = next((r for r in (per_query or {}).values() if "p2v" in r), None)
    if groups is not None:
        p = int(np.asarray(groups["p2v"]["rank"]).size)
        card["num_queries"].update(p2v=p, v2p=p)
        card["gallery_size"].update(p2v=p, v2p=p)
        card["chance_r1"].update(p2v=round(100.0 / p, 6), v2p=round(100.0 / p, 6))
    return card


def write_per_query(path: str | os.PathLike, results: dict, cards: dict | None = None, *,
                    ids: dict | None = None, writer: str = "xmodal train") -> Path:
    """Write ``{split: {normalizer: {direction: {"rank" | "ap" | "ndcg": array}}}}`` (and each
    split's card, each split's query ids ``{split: {direction: uint8 [Q, 16]}}`` of
    :func:`query_ids`, and the writer's mark) to ``path`` as an ``.npz`` of plain arrays, through a
    temporary file renamed at the end."""
    from xmodal.runs import atomic_write

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a file path, got {short_repr(path)}")
    if not isinstance(writer, str):
        raise TypeError(f"writer: expected the writing command's name, got {short_repr(writer)}")
    if ids is not None and (not isinstance(ids, dict) or not all(
            isinstance(s, str) and isinstance(d, dict) and all(
                isinstance(k, str) and isinstance(v, np.ndarray) and v.dtype == np.uint8 and v.ndim == 2
                and v.shape[1] == 16 for k, v in d.items()) for s, d in ids.items())):
        raise TypeError(f"ids: expected {{split: {{direction: uint8 [Q, 16]}}}} (query_ids), got {short_repr(ids)}")
    shape = "{split: {normalizer: {direction: {'rank' | 'ap' | 'ndcg': array}}}}"
    if not isinstance(results, dict) or not all(
            isinstance(s, str) and isinstance(by_name, dict) and all(
                isinstance(n, str) and isinstance(by_dir, dict) and all(
                    isinstance(d, str) and isinstance(v, dict) and set(v) <= {"rank", "ap", "ndcg"} for d, v in by_dir.items())
                for n, by_dir in by_name.items())
            for s, by_name in results.items()):
        raise TypeError(f"results: expected {shape}, got {short_repr(results)}")
    if cards is not None and (not isinstance(cards, dict) or not all(isinstance(c, dict) for c in cards.values())):
        raise TypeError(f"cards: expected {{split: card dict}} or None, got {short_repr(cards)}")
    arrays: dict[str, np.ndarray] = {}
    for split, by_name in results.items():
        for name, by_dir in by_name.items():
            for direction, values in by_dir.items():
                for key, x in values.items():
                    dtype = np.int32 if key == "rank" else np.float32
                    x = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)
                    if x.ndim != 1 or x.dtype.kind not in "biuf":
                        raise TypeError(f"results[{split!r}][{name!r}][{direction!r}][{key!r}]: expected one number "
                                        f"per query, got {x.dtype} of shape {list(x.shape)}")
                    arrays[f"{split}/{name}/{direction}/{key}"] = x.astype(dtype)
    for split, card in (cards or {}).items():
        arrays[f"{split}/protocol"] = np.array(json.dumps(card, sort_keys=True))
    for split, by_dir in (ids or {}).items():
        for direction, x in by_dir.items():
            arrays[f"{split}/query_id/{direction}"] = x
    arrays[WRITER_KEY] = np.array(json.dumps({"writer": writer, "format": FORMAT}))

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)

    atomic_write(Path(path), write)
    return Path(path)


def card_differences(a: dict | None, b: dict | None, *, normalizer_a: str | None = None,
                     normalizer_b: str | None = None) -> list[str]:
    """The :data:`PROTOCOL_FIELDS` on which two cards disagree, as ``"field: A vs B"`` lines
    (``uses_test_queries`` of the compared normalisers when given). A missing card is one line.

    >>> card_differences({"tie_rule": "pessimistic"}, {"tie_rule": "optimistic"})
    ["tie_rule: 'pessimistic' vs 'optimistic'"]
    """
    if a is None or b is None:
        return ["protocol: " + ("A" if a is None else "B") + " has no protocol card (written before cards existed)"]
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise TypeError(f"cards: expected dicts, got {short_repr(a)} and {short_repr(b)}")

    def field(card: dict, key: str, name: str | None) -> Any:
        names = card.get("normalizers")
        if key == "uses_test_queries" and name is not None and isinstance(names, dict) and \
                isinstance(names.get(name), dict) and "uses_test_queries" in names[name]:
            return names[name]["uses_test_queries"]
        return card.get(key)

    out = []
    for key in PROTOCOL_FIELDS:
        va, vb = field(a, key, normalizer_a), field(b, key, normalizer_b)
        if va != vb:
            out.append(f"{key}: {va!r} vs {vb!r}")
    return out
