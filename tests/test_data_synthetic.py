"""The synthetic generator: determinism, shapes, and the effect of every knob."""

import numpy as np
import pytest

from xmodal.data import PairedSplit, synthetic, zipf_probabilities

SMALL = dict(num_train=300, num_val=100, num_test=100)


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)




def test_keys_shapes_dtypes():
    d = synthetic(**SMALL, captions_per_video=4, video_dim=20, text_dim=12)
    assert set(d) == {"train", "val", "test"}
    for name, n in (("train", 300), ("val", 100), ("test", 100)):
        s = d[name]
        assert isinstance(s, PairedSplit)
        assert s.video.shape == (n, 20) and s.video.dtype == np.float32
        assert s.text.shape == (4 * n, 12) and s.text.dtype == np.float32
        assert s.text_to_video.dtype == np.int64
        np.testing.assert_array_equal(s.ids, np.repeat(np.arange(n), 4))
        assert s.video_labels.shape == (n,) and s.text_labels.shape == (4 * n,)
        np.testing.assert_array_equal(s.text_labels, s.video_labels[s.text_to_video])
        assert s.name == f"synthetic/{name}"
        assert np.isfinite(s.video).all() and np.isfinite(s.text).all()


def test_deterministic_by_seed():
    a, b, c = synthetic(**SMALL, seed=3), synthetic(**SMALL, seed=3), synthetic(**SMALL, seed=4)
    for k in a:
        np.testing.assert_array_equal(a[k].video, b[k].video)
        np.testing.assert_array_equal(a[k].text, b[k].text)
        np.testing.assert_array_equal(a[k].video_labels, b[k].video_labels)
    assert not np.allclose(a["train"].video, c["train"].video)


def test_splits_differ_but_share_concepts():
    d = synthetic(**SMALL)
    assert not np.allclose(d["val"].video[:50], d["test"].video[:50])
    # Same concept centres and maps: class-mean video features of val and test agree
    # far better than those of two different classes.
    v, t = d["val"], d["test"]
    cls = np.intersect1d(v.video_labels, t.video_labels)[:2]
    mv = [v.video[v.video_labels == c].mean(0) for c in cls]
    mt = [t.video[t.video_labels == c].mean(0) for c in cls]
    assert np.linalg.norm(mv[0] - mt[0]) < np.linalg.norm(mv[0] - mt[1])


def test_long_tail_counts_decrease():
    d = synthetic(num_train=3000, num_val=10, num_test=10, num_concepts=20, zipf_exponent=1.2)
    counts = np.bincount(d["train"].video_labels, minlength=20)
    expected = 3000 * zipf_probabilities(20, 1.2)
    # Within 5 standard deviations of the multinomial counts, and the head >> the tail.
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected) + 2)
    assert counts[:3].sum() > 5 * counts[-3:].sum()
    flat = synthetic(num_train=3000, num_val=10, num_test=10, num_concepts=20, zipf_exponent=0.0)
    fc = np.bincount(flat["train"].video_labels, minlength=20)
    assert fc.max() < 2 * fc.min()


def test_zipf_probabilities():
    p = zipf_probabilities(4, 1.0)
    np.testing.assert_allclose(p, np.array([1, 1 / 2, 1 / 3, 1 / 4]) / (1 + 1 / 2 + 1 / 3 + 1 / 4))
    np.testing.assert_allclose(zipf_probabilities(3, 0.0), [1 / 3] * 3)


