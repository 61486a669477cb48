"""bench/albums.py's pieces for the testbed without the length cue (issue 35.4): fixed-length albums whose
test gallery is the same for every seed, same-length ranks, and the untrained control's position effect."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from xmodal.data import PairedSplit, load_paired_split

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def albums():
    spec = importlib.util.spec_from_file_location("albums", Path(__file__).resolve().parents[1] / "bench" / "albums.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _topics(n: int, seed: int) -> PairedSplit:
    """``n`` images of 3 caption topics, five captions each; an image's feature is its index."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, 6)) * 5
    topic = rng.integers(0, 3, size=n)
    text = (centres[np.repeat(topic, 5)] + rng.normal(size=(5 * n, 6))).astype(np.float32)
    return PairedSplit.from_arrays(video=np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32),
                                   text=text, text_to_video=np.repeat(np.arange(n), 5))


def test_fixed_albums_have_one_length_and_one_test_gallery_for_every_seed(albums, tmp_path, monkeypatch):
    data = tmp_path / "flickr"
    _topics(240, 0).save(data, "train")
    _topics(130, 1).save(data, "dev")
    monkeypatch.setattr(albums, "VAL_ALBUMS", 4)
    for seed in (0, 1):
        albums.write_albums(data, tmp_path / f"seed{seed}", seed, "fixed")
    splits = {(s, name): load_paired_split(tmp_path / f"seed{s}", name) for s in (0, 1) for name in ("train", "val", "test")}
    for split in splits.values():
        assert set(np.bincount(split.video_to_group).tolist()) == {albums.FIXED}  # paragraph length says nothing
        assert np.array_equal(np.bincount(split.text_to_video), np.ones(split.num_videos, dtype=np.int64))
    assert splits[0, "val"].num_groups == 4
    for field in ("video", "text", "text_to_video", "video_to_group"):  # the test gallery: cut with one seed
        assert np.array_equal(getattr(splits[0, "test"], field), getattr(splits[1, "test"], field))
    assert not np.array_equal(splits[0, "train"].video, splits[1, "train"].video)  # training albums follow the seed


def test_same_length_ranks_against_a_loop(albums):
    rng = np.random.default_rng(2)
    p, v = (torch.as_tensor(rng.normal(size=(30, 8)), dtype=torch.float32) for _ in range(2))
    v[3] = v[7]  # a tie with the right album counts against it (pessimistic)
    p[3] = v[3]
    lengths = rng.integers(3, 6, size=30)
    lengths[7] = lengths[3]
    r = albums._ranks(p, v, lengths)
    sim = (p @ v.T).tolist()
    for i in range(30):
        same = [j for j in range(30) if lengths[j] == lengths[i] and j != i]
        assert r["same"][i] == 1 + sum(sim[i][j] >= sim[i][i] for j in same)
        assert r["p2v"][i] == 1 + sum(sim[i][j] >= sim[i][i] for j in range(30) if j != i)
        assert r["v2p"][i] == 1 + sum(sim[j][i] >= sim[i][i] for j in range(30) if j != i)
    assert r["same"][3] >= 2  # the tie with album 7, of the same length
    # one length: the same-length ranks are the ranks
    one = albums._ranks(p, v, np.full(30, 5))
    assert np.array_equal(one["same"], one["p2v"])


