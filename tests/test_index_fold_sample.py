"""``--normalizer auto`` decides on a sample of the gallery and fits the candidate on the whole gallery
only when it folds it (issue 43 item 2).

References: the full-gallery decision (:func:`choose_fold` on every row, the candidate fitted on every
row) and each caption's best-scoring videos by an explicit loop over the gallery."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("faiss")

from xmodal.retrieval import foldcheck  # noqa: E402
from xmodal.retrieval.foldcheck import choose_fold, choose_on_sample, fold_sample  # noqa: E402
from xmodal.retrieval.index import gallery_bias  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def scenario(helps: bool, n: int = 6000, d: int = 32, m: int = 120, seed: int = 0):
    """Captions with their own videos (added to the gallery) and, near each caption, a distractor video in
    the gallery. The bank's queries keep retrieving the distractors (``helps``: Sinkhorn lowers their bias,
    the captions' own videos rise) or the captions' own videos (the fold lowers them)."""
    rng = np.random.default_rng(seed)
    own = unit(rng.standard_normal((m, d)))
    cap = unit(own + 0.5 / d ** 0.5 * rng.standard_normal((m, d)))
    hubs = unit(cap + 0.45 / d ** 0.5 * rng.standard_normal((m, d)))
    g = np.vstack([unit(rng.standard_normal((n - m, d))), hubs])[rng.permutation(n)]
    popular = hubs if helps else own
    bank = unit(np.repeat(popular, 3, 0) + 0.1 / d ** 0.5 * rng.standard_normal((3 * m, d)))
    return (torch.from_numpy(x) for x in (g, bank, cap, own))


def sinkhorn_fit(bank):
    """``(rows each fit saw, fit)``: the candidate's fit as ``choose_on_sample`` calls it (Sinkhorn on ``bank``)."""
    fitted_on: list[int] = []

    def fit(rows, extra):
        fitted_on.append(int(rows.shape[0]))
        b, xb = gallery_bias("sinkhorn", rows, bank, extra=extra, temperature=0.05, iters=20)
        return {"normalizer": "sinkhorn", "bias": b, "extra_bias": xb, "query_shift": None}
    return fitted_on, fit

@pytest.mark.parametrize("helps", [True, False])
def test_the_sample_decision_equals_the_full_gallery_decision(helps):
    g, bank, cap, own = scenario(helps)
    fitted_on, fit = sinkhorn_fit(bank)

    t2v = len(g) + np.arange(len(own))
    full = choose_fold(g, fit(g, own), cap, t2v, extra=own, n_boot=2000)
    assert full["chosen"] == ("sinkhorn" if helps else "none")  # the answer is clear either way
    assert (full["test"]["ci_low"] > 0) if helps else (full["test"]["ci_high"] < 0)
    fitted_on.clear()
    rec, folded = choose_on_sample(g, fit, cap, t2v, extra=own, size=600, n_boot=2000)
    assert rec["chosen"] == full["chosen"] and folded is None
    assert fitted_on == [600] and rec["sample_rows"] == 600 and rec["near_rows"] > 0
    # none's ranks at the top are exact on the sample: every video outranking a caption's own is among its near
    assert rec["none"] == full["none"]
    # a uniform sample alone thins out the distractors and calls the helpful fold unclear
    alone, _ = choose_on_sample(g, fit, cap, t2v, extra=own, size=600, neighbours=0, n_boot=2000)
    if helps:
        assert alone["chosen"] == "none"


def test_fold_sample_holds_each_captions_nearest_videos_and_its_own():
    rng = np.random.default_rng(1)
    g = torch.from_numpy(unit(rng.standard_normal((500, 8))))
    q = torch.from_numpy(unit(rng.standard_normal((7, 8))))
    t2v = rng.choice(500, 7)
    uniform, near, mapped = fold_sample(g, q, t2v, added=False, size=50, neighbours=20, seed=3)
    measured = np.concatenate([uniform, near])
    assert len(uniform) == 50 and len(set(measured.tolist())) == len(measured)
    np.testing.assert_array_equal(measured[mapped], t2v)  # each caption's own video, renumbered
    s = (q @ g.T).numpy()
    want = set(t2v.tolist())
    for i in range(7):  # by loops: the sample's 2nd best score (20 * 50 / 500), the videos reaching it, and
        threshold = sorted((s[i, j] for j in uniform), reverse=True)[1]  # of them the caption's 20 best
        reaching = [j for j in range(500) if s[i, j] >= threshold]
        best = sorted(range(500), key=lambda j: -s[i, j])[:20]
        assert best[0] in reaching  # the best video always
        want |= set(reaching) & set(best)
    assert set(measured.tolist()) == want | set(uniform.tolist())
    assert fold_sample(g, q, t2v, added=False, size=500) is None  # the whole gallery


