"""`xmodal compare` claims only what its numbers support (issue 35 items 1-2, issue 36 items 5, 6, 10).

Seed groups are judged by a test over seeds (and say when they cannot be decided), R@K uses
McNemar's exact test, p-values at the resampling floor print as bounds, -0.0 is never printed,
what is compared (heads alone / as deployed, val) is said, queries are paired by identity,
`eval --per-query` names its split as the run does and never replaces a file it did not
write, and hostile per_query.npz / metrics.json files are refused in one line.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile

import numpy as np
import pytest
import torch
from scipy import stats

from xmodal.cli import main
from xmodal.data.synthetic import synthetic
from xmodal.metrics.paired import format_diff, format_p, paired_test, seed_test
from xmodal.retrieval.perquery import write_per_query
from xmodal.retrieval.perquery_read import read_per_query

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}


# ----------------------------------------------------------------------------- crafted per-query files
def _card(q=(400, 100), gallery=(100, 400), sha="ab" * 32, normalizer="none", uses=False) -> dict:
    return {"num_queries": {"t2v": q[0], "v2t": q[1]}, "gallery_size": {"t2v": gallery[0], "v2t": gallery[1]},
            "chance_r1": {"t2v": 100 / gallery[0], "v2t": 1.0}, "caption_policy": "all", "captions_per_video": 4.0,
            "v2t": "all-captions", "tie_rule": "pessimistic", "normalizer": normalizer, "bank_source": "none",
            "uses_test_queries": uses,
            "normalizers": {n: {"bank_source": "none", "uses_test_queries": n.endswith("oracle")}
                            for n in ("none", "sinkhorn", "ncl", "sinkhorn_oracle")},
            "split_sha256": sha, "git_revision": None, "git_dirty": None}


def _run(root, name, ranks: dict, *, split="test", selected="none", card=None, ids=None, metrics=True):
    """A run folder with a per_query.npz of ``ranks`` ``{normaliser: (t2v, v2t)}`` and a matching metrics.json."""
    run = root / name
    run.mkdir(parents=True)
    card = card or _card(q=(len(ranks["none"][0]), len(ranks["none"][1])), normalizer=selected)
    results = {split: {n: {"t2v": {"rank": np.asarray(t)}, "v2t": {"rank": np.asarray(v)}} for n, (t, v) in ranks.items()}}
    write_per_query(run / "per_query.npz", results, {split: card}, ids=ids)
    if metrics:
        m = {"normalizer": selected, split: {n: {d: {"R@1": 100.0 * float(np.mean(np.asarray(r) <= 1))}
                                                 for d, r in zip(("t2v", "v2t"), tv)} for n, tv in ranks.items()}}
        m[split]["protocol"] = card
        (run / "metrics.json").write_text(json.dumps(m))
    return run


def _ranks(seed: int, shift: int = 0, n=(400, 100)):
    g = np.random.default_rng(seed)
    return (np.maximum(1, g.integers(1, 30, n[0]) - shift), np.maximum(1, g.integers(1, 60, n[1]) - shift))


def _cli(capsys, *argv):
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# ----------------------------------------------------------------------------- 35.1 the statistics
def test_seed_test_enumerates_exactly_as_scipy_and_samples_beyond_the_bound():
    g = np.random.default_rng(0)
    a, b = g.normal(0, 1, 4), g.normal(1.5, 1, 5)
    mine = seed_test(a, b)
    absdiff = lambda x, y, axis=-1: np.abs(y.mean(axis) - x.mean(axis))  # noqa: E731  (two-sided: |T*| >= |T|)
    ref = stats.permutation_test((a, b), absdiff, permutation_type="independent", n_resamples=10 ** 6,
                                 alternative="greater")
    assert mine["exact"] and mine["labelings"] == 126 and mine["p_value"] == pytest.approx(ref.pvalue, abs=1e-12)
    assert seed_test([1.0, 2, 3], [4.0, 5, 6])["p_value_min"] == pytest.approx(0.1)  # 2 of C(6, 3)
    assert seed_test([1.0, 2, 3], [4.0, 5, 6], paired=True)["p_value_min"] == pytest.approx(0.25)  # 2 of 2^3
    # 14 + 14 runs (C(28, 14) = 4e7 labellings; issue 36.6: > 16 min and > 1.3 GB before): Monte-Carlo, bound stated
    a, b = g.normal(0, 1, 14), g.normal(0.8, 1, 14)
    mc = seed_test(a, b, n_perm=4000, seed=1)
    assert not mc["exact"] and "Monte-Carlo" in mc["test"] and "100000" in mc["test"]
    ref = stats.permutation_test((a, b), absdiff, permutation_type="independent", n_resamples=20000,
                                 random_state=2, alternative="greater")
    assert mc["p_value"] == pytest.approx(ref.pvalue, abs=0.02)
    assert mc["p_value_min"] == pytest.approx(1 / 4001)


def test_r_at_k_of_one_run_each_is_mcnemars_exact_test():
    g = np.random.default_rng(1)
    ra = g.integers(1, 4, 5000)
    rb = ra.copy()
    rb[:300] = 1  # 300 queries move to rank 1 (some already were)
    up, down = int(np.sum((rb <= 1) & (ra > 1))), int(np.sum((rb > 1) & (ra <= 1)))
    r = paired_test(ra, rb, metric="R@1", n_boot=200)
    ref = stats.binomtest(up, up + down).pvalue
    assert r["test"] == "McNemar exact" and r["exact"] and not r["p_floor"]
    assert r["p_value"] == pytest.approx(ref, rel=1e-9) and r["p_value"] < 1e-30  # not floored at 1e-4


def test_a_p_value_at_the_resampling_floor_is_a_bound_and_no_minus_zero_is_printed(tmp_path, capsys):
    a = _ranks(0)
    b = (np.maximum(1, a[0] - 5), a[1].copy())
    b[1][0] = max(1, b[1][0] - 1)  # v2t: one query one place better: MnR -0.01, not "-0.0"
    _run(tmp_path, "a", {"none": a})
    _run(tmp_path, "b", {"none": b})
    code, out, err = _cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--n-boot", "1000")
    assert code == 0, err
    mnr = next(line for line in out.splitlines() if line.startswith("| t2v | MnR |"))
    assert "< 1.0e-03" in mnr  # no sign pattern of 1,000 reached it: 1/1001 is a bound
    assert not re.search(r"-0\.0+(?![0-9])", out), out
    v2t = next(line for line in out.splitlines() if line.startswith("| v2t | MnR |"))
    assert "-0.01" in v2t
    assert format_diff(-0.0, 1) == "0.0" and format_p(1 / 10001, floor=True) == "< 1.0e-04"


def test_seed_groups_are_judged_over_seeds_and_say_when_they_cannot_be_decided(tmp_path, capsys):
    """Issue 35.1: 3 + 3 seeds printed 'B better' on every row beside p (seed labels) 0.10."""
    for s in range(3):
        a = _ranks(s)
        _run(tmp_path, f"x_s{s}", {"none": a})
        _run(tmp_path, f"y_s{s}", {"none": (np.maximum(1, a[0] - 3), np.maximum(1, a[1] - 3))})
    code, out, err = _cli(capsys, "compare", "--a", str(tmp_path / "x_s*"), "--b", str(tmp_path / "y_s*"),
                          "--json", "--n-boot", "500")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    for r in rows:
        assert r["unit"] == "seeds" and r["p_value"] >= 0.1 - 1e-12 and r["p_value_queries"] < 0.01
        assert r["verdict"] == "cannot be decided with 3 + 3 seeds"
    code, text, _ = _cli(capsys, "compare", "--a", str(tmp_path / "x_s*"), "--b", str(tmp_path / "y_s*"),
                         "--n-boot", "500", "--metrics", "R@1", "--directions", "t2v")
    assert "cannot be decided with 3 + 3 seeds" in text and "B better" not in text
    assert "run labels permuted, exact (20 labellings of 3 + 3 runs)" in text
    # 5 + 5 seeds, one question: decidable (2 / C(10, 5) = 0.008)
    for s in range(3, 5):
        a = _ranks(s)
        _run(tmp_path, f"x_s{s}", {"none": a})
        _run(tmp_path, f"y_s{s}", {"none": (np.maximum(1, a[0] - 3), np.maximum(1, a[1] - 3))})
    code, out, _ = _cli(capsys, "compare", "--a", str(tmp_path / "x_s*"), "--b", str(tmp_path / "y_s*"), "--json",
                        "--n-boot", "500", "--metrics", "R@1", "--directions", "t2v")
    r = json.loads(out)["rows"][0]
    assert r["verdict"] == "B better" and r["p_value"] == pytest.approx(2 / 252)


def test_the_same_runs_under_two_normalisers_are_paired_runs_not_two_seed_groups(tmp_path, capsys):
    """Issue 45.3: a normaliser's gain on 3 runs is 3 paired runs (sign flip, floor 0.25), not 3 + 3 seeds."""
    for s in range(3):
        a = _ranks(s)
        _run(tmp_path, f"x_s{s}", {"none": a, "sinkhorn": (np.maximum(1, a[0] - 3), np.maximum(1, a[1] - 3))})
    code, out, err = _cli(capsys, "compare", "--a", str(tmp_path / "x_s*"), "--b", str(tmp_path / "x_s*"),
                          "--normalizer", "none", "--normalizer-b", "sinkhorn", "--json", "--n-boot", "300",
                          "--metrics", "R@1", "--directions", "t2v")
    assert code == 0, err
    r = json.loads(out)["rows"][0]
    assert r["p_value_min"] == pytest.approx(0.25)  # 2 of the 2^3 sign patterns
    assert r["verdict"] == "cannot be decided with 3 paired runs"


