"""``index.quantiser_training`` (FAISS 1.15's BLAS threshold set back while quantisers train): the threshold
is FAISS's own again afterwards, also after an error, and a product quantiser trained under it encodes as
well as one trained with FAISS's default (the two paths round distances differently, so the codebooks
are not bit-equal; their reconstruction errors are within a few percent)."""

from __future__ import annotations

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from xmodal.retrieval.index import BLAS_THRESHOLD, quantiser_training  # noqa: E402


def test_the_threshold_is_set_while_training_and_restored_after():
    before = faiss.cvar.distance_compute_blas_threshold
    with quantiser_training():
        assert faiss.cvar.distance_compute_blas_threshold == min(before, BLAS_THRESHOLD)
    assert faiss.cvar.distance_compute_blas_threshold == before
    with pytest.raises(RuntimeError), quantiser_training():
        raise RuntimeError("a failed training")
    assert faiss.cvar.distance_compute_blas_threshold == before


def test_a_quantiser_trained_under_it_encodes_as_well_as_faiss_default():
    faiss.omp_set_num_threads(1)
    x = np.random.default_rng(0).standard_normal((10000, 16)).astype(np.float32)

    def error(pq) -> float:
        rec = pq.decode(pq.compute_codes(x))
        return float(((rec - x) ** 2).sum(1).mean())

    ours, theirs = faiss.ProductQuantizer(16, 4, 8), faiss.ProductQuantizer(16, 4, 8)
    with quantiser_training():
        ours.train(x)
    theirs.train(x)
    e_ours, e_theirs = error(ours), error(theirs)
    assert e_ours < 0.5 * float((x ** 2).sum(1).mean())  # it did learn: well under the vectors' own energy
    assert abs(e_ours - e_theirs) <= 0.03 * e_theirs, (e_ours, e_theirs)
