"""Frame masks and experts on every path that applies a run (``index``, ``query``, ``eval --run``,
``model.similarity``), and one protocol: ``eval --run`` gives the run's own ``metrics.json``.

Data: variable-length videos (zero-padded, with a mask) and an audio expert missing for some
videos, written in the layout; two tiny runs trained on it (one without, one with the expert).
References are computed here from the model's own ``encode_video`` / ``encode_text`` with the
masks, or with the padded frames cut off video by video (no mask involved at all).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import xmodal
from xmodal.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _write_split(root, split, rng, n, frames=6, d=12, dt=8, da=5, audio=True, relevancy=False):
    centers = rng.standard_normal((n, d))
    lengths = rng.integers(1, frames + 1, n)
    lengths[0] = frames  # the frame axis is the longest video's
    video = centers[:, None, :] + 0.5 * rng.standard_normal((n, frames, d))
    mask = np.arange(frames)[None, :] < lengths[:, None]
    video[~mask] = 0.0  # zero padding, as 'xmodal data import' writes it
    t2v = np.repeat(np.arange(n), 2)
    proj = np.random.default_rng(99).standard_normal((d, dt))  # the same text map in every split
    text = centers[t2v] @ proj + 0.3 * rng.standard_normal((2 * n, dt))
    np.save(root / f"{split}_video_features.npy", video.astype(np.float32))
    np.save(root / f"{split}_video_mask.npy", mask)
    np.save(root / f"{split}_text_features.npy", text.astype(np.float32))
    np.save(root / f"{split}_text_to_video.npy", t2v)
    (root / f"{split}_videos.txt").write_text("".join(f"{split}-v{i}\n" for i in range(n)))
    if audio:
        here = rng.random(n) < 0.7
        here[:2] = True
        a = (centers[:, :da] + 0.2 * rng.standard_normal((n, da))) * here[:, None]
        np.save(root / f"{split}_video_features.audio.npy", a.astype(np.float32))
        np.save(root / f"{split}_video_mask.audio.npy", here)
    if relevancy:
        rel = (rng.random((2 * n, n)) < 0.1) * rng.choice([0.5, 1.0], (2 * n, n))
        rel[np.arange(2 * n), t2v] = 1.0
        np.save(root / f"{split}_relevancy.npy", rel.astype(np.float32))
    return lengths


def _train(data, out, experts):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = data if experts else data.parent / (data.name + "-noexp")
    if not experts:
        root.mkdir(exist_ok=True)
        for f in data.iterdir():
            if ".audio." not in f.name:
                (root / f.name).write_bytes(f.read_bytes())
    cfg = from_dict({
        "data": {"name": "paired", "root": str(root), "val_split": "val", "test_split": "test"},
        "model": {"kind": "meanp", "dim": 16, "width": 32},
        "loss": {"name": "infonce", "temperature": 0.1},
        "test_time": {"normalizers": ["none", "dn", "sinkhorn", "qbnorm"], "bank_size": 64},
        "train": {"seed": 0, "epochs": 2, "batch_size": 32},
    })
    train(cfg, out, resume=False, progress=False)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paths")
    data = tmp / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 96), ("val", 40), ("test", 40)):
        _write_split(data, split, rng, n, relevancy=split == "test")
    plain = _train(data, tmp / "run_plain", experts=False)
    _train(data, tmp / "run_audio", experts=True)
    return {"data": data, "plain_data": plain, "plain": tmp / "run_plain", "audio": tmp / "run_audio"}


def _query(idx, text_path, k, capsys):
    assert main(["query", "--index", str(idx), "--text-features", str(text_path), "--k", str(k), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    return np.array(res["indices"]), np.array(res["scores"])


def _cut_embeddings(model, video, mask):
    """Each video's real frames alone (no padding, no mask), one at a time."""
    return torch.cat([model.encode_video(video[i:i + 1, :int(mask[i].sum())]) for i in range(len(video))])


