"""Linear probe, zero-shot, label retrieval, CLIPScore / DN caption scores and Kendall tau,
against independent references (scikit-learn pipelines, naive loops, scipy)."""
import doctest

import numpy as np
import pytest
import torch

import xmodal.metrics as M
from xmodal.metrics import caption as caption_mod
from xmodal.metrics import probe as probe_mod
from xmodal.normalize import DistributionNormalization


def _blobs(seed, n_per=30, c=4, d=6, spread=1.5):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(c), n_per)
    centers = rng.normal(size=(c, d)) * spread
    return rng.normal(size=(len(y), d)) + centers[y], y


def _rank(scores, col):
    return int((scores >= scores[col]).sum())


@pytest.mark.parametrize("seed,classifier", [(0, "logreg"), (1, "svm"), (2, "logreg")])
def test_linear_probe_matches_sklearn_pipeline(seed, classifier):
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    x, y = _blobs(seed)
    xt, yt = x + np.random.default_rng(seed + 7).normal(scale=0.8, size=x.shape), y
    grid = (0.01, 1.0, 100.0)
    got = M.linear_probe(x, y, xt, yt, classifier=classifier, seed=seed, c_grid=grid)

    def make(c):
        return LinearSVC(C=c, random_state=seed, max_iter=5000) if classifier == "svm" else \
            LogisticRegression(C=c, max_iter=2000, random_state=seed)

    a, b, ya, yb = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    accs = []
    for c in grid:
        sc = StandardScaler().fit(a)
        accs.append(np.mean(make(c).fit(sc.transform(a), ya).predict(sc.transform(b)) == yb))
    best = grid[int(np.argmax(accs))]
    sc = StandardScaler().fit(x)
    clf = make(best).fit(sc.transform(x), y)
    s = clf.decision_function(sc.transform(xt))
    ranks = np.array([_rank(s[i], yt[i]) for i in range(len(yt))])
    assert got["C"] == best
    assert got["top1"] == pytest.approx(100 * np.mean(ranks <= 1))
    assert got["top5"] == pytest.approx(100 * np.mean(ranks <= 5))
    assert got["top1"] == pytest.approx(100 * np.mean(clf.predict(sc.transform(xt)) == yt))


def test_linear_probe_unseen_test_class_and_errors():
    x, y = _blobs(0, c=3)
    r = M.linear_probe(x, y, x[:4], np.array([0, 0, 9, 9]), ks=(1, 3))
    assert r["top3"] == 50.0                   # class 9 never seen in training: a miss
    with pytest.raises(ValueError, match="classifier"):
        M.linear_probe(x, y, x, y, classifier="knn")
    with pytest.raises(TypeError, match="train_labels"):
        M.linear_probe(x, y.astype(float), x, y)
    with pytest.raises(ValueError, match="test_features"):
        M.linear_probe(x, y, x[:, :2], y)
    for seed, err in ((np.arange(3), TypeError), (-1, ValueError), (2 ** 40, ValueError), (1.5, ValueError)):
        with pytest.raises(err, match=r"^seed: ") as info:  # was sklearn's two-line random_state error
            M.linear_probe(x, y, x, y, seed=seed)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_zero_shot_matches_naive_and_dn(seed):
    rng = np.random.default_rng(seed)
    n, c, d = 40, 7, 5
    feats = rng.normal(size=(n, d)) + 0.5
    cls = rng.normal(size=(c, d)) + 0.5
    labels = rng.integers(0, c, n)

    def naive(f, e):
        hits = {1: 0, 5: 0}
        for i in range(n):
            cos = [float(f[i] @ e[j] / np.linalg.norm(f[i]) / np.linalg.norm(e[j])) for j in range(c)]
            r = sum(1 for j in range(c) if cos[j] >= cos[labels[i]])
            for k in hits:
                hits[k] += r <= k
        return {f"top{k}": 100 * v / n for k, v in hits.items()}

    got = M.zero_shot(torch.tensor(feats, dtype=torch.float32), cls, labels)
    want = naive(feats, cls)
    assert got == pytest.approx(want)
    dn = DistributionNormalization(lam=0.25, num_samples=None).fit(feats, cls)
    got = M.zero_shot(feats, cls, labels, normalizer=dn)
    assert got == pytest.approx(naive(feats - 0.25 * feats.mean(0), cls - 0.25 * cls.mean(0)))
    with pytest.raises(ValueError, match="labels"):
        M.zero_shot(feats, cls, labels + c)


