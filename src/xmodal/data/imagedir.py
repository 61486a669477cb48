"""``data import ... --images DIR [--model SPEC]``: encode the collection's images here instead of
reading features, into one array whose rows the import names (:mod:`xmodal.data.arrayrows`), as
``xmodal encode images`` followed by ``data import --features feats.npy --ids LIST`` would.

Each id's image file is ``DIR/<path the format names>`` (COCO's ``filepath/filename``, Flickr30k's
``filename``), else ``DIR/<its file name>``, else ``DIR/<id>.<ext>`` for an image extension
(:data:`xmodal.features.encoders.IMAGE_EXTENSIONS`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["image_files", "encode_collection"]


def image_files(images: str | os.PathLike, ids: list[str], hints: dict[str, str] | None = None, *,
                allow_missing: bool = False) -> dict[str, Path | None]:
    """``{id: image file}``; ids without one named in one line (``allow_missing``: None instead)."""
    from xmodal.features.encoders import IMAGE_EXTENSIONS

    from xmodal._validate import short_repr

    if hints is not None and not isinstance(hints, dict):
        raise TypeError(f"hints: expected {{id: file name}} or None, got {short_repr(hints)}")
    root = Path(images)
    if not root.is_dir():
        raise ValueError(f"--images: {root} is not a folder" if root.exists() else f"--images: {root} not found")
    hints = hints or {}
    found: dict[str, Path | None] = {}
    for v in ids:
        hint = hints.get(v)
        options = [root / hint, root / Path(hint).name] if hint else []
        options += [root / f"{v}{ext}" for ext in IMAGE_EXTENSIONS] + [root / f"{v}{ext.upper()}" for ext in IMAGE_EXTENSIONS]
        found[v] = next((p for p in options if p.is_file()), None)
    missing = [v for v, p in found.items() if p is None]
    if missing and not allow_missing:
        raise ValueError(f"--images: no image file for {len(missing)} item(s) in {root}: {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''}")
    return found


def encode_collection(files: dict[str, Path | None], *, model: str, scratch: Path,
                      progress: bool | None = False) -> tuple[Path, Path]:
    """Encode the images of ``files`` (in its order; None skipped) with image encoder ``model`` into
    ``scratch/images.npy`` (its encoder record beside it, as ``encode images`` writes it) and
    ``scratch/images.txt`` (one id per row); returns both paths."""
    from xmodal._validate import short_repr
    from xmodal.features.encoders import encode_images, identity_of
    from xmodal.features.identity import write_sidecar

    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files):
        raise TypeError(f"files: expected {{id: image path or None}}, got {short_repr(files)}")
    if not isinstance(model, str) or not model:
        raise TypeError(f"model: expected an encoder spec, got {short_repr(model)}")
    if not isinstance(scratch, (str, os.PathLike)):
        raise TypeError(f"scratch: expected a folder path, got {short_repr(scratch)}")
    scratch = Path(scratch)
    ids = [v for v, p in files.items() if p is not None]
    if not ids:
        raise ValueError("--images: no item of the table has an image file")
    try:
        feats = encode_images([files[v] for v in ids], model=model, progress=bool(progress))
        record = identity_of(model, "image", dim=int(feats.shape[1]))
    except ModuleNotFoundError as exc:
        raise ValueError(f"--model: {exc}") from None
    except ValueError as exc:
        text = str(exc)
        raise ValueError(text if text.startswith("--") else f"--model: {text.removeprefix('model: ')}") from None
    scratch.mkdir(parents=True, exist_ok=True)
    array, listing = scratch / "images.npy", scratch / "images.txt"
    np.save(array, np.asarray(feats, dtype=np.float32), allow_pickle=False)
    listing.write_text("".join(v + "\n" for v in ids), encoding="utf-8")
    write_sidecar(array, record)
    return array, listing
