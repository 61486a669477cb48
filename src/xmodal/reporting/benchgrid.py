"""The ``xmodal bench`` grid: objectives x (TS++ on/off) x test-time normalisers x seeds.

Every cell is one ``xmodal.training.loop.train`` run in its own run directory under
``OUT/runs/...``; a finished run (``metrics.json``) is reused, an interrupted one
resumes from its checkpoint, so a killed grid continues where it stopped. Results
(mean +- std over seeds) go to ``OUT/results.md`` and ``OUT/results.csv``.

Evaluation split: ``test`` when the dataset has one (synthetic; epochs and the
normaliser selected on ``val``), else ``val`` (Flickr8k ``dev``: the official test
split is held back, so dev is both the early-stopping and the reported split; this
is stated in the table header).

TS++ variant: a cosine temperature (margin) schedule (TS++ eq. 4.1) plus per-sample
class values (eqs. 4.3-4.5) from dataset labels (synthetic) or k-means over the
training captions (Flickr8k, k=200). What each objective can take comes from its
declaration (:func:`xmodal.losses.loss_spec`): objectives that take only a per-step
temperature get the schedule alone; objectives with nothing scheduled get no TS++ row.
"""

from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from xmodal.config import Config, from_dict

OBJECTIVES = ("infonce", "ntxent", "maxmargin", "milnce", "dcl", "crossclr", "ncl", "calince")
NORMALIZERS = ("none", "dn", "ncl", "sinkhorn", "qbnorm")
METRIC_KEYS = ("R@1", "R@5", "R@10", "MdR", "MnR")

LOSS_SETTINGS: dict[str, dict] = {
    "infonce": {"temperature": 0.05},
    "ntxent": {"temperature": 0.05},
    "maxmargin": {"temperature": None, "margin": 0.2},
    "mimaxmargin": {"temperature": None, "margin": 0.2},
    "milnce": {"temperature": 0.05},
    "dcl": {"temperature": 0.05, "kwargs": {"tau_plus": 0.1}},
    # the paper's defaults (tau 0.03, lambda 0.8, gamma 0.9, kappa 0.0035; Alg. 2 weights)
    "crossclr": {"temperature": 0.03},
    "ncl": {"temperature": 0.05, "kwargs": {"queue_size": 16384}},  # NCL paper
    "calince": {"temperature": 0.05},
}

DATASETS: dict[str, dict] = {
    "synthetic": {
        "data": {"name": "synthetic"},
        "model": {"kind": "linear", "dim": 128},
        "optim": {"name": "adam", "lr": 1e-3, "warmup_epochs": 1},
        "train": {"epochs": 12, "batch_size": 128, "patience": 4, "progress": False},
        "test_time": {"bank_size": 2000},
        "ts": {"kind": "cosine", "alpha": 0.04, "period_epochs": 4, "class_temperature": True,
               "classes": "labels", "t_min": 0.03, "t_max": 0.08},
    },
    "flickr8k": {
        "data": {"name": "paired", "root": "../shared/data/flickr8k", "train_split": "train",
                 "val_split": "dev", "test_split": ""},
        # tuned on dev for InfoNCE (input dropout 0.5 and batch 512 were the big wins over
        # the plain linear baseline), shared by every objective
        "model": {"kind": "linear", "dim": 256, "dropout": 0.5},
        "optim": {"name": "adam", "lr": 1e-3, "warmup_epochs": 1},
        "train": {"epochs": 15, "batch_size": 512, "patience": 4, "progress": False},
        "test_time": {"bank_size": 5000},
        "ts": {"kind": "cosine", "alpha": 0.04, "period_epochs": 4, "class_temperature": True,
               "classes": "kmeans", "k": 200, "t_min": 0.03, "t_max": 0.08},
    },
}
MARGIN_TS = {"alpha": 0.1, "t_min": 0.1, "t_max": 0.3}


