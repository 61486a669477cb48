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
            "--positives", paths["positives"], "--bank", paths["bank"], "--temperature", "0.1", "--json"]
    code, out, _ = _run(capsys, argv)
    assert code == 0
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
                                 "--gallery", paths["gallery"], "--positives", paths["positives"]])
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
