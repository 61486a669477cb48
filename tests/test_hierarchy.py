"""Clips inside videos (CrossCLR appendix A / COOT): the S_video_to_group.npy role, batches of
whole groups, masked global towers (vs a per-group loop), and L = L_local + w L_global (vs a
hand computation)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from xmodal.cli import main
from xmodal.config import from_dict
from xmodal.data import PairedSplit, load_paired_split
from xmodal.data.groups import group_problems, group_rows, paragraph_texts, subset_groups
from xmodal.data.importer import import_pairs
from xmodal.models.hierarchy import GlobalSpec, GlobalTower, HierarchicalTwoTower, pad_groups, with_global_towers
from xmodal.models import build_model, load_model
from xmodal.training.hierarchy import (HierarchyData, build_hierarchical_loss, global_loss_config, group_batches)

pytestmark = pytest.mark.usefixtures("one_thread")


def hier_split(seed=0, groups=9, dv=6, dt=5, frames=3):
    """A split of ``groups`` long videos with 1-4 clips each, one text per clip, a frame mask."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, size=groups)
    v2g = np.repeat(np.arange(groups), sizes)
    n = len(v2g)
    mask = np.ones((n, frames), bool)
    mask[::2, 1:] = False
    return PairedSplit.from_arrays(video=rng.normal(size=(n, frames, dv)), text=rng.normal(size=(n, dt)),
                                   text_to_video=rng.permutation(n), video_mask=mask, video_to_group=v2g)


# --------------------------------------------------------------------------- data


def _write(root: Path, split: PairedSplit, name="train"):
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{name}_video_features.npy", split.video)
    np.save(root / f"{name}_video_mask.npy", split.video_mask)
    np.save(root / f"{name}_text_features.npy", split.text)
    np.save(root / f"{name}_text_to_video.npy", split.text_to_video)
    np.save(root / f"{name}_video_to_group.npy", split.video_to_group)


def test_loader_reads_groups_and_names(tmp_path):
    s = hier_split()
    _write(tmp_path, s)
    (tmp_path / "train_groups.txt").write_text("".join(f"g{i}\n" for i in range(s.num_groups)))
    got = load_paired_split(tmp_path, "train")
    assert got.video_to_group.dtype == np.int64
    np.testing.assert_array_equal(got.video_to_group, s.video_to_group)
    assert got.group_names == [f"g{i}" for i in range(9)] and got.num_groups == 9
    no_groups = tmp_path / "flat"
    _write(no_groups, s)
    (no_groups / "train_video_to_group.npy").unlink()
    assert load_paired_split(no_groups, "train").video_to_group is None


@pytest.mark.parametrize("bad, words", [
    (np.array([0, 0, 1, 0, 1, 2, 2, 2]), ["not monotone", "row 3 has group 0 after group 1"]),
    (np.array([0, 0, 1]), ["3 entries, expected 8"]),
    (np.array([0, 0, 2, 2, 2, 3, 3, 3]), ["skip from 0 to 2 at row 2"]),
    (np.array([1, 1, 1, 1, 2, 2, 2, 2]), ["numbered from 0"]),
    (np.zeros(8, np.float32), ["1-d integer array"]),
])
def test_bad_group_arrays_are_named(tmp_path, capsys, bad, words):
    rng = np.random.default_rng(0)
    s = PairedSplit.from_arrays(video=rng.normal(size=(8, 4)), text=rng.normal(size=(8, 3)),
                                text_to_video=np.arange(8))
    root = tmp_path / "d"
    root.mkdir()
    for role, arr in (("video_features", s.video), ("text_features", s.text), ("text_to_video", s.text_to_video),
                      ("video_to_group", bad)):
        np.save(root / f"train_{role}.npy", arr)
    with pytest.raises(ValueError) as exc:
        load_paired_split(root, "train")
    msg = str(exc.value)
    assert "train_video_to_group.npy" in msg and all(w in msg for w in words), msg
    assert main(["data", "check", str(root)]) == 1
    out = capsys.readouterr()
    assert "train_video_to_group.npy" in out.out + out.err and words[0] in out.out + out.err
    with pytest.raises(ValueError, match="video_to_group"):
        PairedSplit.from_arrays(video=s.video, text=s.text, text_to_video=s.text_to_video, video_to_group=bad)


