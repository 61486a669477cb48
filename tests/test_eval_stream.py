"""``eval --run`` streams at any gallery size (issue 34.2): every normaliser evaluated block by block gives
the dense protocol's numbers (``retrieval_metrics`` of ``TestTime.similarities``); a gallery with
uncaptioned videos is evaluated text -> video only, with one line saying v2t was skipped; the command
never builds a [texts, videos] score matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from xmodal.cli import main
from xmodal.metrics import retrieval
from xmodal.retrieval.evaluate import retrieval_metrics
from xmodal.retrieval.streaming import captioned_everywhere, embed_rows, run_metrics
from xmodal.retrieval.testtime import TestTime, fit_test_time

pytestmark = pytest.mark.usefixtures("one_thread")


def unit(x):
    return torch.nn.functional.normalize(torch.as_tensor(x, dtype=torch.float32), dim=-1)


@pytest.fixture(scope="module")
def test_time():
    g = torch.Generator().manual_seed(0)
    t, v = unit(torch.randn(80, 8, generator=g)), unit(torch.randn(80, 8, generator=g))
    ncl = (unit(torch.randn(60, 8, generator=g)), unit(torch.randn(60, 8, generator=g)))
    return fit_test_time(["none", "dn", "sinkhorn", "ncl", "qbnorm", "is", "dsl", "sinkhorn_oracle"], text_bank=t, video_bank=v,
                         ncl_bank=ncl, temperature=0.05, k=1, beta=20.0)


def data(num_videos, captioned, seed=1):
    rng = np.random.default_rng(seed)
    video = unit(rng.standard_normal((num_videos, 8)))
    owners = np.arange(num_videos) if captioned else rng.choice(num_videos, 30, replace=False)
    t2v = np.concatenate([owners, rng.choice(owners, 40)])  # several captions for some videos
    text = unit(video[t2v].numpy() + 0.7 * rng.standard_normal((len(t2v), 8)))
    return text, video, t2v


@pytest.mark.parametrize("name", ["none", "dn", "sinkhorn", "ncl", "qbnorm", "is", "dsl", "sinkhorn_oracle"])
@pytest.mark.parametrize("v2t", ["all-captions", "max-over-captions"])
def test_streamed_equals_the_dense_protocol(test_time, name, v2t):
    text, video, t2v = data(50, captioned=True)
    want = retrieval_metrics(*test_time.similarities(text, video, name), t2v, v2t=v2t)
    got = run_metrics(test_time, name, text, video.clone(), t2v, v2t=v2t, block_size=7)
    for d in ("t2v", "v2t"):
        assert got[d] == pytest.approx(want[d], abs=1e-9), (name, d)


@pytest.mark.parametrize("name", ["none", "dn", "sinkhorn", "qbnorm"])
def test_uncaptioned_videos_give_text_to_video_only(test_time, name):
    text, video, t2v = data(400, captioned=False)
    assert not captioned_everywhere(t2v, 400)
    got = run_metrics(test_time, name, text, video.clone(), t2v, block_size=5)
    assert set(got) == {"t2v"}
    sim_t2v, _ = test_time.similarities(text, video, name)
    assert got["t2v"] == pytest.approx(retrieval(sim_t2v, torch.as_tensor(t2v)), abs=1e-9)


def test_embed_rows_fills_one_tensor_with_the_models_numbers():
    lin = torch.nn.Linear(6, 4)
    x = np.random.default_rng(0).standard_normal((23, 6)).astype(np.float16)
    with torch.no_grad():  # the same row blocks: the same numbers
        want = torch.cat([lin(torch.as_tensor(x[a:a + 5], dtype=torch.float32)) for a in range(0, 23, 5)])
    got = embed_rows(lambda f, m: lin(torch.as_tensor(f, dtype=torch.float32)), x, block_rows=5)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    with pytest.raises(TypeError, match="encode"):
        embed_rows(None, x)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("stream")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 120, "num_val": 60, "num_test": 60,
                                                     "num_concepts": 10}},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none", "dn", "sinkhorn"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 1, "batch_size": 32},
    })
    train(cfg, root / "run", resume=False, progress=False, verbose=False)
    rng = np.random.default_rng(3)
    paths = {"video": root / "v.npy", "text": root / "t.npy", "t2v": root / "m.npy"}
    np.save(paths["video"], rng.standard_normal((700, 64)).astype(np.float16))  # videos, most uncaptioned
    np.save(paths["text"], rng.standard_normal((40, 48)).astype(np.float32))
    np.save(paths["t2v"], rng.choice(700, 40, replace=False))
    return root / "run", {k: str(v) for k, v in paths.items()}


@pytest.mark.parametrize("name", ["none", "sinkhorn"])
def test_eval_run_on_a_gallery_of_uncaptioned_videos(run_dir, capsys, monkeypatch, name):
    """It refused ("v2t is undefined") after building two dense matrices; now: t2v, one line, no matrix."""
    import xmodal

    run, p = run_dir

    def dense(*args, **kwargs):
        raise AssertionError("eval --run built a dense score matrix")

    monkeypatch.setattr(TestTime, "similarities", dense)
    assert main(["eval", "--run", str(run), "--video-features", p["video"], "--text-features", p["text"],
                 "--text-to-video", p["t2v"], "--normalizer", name, "--json"]) == 0
    cap = capsys.readouterr()
    assert cap.err.strip().splitlines() == ["note: v2t skipped: 660 of 700 videos have no caption; "
                                            "text -> video only"]
    out = json.loads(cap.out)
    assert set(out) >= {"t2v"} and "v2t" not in out and out["info"]["v2t"].startswith("skipped")
    monkeypatch.undo()
    model = xmodal.load_model(run)
    text = model.encode_text(np.load(p["text"]))
    video = model.encode_video(np.load(p["video"]))
    sim_t2v, _ = model.test_time.similarities(text, video, name)
    assert out["t2v"] == pytest.approx(retrieval(sim_t2v, torch.as_tensor(np.load(p["t2v"]))), abs=1e-6)
