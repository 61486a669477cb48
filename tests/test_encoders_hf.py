"""``hf:DIR`` encoders (issue 33): xmodal's features of tiny random-weight CLIP / SigLIP / X-CLIP folders
equal the library's own ``get_text_features`` / ``get_image_features`` / ``get_video_features`` on the
same inputs through the folder's own processor (float32, to 1e-6), their identity records hash the
weights as ``sha256sum`` does, and every missing or foreign folder is one line naming it."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_tiny  # noqa: E402

from xmodal.cli import main  # noqa: E402
from xmodal.features import encoders  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTIONS = ["a dog runs on the grass", "Two cats!", "", "ÜBER café 東京 \u2028 tabs\tand  spaces",
            "a caption that is much longer than the sixteen tokens the tiny text tower can take at all"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"clip": hf_tiny.save_clip(root / "clip"), "siglip": hf_tiny.save_siglip(root / "siglip"),
            "xclip": hf_tiny.save_xclip(root / "xclip")}


def library(folder: Path):
    """The library's own model and processor of a folder, loaded as its docs do."""
    from transformers import AutoModel, AutoProcessor

    return (AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval(),
            AutoProcessor.from_pretrained(str(folder)))


def pooled(out) -> np.ndarray:
    return out.pooler_output.detach().float().numpy()


