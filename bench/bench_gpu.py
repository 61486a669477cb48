"""GPU benchmarks: xmodal on CUDA tensors against bare references timed in the same run.

    python bench/bench_gpu.py                 # full sizes (needs a CUDA GPU; minutes)
    python bench/bench_gpu.py --quick         # small sizes (seconds)
    python bench/bench_gpu.py --only streaming,sinkhorn,losses
    python bench/bench_gpu.py --device cpu --only losses --quick   # check a section on the CPU

(streaming) ``streaming_retrieval`` on N x N (256-d, float32) vs the bare block-wise matmul with the
            same block size (the score matrix is never held whole: 1M x 1M is 4 TB in float32);
(sinkhorn)  ``SinkhornBias.fit`` (blockwise log-domain, K bank queries x N gallery) vs a dense
            log-domain Sinkhorn written inline (materialises the K x N matrix);
(losses)    forward + backward of each loss (``build_loss(name)``, its defaults) at B x D against ITS OWN
            inline reference (plain torch, the same math and hyper-parameters; checked equal in float64,
            value and gradient, before timing) and against an inline CLIP loss (F.cross_entropy both ways);
(amp)       the trainer's training loop (train.amp, bf16 autocast) vs a bare loop, same model/batches.
With ``--device cuda`` (default) on a machine without CUDA it prints one line and exits 0;
``--device cpu`` runs the chosen sections on the CPU (ratios there are not the GPU goal;
``--amp-cpu-dry-run`` checks (amp) on CPU). Timings: wall clock (CUDA-synchronised), best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import math
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


def sync(dev=None) -> None:
    """Wait for queued CUDA work (a no-op on the CPU)."""
    if torch.device(dev or "cuda").type == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeat: int, dev=None):
    best, out = float("inf"), None
    for _ in range(repeat):
        sync(dev)
        t = time.perf_counter()
        out = fn()
        sync(dev)
        best = min(best, time.perf_counter() - t)
    return best, out


def timed_interleaved(fns, repeat: int, dev=None) -> list[float]:
    """Best-of-``repeat`` times of several functions, measured in alternation (round r times each
    once), so that a load change on a shared machine hits all of them alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], timed(fn, 1, dev)[0])
    return best


def unit(n, d, seed, dev):
    g = torch.Generator(device=dev).manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g, device=dev), dim=1)


