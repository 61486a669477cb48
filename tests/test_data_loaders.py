"""load_paired_split on tiny fixtures (every error path) and on the real Flickr8k layout."""

from pathlib import Path

import numpy as np
import pytest

from xmodal.data import load_paired_split, read_captions

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
FLICKR = DATA / "flickr8k"


def _write(root: Path, split="dev", n=4, k=2, dv=6, dt=5, frames=0, item="image", captions=True):
    rng = np.random.default_rng(0)
    shape = (n, frames, dv) if frames else (n, dv)
    np.save(root / f"{split}_{item}_features.npy", rng.standard_normal(shape).astype(np.float16))
    np.save(root / f"{split}_caption_features.npy", rng.standard_normal((n * k, dt)).astype(np.float16))
    np.save(root / f"{split}_caption_to_{item}.npy", np.repeat(np.arange(n), k).astype(np.int32))
    if captions:
        lines = ["image_index\timage\tcaption_number\tcaption"]
        lines += [f"{i // k}\timg{i // k}.jpg\t{i % k}\ta \"quoted\" caption {i} ." for i in range(n * k)]
        (root / f"{split}_captions.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_loads_and_upcasts(tmp_path):
    _write(tmp_path)
    s = load_paired_split(tmp_path, "dev", mmap=False)
    raw = np.load(tmp_path / "dev_image_features.npy")
    assert s.video.dtype == np.float32 and s.text.dtype == np.float32
    np.testing.assert_array_equal(s.video, raw.astype(np.float32))
    mapped = load_paired_split(tmp_path, "dev")  # the default: on disk, in the stored dtype
    assert isinstance(mapped.video, np.memmap) and mapped.video.dtype == raw.dtype == np.float16
    assert not mapped.video.flags.writeable
    np.testing.assert_array_equal(mapped.video, raw)
    assert s.text_to_video.dtype == np.int64
    np.testing.assert_array_equal(s.ids, [0, 0, 1, 1, 2, 2, 3, 3])
    assert s.captions[3] == 'a "quoted" caption 3 .'
    assert s.name == f"{tmp_path.name}/dev" and s.video_labels is None
    assert load_paired_split(tmp_path, "dev", captions=False).captions is None


def test_video_layout_frames_and_labels(tmp_path):
    _write(tmp_path, split="train", item="video", frames=3, captions=False)
    np.save(tmp_path / "train_video_labels.npy", np.array([0, 1, 1, 2]))
    np.save(tmp_path / "train_caption_labels.npy", np.array([0, 0, 1, 1, 1, 1, 2, 2]))
    s = load_paired_split(tmp_path, "train")
    assert s.video.shape == (4, 3, 6) and s.has_frames
    np.testing.assert_array_equal(s.video_labels, [0, 1, 1, 2])
    assert s.text_labels.dtype == np.int64 and s.captions is None


def test_does_not_keep_a_view_of_the_file(tmp_path):
    _write(tmp_path)
    np.save(tmp_path / "dev_image_features.npy", np.ones((4, 6), np.float32))
    s = load_paired_split(tmp_path, "dev", mmap=False)
    s.video[:] = 5
    assert np.all(np.load(tmp_path / "dev_image_features.npy") == 1)
    mapped = load_paired_split(tmp_path, "dev")  # memory-mapped read-only: the file cannot be written through it
    with pytest.raises(ValueError, match="read-only"):
        mapped.video[:] = 5
    assert np.all(np.load(tmp_path / "dev_image_features.npy") == 1)


@pytest.mark.parametrize("case, match", [
    ("missing_video", r"dev_video_features.npy \(or dev_image_features.npy\): file not found"),
    ("missing_text", r"dev_text_features.npy \(or dev_caption_features.npy\): file not found"),
    ("missing_map", r"dev_text_to_video.npy \(or dev_caption_to_video.npy, dev_caption_to_image.npy\): file not"),
    ("video_1d", r"dev_image_features.npy: expected an array \[N, D\] or \[N, F, D\]"),
    ("text_4d", r"dev_caption_features.npy: expected an array \[T, Dt\] \(or token features \[T, L, Dt\]\)"),
    ("count_mismatch", "dev_caption_to_image.npy: 7 entries but dev_caption_features.npy has 8"),
    ("out_of_range", r"dev_caption_to_image.npy: values must lie in \[0, 4\)"),
    ("negative", r"dev_caption_to_image.npy: values must lie in"),
    ("float_map", "dev_caption_to_image.npy: expected a 1-d integer array"),
    ("nan", "dev_caption_features.npy: contains 1 NaN/inf"),
    ("inf", "dev_image_features.npy: contains 2 NaN/inf"),
    ("corrupt", "dev_image_features.npy: not a readable .npy"),
    ("truncated", "dev_caption_features.npy: not a readable .npy"),
    ("pickled", "dev_image_features.npy: not a readable .npy"),
    ("int_features", "dev_image_features.npy: expected floating features"),
    ("tsv_count", "dev_captions.tsv: 7 captions but dev_caption_features.npy has 8"),
    ("tsv_columns", "dev_captions.tsv: line 3 has a different number of columns"),
    ("bad_labels", "dev_image_labels.npy: expected 4 integer labels"),
])
def test_errors_name_the_file(tmp_path, case, match):
    _write(tmp_path)
    f = {k: tmp_path / f"dev_{k}" for k in ("image_features.npy", "caption_features.npy",
                                             "caption_to_image.npy", "captions.tsv")}
    if case.startswith("missing"):
        name = {"missing_video": "image_features.npy", "missing_text": "caption_features.npy",
                "missing_map": "caption_to_image.npy"}[case]
        f[name].unlink()
    elif case == "video_1d":
        np.save(f["image_features.npy"], np.zeros(4, np.float16))
    elif case == "text_4d":  # [T, L, Dt] token features are valid (with S_text_mask.npy)
        np.save(f["caption_features.npy"], np.zeros((8, 2, 2, 5), np.float16))
    elif case == "count_mismatch":
        np.save(f["caption_to_image.npy"], np.zeros(7, np.int32))
    elif case == "out_of_range":
        np.save(f["caption_to_image.npy"], np.array([0, 1, 2, 3, 4, 0, 1, 2], np.int32))
    elif case == "negative":
        np.save(f["caption_to_image.npy"], np.array([0, 1, 2, 3, -1, 0, 1, 2], np.int32))
    elif case == "float_map":
        np.save(f["caption_to_image.npy"], np.zeros(8, np.float32))
    elif case == "nan":
        t = np.load(f["caption_features.npy"])
        t[2, 1] = np.nan
        np.save(f["caption_features.npy"], t)
    elif case == "inf":
        v = np.load(f["image_features.npy"])
        v[0, 0], v[3, 5] = np.inf, -np.inf
        np.save(f["image_features.npy"], v)
    elif case == "corrupt":
        f["image_features.npy"].write_bytes(b"this is not an npy file at all")
    elif case == "truncated":
        f["caption_features.npy"].write_bytes(f["caption_features.npy"].read_bytes()[:100])
    elif case == "pickled":
        np.save(f["image_features.npy"], np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif case == "int_features":
        np.save(f["image_features.npy"], np.zeros((4, 6), np.int64))
    elif case == "tsv_count":
        lines = f["captions.tsv"].read_text().splitlines()
        f["captions.tsv"].write_text("\n".join(lines[:-1]) + "\n")
    elif case == "tsv_columns":
        lines = f["captions.tsv"].read_text().splitlines()
        lines[2] = "1\tonly two"
        f["captions.tsv"].write_text("\n".join(lines) + "\n")
    elif case == "bad_labels":
        np.save(tmp_path / "dev_image_labels.npy", np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=match):
        load_paired_split(tmp_path, "dev")


def test_missing_directory_and_bad_split(tmp_path):
    with pytest.raises(ValueError, match="data directory not found"):
        load_paired_split(tmp_path / "nope", "dev")
    with pytest.raises(ValueError, match="split"):
        load_paired_split(tmp_path, "")


@pytest.mark.parametrize("name", ["dev_video_mask.npy", "dev_relevancy.npy", "dev_image_labels.npy",
                                  "dev_captions.tsv", "dev_image_features.npy", "dev_video_features.audio.npy",
                                  "dev_video_mask.audio.npy"])
def test_a_folder_under_a_layout_name_is_a_problem_not_an_absent_file(tmp_path, name):
    """An optional file that is a folder was skipped as absent (a mask never applied) or, for a
    names file, ended in a traceback; a required one was 'file not found'."""
    _write(tmp_path)
    (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / name).mkdir()
    with pytest.raises(ValueError, match=f"{tmp_path / name}: is a directory, not a file") as info:
        load_paired_split(tmp_path, "dev")
    assert "file not found" not in str(info.value)


def test_read_captions_of_a_folder(tmp_path):
    with pytest.raises(ValueError, match="is a directory, not a text file"):
        read_captions(tmp_path)


def test_read_captions_txt(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("first caption\nsecond\ttab caption\n")
    assert read_captions(p) == ["first caption", "second\ttab caption"]


@pytest.mark.skipif(not FLICKR.is_dir(), reason=f"real data not available at {FLICKR} (skipping Flickr8k checks)")
def test_real_flickr8k_dev():
    s = load_paired_split(FLICKR, "dev")
    assert s.video.shape == (1000, 1280) and s.text.shape == (5000, 384)
    assert s.video.dtype == np.float16 and load_paired_split(FLICKR, "dev", mmap=False).video.dtype == np.float32
    np.testing.assert_array_equal(np.bincount(s.ids, minlength=1000), np.full(1000, 5))
    assert len(s.captions) == 5000 and all(isinstance(c, str) and c for c in s.captions)
    # Caption features are L2-normalised MiniLM embeddings (up to float16 storage).
    np.testing.assert_allclose(np.linalg.norm(s.text, axis=1), 1.0, atol=2e-3)
    # The TSV's image_index column agrees with caption_to_image.
    import csv
    with open(FLICKR / "dev_captions.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    np.testing.assert_array_equal([int(r[0]) for r in rows], s.ids)
