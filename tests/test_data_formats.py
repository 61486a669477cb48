"""``xmodal data import --format NAME`` (issue 42.2): small replicas of each benchmark's own files,
written here with every field the public loaders read (ArrowLuo/CLIP4Clip ``dataloaders/``,
Karpathy's split JSON), imported end to end; split sizes and caption counts checked against counts
made by hand from the replicas, captions against the text the loaders would build. A hostile
``raw-captions.pkl`` is refused and its payload never runs."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.data import load_paired_split
from xmodal.data.formats import read_format
from xmodal.data.formats.safe_pickle import load_plain


def _sentences(prefix: str, n: int) -> list[dict]:
    return [{"raw": f"{prefix} caption {j}.", "tokens": [prefix, "caption", str(j)], "imgid": 0, "sentid": j}
            for j in range(n)]


def coco(root: Path) -> None:
    images = [("COCO_train2014_a.jpg", "train2014", "train", 5), ("COCO_train2014_b.jpg", "train2014", "train", 5),
              ("COCO_val2014_c.jpg", "val2014", "restval", 6), ("COCO_val2014_d.jpg", "val2014", "val", 5),
              ("COCO_val2014_e.jpg", "val2014", "test", 5), ("COCO_val2014_f.jpg", "val2014", "test", 7)]
    data = {"dataset": "coco", "images": [
        {"filepath": fp, "filename": fn, "split": sp, "imgid": i, "cocoid": 100 + i, "sentids": list(range(n)),
         "sentences": _sentences(Path(fn).stem, n)} for i, (fn, fp, sp, n) in enumerate(images)]}
    (root / "dataset_coco.json").write_text(json.dumps(data))


def flickr30k(root: Path) -> None:
    images = [("1000092795.jpg", "train", 5), ("10002456.jpg", "train", 5), ("1007129816.jpg", "val", 5),
              ("1009434119.jpg", "test", 5)]
    data = {"dataset": "flickr30k", "images": [
        {"filename": fn, "split": sp, "imgid": i, "sentids": list(range(n)), "sentences": _sentences(Path(fn).stem, n)}
        for i, (fn, sp, n) in enumerate(images)]}
    (root / "dataset_flickr30k.json").write_text(json.dumps(data))


def msrvtt(root: Path, with_9k: bool = True) -> None:
    caps = {"video0": 3, "video1": 2, "video2": 2, "video3": 1, "video4": 2, "video5": 1}
    data = {"info": {}, "videos": [{"video_id": v, "url": f"https://www.youtube.com/watch?v={v}", "category": 0,
                                    "split": "train", "start time": 0.0, "end time": 10.0, "id": i}
                                   for i, v in enumerate(caps)],
            "sentences": [{"video_id": v, "caption": f"{v} says {j}", "sen_id": 10 * i + j}
                          for i, (v, n) in enumerate(caps.items()) for j in range(n)]}
    (root / "MSRVTT_data.json").write_text(json.dumps(data))
    if with_9k:
        (root / "MSRVTT_train.9k.csv").write_text("video_id\nvideo0\nvideo1\nvideo2\n")
    (root / "MSRVTT_train.7k.csv").write_text("video_id\nvideo0\nvideo1\n")
    (root / "MSRVTT_JSFUSION_test.csv").write_text(
        "key,vid_key,video_id,sentence\nret0,msr7579,video4,a test sentence\nret1,msr7725,video5,\"another, one\"\n")


def msvd(root: Path) -> None:
    caps = {"vA_1_5": [["a", "man"], ["a", "guy", "runs"]], "vB_2_9": [["x"], ["y", "z"], ["w"]],
            "vC_0_3": [["c", "one"], ["c", "two"]], "-vD_4_8": [["d"]]}
    (root / "raw-captions.pkl").write_bytes(pickle.dumps(caps, protocol=2))
    (root / "train_list.txt").write_text("vA_1_5\nvB_2_9\n")
    (root / "val_list.txt").write_text("vC_0_3\n")
    (root / "test_list.txt").write_text("-vD_4_8\n")


def didemo(root: Path) -> None:
    def item(video, desc):
        return {"video": video, "description": desc, "times": [[0, 1], [1, 1], [0, 0], [0, 1]],
                "annotation_id": 1, "dl_link": "", "context": [0, 1], "train_times": [[0, 1]], "num_segments": 6}
    (root / "train_list.txt").write_text("v1@N0_1_a.mov\nv2@N0_2_b.mp4\n")
    (root / "train_data.json").write_text(json.dumps([item("v1@N0_1_a.mov", "a dog sits"), item("vX.mov", "unlisted"),
                                                      item("v2@N0_2_b.mp4", "a cat"), item("v1@N0_1_a.mov", "it runs")]))
    (root / "val_list.txt").write_text("v3_c.avi\n")
    (root / "val_data.json").write_text(json.dumps([item("v3_c.avi", "first"), item("v3_c.avi", "second")]))
    (root / "test_list.txt").write_text("v4_d.mov\nv5_e.mov\n")  # v5 has no description: left out
    (root / "test_data.json").write_text(json.dumps([item("v4_d.mov", "only one")]))


def activitynet(root: Path) -> None:
    def entry(sents):
        return {"duration": 12.5, "timestamps": [[0.0, 4.1], [4.1, 12.5], [1, 2]][: len(sents)], "sentences": sents}
    (root / "train_ids.json").write_text(json.dumps(["v_aaa", "v_bbb"]))
    (root / "train.json").write_text(json.dumps({"v_aaa": entry(["A man walks.", " He sits."]),
                                                 "v_bbb": entry(["One.", "Two.", "Three."])}))
    (root / "val_ids.json").write_text(json.dumps(["v_ccc", "v_ddd"]))  # v_ddd has no captions: left out
    (root / "val_1.json").write_text(json.dumps({"v_ccc": entry(["Only."])}))


def lsmdc(root: Path) -> None:
    line = "{}\t00.00.01.000\t00.00.02.000\t00.00.01.000\t00.00.02.000\t{}\n"
    (root / "LSMDC16_annos_training.csv").write_text(line.format("0001_Movie_00.00.01-00.00.02", "SOMEONE walks.")
                                                     + line.format("0001_Movie_00.00.01-00.00.02", "He stops.")
                                                     + line.format("0001_Movie_00.00.05-00.00.07", "She waves."))
    (root / "LSMDC16_annos_val.csv").write_text(line.format("0002_Other_00.01.00-00.01.03", "A car."))
    (root / "LSMDC16_challenge_1000_publictect.csv").write_text(line.format("1001_Test_00.00.01-00.00.02", "Rain.")
                                                                + line.format("1001_Test_00.00.03-00.00.04", "Sun."))


#: format -> (writer, {split: (items, texts)} counted by hand from the writer above, item kind,
#: {split: {item id: [its texts, in order]}} for a few items, as the public loaders build them)
CASES = {
    "coco": (coco, {"train": (3, 16), "val": (1, 5), "test": (2, 12)}, "images",
             {"train": {"COCO_val2014_c": [f"COCO_val2014_c caption {j}." for j in range(6)]}}),
    "flickr30k": (flickr30k, {"train": (2, 10), "val": (1, 5), "test": (1, 5)}, "images",
                  {"val": {"1007129816": [f"1007129816 caption {j}." for j in range(5)]}}),
    "msrvtt": (msrvtt, {"train": (3, 7), "test": (2, 2)}, "videos",
               {"train": {"video0": ["video0 says 0", "video0 says 1", "video0 says 2"]},
                "test": {"video5": ["another, one"]}}),
    "msvd": (msvd, {"train": (2, 5), "val": (1, 2), "test": (1, 1)}, "videos",
             {"train": {"vA_1_5": ["a man", "a guy runs"]}, "test": {"-vD_4_8": ["d"]}}),
    "didemo": (didemo, {"train": (2, 2), "val": (1, 1), "test": (1, 1)}, "videos",
               {"train": {"v1@N0_1_a": ["a dog sits it runs"]}, "val": {"v3_c": ["first second"]}}),
    "activitynet": (activitynet, {"train": (2, 2), "val": (1, 1)}, "videos",
                    {"train": {"aaa": ["A man walks. He sits."], "bbb": ["One. Two. Three."]}}),
    "lsmdc": (lsmdc, {"train": (2, 3), "val": (1, 1), "test": (2, 2)}, "videos",
              {"train": {"0001_Movie_00.00.01-00.00.02": ["SOMEONE walks.", "He stops."]}}),
}


def _features(rows: list[dict], folder: Path, kind: str, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(exist_ok=True)
    for vid in dict.fromkeys(r["video"] for r in rows):
        shape = (4,) if kind == "images" else (int(rng.integers(1, 4)), 4)
        np.save(folder / f"{vid}.npy", rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("fmt", list(CASES))
def test_format_imports_with_the_standard_splits(tmp_path, fmt, capsys):
    write, sizes, kind, texts = CASES[fmt]
    src = tmp_path / "src"
    src.mkdir()
    write(src)
    found = read_format(fmt, src)
    assert found.kind == kind
    n = sum(t for _, t in sizes.values())
    assert len(found.rows) == n
    _features(found.rows, tmp_path / "feats", kind)
    np.save(tmp_path / "text.npy", np.random.default_rng(1).standard_normal((n, 3)).astype(np.float32))
    code = main(["data", "import", "--format", fmt, str(src), "--features", str(tmp_path / "feats"),
                 "--out", str(tmp_path / "out"), "--text-features", str(tmp_path / "text.npy")])
    out = capsys.readouterr().out
    assert code == 0, out
    for split, (items, count) in sizes.items():
        assert f"{split}: {items} {kind}, {count} texts" in out
        s = load_paired_split(tmp_path / "out", split)
        assert (s.num_videos, s.num_texts) == (items, count)
        for vid, want in texts.get(split, {}).items():
            row = s.video_names.index(vid)
            got = [c for c, v in zip(s.captions, np.asarray(s.text_to_video)) if v == row]
            assert got == want
    assert sorted(p.name.split("_video_features")[0] for p in (tmp_path / "out").glob("*_video_features.npy")) \
        == sorted(sizes)


def test_coco_counts_restval_as_train_and_says_so(tmp_path, capsys):
    coco(tmp_path)
    found = read_format("coco", tmp_path / "dataset_coco.json")  # the JSON itself is a source too
    assert {r["split"] for r in found.rows} == {"train", "val", "test"}
    assert found.notes == ["1 'restval' image(s) counted as train (as is usual: Karpathy's train + restval)"]


def test_msrvtt_7k_when_no_9k(tmp_path):
    msrvtt(tmp_path, with_9k=False)
    rows = read_format("msrvtt", tmp_path).rows
    train = [r for r in rows if r["split"] == "train"]
    assert len({r["video"] for r in train}) == 2 and len(train) == 5  # video0 (3) + video1 (2)


@pytest.mark.parametrize("fmt,remove,named", [
    ("msrvtt", "MSRVTT_JSFUSION_test.csv", "lacks MSRVTT_JSFUSION_test.csv"),
    ("msvd", "val_list.txt", "lacks val_list.txt (val ids)"),
    ("didemo", "test_data.json", "lacks test_data.json (test descriptions)"),
    ("activitynet", "val_1.json", "lacks val_1.json (val captions)"),
    ("lsmdc", "LSMDC16_annos_val.csv", "lacks LSMDC16_annos_val.csv (val split)"),
])
def test_a_missing_file_is_named_in_one_line(tmp_path, capsys, fmt, remove, named):
    CASES[fmt][0](tmp_path)
    (tmp_path / remove).unlink()
    code = main(["data", "import", "--format", fmt, str(tmp_path), "--features", str(tmp_path), "--out",
                 str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_a_missing_field_is_named(tmp_path):
    coco(tmp_path)
    data = json.loads((tmp_path / "dataset_coco.json").read_text())
    del data["images"][2]["sentences"]
    (tmp_path / "dataset_coco.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"images\[2\] lacks 'sentences'"):
        read_format("coco", tmp_path)
    msrvtt(tmp_path)
    (tmp_path / "MSRVTT_JSFUSION_test.csv").write_text("key,video_id\nret0,video4\n")
    with pytest.raises(ValueError, match="MSRVTT_JSFUSION_test.csv lacks column.s. sentence"):
        read_format("msrvtt", tmp_path)
    lsmdc(tmp_path)
    (tmp_path / "LSMDC16_annos_val.csv").write_text("clip\tonly two\n")
    with pytest.raises(ValueError, match="LSMDC16_annos_val.csv line 1 lacks six tab-separated fields"):
        read_format("lsmdc", tmp_path)


class _Payload:
    """Unpickling this calls ``os.mkdir(marker)``: code a hostile raw-captions.pkl would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_hostile_pickle_is_refused_and_never_runs(tmp_path, capsys):
    msvd(tmp_path)
    live = tmp_path / "control_marker"
    pickle.loads(pickle.dumps({"vA_1_5": _Payload(live)}))  # the payload is live: plain pickle runs it
    assert live.is_dir()
    marker = tmp_path / "marker"
    (tmp_path / "raw-captions.pkl").write_bytes(pickle.dumps({"vA_1_5": [["a"]], "x": _Payload(marker)}))
    with pytest.raises(ValueError, match=r"refused, not plain data \(it names posix.mkdir"):
        load_plain(tmp_path / "raw-captions.pkl", "raw-captions.pkl")
    code = main(["data", "import", "--format", "msvd", str(tmp_path), "--features", str(tmp_path), "--out",
                 str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "refused, not plain data" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


def test_plain_pickle_types_load(tmp_path):
    data = {"a": [["x", "y"], "z"], "b": (1, 2.5, None, True, -7), "é": {"n": [[]]}}
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):  # Python 2's protocol 2 files included
        (tmp_path / "p.pkl").write_bytes(pickle.dumps(data, protocol=protocol))
        assert load_plain(tmp_path / "p.pkl", "p.pkl") == data
