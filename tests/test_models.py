"""Two-tower heads: shapes, normalisation, standardisation, frame pooling, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xmodal.models import TwoTower, build_model, load_model, model_payload
from xmodal.runs import atomic_save
from xmodal.retrieval.testtime import TestTime, fit_test_time

pytestmark = pytest.mark.usefixtures("one_thread")


def _features(n=12, dv=10, dt=6, frames=0, seed=0):
    g = np.random.default_rng(seed)
    v = g.normal(size=(n, frames, dv) if frames else (n, dv)).astype(np.float32) * 3 + 1
    t = g.normal(size=(n, dt)).astype(np.float32)
    return v, t


@pytest.mark.parametrize("kind", ["linear", "mlp", "meanp", "transformer"])
def test_encode_shapes_and_unit_norm(kind):
    torch.manual_seed(0)
    model = build_model(video_dim=10, text_dim=6, kind=kind, dim=8, width=16, hidden=16, heads=4, layers=1)
    v, t = _features(frames=4 if kind in ("meanp", "transformer") else 0)
    ev, et = model.encode_video(v), model.encode_text(t)
    assert ev.shape == (12, 8) and et.shape == (12, 8)
    torch.testing.assert_close(ev.norm(dim=1), torch.ones(12))
    torch.testing.assert_close(et.norm(dim=1), torch.ones(12))


def test_meanp_equals_linear_on_frame_mean():
    """meanP pools frames by their mean: the result equals the tower applied to the mean
    (the standardisation is affine, so it commutes with the mean)."""
    torch.manual_seed(0)
    model = build_model(video_dim=10, text_dim=6, kind="meanp", dim=8)
    v, _ = _features(frames=5)
    torch.testing.assert_close(model.encode_video(v), model.encode_video(v.mean(1)), rtol=1e-5, atol=1e-6)


def test_standardization_uses_train_statistics_and_input_untouched():
    torch.manual_seed(0)
    model = build_model(video_dim=10, text_dim=6, kind="linear", dim=8)
    v, t = _features(n=50)
    v_copy = v.copy()
    model.fit_standardization(torch.from_numpy(v), torch.from_numpy(t))
    std = model.video_tower.standardize
    np.testing.assert_allclose(std.mean.numpy(), v.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std.std.numpy(), v.std(0), rtol=1e-4)
    z = std(torch.from_numpy(v))
    np.testing.assert_allclose(z.mean(0).numpy(), 0, atol=1e-5)
    model.encode_video(v)
    np.testing.assert_array_equal(v, v_copy)


def test_transformer_is_frame_order_sensitive_but_meanp_is_not():
    torch.manual_seed(0)
    v, _ = _features(frames=4)
    rev = v[:, ::-1].copy()
    tr = build_model(video_dim=10, text_dim=6, kind="transformer", dim=8, hidden=16, heads=4, layers=2)
    assert not torch.allclose(tr.encode_video(v), tr.encode_video(rev), atol=1e-4)
    mp = build_model(video_dim=10, text_dim=6, kind="meanp", dim=8)
    torch.testing.assert_close(mp.encode_video(v), mp.encode_video(rev), rtol=1e-5, atol=1e-6)


def test_bad_inputs_name_the_argument():
    model = build_model(video_dim=10, text_dim=6, dim=8)
    with pytest.raises(ValueError, match="features"):
        model.encode_video(np.zeros((3, 7), np.float32))
    with pytest.raises(TypeError, match="features"):
        model.encode_text(np.zeros((3, 6), np.int64))
    with pytest.raises(ValueError, match="features"):
        model.encode_text(np.full((3, 6), np.nan, np.float32))
    with pytest.raises(ValueError, match="model.kind"):
        build_model(video_dim=10, text_dim=6, kind="cnn")


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    model = build_model(video_dim=10, text_dim=6, kind="mlp", dim=8, width=16, dropout=0.1)
    v, t = _features()
    model.fit_standardization(torch.from_numpy(v), torch.from_numpy(t))
    model.temperature = 0.07
    g = torch.Generator().manual_seed(1)
    tt = fit_test_time(["none", "dn", "sinkhorn"], text_bank=torch.randn(20, 8, generator=g),
                       video_bank=torch.randn(20, 8, generator=g), temperature=0.07)
    tt.selected = "dn"
    model.test_time = tt
    atomic_save({"model": model_payload(model)}, tmp_path / "model.pt")
    assert not list(tmp_path.glob(".*tmp*"))
    for path in (tmp_path, tmp_path / "model.pt"):
        loaded = load_model(path)
        assert isinstance(loaded, TwoTower)
        assert loaded.temperature == pytest.approx(0.07)
        assert isinstance(loaded.test_time, TestTime)
        assert loaded.test_time.selected == "dn" and loaded.test_time.names == ("none", "dn", "sinkhorn")
        for name in ("none", "dn", "sinkhorn"):  # the stored state gives the same scores
            torch.testing.assert_close(loaded.similarity(t, v, name), model.similarity(t, v, name))
        torch.testing.assert_close(loaded.encode_video(v), model.encode_video(v))
        torch.testing.assert_close(loaded.encode_text(t), model.encode_text(t))
    with pytest.raises(FileNotFoundError, match="path"):
        load_model(tmp_path / "missing")


def test_junk_specs_and_models_refused_in_one_line():
    """What the public-callable fuzz found: each once an AttributeError, AssertionError,
    IndexError or RuntimeError deep inside torch."""
    from xmodal.models import (ExpertFusion, Standardize, Tower, TowerSpec, masked_mean, model_from_payload,
                               parameter_count)

    ok = TowerSpec(in_dim=4, out_dim=3)
    cases = [
        (lambda: Tower(None), TypeError, "spec"),
        (lambda: Tower(TowerSpec(in_dim=4, width=True)), TypeError, "spec.width"),
        (lambda: Tower(TowerSpec(in_dim=4, depth=-1)), ValueError, "spec.depth"),
        # torch's own check is an AssertionError in MultiheadAttention
        (lambda: Tower(TowerSpec(kind="transformer", in_dim=4, hidden=10, heads=4)), ValueError, "spec.heads"),
        (lambda: Tower(TowerSpec(in_dim=4, dropout=float("nan"))), ValueError, "spec.dropout"),
        (lambda: TwoTower([], ok), TypeError, "video"),
        (lambda: TwoTower(ok, ok, temperature=np.zeros((2, 2))), TypeError, "temperature"),
        (lambda: TwoTower(ok, ok, experts={"video": ok}), ValueError, "experts"),
        (lambda: ExpertFusion(np.array([[2, 2]])), TypeError, "specs"),
        (lambda: ExpertFusion({"k": 0, "a": ok}), TypeError, "specs['k']"),
        (lambda: ExpertFusion({"a.b": ok, "c": ok}), ValueError, "specs"),
        (lambda: Standardize(torch.tensor(True)), TypeError, "dim"),
        (lambda: Standardize(-1), ValueError, "dim"),
        (lambda: build_model(video_dim=torch.zeros(4, 0, 4), text_dim=3), TypeError, "video_dim"),
        (lambda: build_model(video_dim=3, text_dim=3, experts=[4, 4]), TypeError, "experts"),
        (lambda: masked_mean(None, None), TypeError, "x"),
        (lambda: masked_mean(torch.ones(2, 3, 4), torch.ones(2, 3, dtype=torch.long)), TypeError, "mask"),
        (lambda: masked_mean(torch.ones(2, 3, 4), torch.ones(3, 2, dtype=torch.bool)), ValueError, "mask"),
        (lambda: model_payload(None), TypeError, "model"),
        (lambda: parameter_count([1, 4]), TypeError, "model"),
        (lambda: model_from_payload(torch.ones(3)), TypeError, "payload"),
        (lambda: model_from_payload({}), ValueError, "payload"),
        (lambda: model_from_payload({"architecture": [1], "state_dict": {}}), ValueError, "architecture"),
        (lambda: model_from_payload({"architecture": {"video": {"kind": "linear", "in_dim": 3, "bogus": 1},
                                                      "text": {}}, "state_dict": {}}),
         ValueError, "architecture['video']"),
    ]
    for make, error, name in cases:
        with pytest.raises(error) as exc:
            make()
        msg = str(exc.value)
        assert "\n" not in msg and msg.startswith(name), (name, msg)


def test_payload_with_weights_the_architecture_lacks_is_a_value_error():
    payload = model_payload(build_model(video_dim=5, text_dim=4, dim=3))
    payload["state_dict"] = {**payload["state_dict"], "extra.weight": torch.zeros(2)}
    from xmodal.models import model_from_payload

    with pytest.raises(ValueError, match=r"payload\['state_dict'\]: .*extra\.weight"):
        model_from_payload(payload)
    del payload["state_dict"]["extra.weight"]
    assert isinstance(model_from_payload(payload), TwoTower)
