"""``xmodal classify``'s work: read a labelled split of a layout, encode the class prompts, score
with and without DN, and write a run-like folder that ``xmodal compare`` takes.

The folder (built beside ``out`` and swapped in at the end; a folder that is not a classify run is
refused, never replaced):

* ``metrics.json``: ``{"task": "zero-shot classification", "normalizer": "none", SPLIT: {"none": {"v2c":
  {...}}, "dn": {"v2c": {...}}, "dn_seeds": {...}, "protocol": card}, "classes", "templates", "encoders"}``;
  each ``v2c`` entry holds ``top1`` / ``top5`` (percent) and the same numbers as ``R@1`` / ``R@5``
  beside ``MdR`` / ``MnR`` (``v2c``: each image / video queries the classes), so ``compare`` reads them.
* ``per_query.npz``: ``SPLIT/none/v2c/rank`` and ``SPLIT/dn/v2c/rank`` (1-based rank of the true class),
  the card, and each query's identity (a digest of its features and its label).
* ``class_embeddings.npy``: float32 ``[C, D]``, the averaged prompt embeddings.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from xmodal._validate import short_repr
from xmodal.classify.templates import prompts
from xmodal.classify.zeroshot import class_embeddings, class_ranks, dn_normalizers, topk
from xmodal.data import layout
from xmodal.data.npyfile import load_array

TASK = "zero-shot classification"
DIRECTION = "v2c"
KS = (1, 5)

__all__ = ["DIRECTION", "TASK", "classify", "collection_kind", "read_labelled"]


def _find(root: Path, split: str, role: str) -> Path | None:
    """:func:`xmodal.data.layout.find`, but a layout name that exists and is not a file is named."""
    for name in layout.names(split, role):
        if (root / name).exists() and not (root / name).is_file():
            raise ValueError(f"--data: {root / name} is not a file")
    return layout.find(root, split, role)


def read_labelled(root: str | os.PathLike, split: str, *, need_labels: bool = True) -> tuple[np.ndarray, Any]:
    """Features ``[N, D]`` of a split (frames averaged over the real ones, as the identity model pools
    them) and its int labels ``[N]`` (None when ``need_labels`` is False)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"--data: {root} is not a folder" if root.exists() else f"--data: {root} not found")
    path = _find(root, split, "video")
    if path is None:
        raise ValueError(f"--data: {root} has no {split} split ({layout.describe(split, 'video')})")
    x = np.asarray(load_array(path, f"--data: {path}", mmap=True), dtype=np.float64)
    if x.ndim == 3:
        mpath = _find(root, split, "video_mask")
        mask = (np.ones(x.shape[:2], bool) if mpath is None
                else np.asarray(load_array(mpath, f"--data: {mpath}"), dtype=bool))
        if mask.shape != x.shape[:2] or not mask.any(1).all():
            raise ValueError(f"--data: {mpath}: expected bool {list(x.shape[:2])} with a real frame in every row")
        x = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    if x.ndim != 2 or x.shape[0] == 0 or not np.isfinite(x).all():
        raise ValueError(f"--data: {path}: expected finite features [N, D] or [N, F, D], got shape {list(x.shape)}")
    if not need_labels:
        return x, None
    lpath = _find(root, split, "video_labels")
    if lpath is None:
        raise ValueError(f"--data: {root} lacks {layout.describe(split, 'video_labels')}: zero-shot "
                         f"classification needs the class of every item")
    y = np.asarray(load_array(lpath, f"--data: {lpath}"))
    if y.shape != (x.shape[0],) or y.dtype.kind not in "iu":
        raise ValueError(f"--data: {lpath}: expected int [{x.shape[0]}] (one class per item), got {y.dtype} "
                         f"{list(y.shape)}")
    return x, y.astype(np.int64)


