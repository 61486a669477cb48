"""The paired-split file layout: the one place that names its files.

A split ``S`` of a data directory holds (``docs/data.md``; aliases in brackets
are the Flickr8k names of ``../shared/data/flickr8k``)::

    S_video_features.npy   float [N, Dv] or [N, F, Dv]        (S_image_features.npy)
    S_video_mask.npy       bool  [N, F], True = real frame    optional
    S_text_features.npy    float [T, Dt] or [T, L, Dt] tokens (S_caption_features.npy)
    S_text_mask.npy        bool/uint8 [T, L], True = real token  optional (token features)
    S_text_to_video.npy    int   [T], row of each text's video (S_caption_to_video.npy,
                                                               S_caption_to_image.npy)
    S_videos.txt           one video name per line            optional (S_images.txt)
    S_texts.tsv            header + one row per text, text last optional (S_captions.tsv)
    S_video_labels.npy     int [N] class per video            optional (S_image_labels.npy)
    S_text_labels.npy      int [T] class per text             optional (S_caption_labels.npy)
    S_video_features.EXPERT.npy  further experts [N, De] or [N, Fe, De]     optional
    S_video_mask.EXPERT.npy      bool [N] (expert present) or [N, Fe]       optional
    S_video_to_group.npy   int [N], the long video (group) of each clip row   optional
                           (groups numbered 0, 1, ... in row order; a group's clips are
                           consecutive rows in temporal order: :mod:`xmodal.data.groups`)
    S_groups.txt           one group name per line            optional

The loader (:func:`xmodal.data.load_paired_split`), ``xmodal data check``,
``xmodal data import`` and the config check all read these names from here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

#: role -> file name patterns, the canonical name first, then its aliases.
ROLES: dict[str, tuple[str, ...]] = {
    "video": ("{split}_video_features.npy", "{split}_image_features.npy"),
    "video_mask": ("{split}_video_mask.npy",),
    "text": ("{split}_text_features.npy", "{split}_caption_features.npy"),
    "text_mask": ("{split}_text_mask.npy",),  # optional bool/uint8 [T, L] of token features [T, L, Dt]
    "text_to_video": ("{split}_text_to_video.npy", "{split}_caption_to_video.npy",
                      "{split}_caption_to_image.npy"),
    "video_names": ("{split}_videos.txt", "{split}_images.txt"),
    "text_names": ("{split}_texts.tsv", "{split}_captions.tsv"),
    "video_labels": ("{split}_video_labels.npy", "{split}_image_labels.npy"),
    "text_labels": ("{split}_text_labels.npy", "{split}_caption_labels.npy"),
    "relevancy": ("{split}_relevancy.npy",),  # optional float [T, V] in [0, 1] (mAP / nDCG)
    "video_to_group": ("{split}_video_to_group.npy",),  # optional int [N] (clips inside long videos)
    "group_names": ("{split}_groups.txt",),
}
REQUIRED = ("video", "text", "text_to_video")
#: the name of the main video features among several experts (never an expert file name).
MAIN_EXPERT = "video"
EXPERT_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _check(split: str, role: str | None = None) -> None:
    if not isinstance(split, str) or not split or "/" in split or os.sep in split:
        from xmodal._validate import short_repr  # lazily: this module holds declarations only

        raise ValueError(f"split: expected a non-empty name without '/', got {short_repr(split)}")
    if role is not None and role not in ROLES:
        raise ValueError(f"role: unknown role {role!r}; expected one of {', '.join(ROLES)}")


def names(split: str, role: str) -> list[str]:
    """File names that may hold ``role`` of ``split``, canonical name first.

    >>> names("train", "text_to_video")
    ['train_text_to_video.npy', 'train_caption_to_video.npy', 'train_caption_to_image.npy']
    """
    _check(split, role)
    return [p.format(split=split) for p in ROLES[role]]


def find(root: str | os.PathLike, split: str, role: str) -> Path | None:
    """The existing file holding ``role`` of ``split`` under ``root`` (canonical name
    preferred over aliases), or ``None``."""
    for name in names(split, role):
        path = Path(root) / name
        if path.is_file():
            return path
    return None


def describe(split: str, role: str) -> str:
    """``"train_text_features.npy (or train_caption_features.npy)"``: for messages."""
    first, *aliases = names(split, role)
    return first + (f" (or {', '.join(aliases)})" if aliases else "")


def missing_files(root: str | os.PathLike, split: str) -> list[str]:
    """One entry per required file of ``split`` missing under ``root`` (all of them,
    not just the first), each naming the canonical file and its aliases.

    >>> import tempfile
    >>> missing_files(tempfile.mkdtemp(), "val")[0]
    'val_video_features.npy (or val_image_features.npy)'
    """
    return [describe(split, role) for role in REQUIRED if find(root, split, role) is None]


def expert_files(root: str | os.PathLike, split: str) -> dict[str, Path]:
    """``{expert: path}`` of the further experts ``{split}_video_features.EXPERT.npy``, sorted by name."""
    _check(split)
    root = Path(root)
    prefix, out = f"{split}_video_features.", {}
    if not root.is_dir():
        return out
    for path in sorted(root.glob(f"{prefix}*.npy")):
        name = path.name[len(prefix):-len(".npy")]
        if path.is_file() and name:
            out[name] = path
    return out


def expert_mask_file(root: str | os.PathLike, split: str, expert: str) -> Path | None:
    """``{split}_video_mask.EXPERT.npy`` when it exists."""
    path = Path(root) / f"{split}_video_mask.{expert}.npy"
    return path if path.is_file() else None


def splits_in(root: str | os.PathLike) -> list[str]:
    """Split names with a text -> video map under ``root`` (e.g. ``["dev", "train"]``)."""
    found = set()
    for pattern in ROLES["text_to_video"]:
        suffix = pattern.replace("{split}", "")
        for path in Path(root).glob(f"*{suffix}"):
            found.add(path.name[: -len(suffix)])
    return sorted(s for s in found if s)


_EXPERT_FILE = re.compile(r"^(?P<split>.+)_video_(?P<kind>features|mask)\.(?P<expert>[A-Za-z0-9_-]+)\.npy$")


def parse(name: str) -> tuple[str, str, str | None, bool] | None:
    """``(split, role, expert, canonical)`` of a layout file name, or ``None`` for any other name.

    ``role`` is a key of :data:`ROLES` (experts: ``"video"`` / ``"video_mask"`` with
    ``expert`` set); ``canonical`` is False for an alias (e.g. ``S_image_features.npy``).
    Roles added to :data:`ROLES` are recognised here without further change.

    >>> parse("train_video_mask.audio.npy"), parse("dev_caption_to_image.npy"), parse("notes.txt")
    (('train', 'video_mask', 'audio', True), ('dev', 'text_to_video', None, False), None)
    """
    m = _EXPERT_FILE.match(name)
    if m and m["expert"] != MAIN_EXPERT:
        return m["split"], "video" if m["kind"] == "features" else "video_mask", m["expert"], True
    for role, patterns in ROLES.items():
        for i, pattern in enumerate(patterns):
            suffix = pattern.replace("{split}", "")
            if name.endswith(suffix) and len(name) > len(suffix) and "/" not in name:
                return name[: -len(suffix)], role, None, i == 0
    return None


def check_expert_name(name: str) -> str:
    if not isinstance(name, str) or not EXPERT_NAME.match(name) or name == MAIN_EXPERT:
        raise ValueError(f"experts: bad expert name {name!r} (letters, digits, '_' or '-'; "
                         f"{MAIN_EXPERT!r} is the main features)")
    return name
