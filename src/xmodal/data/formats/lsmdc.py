"""LSMDC (the 2016 challenge files), read as ArrowLuo/CLIP4Clip ``dataloaders/dataloader_lsmdc_retrieval.py``
reads them: ``LSMDC16_annos_training.csv`` (train), ``LSMDC16_annos_val.csv`` (val) and
``LSMDC16_challenge_1000_publictect.csv`` (test, 1,000 clips with one sentence each by the
challenge's design), each line tab-separated ``<CLIP_ID> <START_ALIGNED> <END_ALIGNED>
<START_EXTRACTED> <END_EXTRACTED> <SENTENCE>`` (six fields; the clip id, not unique in train, and
the sentence are read). Features are named by clip id, ``FEATS/<CLIP_ID>.npy``.
"""

from __future__ import annotations

from pathlib import Path

from xmodal.data.formats._common import FormatRows, lacks, need_files, row, source_dir, text_field

FMT = "lsmdc"
FILES = {"train": "LSMDC16_annos_training.csv", "val": "LSMDC16_annos_val.csv",
         "test": "LSMDC16_challenge_1000_publictect.csv"}


def read_lsmdc(source: str | Path) -> FormatRows:
    """Rows of LSMDC: one per line of each split's file.

    Raises:
        ValueError: one line naming what the folder lacks or the first line without six fields.
    """
    folder = source_dir(source, FMT)
    files = need_files(folder, FMT, {n: f"{s} split" for s, n in FILES.items()})
    rows = []
    for split, name in FILES.items():
        try:
            lines = files[name].read_text(encoding="utf-8-sig").splitlines()
        except UnicodeDecodeError as exc:
            raise ValueError(f"--format {FMT}: {files[name]} is not UTF-8 text (byte {exc.start})") from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            parts = line.strip().split("\t")
            if len(parts) != 6:
                raise lacks(FMT, f"{name} line {i}", f"six tab-separated fields (found {len(parts)})")
            rows.append(row(parts[0], text_field(parts[5], FMT, f"{name} line {i}", "a sentence"), split, FMT,
                            f"{name} line {i}"))
    return FormatRows(rows=rows, kind="videos", splits={s: n for s, n in FILES.items()})
