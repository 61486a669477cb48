"""bench/paper_evals.py on tiny paired runs: tables written, numbers equal naive recomputations."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import xmodal.data as xd
from xmodal.config import from_dict
from xmodal.models import load_model
from xmodal.training.loop import train

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def _module():
    spec = importlib.util.spec_from_file_location("paper_evals", REPO / "bench" / "paper_evals.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pe")
    s = xd.synthetic(num_train=200, num_val=80, num_test=10, num_concepts=8, seed=0)
    for name, sp in (("train", s["train"]), ("dev", s["val"])):
        np.save(tmp / f"{name}_video_features.npy", sp.video.astype(np.float32))
        np.save(tmp / f"{name}_text_features.npy", sp.text.astype(np.float32))
        np.save(tmp / f"{name}_text_to_video.npy", sp.text_to_video.astype(np.int64))
    runs = []
    for seed in (0, 1):
        cfg = from_dict({"data": {"name": "paired", "root": str(tmp), "val_split": "dev", "test_split": ""},
                         "model": {"dim": 16}, "train": {"epochs": 2, "batch_size": 64, "seed": seed,
                                                          "progress": False},
                         "test_time": {"bank_size": 100, "normalizers": ["none", "dn", "sinkhorn"]}})
        train(cfg, tmp / f"run{seed}", progress=False)
        runs.append(tmp / f"run{seed}")
    return tmp, runs


def test_script_writes_every_table(setup, capsys):
    tmp, runs = setup
    out = tmp / "evals.md"
    rc = _module().main(["--data", str(tmp), "--runs", f"a={runs[0]},{runs[1]}", "--runs", f"b={runs[1]}",
                         "--k", "6", "--out", str(out)])
    assert rc == 0
    text = out.read_text()
    for title in ("Linear probe", "Zero-shot classification", "Head / tail", "FN / FP rate by retrieval mass"):
        assert title in text
    assert "| a | 2 |" in text and "| b | 1 |" in text and "| input image features | 1 |" in text
    dn_row = next(line for line in text.splitlines() if line.startswith("| a: zero-shot, DN − no DN"))
    assert dn_row.endswith("| cannot be decided with 2 paired runs |"), dn_row  # one run, two scorings: paired
    assert _module().main(["--data", str(tmp), "--runs", f"a={tmp / 'nothing'}"]) == 2
    assert "not a finished run directory" in capsys.readouterr().err


@pytest.mark.parametrize("k", [3, 6])
def test_classes_and_numbers_match_naive_loops(setup, k):
    tmp, runs = setup
    pe = _module()
    tr, dev = xd.load_paired_split(tmp, "train"), xd.load_paired_split(tmp, "dev")
    cls = pe.image_classes(tr, dev, k)
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    # naive: mean unit caption per image, centroids of train classes, dev by nearest centroid
    def mean_caps(split):
        return np.stack([np.mean([unit(split.text[t]) for t in range(split.num_texts)
                                  if split.text_to_video[t] == i], axis=0) for i in range(split.num_videos)])
    mtr, mdev = mean_caps(tr), mean_caps(dev)
    assert np.array_equal(cls["train"], xd.kmeans_classes(mtr, k=k, seed=0))
    cents = [unit(sum(unit(mtr[i]) for i in range(len(mtr)) if cls["train"][i] == c)) for c in range(k)]
    for i in range(len(mdev)):
        assert cls["dev"][i] == int(np.argmax([unit(mdev[i]) @ c for c in cents]))
    for c in range(k):  # the caption of class c's images nearest the centroid
        own = [t for t in range(tr.num_texts) if cls["train"][tr.text_to_video[t]] == c]
        assert cls["prompts"][c] == own[int(np.argmax([unit(tr.text[t]) @ cents[c] for t in own]))]
    assert len(set(cls["prompts"].tolist())) == k
    cap = pe.caption_classes(tr, dev, k=20)
    res = pe.evaluate_run(runs[0], tr, dev, cls, cap, dn_seeds=2)
    model = load_model(runs[0])
    img = model.encode_video(dev.video).numpy().astype(np.float64)
    prompts = model.encode_text(tr.text[cls["prompts"]]).numpy().astype(np.float64)
    hits = 0
    for i in range(len(img)):  # zero-shot, no normaliser: cosine argmax (pessimistic ties)
        s = [unit(img[i]) @ unit(p) for p in prompts]
        hits += sum(x >= s[cls["dev"][i]] for x in s) == 1
    assert res["zs_none"]["top1"] == pytest.approx(100.0 * hits / len(img))
    assert len(res["zs_dn"]) == 2
    # DN before the final norm (official zero-shot code): means of the towers' un-normalised
    # outputs over each seed's own sample, x - 0.25 mu_x and c - 0.25 mu_y, then cosine
    raw = lambda t: t.numpy().astype(np.float64)  # noqa: E731
    rimg_tr, rtxt_tr = raw(model.encode_video(tr.video, unit=False)), raw(model.encode_text(tr.text, unit=False))
    rimg, rcls = raw(model.encode_video(dev.video, unit=False)), raw(model.encode_text(tr.text[cls["prompts"]], unit=False))
    for k in range(2):
        def sample_mean(x, side):
            if len(x) <= 100:
                return x.mean(0)
            return x[np.random.default_rng([k, side]).choice(len(x), 100, replace=False)].mean(0)
        mu_x, mu_y = sample_mean(rimg_tr, 0), sample_mean(rtxt_tr, 1)
        hits = 0
        for i in range(len(rimg)):
            s = [unit(rimg[i] - 0.25 * mu_x) @ unit(p - 0.25 * mu_y) for p in rcls]
            hits += sum(x >= s[cls["dev"][i]] for x in s) == 1
        assert res["zs_dn"][k]["top1"] == pytest.approx(100.0 * hits / len(rimg))
    # head/tail R@1 under none: naive per-group loop
    txt = model.encode_text(dev.text).numpy().astype(np.float64)
    from xmodal.metrics import head_tail_groups

    groups = head_tail_groups(cap["dev"], class_counts=cap["counts"], head_mass=0.8)
    for g in ("head", "tail"):
        rows = [t for t in range(len(txt)) if groups[t] == g]
        ok = 0
        for t in rows:
            s = img @ txt[t] / np.linalg.norm(img, axis=1) / np.linalg.norm(txt[t])
            ok += (s >= s[dev.text_to_video[t]]).sum() == 1
        assert res["head_tail"]["none"][g]["R@1"] == pytest.approx(100.0 * ok / len(rows), abs=1e-4)