def collection_kind(root: str | os.PathLike, split: str) -> str:
    """``images`` or ``videos``: what a split holds, from its encoder record (``image`` level: images;
    ``frame`` / ``clip``: videos), else from its files (``S_image_features.npy`` or one vector per item:
    images; frames: videos)."""
    from xmodal.data.npyfile import array_header
    from xmodal.features.identity import read_encoders

    try:
        record = (read_encoders(root) or {}).get("video") or {}
    except ValueError:
        record = {}
    if record.get("level") in ("frame", "clip"):
        return "videos"
    if record.get("level") == "image":
        return "images"
    path = layout.find(root, split, "video")
    if path is None:
        return "videos"
    if path.name.endswith("_image_features.npy"):
        return "images"
    return "videos" if len(array_header(path)[0]) == 3 else "images"


def _query_ids(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """uint8 ``[N, 16]``: each query's identity, a digest of its features (float32) and its label."""
    out = np.empty((len(x), 16), np.uint8)
    for i in range(len(x)):
        d = hashlib.blake2b(b"v2c" + np.ascontiguousarray(x[i], dtype=np.float32).tobytes()
                            + int(y[i]).to_bytes(8, "little", signed=True), digest_size=16).digest()
        out[i] = np.frombuffer(d, np.uint8)
    return out


def _entry(ranks: np.ndarray) -> dict[str, float]:
    r = np.asarray(ranks)
    out = topk(r, KS)
    out.update({f"R@{k}": out[f"top{k}"] for k in KS})
    out.update(MdR=float(np.median(r)), MnR=float(np.mean(r)))
    return out


def _prepare(out: Path) -> Path:
    from xmodal.runs import staging_dir

    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"--out: {out} is not a folder")
    if out.is_dir() and any(out.iterdir()):
        m = out / "metrics.json"
        try:
            ours = json.loads(m.read_text(encoding="utf-8")).get("task") == TASK
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise ValueError(f"--out: {out} holds files that 'xmodal classify' did not write; give a new folder")
    return staging_dir(out)


