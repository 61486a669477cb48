"""``xmodal.training.fit`` on in-memory splits and ``PairedSplit.save``: the layout round trip
is exact, and fitting in memory equals training on the saved files (same seed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xmodal.config import from_dict
from xmodal.data import PairedSplit, load_paired_split, synthetic
from xmodal.training import fit
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


def _full_split(rng) -> PairedSplit:
    n, f, m = 6, 4, 9
    mask = np.ones((n, f), bool)
    mask[1, 2:] = False
    mask[4, 1:] = False
    audio_mask = np.array([True, False, True, True, False, True])
    return PairedSplit.from_arrays(
        video=rng.standard_normal((n, f, 5)), text=rng.standard_normal((m, 3)),
        text_to_video=[0, 0, 1, 2, 3, 3, 4, 5, 5], video_mask=mask,
        experts={"audio": rng.standard_normal((n, 2))}, expert_masks={"audio": audio_mask},
        video_labels=np.arange(n) % 2, text_labels=np.arange(m) % 3,
        captions=[f"a caption, number {i} – with “quotes”" for i in range(m)],
        video_names=[f"clip_{i}.mp4" for i in range(n)], relevancy=rng.random((m, n)).astype(np.float32))


def test_save_then_load_round_trip_is_equal(tmp_path):
    split = _full_split(np.random.default_rng(0))
    written = split.save(tmp_path / "data", "train")
    assert all(p.is_file() for p in written) and not list((tmp_path / "data").glob(".*tmp*"))
    back = load_paired_split(tmp_path / "data", "train")
    for key in ("video", "text", "text_to_video", "video_mask", "video_labels", "text_labels", "relevancy"):
        a, b = getattr(split, key), getattr(back, key)
        assert a.dtype == b.dtype and np.array_equal(a, b), key
    assert back.captions == split.captions and back.video_names == split.video_names
    assert back.experts.keys() == {"audio"} and np.array_equal(back.experts["audio"], split.experts["audio"])
    assert np.array_equal(back.expert_masks["audio"], split.expert_masks["audio"])


def test_save_refuses_what_the_layout_cannot_hold(tmp_path):
    split = PairedSplit.from_arrays(video=np.ones((2, 3)), text=np.ones((2, 3)), text_to_video=[0, 1],
                                    captions=["fine", "a\ttab"])
    with pytest.raises(ValueError, match="captions: entry 1"):
        split.save(tmp_path, "train")
    with pytest.raises(ValueError, match="split"):
        PairedSplit.from_arrays(video=np.ones((2, 3)), text=np.ones((2, 3)), text_to_video=[0, 1]).save(
            tmp_path, "a/b")


def _cfg(data: dict):
    return from_dict({"data": {"noise": 0.1, "max_train_texts": 100, **data}, "model": {"kind": "linear", "dim": 16},
                      "loss": {"name": "infonce", "temperature": 0.1},
                      "test_time": {"normalizers": ["none", "dn", "sinkhorn"], "bank_size": 50},
                      "train": {"seed": 5, "epochs": 3, "batch_size": 16, "patience": 0, "device": "cpu"}})


def test_fit_in_memory_equals_train_on_saved_files(tmp_path):
    s = synthetic(num_train=80, num_val=40, num_test=40, num_concepts=8, seed=1)
    splits = {"train": s["train"], "val": s["val"], "test": s["test"]}
    for name, split in splits.items():
        split.save(tmp_path / "data", name)
    files_summary = train(_cfg({"name": "paired", "root": str(tmp_path / "data")}), tmp_path / "files",
                          verbose=False)
    model, summary = fit(_cfg({}), splits, verbose=False)
    assert summary["val"] == files_summary["val"] and summary["test"] == files_summary["test"]
    assert summary["best_epoch"] == files_summary["best_epoch"]
    ref = torch.load(tmp_path / "files" / "model.pt", weights_only=True)["model"]["state_dict"]
    got = model.state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    # with an out directory: a full run directory, no data files in its provenance
    fit(_cfg({}), splits, out=tmp_path / "mem", verbose=False)
    import json

    assert (tmp_path / "mem" / "model.pt").is_file()
    assert json.loads((tmp_path / "mem" / "provenance.json").read_text())["data"] == {}


def test_fit_names_bad_splits():
    s = synthetic(num_train=40, num_val=20, num_test=20, num_concepts=4, seed=0)
    with pytest.raises(ValueError, match="splits: expected a dict with 'train' and 'val'"):
        fit(_cfg({}), {"train": s["train"]}, verbose=False)
    with pytest.raises(TypeError, match=r"splits\['val'\]"):
        fit(_cfg({}), {"train": s["train"], "val": s["val"].text}, verbose=False)


def test_docstring_examples_run():
    import doctest

    import xmodal.data.types
    import xmodal.training.inmemory

    for mod in (xmodal.data.types, xmodal.training.inmemory):
        res = doctest.testmod(mod)
        assert res.attempted > 0 and res.failed == 0, mod.__name__
