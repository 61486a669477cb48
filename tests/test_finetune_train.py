"""``model.kind: clip4clip`` in the one training loop: gradient caching (``train.chunk_size``) and
gradient checkpointing give plain back-propagation's gradients; a run trains, saves, loads and resumes
mid-epoch bit for bit (the pattern of ``tests/test_midepoch_resume.py``); the config keys are checked."""

from __future__ import annotations

import pytest
import torch

from hf_tiny import save_clip
from videos_tiny import split

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = 16


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return save_clip(tmp_path_factory.mktemp("ft") / "clip", seed=5, image_size=SIZE, projection_dim=32)


def _model(clip_dir, *, dropout=0.0, **kw):
    from xmodal.models.clip4clip import build_clip4clip, tokenize

    model, proc = build_clip4clip(f"hf:{clip_dir}", sim_header="seqTransf", temporal_layers=1, max_frames=4,
                                  frame_pos="uniform", max_words=10, **kw)
    for m in model.modules():  # dropout in every attention: the chunks must replay the same masks
        if hasattr(m, "dropout") and isinstance(getattr(m, "dropout"), float):
            m.dropout = dropout
    return model.train(), proc, tokenize


def _batch(proc, tokenize, n=7, seed=0):
    s = split(n, size=SIZE, seed=seed)
    ids = torch.from_numpy(tokenize(s.captions, proc.tokenizer, 10))
    return torch.from_numpy(s.video), torch.from_numpy(s.video_mask), ids


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(a, b, rel=1e-5):
    """Every gradient entry within ``rel`` of the largest gradient entry (some entries are exactly 0 in
    theory, e.g. the key biases', and float noise there has no scale of its own)."""
    assert a.keys() == b.keys() and a
    scale = max(float(g.abs().max()) for g in a.values())
    worst = max((float((a[k] - b[k]).abs().max()), k) for k in a)
    assert worst[0] <= rel * scale, worst


def _plain(model, loss, v, m, t, chunk=None):
    """Plain back-propagation through one graph of the batch; with ``chunk`` the rows are embedded chunk by
    chunk (video chunks, then text chunks: dropout draws its masks per chunk, as gradient caching does)."""
    model.zero_grad()
    torch.manual_seed(0)
    n = v.shape[0]
    step = chunk or n
    video = torch.cat([model.forward_video(v[i:i + step], m[i:i + step]) for i in range(0, n, step)])
    text = torch.cat([model.forward_text(t[i:i + step]) for i in range(0, n, step)])
    value = loss(video, text)
    value.backward()
    return float(value.detach()), _grads(model)


def _cached(model, loss, v, m, t, chunk):
    from xmodal.training.gradcache import cached_backward

    model.zero_grad()
    torch.manual_seed(0)
    value = cached_backward(model.forward_video, model.forward_text, loss, video=v, video_mask=m, text=t,
                            text_mask=None, chunk_size=chunk)
    return float(value), _grads(model)


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_gradient_caching_equals_plain_backprop(clip_dir, chunk):
    """CLIP's own dropout is 0: the same gradients as one backward over the whole batch."""
    from xmodal.losses import InfoNCE

    model, proc, tokenize = _model(clip_dir)
    v, m, t = _batch(proc, tokenize)
    loss = InfoNCE(temperature=0.1)
    ref_value, ref = _plain(model, loss, v, m, t)
    value, got = _cached(model, loss, v, m, t, chunk)
    assert abs(value - ref_value) < 1e-6
    _close(ref, got)


