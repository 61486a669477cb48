"""``index --run`` / ``query`` / ``serve`` on a ``model.kind: clip4clip`` run: queries go through the run's own
fine-tuned text tower (its identity, never the base model's): the query embeddings equal that tower's output on
the captions tokenised independently, differ from the base CLIP's, and a base-model text encoder is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_tiny import save_clip
from videos_tiny import split

pytest.importorskip("transformers")
pytest.importorskip("faiss")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = 16


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.retrieval.build import write_index
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("c4cidx")
    clip_dir = save_clip(root / "clip", seed=5, image_size=SIZE, projection_dim=32)
    cfg = from_dict({"model": {"kind": "clip4clip", "encoder": f"hf:{clip_dir}", "sim_header": "meanP",
                               "standardize": False},
                     "data": {"max_frames": 4, "max_words": 16, "frame_pos": "uniform"},
                     "optim": {"lr": 1e-3, "encoder_lr_scale": 1.0},
                     "train": {"epochs": 2, "batch_size": 8, "eval_batch_size": 64, "checkpoint_minutes": 0,
                               "patience": 0},
                     "test_time": {"bank_size": 8, "normalizers": ["none"]}})
    splits = {"train": split(24, size=SIZE, seed=1), "val": split(8, size=SIZE, seed=2),
              "test": split(8, size=SIZE, seed=3)}
    run = root / "run"
    train(cfg, run, splits=splits, resume=False, progress=False, verbose=False)
    gallery = splits["test"]
    write_index(str(run), gallery.video, root / "index", video_mask=gallery.video_mask, normalizer="none")
    return clip_dir, run, root / "index", gallery


def _tower(model, clip_dir, captions):
    """The reference: the captions tokenised by the base folder's own CLIPProcessor (start, text, end, padded
    with the end id as CLIP does), through ``model``'s text tower, unit length."""
    from transformers import CLIPProcessor

    tok = CLIPProcessor.from_pretrained(str(clip_dir), local_files_only=True).tokenizer
    ids = [tok(c)["input_ids"][:16] for c in captions]
    width = max(map(len, ids))
    batch = torch.tensor([i + [-1] * (width - len(i)) for i in ids])
    with torch.no_grad():
        out = model.text_tower(batch)
    return torch.nn.functional.normalize(out, dim=-1).numpy()


def test_queries_go_through_the_runs_fine_tuned_text_tower(built):
    from xmodal import load_model
    from xmodal.retrieval.search import SearchIndex

    clip_dir, run, index, gallery = built
    idx = SearchIndex(index)
    assert idx.text_encoder()["spec"] == "run"
    captions = ["red box left", "gold bar up"]
    got = idx.model.encode_text(idx.encode_captions(captions)).numpy()
    tuned = load_model(str(run))
    np.testing.assert_allclose(got, _tower(tuned, clip_dir, captions), atol=1e-5)
    base = load_model(str(run))
    from xmodal.models.clip4clip import build_clip4clip

    fresh, _ = build_clip4clip(f"hf:{clip_dir}", sim_header="meanP", max_frames=4, frame_pos="uniform", max_words=16)
    base.text_tower.load_state_dict(fresh.text_tower.state_dict())
    assert np.abs(got - _tower(base, clip_dir, captions)).max() > 1e-3  # the base model's tower answers otherwise


def test_a_query_finds_its_video_through_the_search_path(built):
    from xmodal.retrieval.search import SearchIndex
    from xmodal.serve.searcher import Searcher

    clip_dir, run, index, gallery = built
    idx = SearchIndex(index)
    feats = idx.encode_captions(gallery.captions)
    scores, items = idx.search(feats, 3)
    video = idx.model.encode_video(gallery.video, gallery.video_mask).numpy()
    text = idx.model.encode_text(feats).numpy()
    want = np.argsort(-(text @ video.T), axis=1, kind="stable")[:, 0]
    np.testing.assert_array_equal(items[:, 0], want)  # the run's own similarities, ranked by the index
    answer = Searcher(index).search(gallery.captions[0], 3)
    assert answer["results"][0]["item"] == int(want[0]) and answer["text_encoder"]["spec"] == "run"


def test_a_base_model_encoder_is_refused(built):
    from xmodal.retrieval.build import write_index
    from xmodal.retrieval.search import SearchIndex
    from xmodal.serve.searcher import Searcher

    clip_dir, run, index, gallery = built
    with pytest.raises(ValueError, match="fine-tuned its CLIP text tower"):
        SearchIndex(index).encode_captions(["red box left"], text_encoder=f"hf:{clip_dir}")
    with pytest.raises(ValueError, match="fine-tuned its CLIP text tower"):
        Searcher(index, text_encoder=f"hf:{clip_dir}")
    with pytest.raises(ValueError, match="fine-tuned its CLIP text tower"):
        write_index(str(run), gallery.video, index.parent / "other", video_mask=gallery.video_mask,
                    normalizer="none", text_encoder=f"hf:{clip_dir}")