def classify(data: str | os.PathLike, *, split: str, class_names: list[str], templates: tuple[str, ...],
             encode: Callable[[list[str]], np.ndarray], out: str | os.PathLike, dn_split: str | None = "val",
             dn_lam: float = 0.25, dn_num_samples: int | None = 100, dn_seeds: int = 5, dn_seed: int = 0,
             encoders: dict | None = None, templates_name: str = "") -> dict:
    """Zero-shot classification of ``data``'s ``split`` with and without DN; writes ``out``.

    Args:
        data: a layout with ``S_video_features.npy`` (or ``S_image_features.npy``) and ``S_video_labels.npy``.
        split: the evaluated split.
        class_names: label ``i``'s name.
        templates: prompt templates (each with one ``{}``).
        encode: ``prompts -> [P, D]`` (the text tower of the encoder that made the features).
        out: the run folder.
        dn_split: the split whose (unlabeled) items give DN's ``mu_x`` (DN Table 2: validation); None or a
            missing split: DN is skipped and the result says why. ``dn_split == split`` is flagged as using
            the test queries.
        dn_lam, dn_num_samples, dn_seeds, dn_seed: DN's ``lambda``, sample size, seeds (Table 2: 0.25, 100, 5).
        encoders: identity records ``{"text", "video"}`` stated in the result.
        templates_name: how the templates were named (``clip``, ``photo`` or the file's name).

    Returns:
        the ``metrics.json`` dict.
    """
    from xmodal.metrics import zero_shot
    from xmodal.retrieval.perquery import arrays_sha256, write_per_query
    from xmodal.runs import replace_dir
    from xmodal.training.provenance import git_revision

    if not isinstance(class_names, list) or not class_names or not all(isinstance(c, str) for c in class_names):
        raise TypeError(f"class_names: expected a non-empty list of names, got {short_repr(class_names)}")
    x, y = read_labelled(data, split)
    num_classes = len(class_names)
    if y.min() < 0 or y.max() >= num_classes:
        raise ValueError(f"--classes: {num_classes} class names, but the {split} labels run from {int(y.min())} to "
                         f"{int(y.max())}")
    texts = prompts(class_names, templates)
    feats = np.asarray(encode(texts), dtype=np.float64)
    if feats.ndim != 2 or feats.shape[0] != len(texts):
        raise ValueError(f"--text-model: the encoder returned shape {list(feats.shape)} for {len(texts)} prompts")
    if feats.shape[1] != x.shape[1]:
        raise ValueError(f"--text-model: {feats.shape[1]}-d prompt features, but the {split} features are "
                         f"{x.shape[1]}-d: name the text tower of the encoder that made them")
    cls = class_embeddings(feats, num_classes)
    ranks = {"none": class_ranks(x, cls, y)}
    result: dict[str, Any] = {"none": {DIRECTION: _entry(ranks["none"])}}
    by_metrics = zero_shot(x, cls, y, ks=KS)
    note = None
    val = None
    if dn_split is not None:
        if layout.find(data, dn_split, "video") is None:
            note = f"DN skipped: the layout has no {dn_split} split to estimate the mean from (--dn-split)"
        else:
            val, _ = read_labelled(data, dn_split, need_labels=False)
    else:
        note = "DN skipped (--dn-split none)"
    if val is not None:
        per_seed, pooled = dn_normalizers(val, cls, lam=dn_lam, num_samples=dn_num_samples, seeds=dn_seeds,
                                          seed=dn_seed)
        ranks["dn"] = class_ranks(x, cls, y, pooled)
        result["dn"] = {DIRECTION: _entry(ranks["dn"])}
        seeds = [zero_shot(x, cls, y, ks=KS, normalizer=n) for n in per_seed]
        result["dn_seeds"] = {f"top{k}": {"mean": float(np.mean([s[f"top{k}"] for s in seeds])),
                                          "std": float(np.std([s[f"top{k}"] for s in seeds])),
                                          "per_seed": [s[f"top{k}"] for s in seeds]} for k in KS}
        drawn = min(dn_num_samples or len(val), len(val))
        result["dn_protocol"] = {"lam": dn_lam, "mean_from": dn_split, "num_samples": drawn, "of": len(val),
                                 "seeds": dn_seeds, "seed": dn_seed, "gallery_mean": f"all {num_classes} class embeddings"}
    for k in KS:  # the ranks and metrics.zero_shot must say the same (one tie rule)
        if abs(result["none"][DIRECTION][f"top{k}"] - by_metrics[f"top{k}"]) > 1e-9:
            raise RuntimeError("class_ranks and metrics.zero_shot disagree")
    rev, dirty = git_revision()
    uses_test = dn_split == split
    card = {"num_queries": {DIRECTION: len(x)}, "gallery_size": {DIRECTION: num_classes},
            "chance_r1": {DIRECTION: round(100.0 / num_classes, 6)}, "caption_policy": "class prompts",
            "v2t": "none", "tie_rule": "pessimistic", "normalizer": "none", "bank_source": "none",
            "uses_test_queries": False,
            "normalizers": {"none": {"bank_source": "none", "uses_test_queries": False},
                            **({"dn": {"bank_source": f"{dn_split} split ({result['dn_protocol']['num_samples']} "
                                                      f"unlabeled items x {dn_seeds} seeds) and the class embeddings",
                                       "uses_test_queries": uses_test}} if "dn" in ranks else {})},
            "split_sha256": arrays_sha256({"features": x.astype(np.float32), "labels": y,
                                           "classes": np.frombuffer(hashlib.sha256(
                                               "\n".join(class_names).encode()).digest(), np.uint8)}),
            "git_revision": rev, "git_dirty": dirty,
            "task": TASK, "templates": f"{templates_name} ({len(templates)} per class)", "classes": num_classes}
    result["protocol"] = card
    metrics = {"task": TASK, "normalizer": "none", split: result, "classes": class_names,
               "templates": {"name": templates_name, "count": len(templates), "templates": list(templates)},
               "encoders": encoders or {}, "notes": [note] if note else []}
    out = Path(out)
    stage = _prepare(out)
    try:
        write_per_query(stage / "per_query.npz", {split: {n: {DIRECTION: {"rank": r}} for n, r in ranks.items()}},
                        {split: card}, ids={split: {DIRECTION: _query_ids(x, y)}}, writer="xmodal classify")
        np.save(stage / "class_embeddings.npy", cls, allow_pickle=False)
        (stage / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True), encoding="utf-8")
        replace_dir(stage, out)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    return metrics
