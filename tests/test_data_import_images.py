"""Images first-class in ``data import`` (issue 42.1): ``encode images``' one array plus its sidecar,
its rows named by the ``--list`` file (or the ``--dir`` folder) it was encoded from, imports without
splitting the array by hand; the layout keeps the encoder record, and messages / the texts file word
the collection as images."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.data import load_paired_split
from xmodal.features import encoders

sys.path.insert(0, str(Path(__file__).resolve().parent))

NAME = "fake-img-42"
DIM = 5


def _fake(paths, *, batch_size, progress):
    """A deterministic stand-in image encoder: each file's bytes seed its vector."""
    return np.stack([np.random.default_rng(int.from_bytes(hashlib.sha256(p.read_bytes()).digest()[:8], "little"))
                     .standard_normal(DIM) for p in paths]).astype(np.float32)


@pytest.fixture
def encoded(tmp_path):
    encoders.register_encoder(NAME, _fake, kind="image", overwrite=True)
    try:
        imgs = tmp_path / "imgs"
        imgs.mkdir()
        names = [f"im{i:02d}.jpg" for i in range(8)]
        for i, n in enumerate(names):
            (imgs / n).write_bytes(bytes([i]) * (10 + i))
        listed = names[::-1]  # the list's order, not the folder's: rows follow the list
        (tmp_path / "list.txt").write_text("\n".join(listed) + "\n")
        assert main(["encode", "images", "--dir", str(imgs), "--list", str(tmp_path / "list.txt"), "--out",
                     str(tmp_path / "img.npy"), "--model", NAME]) == 0
        rows = [("im00", "a red thing", "train"), ("im03.jpg", "a blue thing", "train"), ("im03", "blue again", "train"),
                ("im05", "green", "val"), ("im07", "last one", "val")]
        (tmp_path / "pairs.csv").write_text("image,caption,split\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
        np.save(tmp_path / "text.npy", np.random.default_rng(0).standard_normal((len(rows), 3)).astype(np.float32))
        yield tmp_path, imgs, listed, rows
    finally:
        encoders.ENCODERS.pop(NAME, None)


def test_one_array_with_its_list_imports_and_keeps_the_encoder(encoded, capsys):
    tmp, imgs, listed, rows = encoded
    capsys.readouterr()
    assert main(["data", "import", str(tmp / "pairs.csv"), "--features", str(tmp / "img.npy"), "--ids",
                 str(tmp / "list.txt"), "--text-features", str(tmp / "text.npy"), "--out", str(tmp / "d")]) == 0
    out = capsys.readouterr().out
    assert "train: 2 images, 3 texts\n" in out and "val: 2 images, 2 texts\n" in out and "frames" not in out
    array = np.load(tmp / "img.npy")
    for split in ("train", "val"):
        s = load_paired_split(tmp / "d", split)
        for j, name in enumerate(s.video_names):  # by hand: the row of the list line naming the image
            np.testing.assert_array_equal(np.asarray(s.video)[j], array[listed.index(name + ".jpg")])
            np.testing.assert_array_equal(np.asarray(s.video)[j], _fake([imgs / (name + ".jpg")], batch_size=1,
                                                                         progress=False)[0])
    assert load_paired_split(tmp / "d", "train").video_names == ["im00", "im03"]  # "im03.jpg" is im03
    enc = json.loads((tmp / "d" / "encoders.json").read_text())
    assert enc["video"]["spec"] == NAME and enc["video"]["level"] == "image" and enc["video"]["dim"] == DIM
    assert (tmp / "d" / "train_texts.tsv").read_text().splitlines()[0] == "image_index\timage\ttext"


def test_ids_from_the_folder_equal_ids_from_a_sorted_list(encoded):
    tmp, imgs, listed, rows = encoded
    assert main(["encode", "images", "--dir", str(imgs), "--out", str(tmp / "sorted.npy"), "--model", NAME]) == 0
    assert main(["data", "import", str(tmp / "pairs.csv"), "--features", str(tmp / "sorted.npy"), "--ids", str(imgs),
                 "--text-features", str(tmp / "text.npy"), "--out", str(tmp / "a")]) == 0
    assert main(["data", "import", str(tmp / "pairs.csv"), "--features", str(tmp / "img.npy"), "--ids",
                 str(tmp / "list.txt"), "--text-features", str(tmp / "text.npy"), "--out", str(tmp / "b")]) == 0
    for split in ("train", "val"):
        np.testing.assert_array_equal(np.asarray(load_paired_split(tmp / "a", split).video),
                                      np.asarray(load_paired_split(tmp / "b", split).video))


def test_wrong_or_missing_ids_are_one_line(encoded, capsys):
    tmp, imgs, listed, rows = encoded
    base = ["data", "import", str(tmp / "pairs.csv"), "--features", str(tmp / "img.npy"), "--text-features",
            str(tmp / "text.npy"), "--out", str(tmp / "o")]
    capsys.readouterr()
    for extra, said in (([], "--ids: "), (["--ids", str(tmp / "short.txt")], "names 7 item(s), but"),
                        (["--ids", str(tmp / "other.txt")], "no row for 1 item(s) of the table")):
        (tmp / "short.txt").write_text("\n".join(listed[:7]))
        (tmp / "other.txt").write_text("\n".join(["zz.jpg" if n == "im05.jpg" else n for n in listed]))
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    assert main(base + ["--ids", str(tmp / "other.txt"), "--skip-missing"]) == 0
    assert "skipped 1 image(s) without a row in" in capsys.readouterr().out
    assert main(["data", "import", str(tmp / "pairs.csv"), "--features", str(imgs), "--ids", str(tmp / "list.txt"),
                 "--out", str(tmp / "p")]) == 2
    assert "--ids: only with --features FILE.npy" in capsys.readouterr().err
    assert not (tmp / "p").exists()


def test_format_with_images_encodes_them_here(tmp_path, capsys):
    """--format coco SOURCE --images DIR --model SPEC: the images found by COCO's filepath/filename are
    encoded into one array (scratch, removed) and imported as with --features ARRAY --ids LIST."""
    from test_data_formats import coco

    encoders.register_encoder(NAME, _fake, kind="image", overwrite=True)
    try:
        src = tmp_path / "src"
        src.mkdir()
        coco(src)
        data = json.loads((src / "dataset_coco.json").read_text())
        imgs = tmp_path / "coco"
        for i, im in enumerate(data["images"]):
            (imgs / im["filepath"]).mkdir(parents=True, exist_ok=True)
            (imgs / im["filepath"] / im["filename"]).write_bytes(bytes([i + 1]) * (20 + i))
        n = sum(len(im["sentences"]) for im in data["images"])
        np.save(tmp_path / "text.npy", np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32))
        base = ["data", "import", "--format", "coco", str(src), "--images", str(imgs), "--model", NAME,
                "--text-features", str(tmp_path / "text.npy"), "--out", str(tmp_path / "d")]
        capsys.readouterr()
        assert main(base) == 0
        assert "train: 3 images, 16 texts" in capsys.readouterr().out
        by_stem = {Path(im["filename"]).stem: imgs / im["filepath"] / im["filename"] for im in data["images"]}
        for split in ("train", "val", "test"):
            s = load_paired_split(tmp_path / "d", split)
            for j, name in enumerate(s.video_names):  # by hand: the fake encoder on the image file itself
                np.testing.assert_array_equal(np.asarray(s.video)[j],
                                              _fake([by_stem[name]], batch_size=1, progress=False)[0])
        assert json.loads((tmp_path / "d" / "encoders.json").read_text())["video"]["spec"] == NAME
        assert sorted(p.name for p in tmp_path.iterdir()) == ["coco", "d", "src", "text.npy"]  # scratch removed
        (imgs / "val2014" / "COCO_val2014_d.jpg").unlink()
        assert main(base) == 2
        err = capsys.readouterr().err
        assert "--images: no image file for 1 item(s)" in err and "COCO_val2014_d" in err
        assert main(base[:-2] + ["--out", str(tmp_path / "e"), "--skip-missing"]) == 0
        out = capsys.readouterr().out
        assert "skipped 1 image(s) without an image file in" in out and "(5 row(s) dropped): COCO_val2014_d" in out
        assert not (tmp_path / "e" / "val_video_features.npy").exists()  # its only image: no val split
        assert main(["data", "import", "--format", "coco", str(src), "--features", str(imgs), "--model", NAME,
                     "--out", str(tmp_path / "f")]) == 2
        assert "--model: only with --images" in capsys.readouterr().err
    finally:
        encoders.ENCODERS.pop(NAME, None)
