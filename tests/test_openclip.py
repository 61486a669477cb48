"""``open_clip:DIR`` (issue 42 item 4): an open_clip checkpoint folder run as transformers' CLIPModel
without torchvision gives open_clip's own features. The reference is open_clip itself
(``open_clip.create_model`` on a tiny custom config, seeded random weights, ``encode_text`` /
``encode_image``), computed in a subprocess by tests/open_clip_reference.py; its preprocessing reference
(open_clip's ``image_transform``) needs a torchvision that imports: set ``XMODAL_TEST_TORCHVISION_PATH``
to a folder holding one (``pip install --no-deps --target DIR torchvision==0.28.0``), else that test skips.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
if importlib.util.find_spec("open_clip") is None:
    pytest.skip("open_clip is not installed (pip install --no-deps open_clip_torch): no reference to compare with",
                allow_module_level=True)

from xmodal.cli import main
from xmodal.features import encoders, openclip

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).resolve().parent


def reference(folder: Path, *extra: str) -> Path:
    """open_clip's tiny model saved in ``folder`` and its own outputs (``folder/reference.npz``)."""
    proc = subprocess.run([sys.executable, str(HERE / "open_clip_reference.py"), str(folder),
                           os.environ.get("XMODAL_TEST_TORCHVISION_PATH", ""), *extra],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        pytest.skip(f"open_clip does not import here, even behind the op-schema guard: "
                    f"{proc.stderr.strip().splitlines()[-1][:200] if proc.stderr.strip() else proc.returncode}")
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return reference(tmp_path_factory.mktemp("oc") / "tiny")


def ref(folder: Path) -> dict:
    with np.load(folder / "reference.npz") as z:
        return {k: z[k] for k in z.files}


def test_text_tokens_and_features_equal_open_clips(tiny):
    want = ref(tiny)
    captions = [str(c) for c in want["captions"]]
    model = openclip.load(f"open_clip:{tiny}")
    assert np.array_equal(model.tokens(captions).numpy(), want["tokens"])  # truncated caption: <eot> last
    got = encoders.encode_text(captions, model=f"open_clip:{tiny}", batch_size=3, progress=False)
    assert got.shape == want["text"].shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want["text"], rtol=0, atol=1e-5)


def test_image_features_equal_open_clips_on_the_same_pixels(tiny):
    want = ref(tiny)
    model = openclip.load(f"open_clip:{tiny}")
    got = model.images(torch.from_numpy(want["pixels"])).numpy()
    np.testing.assert_allclose(got, want["image"], rtol=0, atol=1e-5)