def bench_streaming(n: int, d: int, repeat: int, dev: torch.device) -> None:
    gal = unit(n, d, 1, dev)
    q = F.normalize(gal + 1.5 * unit(n, d, 0, dev), dim=1)
    pos = torch.arange(n, device=dev)
    b = max(1, MAX_BLOCK_SCORES // n)

    def bare():
        acc = torch.zeros((), device=dev)
        for s in range(0, n, b):
            acc += (q[s:s + b] @ gal.T)[:, 0].sum()  # touch the block so it is not skipped
        return acc

    t_ref, _ = timed(bare, repeat, dev)
    t_ours, res = timed(lambda: streaming_retrieval(q, gal, pos, block_size=b), repeat, dev)
    peak = (f" | peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if dev.type == "cuda" else "")
    print(f"(streaming) {n:,} x {n:,}, {d}-d, {dev.type}, blocks of {b} rows: xmodal {t_ours:.2f} s | bare block "
          f"matmul {t_ref:.2f} s -> {t_ours / t_ref:.2f}x | R@1 {res['R@1']:.3f}{peak}", flush=True)


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


def bench_sinkhorn(k: int, n: int, d: int, repeat: int, dev: torch.device) -> None:
    bank, gal = unit(k, d, 3, dev), unit(n, d, 4, dev)
    t_ref, ref = timed(lambda: dense_log_sinkhorn(bank @ gal.T, 0.05, 4), repeat, dev)
    t_ours, norm = timed(lambda: SinkhornBias(temperature=0.05, iters=4).fit(bank, gal), repeat, dev)
    bias = norm.bias
    diff = float(((bias - bias.mean()) - (ref - ref.mean())).abs().max())
    print(f"(sinkhorn) K {k:,} x N {n:,}, {d}-d, {dev.type}, 4 iterations: xmodal {t_ours:.3f} s | dense inline "
          f"{t_ref:.3f} s -> {t_ref / t_ours:.2f}x faster | max bias difference (up to a constant) {diff:.1e}",
          flush=True)


def clip_loss(v, t, temperature):
    logits = F.normalize(v, dim=1) @ F.normalize(t, dim=1).T / temperature
    labels = torch.arange(v.shape[0], device=v.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


# --- (losses) inline references ------------------------------------------------------------
# One per loss, plain torch, no xmodal import: the minimal vectorised code for the same math
# with the hyper-parameters ``build_loss(name)`` uses (its defaults). ``v``, ``t``: embeddings
# [B, D] (normalised here, as the losses do); ``vin``, ``tin``: CrossCLR's frozen input features.
# tests/test_bench_gpu_refs.py checks each against the xmodal loss (value and gradient, float64).

def ref_infonce(v, t, vin=None, tin=None, tau=0.05):
    """InfoNCE = the CLIP loss (tau 0.05)."""
    return clip_loss(v, t, tau)


def ref_ntxent(v, t, vin=None, tin=None, tau=0.05):
    """NT-Xent over z = [v; t] (2B anchors): positive = the other view, all other 2B - 2 items negatives."""
    z = F.normalize(torch.cat([v, t]), dim=1)
    n = v.shape[0]
    logits = (z @ z.T / tau).masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    labels = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z.device)
    return F.cross_entropy(logits, labels)


def ref_maxmargin(v, t, vin=None, tin=None, margin=0.2):
    """Bidirectional hinge, mean over the B - 1 negatives of each anchor, then anchors, then directions."""
    s = F.normalize(v, dim=1) @ F.normalize(t, dim=1).T  # s[i, j] = <v_i, t_j>
    pos = s.diagonal()
    off = ~torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
    h_v2t = (s - pos[:, None] + margin).clamp_min(0)  # video anchor i (row) vs texts j
    h_t2v = (s - pos[None, :] + margin).clamp_min(0)  # text anchor j (column) vs videos i
    n = s.shape[0]
    return ((h_v2t * off).sum() + (h_t2v * off).sum()) / (2 * n * (n - 1))


def ref_milnce(v, t, vin=None, tin=None, tau=0.05, positives=None):
    """MIL-NCE: -log sum_{P_i} e^{s/tau} / sum_k e^{s/tau}, both directions; P = identity without ids."""
    logits = F.normalize(v, dim=1) @ F.normalize(t, dim=1).T / tau
    if positives is None:
        positives = torch.eye(v.shape[0], dtype=torch.bool, device=v.device)
    out = 0.0
    for lg in (logits, logits.T):
        out = out + (torch.logsumexp(lg, 1) - torch.logsumexp(lg.masked_fill(~positives, float("-inf")), 1)).mean()
    return out / 2


def ref_dcl(v, t, vin=None, tin=None, tau=0.05, tau_plus=0.1):
    """Debiased contrastive (Chuang et al. 2020, official code's Ng with its clamp), both directions."""
    logits = F.normalize(v, dim=1) @ F.normalize(t, dim=1).T / tau
    n = logits.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=logits.device)
    out = 0.0
    for lg in (logits, logits.T):
        pos = lg.diagonal().exp()
        neg = lg.exp().masked_fill(eye, 0).sum(1)
        ng = ((neg - tau_plus * (n - 1) * pos) / (1 - tau_plus)).clamp(min=(n - 1) * math.exp(-1 / tau))
        out = out - torch.log(pos / (pos + ng)).mean()
    return out / 2


def ref_crossclr(v, t, vin, tin, tau=0.03, lam=0.8, gamma=0.9, kappa=0.0035):
    """CrossCLR, Alg. 2 (no queue) as xmodal reads it: connectivity of the input features over the
    batch (self excluded), influential = C / max|C| > gamma prunes the negatives of the anchor's
    modality (never the positive), intra-modal negatives lam * delta, weights B * softmax(C / sum|C| / kappa)."""
    v, t = F.normalize(v, dim=1), F.normalize(t, dim=1)
    n = v.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=v.device)

    def conn(x):  # mean_{j != k} cos(x_k, x_j), without the B x B matrix
        x = F.normalize(x, dim=1)
        return (x @ x.sum(0) - (x * x).sum(1)) / (n - 1)

    def direction(za, zb, c):
        infl = c / c.abs().max() > gamma
        cross = (za @ zb.T / tau).masked_fill(infl[None, :] & ~eye, float("-inf"))
        intra = (za @ za.T / tau).masked_fill(infl[None, :] | eye, float("-inf")) + math.log(lam)
        per = torch.logsumexp(torch.cat([cross, intra], 1), 1) - cross.diagonal()
        w = n * torch.softmax(c / c.abs().sum() / kappa, 0)
        return (w * per).mean()

    cv, ct = conn(vin), conn(tin)
    return (direction(v, t, cv) + direction(t, v, ct)) / 2