@dataclass(frozen=True)
class Cell:
    """One training run of the grid."""

    dataset: str
    objective: str
    ts: bool
    seed: int
    noise: float = 0.0
    queue_size: int | None = None   # NCL query queue size (None: LOSS_SETTINGS' value)

    @property
    def label(self) -> str:
        return self.objective + ("+TS++" if self.ts else "")

    @property
    def path(self) -> str:
        noise = f"-noise{self.noise:g}" if self.noise else ""
        queue = f"-queue{self.queue_size}" if self.queue_size is not None else ""
        return f"{self.dataset}/{self.objective}{'-ts' if self.ts else ''}{noise}{queue}/seed{self.seed}"


def cell_config(cell: Cell, *, overrides: dict | None = None, epochs: int | None = None,
                synthetic: dict | None = None) -> Config | None:
    """The run config of a grid cell (``None``: TS++ not applicable to this objective)."""
    from xmodal.losses import loss_spec

    ds = DATASETS[cell.dataset]
    loss = {"name": cell.objective, **LOSS_SETTINGS.get(cell.objective, {})}
    d: dict[str, Any] = {
        "data": {**ds["data"], "noise": cell.noise},
        "model": dict(ds["model"]),
        "loss": loss,
        "optim": dict(ds["optim"]),
        "train": {**ds["train"], "seed": cell.seed},
        "test_time": {**ds["test_time"],
                      "normalizers": [n for n in NORMALIZERS if n != "ncl" or cell.objective == "ncl"]},
    }
    if d["data"].get("root"):  # absolute, so the run's config.yaml loads from anywhere
        d["data"]["root"] = os.path.abspath(d["data"]["root"])
    if cell.queue_size is not None:
        d["loss"]["kwargs"] = {**d["loss"].get("kwargs", {}), "queue_size": int(cell.queue_size)}
    if synthetic:
        d["data"]["synthetic"] = dict(synthetic)
    if epochs:
        d["train"]["epochs"] = epochs
    if cell.ts:
        spec = loss_spec(cell.objective)
        if spec.keyword is None:
            return None
        ts = dict(ds["ts"])
        if spec.keyword == "margin":
            ts.update(MARGIN_TS)
        if not spec.per_sample:
            ts["class_temperature"] = False
        d["schedule"] = ts
    for section, values in (overrides or {}).items():
        d.setdefault(section, {}).update(values)
    return from_dict(d)


def run_cell(cell: Cell, root: Path, **kw: Any) -> dict | None:
    """Train (or reuse) one cell; returns its ``metrics.json`` summary."""
    from xmodal.training.loop import train

    cfg = cell_config(cell, **kw)
    if cfg is None:
        return None
    out = root / "runs" / cell.path
    done = out / "metrics.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        if summary.get("config") == _cfg_fingerprint(cfg):
            return summary
    summary = train(cfg, out, resume=True, progress=False, verbose=False)  # a grid: its own table
    summary["config"] = _cfg_fingerprint(cfg)
    done.write_text(json.dumps(summary, indent=1))
    return summary


def _cfg_fingerprint(cfg: Config) -> str:
    from xmodal.config import to_dict

    return json.dumps(to_dict(cfg), sort_keys=True)


def aggregate(summaries: list[dict], normalizer: str) -> dict[str, Any]:
    """Mean/std over seeds of the eval-split metrics under one normaliser."""
    split = "test" if "test" in summaries[0] else "val"
    out: dict[str, Any] = {"split": split, "n": len(summaries)}
    for d in ("t2v", "v2t"):
        for k in METRIC_KEYS:
            vals = np.array([s[split][normalizer][d][k] for s in summaries], dtype=np.float64)
            out[f"{d} {k}"] = (float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else float("nan"))
    t = np.array([s["train_time_s"] for s in summaries])
    out["train s"] = (float(t.mean()), float(t.std(ddof=1)) if len(t) > 1 else float("nan"))
    out["selected"] = ",".join(sorted({s["normalizer"] for s in summaries}))
    return out


