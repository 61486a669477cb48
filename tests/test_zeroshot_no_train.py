"""A zero-shot run needs no train split (issue 42.1): ``model.kind: identity`` on a layout with only val
and test runs through the CLI; none and DN (``dn_source: val``) equal recall by hand and DN fitted on the
val embeddings; the normalisers fitted on a bank of train queries (Sinkhorn, QB-Norm, IS, NCL's queue,
DN with ``dn_source: train``) each say so in one line and are skipped; index, query, eval and report
take the run; a trained model, or a partly written train split, still needs one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_zeroshot import DIM, DN, close, config, embeddings, recalls  # noqa: E402

from xmodal.cli import main  # noqa: E402
from xmodal.config import from_dict  # noqa: E402
from xmodal.data import load_paired_split  # noqa: E402
from xmodal.data.synthetic import synthetic  # noqa: E402
from xmodal.data.writer import save_split  # noqa: E402
from xmodal.normalize import DistributionNormalization  # noqa: E402
from xmodal.retrieval.testtime import fit_test_time  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
BANKED = ["sinkhorn", "qbnorm", "is"]


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("zsnt") / "data"
    for name, split in synthetic(num_train=20, num_val=40, num_test=30, video_dim=DIM, text_dim=DIM, frames=3,
                                 num_concepts=6, seed=5).items():
        if name != "train":  # val and test only
            save_split(split, root, name)
    return root


def write_config(path: Path, root: Path, **over) -> Path:
    cfg = config(root, **over)
    cfg["test_time"]["normalizers"] = ["none", "dn", *BANKED, "dsl"]
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_the_cli_runs_without_a_train_split_and_says_what_it_skips(layout, tmp_path, capsys):
    cfg = write_config(tmp_path / "zs.yaml", layout)
    assert not list(layout.glob("train_*"))
    capsys.readouterr()
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("xmodal train: note: ")]
    for name in BANKED:  # one line each, naming it and why
        mine = [n for n in notes if n.startswith(f"xmodal train: note: {name}: ")]
        assert len(mine) == 1 and "no train split 'train', so it is skipped" in mine[0], notes
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["val"]) - {"protocol"} == {"none", "dn", "dsl"} and metrics["no_train_split"] == "train"
    assert set(metrics["dropped_normalizers"]) == set(BANKED)
    for split in ("val", "test"):  # none by hand
        s = load_paired_split(layout, split)
        t, v = embeddings(s)
        close(metrics[split]["none"], recalls(t @ v.T, np.asarray(s.text_to_video)))
    # DN from the val split (DN Sec. 4.3): the 5 seeds' means averaged, as the run with a train split
    val_t, val_v = (torch.from_numpy(x.astype(np.float32)) for x in embeddings(load_paired_split(layout, "val")))
    s = load_paired_split(layout, "test")
    t, v = (torch.from_numpy(x.astype(np.float32)) for x in embeddings(s))
    dn = DistributionNormalization(lam=DN["lam"], num_samples=DN["num_samples"], seeds=DN["seeds"]).fit(val_t, val_v)
    q, g = dn.transform(t, v)
    close(metrics["test"]["dn"], recalls((q @ g.T).double().numpy(), np.asarray(s.text_to_video)))


def test_dn_from_train_is_skipped_and_says_how_to_keep_it(layout, tmp_path, capsys):
    cfg = write_config(tmp_path / "zs.yaml", layout, test_time__dn_source="train", test_time__dn_seeds=1)
    capsys.readouterr()
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("xmodal train: note: dn: ")]
    assert len(line) == 1 and "test_time.dn_source: val fits DN on the val split" in line[0]
    assert set(json.loads((tmp_path / "run" / "metrics.json").read_text())["val"]) - {"protocol"} == {"none", "dsl"}


def test_index_query_eval_and_report_take_the_run(layout, tmp_path, capsys):
    cfg = write_config(tmp_path / "zs.yaml", layout)
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["eval", "--run", str(out), "--data", str(layout), "--split", "test", "--normalizer", "dn",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["t2v"]["R@1"] == pytest.approx(metrics["test"]["dn"]["t2v"]["R@1"])
    assert main(["index", "--run", str(out), "--data", str(layout), "--split", "test", "--out", str(tmp_path / "i"),
                 "--normalizer", "dn", "--quiet"]) == 0
    np.save(tmp_path / "q.npy", np.asarray(load_paired_split(layout, "test").text[:2], dtype=np.float32))
    assert main(["query", "--index", str(tmp_path / "i"), "--text-features", str(tmp_path / "q.npy"), "--k", "3"]) == 0
    assert main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert "this zero-shot run has no train split" in (tmp_path / "r.html").read_text()


def test_a_trained_model_or_a_partial_train_split_still_needs_one(layout, tmp_path):
    cfg = config(layout, model__kind="linear", train__epochs=1)
    with pytest.raises(ValueError, match="^data.train_split: missing file"):
        from_dict(cfg)
    partial = tmp_path / "partial"
    partial.mkdir()
    for f in layout.iterdir():
        (partial / f.name).write_bytes(f.read_bytes())
    (partial / "train_text_features.npy").write_bytes((layout / "val_text_features.npy").read_bytes())
    with pytest.raises(ValueError, match="^data.train_split: missing file") as err:
        from_dict(config(partial))
    assert "\n" not in str(err.value)


def test_fit_test_time_without_train_banks_keeps_only_what_needs_none():
    g = torch.Generator().manual_seed(0)
    t, v = torch.randn(20, 4, generator=g), torch.randn(20, 4, generator=g)
    names = ["none", "dn", "sinkhorn", "qbnorm", "is", "ncl", "dsl"]
    assert fit_test_time(names, text_bank=None, video_bank=None, temperature=0.05).names == ("none", "dsl")
    tt = fit_test_time(names, text_bank=None, video_bank=None, temperature=0.05, dn_bank=(t, v), dn_source="val",
                       dn_num_samples=None)
    assert tt.names == ("none", "dn", "dsl") and "train" not in tt.banks
    want = DistributionNormalization(lam=0.25, num_samples=None).fit(t, v).transform(t, v)
    got = DistributionNormalization.from_state_dict(tt.dn).transform(t, v)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="give both train banks, or neither"):
        fit_test_time(names, text_bank=t, video_bank=None, temperature=0.05)