def test_group_helpers_against_loops():
    s = hier_split(seed=3, groups=7)
    g = s.video_to_group
    rows = group_rows(g)
    assert [r.tolist() for r in rows] == [[i for i in range(len(g)) if g[i] == k] for k in range(7)]
    naive = [[t for v in rows[k] for t in range(s.num_texts) if s.text_to_video[t] == v] for k in range(7)]
    assert [p.tolist() for p in paragraph_texts(s.text_to_video, g)] == naive
    assert group_problems(g, len(g)) == []
    np.testing.assert_array_equal(subset_groups(g, np.flatnonzero(g >= 2)), g[g >= 2] - 2)
    assert subset_groups(g, np.arange(len(g))[::-1]) is None  # reversed rows: groups no longer in order
    assert s.subset(np.flatnonzero(g >= 5)).num_groups == 2


def test_import_with_a_clip_column_orders_clips_by_start(tmp_path):
    feats = tmp_path / "f"
    feats.mkdir()
    lines = ["video_id,clip_id,start,end,caption"]
    for v in ("b", "a"):
        for c, start in ((2, 20.0), (0, 0.0), (1, 5.5)):
            lines.append(f"{v},{v}{c},{start},{start + 2},{v} clip {c}")
            np.save(feats / f"{v}{c}.npy", np.full((2, 3), ord(v) * 10 + c, np.float32))
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    import_pairs(tmp_path / "pairs.csv", features=feats, out=tmp_path / "out",
                 encode=lambda caps: np.arange(len(caps) * 2, dtype=np.float32).reshape(-1, 2))
    s = load_paired_split(tmp_path / "out", "train")
    assert s.group_names == ["b", "a"]
    assert s.video_names == ["b0", "b1", "b2", "a0", "a1", "a2"]
    np.testing.assert_array_equal(s.video_to_group, [0, 0, 0, 1, 1, 1])
    assert s.video[:, 0, 0].tolist() == [980, 981, 982, 970, 971, 972]
    assert [[s.captions[t] for t in p] for p in s.paragraphs()] == [
        ["b clip 0", "b clip 1", "b clip 2"], ["a clip 0", "a clip 1", "a clip 2"]]


# --------------------------------------------------------------------------- batches


def test_batches_hold_whole_groups_each_once():
    s = hier_split(seed=1, groups=23)
    data = HierarchyData(s, *s.video_input(), torch.as_tensor(s.text), seed=5, batch_size=4)
    batches = data.batches(0)
    assert len(batches) == 23 // 4 and all(len(b) == 4 for b in batches)
    seen = np.concatenate(batches)
    assert len(np.unique(seen)) == len(seen)
    for b in batches:
        texts = data.texts(b)
        clips_of_texts = set(s.text_to_video[texts].tolist())
        whole = {int(v) for gid in b for v in np.flatnonzero(s.video_to_group == gid)}
        assert clips_of_texts == whole  # every clip of every group, nothing else
    assert [x.tolist() for x in data.batches(0)] == [x.tolist() for x in batches]
    assert [x.tolist() for x in data.batches(1)] != [x.tolist() for x in batches]
    assert [x.tolist() for x in group_batches(0, seed=5, groups=np.arange(23), batch_size=4)] == \
        [x.tolist() for x in batches]


def test_groups_without_text_are_not_batched():
    s = hier_split(seed=2, groups=5)
    keep = s.video_to_group[s.text_to_video] != 2  # group 2 loses its paragraph
    t = PairedSplit.from_arrays(video=s.video, text=s.text[keep], text_to_video=s.text_to_video[keep],
                                video_mask=s.video_mask, video_to_group=s.video_to_group)
    data = HierarchyData(t, *t.video_input(), torch.as_tensor(t.text), seed=0, batch_size=1)
    assert sorted(np.concatenate(data.batches(0)).tolist()) == [0, 1, 3, 4]


# --------------------------------------------------------------------------- global towers