def run_grid(*, datasets: Iterable[str], objectives: Iterable[str], seeds: Iterable[int],
             ts_variants: Iterable[bool] = (False, True), noise: Iterable[float] = (0.0,),
             out: str | Path, epochs: int | None = None, synthetic: dict | None = None,
             progress: bool | None = True) -> list[dict]:
    """Run every cell, aggregate, write ``results.md``/``results.csv``; returns the rows.
    ``progress``: a bar (True), a line every 30 s without a terminal (None) or nothing (False).

    Every argument is checked before the first run starts (a ValueError / TypeError naming it).
    """
    from xmodal.progress import progress as progress_bar

    from xmodal._validate import flag, integer, number, positive_int, short_repr
    from xmodal.config import known_losses

    def values(v: Any, name: str, check) -> list:
        if isinstance(v, (str, bytes, dict)) or hasattr(v, "shape") or not hasattr(v, "__iter__"):
            raise TypeError(f"{name}: expected a list, got {short_repr(v)}")
        out = [check(x) for x in v]
        if not out:
            raise ValueError(f"{name}: empty")
        return out

    def one_of(options: Iterable[str], name: str):
        options = tuple(options)

        def check(x: Any) -> str:
            if not isinstance(x, str) or x not in options:
                raise ValueError(f"{name}: unknown {short_repr(x)}; expected one of {', '.join(options)}")
            return x
        return check

    datasets = values(datasets, "datasets", one_of(DATASETS, "datasets"))
    objectives = values(objectives, "objectives", one_of(known_losses(), "objectives"))
    seeds = values(seeds, "seeds", lambda x: integer(x, "seeds", minimum=0, maximum=2 ** 32 - 1))
    ts_variants = values(ts_variants, "ts_variants", lambda x: flag(x, "ts_variants"))
    noise = values(noise, "noise", lambda x: number(x, "noise", minimum=0.0))
    if not isinstance(out, (str, os.PathLike)) or not str(out):
        raise TypeError(f"out: expected a folder path, got {short_repr(out)}")
    if epochs is not None:
        epochs = positive_int(epochs, "epochs")
    if synthetic is not None and not isinstance(synthetic, dict):
        raise TypeError(f"synthetic: expected a dict of xmodal.data.synthetic knobs, got {short_repr(synthetic)}")
    progress = None if progress is None else flag(progress, "progress")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    cells = [Cell(ds, obj, ts, seed, nz) for ds in datasets for nz in noise for obj in objectives
             for ts in ts_variants for seed in seeds]
    results: dict[tuple, list[dict]] = {}
    t0 = time.perf_counter()
    bar = progress_bar(cells, desc="bench", unit="cell", show=progress)
    for cell in bar:
        bar.set_postfix_str(cell.path)
        summary = run_cell(cell, root, epochs=epochs, synthetic=synthetic if cell.dataset == "synthetic" else None)
        if summary is not None:
            results.setdefault((cell.dataset, cell.noise, cell.label), []).append(summary)
    rows = []
    for (ds, nz, label), summaries in results.items():
        split = "test" if "test" in summaries[0] else "val"
        for norm in summaries[0][split]:
            if norm == "protocol":  # the split's protocol card (metrics.json[split]["protocol"])
                continue
            rows.append({"dataset": ds, "noise": nz, "objective": label, "normalizer": norm,
                         **aggregate(summaries, norm)})
    write_tables(rows, root, elapsed=time.perf_counter() - t0)
    return rows


def _fmt(pair: tuple[float, float], metric: str) -> str:
    """``mean ± std`` of ``metric`` (:func:`xmodal.metrics.format_metric`; one seed: no std)."""
    from xmodal.metrics import format_metric

    return format_metric(metric, *pair)


def _seconds(pair: tuple[float, float]) -> str:
    m, s = pair
    return f"{m:.0f}" if s != s else f"{m:.0f} ± {s:.0f}"


