"""PNG plots of a run directory (matplotlib, Agg backend; nothing is shown).

- ``curves.png``: training loss (and per-term losses), validation R@1 (both directions) with
  the selection metric, the temperature actually used (scheduled value) with the LR, and
  the validation modality gap when logged.
- ``schedule.png``: the temperature (or margin) schedule actually used, per step, and the
  per-class TS++ values against class frequency when class temperatures were on.
- ``retrieval_mass.png``: histograms of the per-gallery-item summed retrieval probability
  ``sum_i softmax_j(sim_ij / tau)`` on the validation split, before and after each
  test-time normaliser (NCL Figs. 2/3): a perfectly balanced gallery has every item at
  ``num_queries / num_gallery``; hubs sit in the right tail.
- ``fn_fp.png``: false-negative / false-positive rates against retrieval mass (NCL Fig. 3).
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


def _num(v: Any) -> float | None:
    """A log value as a float: numbers as is, dicts by their ``mean`` (else first number)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, dict):
        if "mean" in v:
            return _num(v["mean"])
        for x in v.values():
            if _num(x) is not None:
                return _num(x)
    return None


def selection_key(log: list[dict]) -> str | None:
    """The log key of the selection metric: ``val_rsum`` or another ``val_<metric>``."""
    for r in log:
        keys = [k for k in r if k.startswith("val_") and _num(r[k]) is not None]
        if "val_rsum" in keys:
            return "val_rsum"
        if keys:
            return keys[0]
    return None


def _terms(r: dict) -> dict:
    """Per-term losses of an epoch record (``loss_terms``, as the trainer logs them)."""
    return r.get("loss_terms") or {}


def _gap(r: dict) -> float | None:
    """Validation modality gap of an epoch record (``modality_gap``, as the trainer logs it)."""
    return _num(r.get("modality_gap"))


def _epoch_ticks(ax) -> None:
    """Epochs are whole numbers: no 1.5 on an epoch axis."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend_below(ax, handles=None, labels=None) -> None:
    """The legend under the panel (below its x label), so it never covers a curve."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
              frameon=False)


