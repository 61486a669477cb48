"""The documented layout: names and aliases, masks and experts in the loader and
PairedSplit.from_arrays, every problem at once, config check, and tiny training runs."""

import doctest

import numpy as np
import pytest
import torch

import xmodal.data.importer
import xmodal.data.layout
import xmodal.data.types
import xmodal.models.towers
from xmodal.config import from_dict, load_config
from xmodal.data import PairedSplit, inspect_split, layout, load_paired_split
from xmodal.models import load_model


def _write(root, split="train", n=12, k=2, f=5, d=6, dt=4, seed=0, experts=False):
    """Documented names, variable-length frames with garbage in the padding."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, f + 1, n)
    mask = np.arange(f)[None, :] < lengths[:, None]
    video = rng.standard_normal((n, f, d)).astype(np.float32)
    video[~mask] = 1e30
    np.save(root / f"{split}_video_features.npy", video)
    np.save(root / f"{split}_video_mask.npy", mask)
    np.save(root / f"{split}_text_features.npy", rng.standard_normal((n * k, dt)).astype(np.float16))
    np.save(root / f"{split}_text_to_video.npy", np.repeat(np.arange(n), k))
    (root / f"{split}_videos.txt").write_text("".join(f"v{i}\n" for i in range(n)))
    if experts:
        audio = rng.standard_normal((n, 3)).astype(np.float32)
        here = np.arange(n) % 3 != 0  # audio missing for every third video
        audio[~here] = np.nan
        np.save(root / f"{split}_video_features.audio.npy", audio)
        np.save(root / f"{split}_video_mask.audio.npy", here)
        np.save(root / f"{split}_video_features.flow.npy", rng.standard_normal((n, 2, 5)).astype(np.float32))
    return root


def test_doctests_of_the_data_modules():
    import xmodal.data.check
    import xmodal.data.inputs

    for mod in (xmodal.data.layout, xmodal.data.types, xmodal.data.importer, xmodal.models.towers,
                xmodal.data.check, xmodal.data.inputs):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_names_aliases_and_missing_files(tmp_path):
    assert layout.names("dev", "video") == ["dev_video_features.npy", "dev_image_features.npy"]
    assert layout.missing_files(tmp_path, "dev") == [layout.describe("dev", r) for r in layout.REQUIRED]
    np.save(tmp_path / "dev_caption_features.npy", np.zeros((2, 3), np.float32))
    assert layout.find(tmp_path, "dev", "text").name == "dev_caption_features.npy"
    np.save(tmp_path / "dev_text_features.npy", np.zeros((2, 3), np.float32))
    assert layout.find(tmp_path, "dev", "text").name == "dev_text_features.npy"  # canonical first
    assert len(layout.missing_files(tmp_path, "dev")) == 2
    with pytest.raises(ValueError, match="role"):
        layout.find(tmp_path, "dev", "nope")
    with pytest.raises(ValueError, match="split"):
        layout.names("a/b", "video")


def test_loader_reads_masks_experts_and_names(tmp_path):
    _write(tmp_path, experts=True)
    s = load_paired_split(tmp_path, "train")
    assert s.video.shape == (12, 5, 6) and s.video_mask.dtype == bool
    assert sorted(s.experts) == ["audio", "flow"] and s.expert_masks["audio"].shape == (12,)
    assert s.video_names[3] == "v3" and s.expert_dims() == {"audio": 3, "flow": 5}
    feats, masks = s.video_input([0, 4])
    assert sorted(feats) == ["audio", "flow", "video"] and sorted(masks) == ["audio", "video"]
    np.testing.assert_array_equal(masks["audio"], s.expert_masks["audio"][[0, 4]])
    sub = s.subset([4, 0])
    np.testing.assert_array_equal(sub.video_mask, s.video_mask[[4, 0]])
    np.testing.assert_array_equal(sub.experts["flow"], s.experts["flow"][[4, 0]])


def test_from_arrays_copies_and_validates():
    rng = np.random.default_rng(1)
    video = torch.randn(3, 4, 5, dtype=torch.float64)
    mask = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], bool)
    s = PairedSplit.from_arrays(video=video, text=rng.standard_normal((4, 2)), text_to_video=[0, 1, 2, 2],
                                video_mask=mask, name="mem")
    assert s.video.dtype == np.float32 and s.text_to_video.dtype == np.int64
    s.video_mask[0] = False
    assert mask[0, 0]  # a copy
    bad_video = video.clone()
    bad_video[0, 0, 0] = float("nan")
    with pytest.raises(ValueError) as err:
        PairedSplit.from_arrays(video=bad_video, text=np.zeros((4, 3)), text_to_video=[0, 1, 5, -1],
                                video_mask=np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool))
    msg = str(err.value)  # every problem at once
    assert "video: contains 1 NaN/inf value(s) in real frames" in msg
    assert "video_mask: 1 video(s) have no real frame (rows [1])" in msg
    assert "text_to_video: values must lie in [0, 3)" in msg and "(2 out of range)" in msg
    with pytest.raises(TypeError, match="video_mask: expected a bool mask"):
        PairedSplit.from_arrays(video=video, text=np.zeros((4, 2)), text_to_video=[0, 1, 2, 2], video_mask=mask * 1)
    with pytest.raises(ValueError, match=r"experts\['a'\]: 2 rows, expected 3"):
        PairedSplit.from_arrays(video=video, text=np.zeros((4, 2)), text_to_video=[0, 1, 2, 2],
                                experts={"a": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="bad expert name"):
        PairedSplit.from_arrays(video=video, text=np.zeros((4, 2)), text_to_video=[0, 1, 2, 2],
                                experts={"video": np.zeros((3, 3))})


def test_inspect_lists_every_problem(tmp_path):
    _write(tmp_path, experts=True)
    np.save(tmp_path / "train_text_to_video.npy", np.r_[np.repeat(np.arange(11), 2), 40, 41])  # video 11 uncaptioned
    np.save(tmp_path / "train_video_mask.npy", np.ones((12, 4), bool))  # wrong F
    np.save(tmp_path / "train_video_features.flow.npy", np.zeros((12, 2, 5), np.int32))
    (tmp_path / "train_video_mask.audio.npy").write_bytes(b"junk")
    _, problems = inspect_split(tmp_path, "train", uncaptioned=True)
    text = "\n".join(problems)
    assert "train_video_mask.npy: expected shape [12, 5], got [12, 4]" in text
    assert "train_video_features.flow.npy: expected floating features, got dtype int32" in text
    assert "train_video_mask.audio.npy: not a readable .npy" in text
    assert "train_text_to_video.npy: values must lie in [0, 12)" in text
    # Without its (unreadable) mask, the audio expert's NaN rows of missing videos count as real.
    assert "train_video_features.audio.npy: contains 12 NaN/inf value(s)" in text
    assert len(problems) == 5, problems
    with pytest.raises(ValueError) as err:
        load_paired_split(tmp_path, "train")
    assert str(err.value).count("; ") >= 4 and all(p.split(" (")[0] in str(err.value) for p in problems)
    np.save(tmp_path / "train_text_to_video.npy", np.r_[np.repeat(np.arange(11), 2), 0, 1])
    (tmp_path / "train_video_features.flow.npy").unlink()
    np.save(tmp_path / "train_video_mask.audio.npy", np.arange(12) % 3 != 0)
    np.save(tmp_path / "train_video_mask.npy", np.ones((12, 5), bool))
    _, problems = inspect_split(tmp_path, "train", uncaptioned=True)
    assert len(problems) == 1  # the culprit row and, from train_videos.txt, its video name
    assert problems[0].startswith("train_text_to_video.npy: 1 video(s) have no text (rows [11]")


def test_config_check_accepts_the_video_layout_and_names_all_missing(tmp_path):
    _write(tmp_path, split="train")
    _write(tmp_path, split="val", seed=1)
    cfg = load_config(None, ["data.name=paired", f"data.root={tmp_path}", "data.val_split=val"])
    assert cfg.data.root == str(tmp_path)
    with pytest.raises(ValueError, match=r"data.val_split: missing file\(s\) .*dev_video_features.npy .*; "
                                         r"dev_text_features.npy.*; dev_text_to_video.npy"):
        load_config(None, ["data.name=paired", f"data.root={tmp_path}", "data.val_split=dev"])


def _cfg(root, **model):
    return from_dict({"data": {"name": "paired", "root": str(root), "val_split": "val", "test_split": ""},
                      "model": {"dim": 8, "hidden": 16, "heads": 2, "layers": 1, **model},
                      "test_time": {"normalizers": ["none", "dn"], "bank_size": 20},
                      "train": {"epochs": 2, "batch_size": 8, "progress": False, "device": "cpu"}})


@pytest.mark.parametrize("kind, experts, fusion", [("meanp", False, "gated"), ("transformer", True, "gated"),
                                                   ("meanp", True, "concat")])
def test_trains_on_the_layout_and_padding_never_matters(tmp_path, kind, experts, fusion, one_thread):
    from xmodal.training.loop import train

    data = tmp_path / "data"
    data.mkdir()
    _write(data, "train", n=24, experts=experts)
    _write(data, "val", n=10, seed=1, experts=experts)
    summary = train(_cfg(data, kind=kind, fusion=fusion), tmp_path / "run")
    assert np.isfinite(summary["val_score"]) and summary["epochs_run"] == 2
    model = load_model(tmp_path / "run")
    assert model.experts == (["video", "audio", "flow"] if experts else [])
    val = load_paired_split(data, "val")
    feats, masks = val.video_input()
    ref = model.encode_video(feats, masks)
    assert torch.isfinite(ref).all()
    junk = {k: v.copy() for k, v in feats.items()} if experts else feats.copy()
    main = junk["video"] if experts else junk
    main[~val.video_mask] = -7e20
    if experts:
        junk["audio"][~val.expert_masks["audio"]] = 3e30
    assert torch.equal(model.encode_video(junk, masks), ref)
    # the CLI applies the run to the layout (masks, experts) exactly as model.similarity does
    import json

    from xmodal.cli import main
    from xmodal.metrics import text_video

    want = text_video(model.similarity(val.text, feats, video_mask=masks), val.text_to_video)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["eval", "--run", str(tmp_path / "run"), "--data", str(data), "--split", "val", "--json"]) == 0
    got = json.loads(buf.getvalue())
    for d in ("t2v", "v2t"):
        for k, v in want[d].items():
            assert got[d][k] == pytest.approx(v, abs=1e-9), (d, k)
