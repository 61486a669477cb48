"""``xmodal export --onnx`` (issue 29): the towers as ONNX graphs agree with torch under onnxruntime (max abs
difference <= 1e-5, float32) on random inputs (ragged masks, garbage in padded frames, dynamic batch / frame /
token sizes) and on real Flickr8k features through a small trained run; ``examples/onnx_search.py`` (onnxruntime
and numpy only) finds what ``xmodal query`` finds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnx", reason="the [onnx] extra is not installed (pip install 'xmodal[onnx]')")
pytest.importorskip("onnxscript", reason="the [onnx] extra is not installed (pip install 'xmodal[onnx]')")
pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed (pip install 'xmodal[onnx]')")

from xmodal.cli import main  # noqa: E402
from xmodal.models import build_model, model_payload  # noqa: E402
from xmodal.models.onnx_towers import check_onnx, example_inputs, export_onnx, run_onnx, torch_reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
F8K = ROOT.parent / "shared" / "data" / "flickr8k"
TOL = 1e-5
pytestmark = pytest.mark.usefixtures("one_thread")


def _random(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point() and t.ndim >= 1:
                t.copy_(torch.randn(t.shape, generator=g) * 0.3 + (1.0 if t.ndim == 1 else 0.0))
    return model.eval()


VARIANTS = {
    "linear": lambda: build_model(video_dim=12, text_dim=8, dim=6),
    "transformer_tokens": lambda: build_model(video_dim=12, text_dim=8, dim=6, kind="transformer",
                                              text_kind="transformer", hidden=16, heads=2, text_tokens=20),
    "experts_gated_mlp": lambda: build_model(video_dim=12, text_dim=8, dim=6, kind="mlp", width=10,
                                             experts={"audio": 5, "flow": 7}, fusion="gated"),
    "experts_concat_meanp": lambda: build_model(video_dim=12, text_dim=8, dim=6, kind="meanp",
                                                experts={"audio": 5}, fusion="concat"),
}


_EXPORTED: dict = {}


@pytest.fixture
def exported(tmp_path_factory):
    """``(model, folder, interface)`` of a variant, exported once per session (tracing takes seconds)."""
    def get(variant):
        if variant not in _EXPORTED:
            model = _random(VARIANTS[variant]())
            folder = tmp_path_factory.mktemp(variant)
            _EXPORTED[variant] = (model, folder, export_onnx(model, folder))
        return _EXPORTED[variant]
    return get


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_onnx_towers_match_torch_on_random_inputs_of_any_size(exported, variant):
    import onnx

    model, tmp_path, info = exported(variant)
    for name in ("video_tower.onnx", "text_tower.onnx"):
        graph = onnx.load(str(tmp_path / name)).graph
        dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
        assert set(dims) == set(info[name]["inputs"])
        for key, shape in dims.items():  # batch and frame / token axes are symbolic: any size runs
            want = info[name]["inputs"][key]["shape"]
            assert shape == want and all(isinstance(s, str) for s in want[:-1]), (key, shape, want)
    # sizes the graphs were not traced with (traced: batch 3, 5 frames), ragged masks, 1e6 in padded frames
    for batch, frames in ((1, 1), (7, 9), (33, 20)):
        for which in ("video", "text"):
            x = example_inputs(model, which, batch=batch, frames=frames, seed=batch)
            got = run_onnx(tmp_path / f"{which}_tower.onnx", x)
            want = torch_reference(model, which, x)
            assert got.shape == want.shape == (batch, model.dim)
            assert np.abs(got - want).max() <= TOL, (which, batch, frames)
    diffs = check_onnx(model, tmp_path)
    assert max(diffs.values()) <= TOL


@pytest.mark.parametrize("variant, text_inputs", [("linear", ["features"]), ("experts_gated_mlp", ["features"]),
                                                  ("transformer_tokens", ["features", "mask"])])
def test_graphs_carry_metadata_and_a_sentence_text_tower_takes_no_mask(exported, variant, text_inputs):
    """issue 35.3: ``metadata_props`` with an ``opset`` key (API.md), and a text tower trained on sentence
    features takes ``features [batch, dim]`` alone (it required a mask of ones before)."""
    import onnx

    model, folder, info = exported(variant)
    text = onnx.load(str(folder / "text_tower.onnx"))
    assert [i.name for i in text.graph.input] == text_inputs
    for which in ("video", "text"):
        proto = onnx.load(str(folder / f"{which}_tower.onnx"))
        props = {p.key: p.value for p in proto.metadata_props}
        assert props["opset"] == "18" == str(next(o.version for o in proto.opset_import if o.domain == ""))
        assert props["tower"] == which and props["embedding_dim"] == str(model.dim)
        assert props["normalizer"] == model.test_time.selected and props["l2_normalised"] == "true"
        assert props["xmodal_version"] and props == info[f"{which}_tower.onnx"]["metadata_props"]
    dims = dict(p.split("=") for p in {p.key: p.value for p in text.metadata_props}["input_dims"].split(", "))
    assert dims == {"features": str(model.text_tower.spec.in_dim)}
    if text_inputs == ["features"]:  # sentence features straight in, no token axis
        x = np.random.default_rng(0).standard_normal((5, model.text_tower.spec.in_dim)).astype(np.float32)
        got = run_onnx(folder / "text_tower.onnx", {"features": x})
        assert np.abs(got - model.encode_text(torch.from_numpy(x)).numpy()).max() <= TOL


def test_onnx_reference_is_the_public_api_and_padding_changes_nothing(exported):
    model, tmp_path, _ = exported("transformer_tokens")
    x = example_inputs(model, "video", batch=4, frames=6, seed=3, garbage=False)
    junk = {k: v.copy() for k, v in x.items()}
    junk["features"][~x["mask"]] = 1e6
    a, b = run_onnx(tmp_path / "video_tower.onnx", x), run_onnx(tmp_path / "video_tower.onnx", junk)
    assert np.abs(a - b).max() <= TOL
    # against an independent per-video loop: each video alone, its real frames only, through encode_video
    for i in range(4):
        n = int(x["mask"][i].sum())
        one = model.encode_video(torch.from_numpy(x["features"][i:i + 1, :n])).numpy()
        assert np.abs(a[i] - one[0]).max() <= TOL
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)


@pytest.mark.skipif(not F8K.is_dir(), reason="../shared/data/flickr8k absent (real features for the ONNX check)")
def test_onnx_towers_match_torch_on_real_flickr8k_features(tmp_path):
    from xmodal.config import from_dict
    from xmodal.data.types import PairedSplit
    from xmodal.training import fit

    def split(name, images):
        feats = np.load(F8K / f"{name}_image_features.npy", mmap_mode="r")
        caps = np.load(F8K / f"{name}_caption_features.npy", mmap_mode="r")
        t2i = np.load(F8K / f"{name}_caption_to_image.npy")
        keep = np.flatnonzero(t2i < images)
        return PairedSplit.from_arrays(video=np.asarray(feats[:images], np.float32),
                                       text=np.asarray(caps[keep], np.float32), text_to_video=t2i[keep])

    cfg = from_dict({"model": {"kind": "mlp", "dim": 64, "width": 256, "dropout": 0.5},
                     "loss": {"name": "infonce", "temperature": 0.05}, "optim": {"lr": 1e-3},
                     "test_time": {"normalizers": ["none", "dn"], "bank_size": 500},
                     "train": {"epochs": 2, "batch_size": 256, "patience": 0, "device": "cpu", "seed": 0}})
    model, _ = fit(cfg, {"train": split("train", 1500), "val": split("dev", 200)}, out=tmp_path / "run",
                   verbose=False, progress=False)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "ex"), "--onnx"]) == 0
    recorded = json.loads((tmp_path / "ex" / "config.json").read_text())["onnx_check"]["max_abs_diff"]
    assert max(recorded.values()) <= TOL
    images = np.load(F8K / "dev_image_features.npy").astype(np.float32)  # all 1,000 dev images
    captions = np.load(F8K / "dev_caption_features.npy").astype(np.float32)  # all 5,000 dev captions
    real = {"video": {"features": images[:, None, :], "mask": np.ones((len(images), 1), bool)},
            "text": {"features": captions}}  # a sentence-feature text tower: no mask input
    diffs = check_onnx(model, tmp_path / "ex", real)
    assert max(diffs.values()) <= TOL, diffs
    # and the sentence / image form of the API gives the same embeddings as the one-frame form
    assert torch.equal(model.encode_video(images[:50]), model.encode_video(images[:50, None, :]))


def test_example_searches_an_exported_index_with_onnxruntime_and_numpy_only(tmp_path, capsys):
    from xmodal.retrieval.testtime import fit_test_time
    from xmodal.runs import atomic_save

    model = _random(build_model(video_dim=12, text_dim=8, dim=6, kind="mlp", width=10))
    g = torch.Generator().manual_seed(4)
    model.test_time = fit_test_time(["none", "dn", "sinkhorn"], text_bank=torch.randn(40, 6, generator=g),
                                    video_bank=torch.randn(30, 6, generator=g), temperature=0.05)
    (tmp_path / "run").mkdir()
    atomic_save({"model": model_payload(model)}, tmp_path / "run" / "model.pt")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "v.npy", rng.standard_normal((50, 12)).astype(np.float32))
    np.save(tmp_path / "t.npy", rng.standard_normal((6, 8)).astype(np.float32))
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "ex"), "--onnx"]) == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    for normalizer in ("dn", "sinkhorn"):  # a query shift and a bias column
        idx = tmp_path / f"idx_{normalizer}"
        assert main(["index", "--run", str(tmp_path / "ex"), "--video-features", str(tmp_path / "v.npy"),
                     "--out", str(idx), "--normalizer", normalizer]) == 0
        capsys.readouterr()
        assert main(["query", "--index", str(idx), "--text-features", str(tmp_path / "t.npy"), "--k", "5",
                     "--json"]) == 0
        want = json.loads(capsys.readouterr().out)
        code = ("import sys, runpy; sys.modules['torch'] = None; sys.modules['faiss'] = None; "
                "sys.modules['xmodal'] = None; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        res = subprocess.run([sys.executable, "-c", code, str(ROOT / "examples" / "onnx_search.py"),
                              "--model", str(tmp_path / "ex"), "--index", str(idx), "--text-features",
                              str(tmp_path / "t.npy"), "--k", "5", "--json"],
                             capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout)
        assert got["indices"] == want["indices"], normalizer
        assert np.abs(np.array(got["scores"]) - np.array(want["scores"])).max() <= TOL


def test_export_leaves_the_callers_model_as_it_was(tmp_path):
    model = _random(VARIANTS["linear"]()).double().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export_onnx(model, tmp_path)
    diffs = check_onnx(model, tmp_path)  # a float32 copy is exported and compared
    assert max(diffs.values()) <= TOL
    assert model.training and all(v.dtype == torch.float64 for v in model.state_dict().values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