# ----------------------------------------------------------------------------- 35.2 what is compared
def test_default_shows_heads_alone_and_each_run_as_deployed_naming_mixed_normalisers(tmp_path, capsys):
    for s, sel in enumerate(("sinkhorn", "ncl", "ncl")):
        a = _ranks(s)
        _run(tmp_path, f"x_s{s}", {"none": a, "sinkhorn": a}, selected="sinkhorn")
        b = (np.maximum(1, a[0] - 1), a[1])
        _run(tmp_path, f"y_s{s}", {"none": b, "sinkhorn": b, "ncl": b}, selected=sel)
    code, out, err = _cli(capsys, "compare", "--a", str(tmp_path / "x_s*"), "--b", str(tmp_path / "y_s*"),
                          "--json", "--n-boot", "300")
    assert code == 0, err
    res = json.loads(out)
    assert [c["label"] for c in res["comparisons"]] == ["heads alone", "as deployed"]
    assert res["comparisons"][0]["b"]["normalizers"] == ["none"] * 3
    assert res["comparisons"][1]["b"]["normalizers"] == ["sinkhorn", "ncl", "ncl"]
    assert {r["compared"] for r in res["rows"]} == {"heads alone", "as deployed"}
    code, text, _ = _cli(capsys, "compare", "--a", str(tmp_path / "x_s*"), "--b", str(tmp_path / "y_s*"),
                         "--n-boot", "300")
    assert "### Heads alone: none vs none" in text and "### As deployed" in text
    assert "MIX normalisers (ncl, sinkhorn)" in text and "y_s0 (sinkhorn)" in text