def test_modality_gap_knob():
    def gap(g):
        # common_scale=0: no shared cone, so only the gap knob moves the modal means.
        s = synthetic(**SMALL, video_dim=32, text_dim=32, common_scale=0.0, modality_gap=g)["test"]
        return np.linalg.norm(_unit(s.video).mean(0) - _unit(s.text).mean(0))

    gaps = [gap(g) for g in (0.0, 0.5, 1.5)]
    assert gaps[0] < gaps[1] < gaps[2]

    # Exactly a constant shift of each modality's mean, of norm gap * typical norm.
    s0, s1, s2 = (synthetic(**SMALL, modality_gap=g)["test"] for g in (0.0, 0.7, 1.4))
    for a0, a1, a2 in ((s0.video, s1.video, s2.video), (s0.text, s1.text, s2.text)):
        shift = a1 - a0
        np.testing.assert_allclose(shift, np.broadcast_to(shift[0], shift.shape), atol=1e-5)
        np.testing.assert_allclose(a2 - a0, 2 * shift, atol=1e-5)
        typical = np.sqrt((a0.astype(np.float64) ** 2).sum(1).mean())
        assert 0.3 * typical < np.linalg.norm(shift[0]) < 3 * typical


def test_noisy_fraction_shuffles_exactly_that_fraction():
    clean = synthetic(**SMALL, noisy_fraction=0.0)
    noisy = synthetic(**SMALL, noisy_fraction=0.3)
    m = clean["train"].num_texts
    changed = ~np.all(clean["train"].text == noisy["train"].text, axis=1)
    assert changed.sum() == round(0.3 * m)
    # The mapping still names the original videos; only text content moved...
    np.testing.assert_array_equal(clean["train"].ids, noisy["train"].ids)
    # ...and each moved caption is a caption of ANOTHER video (a permutation of rows).
    src = [np.flatnonzero(np.all(clean["train"].text == row, axis=1)) for row in noisy["train"].text[changed]]
    assert all(len(s) == 1 for s in src)
    src = np.array([s[0] for s in src])
    assert np.all(clean["train"].ids[src] != clean["train"].ids[changed])
    assert sorted(src.tolist()) == np.flatnonzero(changed).tolist()
    # Labels follow the text content; val/test and videos are untouched.
    np.testing.assert_array_equal(noisy["train"].text_labels[changed], clean["train"].text_labels[src])
    np.testing.assert_array_equal(clean["train"].video, noisy["train"].video)
    np.testing.assert_array_equal(clean["test"].text, noisy["test"].text)


def test_knobs_are_independent_streams():
    # Changing the hub knob leaves labels and texts of non-hub structure unchanged.
    a, b = synthetic(**SMALL, hub_fraction=0.0), synthetic(**SMALL, hub_fraction=0.1)
    np.testing.assert_array_equal(a["test"].video_labels, b["test"].video_labels)
    diff_rows = ~np.all(a["test"].video == b["test"].video, axis=1)
    assert diff_rows.sum() == 10


def _k_occurrence_skew(sim, k=10):
    top = np.argpartition(-sim, k, axis=1)[:, :k]
    c = np.bincount(top.ravel(), minlength=sim.shape[1]).astype(float)
    return ((c - c.mean()) ** 3).mean() / c.std() ** 3, c


def test_hubs_are_central():
    d = synthetic(num_train=10, num_val=10, num_test=500, latent_dim=16, video_dim=16, text_dim=16,
                  hub_fraction=0.02, hub_strength=2.0, modality_gap=0.0, seed=1)
    s = d["test"]
    # Cross-modal structure is not aligned in raw space, so look at video-video
    # similarity: hubs occur in many more top-10 lists than ordinary videos.
    v = _unit(s.video)
    sim = v @ v.T
    np.fill_diagonal(sim, -np.inf)
    skew, counts = _k_occurrence_skew(sim)
    base = synthetic(num_train=10, num_val=10, num_test=500, latent_dim=16, video_dim=16, text_dim=16,
                     hub_fraction=0.0, modality_gap=0.0, seed=1)["test"]
    vb = _unit(base.video)
    sb = vb @ vb.T
    np.fill_diagonal(sb, -np.inf)
    skew0, _ = _k_occurrence_skew(sb)
    hubs = np.flatnonzero(~np.all(s.video == base.video, axis=1))
    assert len(hubs) == 10
    assert counts[hubs].mean() > 3 * counts.mean()
    assert skew > skew0 + 0.3


