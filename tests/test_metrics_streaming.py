"""Streaming evaluation from embeddings == dense evaluation of the score matrix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xmodal.metrics import retrieval, streaming_retrieval, streaming_text_video, text_video
from xmodal.metrics import streaming

TIES = ("pessimistic", "optimistic", "average")


def integer_embeddings(rng, n, d=6, lo=-2, hi=3):
    """Small integers: every dot product is exact in float32, so equality is exact and
    ties are plentiful."""
    return rng.integers(lo, hi, (n, d)).astype(np.float32)


@pytest.mark.parametrize("block_size", [1, 5, 10_000])
@pytest.mark.parametrize("ties", TIES)
def test_equals_dense(block_size, ties):
    rng = np.random.default_rng(0)
    q, g = integer_embeddings(rng, 31), integer_embeddings(rng, 17)
    pos = rng.integers(0, 17, 31)
    mask = rng.random((31, 17)) < 0.2
    mask[:, 4] = True
    dense = q @ g.T
    for p in (pos, mask):
        assert streaming_retrieval(q, g, p, ks=(1, 3, 10), ties=ties, block_size=block_size) == \
            retrieval(dense, p, ks=(1, 3, 10), ties=ties)


def test_bias_transform_and_types():
    rng = np.random.default_rng(1)
    q, g = integer_embeddings(rng, 20), integer_embeddings(rng, 9)
    pos = rng.integers(0, 9, 20)
    bias = rng.integers(-2, 3, 9).astype(np.float32)
    dense = q @ g.T + bias
    assert streaming_retrieval(q, g, pos, bias=bias, block_size=3) == retrieval(dense, pos)

    def double_and_shift(s):       # row-wise, exact on integers
        return 2 * s - s[:, :1]
    want = retrieval(2 * dense - dense[:, :1], pos, ties="average")
    got = streaming_retrieval(torch.from_numpy(q), torch.from_numpy(g), torch.from_numpy(pos),
                              bias=torch.from_numpy(bias), transform=double_and_shift,
                              ties="average", block_size=4)
    assert got == want
    half = streaming_retrieval(q.astype(np.float16), g.astype(np.float16), pos, bias=bias)
    assert half == retrieval(dense, pos)
    assert streaming_retrieval(q, g, pos, progress=True) == retrieval(q @ g.T, pos)


def test_block_cap(monkeypatch):
    rng = np.random.default_rng(2)
    q, g = integer_embeddings(rng, 12), integer_embeddings(rng, 8)
    pos = rng.integers(0, 8, 12)
    seen = []

    def spy(s):
        seen.append(s.shape[0])
        return s
    monkeypatch.setattr(streaming, "MAX_BLOCK_SCORES", 16)    # at most 2 rows of 8
    assert streaming_retrieval(q, g, pos, transform=spy) == retrieval(q @ g.T, pos)
    assert max(seen) == 2 and sum(seen) == 12


@pytest.mark.parametrize("v2t", ["all-captions", "max-over-captions"])
@pytest.mark.parametrize("ties", TIES)
def test_text_video_equals_dense(v2t, ties):
    rng = np.random.default_rng(3)
    nv = 7
    t2v = np.concatenate([np.arange(nv), rng.integers(0, nv, 12)])
    text, video = integer_embeddings(rng, len(t2v)), integer_embeddings(rng, nv)
    want = text_video(text @ video.T, t2v, ks=(1, 5), ties=ties, v2t=v2t)
    got = streaming_text_video(text, video, t2v, ks=(1, 5), ties=ties, v2t=v2t, block_size=2)
    assert got == want
    tb = rng.integers(-1, 2, nv).astype(np.float32)
    vb = rng.integers(-1, 2, len(t2v)).astype(np.float32)
    sim = text @ video.T
    got = streaming_text_video(text, video, t2v, ks=(1, 5), ties=ties, v2t=v2t,
                               t2v_bias=tb, v2t_bias=vb)
    assert got["t2v"] == retrieval(sim + tb, t2v, ks=(1, 5), ties=ties)
    assert got["v2t"] == text_video(sim + vb[:, None], t2v, ks=(1, 5), ties=ties, v2t=v2t)["v2t"]


def test_errors():
    q, g = np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32)
    with pytest.raises(ValueError, match="gallery"):
        streaming_retrieval(q, np.zeros((5, 3)), [0, 1, 2])
    with pytest.raises(ValueError, match="bias"):
        streaming_retrieval(q, g, [0, 1, 2], bias=np.zeros(4))
    with pytest.raises(ValueError, match="positives"):
        streaming_retrieval(q, g, [0, 1, 5])
    with pytest.raises(ValueError, match="transform"):
        streaming_retrieval(q, g, [0, 1, 2], transform=lambda s: s[:, :2])
    with pytest.raises(ValueError, match="transform"):
        streaming_retrieval(q, g, [0, 1, 2], transform=lambda s: s / 0.0)
    with pytest.raises(ValueError, match="block_size"):
        streaming_retrieval(q, g, [0, 1, 2], block_size=0)
    bad = q.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="queries"):
        streaming_retrieval(bad, g, [0, 1, 2])
    with pytest.raises(ValueError, match="text_to_video"):
        streaming_text_video(q, g, [0, 1, 2])


def test_inputs_requiring_grad():
    rng = np.random.default_rng(4)
    q = torch.from_numpy(integer_embeddings(rng, 9)).requires_grad_()
    g = torch.from_numpy(integer_embeddings(rng, 5)).requires_grad_()
    pos = rng.integers(0, 5, 9)
    want = retrieval((q @ g.T).detach(), pos)
    assert streaming_retrieval(q, g, pos) == want
    assert retrieval(q @ g.T, pos) == want
