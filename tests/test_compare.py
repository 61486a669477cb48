"""Per-query results, protocol cards, `xmodal compare`, and the normaliser selection that does not
chase noise (issue 28; issue 26 item 6)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import xmodal
from xmodal.cli import main
from xmodal.data.synthetic import synthetic
from xmodal.retrieval.perquery import arrays_sha256, card_differences
from xmodal.retrieval.perquery_read import read_per_query

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}


def _train(out, loss="infonce", seed=0, normalizers=("none", "dn", "sinkhorn", "qbnorm"), **test_time):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": dict(TINY)},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": loss, "temperature": 0.05, **({"kwargs": {"queue_size": 256}} if loss == "ncl" else {})},
        "test_time": {"normalizers": list(normalizers), "bank_size": 100, **test_time},
        "train": {"seed": seed, "epochs": 2, "batch_size": 32, "progress": False, "device": "cpu"},
    })
    return train(cfg, out, resume=False, progress=False, verbose=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cmp")
    _train(root / "a")
    _train(root / "b", loss="ncl", normalizers=("none", "dn", "sinkhorn", "ncl", "qbnorm"))
    _train(root / "other_seed", seed=1)
    torch.set_num_threads(before)
    return root


def test_per_query_file_reproduces_metrics_json_and_the_card_is_right(runs):
    m = json.loads((runs / "a" / "metrics.json").read_text())
    results, cards = read_per_query(runs / "a" / "per_query.npz")
    with np.load(runs / "a" / "per_query.npz", allow_pickle=False) as z:  # plain arrays only
        assert "test/none/t2v/rank" in z.files and z["test/none/t2v/rank"].dtype == np.int32
    assert set(results) == {"val", "test"}
    for split in ("val", "test"):
        for name, dirs in results[split].items():
            ref = m[split].get(name) or m["oracle"][split][name]
            for d, v in dirs.items():
                r = v["rank"]
                for k in (1, 5, 10):
                    assert 100 * np.mean(r <= k) == pytest.approx(ref[d][f"R@{k}"], abs=1e-9), (split, name, d, k)
                assert np.mean(r) == pytest.approx(ref[d]["MnR"]) and np.median(r) == ref[d]["MdR"]
                assert np.nanmean(v["ap"].astype(np.float64)) == pytest.approx(ref[d]["mAP"], rel=1e-5)
        card = m[split]["protocol"]
        assert cards[split] == card
        data = synthetic(**TINY, seed=0)[split]
        assert card["num_queries"] == {"t2v": data.num_texts, "v2t": data.num_videos}
        assert card["gallery_size"] == {"t2v": data.num_videos, "v2t": data.num_texts}
        assert card["chance_r1"]["t2v"] == pytest.approx(100 / data.num_videos, abs=1e-5)
        counts = np.bincount(data.text_to_video)
        assert card["chance_r1"]["v2t"] == pytest.approx(100 * np.mean(counts / data.num_texts), abs=1e-5)
        assert card["tie_rule"] == "pessimistic" and card["v2t"] == "all-captions" and card["caption_policy"] == "all"
        assert card["normalizer"] == m["normalizer"] and card["uses_test_queries"] is False
        assert card["normalizers"]["sinkhorn_oracle"]["uses_test_queries"] is True
        assert card["normalizers"]["none"]["bank_source"] == "none"
        assert card["split_sha256"] == arrays_sha256({
            "video": data.video, "text": data.text, "text_to_video": data.text_to_video,
            "relevancy": data.mir_relevancy()})
        assert "git_revision" in card
    assert "protocol" not in xmodal.load_model(runs / "a").test_time.val  # the card lives in metrics.json only


def test_report_shows_the_card_the_selection_and_the_intervals(runs):
    from xmodal.reporting.report import build_report

    page = build_report(runs / "a", out=runs / "a_report.html", num_examples=1).read_text()
    for needle in ("Protocol card", "split sha256", "Normaliser selection on val", "Intervals (per-query bootstrap)",
                   "95% CI"):
        assert needle in page, needle


def test_compare_identical_runs_gives_zero_and_json(runs, capsys):
    assert main(["compare", str(runs / "a"), str(runs / "a"), "--json", "--n-boot", "500"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "test" and out["protocol_differences"] == []
    assert {r["metric"] for r in out["rows"]} == {"R@1", "R@5", "R@10", "MdR", "MnR", "mAP"}
    assert {r["direction"] for r in out["rows"]} == {"t2v", "v2t"}
    for r in out["rows"]:
        assert r["diff"] == 0 and r["ci_low"] <= 0 <= r["ci_high"] and r["p_value"] == 1
        assert r["verdict"] == "no clear difference" and r["std_a"] is None


def test_compare_two_runs_markdown_matches_their_metrics(runs, capsys):
    assert main(["compare", str(runs / "a"), str(runs / "b"), "--normalizer", "none", "--n-boot", "500"]) == 0
    text = capsys.readouterr().out
    ma = json.loads((runs / "a" / "metrics.json").read_text())["test"]["none"]["t2v"]["R@1"]
    mb = json.loads((runs / "b" / "metrics.json").read_text())["test"]["none"]["t2v"]["R@1"]
    row = next(line for line in text.splitlines() if line.startswith("| t2v | R@1 |"))
    assert f"| {ma:.2f} | {mb:.2f} | {mb - ma:+.2f} |" in row
    assert "Holm over the 12 rows of each table" in text


def test_compare_refuses_different_protocol_cards_and_names_the_fields(runs, capsys):
    # another seed of the synthetic data: other queries
    assert main(["compare", str(runs / "a"), str(runs / "other_seed"), "--n-boot", "200"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("xmodal compare: error:")
    assert "split_sha256" in err and "--force" in err
    # other queries are never paired, even with --force (issue 35.2: --force paired them by position)
    assert main(["compare", str(runs / "a"), str(runs / "other_seed"), "--n-boot", "200", "--force"]) == 2
    assert "cannot be paired, even with --force" in capsys.readouterr().err
    # the same queries under an oracle normaliser: a protocol difference --force accepts, with a warning
    assert main(["compare", str(runs / "a"), str(runs / "a"), "--normalizer", "none", "--normalizer-b",
                 "sinkhorn_oracle", "--n-boot", "200", "--force"]) == 0
    assert "WARNING (--force)" in capsys.readouterr().out
    # an oracle (fitted on the test queries) against a deployable normaliser
    assert main(["compare", str(runs / "a"), str(runs / "a"), "--normalizer", "none",
                 "--normalizer-b", "sinkhorn_oracle", "--n-boot", "200"]) == 2
    assert "uses_test_queries: False vs True" in capsys.readouterr().err
    assert card_differences({"tie_rule": "pessimistic", "v2t": "all-captions"},
                            {"tie_rule": "optimistic", "v2t": "all-captions"}) == \
        ["tie_rule: 'pessimistic' vs 'optimistic'"]


def test_compare_seed_groups_by_glob(runs, tmp_path, capsys):
    for side, src in (("x", "a"), ("y", "b")):
        for s in range(3):
            shutil.copytree(runs / src, tmp_path / f"{side}_s{s}")
            (tmp_path / f"{side}_s{s}.log").write_text("a sweep's log beside the run: not a run\n")
    assert main(["compare", "--a", str(tmp_path / "x_s*"), "--b", str(tmp_path / "y_s*"), "--normalizer", "none",
                 "--metrics", "R@1,MnR", "--json", "--n-boot", "300"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["a"]["runs"]) == 3 and len(out["b"]["runs"]) == 3
    for r in out["rows"]:
        assert r["seeds_a"] == r["seeds_b"] == 3 and "p_value_seeds" in r
        # C(6, 3) = 20 run labelings; all-A-left and its mirror are the extremes (when A and B differ)
        assert r["p_value_seeds_min"] == pytest.approx(0.1 if r["diff"] != 0 else 1.0)
    ra, _ = read_per_query(runs / "a" / "per_query.npz")
    rb, _ = read_per_query(runs / "b" / "per_query.npz")
    single = 100 * (np.mean(rb["test"]["none"]["t2v"]["rank"] <= 1) - np.mean(ra["test"]["none"]["t2v"]["rank"] <= 1))
    paired = next(r for r in out["rows"] if r["direction"] == "t2v" and r["metric"] == "R@1")
    assert paired["diff"] == pytest.approx(single)


def test_compare_bad_input_is_one_line(runs, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv, needle in [([], "required"), ([str(empty), str(runs / "a")], "per_query.npz"),
                         ([str(runs / "a"), str(tmp_path / "nope_*")], "no run directory or .npz matches"),
                         ([str(runs / "a"), str(runs / "a"), "--metrics", "R@x"], "--metrics"),
                         ([str(runs / "a"), str(runs / "a"), "--split", "train"], "--split"),
                         ([str(runs / "a"), str(runs / "a"), "--directions", "p2v"], "--directions"),
                         ([str(runs / "a"), str(runs / "a"), "--normalizer", "ncl"], "--normalizer")]:
        assert main(["compare", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("xmodal compare: error:") and needle in err, err


def test_eval_per_query_equals_the_trainers(runs, tmp_path, capsys):
    data = synthetic(**TINY, seed=0)["test"]
    data.save(tmp_path / "data", "test")
    out = tmp_path / "eval.npz"
    assert main(["eval", "--run", str(runs / "b"), "--data", str(tmp_path / "data"), "--split", "test",
                 "--normalizer", "ncl", "--per-query", str(out)]) == 0
    capsys.readouterr()
    results, cards = read_per_query(out)
    train_results, train_cards = read_per_query(runs / "b" / "per_query.npz")
    for d in ("t2v", "v2t"):
        assert np.array_equal(results["test"]["ncl"][d]["rank"], train_results["test"]["ncl"][d]["rank"])
    assert card_differences(train_cards["test"], cards["test"], normalizer_a="ncl", normalizer_b="ncl") == []
    assert main(["compare", str(runs / "b"), str(out), "--normalizer", "ncl", "--json", "--n-boot", "200"]) == 0
    assert all(r["diff"] == 0 for r in json.loads(capsys.readouterr().out)["rows"])
    assert main(["eval", "--run", str(runs / "b"), "--data", str(tmp_path / "data"), "--ties", "average",
                 "--per-query", str(out)]) == 2
    assert "--per-query" in capsys.readouterr().err


# ----------------------------------------------------------------------------- selection (issue 26 item 6)


def _val(ranks: dict) -> tuple[dict, dict]:
    """Metrics and per-query results of made-up per-normaliser t2v / v2t ranks."""
    from xmodal.metrics._common import summarize

    val, per_query = {}, {}
    for name, (t, v) in ranks.items():
        per_query[name] = {"t2v": {"rank": t}, "v2t": {"rank": v}}
        val[name] = {d: summarize(torch.as_tensor(r), torch.zeros(len(r), dtype=torch.long),
                                  torch.ones(len(r), dtype=torch.long), (1, 5, 10))
                     for d, r in (("t2v", t), ("v2t", v))}
    return val, per_query


def test_selection_keeps_none_unless_the_gain_is_clear():
    from xmodal.retrieval.selection import select_normalizer
    from xmodal.retrieval.testtime import select

    g = np.random.default_rng(0)
    t, v = g.integers(1, 40, 400), g.integers(1, 40, 80)
    noisy_t = t.copy()
    noisy_t[:3] = 1  # three queries: +0.75 R@1, a gain no larger than noise
    val, pq = _val({"none": (t, v), "qbnorm": (noisy_t, v), "sinkhorn": (np.maximum(1, t - 8), v)})
    names = ["none", "qbnorm", "sinkhorn"]
    rec = select_normalizer(names, val, pq, "r1")
    assert not rec["tests"]["qbnorm"]["clear"] and rec["tests"]["sinkhorn"]["clear"]
    assert rec["selected"] == "sinkhorn" and rec["index_normalizer"] == "sinkhorn" and rec["index_note"] is None
    # without sinkhorn: the old rule (highest score) takes QB-Norm's noise, the paired rule keeps none
    val2, pq2 = _val({"none": (t, v), "qbnorm": (noisy_t, v)})
    from xmodal.retrieval.evaluate import score
    from xmodal.retrieval.testtime import TestTime

    assert select(TestTime(names=("none", "qbnorm")), val2, lambda m: score(m, "r1")) == "qbnorm"
    assert select_normalizer(["none", "qbnorm"], val2, pq2, "r1")["selected"] == "none"
    assert select_normalizer(["none", "qbnorm"], val2, pq2, "r1", rule="best")["selected"] == "qbnorm"
    # the decision is the lower end of the paired bootstrap interval: scipy's agrees
    from scipy import stats

    hits = lambda r: 100.0 * (r <= 1)  # noqa: E731
    ref = stats.bootstrap((hits(t), hits(np.maximum(1, t - 8))), lambda x, y, axis=-1: y.mean(axis) - x.mean(axis),
                          paired=True, method="percentile", random_state=0).confidence_interval
    assert (ref.low > 0) == rec["tests"]["sinkhorn"]["clear"]


def test_an_unfoldable_selection_names_the_index_normaliser_and_why():
    from xmodal.retrieval.selection import select_normalizer

    g = np.random.default_rng(1)
    t, v = g.integers(1, 40, 400), g.integers(1, 40, 80)
    small = t.copy()
    small[:2] = 1
    val, pq = _val({"none": (t, v), "sinkhorn": (small, v), "qbnorm": (np.maximum(1, t - 10), v)})
    rec = select_normalizer(["none", "sinkhorn", "qbnorm"], val, pq, "rsum")
    assert rec["selected"] == "qbnorm" and rec["index_normalizer"] == "none"
    assert "no foldable normaliser is clear of none" in rec["index_note"]


def test_index_folds_the_normaliser_the_runs_summary_names(tmp_path, capsys):
    """Issue 26 item 6: the run selected QB-Norm, its summary said nothing about the index, and
    ``index --normalizer selected`` folded the best foldable normaliser by raw val score."""
    pytest.importorskip("faiss")
    from xmodal.retrieval.index import best_foldable
    from xmodal.retrieval.testtime import TestTime

    val, _ = _val({"none": (np.array([5, 5, 5]), np.array([5, 5])),
                   "sinkhorn": (np.array([1, 5, 5]), np.array([5, 5])),
                   "qbnorm": (np.array([1, 1, 5]), np.array([5, 5]))})
    model = type("M", (), {})()
    model.test_time = TestTime(names=("none", "sinkhorn", "qbnorm"), selected="qbnorm", val=val,
                               selection={"index_normalizer": "none"})
    assert best_foldable(model) == "none"  # the recorded choice, not sinkhorn's noisy +33 R@1
    model.test_time.selection = {}
    assert best_foldable(model) == "sinkhorn"  # a run written before the record: the former rule

    summary = _train(tmp_path / "run", normalizers=("none", "qbnorm"), bank_size=100)
    data = synthetic(**TINY, seed=0)["test"]
    np.save(tmp_path / "v.npy", data.video)
    assert main(["index", "--run", str(tmp_path / "run"), "--video-features", str(tmp_path / "v.npy"),
                 "--out", str(tmp_path / "idx")]) == 0
    err = capsys.readouterr().err
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["normalizer"] == summary["index_normalizer"]
    if summary["normalizer"] == "qbnorm":
        assert summary["index_note"] in err
    from xmodal.commands.train import format_summary

    assert "index: " in format_summary(summary)