def test_pad_groups_against_a_loop():
    rng = np.random.default_rng(0)
    owner = torch.as_tensor(rng.integers(0, 4, size=11))
    x = torch.randn(11, 3)
    padded, mask = pad_groups(x, owner, 4)
    for g in range(4):
        rows = [i for i in range(11) if owner[i] == g]
        assert mask[g].sum() == len(rows) and mask[g, :len(rows)].all()
        torch.testing.assert_close(padded[g, :len(rows)], x[rows], rtol=0, atol=0)


@pytest.mark.parametrize("block", ["xmodal", "release"])
@pytest.mark.parametrize("pooling", ["mean", "max", "atn"])
def test_masked_global_pooling_ignores_padded_clips(pooling, block):
    torch.manual_seed(0)
    tower = GlobalTower(GlobalSpec(dim=8, heads=2, layers=1, pooling=pooling, pool_heads=2, block=block)).eval()
    sizes = [1, 4, 2]
    x = torch.randn(3, 4, 8)
    mask = torch.arange(4)[None, :] < torch.tensor(sizes)[:, None]
    junk = x.clone()
    junk[~mask] = 1e4
    with torch.no_grad():
        batched = tower(x, mask)
        batched_junk = tower(junk, mask)
        naive = torch.stack([tower(x[g:g + 1, :n], torch.ones(1, n, dtype=torch.bool))[0]
                             for g, n in enumerate(sizes)])
    torch.testing.assert_close(batched, naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched_junk, naive, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="at least one"):
        tower(x, mask & False)


def _model(seed=0, dv=6, dt=5, dim=8, pooling="atn"):
    torch.manual_seed(seed)
    flat = build_model(video_dim=dv, text_dim=dt, kind="meanp", dim=dim)
    return flat, with_global_towers(flat, GlobalSpec(dim=dim, heads=2, pooling=pooling))


def test_with_global_towers_keeps_the_local_model_and_round_trips(tmp_path):
    from xmodal.models import model_payload
    from xmodal.runs import atomic_save

    s = hier_split()
    flat, model = _model()
    torch.testing.assert_close(model.encode_video(*s.video_input()), flat.encode_video(*s.video_input()))
    atomic_save({"model": model_payload(model)}, tmp_path / "model.pt")
    back = load_model(tmp_path / "model.pt")
    assert isinstance(back, HierarchicalTwoTower) and back.global_spec == model.global_spec
    a = model.encode_groups(*s.video_input(), s.text, s.text_to_video, s.video_to_group)
    b = back.encode_groups(*s.video_input(), s.text, s.text_to_video, s.video_to_group)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


