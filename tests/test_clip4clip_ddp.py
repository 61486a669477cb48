"""``model.kind: clip4clip`` under 2-process gloo DDP equals one process: each rank embeds its half of every
batch's frames and captions, the loss all-gathers the embeddings with their gradients, the gradients are
averaged over ranks; after one epoch every weight of the fine-tuned CLIP towers (and the learnable
temperature) equals the single-process run on the whole batches, with plain back-propagation and with
gradient caching (``train.chunk_size``, Gao et al. 2021, Sec. 3.2) on each rank's rows."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

from conftest import mark_done, spawn_gloo
from hf_tiny import save_clip
from videos_tiny import split

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = 16
STEP = 1e-3 * 0.5  # optim.lr x optim.encoder_lr_scale: the largest change of an encoder weight per step


def _config(clip_dir, chunk_size):
    from xmodal.config import from_dict

    return from_dict({
        "model": {"kind": "clip4clip", "encoder": f"hf:{clip_dir}", "sim_header": "seqTransf",
                  "temporal_layers": 1, "standardize": False},
        "data": {"max_frames": 4, "max_words": 16, "frame_pos": "uniform"},
        "loss": {"name": "infonce", "temperature": 0.1, "learnable": True},
        "optim": {"lr": 1e-3, "encoder_lr_scale": 0.5, "warmup_proportion": 0.1},
        "train": {"epochs": 1, "batch_size": 8, "eval_batch_size": 64, "checkpoint_minutes": 0, "seed": 2,
                  "patience": 0, "device": "cpu", "chunk_size": chunk_size},
        "test_time": {"bank_size": 8, "normalizers": ["none"]}})


def _splits():
    return {"train": split(24, size=SIZE, seed=1), "val": split(8, size=SIZE, seed=2),
            "test": split(8, size=SIZE, seed=3)}


def _weights(run):
    return torch.load(run / "model.pt", weights_only=True)["model"]["state_dict"]


def _worker(rank: int, init_file: str, clip_dir: str, out: str, chunk_size: int) -> None:
    from xmodal.training.loop import train

    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        train(_config(clip_dir, chunk_size), out, splits=_splits(), resume=False, progress=False, verbose=False)
        mark_done(init_file, rank)
        tdist.barrier()  # tear down only when both ranks are done (gloo aborts otherwise)
    finally:
        tdist.destroy_process_group()


@pytest.mark.parametrize("chunk_size", [0, 3])
def test_two_process_clip4clip_equals_single_process(tmp_path, chunk_size):
    from xmodal.training.loop import train

    if not tdist.is_available():
        pytest.skip("torch.distributed unavailable")
    clip_dir = save_clip(tmp_path / "clip", seed=5, image_size=SIZE, projection_dim=32)
    single = tmp_path / "single"
    train(_config(clip_dir, 0), single, splits=_splits(), resume=False, progress=False, verbose=False)
    ddp = tmp_path / "ddp"
    spawn_gloo(_worker, 2, str(tmp_path / "init"), str(clip_dir), str(ddp), chunk_size)
    a, b = _weights(single), _weights(ddp)
    assert a.keys() == b.keys()
    assert any("vision_model" in k for k in a)  # the encoder itself was trained and saved
    # Adam divides by sqrt(v): an entry whose gradient is ~0 moves by float noise scaled up to a fraction of a
    # step, so weights agree to 1% of one encoder step. A key bias adds q.b to every logit of a query; softmax
    # ignores it, its gradient is 0 up to noise that Adam scales to whole steps: those entries are left out.
    noise = [k for k in a if k.endswith("k_proj.bias")]
    assert noise
    bad = [(k, float((a[k] - b[k]).abs().max())) for k in a if k not in noise
           and not torch.allclose(a[k], b[k], rtol=1e-5, atol=STEP / 100)]
    assert not bad, bad
    la = torch.load(single / "checkpoint.pt", weights_only=True)["loss"]
    lb = torch.load(ddp / "checkpoint.pt", weights_only=True)["loss"]
    for k in la:
        torch.testing.assert_close(la[k], lb[k], rtol=1e-5, atol=1e-6)