def markdown(rows: list[dict]) -> str:
    """One Markdown table per (dataset, noise)."""
    parts = []
    keys = sorted({(r["dataset"], r["noise"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for ds, nz in keys:
        sub = [r for r in rows if r["dataset"] == ds and r["noise"] == nz]
        split = sub[0]["split"]
        name = {"val": "dev/val (also used for early stopping and normaliser selection)",
                "test": "test (model and normaliser selected on val)"}[split]
        noise = f", {nz:.0%} of training pairs shuffled" if nz else ""
        seeds = f"mean ± std over {sub[0]['n']} seeds" if sub[0]["n"] > 1 else "one seed"
        parts.append(f"### {ds}{noise}: {name}, {seeds}\n")
        parts.append("| objective | normaliser | t2v R@1 | t2v R@5 | t2v R@10 | t2v MdR | t2v MnR | "
                     "v2t R@1 | v2t R@5 | v2t R@10 | v2t MdR | v2t MnR | train s |")
        parts.append("|---|---|" + "---:|" * 11)
        for r in sub:
            cells = [_fmt(r[f"{d} {k}"], k) for d in ("t2v", "v2t") for k in METRIC_KEYS]
            mark = " *" if r["normalizer"] in r["selected"].split(",") else ""
            parts.append(f"| {r['objective']} | {r['normalizer']}{mark} | " + " | ".join(cells)
                         + f" | {_seconds(r['train s'])} |")
        parts.append("")
    parts.append("`*`: the normaliser selected on val for (some of) the seeds. `ncl`: Sinkhorn biases "
                 "from the NCL loss's own training query queue; `sinkhorn`: from a random bank of "
                 "training queries; `dn`: distribution normalisation (lambda 0.25); `qbnorm`: QB-Norm "
                 "(k=1, beta=20). Train time: seconds of the training loop (one CPU thread).")
    return "\n".join(parts)


def write_tables(rows: list[dict], root: Path, *, elapsed: float | None = None, text: str | None = None) -> None:
    """``results.md`` (``text``, default :func:`markdown` of the rows) and ``results.csv``."""
    text = markdown(rows) if text is None else text
    if elapsed is not None:
        text += f"\n\nGrid wall time: {elapsed / 60:.1f} min (finished runs are reused).\n"
    (root / "results.md").write_text(text)
    fields = ["dataset", "noise", "objective", "normalizer", "split", "n"]
    metric_cols = [f"{d} {k}" for d in ("t2v", "v2t") for k in METRIC_KEYS] + ["train s"]
    with open(root / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields + [f"{c} {x}" for c in metric_cols for x in ("mean", "std")] + ["selected"])
        for r in rows:
            w.writerow([r[k] for k in fields] + [f"{v:.4f}" for c in metric_cols for v in r[c]] + [r["selected"]])


# --------------------------------------------------------------------------- NCL Fig. 5


def queue_prefix_metrics(run_dir: str | Path, split: Any, sizes: Iterable[int]) -> dict[int, dict]:
    """Metrics of a trained NCL run under ``none`` and ``ncl`` with query queues of each size.

    NCL Sec. 3.4 / Fig. 5: the train query queues are used only at test time (they never
    enter the loss), and a FIFO queue is newest first, so the queue a run with
    ``queue_size=K`` ends with is the first ``K`` rows of the queue of the same run with a
    larger size (tested). One run with the largest size therefore gives every point of
    the sweep: its stored NCL bank is cut to ``K`` rows and the Sinkhorn biases are fitted
    on that bank against the evaluated gallery.

    Args:
        run_dir: an ``xmodal train`` run of the NCL loss (``model.pt`` with an ``ncl`` bank).
        split: the evaluated :class:`~xmodal.data.PairedSplit`.
        sizes: queue sizes ``K``.

    Returns:
        ``{K: {"none": {"t2v", "v2t"}, "ncl": {...}, "bank_rows": rows used}}``.
    """
    import dataclasses as dc

    from xmodal.retrieval.evaluate import evaluate_normalizers
    from xmodal.models import load_model

    model = load_model(run_dir)
    tt = model.test_time
    if "ncl" not in tt.banks:
        raise ValueError(f"run_dir: {run_dir} has no NCL query bank (train it with loss.name=ncl)")
    text_q, video_q = tt.banks["ncl"]
    out = {}
    for k in sizes:
        sub = dc.replace(tt, banks={**tt.banks, "ncl": (text_q[:k], video_q[:k])},
                         names=tuple(dict.fromkeys(["none", "ncl", *tt.names])))
        res = evaluate_normalizers(["none", "ncl"], sub, model, split)
        out[int(k)] = {**res, "bank_rows": int(min(k, len(text_q)))}
    return out


def run_queue_sweep(*, datasets: Iterable[str], sizes: Iterable[int], seeds: Iterable[int], out: str | Path,
                    epochs: int | None = None, synthetic: dict | None = None,
                    progress: bool | None = True) -> list[dict]:
    """NCL Fig. 5 (query queue size vs text-to-video R@1) as a table.

    One NCL run per dataset and seed with the largest queue (:func:`queue_prefix_metrics`
    evaluates every smaller size on it); rows (one per dataset, size and normaliser
    ``none`` / ``ncl``) in the schema of :func:`run_grid`, objective ``ncl queue=K``,
    written to ``results.md`` (the Fig. 5 table) and ``results.csv``.
    """
    from xmodal.config import load_config
    from xmodal.progress import progress as progress_bar
    from xmodal.training.loop import load_splits

    sizes = sorted({int(k) for k in sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sizes: expected positive queue sizes, got {sizes}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    cells = [Cell(ds, "ncl", False, seed, queue_size=sizes[-1]) for ds in datasets for seed in seeds]
    t0 = time.perf_counter()
    per: dict[tuple[str, int], list[dict]] = {}
    for cell in progress_bar(cells, desc="ncl queue sweep", unit="cell", show=progress):
        summary = run_cell(cell, root, epochs=epochs, synthetic=synthetic if cell.dataset == "synthetic" else None)
        run_dir = root / "runs" / cell.path
        splits = load_splits(load_config(run_dir / "config.yaml"))
        split = "test" if "test" in splits else "val"
        for k, res in queue_prefix_metrics(run_dir, splits[split], sizes).items():
            per.setdefault((cell.dataset, k), []).append(
                {split: {"none": res["none"], "ncl": res["ncl"]}, "train_time_s": summary["train_time_s"],
                 "normalizer": summary["normalizer"], "bank_rows": res["bank_rows"]})
    rows = []
    for (ds, k), summaries in per.items():
        for norm in ("none", "ncl"):
            agg = aggregate(summaries, norm)
            agg["selected"] = ""  # a sweep, not a selection
            rows.append({"dataset": ds, "noise": 0.0, "objective": f"ncl queue={k}", "normalizer": norm,
                         "queue_size": k, "bank_rows": [s["bank_rows"] for s in summaries], **agg})
    write_tables(rows, root, elapsed=time.perf_counter() - t0, text=queue_markdown(rows))
    return rows


def queue_markdown(rows: list[dict]) -> str:
    """The NCL Fig. 5 table: t2v R@1 without / with the NCL test-time biases per queue size."""
    parts = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        sub = [r for r in rows if r["dataset"] == ds]
        first = sub[0]
        seeds = f"mean ± std over {first['n']} seeds" if first["n"] > 1 else "one seed"
        parts.append(f"### {ds}: NCL query queue size vs text-to-video R@1 (NCL Fig. 5), "
                     f"{first['split']} split, {seeds}\n")
        parts.append("| queue size | bank rows | t2v R@1 none | t2v R@1 ncl | gain | v2t R@1 none | v2t R@1 ncl |")
        parts.append("|---:|---:|---:|---:|---:|---:|---:|")
        for k in sorted({r["queue_size"] for r in sub}):
            none = next(r for r in sub if r["queue_size"] == k and r["normalizer"] == "none")
            ncl = next(r for r in sub if r["queue_size"] == k and r["normalizer"] == "ncl")
            gain = ncl["t2v R@1"][0] - none["t2v R@1"][0]
            rows_used = sorted(set(ncl["bank_rows"]))
            parts.append(f"| {k} | {','.join(map(str, rows_used))} | {_fmt(none['t2v R@1'], 2)} | "
                         f"{_fmt(ncl['t2v R@1'], 2)} | {gain:+.2f} | {_fmt(none['v2t R@1'], 2)} | "
                         f"{_fmt(ncl['v2t R@1'], 2)} |")
        parts.append("")
    parts.append("One NCL run per seed with the largest queue; a smaller queue is the newest K rows of "
                 "it (what a run with queue_size=K keeps: the queues never enter the loss). `bank rows`: "
                 "train queries actually in the queue (fewer than K when training saw fewer). `ncl`: "
                 "Sinkhorn biases (NCL eq. 13) from that bank; `none`: cosine scores, the same for every K.")
    return "\n".join(parts)