def test_untrained_release_towers_carry_the_album_length_through_their_positions(albums):
    """Why the control exists: untrained (std 0.01) release global towers average layer-normed clip
    embeddings plus their sine/cosine positions, so two albums of identical clips but different lengths
    differ, and they stop differing when the positions are zeroed."""
    from xmodal.models.hierarchy import GlobalSpec, GlobalTower

    torch.manual_seed(0)
    tower = GlobalTower(GlobalSpec(dim=16, heads=2, pooling="mean", context=False, block="release")).eval()
    clip = torch.randn(16)
    short, long_ = clip.repeat(1, 3, 1), clip.repeat(1, 8, 1)
    with torch.no_grad():
        a = tower(short, torch.ones(1, 3, dtype=torch.bool))
        b = tower(long_, torch.ones(1, 8, dtype=torch.bool))
        assert float((a - b).norm() / a.norm()) > 0.1  # the same clips, 3 or 8 times: 17 % apart
        tower.pos.zero_()
        a = tower(short, torch.ones(1, 3, dtype=torch.bool))
        b = tower(long_, torch.ones(1, 8, dtype=torch.bool))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_control_rows_store_each_albums_query_id_so_compare_pairs_them_by_identity(albums, tmp_path, monkeypatch,
                                                                                   capsys):
    """Issue 45.4: the per-query files of ``--controls`` carry p2v / v2p query ids (the album's images and
    captions in order), the test albums' ids, so ``xmodal compare`` pairs the rows by album, not by position."""
    from types import SimpleNamespace

    from xmodal.cli import main
    from xmodal.retrieval.perquery import query_ids
    from xmodal.retrieval.perquery_read import PerQueryFile
    from xmodal.training.loop import train

    data = tmp_path / "flickr"
    _topics(240, 0).save(data, "train")
    _topics(130, 1).save(data, "dev")
    monkeypatch.setattr(albums, "VAL_ALBUMS", 4)
    root, out = tmp_path / "albums", tmp_path / "out"
    albums.write_albums(data, root, 0, "fixed")
    run = tmp_path / "run"
    train(albums.config(root, "infonce", "flat", 0, 1, album_size=albums.FIXED), run, resume=False, progress=False,
          verbose=False)
    albums.evaluate_rows(SimpleNamespace(out=str(out), epochs=1), "fixed", "infonce", "flat", 0, run, root)
    want = query_ids(load_paired_split(root, "test"))
    folder = out / "perquery" / "fixed" / "infonce"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["flat", "flat-samelength", "untrained", "untrained-nopos", "untrained-nopos-samelength",
                     "untrained-samelength"]
    for name in names:
        with PerQueryFile(folder / name / "seed0.npz") as f:
            assert f.id_entries["test"] == {"p2v", "v2p"}
            for d in ("p2v", "v2p"):
                assert np.array_equal(f.query_ids("test", d), want[d])
    capsys.readouterr()
    assert main(["compare", str(folder / "flat" / "seed0.npz"), str(folder / "untrained" / "seed0.npz"),
                 "--n-boot", "100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairing"] == "query ids (p2v, v2p)"


def test_the_result_file_holds_every_seed_and_the_summaries_the_pages_print(albums, tmp_path):
    """Issue 45.1: the JSON the docs render: per-seed rows, mean / sample std (numpy's, ddof 1) and the table."""
    rng = np.random.default_rng(3)
    per_seed = {}
    for s in (0, 1, 2):
        per_seed[s] = {}
        for kind, loss, name in (("fixed", "infonce", "coot"), ("fixed", "infonce", "flat")):
            v = rng.uniform(20, 60, size=5).round(2)
            per_seed[s][(kind, loss, name)] = {"p2v": {"R@1": v[0], "R@5": v[1]}, "v2p": {"R@1": v[2]},
                                               "same": {"R@1": v[3]}, "t2v": {"R@1": v[4]}, "best_epoch": s + 4,
                                               "label": f"label of {name}"}
    rows, nested, tables = albums.results(per_seed)
    assert len(rows) == 6 and rows[1] == {"albums": "fixed", "loss": "infonce", "row": "coot", "seed": 1,
                                          "p2v_r1": per_seed[1]["fixed", "infonce", "coot"]["p2v"]["R@1"],
                                          "same_r1": per_seed[1]["fixed", "infonce", "coot"]["same"]["R@1"],
                                          "v2p_r1": per_seed[1]["fixed", "infonce", "coot"]["v2p"]["R@1"],
                                          "p2v_r5": per_seed[1]["fixed", "infonce", "coot"]["p2v"]["R@5"],
                                          "t2v_r1": per_seed[1]["fixed", "infonce", "coot"]["t2v"]["R@1"],
                                          "best_epoch": 5}
    got = nested["fixed"]["infonce"]["flat"]
    ref = np.array([per_seed[s]["fixed", "infonce", "flat"]["p2v"]["R@1"] for s in (0, 1, 2)])
    assert got["p2v_r1"]["per_seed"] == ref.tolist() and got["best_epochs"] == [4, 5, 6]
    assert got["p2v_r1"]["mean"] == pytest.approx(ref.mean()) and got["p2v_r1"]["std"] == pytest.approx(ref.std(ddof=1))
    table = tables["fixed"]
    assert len(table["columns"]) == len(table["align"]) == len(table["rows"][0]) == 9
    assert table["rows"][1][:2] == ["infonce", "label of flat"] and table["rows"][1][-2:] == [ref.tolist(), [4, 5, 6]]


def test_write_takes_a_json_file(albums, tmp_path, capsys):
    with pytest.raises(SystemExit):
        albums.main(["--data", str(tmp_path), "--write", "docs/results/albums.md"])
    assert "is not a .json file" in capsys.readouterr().err


def test_seed_counts_say_on_how_many_seeds_b_beats_a(albums):
    nested = {"fixed": {"infonce": {"flat": {"p2v_r1": {"per_seed": [40.0, 42.0, 44.0]}},
                                    "coot": {"p2v_r1": {"per_seed": [35.0, 43.0, 44.0]}}}}}
    got = albums.seed_counts(nested)["fixed"]["infonce"]["coot-vs-flat"]
    assert got == {"p2v_r1": {"higher": 1, "lower": 1, "seeds": 3}}  # a tie is neither
