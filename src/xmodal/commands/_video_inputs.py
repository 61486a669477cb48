"""Video inputs of the commands that apply a run (``eval --run``, ``index``): frame masks and
experts from flags or from a data directory, checked against the run with messages that
name files and flags.

    --video-features V.npy [--video-mask M.npy] [--expert NAME=NPY ...] [--expert-mask NAME=NPY ...]
    --data DIR --split S            (the layout: masks and experts read from the directory)
    --no-mask                       (accept [V, F, D] rows that end in all-zero frames as real)

A ``[V, F, D]`` input without a mask whose rows end in all-zero (or non-finite) frames
looks zero-padded; averaging those frames in changes every embedding silently, so it is
refused unless ``--no-mask`` says the zeros are real.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from xmodal.data.inputs import padded_rows
from xmodal.data.layout import MAIN_EXPERT
from xmodal.data.types import rows_text


def add_arguments(parser: argparse.ArgumentParser, *, group: Any = None, data: bool = True) -> None:
    """The mask / expert flags (and ``--data``/``--split`` when ``data``)."""
    g = group or parser
    g.add_argument("--video-mask", metavar="NPY", help="bool [V, F] frame mask of --video-features "
                   "(True = real frame; padded frames never change an embedding)")
    g.add_argument("--expert", action="append", default=[], metavar="NAME=NPY",
                   help="features of a further expert of the run, [V, De] or [V, Fe, De] (repeatable; "
                        "a run trained with experts needs every one)")
    g.add_argument("--expert-mask", action="append", default=[], metavar="NAME=NPY",
                   help="bool [V] (expert present) or [V, Fe] (real frames) mask of --expert NAME")
    g.add_argument("--no-mask", action="store_true",
                   help="accept [V, F, D] features without a mask whose rows end in all-zero frames "
                        "(else refused: they look zero-padded)")
    if data:
        g.add_argument("--data", metavar="DIR", help="instead of --video-features: a data directory in the "
                       "layout of docs/data.md (frame masks and experts included)")
        g.add_argument("--split", default="test", help="split of --data (default test)")


def _pairs(specs: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in specs or []:
        name, sep, path = str(spec).partition("=")
        if not sep or not name or not path:
            raise ValueError(f"{flag}: expected NAME=NPY, got {spec!r}")
        if name in out:
            raise ValueError(f"{flag}: {name!r} given twice")
        out[name] = path
    return out


def run_experts(model: Any) -> list[str]:
    """The run's further experts (besides the main video features), in its order."""
    return [k for k in (getattr(model, "experts", None) or []) if k != MAIN_EXPERT]


def _in_dim(model: Any, name: str) -> int | None:
    tower = getattr(model, "video_tower", None)
    towers = getattr(tower, "towers", None)
    spec = getattr(towers[name] if towers is not None else tower, "spec", None)
    return None if spec is None else int(spec.in_dim)


def _check_one(model: Any, name: str, x: np.ndarray, mask: np.ndarray | None, flag: str, mask_flag: str,
               n: int | None, no_mask: bool, expert: bool) -> None:
    if not isinstance(x, np.ndarray) or x.ndim not in (2, 3) or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{flag}: expected float features [V, D] or [V, F, D], got shape "
                         f"{list(getattr(x, 'shape', []))} dtype {getattr(x, 'dtype', '?')}")
    d = _in_dim(model, name)
    if d is not None and x.shape[-1] != d:
        raise ValueError(f"{flag}: feature size {x.shape[-1]}, but the run's {name!r} tower takes {d}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{flag}: {x.shape[0]} videos, but --video-features has {n}")
    if mask is not None:
        ok = ([list(x.shape[:2])] if x.ndim == 3 else []) + ([list(x.shape[:1])] if expert else [])
        if mask.dtype != np.bool_ or list(mask.shape) not in ok:
            want = " or ".join(str(s) for s in ok) or "none: the features have no frame axis"
            raise ValueError(f"{mask_flag}: expected a bool mask of shape {want}, got shape {list(mask.shape)} "
                             f"dtype {mask.dtype}")
        here = mask if mask.ndim == 1 else mask.any(1)
        if not expert and not here.all():
            raise ValueError(f"{mask_flag}: {int((~here).sum())} video(s) have no real frame "
                             f"({rows_text(np.flatnonzero(~here))}); every video needs at least one")
        return
    if no_mask:
        return
    rows = padded_rows(x, missing_rows=expert)
    if rows.size:
        what = "end in all-zero or non-finite frames" if x.ndim == 3 else "are all zero or non-finite"
        fix = ("--video-mask MASK.npy (bool [V, F], True = real frame) or --data DIR --split S" if not expert
               else f"--expert-mask {name}=MASK.npy (bool [V] or [V, F], True = present / real frame)")
        raise ValueError(f"{flag}: {rows.size} video(s) {what} ({rows_text(rows)}) and no mask was given: "
                         f"they look zero-padded; pass {fix}, or --no-mask to count those frames as real")