@pytest.mark.parametrize("seed", [0, 1])
def test_label_retrieval_matches_naive(seed):
    rng = np.random.default_rng(seed)
    n = 25
    e = np.round(rng.normal(size=(n, 3)), 1)
    labels = rng.integers(0, 6, n)
    labels[0] = 99                               # a singleton class: left out
    got = M.label_retrieval(e, labels, ks=(1, 5))
    en = e / np.linalg.norm(e, axis=1, keepdims=True)
    ranks = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        pos = [j for j in others if labels[j] == labels[i]]
        if not pos:
            continue
        s = {j: float(en[i] @ en[j]) for j in others}
        best = max(s[j] for j in pos)
        ranks.append(sum(1 for j in others if s[j] >= best and labels[j] != labels[i]) + 1)
    ranks = np.array(ranks)
    assert got["num_queries"] == len(ranks)
    assert got["R@1"] == pytest.approx(100 * np.mean(ranks <= 1))
    assert got["R@5"] == pytest.approx(100 * np.mean(ranks <= 5))
    assert got["MnR"] == pytest.approx(ranks.mean())
    assert got["MdR"] == pytest.approx(np.median(ranks))
    # test queries against a training gallery (Cali-NCE protocol): plain retrieval on cosines
    g = rng.normal(size=(10, 3))
    gl = rng.integers(0, 6, 10)
    got = M.label_retrieval(e, labels, ks=(1,), gallery=g, gallery_labels=gl)
    keep = np.isin(labels, gl)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    want = M.retrieval(en[keep] @ gn.T, labels[keep][:, None] == gl[None, :], ks=(1,))
    assert got["R@1"] == pytest.approx(want["R@1"]) and got["num_queries"] == int(keep.sum())


def _naive_clip(img, cap, refs=None, w=2.5):
    out = []
    for i in range(len(img)):
        cos = img[i] @ cap[i] / np.linalg.norm(img[i]) / np.linalg.norm(cap[i])
        c = w * max(cos, 0.0)
        if refs is not None:
            r = max(max(cap[i] @ x / np.linalg.norm(cap[i]) / np.linalg.norm(x) for x in refs[i]), 0.0)
            c = 2 * c * r / (c + r) if c + r > 0 else 0.0
        out.append(c)
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_caption_score_clipscore_and_refclipscore(seed):
    rng = np.random.default_rng(seed)
    n, d = 12, 8
    img, cap = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    refs = rng.normal(size=(n, 3, d))
    np.testing.assert_allclose(M.caption_score(img, cap), _naive_clip(img, cap), rtol=1e-10)
    np.testing.assert_allclose(M.caption_score(img, cap, references=refs), _naive_clip(img, cap, refs),
                               rtol=1e-10)
    ragged = [refs[i, : 1 + i % 3] for i in range(n)]
    np.testing.assert_allclose(M.caption_score(img, cap, references=ragged),
                               _naive_clip(img, cap, ragged), rtol=1e-10)


def test_caption_score_dn_follows_paper_sec_4_5():
    rng = np.random.default_rng(4)
    n, d = 10, 6
    img, cap = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    refs = rng.normal(size=(n, 2, d))
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    xi, yc, rr = unit(img), unit(cap), unit(refs)
    dn = DistributionNormalization(lam=0.25, num_samples=None).fit(xi, rr.reshape(-1, d))
    mu_x, mu_y = xi.mean(0), rr.reshape(-1, d).mean(0)
    s = np.array([(xi[i] - 0.25 * mu_x) @ (yc[i] - 0.25 * mu_y) for i in range(n)])   # eq. 7
    np.testing.assert_allclose(M.caption_score(img, cap, normalizer=dn), s, rtol=1e-10)
    ref = np.array([max(yc[i] @ r for r in rr[i]) for i in range(n)])
    np.testing.assert_allclose(M.caption_score(img, cap, references=refs, normalizer=dn),
                               (s + 0.25 * ref) / 2, rtol=1e-10)
    with pytest.raises(ValueError, match="references"):
        M.caption_score(img, cap, references=refs[:3])
    with pytest.raises(ValueError, match="caption_features"):
        M.caption_score(img, cap[:3])


def test_kendall_tau_variants_match_scipy():
    from scipy.stats import kendalltau

    rng = np.random.default_rng(0)
    s = rng.normal(size=50)
    h = np.clip(np.round(s + rng.normal(size=50)), -2, 2)      # ties in the human ratings
    for v in ("b", "c"):
        assert M.kendall_tau(s, h, variant=v) == pytest.approx(kendalltau(s, h, variant=v).statistic)
    assert M.kendall_tau(s, h, variant="flickr8k-cf") == M.kendall_tau(s, h, variant="b")
    assert M.kendall_tau(s, h, variant="Flickr8k-Expert") == M.kendall_tau(s, h, variant="c")
    assert M.kendall_tau(s, h, variant="b") != M.kendall_tau(s, h, variant="c")
    with pytest.raises(ValueError, match="variant"):
        M.kendall_tau(s, h, variant="a")
    with pytest.raises(ValueError, match="human"):
        M.kendall_tau(s, h[:3])


@pytest.mark.parametrize("mod", [probe_mod, caption_mod])
def test_docstring_examples(mod):
    assert doctest.testmod(mod).failed == 0