def test_encode_groups_against_a_per_group_loop():
    s = hier_split(seed=4, groups=6)
    _, model = _model(pooling="max")
    model.eval()
    paragraph, video, groups = model.encode_groups(*s.video_input(), s.text, s.text_to_video, s.video_to_group,
                                                   batch_size=4)
    assert groups.tolist() == list(range(6))
    with torch.no_grad():
        for g, (rows, texts) in enumerate(zip(s.group_rows(), s.paragraphs())):
            clips = model.forward_video(torch.as_tensor(s.video[rows]), torch.as_tensor(s.video_mask[rows]))
            sents = model.forward_text(torch.as_tensor(s.text[texts]))
            one = torch.ones(1, len(rows), dtype=torch.bool)
            v = model.global_video(clips[None], one)[0]
            p = model.global_text(sents[None], torch.ones(1, len(texts), dtype=torch.bool))[0]
            torch.testing.assert_close(video[g], v / v.norm(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(paragraph[g], p / p.norm(), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- loss


def _info_nce_by_hand(v, t, tau):
    """Symmetric InfoNCE with unique ids, a plain double loop (CLIP)."""
    unit = lambda x: [a / math.sqrt(sum(b * b for b in x)) for a in x]  # noqa: E731
    v, t = [unit(x) for x in v.tolist()], [unit(x) for x in t.tolist()]
    n = len(v)
    s = [[sum(a * b for a, b in zip(t[i], v[j])) / tau for j in range(n)] for i in range(n)]
    t2v = sum(-s[i][i] + math.log(sum(math.exp(s[i][j]) for j in range(n))) for i in range(n)) / n
    v2t = sum(-s[i][i] + math.log(sum(math.exp(s[j][i]) for j in range(n))) for i in range(n)) / n
    return 0.5 * (t2v + v2t)


def cfg_for(**loss):
    return from_dict({"model": {"kind": "meanp", "dim": 8, "hierarchy": True, "global_heads": 2},
                      "loss": {"name": "infonce", "temperature": 0.1, **loss}})


def test_loss_is_local_plus_weight_times_global_by_hand():
    s = hier_split(seed=6, groups=5)
    _, model = _model(seed=1)
    model.eval()  # no dropout: the hand computation below sees the same embeddings
    cfg = cfg_for(global_weight=0.25)
    loss_fn = build_hierarchical_loss(cfg)
    data = HierarchyData(s, *(torch.as_tensor(a) if a is not None else None for a in s.video_input()),
                         torch.as_tensor(s.text), seed=0, batch_size=3)
    batch = data.batches(0)[0]
    from contextlib import nullcontext

    got = data.loss(model, loss_fn, batch, device=torch.device("cpu"), amp=nullcontext(), scheduled=None,
                    keyword="temperature")
    # by hand: each text with its clip (local), each group's clips / paragraph through the global towers
    with torch.no_grad():
        texts = np.concatenate([s.paragraphs()[g] for g in batch])
        clips = s.text_to_video[texts]
        lv = model.forward_video(torch.as_tensor(s.video[clips]), torch.as_tensor(s.video_mask[clips]))
        lt = model.forward_text(torch.as_tensor(s.text[texts]))
        gv, gt = [], []
        for g in batch:
            rows, para = s.group_rows()[g], s.paragraphs()[g]
            c = model.forward_video(torch.as_tensor(s.video[rows]), torch.as_tensor(s.video_mask[rows]))
            p = model.forward_text(torch.as_tensor(s.text[para]))
            gv.append(model.global_video(c[None], torch.ones(1, len(rows), dtype=torch.bool))[0])
            gt.append(model.global_text(p[None], torch.ones(1, len(para), dtype=torch.bool))[0])
    local = _info_nce_by_hand(lv, lt, 0.1)
    global_ = _info_nce_by_hand(torch.stack(gv), torch.stack(gt), 0.1)
    assert float(got.detach()) == pytest.approx(local + 0.25 * global_, rel=1e-5)
    assert float(loss_fn.last_terms["local"]) == pytest.approx(local, rel=1e-5)
    assert float(loss_fn.last_terms["global"]) == pytest.approx(global_, rel=1e-5)
    got.backward()
    assert model.global_video.out.weight.grad is not None and model.video_tower.net.weight.grad is not None


def test_global_loss_defaults_drop_the_queue_and_follow_overrides():
    cfg = cfg_for(name="crossclr", kwargs={"queue_size": 64, "intra_weight": 0.5})
    g = global_loss_config(cfg).loss
    assert (g.name, g.kwargs) == ("crossclr", {"intra_weight": 0.5})
    loss_fn = build_hierarchical_loss(cfg)
    assert loss_fn.local.queue_size == 64 and loss_fn.global_.queue_size == 0 and loss_fn.weight == 0.6
    other = global_loss_config(cfg_for(name="crossclr", kwargs={"queue_size": 64}, global_name="infonce")).loss
    assert (other.name, other.kwargs) == ("infonce", {})
    explicit = global_loss_config(cfg_for(global_kwargs={"learnable": True})).loss
    assert explicit.kwargs == {"learnable": True}
    with pytest.raises(ValueError, match="loss.global_name"):
        cfg_for(global_name="nope")
    with pytest.raises(ValueError, match="loss.global_weight"):
        cfg_for(global_weight=-1)
    with pytest.raises(ValueError, match="model.global_heads"):
        from_dict({"model": {"dim": 10, "hierarchy": True, "global_heads": 4}})


def test_doctests_of_the_hierarchy_modules():
    import doctest

    import xmodal.data.groups
    import xmodal.models.hierarchy
    import xmodal.training.hierarchy

    for mod in (xmodal.data.groups, xmodal.models.hierarchy, xmodal.training.hierarchy):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_albums_of_the_bench_are_seeded_whole_and_in_order():
    import importlib.util

    spec = importlib.util.spec_from_file_location("albums", Path(__file__).resolve().parents[1] / "bench" / "albums.py")
    albums = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(albums)
    n = 40
    base = PairedSplit.from_arrays(video=np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 2)),
                                   text=np.repeat(np.arange(n, dtype=np.float32), 5)[:, None] * np.ones((1, 3)),
                                   text_to_video=np.repeat(np.arange(n), 5))
    a, b = albums.make_albums(base, 3), albums.make_albums(base, 3)
    np.testing.assert_array_equal(a.video, b.video)
    sizes = np.bincount(a.video_to_group)
    assert sizes.min() >= 3 and sizes.max() <= 8 and n - 3 < sizes.sum() <= n
    assert len(np.unique(a.video[:, 0])) == a.num_videos  # each image at most once
    # one caption per image, of that image, in album (clip) order
    np.testing.assert_array_equal(a.text[:, 0], a.video[a.text_to_video, 0])
    assert all(p.tolist() == r.tolist() for p, r in zip(a.paragraphs(), a.group_rows()))
    assert not np.array_equal(albums.make_albums(base, 4).video, a.video)


def test_related_albums_of_the_bench_hold_one_topic_each_in_order():
    import importlib.util

    spec = importlib.util.spec_from_file_location("albums", Path(__file__).resolve().parents[1] / "bench" / "albums.py")
    albums = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(albums)
    rng = np.random.default_rng(0)
    n, topics = 160, 4
    centres = rng.normal(size=(topics, 6)) * 5
    topic = np.repeat(np.arange(topics), n // topics)
    # five captions per image near its topic's centre; the image feature is its index (to trace rows)
    text = (centres[np.repeat(topic, 5)] + rng.normal(size=(5 * n, 6))).astype(np.float32)
    base = PairedSplit.from_arrays(video=np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 2)), text=text,
                                   text_to_video=np.repeat(np.arange(n), 5))
    a, b = albums.make_related_albums(base, 3), albums.make_related_albums(base, 3)
    np.testing.assert_array_equal(a.video, b.video)
    assert not np.array_equal(albums.make_related_albums(base, 4).video, a.video)
    sizes = np.bincount(a.video_to_group)
    assert sizes.min() >= 3 and sizes.max() <= 8
    image = a.video[:, 0].astype(int)
    assert len(np.unique(image)) == a.num_videos  # each image at most once
    clusters, mean = albums.topic_clusters(base, 3)
    for rows in a.group_rows():
        assert len(set(clusters[image[rows]].tolist())) == 1  # one caption topic per album
        members = np.flatnonzero(clusters == clusters[image[rows[0]]])
        centred = mean[members] - mean[members].mean(0)
        axis = np.linalg.svd(centred, full_matrices=False)[2][0]
        proj = mean[image[rows]] @ axis
        # ordered along the topic's first principal axis (whose sign SVD leaves open)
        assert np.all(np.diff(proj) >= -1e-12) or np.all(np.diff(proj) <= 1e-12)
    # one caption per image, of that image, in album order
    for t, v in enumerate(a.text_to_video):
        assert any(np.allclose(a.text[t], text[5 * image[v] + k]) for k in range(5))
    assert all(p.tolist() == r.tolist() for p, r in zip(a.paragraphs(), a.group_rows()))
    assert a.video_to_group[0] == 0 and len(set(clusters[image[a.group_rows()[0]]])) == 1


def test_retrieval_metrics_names_a_one_dimensional_t2v_matrix_beside_a_v2t_one():
    # found by the public fuzz test: a 1-d sim_t2v with a v2t matrix raised a bare RuntimeError
    from xmodal.retrieval.evaluate import retrieval_metrics

    with pytest.raises(ValueError, match="sim_t2v: expected 2 dimensions"):
        retrieval_metrics(np.array([0.1], dtype=np.float32), np.array([[4], [2]]),
                          np.array([[0.1], [-0.1], [0.6]], dtype=np.float32))
    with pytest.raises((ValueError, TypeError), match="text_to_video|positives"):
        retrieval_metrics(np.ones((3, 2), dtype=np.float32), np.ones((2, 3)), np.ones((3, 1), dtype=np.float32))