def _lstsq_r1(d):
    """R@1 of text->video after a least-squares linear map fitted on train (numpy only)."""
    tr, te = d["train"], d["test"]
    w, *_ = np.linalg.lstsq(tr.text, tr.video[tr.ids], rcond=None)
    q, g = _unit(te.text @ w), _unit(te.video)
    sim = q @ g.T
    pos = sim[np.arange(len(te.ids)), te.ids]
    return float(((sim > pos[:, None]).sum(1) == 0).mean())


def test_difficulty_mid_range_and_noise_knobs():
    base = _lstsq_r1(synthetic(num_train=1000, num_val=10, num_test=300))
    assert 0.05 < base < 0.9
    easier = _lstsq_r1(synthetic(num_train=1000, num_val=10, num_test=300, caption_noise=0.2,
                                 feature_noise=0.05))
    harder = _lstsq_r1(synthetic(num_train=1000, num_val=10, num_test=300, caption_noise=3.0))
    assert harder < base < easier


def test_frames_axis():
    d = synthetic(**SMALL, frames=5, video_dim=16, frame_noise=0.1)
    flat = synthetic(**SMALL, video_dim=16)
    v = d["test"].video
    assert v.shape == (100, 5, 16) and v.dtype == np.float32
    assert d["test"].has_frames
    # Frames scatter around the clip feature of the frame-free dataset.
    err = np.abs(v.mean(1) - flat["test"].video).mean()
    assert err < 0.2 * np.abs(flat["test"].video).mean()


@pytest.mark.parametrize("kw, exc", [
    (dict(num_train=0), ValueError), (dict(captions_per_video=1.5), TypeError),
    (dict(noisy_fraction=1.5), ValueError), (dict(hub_fraction=-0.1), ValueError),
    (dict(modality_gap=float("nan")), ValueError), (dict(instance_scale=0), ValueError),
    (dict(seed="a"), TypeError), (dict(frames=-1), ValueError),
])
def test_bad_knobs(kw, exc):
    with pytest.raises(exc, match=next(iter(kw))):
        synthetic(**kw)


def test_paired_split_subset_and_validation():
    d = synthetic(**SMALL)["test"]
    sub = d.subset(np.array([5, 2]))
    assert sub.num_videos == 2 and sub.num_texts == 6
    np.testing.assert_array_equal(sub.video, d.video[[5, 2]])
    np.testing.assert_array_equal(sub.text[:3], d.text[6:9])  # texts keep original order (video 2 first)
    np.testing.assert_array_equal(sub.ids, [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(sub.video_labels, d.video_labels[[5, 2]])
    sub.video[:] = 0
    assert np.abs(d.video[5]).sum() > 0  # a copy: the original is untouched
    with pytest.raises(ValueError, match="video_rows"):
        d.subset([0, 0])
    with pytest.raises(ValueError, match="text_to_video"):
        PairedSplit(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), np.array([0, 2]))
    with pytest.raises(ValueError, match="text_to_video"):
        PairedSplit(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), np.array([0]))
    with pytest.raises(ValueError, match="captions"):
        PairedSplit(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), np.array([0, 1]),
                    captions=["a"])


