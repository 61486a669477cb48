"""It learns: a tiny random-init CLIP fine-tuned end to end (``model.kind: clip4clip``, meanP, every encoder
weight at ``optim.lr``) beats a head trained on the same model's frozen features by a wide margin.

The task is one frozen random features cannot separate: a square of a random colour fills one cell of a
4 x 4 grid (one 8 x 8 ViT patch of a 32 x 32 frame) and the caption names the cell ("row 1 col 2"), not the
colour. A random ViT's pooled output is close to a sum of per-patch terms, so where the square sits barely
changes it and the colour dominates; fine-tuning can learn position-dependent features (DN Sec. 4.6.2 and
NCL Appendix B fine-tune the encoder for this reason). Test t2v R@1 over the 16 cells, one video each.

Measured (seed 0, this command; the frozen head is ``model.kind: meanp`` + an MLP text head on the initial
model's frame and caption embeddings, trained for twice the epochs):
``PYTHONPATH=src pytest tests/test_clip4clip_learns.py -s``: fine-tuned 68.75, frozen 31.25. With the CLIP's
seed 1 and 2 (same split): 100.0 vs 25.0 both times. The assert asks for a 25-point margin.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_tiny import save_clip

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
SIZE, GRID, FRAMES, EPOCHS = 32, 4, 2, 20
COLOURS = [(230, 30, 30), (30, 200, 40), (40, 60, 230), (230, 220, 40)]


def _video(row: int, col: int, rng: np.random.Generator) -> np.ndarray:
    """``[FRAMES, SIZE * SIZE * 3]`` uint8: a square of a random colour in cell (row, col), on lightly noisy grey."""
    cell = SIZE // GRID
    colour = COLOURS[int(rng.integers(len(COLOURS)))]
    out = np.empty((FRAMES, SIZE, SIZE, 3), np.uint8)
    for f in range(FRAMES):
        img = rng.integers(110, 130, size=(SIZE, SIZE, 3)).astype(np.uint8)
        img[row * cell:(row + 1) * cell, col * cell:(col + 1) * cell] = colour
        out[f] = img
    return out.reshape(FRAMES, -1)


def _split(cells: list, seed: int):
    from xmodal.data import PairedSplit

    rng = np.random.default_rng(seed)
    video = np.stack([_video(r, c, rng) for r, c in cells])
    captions = [f"row {r} col {c}" for r, c in cells]
    return PairedSplit(video=video, text=np.zeros((len(captions), 1), np.float32),
                       text_to_video=np.arange(len(captions)), video_mask=np.ones(video.shape[:2], bool),
                       captions=captions)


def _splits():
    cells = [(r, c) for r in range(GRID) for c in range(GRID)]
    pick = np.random.default_rng(1).integers(len(cells), size=1024)
    return {"train": _split([cells[i] for i in pick], 1), "val": _split(cells, 2), "test": _split(cells, 3)}


def _frozen_features(cfg, splits):
    """Every split embedded by the initial (never trained) model: frame embeddings and caption embeddings."""
    from xmodal.data import PairedSplit
    from xmodal.models.clip4clip import tokenize
    from xmodal.training import finetune

    model, proc = finetune.build(cfg)
    model.eval()
    out = {}
    with torch.no_grad():
        for name, s in splits.items():
            v, m = model.video_tower.frame_embeddings(torch.from_numpy(s.video), torch.from_numpy(s.video_mask))
            t = model.text_tower(torch.from_numpy(tokenize(s.captions, proc.tokenizer, 16)))
            out[name] = PairedSplit.from_arrays(video=v, text=t, text_to_video=s.text_to_video, video_mask=m)
    return out


def test_finetuning_beats_a_head_on_frozen_features(tmp_path):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    clip_dir = save_clip(tmp_path / "clip", seed=0, image_size=SIZE, projection_dim=32)
    splits = _splits()
    common = {"loss": {"temperature": 0.05}, "test_time": {"bank_size": 16, "normalizers": ["none"]}}
    cfg = from_dict({**common,
                     "model": {"kind": "clip4clip", "encoder": f"hf:{clip_dir}", "sim_header": "meanP",
                               "standardize": False},
                     "data": {"max_frames": FRAMES, "max_words": 16, "frame_pos": "uniform"},
                     "optim": {"lr": 1e-3, "encoder_lr_scale": 1.0, "warmup_proportion": 0.1},
                     "train": {"epochs": EPOCHS, "batch_size": 32, "eval_batch_size": 64, "patience": 0, "seed": 0,
                               "checkpoint_minutes": 0}})
    head = from_dict({**common,
                      "model": {"kind": "meanp", "dim": 32, "hidden": 64, "heads": 4, "layers": 2, "text_kind": "mlp"},
                      "optim": {"lr": 1e-3},
                      "train": {"epochs": 2 * EPOCHS, "batch_size": 32, "patience": 0, "seed": 0,
                                "checkpoint_minutes": 0}})
    frozen = train(head, tmp_path / "frozen", splits=_frozen_features(cfg, splits), resume=False, progress=False,
                   verbose=False)["test"]["none"]["t2v"]["R@1"]
    tuned = train(cfg, tmp_path / "tuned", splits=splits, resume=False, progress=False,
                  verbose=False)["test"]["none"]["t2v"]["R@1"]
    print(f"test t2v R@1: fine-tuned {tuned:.2f}, head on frozen features {frozen:.2f}")
    assert tuned >= frozen + 25.0, (tuned, frozen)
