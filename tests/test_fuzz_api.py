"""Fuzz tests (hypothesis) over the public API and the CLI.

Fixed cases from issue 9: ``ks=(1.5,)``/``(True,)`` are rejected, ``mir`` relevancy
must lie in [0, 1], Sinkhorn iterations are bounded, ``read_captions`` on a binary
file is a ValueError. For every input: bad input raises a ValueError/TypeError whose
message names the argument (or a one-line ``xmodal CMD: error: ...``), and no input
array is modified.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from xmodal import metrics  # noqa: E402
from xmodal.cli import main  # noqa: E402
from xmodal.normalize import (DistributionNormalization, DualSoftmax, InvertedSoftmax,  # noqa: E402
                              QBNorm, SinkhornBias)

# The active profile (tests/conftest.py: random seed, no replay database, bounded examples).
FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

finite = st.floats(-5, 5, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def sim_and_positives(draw):
    q = draw(st.integers(1, 8))
    g = draw(st.integers(1, 8))
    sim = draw(hnp.arrays(np.float32, (q, g), elements=st.integers(-3, 3).map(float)))  # ties
    pos = draw(hnp.arrays(np.int64, (q,), elements=st.integers(0, g - 1)))
    return sim, pos


def _named(exc_info, name):
    assert str(exc_info.value).startswith(name), str(exc_info.value)


# ----------------------------------------------------------------------------- ks
BAD_KS = st.one_of(
    st.tuples(st.floats(allow_nan=True).filter(lambda f: not (np.isfinite(f) and float(f).is_integer()))),
    st.tuples(st.booleans()),
    st.tuples(st.integers(max_value=0)),
    st.just(()), st.just("15"), st.just((1, "5")), st.just(None), st.just((np.bool_(True),)),
)


@FUZZ
@given(data=sim_and_positives(), ks=BAD_KS)
def test_bad_ks_rejected_everywhere(data, ks):
    sim, pos = data
    calls = [lambda: metrics.retrieval(sim, pos, ks=ks),
             lambda: metrics.streaming_retrieval(sim, np.eye(sim.shape[1], dtype=np.float32), pos, ks=ks)]
    if sim.shape[0] >= sim.shape[1]:
        t2v = np.arange(sim.shape[0]) % sim.shape[1]
        calls.append(lambda: metrics.text_video(sim, t2v, ks=ks))
    for call in calls:
        with pytest.raises((TypeError, ValueError)) as exc:
            call()
        _named(exc, "ks")


@FUZZ
@given(data=sim_and_positives(), ks=st.lists(st.integers(1, 20), min_size=1, max_size=4))
def test_integer_ks_accepted_as_ints_numpy_and_tensors(data, ks):
    sim, pos = data
    want = metrics.retrieval(sim, pos, ks=tuple(ks))
    assert metrics.retrieval(sim, pos, ks=np.array(ks)) == want
    assert metrics.retrieval(sim, pos, ks=torch.tensor(ks)) == want
    assert set(want) == {f"R@{k}" for k in ks} | {"MdR", "MnR"}


# ----------------------------------------------------------------------------- mir
@FUZZ
@given(shape=st.tuples(st.integers(1, 6), st.integers(1, 6)), bad=st.one_of(
    st.floats(1.0, 1e6, exclude_min=True), st.floats(-1e6, 0, exclude_max=True)),
    row=st.integers(0, 5), col=st.integers(0, 5))
def test_mir_relevancy_outside_unit_interval_rejected(shape, bad, row, col):
    rng = np.random.default_rng(0)
    sim = rng.standard_normal(shape).astype(np.float32)
    rel = rng.random(shape).astype(np.float32)
    rel[row % shape[0], col % shape[1]] = np.float32(bad)
    if 0 <= rel.min() and rel.max() <= 1:  # float32 rounding brought it back inside
        return
    with pytest.raises(ValueError) as exc:
        metrics.mir(sim, rel)
    _named(exc, "relevancy")


# ----------------------------------------------------------------------------- no mutation
@FUZZ
@given(data=sim_and_positives(), ties=st.sampled_from(["pessimistic", "optimistic", "average"]))
def test_metrics_do_not_mutate(data, ties):
    sim, pos = data
    s0, p0 = sim.copy(), pos.copy()
    t = torch.from_numpy(sim.copy())
    t0 = t.clone()
    metrics.retrieval(sim, pos, ks=(1, 2), ties=ties)
    metrics.retrieval(t, torch.from_numpy(pos), ks=(1,), ties=ties)
    rel = (np.abs(sim) / 3).astype(np.float32)
    r0 = rel.copy()
    metrics.mir(sim, rel, ties="optimistic" if ties == "optimistic" else "pessimistic")
    metrics.streaming_retrieval(sim, np.eye(sim.shape[1], dtype=np.float32), pos, ks=(1,), ties=ties)
    np.testing.assert_array_equal(sim, s0)
    np.testing.assert_array_equal(pos, p0)
    np.testing.assert_array_equal(rel, r0)
    assert torch.equal(t, t0)


@st.composite
def embeddings(draw):
    d = draw(st.integers(1, 5))
    k, n, q = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 6))
    arr = lambda rows: draw(hnp.arrays(np.float32, (rows, d), elements=finite))  # noqa: E731
    return arr(k), arr(n), arr(q)


@FUZZ
@given(data=embeddings())
def test_normalizers_do_not_mutate(data):
    bank, gallery, queries = data
    sim = queries @ gallery.T
    before = [x.copy() for x in (bank, gallery, queries, sim)]
    for norm in (SinkhornBias(0.5, iters=3), QBNorm(k=1, beta=2.0), InvertedSoftmax(beta=2.0),
                 DualSoftmax(0.5, oracle=False)):
        norm.fit(bank, gallery)
        out = norm(sim)
        assert out.shape == sim.shape
    dn = DistributionNormalization(lam=0.25).fit(bank, gallery)
    dn.transform(queries, gallery)
    dn(sim)
    for x, x0 in zip((bank, gallery, queries, sim), before):
        np.testing.assert_array_equal(x, x0)


# ----------------------------------------------------------------------------- bad arrays
@FUZZ
@given(data=sim_and_positives(), where=st.integers(0, 63), value=st.sampled_from([np.nan, np.inf, -np.inf]))
def test_non_finite_scores_named(data, where, value):
    sim, pos = data
    bad = sim.copy()
    bad.flat[where % bad.size] = value
    with pytest.raises(ValueError) as exc:
        metrics.retrieval(bad, pos)
    _named(exc, "sim")
    with pytest.raises(ValueError) as exc:
        SinkhornBias(0.5).fit(bad, np.ones((3, bad.shape[1]), np.float32))
    _named(exc, "query_bank")


@FUZZ
@given(iters=st.one_of(st.integers(10_001, 10**12), st.integers(max_value=0), st.just(True),
                       st.floats(allow_nan=True).filter(lambda f: not float(f).is_integer() if np.isfinite(f)
                                                        else True), st.just("4"), st.just(None)))
def test_sinkhorn_iters_bounded_and_named(iters):
    with pytest.raises((TypeError, ValueError)) as exc:
        SinkhornBias(0.05, iters=iters)
    _named(exc, "iters")


def test_dn_negative_lambda_rejected():
    with pytest.raises(ValueError, match="^lam"):
        DistributionNormalization(lam=-1)


def test_dn_transform_other_dimension_named():
    dn = DistributionNormalization().fit(np.ones((4, 3), np.float32), np.ones((5, 3), np.float32))
    with pytest.raises(ValueError, match="^queries"):
        dn.transform(np.ones((2, 4), np.float32), np.ones((5, 3), np.float32))


# ----------------------------------------------------------------------------- files
@FUZZ
@given(blob=st.binary(min_size=1, max_size=64), suffix=st.sampled_from([".txt", ".tsv"]))
def test_read_captions_on_binary_is_value_error(tmp_path, blob, suffix):
    from xmodal.data.loaders import read_captions

    path = tmp_path / f"caps{suffix}"
    path.write_bytes(b"\xff" + blob)  # 0xff never starts a UTF-8 sequence
    with pytest.raises(ValueError) as exc:
        read_captions(path)
    assert str(path) in str(exc.value) and "UTF-8" in str(exc.value)


# ----------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzzcli")
    rng = np.random.default_rng(0)
    g = rng.standard_normal((6, 4)).astype(np.float32)
    q = (g[[0, 1, 2, 3, 4, 5, 0, 1]] + 0.3 * rng.standard_normal((8, 4))).astype(np.float32)
    arrays = {"q": q, "g": g, "p": np.array([0, 1, 2, 3, 4, 5, 0, 1]), "b": q[:5],
              "rel": rng.random((8, 6)).astype(np.float32), "sim": q @ g.T}
    paths = {}
    for name, arr in arrays.items():
        paths[name] = str(root / f"{name}.npy")
        np.save(paths[name], arr)
    (root / "junk.npy").write_bytes(b"\x00\x01junk")
    paths["junk"] = str(root / "junk.npy")
    return paths, arrays


FLAG_VALUES = st.one_of(st.sampled_from(["0", "-1", "1.5", "true", "", "1,,x", "nan", "1e9", "10000000000",
                                         "junk", " ", "--", "\x00"]),
                        st.text(max_size=6))


@FUZZ
@given(cmd=st.sampled_from(["eval", "normalize"]),
       flag=st.sampled_from(["--ks", "--threads", "--block-size", "--iters", "--k", "--ties", "--v2t",
                             "--temperature", "--beta", "--lam", "--method", "--positives", "--bias"]),
       value=FLAG_VALUES)
def test_cli_bad_values_give_one_line_errors(npy, capsys, cmd, flag, value):
    paths, arrays = npy
    if cmd == "eval":
        argv = ["eval", "--queries", paths["q"], "--gallery", paths["g"], "--positives", paths["p"], "--json"]
        if flag in ("--iters", "--k", "--temperature", "--beta", "--lam", "--method"):
            flag = "--ks"
    else:
        argv = ["normalize", "--method", "sinkhorn", "--queries", paths["q"], "--gallery", paths["g"],
                "--positives", paths["p"], "--bank", paths["b"], "--l2", "--json"]
        if flag in ("--block-size", "--ties", "--v2t", "--bias"):
            flag = "--iters"
    before = {k: np.load(v) for k, v in paths.items() if k != "junk"}
    code = main(argv + [flag, value] if flag not in argv else argv)
    out = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"xmodal {cmd}: error: "), out.err
        assert "Traceback" not in out.err
    for k, arr in before.items():  # the CLI never writes to its inputs
        np.testing.assert_array_equal(np.load(paths[k]), arr)


@FUZZ
@given(cmd=st.sampled_from(["eval", "normalize", "index", "query", "demo", "encode"]),
       extra=st.lists(st.sampled_from(["--json", "--run", "--sim", "--queries", "--bogus", "x", "--k",
                                       "--labels", "--force", "--save-bias", "--progress", "--no-progress"]),
                      max_size=4))
def test_cli_nonsense_argv_is_one_line(npy, capsys, cmd, extra):
    paths, _ = npy
    argv = [cmd] + [paths["junk"] if a == "x" else a for a in extra]
    if cmd == "demo" and "--bogus" not in extra:
        argv.append("--bogus")  # never start a real demo run here
    code = main(argv)
    out = capsys.readouterr()
    assert code == 2
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"xmodal {cmd}: error: "), out.err


def test_cli_fixed_cases(npy, capsys):
    paths, _ = npy
    base = ["eval", "--queries", paths["q"], "--gallery", paths["g"], "--positives", paths["p"]]
    for ks in ("1.5", "0", "1,x"):
        assert main(base + ["--ks", ks]) == 2
        assert capsys.readouterr().err.startswith("xmodal eval: error: --ks")
    assert main(["eval", "--sim", paths["sim"], "--relevancy", paths["sim"]]) == 2  # values outside [0, 1]
    assert capsys.readouterr().err.startswith("xmodal eval: error: --relevancy")
    assert main(["eval", "--sim", paths["junk"], "--positives", paths["p"]]) == 2
    assert capsys.readouterr().err.startswith("xmodal eval: error: --sim")
    for threads in ("0", "10000000000", "two"):
        assert main(base + ["--threads", threads]) == 2
        assert capsys.readouterr().err.startswith("xmodal eval: error: argument --threads")
    assert main(base + ["--bogus"]) == 2
    assert capsys.readouterr().err.startswith("xmodal eval: error: unrecognized arguments: --bogus")