def test_linear_infonce_head_reaches_mid_range_r1():
    """The default dataset is neither trivial nor hopeless for a linear InfoNCE head."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: extra threads only contend on a shared 2-core box
    try:
        r1 = _train_linear_infonce_r1(torch)
    finally:
        torch.set_num_threads(threads)
    assert 0.15 < r1 < 0.6, r1


def _train_linear_infonce_r1(torch):
    torch.manual_seed(0)
    d = synthetic()
    tr, te = d["train"], d["test"]
    mv, sv, mt, st = tr.video.mean(0), tr.video.std(0), tr.text.mean(0), tr.text.std(0)
    xv, xt = torch.tensor((tr.video - mv) / sv), torch.tensor((tr.text - mt) / st)
    fv, ft = torch.nn.Linear(xv.shape[1], 64), torch.nn.Linear(xt.shape[1], 64)
    opt = torch.optim.Adam([*fv.parameters(), *ft.parameters()], 1e-3)
    ids = torch.tensor(tr.ids)
    for _ in range(10):
        for b in torch.randperm(len(ids), generator=torch.Generator().manual_seed(0)).split(256):
            v = torch.nn.functional.normalize(fv(xv[ids[b]]), dim=1)
            t = torch.nn.functional.normalize(ft(xt[b]), dim=1)
            logits = (t @ v.T / 0.05).masked_fill((ids[b][:, None] == ids[b][None]) & ~torch.eye(len(b), dtype=bool),
                                                  float("-inf"))
            lab = torch.arange(len(b))
            loss = torch.nn.functional.cross_entropy(logits, lab) + torch.nn.functional.cross_entropy(logits.T, lab)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        v = torch.nn.functional.normalize(fv(torch.tensor((te.video - mv) / sv)), dim=1).numpy()
        t = torch.nn.functional.normalize(ft(torch.tensor((te.text - mt) / st)), dim=1).numpy()
    sim = t @ v.T
    pos = sim[np.arange(te.num_texts), te.ids]
    return ((sim > pos[:, None]).sum(1) == 0).mean()


def test_write_synthetic_writes_the_splits_a_synthetic_run_generates(tmp_path):
    """``xmodal data synthetic`` / ``write_synthetic``: the layout reads back equal to ``synthetic()``."""
    import numpy as np

    from xmodal.data import load_paired_split, synthetic, write_synthetic

    out = tmp_path / "synth"
    write_synthetic(out, seed=3, num_train=30, num_val=10, num_test=10)
    want = synthetic(seed=3, num_train=30, num_val=10, num_test=10)
    for name in ("train", "val", "test"):
        got = load_paired_split(out, name, mmap=False)
        np.testing.assert_array_equal(np.asarray(got.video), np.asarray(want[name].video))
        np.testing.assert_array_equal(np.asarray(got.text), np.asarray(want[name].text))
        np.testing.assert_array_equal(np.asarray(got.text_to_video), np.asarray(want[name].text_to_video))
        np.testing.assert_array_equal(np.asarray(got.video_labels), np.asarray(want[name].video_labels))
    write_synthetic(out, seed=4, num_train=30, num_val=10, num_test=10)  # a second write replaces the first
    again = load_paired_split(out, "test", mmap=False)
    assert not np.array_equal(np.asarray(again.video), np.asarray(want["test"].video))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".synth")]  # no temporary left


def test_write_synthetic_refuses_a_folder_with_other_files(tmp_path):
    import pytest

    from xmodal.data import write_synthetic

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="notes.txt"):
        write_synthetic(out, num_train=10, num_val=5, num_test=5)
    assert (out / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="a file or a symbolic link"):
        write_synthetic(tmp_path / "file", num_train=10, num_val=5, num_test=5)


def test_data_synthetic_command(tmp_path, capsys):
    from xmodal.cli import main

    assert main(["data", "synthetic", "--out", str(tmp_path / "s"), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "train: 2000 videos, 6000 texts" in out and "data.root=" in out
    assert main(["data", "check", str(tmp_path / "s")]) == 0


def test_data_synthetic_output_of_the_wrong_kind_is_one_line(tmp_path, capsys):
    from xmodal.cli import main

    (tmp_path / "file").write_bytes(b"mine")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    for out in ("file", "link"):
        assert main(["data", "synthetic", "--out", str(tmp_path / out)]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("xmodal data: error: out:") and out in err[0]
    assert (tmp_path / "file").read_bytes() == b"mine"
