"""COCO and Flickr30k in Karpathy's split JSON (``dataset_coco.json``, ``dataset_flickr30k.json``): the
files DN's retrieval tables (Zhou et al. 2023, Sec. 4.2, Table 1) and most image-text retrieval papers use.

Fields read (as Karpathy distributes the JSON with NeuralTalk; ``tokens``, ``imgid``, ``sentids`` unused):
``images[]`` with ``filename`` (the image file; its stem is the image id, so features are
``FEATS/<stem>.npy``), ``split`` (``train``, ``val``, ``test`` or ``restval``) and ``sentences[]`` with
``raw`` (the caption as written; ``tokens`` is ignored); COCO's ``filepath`` (``train2014`` /
``val2014``) locates the image for ``data import --images DIR``. ``restval`` (the part of COCO's val2014
outside Karpathy's val and test) is counted as train, as is usual (Karpathy & Fei-Fei 2015; VSE++ and
the CLIP-era retrieval papers train on train + restval); the import says how many images it moved.
"""

from __future__ import annotations

from pathlib import Path

from xmodal.data.formats._common import FormatRows, lacks, read_json, row, text_field

FILES = {"coco": "dataset_coco.json", "flickr30k": "dataset_flickr30k.json"}
SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def read_karpathy(source: str | Path, fmt: str) -> FormatRows:
    """Rows of a Karpathy split JSON (``source``: the file, or a folder holding ``dataset_{fmt}.json``).

    Raises:
        ValueError: one line naming the file and the first entry that lacks a field read, or a split
            name other than train / val / test / restval.
    """
    path = Path(source)
    if path.is_dir():
        if not (path / FILES[fmt]).is_file():
            raise ValueError(f"--format {fmt}: {path} lacks {FILES[fmt]} (Karpathy's split JSON)")
        path = path / FILES[fmt]
    elif not path.is_file():
        raise ValueError(f"--format {fmt}: {path} not found (give {FILES[fmt]} or its folder)")
    data = read_json(path, fmt)
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list) or not images:
        raise lacks(fmt, str(path), "a non-empty 'images' list (Karpathy's split JSON)")
    rows, restval, files = [], 0, {}
    for i, image in enumerate(images):
        where = f"{path.name} images[{i}]"
        if not isinstance(image, dict):
            raise lacks(fmt, where, "an object with 'filename', 'split' and 'sentences'")
        name = image.get("filename")
        if not isinstance(name, str) or not name.strip():
            raise lacks(fmt, where, "'filename'")
        split = image.get("split")
        if split not in SPLITS:
            raise lacks(fmt, where, f"a 'split' of train, val, test or restval (got {split!r})")
        restval += split == "restval"
        sentences = image.get("sentences")
        if not isinstance(sentences, list) or not sentences:
            raise lacks(fmt, where, "'sentences' (a non-empty list)")
        stem = Path(name.strip()).stem
        folder = image.get("filepath")  # COCO: train2014 / val2014
        files.setdefault(stem, f"{folder}/{name.strip()}" if isinstance(folder, str) and folder else name.strip())
        for j, sentence in enumerate(sentences):
            if not isinstance(sentence, dict) or "raw" not in sentence:
                raise lacks(fmt, f"{where}.sentences[{j}]", "'raw'")
            caption = text_field(sentence["raw"], fmt, f"{where}.sentences[{j}]", "'raw'")
            rows.append(row(stem, caption, SPLITS[split], fmt, where))
    notes = [f"{restval} 'restval' image(s) counted as train (as is usual: Karpathy's train + restval)"] if restval else []
    return FormatRows(rows=rows, kind="images", notes=notes, files=files,
                      splits={"train": "split train" + (" + restval" if restval else ""), "val": "split val",
                              "test": "split test"})
