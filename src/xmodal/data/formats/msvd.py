"""MSVD as Collaborative Experts and CLIP4Clip distribute it, read as ArrowLuo/CLIP4Clip
``dataloaders/dataloader_msvd_retrieval.py`` reads it (albanie/collaborative-experts
``data_loader/MSVD_dataset.py`` names the same files):

- ``train_list.txt``, ``val_list.txt``, ``test_list.txt``: one video id per line (``-4wsuPCjDBc_5_15``).
- ``raw-captions.pkl``: ``{video id: [caption, ...]}``, each caption a list of tokens joined with spaces
  (``" ".join(cap)``) as CLIP4Clip does (a caption already a string is taken as it is). Read by
  :func:`xmodal.data.formats.safe_pickle.load_plain`: plain data only, a pickle that names any class
  or function is refused without running it.

Every caption of a video is a query (CLIP4Clip's ``multi_sentence_per_video``).
"""

from __future__ import annotations

from pathlib import Path

from xmodal._validate import short_repr
from xmodal.data.formats._common import FormatRows, lacks, need_files, read_lines, row, source_dir, text_field
from xmodal.data.formats.safe_pickle import load_plain

FMT = "msvd"
LISTS = {"train": "train_list.txt", "val": "val_list.txt", "test": "test_list.txt"}
CAPTIONS = "raw-captions.pkl"


def _caption(cap, where: str) -> str:
    if isinstance(cap, (list, tuple)) and all(isinstance(t, str) for t in cap):
        cap = " ".join(cap)
    return text_field(cap, FMT, where, "a caption (a list of tokens or a string)")


def read_msvd(source: str | Path) -> FormatRows:
    """Rows of MSVD: train / val / test from the id lists, every caption of ``raw-captions.pkl``.

    Raises:
        ValueError: one line naming what the folder or a file lacks, or a pickle that is not plain data.
    """
    folder = source_dir(source, FMT)
    files = need_files(folder, FMT, {CAPTIONS: "captions", **{n: f"{s} ids" for s, n in LISTS.items()}})
    captions = load_plain(files[CAPTIONS], f"--format {FMT}: {files[CAPTIONS]}")
    if not isinstance(captions, dict):
        raise lacks(FMT, CAPTIONS, f"a dict {{video id: [captions]}} (got {short_repr(captions, 60)})")
    rows = []
    for split, name in LISTS.items():
        ids = read_lines(files[name], FMT)
        absent = [v for v in ids if v not in captions]
        if absent:
            raise lacks(FMT, CAPTIONS, f"the captions of {len(absent)} video(s) of {name}: "
                                       f"{', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}")
        for vid in ids:
            caps = captions[vid]
            if not isinstance(caps, (list, tuple)) or not caps:
                raise lacks(FMT, f"{CAPTIONS}[{vid!r}]", "a non-empty list of captions")
            rows += [row(vid, _caption(c, f"{CAPTIONS}[{vid!r}][{j}]"), split, FMT, name) for j, c in enumerate(caps)]
    return FormatRows(rows=rows, kind="videos", splits={s: f"{n}, every caption in {CAPTIONS}" for s, n in LISTS.items()})
