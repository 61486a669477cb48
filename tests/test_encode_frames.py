"""``xmodal encode frames``: a frame store (uint8 frames, short side S, centre crop) with the guarantees of
``encode videos``; each stored frame is what ``CLIPImageProcessor`` makes of the decoded frame before it
rescales and normalises, and the clip4clip tower's normalisation of it equals the processor's pixels;
``data import`` turns the store into a layout the clip4clip trainer reads."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from hf_tiny import decoded_frames, save_clip, write_video

pytest.importorskip("av")
pytest.importorskip("transformers")
S = 16


def _videos(folder, n=3, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        frames = rng.integers(0, 256, size=(6 + 2 * i, 24 + 8 * i, 40, 3), dtype=np.uint8)
        frames[:, 4:12, 8:20] = (200, 40, 40)  # some structure the resize keeps
        paths.append(write_video(folder / f"v{i}.mp4", frames, rate=5))
    return paths


def _processor(**kw):
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": S}, crop_size={"height": S, "width": S}, **kw)


def test_frames_are_clip_processors_resize_and_crop(tmp_path):
    from xmodal.cli import main

    paths = _videos(tmp_path / "videos")
    assert main(["encode", "frames", str(tmp_path / "videos"), "--out", str(tmp_path / "fr"), "--size", str(S),
                 "--fps", "5"]) == 0
    side = json.loads((tmp_path / "fr" / "encoder.json").read_text())
    assert side["spec"] == f"frames:{S}" and side["dim"] == S * S * 3
    assert side["sampling"] == {"frames": None, "fps": 5.0}
    resize_only = _processor(do_rescale=False, do_normalize=False)
    for p in paths:
        got = np.load(tmp_path / "fr" / f"{p.stem}.npy")
        ref_frames = decoded_frames(p)
        assert got.dtype == np.uint8 and got.shape == (len(ref_frames), S * S * 3)
        ref = resize_only(images=ref_frames, return_tensors="np")["pixel_values"]  # [F, 3, S, S], 0-255
        ref = np.round(ref).astype(np.int64).transpose(0, 2, 3, 1).reshape(len(ref_frames), -1)
        assert np.abs(got.astype(np.int64) - ref).max() <= 1


def test_tower_normalisation_equals_the_processor(tmp_path):
    import torch

    from xmodal.features.frames import crop_frame
    from xmodal.models.clip4clip import build_clip4clip

    folder = save_clip(tmp_path / "clip", image_size=S)
    model, proc = build_clip4clip(f"hf:{folder}", max_words=16)
    p = _videos(tmp_path / "videos", n=1)[0]
    frames = decoded_frames(p)
    stored = torch.from_numpy(np.stack([crop_frame(f, S) for f in frames]))
    ref = proc.image_processor(images=[f.resize(f.size) for f in frames], return_tensors="pt")["pixel_values"]
    got = model.video_tower.pixels(stored)
    # the processor resizes in PIL too, so a stored frame holds its exact uint8 input (<= 1 level at most)
    assert (got - ref).abs().max() <= 1.01 / 255 / min(proc.image_processor.image_std)


def test_failures_are_named_and_the_others_go_on(tmp_path, capsys):
    from xmodal.cli import main

    _videos(tmp_path / "videos", n=2)
    (tmp_path / "videos" / "broken.mp4").write_bytes(b"not a video at all")
    code = main(["encode", "frames", str(tmp_path / "videos"), "--out", str(tmp_path / "fr"), "--size", str(S)])
    assert code == 1
    assert "broken.mp4" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "fr").glob("*.npy")) == ["v0.npy", "v1.npy"]
    # a re-run skips what is done and keeps the store as it was
    before = np.load(tmp_path / "fr" / "v0.npy")
    assert main(["encode", "frames", str(tmp_path / "videos"), "--out", str(tmp_path / "fr"), "--size", str(S)]) == 1
    assert np.array_equal(before, np.load(tmp_path / "fr" / "v0.npy"))
    out = capsys.readouterr().out
    assert "0 video(s)" in out and "2 already there" in out
    assert main(["encode", "frames", str(tmp_path / "videos"), "--out", str(tmp_path / "x"), "--model", "minilm"]) != 0
    assert "--model: 'xmodal encode frames' keeps the frames" in capsys.readouterr().err


def test_another_size_into_the_same_store_is_refused(tmp_path):
    from xmodal.cli import main

    _videos(tmp_path / "videos", n=1)
    assert main(["encode", "frames", str(tmp_path / "videos"), "--out", str(tmp_path / "fr"), "--size", str(S)]) == 0
    assert main(["encode", "frames", str(tmp_path / "videos"), "--out", str(tmp_path / "fr"), "--size", "24"]) != 0


def _frame_layout(tmp_path):
    """A frame-store layout of 12 coloured-box videos (8 train, 4 val), written as ``encode frames`` does."""
    from xmodal.data.importer import import_pairs
    from xmodal.features.frames import crop_frame

    from videos_tiny import COLOURS, caption, video

    rng = np.random.default_rng(0)
    store = tmp_path / "fr"
    store.mkdir()
    rows = []
    for i, colour in enumerate(list(COLOURS) * 3):  # 12 videos of 3..5 frames, stored as encode frames does
        v = video(colour, "box", "left", size=S, frames=3 + i % 3, rng=rng).reshape(-1, S, S, 3)
        from PIL import Image

        np.save(store / f"clip{i:02d}.npy", np.stack([crop_frame(Image.fromarray(f), S) for f in v]))
        rows.append((f"clip{i:02d}", caption(colour, "box", "left"), "train" if i < 8 else "val"))
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["video_id", "caption", "split"])
        w.writerows(rows)
    np.save(tmp_path / "text.npy", np.zeros((len(rows), 2), np.float32))  # the trainer reads the captions
    import_pairs(tmp_path / "pairs.csv", features=store, out=tmp_path / "data", text_features=tmp_path / "text.npy")
    return store


def test_data_import_of_a_frame_store_trains_clip4clip(tmp_path, capsys):
    from xmodal.config import from_dict
    from xmodal.data import load_paired_split
    from xmodal.training.loop import train

    store = _frame_layout(tmp_path)
    s = load_paired_split(tmp_path / "data", "train")
    assert s.video.dtype == np.uint8 and s.video.shape == (8, 5, S * S * 3)
    assert s.video_mask.sum(1).tolist() == [3 + i % 3 for i in range(8)]
    np.testing.assert_array_equal(s.video[1, :4], np.load(store / f"{s.video_names[1]}.npy"))
    clip = save_clip(tmp_path / "clip", image_size=S)
    cfg = from_dict({"data": {"name": "paired", "root": str(tmp_path / "data"), "max_frames": 4, "max_words": 16},
                     "model": {"kind": "clip4clip", "encoder": f"hf:{clip}", "standardize": False},
                     "train": {"epochs": 1, "batch_size": 4}, "test_time": {"normalizers": ["none"], "bank_size": 8}})
    summary = train(cfg, tmp_path / "run", progress=False, verbose=False)
    assert summary["epochs_run"] == 1
    # eval --run on the layout: the captions tokenised as in training, the trainer's numbers
    from xmodal.cli import main

    capsys.readouterr()
    assert main(["eval", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--split", "val",
                 "--normalizer", "none", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = summary["val"]["none"]
    assert got["t2v"]["R@1"] == want["t2v"]["R@1"] and got["t2v"]["MnR"] == want["t2v"]["MnR"]


def test_the_cli_trains_plots_indexes_and_reports_a_clip4clip_ncl_run(tmp_path, capsys):
    """What a user runs after ``encode frames`` + ``data import``: ``xmodal train`` of a clip4clip run with the NCL
    loss and several test-time normalisers (the trainer's plots read the val captions as tokens), ``index --run
    --data`` (its captions for video -> text embedded by the run's own tower) and ``report``; a ``data.max_words``
    beyond the CLIP's text positions is one line before training."""
    from xmodal.cli import main

    _frame_layout(tmp_path)
    clip = save_clip(tmp_path / "clip", image_size=S)
    base = ["train", "configs/clip4clip/ncl.yaml", "--out", str(tmp_path / "run"), "data.name=paired",
            f"data.root={tmp_path / 'data'}", f"model.encoder=hf:{clip}", "train.epochs=1", "train.batch_size=4",
            "data.max_frames=4", "loss.kwargs.queue_size=8", "test_time.normalizers=[none,ncl,dn]",
            "test_time.bank_size=8"]
    assert main(base) == 2  # the recipe's 32 words > the tiny CLIP's 16 positions
    assert "data.max_words: 32 tokens, but the text tower of model.encoder holds 16 positions" in \
        capsys.readouterr().err
    assert main(base + ["data.max_words=16"]) == 0
    assert (tmp_path / "run" / "retrieval_mass.png").is_file()
    capsys.readouterr()
    assert main(["index", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--split", "val",
                 "--out", str(tmp_path / "idx"), "--normalizer", "none"]) == 0
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["texts"] == 4 and meta["text_encoder"] == "run"  # never the layout's caption encoder (minilm)
    assert meta["encoders"]["text"]["family"] == "clip4clip"
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report.html")]) == 0
    assert "Head / tail breakdown" in (tmp_path / "report.html").read_text()