def test_quick_gelu_checkpoint_equals_open_clips(tmp_path):
    folder = reference(tmp_path / "quick", "quick")
    want = ref(folder)
    assert json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]["quick_gelu"] is True
    model = openclip.load(f"open_clip:{folder}")
    np.testing.assert_allclose(model.images(torch.from_numpy(want["pixels"])).numpy(), want["image"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(model.text([str(c) for c in want["captions"]]).numpy(), want["text"], rtol=0, atol=1e-5)


def test_preprocessing_equals_open_clips_transform(tiny):
    want = ref(tiny)
    if "preprocessed" not in want:
        pytest.skip("no torchvision imports here (XMODAL_TEST_TORCHVISION_PATH unset): open_clip's own "
                    "image_transform cannot run")
    from PIL import Image

    cfg = openclip.read_config(tiny, "t")
    got = np.stack([openclip.preprocess(Image.open(tiny / f"img{i}.png"), cfg) for i in range(len(want["preprocessed"]))])
    np.testing.assert_allclose(got, want["preprocessed"], rtol=0, atol=1e-6)


def test_preprocessing_by_hand_shortest_side_and_centre_crop(tiny):
    """Independent of torchvision: a 2x-wide image whose shorter side is already the size keeps its
    pixels; the centre crop takes columns round((W - S) / 2) onwards; then mean / std of the config."""
    from PIL import Image

    cfg = openclip.read_config(tiny, "t")
    s = 48
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 256, (s, 2 * s + 3, 3), dtype=np.uint8)
    got = openclip.preprocess(Image.fromarray(arr), cfg)
    left = int(round((2 * s + 3 - s) / 2.0))
    crop = arr[:, left:left + s].astype(np.float32) / 255.0
    mean, std = np.array([0.5, 0.4, 0.3], np.float32), np.array([0.2, 0.25, 0.3], np.float32)
    np.testing.assert_allclose(got, ((crop - mean) / std).transpose(2, 0, 1), rtol=0, atol=1e-6)


def test_encode_commands_write_features_and_identity(tiny, tmp_path, capsys):
    want = ref(tiny)
    caps = tmp_path / "caps.txt"
    caps.write_text("\n".join(str(c) for c in want["captions"]) + "\n")
    out = tmp_path / "t.npy"
    assert main(["encode", "text", "--captions", str(caps), "--out", str(out), "--model", f"open_clip:{tiny}",
                 "--device", "cpu", "--no-progress"]) == 0
    np.testing.assert_allclose(np.load(out), want["text"], rtol=0, atol=1e-5)
    from xmodal.features.identity import read_sidecar

    assert str(tiny.parent) not in out.with_name("t.npy.encoder.json").read_text()  # relative to the sidecar
    record = read_sidecar(out)
    assert record["spec"] == f"open_clip:{tiny.resolve()}" and record["family"] == "open_clip"
    assert record["weights_sha256"] == hashlib.sha256((tiny / "open_clip_model.safetensors").read_bytes()).hexdigest()
    assert record["dim"] == 24 and record["kind"] == "text"
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    from PIL import Image

    Image.fromarray(np.random.default_rng(2).integers(0, 256, (50, 70, 3), dtype=np.uint8)).save(imgs / "a.png")
    assert main(["encode", "images", "--dir", str(imgs), "--out", str(tmp_path / "i.npy"), "--model",
                 f"open_clip:{tiny}", "--no-progress"]) == 0
    cfg = openclip.read_config(tiny, "t")
    pixels = torch.from_numpy(openclip.preprocess(Image.open(imgs / "a.png"), cfg))[None]
    np.testing.assert_allclose(np.load(tmp_path / "i.npy"), openclip.load(f"open_clip:{tiny}").images(pixels).numpy(),
                               rtol=0, atol=1e-6)


def test_bfloat16_states_its_difference_to_float32(tiny, tmp_path):
    want = ref(tiny)
    caps = tmp_path / "caps.txt"
    caps.write_text("\n".join(str(c) for c in want["captions"]) + "\n")
    out = tmp_path / "b.npy"
    assert main(["encode", "text", "--captions", str(caps), "--out", str(out), "--model", f"open_clip:{tiny}",
                 "--device", "cpu", "--precision", "bfloat16", "--batch-size", "4", "--no-progress"]) == 0
    side = json.loads(out.with_name("b.npy.encoder.json").read_text())
    run = side.get("encoder", side)["runtime"]
    diff = np.abs(np.load(out) - want["text"]).max()  # all 4 captions are the first batch
    assert run["precision"] == "bfloat16" and run["device"] == "cpu"
    assert 0 < diff and abs(run["max_abs_diff_vs_float32"] - diff) <= 1e-5 * max(1.0, diff)


def test_the_folder_is_data_and_checked(tiny, tmp_path):
    def variant(name: str) -> Path:
        return Path(shutil.copytree(tiny, tmp_path / name))

    timm = variant("timm")
    cfg = json.loads((timm / "open_clip_config.json").read_text())
    cfg["model_cfg"]["vision_cfg"]["timm_model_name"] = "convnext_base"
    (timm / "open_clip_config.json").write_text(json.dumps(cfg))
    code = variant("code")
    (code / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": "x.Tok"}}))
    from safetensors.torch import load_file, save_file

    state = load_file(str(tiny / "open_clip_model.safetensors"))
    missing = variant("missing")
    save_file({k: v for k, v in state.items() if k != "ln_final.bias"}, str(missing / "open_clip_model.safetensors"))
    nan = variant("nan")
    save_file({**state, "visual.proj": state["visual.proj"].clone().fill_(float("nan"))},
              str(nan / "open_clip_model.safetensors"))
    pickled = variant("pickled")
    (pickled / "open_clip_model.safetensors").unlink()

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    torch.save({"x": Payload()}, pickled / "open_clip_pytorch_model.bin")
    cases = [(timm, "timm_model_name is \"convnext_base\": a ConvNeXt image tower, which open_clip builds with timm"),
             (code, "auto_map"),
             (missing, "ln_final.bias is missing"), (nan, "not finite"), (pickled, "weights_only=True")]
    for folder, needle in cases:
        with pytest.raises(ValueError, match="^model: open_clip:") as err:
            openclip.OpenCLIPModel(folder, f"open_clip:{folder}")
        assert needle in str(err.value) and "\n" not in str(err.value), (folder.name, str(err.value))
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("family, change, needle", [
    ("convnext", {"vision_cfg": {"timm_model_name": "convnext_base", "timm_pool": "", "timm_proj": "linear"}},
     "a ConvNeXt image tower, which open_clip builds with timm (and timm needs torchvision)"),
    ("eva", {"vision_cfg": {"timm_model_name": "eva02_base_patch16_clip_224", "timm_pool": "token"}},
     "an EVA image tower, which open_clip builds with timm"),
    ("coca", {"multimodal_cfg": {"width": 32, "layers": 1}}, "model_cfg.multimodal_cfg: a CoCa checkpoint"),
    ("xlmr", {"text_cfg": {"hf_model_name": "xlm-roberta-base"}}, "a Hugging Face text tower")])
def test_other_families_say_why_and_what_to_do(tiny, tmp_path, family, change, needle):
    """ConvNeXt / EVA (timm towers), CoCa and HF text towers: one line saying what the checkpoint is, that
    only the plain ViT CLIP is mapped, and what to do instead (issue 42.4), whatever key comes first."""
    folder = Path(shutil.copytree(tiny, tmp_path / family))
    cfg = json.loads((folder / "open_clip_config.json").read_text())
    model = cfg["model_cfg"]
    for key, value in change.items():  # the family's keys first, as open_clip's own configs order them
        model[key] = {**value, **model[key]} if key in model else value
    (folder / "open_clip_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as err:
        openclip.OpenCLIPModel(folder, f"open_clip:{folder}")
    text = str(err.value)
    assert text.startswith(f"model: open_clip:{folder}: open_clip_config.json: ") and needle in text, text
    assert "not mapped (only the plain ViT CLIP is)" in text and "xmodal data import" in text and "\n" not in text


def test_a_bin_checkpoint_loads_with_weights_only(tiny, tmp_path):
    from safetensors.torch import load_file

    folder = Path(shutil.copytree(tiny, tmp_path / "bin"))
    state = load_file(str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_model.safetensors").unlink()
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, folder / "open_clip_pytorch_model.bin")
    want = ref(tiny)
    got = openclip.OpenCLIPModel(folder, f"open_clip:{folder}").images(torch.from_numpy(want["pixels"])).numpy()
    np.testing.assert_allclose(got, want["image"], rtol=0, atol=1e-5)


def test_missing_folder_and_bad_flags_are_one_line(tmp_path, capsys):
    for spec, needle in (("open_clip:ViT-B-32", "alone names no weights"), ("open_clip:", "needs a folder")):
        with pytest.raises(ValueError, match="^model: ") as err:
            encoders.get_encoder(spec, "image")
        assert needle in str(err.value)
    with pytest.raises(ValueError, match="^precision: "):
        encoders.get_encoder(f"open_clip:{tmp_path}", "text", precision="float8")
    with pytest.raises(ValueError, match="^device: "):
        encoders.resolve_device("gpu0")
    with pytest.raises(ValueError, match="place hf:DIR and open_clip:DIR models only"):
        encoders.get_encoder("minilm", "text", precision="bfloat16")