def _legend_right(ax, handles=None, labels=None) -> None:
    """The legend right of the panel, outside the plotting area."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
              frameon=False)


def _save(fig, path: str | Path) -> Path:
    """PNG through a temporary name renamed over ``path`` (no truncated plot on a full disk);
    "tight": the legends outside the panels are kept."""
    from xmodal.runs import atomic_write

    out = Path(path)
    try:
        atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=100, format="png", bbox_inches="tight"))
    finally:
        _plt().close(fig)
    return out


def plot_curves(log: list[dict], path: str | Path, *, per_step: tuple | None = None) -> Path:
    """Training curves per epoch from ``log.jsonl`` (:func:`curves_figure`) written to ``path``."""
    return _save(curves_figure(log, per_step=per_step), path)


def curves_figure(log: list[dict], *, per_step: tuple | None = None):
    """The figure of :func:`plot_curves`: training curves per epoch from ``log.jsonl``.

    Panels: training loss (and the per-term / per-direction losses of ``loss_terms``
    when logged); validation R@1 both ways with the selection metric (``val_rsum`` or
    ``val_<metric>``) and the best epoch; the temperature actually used (the
    ``scheduled`` value when a schedule ran, else ``temperature``) with the LR; and the
    validation modality gap when ``modality_gap`` is logged (TS++ Fig. 5.6).
    ``per_step``: ``(steps, values, steps_per_epoch)`` of a schedule, drawn as a line so
    that a schedule faster than an epoch is not aliased by the end-of-epoch samples.
    Legends sit under the panels (clear of every curve); epoch ticks are integers.
    """
    plt = _plt()
    ep = [r["epoch"] for r in log]
    gap = [_gap(r) for r in log]
    has_gap = any(g is not None for g in gap)
    n = 4 if has_gap else 3
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.8))
    for a in axes:
        _epoch_ticks(a)
    ax = list(axes)
    ax[0].plot(ep, [r["train_loss"] for r in log], marker="o", color="k", label="total")
    terms = sorted({k for r in log for k in _terms(r)} - {"loss"})
    for i, name in enumerate(terms):
        ax[0].plot(ep, [_num(_terms(r).get(name)) for r in log], marker=".",
                   ls="--", color=f"C{i}", label=name)
    ax[0].set(title="training loss", xlabel="epoch")
    if terms:
        _legend_below(ax[0])
    for i, d in enumerate(("t2v", "v2t")):
        ax[1].plot(ep, [r["val"][d]["R@1"] for r in log], marker="o", color=f"C{i}", label=f"{d} R@1")
    ax[1].set(title="validation", xlabel="epoch", ylabel="R@1 (%)")
    key = selection_key(log)
    handles, labels = ax[1].get_legend_handles_labels()
    if key:
        tw = ax[1].twinx()
        h = tw.plot(ep, [_num(r.get(key)) for r in log], marker="s", ls=":", color="C3",
                    label=f"{key} (selection)")
        tw.set_ylabel(key)
        handles, labels = handles + h, labels + [h[0].get_label()]
    best = log[-1].get("best_epoch")
    if best:
        handles.append(ax[1].axvline(best, color="grey", ls="--", lw=1))
        labels.append(f"best epoch ({best})")
    _legend_below(ax[1], handles, labels)
    sched = [_num(r.get("scheduled")) for r in log]
    used = [s if s is not None else _num(r.get("temperature")) for s, r in zip(sched, log)]
    what = "scheduled value" if any(s is not None for s in sched) else "temperature"
    if per_step is not None:
        steps, values, spe = per_step
        ax[2].plot((np.asarray(steps) + 1) / spe, values, color="C1", lw=1, alpha=0.6, label=f"{what} per step")
    ax[2].plot(ep, used, marker="s", ls="none" if per_step is not None else "-", color="C1",
               label=f"{what} (end of epoch)")
    ax[2].set(title="temperature used / learning rate", xlabel="epoch", ylabel=what)
    tw = ax[2].twinx()
    h2 = tw.plot(ep, [r["lr"] for r in log], marker=".", color="C7", ls="--", label="LR (end of epoch)")
    tw.set_ylabel("LR")
    h1, l1 = ax[2].get_legend_handles_labels()
    _legend_below(ax[2], h1 + h2, l1 + [h2[0].get_label()])
    if has_gap:
        ax[3].plot(ep, gap, marker="o", color="C4")
        ax[3].set(title="modality gap (val)", xlabel="epoch", ylabel="||mean(v) - mean(t)||")
    fig.tight_layout()
    return fig


def plot_schedule(steps: np.ndarray, values: np.ndarray, path: str | Path, *, label: str = "temperature",
                  class_counts: np.ndarray | None = None, class_values: np.ndarray | None = None) -> Path:
    """The schedule per step, and (optionally) per-class values against class size."""
    plt = _plt()
    n = 2 if class_values is not None else 1
    fig, ax = plt.subplots(1, n, figsize=(5.5 * n, 3.6), squeeze=False)
    ax[0, 0].plot(steps, values)
    ax[0, 0].set(title=f"{label} schedule", xlabel="step", ylabel=label)
    _epoch_ticks(ax[0, 0])  # steps are whole numbers too
    if class_values is not None:
        ax[0, 1].scatter(class_counts, class_values, s=10)
        ax[0, 1].set(xscale="log", title=f"per-class {label} (TS++ eq. 4.3)", xlabel="class size K_c",
                     ylabel=label)
    fig.tight_layout()
    return _save(fig, path)


CAPTION_MASS = ("Retrieval mass of a gallery item = sum over queries of softmax(sim / tau) (NCL Sec. 3.2). "
                "A balanced gallery has every item at the dashed line (queries / items); items to the "
                "left are under-represented (missed by their own queries), items to the right are hubs.")
CAPTION_FNFP = ("False-negative rate: positive (query, item) pairs whose item is not the query's top-1. "
                "False-positive rate: top-1 retrievals of the items that answer a non-matching query. "
                "Items binned by retrieval mass (equal-count bins; NCL Fig. 3).")


def plot_retrieval_mass(masses: dict[str, np.ndarray], expected: float, path: str | Path,
                        title: str = "", caption: str = CAPTION_MASS, item: str = "gallery item") -> Path:
    """:func:`retrieval_mass_figure` written to ``path``."""
    return _save(retrieval_mass_figure(masses, expected, title=title, caption=caption, item=item), path)


def retrieval_mass_figure(masses: dict[str, np.ndarray], expected: float, *, title: str = "",
                          caption: str = CAPTION_MASS, item: str = "gallery item"):
    """Per-item retrieval mass, one step histogram per normaliser (log-spaced bins,
    distinct line styles so overlapping curves stay readable; the legend right of the
    panel), with a caption. ``item``: what a gallery row is (``image`` / ``video``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    allm = np.concatenate([np.asarray(m, dtype=np.float64) for m in masses.values()])
    lo = max(float(allm[allm > 0].min()) if (allm > 0).any() else expected / 100, expected / 1e4)
    hi = max(float(allm.max()), 2 * expected)
    bins = np.geomspace(lo, hi * 1.0001, 50)
    styles = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1))]
    for i, (name, m) in enumerate(masses.items()):
        dev = float(np.mean(np.abs(np.asarray(m) - expected)))
        ax.hist(np.clip(m, lo, bins[-1]), bins=bins, histtype="step", lw=1.8, ls=styles[i % len(styles)],
                color=f"C{i}", label=f"{name} (mean |dev| {dev:.2f})")
    ax.axvline(expected, color="k", ls="--", lw=1, label=f"balanced ({expected:.2g})")
    ax.set(xscale="log", xlabel=f"retrieval mass per {item} (log scale)", ylabel=f"{item}s", title=title)
    _plain_ticks(ax)
    _legend_right(ax)
    _caption(fig, caption)
    return fig


