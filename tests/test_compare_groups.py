"""Paragraph <-> video results are paired by identity too (issue 45 item 4): every direction's per-query
results store query ids (t2v, v2t, p2v, v2p), so `xmodal compare` pairs two evaluations whose splits list
the albums in another order query by query; files without p2v / v2p ids are paired by position only
when their split files are identical, and the header names those directions and why that is safe."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from xmodal.cli import main
from xmodal.data import PairedSplit
from xmodal.data.synthetic import synthetic
from xmodal.retrieval.perquery import query_ids, write_per_query
from xmodal.retrieval.perquery_read import PerQueryFile, read_per_query

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}
DIRS = ("t2v", "v2t", "p2v", "v2p")


def _grouped(split: PairedSplit, seed: int) -> PairedSplit:
    """``split`` with its videos cut into groups of 1-4 consecutive clips."""
    rng = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < split.num_videos:
        sizes.append(int(min(rng.integers(1, 5), split.num_videos - sum(sizes))))
    return PairedSplit.from_arrays(video=split.video, text=split.text, text_to_video=split.text_to_video,
                                   video_to_group=np.repeat(np.arange(len(sizes)), sizes))


def _permuted(split: PairedSplit, seed: int, *, swap_clips: bool = False) -> PairedSplit:
    """The same groups in another order, texts interleaved anew (each clip's texts keep their order, so every
    paragraph reads as before); ``swap_clips``: also swap the first two clips of the first group that has two."""
    rng = np.random.default_rng(seed)
    g = split.video_to_group
    rows = [np.flatnonzero(g == k) for k in range(int(g.max()) + 1)]
    if swap_clips:
        k = next(k for k, r in enumerate(rows) if r.size >= 2)
        rows[k] = rows[k][[1, 0, *range(2, rows[k].size)]]
    order = rng.permutation(len(rows))
    vorder = np.concatenate([rows[k] for k in order])
    new_group = np.repeat(np.arange(len(rows)), [rows[k].size for k in order])
    where = np.argsort(vorder)  # new row of each old video
    keys = rng.random(split.num_texts)
    for v in range(split.num_videos):  # a clip's texts keep their relative order
        mine = np.flatnonzero(split.text_to_video == v)
        keys[mine] = np.sort(keys[mine])
    torder = np.argsort(keys)
    return PairedSplit.from_arrays(video=split.video[vorder], text=split.text[torder],
                                   text_to_video=where[split.text_to_video[torder]], video_to_group=new_group)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("groups")
    data = synthetic(**TINY, seed=0)
    flat = PairedSplit.from_arrays(video=data["train"].video, text=data["train"].text,
                                   text_to_video=data["train"].text_to_video)
    flat.save(root / "data", "train")
    _grouped(data["val"], 1).save(root / "data", "dev")
    test = _grouped(data["test"], 2)
    test.save(root / "data", "test")
    _permuted(test, 3).save(root / "permuted", "test")
    _permuted(test, 3, swap_clips=True).save(root / "swapped", "test")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seed in (0, 1):
            train(from_dict({"data": {"name": "paired", "root": str(root / "data"), "train_split": "train",
                                      "val_split": "dev", "test_split": "test"},
                             "model": {"kind": "linear", "dim": 16}, "loss": {"name": "infonce", "temperature": 0.05},
                             "test_time": {"normalizers": ["none"], "bank_size": 100},
                             "train": {"seed": seed, "epochs": 2, "batch_size": 32, "progress": False,
                                       "device": "cpu"}}),
                  root / f"run{seed}", resume=False, progress=False, verbose=False)
    finally:
        torch.set_num_threads(before)
    return root


def _cli(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _eval(capsys, root, run, data, out):
    code, _, err = _cli(capsys, "eval", "--run", root / run, "--data", root / data, "--split", "test",
                        "--normalizer", "none", "--per-query", out)
    assert code == 0, err
    return out


def test_group_ids_follow_the_albums_not_their_rows():
    rng = np.random.default_rng(0)
    video, text = rng.normal(size=(7, 4)), rng.normal(size=(9, 3))
    t2v = np.array([0, 1, 1, 2, 3, 4, 4, 5, 0])  # video 6 has no text: its group 3 has no paragraph
    g = np.array([0, 0, 1, 1, 2, 2, 3])
    base = query_ids(PairedSplit.from_arrays(video=video, text=text, text_to_video=t2v, video_to_group=g))
    assert {k: v.shape for k, v in base.items()} == {"t2v": (9, 16), "v2t": (7, 16), "p2v": (3, 16), "v2p": (3, 16)}
    assert len({bytes(x) for x in base["p2v"]} | {bytes(x) for x in base["v2p"]}) == 6  # all distinct

    def ids(**change):
        a = {"video": video.copy(), "text": text.copy(), "text_to_video": t2v, "video_to_group": g, **change}
        return query_ids(PairedSplit.from_arrays(**a))

    # groups 0 and 2 swapped (rows and texts moved with them): the ids swap, nothing else changes
    vo = np.array([4, 5, 2, 3, 0, 1, 6])
    where = np.argsort(vo)
    swapped = ids(video=video[vo], text_to_video=where[t2v], video_to_group=g)
    for d in ("p2v", "v2p"):
        assert np.array_equal(swapped[d], base[d][[2, 1, 0]])
    # one text of group 1 changed: that paragraph's id changes (and the text's own), no other
    t = text.copy()
    t[3] += 1e-3
    changed = ids(text=t)
    assert [bool((changed["p2v"][i] != base["p2v"][i]).any()) for i in range(3)] == [False, True, False]
    # the clips of group 0 in the other order (each with its texts): another paragraph, the same clips' ids
    vo = np.array([1, 0, 2, 3, 4, 5, 6])
    flipped = ids(video=video[vo], text_to_video=np.argsort(vo)[t2v])
    assert bool((flipped["p2v"][0] != base["p2v"][0]).any()) and np.array_equal(flipped["p2v"][1:], base["p2v"][1:])
    assert np.array_equal(np.sort(flipped["v2t"].view(">u8"), axis=0), np.sort(base["v2t"].view(">u8"), axis=0))
    # a split without groups: t2v / v2t only, as before
    assert set(query_ids(PairedSplit.from_arrays(video=video, text=text, text_to_video=t2v))) == {"t2v", "v2t"}


def test_every_direction_stores_query_ids(grouped, tmp_path, capsys):
    with PerQueryFile(grouped / "run0" / "per_query.npz") as f:  # the trainer's file
        assert {s: f.id_entries[s] for s in ("val", "test")} == {"val": set(DIRS), "test": set(DIRS)}
        p = f.cards["test"]["num_queries"]["p2v"]
        assert f.query_ids("test", "p2v").shape == (p, 16) and f.query_ids("test", "v2p").shape == (p, 16)
    with PerQueryFile(_eval(capsys, grouped, "run0", "data", tmp_path / "e.npz")) as f:  # eval --per-query's
        assert f.id_entries["test"] == set(DIRS)


def test_compare_pairs_permuted_albums_by_identity(grouped, tmp_path, capsys):
    a = _eval(capsys, grouped, "run0", "data", tmp_path / "a.npz")
    b = _eval(capsys, grouped, "run1", "data", tmp_path / "b.npz")
    bp = _eval(capsys, grouped, "run1", "permuted", tmp_path / "bp.npz")
    mine, _ = read_per_query(b)
    perm, _ = read_per_query(bp)
    for d in DIRS:  # the same queries in another order: by position these would be other queries
        x, y = mine["test"]["none"][d]["rank"], perm["test"]["none"][d]["rank"]
        assert not np.array_equal(x, y) and sorted(x) == sorted(y), d
    runs = {}
    for name, other, force in (("plain", b, ()), ("permuted", bp, ("--force",))):
        code, out, err = _cli(capsys, "compare", a, other, "--normalizer", "none", "--n-boot", "300", "--json", *force)
        assert code == 0, err
        runs[name] = json.loads(out)
    assert {r["direction"] for r in runs["plain"]["rows"]} == set(DIRS)
    assert runs["permuted"]["pairing"] == runs["plain"]["pairing"] == "query ids (t2v, v2t, p2v, v2p)"
    assert runs["permuted"]["paired_by_position"] == []
    keys = ("direction", "metric", "a", "b", "diff", "ci_low", "ci_high", "p_value")
    assert [{k: r[k] for k in keys} for r in runs["permuted"]["rows"]] == \
        [{k: r[k] for k in keys} for r in runs["plain"]["rows"]]
    assert any(r["diff"] != 0 for r in runs["plain"]["rows"] if r["direction"] == "p2v")  # two models: not trivial


def test_other_albums_are_refused_in_one_line(grouped, tmp_path, capsys):
    a = _eval(capsys, grouped, "run0", "data", tmp_path / "a.npz")
    s = _eval(capsys, grouped, "run0", "swapped", tmp_path / "s.npz")
    code, _, err = _cli(capsys, "compare", a, s, "--normalizer", "none", "--n-boot", "200", "--force")
    assert code == 2 and err.count("\n") == 1, err
    # the clips are the same clips (t2v / v2t pair), but one album reads them in another order
    assert "the test p2v queries differ (1 of A's" in err and "cannot be paired, even with --force" in err


def test_files_without_group_ids_pair_by_position_only_on_the_same_split_files(grouped, tmp_path, capsys):
    a = _eval(capsys, grouped, "run0", "data", tmp_path / "a.npz")
    bp = _eval(capsys, grouped, "run1", "permuted", tmp_path / "bp.npz")
    results, cards = read_per_query(_eval(capsys, grouped, "run1", "data", tmp_path / "b.npz"))
    with PerQueryFile(tmp_path / "b.npz") as f:  # as written before p2v / v2p had ids
        old = {"test": {d: f.query_ids("test", d) for d in ("t2v", "v2t")}}
    write_per_query(tmp_path / "old.npz", results, cards, ids=old)
    code, out, err = _cli(capsys, "compare", a, tmp_path / "old.npz", "--normalizer", "none", "--n-boot", "200")
    assert code == 0, err
    sha = cards["test"]["split_sha256"][:12]
    header = out.splitlines()[0]
    assert header.endswith(
        f"; queries paired by query ids (t2v, v2t); p2v, v2p by position ({tmp_path / 'old.npz'} stores no p2v / "
        f"v2p query ids, written before xmodal stored them): safe because every file lists the very same split "
        f"files (split_sha256 {sha}…), whose queries come in one order, so the i-th query is the same query in "
        f"every file"), header
    code, out, _ = _cli(capsys, "compare", a, tmp_path / "old.npz", "--normalizer", "none", "--n-boot", "200", "--json")
    assert json.loads(out)["paired_by_position"] == ["p2v", "v2p"]
    # other split files and no ids: never by position, even with --force; one line
    code, _, err = _cli(capsys, "compare", bp, tmp_path / "old.npz", "--normalizer", "none", "--n-boot", "200",
                        "--force", "--directions", "p2v")
    assert code == 2 and err.count("\n") == 1 and "stores no query ids" in err and "p2v queries cannot be paired" in err
