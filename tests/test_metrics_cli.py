"""``xmodal eval`` smoke tests through ``xmodal.cli.main``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.metrics import mir, retrieval, text_video


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.integers(-2, 3, (30, 5)).astype(np.float32)
    g = rng.integers(-2, 3, (12, 5)).astype(np.float32)
    t2v = np.concatenate([np.arange(12), rng.integers(0, 12, 18)])
    paths = {}
    for name, arr in {"q": q, "g": g, "p": rng.integers(0, 12, 30), "t2v": t2v,
                      "sim": q @ g.T, "rel": (rng.random((30, 12)) < 0.3).astype(np.float32)}.items():
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], arr)
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    paths["bad"] = str(tmp_path / "bad.npy")
    paths["dir"] = tmp_path
    np.save(tmp_path / "strings.npy", np.full((4, 3), "x"))
    paths["strings"] = str(tmp_path / "strings.npy")
    return paths, q, g, t2v


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_embeddings_and_sim_agree_with_library(files, capsys):
    paths, q, g, t2v = files
    p = np.load(paths["p"])
    want = retrieval(q @ g.T, p, ks=(1, 5), ties="average")
    out = run_json(capsys, ["eval", "--queries", paths["q"], "--gallery", paths["g"],
                            "--positives", paths["p"], "--ks", "1,5", "--ties", "average",
                            "--block-size", "7", "--no-progress"])
    assert out["queries"] == pytest.approx(want)
    out = run_json(capsys, ["eval", "--sim", paths["sim"], "--positives", paths["p"],
                            "--ks", "1,5", "--ties", "average"])
    assert out["queries"] == pytest.approx(want)


def test_text_video_and_mir(files, capsys):
    paths, q, g, t2v = files
    want = text_video(q @ g.T, t2v, v2t="max-over-captions")
    out = run_json(capsys, ["eval", "--text", paths["q"], "--video", paths["g"],
                            "--text-to-video", paths["t2v"], "--v2t", "max-over-captions"])
    assert out["t2v"] == pytest.approx(want["t2v"]) and out["v2t"] == pytest.approx(want["v2t"])
    out = run_json(capsys, ["eval", "--sim", paths["sim"], "--text-to-video", paths["t2v"],
                            "--v2t", "max-over-captions"])
    assert out["v2t"] == pytest.approx(want["v2t"])
    rel = np.load(paths["rel"])
    out = run_json(capsys, ["eval", "--sim", paths["sim"], "--relevancy", paths["rel"]])
    assert out["mAP"] == pytest.approx(mir(q @ g.T, rel, directions="both")["mAP"])


def test_table_output(files, capsys):
    paths, *_ = files
    assert main(["eval", "--queries", paths["q"], "--gallery", paths["g"], "--positives",
                 paths["p"], "--normalize"]) == 0
    out = capsys.readouterr().out
    assert "R@1" in out and "MdR" in out and "queries" in out
    assert main(["eval", "--sim", paths["sim"], "--relevancy", paths["rel"]]) == 0
    out = capsys.readouterr().out
    assert "mAP" in out and "nDCG" in out and "mean" in out


@pytest.mark.parametrize("argv_tail, needle", [
    (["--queries", "{missing}", "--gallery", "{g}", "--positives", "{p}"], "no such file"),
    (["--queries", "{bad}", "--gallery", "{g}", "--positives", "{p}"], "not a readable .npy"),
    (["--queries", "{strings}", "--gallery", "{g}", "--positives", "{p}"], "--queries: {strings} holds <U1 values"),
    (["--queries", "{q}", "--gallery", "{g}", "--positives", "{strings}"], "--positives: {strings} holds <U1"),
    (["--queries", "{dir}", "--gallery", "{g}", "--positives", "{p}"], "--queries: {dir} is a directory"),
    (["--sim", "{sim}"], "exactly one of"),
    (["--sim", "{sim}", "--queries", "{q}"], "exactly one input"),
    ([], "exactly one input"),
    (["--sim", "{sim}", "--positives", "{rel}"], "--positives"),
    (["--sim", "{sim}", "--positives", "{g}"], "--positives"),
    (["--text", "{q}", "--video", "{g}", "--text-to-video", "{p}"], "--text-to-video"),
    (["--sim", "{sim}", "--positives", "{p}", "--ks", "1,x"], "--ks"),
])
def test_errors_are_one_line(files, capsys, argv_tail, needle):
    paths, *_ = files
    fmt = {**paths, "missing": str(paths["dir"] / "missing.npy")}
    assert main(["eval"] + [a.format(**fmt) for a in argv_tail]) == 2
    err = capsys.readouterr().err.strip()
    assert needle.format(**fmt) in err and len(err.splitlines()) == 1


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--relevancy" in out and "--ties" in out and "--block-size" in out
