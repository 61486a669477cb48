"""``query --device`` / ``serve --device`` (issue 42.5): the hf: encoder of the queries runs where the flag
says (the device reaches the encoder; the features equal ``encode text --device`` of the same captions),
a device that places no encoder, a bad name or features already encoded are one line; on CUDA the
answers equal the CPU's (skipped without a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_serve_images import gallery  # noqa: E402,F401 - the fixture: an index of a tiny hf: CLIP

from xmodal.cli import main  # noqa: E402
from xmodal.features import encoders  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTIONS = ["picture 17 of things", "a dog"]


@pytest.fixture
def spy(monkeypatch):
    """Every device ``encode_text`` is asked for."""
    seen = []
    real = encoders.encode_text

    def encode_text(captions, **kw):
        seen.append(kw.get("device"))
        return real(captions, **kw)

    monkeypatch.setattr(encoders, "encode_text", encode_text)
    return seen


def by_hand(root: Path, clip: Path, tmp: Path, device: str) -> list[list[int]]:
    """``encode text --device`` on the captions, the run's text head, brute force over the gallery."""
    import xmodal

    (tmp / "caps.txt").write_text("\n".join(CAPTIONS) + "\n")
    assert main(["encode", "text", "--captions", str(tmp / "caps.txt"), "--out", str(tmp / "t.npy"),
                 "--model", f"hf:{clip}", "--device", device, "--no-progress"]) == 0
    model = xmodal.load_model(root / "run")
    q = model.encode_text(np.load(tmp / "t.npy")).double().numpy()
    g = model.encode_video(np.load(root / "data" / "test_video_features.npy")).double().numpy()
    return [sorted(range(len(g)), key=lambda j: (-float(q[i] @ g[j]), j))[:3] for i in range(len(q))]


def test_query_device_reaches_the_encoder_and_equals_encode_text(gallery, tmp_path, spy, capsys):  # noqa: F811
    root, clip, _ = gallery
    capsys.readouterr()
    assert main(["query", "--index", str(root / "index"), "--captions", *CAPTIONS, "--k", "3", "--device", "cpu",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert spy == ["cpu"]
    assert got["indices"] == by_hand(root, clip, tmp_path, "cpu")


def test_device_refusals_are_one_line(gallery, tmp_path, capsys):  # noqa: F811
    root, _, _ = gallery
    np.save(tmp_path / "f.npy", np.zeros((1, 24), np.float32))
    base = ["query", "--index", str(root / "index")]
    for extra, needle in ((["--captions", "x", "--device", "tpu"], "--device: expected auto, cpu, cuda or cuda:N"),
                          (["--text-features", str(tmp_path / "f.npy"), "--device", "cpu"],
                           "--device: only with --captions")):
        capsys.readouterr()
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err
    from xmodal.commands._device import check_placed

    with pytest.raises(ValueError, match="^--device: places hf:DIR and open_clip:DIR encoders only; this index's "
                                         "query encoder is minilm"):
        check_placed("cpu", ["minilm"])
    check_placed("cpu", ["minilm", "hf:x"])  # one placed encoder: taken
    check_placed(None, ["minilm"])  # auto: nothing to refuse


def test_serve_device_reaches_the_text_encoder(gallery, spy):  # noqa: F811
    from starlette.testclient import TestClient

    from xmodal.serve import create_app

    root, _, imgs = gallery
    client = TestClient(create_app(root / "index", images=imgs, device="cpu"))
    res = client.get("/api/search", params={"q": CAPTIONS[0], "k": 3})
    assert res.status_code == 200 and spy and set(spy) == {"cpu"}


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_cuda_queries_equal_the_cpus(gallery, tmp_path, capsys):  # noqa: F811
    root, _, _ = gallery
    out = {}
    for device in ("cpu", "cuda"):
        capsys.readouterr()
        assert main(["query", "--index", str(root / "index"), "--captions", *CAPTIONS, "--k", "5", "--device", device,
                     "--json"]) == 0
        out[device] = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(out["cuda"]["scores"], out["cpu"]["scores"], atol=1e-4)