def test_gradient_caching_replays_dropout(clip_dir):
    """With dropout, each chunk is re-run under the RNG state of its first pass: the gradients of one graph
    over the same chunked forward; without the replay the masks differ and so do the gradients."""
    from xmodal.losses import InfoNCE
    from xmodal.training import gradcache

    model, proc, tokenize = _model(clip_dir, dropout=0.1)
    v, m, t = _batch(proc, tokenize)
    loss = InfoNCE(temperature=0.1)
    ref_value, ref = _plain(model, loss, v, m, t, chunk=3)
    value, got = _cached(model, loss, v, m, t, 3)
    assert abs(value - ref_value) < 1e-6
    _close(ref, got)
    keep = gradcache._set_rng
    gradcache._set_rng = lambda state: None
    try:
        _, broken = _cached(model, loss, v, m, t, 3)
    finally:
        gradcache._set_rng = keep
    with pytest.raises(AssertionError):
        _close(ref, broken)


def test_gradient_checkpointing_equals_plain_backprop(clip_dir):
    from xmodal.losses import InfoNCE

    loss = InfoNCE(temperature=0.1)
    plain, proc, tokenize = _model(clip_dir)
    v, m, t = _batch(proc, tokenize)
    _, ref = _plain(plain, loss, v, m, t)
    ckpt, _, _ = _model(clip_dir, gradient_checkpointing=True)
    assert ckpt.video_tower.vision_model.encoder.layers[0].gradient_checkpointing
    _, got = _plain(ckpt, loss, v, m, t)
    _close(ref, got)


def _config(clip_dir, **sections):
    from xmodal.config import from_dict

    base = {"model": {"kind": "clip4clip", "encoder": f"hf:{clip_dir}", "sim_header": "seqTransf",
                      "temporal_layers": 1, "standardize": False},
            "data": {"max_frames": 4, "max_words": 16, "frame_pos": "uniform"},
            "optim": {"lr": 1e-3, "encoder_lr_scale": 0.1, "warmup_proportion": 0.1},
            "train": {"epochs": 2, "batch_size": 8, "eval_batch_size": 64, "checkpoint_minutes": 0},
            "test_time": {"bank_size": 16, "normalizers": ["none", "dn"]}}
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return from_dict(base)


def _splits():
    return {"train": split(32, size=SIZE, seed=1), "val": split(12, size=SIZE, seed=2),
            "test": split(12, size=SIZE, seed=3)}


def _weights(run):
    return torch.load(run / "model.pt", weights_only=True)["model"]["state_dict"]


def test_a_clip4clip_run_trains_saves_and_loads(clip_dir, tmp_path):
    from xmodal import load_model
    from xmodal.models.clip4clip import Clip4Clip, tokenize
    from xmodal.training.loop import train

    splits = _splits()
    summary = train(_config(clip_dir, train={"chunk_size": 3}), tmp_path / "run", splits=splits, progress=False,
                    verbose=False)
    assert set(summary["test"]) >= {"none", "dn"}
    model = load_model(tmp_path / "run")
    assert isinstance(model, Clip4Clip)
    before = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    from transformers import CLIPModel

    clip = CLIPModel.from_pretrained(str(clip_dir))
    trained = before["model"]["state_dict"]["video_tower.visual_projection.weight"]
    assert not torch.equal(trained, clip.visual_projection.weight)  # the encoder itself moved
    from transformers import CLIPProcessor

    ids = tokenize(splits["test"].captions, CLIPProcessor.from_pretrained(str(clip_dir)).tokenizer, 16)
    sim = model.similarity(ids, splits["test"].video, normalizer="none", video_mask=splits["test"].video_mask)
    assert sim.shape == (12, 12)

    # xmodal export: the towers + head (load_model gives the same scores) and DIR/encoder, usable as hf:DIR
    from xmodal.cli import main
    from xmodal.features.encoders import encode_text, identity_of

    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "exp")]) == 0
    again = load_model(tmp_path / "exp")
    assert torch.equal(again.similarity(ids, splits["test"].video, normalizer="none",
                                        video_mask=splits["test"].video_mask), sim)
    spec = f"hf:{tmp_path / 'exp' / 'encoder'}"
    feats = torch.from_numpy(encode_text(splits["test"].captions, model=spec))  # transformers' get_text_features
    assert torch.allclose(torch.nn.functional.normalize(feats, dim=-1), model.encode_text(ids), atol=1e-5)
    assert identity_of(spec, "text")["weights_sha256"] != identity_of(f"hf:{clip_dir}", "text")["weights_sha256"]