def from_flags(args: argparse.Namespace, model: Any, load: Any) -> tuple[Any, Any]:
    """``(features, mask)`` for ``model.encode_video`` from ``--video-features``, ``--video-mask``,
    ``--expert``, ``--expert-mask`` (``load(path, flag)`` reads a ``.npy``); dicts with experts."""
    experts, masks = _pairs(args.expert, "--expert"), _pairs(args.expert_mask, "--expert-mask")
    wanted = run_experts(model)
    if args.no_mask and (args.video_mask or masks):
        raise ValueError("--no-mask: drop it when giving --video-mask / --expert-mask")
    if experts and not wanted:
        raise ValueError(f"--expert: this run has no further experts (it reads only --video-features); "
                         f"drop --expert {', '.join(experts)}")
    unknown = sorted(set(experts) - set(wanted))
    if unknown:
        raise ValueError(f"--expert: {', '.join(unknown)} is not an expert of this run (its experts: "
                         f"{', '.join(wanted)})")
    missing = [k for k in wanted if k not in experts]
    if missing:
        raise ValueError(f"--expert: this run fuses the experts {', '.join(wanted)} besides --video-features; "
                         f"pass {' '.join(f'--expert {k}=NPY' for k in missing)} (masks with --expert-mask "
                         f"NAME=NPY), or --data DIR --split S")
    stray = sorted(set(masks) - set(experts))
    if stray:
        raise ValueError(f"--expert-mask: {', '.join(stray)} has no --expert")
    video = load(args.video_features, "--video-features")
    vmask = load(args.video_mask, "--video-mask") if args.video_mask else None
    _check_one(model, MAIN_EXPERT, video, vmask, "--video-features", "--video-mask", None, args.no_mask, False)
    if not wanted:
        return video, vmask
    feats, fmasks = {MAIN_EXPERT: video}, {}
    if vmask is not None:
        fmasks[MAIN_EXPERT] = vmask
    for k in wanted:
        feats[k] = load(experts[k], f"--expert {k}")
        m = load(masks[k], f"--expert-mask {k}") if k in masks else None
        _check_one(model, k, feats[k], m, f"--expert {k}", f"--expert-mask {k}", video.shape[0], args.no_mask,
                   True)
        if m is not None:
            fmasks[k] = m
    _check_present(feats, fmasks)
    return feats, fmasks


def _check_present(feats: dict, masks: dict) -> None:
    n = next(iter(feats.values())).shape[0]
    here = np.zeros(n, dtype=bool)
    for k in feats:
        m = masks.get(k)
        here |= True if m is None else (m if m.ndim == 1 else m.any(1))
    if not here.all():
        raise ValueError(f"--expert-mask: {int((~here).sum())} video(s) have no expert present "
                         f"({rows_text(np.flatnonzero(~here))})")


def from_split(split: Any, model: Any, flag: str = "--data") -> tuple[Any, Any]:
    """``(features, mask)`` of a loaded split for ``model``: the main features alone for a run
    without experts, else every expert of the run (extra experts of the split are left out)."""
    wanted = run_experts(model)
    name = split.name or flag
    if not wanted:
        _check_dim(model, MAIN_EXPERT, split.video, f"{flag}: {name}")
        return split.video, split.video_mask
    missing = [k for k in wanted if k not in split.experts]
    if missing:
        raise ValueError(f"{flag}: this run fuses the experts {', '.join(wanted)}; {name} lacks "
                         f"{', '.join(missing)} (no S_video_features.NAME.npy for them)")
    feats, masks = split.video_input()
    feats = {k: v for k, v in feats.items() if k == MAIN_EXPERT or k in wanted}
    masks = {k: v for k, v in masks.items() if k in feats}
    for k, x in feats.items():
        _check_dim(model, k, x, f"{flag}: {name}" + ("" if k == MAIN_EXPERT else f" expert {k}"))
    return feats, masks


def _check_dim(model: Any, name: str, x: np.ndarray, where: str) -> None:
    d = _in_dim(model, name)
    if d is not None and x.shape[-1] != d:
        raise ValueError(f"{where}: feature size {x.shape[-1]}, but the run's {name!r} tower takes {d}")


def check_no_flags(args: argparse.Namespace) -> None:
    """``--data`` holds the mask and experts: refuse the flags that would give them twice."""
    given = [f for f, v in (("--video-features", getattr(args, "video_features", None)),
                            ("--video-mask", args.video_mask), ("--expert", args.expert),
                            ("--expert-mask", args.expert_mask), ("--no-mask", args.no_mask)) if v]
    if given:
        raise ValueError(f"--data: the directory holds the features, masks and experts; drop {', '.join(given)}")
