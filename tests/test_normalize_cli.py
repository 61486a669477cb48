"""``xmodal normalize`` end to end on small seeded .npy files."""

import json

import numpy as np
import pytest

from xmodal.cli import main

metrics = pytest.importorskip("xmodal.metrics")


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(0)
    gallery = rng.standard_normal((40, 8)).astype(np.float32)
    positives = rng.integers(0, 40, 60)
    queries = (gallery[positives] + 1.5 * rng.standard_normal((60, 8))).astype(np.float32)
    bank = (gallery[rng.integers(0, 40, 200)] + 1.5 * rng.standard_normal((200, 8))).astype(np.float32)
    paths = {}
    for name, arr in dict(queries=queries, gallery=gallery, positives=positives, bank=bank).items():
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], arr)
    return paths, queries, gallery, positives, bank


def _run(capsys, argv):
    code = main(["normalize"] + argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("method", ["dn", "sinkhorn", "qbnorm", "is", "dsl"])
def test_json_matches_library(method, files, capsys):
    from xmodal.commands.normalize import build_and_fit

    paths, queries, gallery, positives, bank = files
    argv = ["--method", method, "--queries", paths["queries"], "--gallery", paths["gallery"],
            "--positives", paths["positives"], "--bank", paths["bank"], "--temperature", "0.1", "--json", "--force"]
    code, out, err = _run(capsys, argv)
    assert code == 0
    # un-normalised embeddings: scale-sensitive methods warn under --force, DN does not
    assert ("warning" in err and "--l2" in err) == (method != "dn")
    result = json.loads(out)
    norm = build_and_fit(method, queries, gallery, bank, oracle=False, temperature=0.1)
    sim = queries @ gallery.T
    assert result["before"] == pytest.approx(metrics.retrieval(sim, positives, ks=(1, 5, 10)))
    assert result["after"] == pytest.approx(metrics.retrieval(norm(sim), positives, ks=(1, 5, 10)))
    assert result["normalization_error"]["after"] == pytest.approx(
        metrics.normalization_error(norm(sim), 0.1), rel=1e-5)
    assert result["uses_test_queries"] is False  # a bank was given, no --oracle


def test_table_output_and_oracle(files, capsys):
    paths = files[0]
    code, out, _ = _run(capsys, ["--method", "sinkhorn", "--oracle", "--queries", paths["queries"],
                                 "--gallery", paths["gallery"], "--positives", paths["positives"], "--l2"])
    assert code == 0
    assert "| none |" in out and "| sinkhorn |" in out and "uses test queries: yes" in out
    assert "Sinkhorn marginal error per iteration" in out


def test_errors_are_one_line(files, capsys):
    paths = files[0]
    code, _, err = _run(capsys, ["--method", "qbnorm", "--queries", paths["queries"],
                                 "--gallery", paths["gallery"], "--positives", paths["positives"]])
    assert code == 2 and "--bank" in err
    code, _, err = _run(capsys, ["--method", "is", "--queries", "missing.npy", "--gallery",
                                 paths["gallery"], "--positives", paths["positives"], "--bank", paths["bank"]])
    assert code == 2 and "missing.npy" in err


@pytest.mark.parametrize("method", ["sinkhorn", "qbnorm", "is", "dsl"])
def test_scale_sensitive_refused_on_unnormalised(method, files, capsys):
    paths = files[0]
    base = ["--method", method, "--queries", paths["queries"], "--gallery", paths["gallery"],
            "--positives", paths["positives"], "--bank", paths["bank"], "--json"]
    code, out, err = _run(capsys, base)
    assert code == 2 and out == ""
    assert err.startswith("xmodal normalize: error: --method") and "--l2" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = _run(capsys, base + ["--l2"])
    assert code == 0 and err == ""


def test_l2_and_hidden_normalize_alias_agree(files, capsys):
    paths = files[0]
    base = ["--method", "dsl", "--queries", paths["queries"], "--gallery", paths["gallery"],
            "--positives", paths["positives"], "--bank", paths["bank"], "--json"]
    results = []
    for flag in ("--l2", "--normalize"):
        code, out, _ = _run(capsys, base + [flag])
        assert code == 0
        results.append(json.loads(out)["after"])
    assert results[0] == results[1]
    with pytest.raises(SystemExit):
        main(["normalize", "--help"])
    help_text = capsys.readouterr().out
    assert "--l2" in help_text and "--normalize" not in help_text  # the alias stays hidden
    assert "--quiet" in help_text  # --quiet is a real option (issue 26.7): no progress, only the results


@pytest.mark.parametrize("method", ["dn", "sinkhorn"])
def test_save_bias_reproduces_after_with_eval_bias(method, files, tmp_path, capsys):
    paths, queries, gallery, positives, bank = files
    bias_path = str(tmp_path / "b.npy")
    code, out, _ = _run(capsys, ["--method", method, "--queries", paths["queries"], "--gallery",
                                 paths["gallery"], "--positives", paths["positives"], "--bank",
                                 paths["bank"], "--l2", "--json", "--save-bias", bias_path])
    assert code == 0
    after = json.loads(out)["after"]
    bias = np.load(bias_path)
    assert bias.shape == (gallery.shape[0],) and bias.dtype == np.float32
    # independent reference: the biased cosine scores, ranked by the library's exact retrieval
    qn = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    gn = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    bn = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    if method == "dn":  # -lam * mu_bank . y_j, the rank-relevant part of DN eq. 7 (100 samples, seed 0)
        rows = np.sort(np.random.default_rng(0).choice(len(bn), 100, replace=False))
        want_bias = -0.25 * (gn.astype(np.float64) @ bn[rows].astype(np.float64).mean(0))
        np.testing.assert_allclose(bias, want_bias, atol=1e-5)
    ref = metrics.retrieval(qn.astype(np.float64) @ gn.T.astype(np.float64) + bias[None, :].astype(np.float64),
                            positives, ks=(1, 5, 10))
    assert after == pytest.approx(ref, abs=1e-6)
    assert main(["eval", "--queries", paths["queries"], "--gallery", paths["gallery"], "--positives",
                 paths["positives"], "--l2", "--bias", bias_path, "--ks", "1,5,10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["queries"] == pytest.approx(after)


def test_save_bias_and_iters_errors(files, tmp_path, capsys):
    paths = files[0]
    base = ["--queries", paths["queries"], "--gallery", paths["gallery"], "--positives", paths["positives"],
            "--bank", paths["bank"], "--l2"]
    code, _, err = _run(capsys, ["--method", "qbnorm", *base, "--save-bias", str(tmp_path / "b.npy")])
    assert code == 2 and "--save-bias" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.npy").exists()
    code, _, err = _run(capsys, ["--method", "sinkhorn", *base, "--iters", "1000000000"])
    assert code == 2 and err.startswith("xmodal normalize: error: --iters") and "10000" in err
    code, _, err = _run(capsys, ["--method", "sinkhorn", *base, "--threads", "0"])
    assert code == 2 and "--threads" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("method", ["dn", "sinkhorn"])
@pytest.mark.parametrize("positives", [np.zeros((5, 3, 2, 7), np.float32), np.arange(7), np.full(60, 99)])
def test_save_bias_is_written_only_after_every_input_passed(files, tmp_path, capsys, method, positives):
    """Bad --positives (a wrong shape, a wrong length, ids out of range) used to be found after the bias
    file was written; now the file is written last, and the error names --positives."""
    paths = files[0]
    np.save(tmp_path / "bad_p.npy", positives)
    code, _, err = _run(capsys, ["--method", method, "--queries", paths["queries"], "--gallery", paths["gallery"],
                                 "--positives", str(tmp_path / "bad_p.npy"), "--bank", paths["bank"], "--l2",
                                 "--save-bias", str(tmp_path / "b.npy")])
    assert code == 2 and err.startswith("xmodal normalize: error: --positives") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "b.npy").exists()
