"""``--device`` / ``--precision`` of hf: encoders (issue 42 item 5): the reduced-precision features'
largest difference to float32, measured on the first batch, is what the sidecar states (recomputed
here from a float32 run on the same inputs); CUDA features equal the CPU's (skips without a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_tiny

from xmodal.cli import main
from xmodal.features import encoders

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTIONS = ["a dog runs on the grass", "Two cats!", "a red car", "the sea at night", "x"]


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return hf_tiny.save_clip(tmp_path_factory.mktemp("dev") / "clip")


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_reduced_precision_states_the_first_batchs_difference(clip, tmp_path, precision):
    caps = tmp_path / "caps.txt"
    caps.write_text("\n".join(CAPTIONS) + "\n")
    full, low = tmp_path / "f32.npy", tmp_path / "low.npy"
    assert main(["encode", "text", "--captions", str(caps), "--out", str(full), "--model", f"hf:{clip}",
                 "--device", "cpu", "--batch-size", "2", "--no-progress"]) == 0
    assert main(["encode", "text", "--captions", str(caps), "--out", str(low), "--model", f"hf:{clip}",
                 "--device", "cpu", "--precision", precision, "--batch-size", "2", "--no-progress"]) == 0
    a, b = np.load(full), np.load(low)
    first = float(np.abs(a[:2] - b[:2]).max())  # batch 1 = captions 0 and 1
    record = json.loads(low.with_name("low.npy.encoder.json").read_text())
    record = record.get("encoder", record)
    assert record["runtime"]["precision"] == precision and record["runtime"]["device"] == "cpu"
    assert first > 0, "a reduced precision that changes nothing: the dtype was not applied"
    assert record["runtime"]["max_abs_diff_vs_float32"] == pytest.approx(first, rel=1e-6, abs=1e-7)
    assert record["preprocessing"]["dtype"] == precision
    plain = json.loads(full.with_name("f32.npy.encoder.json").read_text())
    assert "runtime" not in plain.get("encoder", plain)  # float32 on the CPU: the record as before
    assert np.abs(a - b).max() < 0.1 * np.abs(a).max()  # close, not equal


def test_images_in_bfloat16_match_float32_closely(clip, tmp_path):
    paths = hf_tiny.write_images(tmp_path / "imgs", 3)
    a = encoders.encode_images(paths, model=f"hf:{clip}", batch_size=3, progress=False, device="cpu")
    b = encoders.encode_images(paths, model=f"hf:{clip}", batch_size=3, progress=False, device="cpu",
                               precision="bfloat16")
    run = encoders.identity_of(f"hf:{clip}", "image", device="cpu", precision="bfloat16")["runtime"]
    assert run["max_abs_diff_vs_float32"] == pytest.approx(float(np.abs(a - b).max()), rel=1e-6, abs=1e-7)


def test_device_flags_are_checked(clip, tmp_path, capsys):
    caps = tmp_path / "caps.txt"
    caps.write_text("a\n")
    for extra, needle in ((["--model", f"hf:{clip}", "--device", "tpu"], "--device: expected auto, cpu, cuda or cuda:N"),
                          (["--precision", "float16"], "--precision: places hf:DIR and open_clip:DIR models only")):
        capsys.readouterr()
        assert main(["encode", "text", "--captions", str(caps), "--out", str(tmp_path / "o.npy"), *extra]) != 0
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o.npy").exists()
    if not torch.cuda.is_available():
        assert encoders.resolve_device("auto") == "cpu"
        with pytest.raises(ValueError, match="no CUDA device is visible"):
            encoders.resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_features_equal_the_cpus(clip):
    a = encoders.encode_text(CAPTIONS, model=f"hf:{clip}", batch_size=5, progress=False, device="cpu")
    b = encoders.encode_text(CAPTIONS, model=f"hf:{clip}", batch_size=5, progress=False, device="cuda")
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)
    assert encoders.identity_of(f"hf:{clip}", "text", device="auto")["runtime"]["device"] == "cuda"


def test_a_videos_folder_states_its_precision(clip, tmp_path):
    pytest.importorskip("av")
    vids = tmp_path / "vids"
    vids.mkdir()
    rng = np.random.default_rng(0)
    hf_tiny.write_video(vids / "a.avi", rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8))
    for out, extra in ((tmp_path / "f32", []), (tmp_path / "bf16", ["--precision", "bfloat16"])):
        assert main(["encode", "videos", str(vids), "--out", str(out), "--model", f"hf:{clip}", "--frames", "3",
                     "--device", "cpu", "--batch-size", "8", "--quiet", *extra]) == 0
    a, b = np.load(tmp_path / "f32" / "a.npy"), np.load(tmp_path / "bf16" / "a.npy")
    run = json.loads((tmp_path / "bf16" / "encoder.json").read_text())["runtime"]
    assert run["precision"] == "bfloat16"
    diff = float(np.abs(a - b).max())
    assert diff > 0 and run["max_abs_diff_vs_float32"] == pytest.approx(diff, rel=1e-6, abs=1e-7)
    assert "runtime" not in json.loads((tmp_path / "f32" / "encoder.json").read_text())
