"""Frame masks and several experts in the two-tower heads: padded frames never change
an embedding, missing experts contribute nothing, weights renormalise, round trip."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xmodal.models import ExpertFusion, atomic_save, build_model, load_model, masked_mean, model_payload


def _padded(seed, n=5, f=6, d=7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, d, generator=g)
    lengths = torch.randint(1, f + 1, (n,), generator=g)
    lengths[0] = f  # one full row
    mask = torch.arange(f)[None, :] < lengths[:, None]
    return x, mask, lengths


def _model(kind, seed, d=7, **kw):
    torch.manual_seed(seed)
    return build_model(video_dim=d, text_dim=3, kind=kind, dim=8, width=16, hidden=16, heads=2, layers=2, **kw)


@pytest.mark.parametrize("kind", ["linear", "mlp", "meanp", "transformer"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_padded_frames_never_change_an_embedding(kind, seed, one_thread):
    x, mask, lengths = _padded(seed)
    model = _model(kind, seed)
    model.fit_standardization(x, torch.randn(4, 3), video_mask=mask)
    ref = model.encode_video(x, mask)
    for junk in (1e30, -3e38, float("nan"), float("inf")):
        y = x.clone()
        y[~mask] = junk
        assert torch.equal(model.encode_video(y, mask), ref), junk
    # Same embedding as each video alone, without padding and without a mask.
    for i in range(len(x)):
        alone = model.encode_video(x[i:i + 1, : lengths[i]])
        torch.testing.assert_close(alone[0], ref[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["meanp", "transformer"])
def test_training_path_gives_padded_frames_no_gradient(kind, one_thread):
    x, mask, _ = _padded(3)
    model = _model(kind, 3).train()  # dropout 0: train mode is deterministic
    x = x.clone().requires_grad_(True)
    model.forward_video(x, mask).sum().backward()
    assert torch.all(x.grad[~mask] == 0) and x.grad[mask].abs().sum() > 0
    y = x.detach().clone()
    y[~mask] = 1e20
    torch.testing.assert_close(model.forward_video(y, mask), model.forward_video(x.detach(), mask))


@pytest.mark.parametrize("seed", [0, 1])
def test_masked_mean_matches_a_loop(seed):
    x, mask, _ = _padded(seed)
    got = masked_mean(x.double(), mask)
    for i in range(len(x)):
        real = [x[i, t].double() for t in range(x.shape[1]) if mask[i, t]]
        torch.testing.assert_close(got[i], sum(real) / len(real))


def test_standardization_ignores_padded_frames():
    x, mask, _ = _padded(4)
    y = x.clone()
    y[~mask] = 1e6
    model = _model("meanp", 0)
    model.fit_standardization(y, torch.randn(4, 3), video_mask=mask)
    real = x[mask].double().numpy()
    np.testing.assert_allclose(model.video_tower.standardize.mean.numpy(), real.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.video_tower.standardize.std.numpy(), real.std(0), rtol=1e-5, atol=1e-6)


def test_mask_errors_name_the_argument():
    x, mask, _ = _padded(0)
    model = _model("meanp", 0)
    empty = mask.clone()
    empty[2] = False
    with pytest.raises(ValueError, match=r"mask: 1 video\(s\) have no real frame \(rows \[2\]\)"):
        model.encode_video(x, empty)
    with pytest.raises(ValueError, match="no real frame"):
        model.forward_video(x, empty)
    with pytest.raises(TypeError, match="mask: expected a bool mask"):
        model.encode_video(x, mask.int())
    with pytest.raises(ValueError, match="mask: expected shape"):
        model.encode_video(x, mask[:, :3])
    with pytest.raises(ValueError, match="mask: expected shape"):
        model.encode_video(x[:, 0], mask)  # no frame axis
    y = x.clone()
    y[0, 0, 0] = float("nan")  # a real frame
    with pytest.raises(ValueError, match="features: contains 1 NaN"):
        model.encode_video(y, mask)
    with pytest.raises(TypeError, match="features: this model has one video expert"):
        model.encode_video({"video": x})


# --------------------------------------------------------------------------- experts


def _experts(seed, n=6):
    g = torch.Generator().manual_seed(seed)
    feats = {"video": torch.randn(n, 4, 7, generator=g), "audio": torch.randn(n, 5, generator=g),
             "ocr": torch.randn(n, 3, 6, generator=g)}
    masks = {"video": torch.rand(n, 4, generator=g) < 0.7, "audio": torch.tensor([True, False] * (n // 2)),
             "ocr": torch.rand(n, 3, generator=g) < 0.5}
    masks["video"][:, 0] = True
    masks["ocr"][1] = False  # ocr missing for video 1 (and audio too)
    return feats, masks


def _expert_model(fusion, kind="meanp", seed=0):
    torch.manual_seed(seed)
    return build_model(video_dim=7, text_dim=3, kind=kind, dim=8, width=16, hidden=16, heads=2,
                       experts={"audio": 5, "ocr": 6}, fusion=fusion)


def _reference(model, feats, masks):
    """Float64 loop: gated embedding unit per expert, softmax over the present experts."""
    fus = model.video_tower
    out = []
    for i in range(next(iter(feats.values())).shape[0]):
        units, logits = [], []
        for name in fus.names:
            m = masks[name][i]
            if not bool(m.any()):
                continue  # missing: contributes nothing
            x = feats[name][i:i + 1]
            if x.ndim == 3:
                x = x[:, m]  # the real frames only, no mask
            y = fus.towers[name](x)[0].double()
            g = fus.gates[name]
            u = y * torch.sigmoid(g.weight.double() @ y + g.bias.double())
            units.append(u / u.norm())
            s = fus.scores[name]
            logits.append(float(s.weight.double()[0] @ y + s.bias.double()[0]))
        w = np.exp(np.array(logits) - max(logits))
        w /= w.sum()
        out.append(sum(float(wi) * ui for wi, ui in zip(w, units)))
    return F.normalize(torch.stack(out), dim=-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gated_fusion_matches_a_loop_and_renormalises(seed, one_thread):
    feats, masks = _experts(seed)
    model = _expert_model("gated", seed=seed).eval()
    got = model.encode_video(feats, masks)
    with torch.no_grad():
        want = _reference(model, feats, masks)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fusion", ["gated", "concat"])
@pytest.mark.parametrize("kind", ["meanp", "transformer"])
def test_missing_experts_and_padded_frames_contribute_nothing(fusion, kind, one_thread):
    feats, masks = _experts(5)
    model = _expert_model(fusion, kind)
    ref = model.encode_video(feats, masks)
    junk = {k: v.clone() for k, v in feats.items()}
    junk["audio"][~masks["audio"]] = float("nan")
    junk["ocr"][~masks["ocr"]] = 1e30
    junk["video"][~masks["video"]] = -1e30
    assert torch.equal(model.encode_video(junk, masks), ref)
    # A video whose only other experts are missing is its main expert alone in a gated mix.
    if fusion == "gated":
        only_main = {k: (m if k == "video" else torch.zeros_like(m)) for k, m in masks.items()}
        fus = model.video_tower
        with torch.no_grad():
            y = fus.towers["video"](feats["video"], masks["video"])
            u = F.normalize(F.normalize(y * torch.sigmoid(fus.gates["video"](y)), dim=-1), dim=-1)
        torch.testing.assert_close(model.encode_video(feats, only_main), u, rtol=1e-5, atol=1e-6)
    # Gradients: none reach missing experts' rows or padded frames.
    x = {k: v.clone().requires_grad_(True) for k, v in junk.items()}
    model.train()
    out = model.forward_video(x, masks)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert torch.all(x["audio"].grad[~masks["audio"]] == 0)
    assert torch.all(x["ocr"].grad[~masks["ocr"]] == 0)


def test_expert_errors():
    feats, masks = _experts(0)
    model = _expert_model("gated")
    with pytest.raises(ValueError, match="features: expected a dict with the experts"):
        model.encode_video(feats["video"], masks["video"])
    with pytest.raises(ValueError, match="features: expected a dict with the experts"):
        model.encode_video({"video": feats["video"]})
    none = {k: torch.zeros_like(m) for k, m in masks.items()}
    with pytest.raises(ValueError, match="no expert present"):
        model.encode_video(feats, none)
    with pytest.raises(ValueError, match="no expert present"):
        model.forward_video(feats, none)
    with pytest.raises(ValueError, match="model.fusion"):
        _expert_model("sum")
    with pytest.raises(ValueError, match="experts"):
        ExpertFusion({"video": model.video_tower.towers["video"].spec}, "gated")


@pytest.mark.parametrize("fusion", ["gated", "concat"])
def test_load_model_round_trip_with_experts_and_masks(tmp_path, fusion):
    feats, masks = _experts(2)
    model = _expert_model(fusion, "transformer")
    model.fit_standardization(feats, torch.randn(5, 3), video_mask=masks)
    atomic_save({"model": model_payload(model)}, tmp_path / "model.pt")
    loaded = load_model(tmp_path)
    assert loaded.experts == ["video", "audio", "ocr"]
    torch.testing.assert_close(loaded.encode_video(feats, masks), model.encode_video(feats, masks))
    single = _model("transformer", 0)
    x, mask, _ = _padded(1)
    atomic_save({"model": model_payload(single)}, tmp_path / "single.pt")
    torch.testing.assert_close(load_model(tmp_path / "single.pt").encode_video(x, mask), single.encode_video(x, mask))