def test_an_added_videos_bias_is_the_column_update_of_the_fitted_scaling():
    """``gallery_bias(extra=...)``: a copy of a gallery row gets that row's bias (the last Sinkhorn step is
    the column update), and any video ``u`` gets ``T (log c - logsumexp_i(S_iu / T + log alpha_i)) - T
    logsumexp(log beta)`` by a float64 loop over the bank with ``alpha`` from the gallery's own bias."""
    rng = np.random.default_rng(4)
    g = torch.from_numpy(unit(rng.standard_normal((300, 16))))
    bank = torch.from_numpy(unit(rng.standard_normal((40, 16))))
    other = torch.from_numpy(unit(rng.standard_normal((5, 16))))
    bias, extra = gallery_bias("sinkhorn", g, bank, extra=torch.cat([g[[3, 17, 299]], other]), temperature=0.05,
                               iters=6)
    np.testing.assert_allclose(extra[:3].numpy(), bias[[3, 17, 299]].numpy(), atol=2e-5)
    # by loops in float64 (Cuturi 2013's log-domain iteration, uniform marginals, rows first):
    s = bank.double().numpy() @ g.double().numpy().T / 0.05  # [K, N]
    lse = lambda m, axis: np.log(np.exp(m - m.max(axis, keepdims=True)).sum(axis)) + m.max(axis)  # noqa: E731
    la = -np.log(40) - lse(s, 1)
    for it in range(6):
        lb = -np.log(300) - lse(s + la[:, None], 0)
        if it < 5:
            la = -np.log(40) - lse(s + lb[None, :], 1)
    np.testing.assert_allclose(bias.numpy(), 0.05 * (lb - lse(lb, 0)), atol=2e-4)
    xs = bank.double().numpy() @ other.double().numpy().T / 0.05
    want = 0.05 * (-np.log(300) - lse(xs + la[:, None], 0) - lse(lb, 0))
    np.testing.assert_allclose(extra[3:].numpy(), want, atol=2e-4)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from conftest import sinkhorn_run_and_gallery

    return sinkhorn_run_and_gallery(tmp_path_factory.mktemp("foldsample"))


def counted_fits(real_fold):
    """``(sizes, counting)``: ``fold_run_normalizer`` recording each fit's normaliser and gallery rows."""
    sizes: list[tuple[str, int]] = []

    def counting(model, rows, normalizer="selected", **kw):
        sizes.append((normalizer, int(rows.shape[0])))
        return real_fold(model, rows, normalizer, **kw)
    return sizes, counting

