"""The trainer's DSL test-time option is dual softmax over the test queries (not a bank fit)."""
import numpy as np
import torch

from xmodal.normalize import DualSoftmax
from xmodal.training.loop import normalized_similarities


def test_dsl_uses_the_test_queries_not_the_train_bank():
    g = torch.Generator().manual_seed(0)
    text = torch.nn.functional.normalize(torch.randn(30, 8, generator=g), dim=1)
    video = torch.nn.functional.normalize(torch.randn(12, 8, generator=g), dim=1)
    bank = torch.nn.functional.normalize(torch.randn(50, 8, generator=g), dim=1) * 3  # far from the test queries
    tt = {"text_bank": bank, "video_bank": bank, "kwargs": {"dsl": {"temperature": 0.05}}}
    t2v, v2t, _ = normalized_similarities("dsl", tt, text, video)
    sim = (text @ video.T).numpy()
    np.testing.assert_allclose(t2v.numpy(), DualSoftmax(0.05)(sim), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(v2t.numpy(), DualSoftmax(0.05)(sim.T.copy()), rtol=1e-6, atol=1e-9)
    assert torch.isfinite(t2v).all() and torch.isfinite(v2t).all()