def _error(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_index_without_mask_is_refused_not_averaged(runs, tmp_path, capsys):
    """The reported defect: 'xmodal index' without the mask averaged the zero padding in silently."""
    data, run = runs["plain_data"], runs["plain"]
    model = xmodal.load_model(run)
    video = np.load(data / "test_video_features.npy")
    mask = np.load(data / "test_video_mask.npy")
    assert not mask.all()  # variable lengths: there is padding to average in
    masked = model.encode_video(video, mask)
    np.testing.assert_allclose(masked.numpy(), _cut_embeddings(model, video, mask).numpy(), atol=1e-5)
    assert (model.encode_video(video) - masked).abs().max() > 1e-3  # padding changes embeddings

    args = ["index", "--run", str(run), "--video-features", str(data / "test_video_features.npy"),
            "--normalizer", "none"]
    assert main([*args, "--out", str(tmp_path / "bad")]) == 2
    err = _error(capsys)
    assert "--video-features" in err and "--video-mask" in err and "--no-mask" in err and "rows [" in err
    assert "dict" not in err and not (tmp_path / "bad").exists()

    text = tmp_path / "t.npy"
    np.save(text, np.load(data / "test_text_features.npy"))
    ref = (model.encode_text(np.load(text)) @ masked.T).numpy()
    for extra, out in ((["--video-mask", str(data / "test_video_mask.npy")], "flags"), (None, "data")):
        argv = ([*args, *extra] if extra else ["index", "--run", str(run), "--data", str(data), "--split",
                                                "test", "--normalizer", "none"])
        assert main([*argv, "--out", str(tmp_path / out)]) == 0
        capsys.readouterr()
        idx, scores = _query(tmp_path / out, text, 5, capsys)
        np.testing.assert_allclose(scores, np.take_along_axis(ref, idx, 1), atol=1e-4)
        np.testing.assert_allclose(scores[:, 0], ref.max(1), atol=1e-4)
    # --data also names the gallery from test_videos.txt
    assert (tmp_path / "data" / "names.txt").read_text().splitlines()[:2] == ["test-v0", "test-v1"]
    # --no-mask: the zeros are counted as frames, on purpose
    assert main([*args, "--no-mask", "--out", str(tmp_path / "nomask")]) == 0
    capsys.readouterr()
    idx, scores = _query(tmp_path / "nomask", text, 1, capsys)
    unmasked = (model.encode_text(np.load(text)) @ model.encode_video(video).T).numpy()
    np.testing.assert_allclose(scores[:, 0], unmasked.max(1), atol=1e-4)


def test_expert_run_takes_expert_files_and_masks(runs, tmp_path, capsys):
    data, run = runs["data"], runs["audio"]
    model = xmodal.load_model(run)
    assert model.experts == ["video", "audio"]
    f = {k: np.load(data / f"test_{k}.npy") for k in ("video_features", "video_mask", "video_features.audio",
                                                     "video_mask.audio", "text_features", "text_to_video")}
    base = ["--run", str(run), "--video-features", str(data / "test_video_features.npy")]
    # only the main features: the message names the missing expert flag, never a Python type
    assert main(["index", *base, "--out", str(tmp_path / "i0")]) == 2
    err = _error(capsys)
    assert "--expert audio=NPY" in err and "--data" in err and "dict" not in err
    # every expert + masks: the embeddings of model.encode_video with dicts
    full = [*base, "--video-mask", str(data / "test_video_mask.npy"),
            "--expert", f"audio={data / 'test_video_features.audio.npy'}",
            "--expert-mask", f"audio={data / 'test_video_mask.audio.npy'}"]
    assert main(["index", *full, "--normalizer", "none", "--out", str(tmp_path / "i1")]) == 0
    capsys.readouterr()
    feats = {"video": f["video_features"], "audio": f["video_features.audio"]}
    masks = {"video": f["video_mask"], "audio": f["video_mask.audio"]}
    emb = model.encode_video(feats, masks)
    # junk in padded frames / missing experts changes nothing (the masks are honoured)
    junk = {k: v.copy() for k, v in feats.items()}
    junk["video"][~masks["video"]] = 1e3
    junk["audio"][~masks["audio"]] = -7.0
    np.testing.assert_allclose(model.encode_video(junk, masks).numpy(), emb.numpy(), atol=1e-5)
    np.save(tmp_path / "t.npy", f["text_features"])
    idx, scores = _query(tmp_path / "i1", tmp_path / "t.npy", 3, capsys)
    ref = (model.encode_text(f["text_features"]) @ emb.T).numpy()
    np.testing.assert_allclose(scores, np.take_along_axis(ref, idx, 1), atol=1e-4)
    # without the audio mask the missing (all-zero) audio rows are refused, naming --expert-mask
    assert main(["index", *full[:-2], "--out", str(tmp_path / "i2")]) == 2
    assert "--expert-mask audio=" in _error(capsys)
    # eval --run with the files == eval --run --data (same numbers, the same protocol)
    t2v = ["--text-features", str(data / "test_text_features.npy"), "--text-to-video",
           str(data / "test_text_to_video.npy")]
    assert main(["eval", *full, *t2v, "--json"]) == 0
    by_flags = json.loads(capsys.readouterr().out)
    assert main(["eval", "--run", str(run), "--data", str(data), "--split", "test", "--json"]) == 0
    by_data = json.loads(capsys.readouterr().out)
    for d in ("t2v", "v2t"):
        for key, value in by_flags[d].items():
            assert by_data[d][key] == pytest.approx(value, abs=1e-9)
    # model.similarity takes the same dicts
    sim = model.similarity(f["text_features"], feats, "none", video_mask=masks)
    np.testing.assert_allclose(sim.numpy(), ref, atol=1e-5)
    # bad combinations are one line naming the flag
    for argv, needle in ((["--expert", "flow=x.npy"], "--expert: flow"), (["--no-mask"], "--no-mask"),
                         (["--expert-mask", "flow=x.npy"], "--expert-mask")):
        assert main(["index", *full, *argv, "--out", str(tmp_path / "i3")]) == 2
        assert needle in _error(capsys)
    assert main(["index", "--run", str(runs["plain"]), "--video-features", str(data / "test_video_features.npy"),
                 "--expert", f"audio={data / 'test_video_features.audio.npy'}", "--out", str(tmp_path / "i4")]) == 2
    assert "no further experts" in _error(capsys)


@pytest.mark.parametrize("which", ["plain", "audio"])
def test_eval_run_gives_the_runs_metrics_json(runs, capsys, which):
    """Every number of metrics.json["test"] (each fitted normaliser, both directions, mAP / nDCG
    from the test relevancy) is what 'eval --run RUN --data DIR --split test' prints."""
    run = runs[which]
    data = runs["plain_data"] if which == "plain" else runs["data"]
    metrics = json.loads((run / "metrics.json").read_text())
    test = metrics["test"]
    assert set(test) >= {"none", "dn", "sinkhorn", "qbnorm"} and "mAP" in test["none"]["t2v"]
    differs = False
    for name in [*(n for n in test if n != "protocol"), "selected"]:  # "protocol": the split's card
        argv = ["eval", "--run", str(run), "--data", str(data), "--split", "test", "--json"]
        assert main(argv + ["--normalizer", name]) == 0
        got = json.loads(capsys.readouterr().out)
        want = test[metrics["normalizer"] if name == "selected" else name]
        for direction in ("t2v", "v2t"):
            assert set(got[direction]) == set(want[direction])
            for key, value in want[direction].items():
                assert got[direction][key] == pytest.approx(value, abs=1e-9), (name, direction, key)
        assert main(argv + ["--normalizer", name, "--v2t-scores", "transpose"]) == 0
        transposed = json.loads(capsys.readouterr().out)
        assert transposed["t2v"] == got["t2v"]
        differs |= transposed["v2t"] != got["v2t"]
        if name in ("none", "dn"):  # one matrix: both protocols agree
            assert transposed["v2t"] == got["v2t"]
    assert differs  # the transpose variant is another protocol for sinkhorn / qbnorm


def test_eval_run_refuses_unmasked_padding_and_mixed_flags(runs, capsys):
    data, run = runs["plain_data"], runs["plain"]
    files = ["--video-features", str(data / "test_video_features.npy"), "--text-features",
             str(data / "test_text_features.npy"), "--text-to-video", str(data / "test_text_to_video.npy")]
    assert main(["eval", "--run", str(run), *files]) == 2
    assert "--video-mask" in _error(capsys)
    assert main(["eval", "--run", str(run), "--data", str(data), "--video-mask", "m.npy"]) == 2
    assert "--data" in _error(capsys)
    assert main(["eval", "--sim", "s.npy", "--text-to-video", "t.npy", "--v2t-scores", "transpose"]) == 2
    assert "--v2t-scores" in _error(capsys)
