"""GPU benchmarks: xmodal on CUDA tensors against bare references timed in the same run.

    python bench/bench_gpu.py                 # full sizes (needs a CUDA GPU; minutes)
    python bench/bench_gpu.py --quick         # small sizes (seconds)
    python bench/bench_gpu.py --only streaming,sinkhorn,losses

(streaming) ``streaming_retrieval`` on N x N (256-d, float32) vs the bare block-wise matmul with the
            same block size (the score matrix is never held whole: 1M x 1M is 4 TB in float32);
(sinkhorn)  ``SinkhornBias.fit`` (blockwise log-domain, K bank queries x N gallery) vs a dense
            log-domain Sinkhorn written inline (materialises the K x N matrix);
(losses)    forward + backward of each loss at B x D vs an inline CLIP loss (F.cross_entropy both ways);
(amp)       the trainer's training loop (train.amp, bf16 autocast) vs a bare loop, same model/batches.
On a machine without CUDA it prints one line and exits 0 (``--amp-cpu-dry-run`` checks (amp) on CPU).
Timings: CUDA-synchronised wall clock, best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from xmodal.losses import build_loss  # noqa: E402
from xmodal.metrics import streaming_retrieval  # noqa: E402
from xmodal.metrics.streaming import MAX_BLOCK_SCORES  # noqa: E402
from xmodal.normalize import SinkhornBias  # noqa: E402


def timed(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best, out


def unit(n, d, seed, dev):
    g = torch.Generator(device=dev).manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g, device=dev), dim=1)


def bench_streaming(n: int, d: int, repeat: int) -> None:
    dev = torch.device("cuda")
    gal = unit(n, d, 1, dev)
    q = F.normalize(gal + 1.5 * unit(n, d, 0, dev), dim=1)
    pos = torch.arange(n, device=dev)
    b = max(1, MAX_BLOCK_SCORES // n)

    def bare():
        acc = torch.zeros((), device=dev)
        for s in range(0, n, b):
            acc += (q[s:s + b] @ gal.T)[:, 0].sum()  # touch the block so it is not skipped
        return acc

    t_ref, _ = timed(bare, repeat)
    t_ours, res = timed(lambda: streaming_retrieval(q, gal, pos, block_size=b), repeat)
    print(f"(streaming) {n:,} x {n:,}, {d}-d, blocks of {b} rows: xmodal {t_ours:.2f} s | bare block matmul "
          f"{t_ref:.2f} s -> {t_ours / t_ref:.2f}x | R@1 {res['R@1']:.3f} | peak GPU memory "
          f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)


def dense_log_sinkhorn(sim: torch.Tensor, temperature: float, iters: int) -> torch.Tensor:
    """Inline reference: uniform marginals, biases of the gallery (columns) after ``iters`` rounds."""
    k, n = sim.shape
    logits = sim / temperature
    a = torch.zeros(k, 1, device=sim.device, dtype=sim.dtype)
    b = torch.zeros(1, n, device=sim.device, dtype=sim.dtype)
    for _ in range(iters):
        a = -torch.logsumexp(logits + b, dim=1, keepdim=True) - torch.log(torch.tensor(float(k)))
        b = -torch.logsumexp(logits + a, dim=0, keepdim=True) - torch.log(torch.tensor(float(n)))
    return b[0] * temperature


def bench_sinkhorn(k: int, n: int, d: int, repeat: int) -> None:
    dev = torch.device("cuda")
    bank, gal = unit(k, d, 3, dev), unit(n, d, 4, dev)
    t_ref, ref = timed(lambda: dense_log_sinkhorn(bank @ gal.T, 0.05, 4), repeat)
    t_ours, norm = timed(lambda: SinkhornBias(temperature=0.05, iters=4).fit(bank, gal), repeat)
    bias = norm.bias
    diff = float(((bias - bias.mean()) - (ref - ref.mean())).abs().max())
    print(f"(sinkhorn) K {k:,} x N {n:,}, {d}-d, 4 iterations: xmodal {t_ours:.3f} s | dense inline "
          f"{t_ref:.3f} s -> {t_ref / t_ours:.2f}x faster | max bias difference (up to a constant) {diff:.1e}",
          flush=True)


def clip_loss(v, t, temperature):
    logits = F.normalize(v, dim=1) @ F.normalize(t, dim=1).T / temperature
    labels = torch.arange(v.shape[0], device=v.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def bench_losses(b: int, d: int, repeat: int) -> None:
    dev = torch.device("cuda")
    v0, t0 = unit(b, d, 5, dev), unit(b, d, 6, dev)
    vin, tin = unit(b, 2 * d, 7, dev), unit(b, d, 8, dev)

    def step(fn):
        v = v0.clone().requires_grad_(True)
        t = t0.clone().requires_grad_(True)
        fn(v, t).backward()
        return v.grad

    t_ref, _ = timed(lambda: step(lambda v, t: clip_loss(v, t, 0.05)), repeat)
    print(f"(losses) B {b}, D {d}, forward + backward, float32: inline CLIP loss {1000 * t_ref:.2f} ms", flush=True)
    for name in ("infonce", "ntxent", "maxmargin", "milnce", "dcl", "crossclr", "ncl"):
        loss = build_loss(name).to(dev)
        extra = {"video_input": vin, "text_input": tin} if name == "crossclr" else {}
        t_ours, _ = timed(lambda: step(lambda v, t: loss(v, t, **extra)), repeat)
        print(f"  {name:10s} {1000 * t_ours:8.2f} ms  {t_ours / t_ref:5.2f}x the inline CLIP loss", flush=True)


def bench_amp_epoch(num_train: int, epochs: int, device: str) -> None:
    """The trainer's training loop (``train.amp: true``, bf16 autocast on CUDA) against a
    bare loop with the same model, loss, optimiser, batches and autocast: the trainer's
    ``train_time_s`` (training steps only, no evaluation) / the bare loop's time, per epoch."""
    import json
    import tempfile

    import numpy as np

    from xmodal.config import from_dict
    from xmodal.training.loop import train
    from xmodal.training.loop import load_splits
    from xmodal.training.parts import build_loss_from_config, make_optimizer
    from xmodal.training.sampling import epoch_batches
    from xmodal.models import build_model

    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": num_train, "num_val": 500, "num_test": 500}},
        "model": {"kind": "mlp", "dim": 256},
        "loss": {"name": "infonce", "temperature": 0.05},
        "optim": {"name": "adam", "lr": 1e-3, "warmup_epochs": 0},
        "test_time": {"normalizers": ["none"]},
        "train": {"seed": 0, "epochs": epochs, "batch_size": 512, "patience": 0, "progress": False,
                  "device": device, "amp": True},
    })
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as out:
        train(cfg, out, resume=False)
        t_trainer = json.loads((Path(out) / "metrics.json").read_text())["train_time_s"]
    split = load_splits(cfg)["train"]
    torch.manual_seed(0)
    model = build_model(video_dim=split.video.shape[-1], text_dim=split.text.shape[-1], kind="mlp",
                        dim=256, temperature=0.05).to(dev)
    loss_fn = build_loss_from_config(cfg).to(dev)
    params = [p for p in list(model.parameters()) + list(loss_fn.parameters()) if p.requires_grad]
    opt = make_optimizer(cfg, params)
    video = torch.as_tensor(np.asarray(split.video, dtype=np.float32))
    text = torch.as_tensor(np.asarray(split.text, dtype=np.float32))
    t2v = split.text_to_video
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    sync()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        for batch in epoch_batches(epoch, seed=0, text_to_video=t2v, batch_size=512, sampling=cfg.train.sampling,
                                   captions_per_video=cfg.train.captions_per_video):
            v_in, t_in = video[t2v[batch]].to(dev), text[batch].to(dev)
            with amp:
                v, t = model.forward_video(v_in, None), model.forward_text(t_in)
            loss = loss_fn(v.float(), t.float())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    sync()
    t_bare = time.perf_counter() - t0
    print(f"(amp) training loop, {num_train:,} synthetic pairs x {epochs} epochs, mlp 256-d, InfoNCE, batch 512, "
          f"{device}: trainer {t_trainer / epochs:.3f} s/epoch | bare loop {t_bare / epochs:.3f} s/epoch -> "
          f"{t_trainer / t_bare:.2f}x (goal <= 1.1)", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", default="streaming,sinkhorn,losses,amp")
    p.add_argument("--n", type=int, default=None, help="streaming size N (default 1,000,000; quick 50,000)")
    p.add_argument("--amp-cpu-dry-run", action="store_true",
                   help="run only the (amp) comparison on the CPU (no autocast), to check the script")
    args = p.parse_args(argv)
    if args.amp_cpu_dry_run:
        bench_amp_epoch(2000, 1, "cpu")
        return 0
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; nothing to measure (skipped: streaming, sinkhorn, losses, amp)")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    only = set(args.only.split(","))
    if "streaming" in only:
        bench_streaming(args.n or (50_000 if args.quick else 1_000_000), 256, 1 if not args.quick else args.repeat)
    if "sinkhorn" in only:
        bench_sinkhorn(*((4096, 10_000) if args.quick else (16_384, 100_000)), 256, args.repeat)
    if "losses" in only:
        bench_losses(*((1024, 256) if args.quick else (8192, 512)), args.repeat)
    if "amp" in only:
        bench_amp_epoch(20_000 if args.quick else 200_000, 2, "cuda")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
