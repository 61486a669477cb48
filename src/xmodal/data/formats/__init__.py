"""Benchmark formats for ``xmodal data import --format NAME SOURCE``: each reader turns a benchmark's
own files into the ``{"video", "caption", "split"}`` rows a ``pairs.csv`` gives, so
:func:`xmodal.data.importer.import_rows` builds the layout exactly as for a table.

============  ==========================================================  ===================================
format        SOURCE holds                                                splits written
============  ==========================================================  ===================================
coco          ``dataset_coco.json`` (Karpathy; or the file itself)        train (+ restval), val, test
flickr30k     ``dataset_flickr30k.json`` (Karpathy; or the file itself)   train, val, test
msrvtt        ``MSRVTT_data.json``, ``MSRVTT_train.9k.csv`` (or 7k),      train, test (JSFusion 1k-A)
              ``MSRVTT_JSFUSION_test.csv``
msvd          ``raw-captions.pkl``, ``{train,val,test}_list.txt``         train, val, test
didemo        ``{train,val,test}_list.txt``, ``{train,val,test}_data.json``  train, val, test (paragraphs)
activitynet   ``train_ids.json``, ``val_ids.json``, ``train.json``,       train, val (= val_1; paragraphs)
              ``val_1.json``
lsmdc         ``LSMDC16_annos_training.csv``, ``LSMDC16_annos_val.csv``,  train, val, test
              ``LSMDC16_challenge_1000_publictect.csv``
============  ==========================================================  ===================================

Field names follow the public loaders (ArrowLuo/CLIP4Clip ``dataloaders/``, albanie/collaborative-experts
``data_loader/``); each module cites the one it follows.
"""

from __future__ import annotations

import os
from typing import Callable

from xmodal._validate import short_repr
from xmodal.data.formats._common import FormatRows
from xmodal.data.formats.karpathy import read_karpathy
from xmodal.data.formats.lsmdc import read_lsmdc
from xmodal.data.formats.msrvtt import read_msrvtt
from xmodal.data.formats.msvd import read_msvd
from xmodal.data.formats.paragraph import read_activitynet, read_didemo

#: ``--format`` name -> reader of the benchmark's folder (or file).
FORMATS: dict[str, Callable[[str | os.PathLike], FormatRows]] = {
    "coco": lambda source: read_karpathy(source, "coco"),
    "flickr30k": lambda source: read_karpathy(source, "flickr30k"),
    "msrvtt": read_msrvtt,
    "msvd": read_msvd,
    "didemo": read_didemo,
    "activitynet": read_activitynet,
    "lsmdc": read_lsmdc,
}

__all__ = ["FORMATS", "FormatRows", "read_format"]


def read_format(name: str, source: str | os.PathLike) -> FormatRows:
    """The rows of benchmark ``name`` read from ``source`` (see the table above).

    Raises:
        ValueError: an unknown format, or one line naming what ``source`` or one of its files lacks.
    """
    if not isinstance(name, str) or name not in FORMATS:
        raise ValueError(f"--format: expected one of {', '.join(FORMATS)}, got {short_repr(name)}")
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"--format {name}: expected a folder or file path, got {short_repr(source)}")
    return FORMATS[name](source)
