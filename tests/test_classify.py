"""``xmodal classify`` (issue 42.3): zero-shot classification of a labelled layout on a tiny random CLIP
(``hf:DIR``) equals top-k computed by hand (the library's own text features, CLIP's prompt averaging,
cosine, explicit rank loops); its DN equals DN's eq. 7 applied by hand with Table 2's protocol (the
image mean from sampled validation items per seed, the text mean from the class embeddings); two
runs go through ``xmodal compare``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_tiny  # noqa: E402

from xmodal.cli import main  # noqa: E402
from xmodal.classify.templates import CLIP_IMAGENET_TEMPLATES  # noqa: E402
from xmodal.features import encoders, identity  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES = ["dog", "cat", "red car", "tree", "boat", "pizza"]
TEMPLATES = ["a photo of a {}.", "a blurry picture of the {}", "{} in the wild"]
N_TEST, N_VAL, SAMPLES, SEEDS, LAM = 40, 30, 4, 5, 0.25  # SAMPLES < classes: the text mean is not sampled


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def text_features_by_hand(folder: Path, prompts: list[str]) -> np.ndarray:
    """The library's own text tower, one prompt at a time."""
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    proc = AutoProcessor.from_pretrained(str(folder))
    with torch.inference_mode():
        return np.concatenate([model.get_text_features(**proc(text=[p], padding=True, truncation=True, max_length=16,
                                                                   return_tensors="pt")).pooler_output.double().numpy()
                               for p in prompts])


def ranks_by_hand(x: np.ndarray, c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Cosine, then each item's rank of its true class by an explicit loop (ties pessimistic)."""
    s = unit(x) @ unit(c).T
    return np.array([1 + sum(s[i, j] >= s[i, y[i]] for j in range(len(c)) if j != y[i]) for i in range(len(x))])


def top(ranks, k):
    return 100.0 * np.mean(np.asarray(ranks) <= k)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cls")
    folder = hf_tiny.save_clip(root / "clip")
    prompts = [t.format(c) for c in CLASSES for t in TEMPLATES]
    feats = text_features_by_hand(folder, prompts)
    cls = unit(unit(feats).reshape(len(CLASSES), len(TEMPLATES), -1).mean(1))  # CLIP's prompt ensembling
    rng = np.random.default_rng(0)
    data = root / "data"
    data.mkdir()
    y = rng.integers(0, len(CLASSES), N_TEST)
    x = cls[y] + 0.35 * rng.standard_normal((N_TEST, cls.shape[1])) + 0.3  # a shared offset: what DN removes
    val = cls[rng.integers(0, len(CLASSES), N_VAL)] + 0.35 * rng.standard_normal((N_VAL, cls.shape[1])) + 0.3
    np.save(data / "test_image_features.npy", x.astype(np.float32))
    np.save(data / "test_image_labels.npy", y)
    np.save(data / "val_image_features.npy", val.astype(np.float32))
    identity.write_encoders(data, {"text": None, "video": encoders.identity_of(f"hf:{folder}", "image"), "experts": {}})
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    (root / "templates.txt").write_text("\n".join(TEMPLATES) + "\n")
    return {"root": root, "folder": folder, "data": data, "x": x.astype(np.float32).astype(np.float64),
            "val": val.astype(np.float32).astype(np.float64), "y": y, "cls": cls}


def classify(setup, out: str, *extra: str) -> dict:
    r = setup["root"]
    code = main(["classify", "--data", str(setup["data"]), "--classes", str(r / "classes.txt"), "--out", str(r / out),
                 "--dn-num-samples", str(SAMPLES), *extra])
    assert code == 0
    return json.loads((r / out / "metrics.json").read_text())


def test_top_k_equals_the_hand_computation(setup, capsys):
    m = classify(setup, "run_file", "--templates", str(setup["root"] / "templates.txt"))
    out = capsys.readouterr().out
    assert "40 images, 6 classes, 3 template(s) per class" in out
    np.testing.assert_allclose(np.load(setup["root"] / "run_file" / "class_embeddings.npy"), setup["cls"], atol=1e-5)
    want = ranks_by_hand(setup["x"], setup["cls"], setup["y"])
    got = m["test"]["none"]["v2c"]
    assert 0 < got["top1"] < 100  # neither trivial nor hopeless: the check can fail
    for k in (1, 5):
        assert got[f"top{k}"] == pytest.approx(top(want, k), abs=1e-9) == got[f"R@{k}"]
    with np.load(setup["root"] / "run_file" / "per_query.npz") as z:
        np.testing.assert_array_equal(z["test/none/v2c/rank"], want)
    assert m["test"]["protocol"]["gallery_size"] == {"v2c": 6} and m["test"]["protocol"]["chance_r1"]["v2c"] == \
        pytest.approx(100 / 6)


def test_dn_equals_eq7_with_table2_sampling_by_hand(setup):
    m = classify(setup, "run_dn", "--templates", str(setup["root"] / "templates.txt"))
    x, val, y, cls = setup["x"], setup["val"], setup["y"], setup["cls"]
    mu_y = cls.mean(0)  # every class embedding (the authors' code: the mean of all caption embeddings)
    samples = [val[np.sort(np.random.default_rng([k, 0]).choice(N_VAL, SAMPLES, replace=False))] for k in range(SEEDS)]
    per_seed = [ranks_by_hand(x - LAM * s.mean(0), cls - LAM * mu_y, y) for s in samples]  # eq. 7
    for k in (1, 5):
        accs = [top(r, k) for r in per_seed]
        got = m["test"]["dn_seeds"][f"top{k}"]
        assert got["per_seed"] == pytest.approx(accs, abs=1e-9)
        assert got["mean"] == pytest.approx(np.mean(accs)) and got["std"] == pytest.approx(np.std(accs))
    pooled = ranks_by_hand(x - LAM * np.mean([s.mean(0) for s in samples], 0), cls - LAM * mu_y, y)
    with np.load(setup["root"] / "run_dn" / "per_query.npz") as z:
        np.testing.assert_array_equal(z["test/dn/v2c/rank"], pooled)
    assert m["test"]["dn"]["v2c"]["top1"] == pytest.approx(top(pooled, 1))
    assert m["test"]["none"]["v2c"]["top1"] != m["test"]["dn"]["v2c"]["top1"]  # DN changed something here
    assert m["test"]["protocol"]["normalizers"]["dn"]["uses_test_queries"] is False


def test_clip_templates_and_compare_between_two_runs(setup, capsys):
    m = classify(setup, "run_clip")  # default: CLIP's 80 templates
    assert m["templates"]["count"] == 80 and m["templates"]["templates"] == list(CLIP_IMAGENET_TEMPLATES)
    classify(setup, "run_photo", "--templates", "photo")
    capsys.readouterr()
    r = setup["root"]
    assert main(["compare", str(r / "run_photo"), str(r / "run_clip"), "--json", "--n-boot", "200"]) == 0
    rows = json.loads(capsys.readouterr().out)
    tables = rows if isinstance(rows, list) else [rows]
    got = [row for t in tables for row in t["rows"] if row["direction"] == "v2c" and row["metric"] == "R@1"]
    assert got and all(set(row) >= {"diff", "ci_low", "ci_high", "p_value", "verdict"} for row in got)


def test_other_weights_wrong_size_missing_labels_and_foreign_out_are_one_line(setup, tmp_path, capsys):
    r = setup["root"]
    other = hf_tiny.save_clip(tmp_path / "other", seed=1)
    base = ["classify", "--data", str(setup["data"]), "--classes", str(r / "classes.txt")]
    assert main(base + ["--text-model", f"hf:{other}", "--out", str(tmp_path / "o")]) == 2
    assert "has other weights than" in capsys.readouterr().err
    assert main(base + ["--text-model", "minilm", "--out", str(tmp_path / "o")]) == 2
    assert "384-d features, but these features are 24-d" in capsys.readouterr().err
    assert main(base + ["--split", "val", "--out", str(tmp_path / "o")]) == 2
    assert "lacks val_video_labels.npy" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(base + ["--templates", "photo", "--out", str(tmp_path / "mine")]) == 2
    err = capsys.readouterr().err
    assert "did not write" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert not (tmp_path / "o").exists()


def _hashed(prompts, *, batch_size, progress):
    """A stand-in text encoder: each prompt's bytes seed its 6-d vector."""
    import hashlib

    return np.stack([np.random.default_rng(int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "little"))
                     .standard_normal(6) for p in prompts]).astype(np.float32)


