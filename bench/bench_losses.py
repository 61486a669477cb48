"""Forward+backward time per step of every xmodal loss at B=256, D=256 (CPU, float32),
as a ratio to xmodal's InfoNCE measured in the same run, and xmodal's InfoNCE / NTXent
against open_clip's ``ClipLoss`` and pytorch-metric-learning's ``NTXentLoss`` when they
are importable (bench-only; install with ``pip install --no-deps open_clip_torch
pytorch-metric-learning``).

Timing: all candidates are interleaved round by round (so machine-load drift hits them
alike); each round times up to ``--iters`` steps of one candidate (fewer for candidates
slower than 10 ms/step, at least 1); the median per-step time
over ``--rounds`` rounds is reported. Values of the compared losses are checked equal
before timing.

    python bench/bench_losses.py [--batch 256 --dim 256 --rounds 15 --iters 5 --threads N]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from xmodal import losses


def load_open_clip_loss():
    """``open_clip.loss`` without the package ``__init__`` (which needs torchvision)."""
    try:
        from open_clip.loss import ClipLoss  # noqa: F401
        return ClipLoss, "open_clip.loss"
    except Exception:  # noqa: BLE001 - any import failure: try the file itself
        pass
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return None, "open_clip_torch not installed"
    path = Path(list(spec.submodule_search_locations)[0]) / "loss.py"
    if not path.exists():
        return None, f"{path} missing"
    mod_spec = importlib.util.spec_from_file_location("open_clip_loss_file", path)
    module = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001
        return None, f"loading {path} failed: {exc}"
    return module.ClipLoss, f"{path} (loaded directly: the package __init__ needs torchvision)"


def load_pml():
    try:
        from pytorch_metric_learning.losses import NTXentLoss
    except Exception as exc:  # noqa: BLE001
        return None, f"pytorch-metric-learning not importable: {exc}"
    return NTXentLoss, "pytorch_metric_learning.losses.NTXentLoss"


def step_fn(loss_fn, b: int, d: int, seed: int, **extra):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(b, d, generator=g, requires_grad=True)
    t = torch.randn(b, d, generator=g, requires_grad=True)

    def step():
        v.grad = t.grad = None
        loss = loss_fn(v, t, **extra)
        loss.backward()
        return loss

    return step


def paper_candidates(b: int, d: int, report: list[str]):
    """CrossCLR (queue 5,000) / NCL / CaliNCE if the LOSSES-PAPER modules exist."""
    out = {}
    g = torch.Generator().manual_seed(1)
    vin, tin = torch.randn(b, 512, generator=g), torch.randn(b, 384, generator=g)
    specs = {
        "crossclr(queue=5000)": ("crossclr", {"queue_size": 5000}, {"video_input": vin, "text_input": tin}),
        "crossclr(no queue)": ("crossclr", {}, {"video_input": vin, "text_input": tin}),
        "ncl": ("ncl", {}, {}),
        "calince": ("calince", {"embed_dim": d}, {"video_input": vin, "text_input": tin}),
    }
    for label, (key, kwargs, extra) in specs.items():
        cls = losses.LOSSES.get(key)
        if cls is None:
            report.append(f"skipped {label}: xmodal.losses has no {key!r}")
            continue
        try:
            module = cls(**kwargs).train()
            fn = step_fn(module, b, d, 0, **extra)
            for _ in range(3):  # fills the CrossCLR queue with a few batches (and checks it runs)
                fn()
            out[label] = fn
        except Exception as exc:  # noqa: BLE001 - report and go on
            report.append(f"skipped {label}: {type(exc).__name__}: {exc}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (what "
                    "bench/resultfile.py --run parses into a docs result file)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    b, d, tau = args.batch, args.dim, 0.05
    notes: list[str] = []
    ids = torch.arange(b) // 2
    rel = torch.eye(b)
    cands = {
        "xmodal InfoNCE": step_fn(losses.InfoNCE(tau), b, d, 0),
        "xmodal InfoNCE(normalize=False)": step_fn(losses.InfoNCE(tau, normalize=False), b, d, 0),
        "xmodal InfoNCE(ids)": step_fn(losses.InfoNCE(tau), b, d, 0, ids=ids),
        "xmodal InfoNCE(learnable)": step_fn(losses.InfoNCE(tau, learnable=True), b, d, 0),
        "xmodal NTXent": step_fn(losses.NTXent(tau), b, d, 0),
        "xmodal MaxMargin": step_fn(losses.MaxMargin(), b, d, 0),
        "xmodal MaxMargin(hardest)": step_fn(losses.MaxMargin(hardest=True), b, d, 0),
        "xmodal MIMaxMargin": step_fn(losses.MIMaxMargin(), b, d, 0, relevancy=rel),
        "xmodal MILNCE(ids)": step_fn(losses.MILNCE(tau), b, d, 0, ids=ids),
        "xmodal DebiasedContrastive": step_fn(losses.DebiasedContrastive(tau), b, d, 0),
    }
    cands.update({f"xmodal {k}": fn for k, fn in paper_candidates(b, d, notes).items()})

    ClipLoss, where = load_open_clip_loss()
    notes.append(f"open_clip ClipLoss: {where}")
    if ClipLoss is not None:
        clip = ClipLoss()
        scale = torch.tensor(1.0 / tau)
        cands["open_clip ClipLoss (+F.normalize)"] = step_fn(
            lambda v, t: clip(F.normalize(v, dim=-1), F.normalize(t, dim=-1), scale), b, d, 0)
        cands["open_clip ClipLoss (raw inputs)"] = step_fn(lambda v, t: clip(v, t, scale), b, d, 0)
        g = torch.Generator().manual_seed(5)
        v, t = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
        ours, theirs = losses.InfoNCE(tau)(v, t), clip(F.normalize(v, dim=-1), F.normalize(t, dim=-1), scale)
        notes.append(f"value check InfoNCE vs ClipLoss: {float(ours):.6f} vs {float(theirs):.6f}")
    NTXentLoss, where = load_pml()
    notes.append(f"pytorch-metric-learning: {where}")
    if NTXentLoss is not None:
        pml = NTXentLoss(temperature=tau)
        labels = torch.cat([torch.arange(b), torch.arange(b)])
        cands["pml NTXentLoss (SimCLR, 2B views)"] = step_fn(
            lambda v, t: pml(torch.cat([v, t]), labels), b, d, 0)
        g = torch.Generator().manual_seed(5)
        v, t = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
        ours, theirs = losses.NTXent(tau)(v, t), pml(torch.cat([v, t]), labels)
        notes.append(f"value check NTXent vs pml NTXentLoss: {float(ours):.6f} vs {float(theirs):.6f}")

    iters = {}
    for name, fn in cands.items():  # warm-up; slow candidates get fewer steps per round
        fn()
        start = time.perf_counter()
        fn()
        iters[name] = max(1, min(args.iters, int(0.05 / (time.perf_counter() - start))))
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(args.rounds):
        for name, fn in cands.items():
            start = time.perf_counter()
            for _ in range(iters[name]):
                fn()
            times[name].append((time.perf_counter() - start) / iters[name])
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = med["xmodal InfoNCE"]
    print(f"B={b} D={d} float32 CPU, torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"median of {args.rounds} rounds x <= {args.iters} steps (forward+backward)")
    if args.markdown:
        print("\n| loss | ms/step | x InfoNCE |\n|---|---:|---:|")
        for name, m in med.items():
            print(f"| {name} | {1e3 * m:.3f} | {m / ref:.2f} |")
        print()
    else:
        print(f"{'loss':44s} {'ms/step':>9s} {'x InfoNCE':>10s}")
        for name, m in med.items():
            print(f"{name:44s} {1e3 * m:9.3f} {m / ref:10.2f}")
    for label, ours, theirs in (("InfoNCE / open_clip ClipLoss (+F.normalize)", "xmodal InfoNCE",
                                 "open_clip ClipLoss (+F.normalize)"),
                                ("InfoNCE(normalize=False) / ClipLoss (raw)", "xmodal InfoNCE(normalize=False)",
                                 "open_clip ClipLoss (raw inputs)"),
                                ("NTXent / pml NTXentLoss", "xmodal NTXent", "pml NTXentLoss (SimCLR, 2B views)"),
                                ("InfoNCE / pml NTXentLoss", "xmodal InfoNCE", "pml NTXentLoss (SimCLR, 2B views)")):
        if theirs in med:
            print(f"ratio {label}: {med[ours] / med[theirs]:.3g} (target <= 1.2)")
    for note in notes:
        print("note:", note)


if __name__ == "__main__":
    main()
