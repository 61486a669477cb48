"""PNG plots of a run directory (matplotlib, Agg backend; nothing is shown).

- ``curves.png``: training loss, validation R@1 (both directions), LR and temperature per epoch.
- ``schedule.png``: the temperature (or margin) schedule actually used, per step, and the
  per-class TS++ values against class frequency when class temperatures were on.
- ``retrieval_mass.png``: histograms of the per-gallery-item summed retrieval probability
  ``sum_i softmax_j(sim_ij / tau)`` on the validation split, before and after each
  test-time normaliser (NCL Figs. 2/3): a perfectly balanced gallery has every item at
  ``num_queries / num_gallery``; hubs sit in the right tail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_log(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(log: list[dict], path: str | Path) -> Path:
    """Loss, val R@1, LR and temperature per epoch."""
    plt = _plt()
    ep = [r["epoch"] for r in log]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    ax[0].plot(ep, [r["train_loss"] for r in log], marker="o")
    ax[0].set(title="training loss", xlabel="epoch")
    for d in ("t2v", "v2t"):
        ax[1].plot(ep, [r["val"][d]["R@1"] for r in log], marker="o", label=f"{d} R@1")
    best = log[-1].get("best_epoch")
    if best:
        ax[1].axvline(best, color="grey", ls="--", lw=1, label="best epoch")
    ax[1].set(title="validation", xlabel="epoch", ylabel="%")
    ax[1].legend()
    ax[2].plot(ep, [r["lr"] for r in log], marker="o", label="LR (end of epoch)")
    ax[2].set(title="learning rate / temperature", xlabel="epoch")
    tw = ax[2].twinx()
    tw.plot(ep, [r["temperature"] for r in log], color="C1", marker="s", label="temperature")
    ax[2].legend(loc="upper left")
    tw.legend(loc="upper right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_schedule(steps: np.ndarray, values: np.ndarray, path: str | Path, *, label: str = "temperature",
                  class_counts: np.ndarray | None = None, class_values: np.ndarray | None = None) -> Path:
    """The schedule per step, and (optionally) per-class values against class size."""
    plt = _plt()
    n = 2 if class_values is not None else 1
    fig, ax = plt.subplots(1, n, figsize=(5.5 * n, 3.6), squeeze=False)
    ax[0, 0].plot(steps, values)
    ax[0, 0].set(title=f"{label} schedule", xlabel="step", ylabel=label)
    if class_values is not None:
        ax[0, 1].scatter(class_counts, class_values, s=10)
        ax[0, 1].set(xscale="log", title=f"per-class {label} (TS++ eq. 4.3)", xlabel="class size K_c",
                     ylabel=label)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def retrieval_mass(sim: torch.Tensor, temperature: float) -> np.ndarray:
    """Per gallery item, ``sum_i softmax_j(sim_ij / temperature)``. Shape: ``[Q, G]`` -> ``[G]``."""
    return torch.softmax(sim.float() / temperature, dim=1).sum(0).cpu().numpy()


def plot_retrieval_mass(masses: dict[str, np.ndarray], expected: float, path: str | Path,
                        title: str = "") -> Path:
    """Overlaid histograms of per-item summed retrieval probability, one per normaliser."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    hi = max(float(np.quantile(m, 0.995)) for m in masses.values())
    bins = np.linspace(0, max(hi, 2 * expected), 60)
    for name, m in masses.items():
        ax.hist(np.clip(m, 0, bins[-1]), bins=bins, histtype="step", lw=1.5, label=name)
    ax.axvline(expected, color="k", ls="--", lw=1, label="uniform target")
    ax.set(xlabel="summed retrieval probability per gallery item", ylabel="items", title=title)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_run(run_dir: str | Path, *, splits: dict[str, Any] | None = None) -> list[Path]:
    """All plots of a finished run directory; returns the written files.

    ``splits``: the loaded data (else re-loaded from the run's ``config.yaml``).
    """
    from xmodal.config import load_config
    from xmodal.models import load_model
    from xmodal.train import TemperaturePlan, load_splits, normalized_similarities

    run_dir = Path(run_dir)
    written = [plot_curves(read_log(run_dir), run_dir / "curves.png")]
    cfg = load_config(run_dir / "config.yaml")
    model = load_model(run_dir)
    splits = splits or load_splits(cfg)
    log = read_log(run_dir)
    steps_per_epoch = max(1, log[0]["step"])
    from xmodal.train import build_loss_from_config

    plan = TemperaturePlan(cfg, build_loss_from_config(cfg, video_dim=splits["train"].video.shape[-1],
                                                      text_dim=splits["train"].text.shape[-1]),
                           splits["train"], steps_per_epoch)
    if plan.active:
        steps = np.arange(0, log[-1]["step"])
        values = np.array([plan.mean_value(int(s)) for s in steps])
        written.append(plot_schedule(steps, values, run_dir / "schedule.png", label=plan.keyword,
                                     class_counts=plan.class_counts, class_values=plan.class_values))
    val = splits["val"]
    text, video = model.encode_text(val.text), model.encode_video(*val.video_input())
    tt = model.test_time
    masses = {}
    for name in [n for n in tt.get("val", {"none": None})]:
        s_t2v, _, _ = normalized_similarities(name, tt, text, video)
        masses[name] = retrieval_mass(s_t2v, model.temperature)
    expected = val.num_texts / val.num_videos
    written.append(plot_retrieval_mass(masses, expected, run_dir / "retrieval_mass.png",
                                       title=f"text->video on val, tau={model.temperature:.3f}"))
    return written