def test_two_learning_rates(clip_dir):
    from xmodal.training import finetune

    cfg = _config(clip_dir)
    model, _ = finetune.build(cfg)
    groups = finetune.param_groups(cfg, model, [])
    assert [g["lr_scale"] for g in groups] == [1.0, 0.1]
    head = {id(p) for p in model.video_tower.temporal.parameters()}
    assert {id(p) for p in groups[0]["params"]} == head
    assert len(groups[1]["params"]) == sum(1 for p in model.parameters() if id(p) not in head)


class Crash(Exception):
    pass


@pytest.mark.parametrize("extra", [{"train": {"chunk_size": 3}},
                                   {"train": {"precision": "bf16"}, "model": {"sim_header": "meanP"}}])
def test_midepoch_crash_then_resume_is_bit_identical(clip_dir, tmp_path, monkeypatch, extra):
    import xmodal.dist as dist
    from xmodal.training.loop import train

    full = _config(clip_dir, **extra)
    train(full, tmp_path / "full", splits=_splits(), progress=False, verbose=False)
    cfg = _config(clip_dir, **{**extra, "train": {**extra.get("train", {}), "checkpoint_minutes": 1e-9}})
    average, calls = dist.average_gradients, [0]

    def counting(params):
        calls[0] += 1
        if calls[0] == 6:  # inside epoch 2 (4 steps per epoch)
            raise Crash
        return average(params)

    with monkeypatch.context() as m:
        m.setattr(dist, "average_gradients", counting)
        with pytest.raises(Crash):
            train(cfg, tmp_path / "killed", splits=_splits(), progress=False, verbose=False)
    state = torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["state"]
    assert (state["epoch"], state["batch"]) == (1, 1)
    torch.manual_seed(99)
    train(cfg, tmp_path / "killed", splits=_splits(), progress=False, verbose=False)
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "killed")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_fp16_trains_with_a_grad_scaler(clip_dir, tmp_path):
    from xmodal.training import finetune
    from xmodal.training.loop import train

    cfg = _config(clip_dir, train={"precision": "fp16", "epochs": 1})
    assert finetune.grad_scaler(cfg, torch.device("cpu")) is not None
    summary = train(cfg, tmp_path / "run", splits=_splits(), progress=False, verbose=False)
    assert "scaler" in torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["state"]
    assert summary["epochs_run"] == 1


@pytest.mark.parametrize("override,match", [
    ({"model": {"encoder": "minilm"}}, "model.encoder: model.kind clip4clip needs hf:DIR"),
    ({"model": {"sim_header": "tight"}}, "model.sim_header"),
    ({"data": {"frame_pos": "middle"}}, "data.frame_pos"),
    ({"data": {"max_frames": 0}}, "data.max_frames"),
    ({"optim": {"encoder_lr_scale": 0}}, "optim.encoder_lr_scale"),
    ({"train": {"precision": "fp8"}}, "train.precision"),
    ({"train": {"chunk_size": -1}}, "train.chunk_size"),
    ({"model": {"hierarchy": True}}, "model.hierarchy"),
])
def test_config_errors_are_one_line(clip_dir, override, match):
    from xmodal.config import validate

    with pytest.raises(ValueError, match=match):
        validate(_config(clip_dir, **override))


def test_features_are_refused_for_clip4clip(clip_dir, tmp_path):
    from xmodal.data import PairedSplit
    from xmodal.training.loop import train

    import numpy as np

    feats = PairedSplit.from_arrays(video=np.ones((4, 3, 8)), text=np.ones((4, 2)), text_to_video=[0, 1, 2, 3],
                                    captions=["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="clip4clip trains on frames"):
        train(_config(clip_dir), tmp_path / "r", splits={"train": feats, "val": feats}, progress=False, verbose=False)
