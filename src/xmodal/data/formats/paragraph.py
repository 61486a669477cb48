"""DiDeMo and ActivityNet Captions as paragraph -> video retrieval: each video's sentences joined
into one paragraph, as ArrowLuo/CLIP4Clip does (and Collaborative Experts' ``DiDeMo_dataset.py`` /
``ActivityNet_dataset.py`` evaluate the same task).

DiDeMo (``dataloaders/dataloader_didemo_retrieval.py``): ``{train,val,test}_list.txt`` (video file
names, one per line) and ``{train,val,test}_data.json`` (a list of ``{"video", "description",
"times"}``); a listed video's ``description`` s are joined with spaces in file order
(``" ".join(caption_dict[video]["text"])``); ``times`` are not needed for the whole-video
paragraph. Video names carry their extension (``...87ef417396.mov``); the feature file is the
stem's (``FEATS/<stem>.npy``), as ``encode videos`` names it.

ActivityNet (``dataloaders/dataloader_activitynet_retrieval.py``): ``train_ids.json`` / ``val_ids.json``
(lists of ids ``v_<youtube id>``) and ``train.json`` / ``val_1.json`` (``{id: {"duration",
"timestamps", "sentences"}}``); the paragraph is ``" ".join(sentences)``. The video id is the id
without its ``v_`` (CLIP4Clip's ``pseudo_video_id[2:]``), so features are ``FEATS/<youtube id>.npy``.
``val_1`` is the split the papers report (CLIP4Clip evaluates on it); it is written as ``val``.
"""

from __future__ import annotations

from pathlib import Path

from xmodal.data.formats._common import (FormatRows, lacks, need_files, read_json, read_lines, row, source_dir,
                                         strip_video_extension, text_field)

DIDEMO_SPLITS = ("train", "val", "test")
ANET_FILES = {"train": ("train_ids.json", "train.json"), "val": ("val_ids.json", "val_1.json")}


def read_didemo(source: str | Path) -> FormatRows:
    """Rows of DiDeMo: one paragraph per listed video that has a description.

    Raises:
        ValueError: one line naming what the folder or a file lacks.
    """
    fmt = "didemo"
    folder = source_dir(source, fmt)
    names = {}
    for s in DIDEMO_SPLITS:
        names[f"{s}_list.txt"] = f"{s} video names"
        names[f"{s}_data.json"] = f"{s} descriptions"
    files = need_files(folder, fmt, names)
    rows, skipped = [], 0
    for split in DIDEMO_SPLITS:
        listed = read_lines(files[f"{split}_list.txt"], fmt)
        data = read_json(files[f"{split}_data.json"], fmt)
        if not isinstance(data, list):
            raise lacks(fmt, f"{split}_data.json", "a list of {'video', 'description', 'times'}")
        wanted, texts = set(listed), {}
        for i, item in enumerate(data):
            where = f"{split}_data.json [{i}]"
            if not isinstance(item, dict) or "video" not in item or "description" not in item:
                raise lacks(fmt, where, "'video' and 'description'")
            if item["video"] in wanted:
                texts.setdefault(item["video"], []).append(text_field(item["description"], fmt, where, "'description'"))
        skipped += sum(v not in texts for v in dict.fromkeys(listed))
        rows += [row(strip_video_extension(v), " ".join(texts[v]), split, fmt, f"{split}_list.txt")
                 for v in dict.fromkeys(listed) if v in texts]
    notes = [f"{skipped} listed video(s) without a description left out (as CLIP4Clip does)"] if skipped else []
    return FormatRows(rows=rows, kind="videos", notes=notes,
                      splits={s: f"{s}_list.txt videos, descriptions of {s}_data.json joined" for s in DIDEMO_SPLITS})


def read_activitynet(source: str | Path) -> FormatRows:
    """Rows of ActivityNet Captions: one paragraph per listed video.

    Raises:
        ValueError: one line naming what the folder or a file lacks.
    """
    fmt = "activitynet"
    folder = source_dir(source, fmt)
    files = need_files(folder, fmt, {n: what for s, (ids, caps) in ANET_FILES.items()
                                     for n, what in ((ids, f"{s} ids"), (caps, f"{s} captions"))})
    rows, skipped = [], 0
    for split, (ids_name, caps_name) in ANET_FILES.items():
        ids = read_json(files[ids_name], fmt)
        if not isinstance(ids, list) or not all(isinstance(v, str) for v in ids):
            raise lacks(fmt, ids_name, "a list of video ids")
        caps = read_json(files[caps_name], fmt)
        if not isinstance(caps, dict):
            raise lacks(fmt, caps_name, "an object {id: {'sentences': [...]}}")
        for pseudo in dict.fromkeys(ids):
            if pseudo not in caps:
                skipped += 1
                continue
            entry = caps[pseudo]
            if not isinstance(entry, dict) or not isinstance(entry.get("sentences"), list) or not entry["sentences"]:
                raise lacks(fmt, f"{caps_name} [{pseudo!r}]", "'sentences' (a non-empty list)")
            paragraph = " ".join(text_field(s, fmt, f"{caps_name} [{pseudo!r}]", "'sentences'")
                                 for s in entry["sentences"])
            rows.append(row(pseudo[2:] if pseudo.startswith("v_") else pseudo, paragraph, split, fmt, ids_name))
    notes = [f"{skipped} listed id(s) without captions left out (as CLIP4Clip does)"] if skipped else []
    return FormatRows(rows=rows, kind="videos", notes=notes,
                      splits={s: f"{ids} videos, sentences of {caps} joined" for s, (ids, caps) in ANET_FILES.items()})
