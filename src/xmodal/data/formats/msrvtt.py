"""MSR-VTT as CLIP4Clip distributes it (``msrvtt_data/``), read as ArrowLuo/CLIP4Clip
``dataloaders/dataloader_msrvtt_retrieval.py`` reads it:

- ``MSRVTT_data.json``: ``sentences[]`` with ``video_id`` and ``caption`` (every caption of every
  video; ``MSRVTT_TrainDataLoader`` with ``unfold_sentences`` pairs each caption of a train video with
  it); ``videos[]`` (``video_id``, ``url``) is not needed for retrieval.
- ``MSRVTT_train.9k.csv`` (or ``MSRVTT_train.7k.csv``): column ``video_id``, the train videos
  (9k: Gabeur et al.'s split; 7k: Miech et al.'s); the 9k one is read when both exist.
- ``MSRVTT_JSFUSION_test.csv``: columns ``video_id`` and ``sentence``, the 1k-A test split of Yu et
  al. (JSFusion): one caption per video (``MSRVTT_DataLoader`` pairs each row's ``video_id`` with
  its ``sentence``).

Video ids (``video7020``) name the feature files, ``FEATS/video7020.npy``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from xmodal.data.formats._common import FormatRows, lacks, read_json, row, source_dir, text_field

FMT = "msrvtt"
TRAIN_CSVS = ("MSRVTT_train.9k.csv", "MSRVTT_train.7k.csv")
TEST_CSV = "MSRVTT_JSFUSION_test.csv"
DATA_JSON = "MSRVTT_data.json"


def _csv(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--format {FMT}: {path} is not UTF-8 text (byte {exc.start})") from None
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    found = set(rows[0]) if rows else set()
    if not rows or not set(columns) <= found:
        raise lacks(FMT, str(path), f"column(s) {', '.join(c for c in columns if c not in found) or 'rows'}")
    return rows


def read_msrvtt(source: str | Path) -> FormatRows:
    """Rows of MSR-VTT: train (every caption of the 9k or 7k train videos), test (JSFusion 1k-A).

    Raises:
        ValueError: one line naming what the folder or a file lacks.
    """
    folder = source_dir(source, FMT)
    missing = [n for n in (DATA_JSON, TEST_CSV) if not (folder / n).is_file()]
    train_csv = next((folder / n for n in TRAIN_CSVS if (folder / n).is_file()), None)
    if train_csv is None:
        missing.append(" or ".join(TRAIN_CSVS))
    if missing:
        raise ValueError(f"--format {FMT}: {folder} lacks {', '.join(missing)} (CLIP4Clip's msrvtt_data)")
    data = read_json(folder / DATA_JSON, FMT)
    sentences = data.get("sentences") if isinstance(data, dict) else None
    if not isinstance(sentences, list) or not sentences:
        raise lacks(FMT, DATA_JSON, "a non-empty 'sentences' list")
    train_ids = list(dict.fromkeys(r["video_id"].strip() for r in _csv(train_csv, ("video_id",))))
    wanted = set(train_ids)
    by_video: dict[str, list[str]] = {}
    for i, s in enumerate(sentences):
        if not isinstance(s, dict) or "video_id" not in s or "caption" not in s:
            raise lacks(FMT, f"{DATA_JSON} sentences[{i}]", "'video_id' and 'caption'")
        vid = str(s["video_id"]).strip()
        if vid in wanted:
            by_video.setdefault(vid, []).append(text_field(s["caption"], FMT, f"{DATA_JSON} sentences[{i}]",
                                                           "'caption'"))
    without = [v for v in train_ids if v not in by_video]
    if without:
        raise lacks(FMT, DATA_JSON, f"captions of {len(without)} train video(s) of {train_csv.name}: "
                                    f"{', '.join(without[:5])}{' ...' if len(without) > 5 else ''}")
    rows = [row(v, c, "train", FMT, f"{train_csv.name}") for v in train_ids for c in by_video[v]]
    for i, r in enumerate(_csv(folder / TEST_CSV, ("video_id", "sentence"))):
        where = f"{TEST_CSV} line {i + 2}"
        rows.append(row(r["video_id"], text_field(r["sentence"], FMT, where, "'sentence'"), "test", FMT, where))
    return FormatRows(rows=rows, kind="videos",
                      splits={"train": f"{train_csv.name} videos, every caption in {DATA_JSON}",
                              "test": f"{TEST_CSV}: 1k-A, one caption per video"})