def test_video_frames_are_averaged_and_a_missing_val_split_skips_dn(tmp_path, capsys):
    from xmodal.classify import zeroshot

    encoders.register_encoder("zs-hashed", _hashed, kind="text", overwrite=True)
    try:
        rng = np.random.default_rng(3)
        x = rng.standard_normal((7, 4, 6)).astype(np.float32)
        mask = np.arange(4)[None, :] < rng.integers(1, 5, 7)[:, None]
        y = rng.integers(0, 3, 7)
        np.save(tmp_path / "test_video_features.npy", x)
        np.save(tmp_path / "test_video_mask.npy", mask)
        np.save(tmp_path / "test_video_labels.npy", y)
        (tmp_path / "c.txt").write_text("a\nb\nc\n")
        capsys.readouterr()
        assert main(["classify", "--data", str(tmp_path), "--classes", str(tmp_path / "c.txt"), "--text-model",
                     "zs-hashed", "--templates", "photo", "--out", str(tmp_path / "run")]) == 0
        out = capsys.readouterr().out
        assert "7 videos, 3 classes" in out and "note: DN skipped: the layout has no val split" in out
        pooled = np.stack([x[i][mask[i]].astype(np.float64).mean(0) for i in range(7)])  # the real frames only
        cls = unit(_hashed([f"a photo of a {c}." for c in "abc"], batch_size=1, progress=False).astype(np.float64))
        m = json.loads((tmp_path / "run" / "metrics.json").read_text())
        assert "dn" not in m["test"] and m["test"]["none"]["v2c"]["top1"] == pytest.approx(
            top(ranks_by_hand(pooled, cls, y), 1))
        with np.load(tmp_path / "run" / "per_query.npz") as z:
            np.testing.assert_array_equal(z["test/none/v2c/rank"], ranks_by_hand(pooled, cls, y))
        old = zeroshot.BLOCK
        zeroshot.BLOCK = 2  # blocks of 2 items give the same ranks as one block
        try:
            np.testing.assert_array_equal(zeroshot.class_ranks(pooled, cls, y), ranks_by_hand(pooled, cls, y))
        finally:
            zeroshot.BLOCK = old
    finally:
        encoders.ENCODERS.pop("zs-hashed", None)


def test_clip_templates_are_open_clips_list():
    """The 80 templates against open_clip's own list (its file read without importing open_clip)."""
    import importlib.util

    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("open_clip is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "zero_shot_metadata.py"
    mod_spec = importlib.util.spec_from_file_location("_open_clip_zero_shot_metadata", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    assert [t("{}") for t in mod.OPENAI_IMAGENET_TEMPLATES] == list(CLIP_IMAGENET_TEMPLATES)