def test_on_val_the_header_says_val_chose_the_epoch_and_the_normaliser(tmp_path, capsys):
    _run(tmp_path, "a", {"none": _ranks(0)}, split="val")
    _run(tmp_path, "b", {"none": _ranks(1)}, split="val")
    code, out, err = _cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--n-boot", "200")
    assert code == 0, err
    assert "val chose each run's epoch" in out and "defaulted to val" in out and "have no test split" in out


def test_refusals_name_a_then_b_and_give_values_in_that_order(tmp_path, capsys):
    _run(tmp_path, "a", {"none": _ranks(0)})
    card = _card()
    card["tie_rule"] = "optimistic"
    _run(tmp_path, "b", {"none": _ranks(1)}, card=card)
    code, _, err = _cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 2
    assert f"{tmp_path / 'a'} (A) vs {tmp_path / 'b'} (B): tie_rule: 'pessimistic' vs 'optimistic'" in err, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run trained on a data folder (train / dev as val / test), a copy of test with its texts and
    videos in another order, and test's arrays as plain .npy files (eval's flags)."""
    from xmodal.config import from_dict
    from xmodal.data import PairedSplit
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("claims")
    data = synthetic(**TINY, seed=0)
    plain = {k: PairedSplit.from_arrays(video=v.video, text=v.text, text_to_video=v.text_to_video)
             for k, v in data.items()}
    for name, split in (("train", "train"), ("dev", "val"), ("test", "test")):
        plain[split].save(root / "data", name)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(from_dict({"data": {"name": "paired", "root": str(root / "data"), "train_split": "train",
                                  "val_split": "dev", "test_split": "test"},
                         "model": {"kind": "linear", "dim": 16}, "loss": {"name": "infonce", "temperature": 0.05},
                         "test_time": {"normalizers": ["none", "sinkhorn"], "bank_size": 100},
                         "train": {"seed": 0, "epochs": 2, "batch_size": 32, "progress": False, "device": "cpu"}}),
              root / "run", resume=False, progress=False, verbose=False)
    finally:
        torch.set_num_threads(before)
    test = plain["test"]
    g = np.random.default_rng(3)
    vperm, tperm = g.permutation(test.num_videos), g.permutation(test.num_texts)
    where = np.argsort(vperm)  # new row of each old video
    PairedSplit.from_arrays(video=test.video[vperm], text=test.text[tperm],
                            text_to_video=where[test.text_to_video[tperm]]).save(root / "permuted", "test")
    for name in ("video", "text", "text_to_video"):  # the flags path: the test arrays as plain .npy files
        np.save(root / f"test_{name}.npy", getattr(test, name))
    return root


def test_queries_are_paired_by_identity_not_by_position(trained, tmp_path, capsys):
    """Issue 35.2: --force paired a permuted copy by position (p 0.178 instead of 0.019)."""
    run = str(trained / "run")
    for name, data in (("orig", "data"), ("perm", "permuted")):
        code, _, err = _cli(capsys, "eval", "--run", run, "--data", str(trained / data), "--split", "test",
                            "--normalizer", "none", "--per-query", str(tmp_path / f"{name}.npz"))
        assert code == 0, err
    orig, _ = read_per_query(tmp_path / "orig.npz")
    perm, _ = read_per_query(tmp_path / "perm.npz")
    for d in ("t2v", "v2t"):  # the same queries in another order
        assert not np.array_equal(orig["test"]["none"][d]["rank"], perm["test"]["none"][d]["rank"])
        assert sorted(orig["test"]["none"][d]["rank"]) == sorted(perm["test"]["none"][d]["rank"])
    code, _, err = _cli(capsys, "compare", str(tmp_path / "orig.npz"), str(tmp_path / "perm.npz"), "--normalizer",
                        "none", "--n-boot", "200")
    assert code == 2 and "split_sha256" in err  # other split files: a protocol difference ...
    code, out, err = _cli(capsys, "compare", str(tmp_path / "orig.npz"), str(tmp_path / "perm.npz"), "--normalizer",
                          "none", "--n-boot", "200", "--force", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["pairing"] == "query ids (t2v, v2t)" and res["paired_by_position"] == []
    for r in res["rows"]:  # ... but the same queries, ranked alike by the same model: paired, no difference
        assert r["diff"] == 0 and r["p_value"] == 1.0, r


def test_eval_per_query_names_its_split_as_the_run_does_and_pairs_with_it(trained, tmp_path, capsys):
    run = str(trained / "run")
    out = tmp_path / "dev.npz"
    code, _, err = _cli(capsys, "eval", "--run", run, "--data", str(trained / "data"), "--split", "dev",
                        "--normalizer", "none", "--per-query", str(out))
    assert code == 0, err
    results, cards = read_per_query(out)
    assert set(results) == {"val"}  # the run's val split, read from a folder that calls it dev
    code, text, err = _cli(capsys, "compare", run, str(out), "--normalizer", "none", "--n-boot", "200", "--json")
    assert code == 0, err
    res = json.loads(text)
    assert res["split"] == "val" and all(r["diff"] == 0 for r in res["rows"])


def test_eval_per_query_with_feature_flags_works(trained, tmp_path, capsys):
    """Issue 36.10: 'split: expected a PairedSplit, got SimpleNamespace (no text)'."""
    run, out = str(trained / "run"), tmp_path / "flags.npz"
    code, _, err = _cli(capsys, "eval", "--run", run, "--video-features", str(trained / "test_video.npy"),
                        "--text-features", str(trained / "test_text.npy"), "--text-to-video",
                        str(trained / "test_text_to_video.npy"), "--normalizer", "none", "--per-query", str(out))
    assert code == 0, err
    results, _ = read_per_query(out)
    own, _ = read_per_query(trained / "run" / "per_query.npz")
    assert set(results) == {"test"}  # the same arrays as the run's test split: named so
    for d in ("t2v", "v2t"):
        assert np.array_equal(results["test"]["none"][d]["rank"], own["test"]["none"][d]["rank"])


def test_eval_per_query_replaces_only_its_own_files(trained, tmp_path, capsys):
    run = trained / "run"
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = (copy / "per_query.npz").read_bytes()
    base = ["eval", "--run", str(copy), "--data", str(trained / "data"), "--split", "test", "--normalizer", "none"]
    code, _, err = _cli(capsys, *base, "--per-query", str(copy / "per_query.npz"))
    assert code == 2 and "written by 'xmodal train'" in err and len(err.strip().splitlines()) == 1, err
    assert (copy / "per_query.npz").read_bytes() == before  # the run's own results survive
    other = tmp_path / "other.npz"
    np.savez(other, weights=np.zeros(3))
    code, _, err = _cli(capsys, *base, "--per-query", str(other))
    assert code == 2 and "not written by 'xmodal eval --per-query'" in err
    assert set(np.load(other).files) == {"weights"}
    mine = tmp_path / "mine.npz"
    assert _cli(capsys, *base, "--per-query", str(mine))[0] == 0
    assert _cli(capsys, *base, "--per-query", str(mine), "--ties", "optimistic")[0] == 0  # its own file: replaced
    _, cards = read_per_query(mine)
    assert cards["test"]["tie_rule"] == "optimistic" and not list(tmp_path.glob(".mine.npz.tmp*"))


def test_report_compare_shows_the_table(trained, tmp_path, capsys):
    from xmodal.reporting.report import build_report

    page = build_report(trained / "run", out=tmp_path / "r.html", num_examples=1,
                        compare=[str(trained / "run")]).read_text()
    assert "Comparison (xmodal compare)" in page and "heads alone" in page and "no clear difference" in page
    code, _, err = _cli(capsys, "report", str(trained / "run"), "--compare", str(trained / "run"), "--out",
                        str(tmp_path / "cli.html"), "--examples", "1", "--threads", "1")
    assert code == 0, err
    assert "Comparison (xmodal compare)" in (tmp_path / "cli.html").read_text()


# ----------------------------------------------------------------------------- 36.5 / 36.6 hostile files
def _hostile(root, kind: str):
    """A run whose per_query.npz or metrics.json is hostile in one way; returns (run, culprit file)."""
    a = _ranks(0)
    card = _card()
    if kind == "truncated npz":
        run = _run(root, "h", {"none": a})
        data = (run / "per_query.npz").read_bytes()
        (run / "per_query.npz").write_bytes(data[: len(data) // 2])
        return run, run / "per_query.npz"
    if kind == "deep card":
        run = _run(root, "h", {"none": a}, metrics=False)
        _rewrite(run / "per_query.npz", "test/protocol", np.array("[" * 100_000 + "]" * 100_000))
        return run, run / "per_query.npz"
    if kind == "deep metrics.json":
        run = _run(root, "h", {"none": a})
        (run / "metrics.json").write_text("[" * 100_000 + "]" * 100_000)
        return run, run / "metrics.json"
    if kind == "card without uses_test_queries":
        del card["uses_test_queries"]
        return _run(root, "h", {"none": a}, card=card, metrics=False), None
    if kind == "card with a list for a dict":
        card["num_queries"] = [400, 100]
        return _run(root, "h", {"none": a}, card=card, metrics=False), None
    if kind == "metrics.json from another run":
        run = _run(root, "h", {"none": a})
        m = json.loads((run / "metrics.json").read_text())
        m["test"]["protocol"]["split_sha256"] = "cd" * 32
        (run / "metrics.json").write_text(json.dumps(m))
        return run, None
    if kind == "metrics.json with other numbers":
        run = _run(root, "h", {"none": a})
        m = json.loads((run / "metrics.json").read_text())
        m["test"]["none"]["t2v"]["R@1"] += 5
        (run / "metrics.json").write_text(json.dumps(m))
        return run, None
    run = _run(root, "h", {"none": a}, metrics=False)
    bad = {"0-d ranks": np.array(3, dtype=np.int32),
           "ranks above the gallery": np.full(400, 101, dtype=np.int32),
           "fractional ranks": np.full(400, 1.5),
           "string ranks": np.full(400, "1"),
           "complex ranks": np.full(400, 1 + 1j),
           "bool ranks": np.ones(400, dtype=bool),
           "wrong number of ranks": np.ones(399, dtype=np.int32),
           "huge declared shape": None}[kind]
    if kind == "huge declared shape":
        _rewrite_raw(run / "per_query.npz", "test/none/t2v/rank", _npy_header(np.int32, (10 ** 12,)))
    else:
        _rewrite(run / "per_query.npz", "test/none/t2v/rank", bad)
    return run, run / "per_query.npz"


def _npy_header(dtype, shape) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
    return np.lib.format.magic(1, 0) + buf.getvalue()


def _rewrite(path, key, array):
    import io

    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    _rewrite_raw(path, key, buf.getvalue())


def _rewrite_raw(path, key, data: bytes):
    with zipfile.ZipFile(path) as z:
        entries = {i.filename: z.read(i) for i in z.infolist() if i.filename != key + ".npy"}
    entries[key + ".npy"] = data
    with zipfile.ZipFile(path, "w") as z:
        for name, blob in entries.items():
            z.writestr(name, blob)


HOSTILE = ["truncated npz", "deep card", "deep metrics.json", "card without uses_test_queries",
           "card with a list for a dict", "metrics.json from another run", "metrics.json with other numbers",
           "0-d ranks", "ranks above the gallery", "fractional ranks", "string ranks", "complex ranks", "bool ranks",
           "wrong number of ranks", "huge declared shape"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_per_query_and_metrics_files_are_one_line(tmp_path, capsys, kind):
    good = _run(tmp_path, "good", {"none": _ranks(1)})
    bad, culprit = _hostile(tmp_path, kind)
    for argv in ([str(good), str(bad)], [str(bad), str(good)]):
        code, out, err = _cli(capsys, "compare", *argv, "--n-boot", "200")
        assert "Traceback" not in err and code == 2, (kind, code, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("xmodal compare: error:"), err
        assert str(culprit or bad) in lines[0], lines[0]
        assert "unhashable" not in lines[0] and "KeyError" not in lines[0]


def test_map_above_100_is_refused(tmp_path):
    from xmodal.retrieval.perquery_read import PerQueryFile

    a = _ranks(0)
    results = {"test": {"none": {"t2v": {"rank": a[0], "ap": np.full(400, 150.0, np.float32)},
                                 "v2t": {"rank": a[1]}}}}
    write_per_query(tmp_path / "x.npz", results, {"test": _card()})
    with PerQueryFile(tmp_path / "x.npz") as f:
        with pytest.raises(ValueError, match=r"outside \[0, 100\]"):
            f.array("test", "none", "t2v", "ap")


def test_only_the_entries_compared_are_read(tmp_path, capsys):
    """Issue 36.6: an unused entry was decompressed too (a 1.5 GB zero entry: 226 -> 1,763 MB). An unused
    entry that cannot be decompressed at all proves it is never read."""
    run = _run(tmp_path, "a", {"none": _ranks(0), "sinkhorn": _ranks(2)})
    with zipfile.ZipFile(run / "per_query.npz") as z:
        entries = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(run / "per_query.npz", "w", zipfile.ZIP_DEFLATED) as z:
        for name, blob in entries.items():
            z.writestr(name, blob)
    data = bytearray((run / "per_query.npz").read_bytes())
    with zipfile.ZipFile(run / "per_query.npz") as z:
        info = z.getinfo("test/sinkhorn/t2v/rank.npy")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start:start + info.compress_size] = b"\xff" * info.compress_size  # not a deflate stream
    (run / "per_query.npz").write_bytes(bytes(data))
    _run(tmp_path, "b", {"none": _ranks(1), "sinkhorn": _ranks(3)})
    code, _, err = _cli(capsys, "compare", str(run), str(tmp_path / "b"), "--normalizer", "none", "--n-boot", "200")
    assert code == 0, err
    code, _, err = _cli(capsys, "compare", str(run), str(tmp_path / "b"), "--normalizer", "sinkhorn", "--n-boot",
                        "200")
    assert code == 2 and "test/sinkhorn/t2v/rank" in err and "unreadable" in err


def test_resamples_and_runs_are_bounded(tmp_path, capsys):
    _run(tmp_path, "a", {"none": _ranks(0)})
    code, _, err = _cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "a"), "--n-boot", "100000000")
    assert code == 2 and "--n-boot" in err
    with pytest.raises(ValueError, match="n_boot"):
        paired_test(np.ones(3), np.ones(3), n_boot=10 ** 9)
    for s in range(14):  # 14 + 14 seeds: Monte-Carlo over the labellings, in bounded time and memory
        _run(tmp_path, f"x_s{s}", {"none": _ranks(s, n=(40, 10))})
        _run(tmp_path, f"y_s{s}", {"none": _ranks(s + 100, 1, n=(40, 10))})
    code, out, err = _cli(capsys, "compare", "--a", str(tmp_path / "x_s*"), "--b", str(tmp_path / "y_s*"), "--json",
                          "--n-boot", "500", "--metrics", "R@1")
    assert code == 0, err
    assert all("Monte-Carlo" in r["test"] and not r["exact"] for r in json.loads(out)["rows"])
