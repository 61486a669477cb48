"""``model.kind: clip4clip`` from a SigLIP folder (issue 41.2, "SigLIP where it fits"): the towers are SigLIP's
own, so before any training the text tower equals ``xmodal encode text`` with the same ``hf:`` folder (the
library's ``get_text_features`` through its processor), a one-frame video equals ``get_image_features`` of
the processor's pixels, seqTransf starts from SigLIP's text positions and blocks, the trained towers round
trip through a ``SiglipModel``, and one epoch of the one loop runs. A tiny random SigLIP saved by the test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_tiny import save_clip, save_siglip

pytest.importorskip("transformers")
S = 32  # the tiny SigLIP's image_size
CAPTIONS = ["a red box moves left", "two", "a caption long enough to be cut at sixteen tokens"]


@pytest.fixture(scope="module")
def siglip(tmp_path_factory):
    return save_siglip(tmp_path_factory.mktemp("siglip") / "s")


def _frames(n, f, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, f, S * S * 3), dtype=np.uint8)


def test_text_tower_is_encode_text_of_the_same_folder(siglip):
    from xmodal.features.encoders import encode_text
    from xmodal.models.clip4clip import build_clip4clip, tokenize

    model, proc = build_clip4clip(f"hf:{siglip}", max_words=16, max_frames=4)
    model.eval()
    with torch.no_grad():
        got = model.text_tower(torch.from_numpy(tokenize(CAPTIONS, proc.tokenizer, 16))).numpy()
    ref = encode_text(CAPTIONS, model=f"hf:{siglip}", progress=False)  # processor + get_text_features
    assert got.shape == ref.shape == (3, 32)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_video_tower_is_the_mean_of_get_image_features(siglip):
    from PIL import Image
    from transformers import SiglipModel

    from xmodal.models.clip4clip import build_clip4clip

    model, proc = build_clip4clip(f"hf:{siglip}", max_words=16, max_frames=4)
    model.eval()
    frames = _frames(2, 3)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    with torch.no_grad():
        got = model.video_tower(torch.from_numpy(frames), mask).numpy()
    ref_model = SiglipModel.from_pretrained(str(siglip), local_files_only=True).eval()
    for i, n in enumerate((3, 2)):
        images = [Image.fromarray(frames[i, j].reshape(S, S, 3)) for j in range(n)]
        pixels = proc.image_processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            out = ref_model.get_image_features(pixel_values=pixels)
        emb = getattr(out, "pooler_output", out)
        want = torch.nn.functional.normalize(emb, dim=-1).mean(0).numpy()  # meanP: the mean of unit frames
        np.testing.assert_allclose(got[i], want, atol=1e-5, rtol=1e-5)


def test_seqtransf_starts_from_siglip_s_text_blocks(siglip):
    from transformers import SiglipModel

    from xmodal.models.clip4clip import build_clip4clip

    model, _ = build_clip4clip(f"hf:{siglip}", sim_header="seqTransf", temporal_layers=1, max_words=16, max_frames=4)
    ref = SiglipModel.from_pretrained(str(siglip), local_files_only=True).text_model
    head = model.video_tower.temporal
    assert torch.equal(head.position.weight, ref.embeddings.position_embedding.weight)
    mine, theirs = head.blocks[0].state_dict(), ref.encoder.layers[0].state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    with torch.no_grad():  # it runs, and padded frames change nothing
        frames, mask = torch.from_numpy(_frames(2, 3)), torch.tensor([[True, True, False], [True, False, False]])
        a = model.video_tower(frames, mask)
        junk = frames.clone()
        junk[~mask] = 7
        assert torch.allclose(a, model.video_tower(junk, mask), atol=1e-6)


def test_trained_towers_round_trip_through_a_siglipmodel(siglip):
    from transformers import SiglipModel

    from xmodal.models.clip4clip import build_clip4clip, tokenize

    model, proc = build_clip4clip(f"hf:{siglip}", max_words=16, max_frames=4, freeze_layers=1)
    assert all(p.requires_grad for n, p in model.named_parameters() if ".head." in n)  # the pooling heads train
    assert not any(p.requires_grad for n, p in model.named_parameters() if "encoder.layers.0." in n)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # "trained": no longer the base weights
    clip = model.clip_model()
    assert isinstance(clip, SiglipModel)
    model.eval()
    clip.eval()
    ids = tokenize(CAPTIONS, proc.tokenizer, 16)
    real = ids >= 0
    with torch.no_grad():
        out = clip.get_text_features(input_ids=torch.from_numpy(np.where(real, ids, proc.tokenizer.pad_token_id)),
                                     attention_mask=torch.from_numpy(real.astype(np.int64)))
        want = getattr(out, "pooler_output", out)
        assert torch.allclose(model.text_tower(torch.from_numpy(ids)), want, atol=1e-6)


def test_one_epoch_of_the_loop_and_a_clip_is_still_a_clip(siglip, tmp_path):
    import csv

    from xmodal.config import from_dict
    from xmodal.data.importer import import_pairs
    from xmodal.models.clip4clip import build_clip4clip
    from xmodal.training.loop import train

    store = tmp_path / "fr"
    store.mkdir()
    rows = []
    for i in range(8):
        np.save(store / f"c{i}.npy", _frames(1, 2 + i % 3, seed=i)[0])
        rows.append((f"c{i}", CAPTIONS[i % 3] + f" {i}", "train" if i < 6 else "val"))
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        csv.writer(f).writerows([("video_id", "caption", "split"), *rows])
    np.save(tmp_path / "text.npy", np.zeros((8, 2), np.float32))
    import_pairs(tmp_path / "pairs.csv", features=store, out=tmp_path / "data", text_features=tmp_path / "text.npy")
    cfg = from_dict({"data": {"name": "paired", "root": str(tmp_path / "data"), "max_frames": 4, "max_words": 16},
                     "model": {"kind": "clip4clip", "encoder": f"hf:{siglip}", "standardize": False},
                     "train": {"epochs": 1, "batch_size": 3}, "test_time": {"normalizers": ["none"], "bank_size": 4}})
    summary = train(cfg, tmp_path / "run", progress=False, verbose=False)
    assert summary["epochs_run"] == 1 and np.isfinite(summary["val"]["none"]["t2v"]["MnR"])
    # xmodal export: DIR/encoder is a SiglipModel folder again, its get_text_features the run's text tower
    from xmodal import load_model
    from xmodal.cli import main
    from xmodal.features.encoders import encode_text
    from xmodal.models.clip4clip import tokenize

    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "exp")]) == 0
    run = load_model(tmp_path / "run")
    spec = f"hf:{tmp_path / 'exp' / 'encoder'}"
    feats = torch.from_numpy(encode_text(CAPTIONS, model=spec, progress=False))
    _, proc = build_clip4clip(f"hf:{siglip}", max_words=16)
    ids = tokenize(CAPTIONS, proc.tokenizer, 16)
    assert torch.allclose(torch.nn.functional.normalize(feats, dim=-1), run.encode_text(ids), atol=1e-5)
    clip_model, _ = build_clip4clip(f"hf:{save_clip(tmp_path / 'clip', image_size=S)}", max_words=16)
    assert type(clip_model.clip_model()).__name__ == "CLIPModel"


def test_another_model_type_is_one_line(tmp_path):
    import json

    from xmodal.models.clip4clip import build_clip4clip

    folder = save_siglip(tmp_path / "s")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "bert"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model.encoder: .*clip4clip fine-tunes a CLIPModel or a SiglipModel|"
                                         "model.encoder: .*unreadable config.json"):
        build_clip4clip(f"hf:{folder}", max_words=16)