def ref_ncl(v, t, vin=None, tin=None, gamma=0.05, iters=4):
    """NCL: 4 log-domain Sinkhorn iterations (rows, then columns; uniform marginals) on the detached
    text x video kernel s / gamma; the scalings are constant biases of the symmetric InfoNCE."""
    s = F.normalize(t, dim=1) @ F.normalize(v, dim=1).T  # [text, video]
    n = s.shape[0]
    with torch.no_grad():
        m = s / gamma
        log_b = torch.zeros(n, dtype=s.dtype, device=s.device)
        for _ in range(iters):
            log_a = -math.log(n) - torch.logsumexp(m + log_b[None, :], 1)
            log_b = -math.log(n) - torch.logsumexp(m + log_a[:, None], 0)
    logits = s / gamma + log_a[:, None] + log_b[None, :]
    labels = torch.arange(n, device=s.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


REFERENCES = {"infonce": ref_infonce, "ntxent": ref_ntxent, "maxmargin": ref_maxmargin, "milnce": ref_milnce,
              "dcl": ref_dcl, "crossclr": ref_crossclr, "ncl": ref_ncl}


def reference_diffs(name: str, v, t, vin, tin, loss=None) -> tuple[float, float]:
    """(relative value difference, relative max gradient difference) of ``build_loss(name)`` and
    its inline reference on the same inputs (run in the inputs' dtype: float64 for the check).
    The gradient difference is ``max |g_ours - g_ref| / max |g_ref|`` over both embeddings."""
    loss = build_loss(name).to(v.device) if loss is None else loss
    extra = {"video_input": vin, "text_input": tin} if name == "crossclr" else {}
    vals, grads = [], []
    for fn in (lambda a, b: loss(a, b, **extra), lambda a, b: REFERENCES[name](a, b, vin, tin)):
        a, b = v.detach().clone().requires_grad_(True), t.detach().clone().requires_grad_(True)
        out = fn(a, b)
        out.backward()
        vals.append(out.detach())
        grads.append(torch.cat([a.grad.flatten(), b.grad.flatten()]))
    value = float((vals[0] - vals[1]).abs() / vals[1].abs().clamp_min(1e-300))
    grad = float((grads[0] - grads[1]).abs().max() / grads[1].abs().max().clamp_min(1e-300))
    return value, grad


def bench_losses(b: int, d: int, repeat: int, dev: torch.device, tol: float = 1e-6) -> None:
    v0, t0 = unit(b, d, 5, dev), unit(b, d, 6, dev)
    vin, tin = unit(b, 2 * d, 7, dev), unit(b, d, 8, dev)

    def step(fn):
        v = v0.clone().requires_grad_(True)
        t = t0.clone().requires_grad_(True)
        fn(v, t).backward()
        return v.grad

    def clip():
        return step(lambda v, t: clip_loss(v, t, 0.05))

    clip()  # warm-up (allocator, kernels)
    print(f"(losses) B {b}, D {d}, {dev.type}, forward + backward, float32, best of {repeat}; each loss timed "
          f"in alternation with its reference and the inline CLIP loss", flush=True)
    print(f"  {'loss':10s} {'ours ms':>9s} {'ref ms':>9s} {'CLIP ms':>9s} {'ours/ref':>8s} {'ours/CLIP':>9s}   "
          f"float64 check: rel. value diff, rel. grad diff", flush=True)
    wide = [x.double() for x in (v0, t0, vin, tin)]
    for name in REFERENCES:
        loss = build_loss(name).to(dev)
        dv, dg = reference_diffs(name, *wide, loss=build_loss(name).to(dev))
        if not (dv <= tol and dg <= tol):
            raise AssertionError(f"{name}: the inline reference differs from xmodal (float64: value "
                                 f"{dv:.1e}, gradient {dg:.1e}, tolerance {tol:g})")
        extra = {"video_input": vin, "text_input": tin} if name == "crossclr" else {}
        ref = REFERENCES[name]
        t_clip, t_ref, t_ours = timed_interleaved([clip, lambda: step(lambda v, t: ref(v, t, vin, tin)),
                                                   lambda: step(lambda v, t: loss(v, t, **extra))], repeat, dev)
        print(f"  {name:10s} {1000 * t_ours:9.2f} {1000 * t_ref:9.2f} {1000 * t_clip:9.2f} {t_ours / t_ref:7.2f}x "
              f"{t_ours / t_clip:8.2f}x   {dv:.1e}, {dg:.1e}", flush=True)
        if name == "ncl":  # training mode (as built) also enqueues 2 x B rows into its 16,384-row queues
            loss.eval()
            t_clip, t_ref, t_eval = timed_interleaved([clip, lambda: step(lambda v, t: ref(v, t, vin, tin)),
                                                       lambda: step(lambda v, t: loss(v, t))], repeat, dev)
            print(f"  {'ncl, eval':10s} {1000 * t_eval:9.2f} {1000 * t_ref:9.2f} {1000 * t_clip:9.2f} "
                  f"{t_eval / t_ref:7.2f}x {t_eval / t_clip:8.2f}x   (no queue update)", flush=True)
    print(f"  goal: ours/ref <= 1.2 on the GPU (issue 17); float64 checks passed (tolerance {tol:g})", flush=True)


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
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default; without CUDA: one line, exit 0) or cpu (to check a section here)")
    p.add_argument("--n", type=int, default=None, help="streaming size N (default 1,000,000; quick 50,000)")
    p.add_argument("--loss-batch", type=int, default=None, help="(losses) B (default 8192; quick 1024)")
    p.add_argument("--loss-dim", type=int, default=None, help="(losses) D (default 512; quick 256)")
    p.add_argument("--amp-cpu-dry-run", action="store_true",
                   help="run only the (amp) comparison on the CPU (no autocast), to check the script")
    args = p.parse_args(argv)
    if args.amp_cpu_dry_run:
        bench_amp_epoch(2000, 1, "cpu")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; nothing to measure (skipped: streaming, sinkhorn, losses, amp)")
        return 0
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {name}")
    only = set(args.only.split(","))
    if "streaming" in only:
        bench_streaming(args.n or (50_000 if args.quick else 1_000_000), 256, 1 if not args.quick else args.repeat,
                        dev)
    if "sinkhorn" in only:
        bench_sinkhorn(*((4096, 10_000) if args.quick else (16_384, 100_000)), 256, args.repeat, dev)
    if "losses" in only:
        b, d = (1024, 256) if args.quick else (8192, 512)
        bench_losses(args.loss_batch or b, args.loss_dim or d, args.repeat, dev)
    if "amp" in only:
        bench_amp_epoch(20_000 if args.quick else 200_000, 2, args.device)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