def _plain_ticks(ax) -> None:
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _caption(fig, text: str) -> None:
    import textwrap

    fig.tight_layout(rect=(0, 0.13, 1, 1))
    fig.text(0.01, 0.01, "\n".join(textwrap.wrap(text, 120)), fontsize=7.5, va="bottom", ha="left",
             color="#333")


def plot_fn_fp(results: dict[str, dict], path: str | Path, title: str = "",
               caption: str = CAPTION_FNFP) -> Path:
    """:func:`fn_fp_figure` written to ``path``."""
    return _save(fn_fp_figure(results, title=title, caption=caption), path)


def fn_fp_figure(results: dict[str, dict], *, title: str = "", caption: str = CAPTION_FNFP):
    """FN and FP rates against the bins' mean retrieval mass (NCL Fig. 3), one colour per
    normaliser (one legend, right of the panels); ``results[name]`` is
    :func:`xmodal.metrics.fn_fp_by_mass` output."""
    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    expected = None
    for i, (name, r) in enumerate(results.items()):
        expected = r["expected_mass"]
        for j, (key, lab) in enumerate((("fn_rate", "false negatives"), ("fp_rate", "false positives"))):
            pts = [(m, v) for m, v in zip(r["mean_mass"], r[key]) if m is not None and v is not None]
            if pts:
                x, y = zip(*pts)
                ax[j].plot(x, y, marker="os^dvx"[i % 6], ls="-", color=f"C{i}", label=name, alpha=0.85)
            ax[j].set(title=f"{lab} (top-{r['k']})", xlabel="retrieval mass (bin mean, log scale)",
                      ylabel="rate (%)", xscale="log")
    for a in ax:
        _plain_ticks(a)
        if expected is not None:
            a.axvline(expected, color="k", ls="--", lw=1, label="balanced")
        a.set_ylim(-2, 102)
    _legend_right(ax[1])
    fig.suptitle(title, fontsize=10)
    _caption(fig, caption)
    return fig