@pytest.mark.parametrize("name", ["clip", "siglip", "xclip"])
def test_text_features_equal_get_text_features(folders, name):
    model, proc = library(folders[name])
    padding = "max_length" if name == "siglip" else True  # SigLIP was trained on max_length padding
    with torch.inference_mode():  # the same batches of 2 (CLIP pads a batch to its longest caption)
        want = np.concatenate([pooled(model.get_text_features(**proc(
            text=CAPTIONS[i:i + 2], padding=padding, truncation=True, max_length=16, return_tensors="pt")))
            for i in range(0, len(CAPTIONS), 2)])
    got = encoders.encode_text(CAPTIONS, model=f"hf:{folders[name]}", batch_size=2, progress=False)
    assert got.dtype == np.float32 and got.shape == (len(CAPTIONS), hf_tiny.DIMS[name])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert not np.allclose(got[0], got[1])  # the captions really differ
    whole = encoders.encode_text(CAPTIONS, model=f"hf:{folders[name]}", batch_size=64, progress=False)
    np.testing.assert_allclose(whole, got, rtol=1e-5, atol=1e-5)  # other batches: float rounding only


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_image_features_equal_get_image_features(folders, name, tmp_path):
    from PIL import Image

    paths = hf_tiny.write_images(tmp_path / "imgs", 5)
    rgba = Image.new("RGBA", (30, 20), (200, 10, 10, 60))  # real transparency: the processor composites it
    rgba.save(tmp_path / "imgs" / "z_alpha.png")
    paths.append(tmp_path / "imgs" / "z_alpha.png")
    model, proc = library(folders[name])
    with torch.inference_mode():  # the same batches of 3
        want = np.concatenate([pooled(model.get_image_features(**proc(images=[Image.open(p) for p in paths[i:i + 3]],
                                                                      return_tensors="pt")))
                               for i in range(0, len(paths), 3)])
    got = encoders.encode_images(paths, model=f"hf:{folders[name]}", batch_size=3, progress=False)
    assert got.shape == (len(paths), hf_tiny.DIMS[name])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_video_frames_through_clip_equal_the_library(folders, tmp_path):
    pytest.importorskip("av")
    from xmodal.features.video import uniform_indices

    frames = np.random.default_rng(1).integers(0, 256, size=(7, 32, 48, 3), dtype=np.uint8)
    path = hf_tiny.write_video(tmp_path / "v.avi", frames)
    got = encoders.encode_videos([path], frames=3, model=f"hf:{folders['clip']}", batch_size=3)[0]
    decoded = hf_tiny.decoded_frames(path)
    picked = [decoded[i] for i in uniform_indices(len(decoded), 3)]
    model, proc = library(folders["clip"])
    with torch.inference_mode():
        want = pooled(model.get_image_features(**proc(images=picked, return_tensors="pt")))
    assert got.shape == (3, hf_tiny.DIMS["clip"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("length", [9, 3])
def test_xclip_takes_each_video_as_one_clip(folders, tmp_path, length):
    """A video's frames go through X-CLIP's video branch as one clip of num_frames frames (a shorter
    video's frames repeated, index i * n // num_frames): one [1, D] row equal to get_video_features."""
    pytest.importorskip("av")
    from xmodal.features.video import uniform_indices

    frames = np.random.default_rng(length).integers(0, 256, size=(length, 32, 32, 3), dtype=np.uint8)
    path = hf_tiny.write_video(tmp_path / "v.avi", frames)
    spec = f"hf:{folders['xclip']}"
    got = encoders.encode_videos([path], model=spec)[0]
    decoded = hf_tiny.decoded_frames(path)
    n = hf_tiny.XCLIP_FRAMES
    picked = [decoded[i] for i in uniform_indices(len(decoded), n)]
    picked = [picked[i * len(picked) // n] for i in range(n)]
    model, proc = library(folders["xclip"])
    with torch.inference_mode():
        want = pooled(model.get_video_features(**proc(videos=[picked], return_tensors="pt")))
    assert got.shape == (1, hf_tiny.DIMS["xclip"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"^frames: .* exactly 4 frames"):
        encoders.encode_videos([path], frames=3, model=spec)
    with pytest.raises(ValueError, match="XCLIPModel: it encodes whole video clips"):
        encoders.encode_images([path], model=spec, progress=False)


def test_identity_hashes_the_weights_and_states_the_size(folders):
    for name, folder in folders.items():
        rec = encoders.identity_of(f"hf:{folder}", "text")
        assert rec["weights_sha256"] == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        assert rec["spec"] == f"hf:{folder.resolve()}" and rec["dim"] == hf_tiny.DIMS[name]
        assert rec["normalized"] is False and rec["family"] == name and rec["level"] == "sentence"
        assert rec["preprocessing_sha256"] and rec["hub_name"] is None
    text, image = (encoders.identity_of(f"hf:{folders['clip']}", k) for k in ("text", "image"))
    assert image["kind"] == "image" and image["level"] == "image" and image["weights_sha256"] == text["weights_sha256"]
    assert encoders.identity_of(f"hf:{folders['xclip']}", "video")["level"] == "clip"


def test_hub_name_comes_from_the_folders_config(folders, tmp_path):
    import shutil

    copy = shutil.copytree(folders["clip"], tmp_path / "clip-vit-base-patch32")
    cfg = json.loads((copy / "config.json").read_text())
    cfg["_name_or_path"] = "openai/clip-vit-base-patch32"  # what older transformers wrote for a hub model
    (copy / "config.json").write_text(json.dumps(cfg))
    assert encoders.identity_of(f"hf:{copy}", "text")["hub_name"] == "openai/clip-vit-base-patch32"


def test_missing_or_foreign_folders_are_one_line(folders, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "bert" / "model.safetensors").write_bytes(b"x")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text('{"model_type": "clip"}')
    cases = [("hf:" + str(tmp_path / "nope"), "no such folder"), ("hf:" + str(tmp_path / "empty"), "config.json not found"),
             ("hf:" + str(tmp_path / "bert"), "model_type 'bert' is not supported"),
             ("hf:" + str(tmp_path / "noweights"), "no weights"), ("hf:", "needs a folder"),
             ("open_clip:ViT-B-32", "an architecture name such as open_clip:ViT-B-32 alone names no weights"), ("nope", "unknown encoder")]
    for spec, needle in cases:
        with pytest.raises(ValueError, match="^model: ") as err:
            encoders.get_encoder(spec, "text")
        assert needle in str(err.value) and "\n" not in str(err.value), spec
    import shutil

    bare = shutil.copytree(folders["clip"], tmp_path / "bare")
    for f in ("processor_config.json", "tokenizer.json", "tokenizer_config.json"):
        (bare / f).unlink()
    with pytest.raises(ValueError, match=r"^model: hf:.*bare: no tokenizer in the folder") as err:
        encoders.encode_text(["a"], model=f"hf:{bare}", progress=False)
    assert "\n" not in str(err.value)


def test_cli_writes_features_and_their_identity(folders, tmp_path, capsys):
    caps = tmp_path / "caps.txt"
    caps.write_text("\n".join(CAPTIONS[:3]) + "\n")
    out = tmp_path / "t.npy"
    assert main(["encode", "text", "--captions", str(caps), "--out", str(out), "--model", f"hf:{folders['siglip']}",
                 "--quiet"]) == 0
    side = json.loads((tmp_path / "t.npy.encoder.json").read_text())
    import os

    rel = os.path.relpath(folders["siglip"].resolve(), tmp_path.resolve())  # relative to the sidecar's folder
    assert side["format"] == "xmodal-encoder" and side["spec"] == f"hf:{rel}" and side["spec_relative_to"] == "file"
    from xmodal.features.identity import read_sidecar

    assert read_sidecar(out)["spec"] == f"hf:{folders['siglip'].resolve()}"
    assert side["dim"] == np.load(out).shape[1] == hf_tiny.DIMS["siglip"] and side["dtype"] == "float32"
    capsys.readouterr()
    for argv, needle in [(["text", "--captions", str(caps), "--out", str(out), "--model", f"hf:{tmp_path / 'x'}"],
                          "--model: hf:"), (["images", "--dir", str(tmp_path), "--out", str(out), "--model",
                                             f"hf:{folders['xclip']}"], "--model: hf:"),
                         (["text", "--captions", str(caps), "--out", str(out), "--model", "open_clip:ViT-B-32",
                           "--weights", str(tmp_path / "missing.pt")], "--weights: "),
                         (["text", "--captions", str(caps), "--out", str(out), "--weights", str(caps)], "--weights: ")]:
        assert main(["encode", *argv, "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"xmodal encode: error: {needle}"), err
