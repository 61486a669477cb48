"""DN (Zhou et al. 2023): independent per-(seed, side) samples and the eq. 6 / eq. 8 forms,
against literal float64 transcriptions of the paper's equations."""

import math

import numpy as np
import pytest

from xmodal.normalize import DistributionNormalization


def test_dn_seeds_draw_independent_samples_per_seed_and_side():
    # one-hot rows: a sample mean reveals which rows were drawn; queries == gallery rows, so a
    # reused generator (seed k+1's queries == seed k's gallery) would show as equal sets
    rows = np.eye(400)
    runs = DistributionNormalization.fit_per_seed(rows, rows, num_samples=100, seeds=5, seed=0)
    drawn = []
    for k, r in enumerate(runs):
        for side, mu in ((0, r.mu_queries.numpy()), (1, r.mu_gallery.numpy())):
            got = np.flatnonzero(mu)
            # reference: a fresh generator per (seed, side), drawn here by hand
            ref = np.sort(np.random.default_rng([k, side]).choice(400, size=100, replace=False))
            np.testing.assert_array_equal(got, ref)
            drawn.append(frozenset(got.tolist()))
    assert len(set(drawn)) == 10  # no (seed, side) sample reuses another's rows
    for k in range(4):  # the old bug: seed k's gallery rows == seed k+1's query rows
        assert drawn[2 * k + 1] != drawn[2 * (k + 1)]


def _data(seed=0, q=6, n=7, k=9, m=8, d=5):
    rng = np.random.default_rng(seed)
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    return (unit(rng.normal(size=(q, d))), unit(rng.normal(size=(n, d))),
            unit(rng.normal(size=(k, d))), unit(rng.normal(size=(m, d))))


def _dot(a, b):
    return sum(float(x) * float(y) for x, y in zip(a, b))


def test_dn_exponential_form_is_minus_eq6():
    queries, gallery, val_q, val_g = _data()
    tau = 0.1
    dn = DistributionNormalization(form="exponential", tau=tau, num_samples=None).fit(val_q, val_g)
    mu_x = [sum(r[i] for r in val_q) / len(val_q) for i in range(val_q.shape[1])]
    mu_y = [sum(r[i] for r in val_g) / len(val_g) for i in range(val_g.shape[1])]
    # eq. 6: e^{phi(x0)^T (mu_y - psi(y0)) / tau} + e^{(mu_x - phi(x0))^T psi(y0) / tau}
    ref = np.array([[-(math.exp(_dot(x0, [a - b for a, b in zip(mu_y, y0)]) / tau)
                       + math.exp(_dot([a - b for a, b in zip(mu_x, x0)], y0) / tau))
                     for y0 in gallery] for x0 in queries])
    np.testing.assert_allclose(dn.score(queries, gallery), ref, rtol=1e-12, atol=0)


def test_dn_full_form_is_minus_eq8_over_the_sampled_rows():
    queries, gallery, val_q, val_g = _data(1)
    tau = 0.2
    dn = DistributionNormalization(form="full", tau=tau, num_samples=5, seed=3).fit(val_q, val_g)
    xs = val_q[np.sort(np.random.default_rng([3, 0]).choice(len(val_q), 5, replace=False))]
    ys = val_g[np.sort(np.random.default_rng([3, 1]).choice(len(val_g), 5, replace=False))]
    # eq. 8: E_{y1} e^{phi(x0)^T [0.5 psi(y1) - psi(y0)] / tau} + E_{x1} e^{[0.5 phi(x1) - phi(x0)]^T psi(y0) / tau}
    ref = np.array([[-(sum(math.exp(_dot(x0, [0.5 * a - b for a, b in zip(y1, y0)]) / tau) for y1 in ys) / len(ys)
                       + sum(math.exp(_dot([0.5 * a - b for a, b in zip(x1, x0)], y0) / tau) for x1 in xs) / len(xs))
                     for y0 in gallery] for x0 in queries])
    np.testing.assert_allclose(dn.score(queries, gallery), ref, rtol=1e-12, atol=0)
    back = DistributionNormalization.from_state_dict(dn.state_dict())
    np.testing.assert_allclose(back.score(queries, gallery), ref, rtol=1e-12, atol=0)


def test_dn_nonlinear_forms_refuse_the_bias_paths():
    queries, gallery, val_q, val_g = _data(2)
    dn = DistributionNormalization(form="exponential").fit(val_q, val_g)
    with pytest.raises(ValueError, match="score"):
        dn(queries @ gallery.T)
    with pytest.raises(ValueError, match="transform"):
        dn.transform(queries, gallery)
    with pytest.raises(ValueError, match="form"):
        DistributionNormalization(form="quadratic")
    with pytest.raises(ValueError, match="seeds"):
        DistributionNormalization(form="full", seeds=5)
    with pytest.raises(ValueError, match="tau"):
        DistributionNormalization(form="exponential", tau=0)