def gallery_item(cfg: Any) -> str:
    """What the gallery holds, as the data names it: ``"image"`` when the validation split's
    features are ``{split}_image_features.npy`` (Flickr8k), else ``"video"``."""
    d = getattr(cfg, "data", None)
    if d is None or d.name != "paired" or not d.root:
        return "video"
    from xmodal.data import layout

    split = d.train_split if d.val_from_train or not d.val_split else d.val_split
    path = layout.find(d.root, split, "video")
    return "image" if path is not None and path.name.endswith("_image_features.npy") else "video"


def t2v_similarity(model: Any, split: Any, name: str) -> torch.Tensor:
    """Text -> video similarities ``[T, V]`` of ``split`` under the run's normaliser ``name``."""
    video, mask = split.video_input()
    text, text_mask = split.text_input()
    return torch.as_tensor(model.similarity(text, video, normalizer=name, video_mask=mask, text_mask=text_mask))


def mass_analysis(model: Any, split: Any, *, bins: int = 8) -> dict[str, Any]:
    """Retrieval mass and FN/FP-by-mass (text -> video) of ``split`` per fitted normaliser."""
    from xmodal.metrics import fn_fp_by_mass, retrieval_mass

    masses, fnfp = {}, {}
    for name in list(model.test_time.get("val") or {}) or ["none"]:  # an unfinished run's checkpoint: none only
        sim = t2v_similarity(model, split, name)
        masses[name] = retrieval_mass(sim, model.temperature)
        fnfp[name] = fn_fp_by_mass(sim, split.text_to_video, model.temperature, bins=bins)
    return {"masses": masses, "fn_fp": fnfp, "expected": split.num_texts / split.num_videos}


def plot_run(run_dir: str | Path, *, splits: dict[str, Any] | None = None) -> list[Path]:
    """All plots of a finished run directory; returns the written files.

    ``splits``: the loaded data (else re-loaded from the run's ``config.yaml``).
    """
    from xmodal.config import load_config
    from xmodal.models import load_model
    from xmodal.training.loop import TemperaturePlan, build_loss_from_config, load_splits

    run_dir = Path(run_dir)
    log = read_log(run_dir) if (run_dir / "log.jsonl").is_file() else []  # a zero-shot run has no epoch
    cfg = load_config(run_dir / "config.yaml")
    model = load_model(run_dir)
    from xmodal.training.finetune import splits_for

    splits = splits_for(model, splits or load_splits(cfg), run_dir)  # a clip4clip run reads tokens
    steps_per_epoch = max(1, log[0]["step"]) if log else 1
    sizes = splits.get("train", splits["val"])  # a zero-shot run may have no train split
    plan = TemperaturePlan(cfg, build_loss_from_config(cfg, video_dim=sizes.video.shape[-1],
                                                      text_dim=sizes.text.shape[-1]),
                           sizes, steps_per_epoch)
    written = []
    if not log:
        pass  # no training curves to draw
    elif plan.active:
        steps = np.arange(0, log[-1]["step"])
        values = np.array([plan.mean_value(int(s)) for s in steps])
        written.append(plot_curves(log, run_dir / "curves.png", per_step=(steps, values, steps_per_epoch)))
        written.append(plot_schedule(steps, values, run_dir / "schedule.png", label=plan.keyword,
                                     class_counts=plan.class_counts, class_values=plan.class_values))
    else:
        written.append(plot_curves(log, run_dir / "curves.png"))
    a = mass_analysis(model, splits["val"])
    item = gallery_item(cfg)
    title = f"text->{item} on val, tau={model.temperature:.3f}"
    written.append(plot_retrieval_mass(a["masses"], a["expected"], run_dir / "retrieval_mass.png", title=title,
                                       item=item))
    written.append(plot_fn_fp(a["fn_fp"], run_dir / "fn_fp.png", title=title))
    return written