@pytest.mark.parametrize("verdict", ["none", "candidate"])
def test_the_whole_gallery_is_fitted_only_when_the_fold_is_kept(run_dir, tmp_path, monkeypatch, capsys, verdict):
    from xmodal.cli import main
    from xmodal.retrieval import index as index_module

    run, feats = run_dir
    real_choose = foldcheck.choose_fold
    sizes, counting = counted_fits(index_module.fold_run_normalizer)

    def decided(*args, **kw):  # the measurement as it is, its verdict forced
        rec = real_choose(*args, **kw)
        rec["chosen"] = "none" if verdict == "none" else rec["candidate"]
        rec["test"]["clear"] = verdict != "none"
        return rec

    monkeypatch.setattr(index_module, "fold_run_normalizer", counting)
    monkeypatch.setattr(foldcheck, "choose_fold", decided)
    monkeypatch.setattr(foldcheck, "SAMPLE_ROWS", 300)
    out = tmp_path / "idx"
    assert main(["index", "--run", str(run), "--video-features", str(feats), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    choice = meta["normalizer_choice"]
    assert choice["candidate"] == "sinkhorn" and choice["sample_rows"] == 300 and choice["gallery"] == 900
    assert "a seeded sample of 300 of the 900 gallery videos" in printed
    fits = [s for s in sizes if s[0] == "sinkhorn"]
    assert fits[0] == ("sinkhorn", 300)  # measured on the sample
    assert fits[1:] == ([] if verdict == "none" else [("sinkhorn", 900)])  # the gallery: only when folded
    assert meta["normalizer"] == ("none" if verdict == "none" else "sinkhorn")


@pytest.mark.parametrize("helps", [True, False])
def test_an_early_stage_ends_the_measurement_only_when_the_fold_is_clearly_worse(helps):
    from xmodal.retrieval.foldcheck import describe_choice

    g, bank, cap, own = scenario(helps)
    fitted_on, fit = sinkhorn_fit(bank)

    t2v = len(g) + np.arange(len(own))
    full = choose_fold(g, fit(g, own), cap, t2v, extra=own, n_boot=2000)  # every row, every caption
    fitted_on.clear()
    rec, _ = choose_on_sample(g, fit, cap, t2v, extra=own, size=600, n_boot=2000, stages=[(24, 150)])
    assert rec["chosen"] == full["chosen"] == ("sinkhorn" if helps else "none")
    assert rec["captions"] == 120 and rec["stages"][0]["queries"] == 24 and rec["stages"][0]["sample_rows"] == 150
    if helps:  # not clearly worse on the first stage: measured again on every caption and 600 rows
        assert fitted_on == [150, 600] and len(rec["stages"]) == 2 and rec["queries"] == 120
        assert rec["sample_rows"] == 600 and "stopped_early" not in rec
    else:  # clearly worse on 24 captions and 150 rows: never fitted on more
        assert fitted_on == [150] and len(rec["stages"]) == 1 and rec["stages"][0]["ci_high"] < 0
        assert rec["queries"] == 24 and rec["sample_rows"] == 150
        rec.update(source="captions", gallery=len(g), added_videos=len(own))
        line = describe_choice(rec)
        assert "24 of the 120 captions" in line and "clearly worse than none" in line and "no further" in line
        assert 24 <= rec["added_rows"] < 120 and f"({rec['added_rows']} of the 120 added videos, theirs" in line
    # the stages are checked: more captions each, no fewer rows
    with pytest.raises(ValueError, match="stages"):
        choose_on_sample(g, fit, cap, t2v, extra=own, size=600, stages=[(24, 150), (12, 300)])


@pytest.mark.parametrize("helps", [True, False])
def test_the_default_stages_decide_as_the_last_stage_on_a_gallery_over_the_sample(helps):
    """At the shipped :data:`STAGES` (a first stage of 1,000 rows) on a gallery larger than the sample: a fold
    that helps is not stopped early, and one that hurts is stopped on the first stage; each decides as the
    last stage alone (``stages=()``) does."""
    from xmodal.retrieval import foldcheck

    g, bank, cap, own = scenario(helps, n=foldcheck.SAMPLE_ROWS + 10_000, m=600, seed=1)
    fitted_on, fit = sinkhorn_fit(bank)
    t2v = len(g) + np.arange(len(own))
    last, _ = choose_on_sample(g, fit, cap, t2v, extra=own, n_boot=2000, stages=())
    assert last["chosen"] == ("sinkhorn" if helps else "none")
    fitted_on.clear()
    rec, _ = choose_on_sample(g, fit, cap, t2v, extra=own, n_boot=2000)
    assert rec["chosen"] == last["chosen"]
    first = foldcheck.STAGES[0]
    assert (rec["stages"][0]["queries"], rec["stages"][0]["sample_rows"]) == first
    if helps:
        assert fitted_on == [r for _, r in foldcheck.STAGES] + [foldcheck.SAMPLE_ROWS]
    else:
        assert fitted_on == [first[1]] and rec["stages"][0]["ci_high"] < 0


def test_the_build_records_each_stage_and_stops_where_the_fold_is_clearly_worse(run_dir, tmp_path, monkeypatch,
                                                                               capsys):
    from xmodal.cli import main
    from xmodal.retrieval import index as index_module

    run, feats = run_dir
    real_choose = foldcheck.choose_fold
    sizes, counting = counted_fits(index_module.fold_run_normalizer)

    def worse(*args, **kw):  # the measurement as it is, its interval forced below 0
        rec = real_choose(*args, **kw)
        rec["chosen"], rec["test"]["clear"] = "none", False
        rec["test"].update(ci_low=-3.0, ci_high=-1.0)
        return rec

    passes, real_sample = [], foldcheck._sample

    def sample(*args, **kw):  # a pass of its own over the gallery
        passes.append(1)
        return real_sample(*args, **kw)

    monkeypatch.setattr(index_module, "fold_run_normalizer", counting)
    monkeypatch.setattr(foldcheck, "choose_fold", worse)
    monkeypatch.setattr(foldcheck, "_sample", sample)
    monkeypatch.setattr(foldcheck, "SAMPLE_ROWS", 300)
    monkeypatch.setattr(foldcheck, "STAGES", ((8, 100), (16, 200)))
    out = tmp_path / "idx"
    assert main(["index", "--run", str(run), "--video-features", str(feats), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    choice = json.loads((out / "meta.json").read_text())["normalizer_choice"]
    assert [s[1] for s in sizes if s[0] == "sinkhorn"] == [100]  # the first stage only
    assert passes == []  # its rows gathered while the gallery was embedded: no second pass
    assert [(s["queries"], s["sample_rows"]) for s in choice["stages"]] == [(8, 100)]
    assert choice["sample_rows"] == 100 and choice["queries"] == 8 and choice["captions"] > 16
    assert f"8 of the {choice['captions']:,} held-out train captions" in printed and "measured no further" in printed


@pytest.mark.parametrize("added", [True, False])
def test_the_first_stage_gathered_while_embedding_holds_each_captions_best_videos(added):
    from xmodal.retrieval.foldcheck import FirstStage

    g, bank, cap, own = scenario(helps=False)
    n = len(g)
    if added:
        t2v, x = n + np.arange(len(own)), own
    else:  # the captions' videos are gallery rows
        t2v, x = np.random.default_rng(2).choice(n, len(cap), replace=False), None
        g = g.clone()
        g[torch.from_numpy(t2v)] = own
    first = FirstStage(n, cap, t2v, added=added, size=600, neighbours=20, stages=[(24, 150)])
    assert first.active and len(first.captions) == 24 and len(first.uniform) == 150
    for start in range(0, n, 1000):  # the build's blocks, in order
        first.add(start, g[start:start + 1000])
    assert first.result(n, first.captions, first.uniform) is None  # the near rows are read from the gallery
    uniform, part, near, near_rows, _, threshold = first.result(n, first.captions, first.uniform, g)
    assert torch.equal(part, g[torch.from_numpy(uniform)]) and torch.equal(near_rows, g[torch.from_numpy(near)])
    s = (cap @ g.T).numpy()
    want = set() if added else set(t2v[first.captions].tolist())
    for i in first.captions:  # by loops: each caption's 20 best gallery videos
        want |= set(sorted(range(n), key=lambda j: -s[i, j])[:20])
    assert set(near.tolist()) == want - set(uniform.tolist())
    np.testing.assert_allclose(threshold.reshape(-1).numpy(),
                               [sorted(s[i], reverse=True)[19] for i in first.captions], atol=1e-6)
    # the stage measured from these rows decides as the stage measured with its own pass over the gallery
    fit = lambda rows, extra: dict(zip(("bias", "extra_bias"), gallery_bias(  # noqa: E731
        "sinkhorn", rows, bank, extra=extra, temperature=0.05, iters=20)), normalizer="sinkhorn", query_shift=None)
    a, _ = choose_on_sample(g, fit, cap, t2v, extra=x, size=600, neighbours=20, n_boot=2000, stages=[(24, 150)],
                            first=first)
    b, _ = choose_on_sample(g, fit, cap, t2v, extra=x, size=600, neighbours=20, n_boot=2000, stages=[(24, 150)])
    assert a["chosen"] == b["chosen"] == "none" and len(a["stages"]) == len(b["stages"]) == 1  # stopped at 24
    assert a["none"] == b["none"] and a["queries"] == 24
    with pytest.raises(ValueError, match="block"):  # a block out of order
        FirstStage(n, cap, t2v, added=added, size=600, stages=[(24, 150)]).add(1000, g[:10])
