"""One self-contained HTML page per run or bench directory (``xmodal report``).

Collaborative Experts writes a page of predicted rankings after every evaluation;
this module does the same for an ``xmodal train`` run directory: summary and config,
results per test-time normaliser (val and test, from ``metrics.json``), training
curves and schedule, retrieval mass and FN/FP-by-mass (NCL Fig. 3), a head/tail
breakdown by class frequency (TS++), and example text -> video rankings with the
correct item marked (image thumbnails with ``images=``). For an ``xmodal bench``
directory it renders the grid tables with the best cell per column marked.

Everything is inline: PNGs and thumbnails are ``data:`` URIs, the CSS sits in the
page, and there are no links, scripts or external resources.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from xmodal._validate import duck, positive_int, short_repr, whole_number
from xmodal.features.media import find_media
from xmodal.metrics.formatting import format_metric
from xmodal.metrics.paired import format_diff, format_p

LOWER_IS_BETTER = ("MdR", "MnR", "train s")
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1320px;color:#1d1d1f;line-height:1.4;padding:0 16px}
h1{font-size:24px;margin-bottom:4px}h2{font-size:19px;border-bottom:1px solid #ddd;padding-bottom:4px;
margin-top:32px}h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:8px 0 14px;font-size:13px}
th,td{border:1px solid #d5d5d5;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f3f6}td.l,th.l{text-align:left}
td.best{font-weight:700;background:#e3f4e1}tr.sel td{background:#fff8dc}tr.sel td.best{background:#d8efc9}
img.plot{max-width:100%;border:1px solid #eee;margin:4px 0}
.muted{color:#666;font-size:13px}pre{background:#f7f7f9;padding:10px;font-size:12px;overflow:auto;
max-height:420px}
.query{border:1px solid #ddd;border-radius:6px;padding:8px 10px;margin:10px 0}
.query .q{font-weight:600;margin-bottom:6px}
.ranks{display:flex;gap:8px;flex-wrap:wrap}
.item{width:150px;font-size:12px;border:2px solid #e5e5e5;border-radius:4px;padding:4px;
overflow-wrap:anywhere}
.item.hit{border-color:#2e9d3a;background:#eef9ee}.item img{width:140px;height:105px;object-fit:cover;
display:block;margin-bottom:3px}
.badge{display:inline-block;border-radius:3px;padding:0 5px;font-size:12px;color:#fff;background:#888}
.badge.ok{background:#2e9d3a}.badge.miss{background:#c0392b}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _png(path_or_bytes: Any, alt: str) -> str:
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else Path(path_or_bytes).read_bytes()
    return (f'<img class="plot" alt="{_e(alt)}" '
            f'src="data:image/png;base64,{base64.b64encode(data).decode()}">')


_REFUSED: set[str] = set()  # files a thumbnail was refused for (named once)


def _thumb(path: Path | None, size: int = 160) -> str | None:
    """A ``data:`` URI of :func:`xmodal.features.media.make_thumbnail` (an image, or a video's middle
    frame); a file it refuses (over the pixel budget, unreadable) is named on one stderr line."""
    import sys

    from xmodal.features.media import make_thumbnail

    if path is None:
        return None
    try:
        data = make_thumbnail(path, size, quality=80)
    except ValueError as exc:
        if str(path) not in _REFUSED:  # one line per file, however many rankings show it
            _REFUSED.add(str(path))
            print(f"xmodal report: warning: --images: {exc}; shown without a thumbnail", file=sys.stderr)
        return None
    return f"data:image/jpeg;base64,{base64.b64encode(data).decode()}"


def _fmt(v: Any, column: str, digits: int | None = None, std: Any = None) -> str:
    """A cell of column ``column``: :func:`xmodal.metrics.format_metric` (or ``digits`` decimals when given)."""
    if isinstance(v, float) or v is None:
        if digits is None:
            return _e(format_metric(column, v, std))
        if v is None:
            return "–"
        std_ok = std is not None and std == std
        return f"{v:.{digits}f}" + (f" ± {std:.{digits}f}" if std_ok else "")
    return _e(v)


def _seq(v: Any) -> bool:
    return isinstance(v, (list, tuple, range))


def _indices(v: Any, name: str) -> list[int]:
    """A list of non-negative column / row indices."""
    if isinstance(v, (str, bytes, dict)) or not isinstance(v, Iterable) or (hasattr(v, "ndim") and v.ndim != 1):
        raise TypeError(f"{name}: expected a list of indices, got {short_repr(v)}")
    return [whole_number(j, name) for j in v]


def table(header: list[str], rows: list[list[Any]], *, best_cols: Iterable[int] = (),
          lower: Callable[[str], bool] = lambda h: h.split()[-1] in LOWER_IS_BETTER,
          left_cols: int = 1, selected: Iterable[int] = (), digits: int | None = None) -> str:
    """An HTML table; in ``best_cols`` the best value (max, or min where ``lower(header)``)
    is bold/green. Cells may be floats, strings or ``(mean, std)`` pairs, printed as every xmodal
    table prints the column's metric (:func:`xmodal.metrics.format_metric`), or with ``digits``
    decimals when given."""
    if not _seq(header) or not all(isinstance(h, str) for h in header):
        raise TypeError(f"header: expected a list of column names, got {short_repr(header)}")
    if not _seq(rows) or not all(_seq(r) for r in rows):
        raise TypeError(f"rows: expected a list of rows (lists of cells), got {short_repr(rows)}")
    if not callable(lower):
        raise TypeError(f"lower: expected a callable, got {type(lower).__name__}")
    best_cols, selected = _indices(best_cols, "best_cols"), _indices(selected, "selected")
    width = min((len(r) for r in rows), default=0)
    if any(j >= min(width, len(header)) for j in best_cols) and rows:
        raise ValueError(f"best_cols: column index out of range for {len(header)} column(s)")
    left_cols = whole_number(left_cols, "left_cols")
    digits = None if digits is None else whole_number(digits, "digits")

    def val(c):
        return c[0] if isinstance(c, tuple) else c

    best: dict[int, set[int]] = {}
    for j in best_cols:
        vals = [(i, val(r[j])) for i, r in enumerate(rows) if isinstance(val(r[j]), (int, float))
                and np.isfinite(val(r[j]))]
        if vals:
            target = (min if lower(header[j]) else max)(v for _, v in vals)
            best[j] = {i for i, v in vals if v == target}
    sel = set(selected)
    out = ["<table><tr>" + "".join(f'<th class="{"l" if j < left_cols else ""}">{_e(h)}</th>'
                                   for j, h in enumerate(header)) + "</tr>"]
    for i, r in enumerate(rows):
        cells = []
        for j, c in enumerate(r):
            cls = ["l"] if j < left_cols else []
            if i in best.get(j, ()):
                cls.append("best")
            column = header[j] if j < len(header) else ""
            txt = _fmt(c[0], column, digits, c[1]) if isinstance(c, tuple) else _fmt(c, column, digits)
            cells.append(f'<td class="{" ".join(cls)}">{txt}</td>')
        out.append(f'<tr class="{"sel" if i in sel else ""}">' + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"{GENERATOR}<title>{_e(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


# --------------------------------------------------------------------------- run pages

METRIC_KEYS = ("R@1", "R@5", "R@10", "MdR", "MnR")


def chance_levels(text_to_video: Any, num_videos: int) -> dict:
    """Gallery sizes and the R@1 (%) of a random ranking, per direction.

    t2v: each text has one correct video among ``num_videos``: ``100 / N``. v2t: a video with
    ``n_v`` texts among ``T`` is right at rank 1 with probability ``n_v / T``, averaged over the
    videos that have texts (the queries).
    """
    t2v = np.asarray(text_to_video)
    counts = np.bincount(t2v, minlength=num_videos)
    queried = counts[counts > 0]
    return {"videos": int(num_videos), "texts": int(len(t2v)), "t2v": 100.0 / num_videos,
            "v2t": float(100.0 * (queried / len(t2v)).mean()) if len(queried) else float("nan")}


def results_tables(metrics: dict, sizes: dict | None = None) -> list[str]:
    """Per split, one row per normaliser (selected one highlighted, best per column bold);
    ``sizes[split]`` (:func:`chance_levels`) adds the gallery sizes and chance R@1."""
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics: expected a dict (metrics.json), got {type(metrics).__name__}")
    if sizes is not None and not isinstance(sizes, dict):
        raise TypeError(f"sizes: expected a dict or None, got {type(sizes).__name__}")
    parts = []
    for split in ("val", "test"):
        res = {k: v for k, v in (metrics.get(split) or {}).items() if k != "protocol"}  # the card: its own section
        if not res:
            continue
        if not isinstance(res, dict) or not all(isinstance(r, dict) and all(isinstance(v, dict) for v in r.values())
                                                for r in res.values()):
            raise TypeError(f"metrics[{split!r}]: expected {{normaliser: {{direction: {{metric: value}}}}}}")
        names = list(res)
        # p2v / v2p (paragraph <-> video) where the split has groups; a hierarchy's flat reference
        # p2v_flat / v2p_flat (its clip embeddings mean-pooled) beside its global towers' p2v / v2p
        dirs = [d for d in ("t2v", "v2t", "p2v", "v2p", "p2v_flat", "v2p_flat") if all(d in res[n] for n in names)]
        header = ["normaliser"] + [f"{d} {k}" for d in dirs for k in METRIC_KEYS]
        rows = [[n + (" (selected)" if n == metrics.get("normalizer") else "")]
                + [res[n][d].get(k) for d in dirs for k in METRIC_KEYS] for n in names]
        parts.append(f"<h3>{_e(split)}</h3>")
        c = (sizes or {}).get(split)
        if c and (not isinstance(c, dict) or not {"videos", "texts", "t2v", "v2t"} <= set(c)):
            raise TypeError(f"sizes[{split!r}]: expected chance_levels()'s dict (videos, texts, t2v, v2t)")
        if c:
            parts.append(f'<p class="muted">Gallery: {c["videos"]} videos (t2v), {c["texts"]} texts (v2t); '
                         f'chance R@1: t2v {c["t2v"]:.2f}%, v2t {c["v2t"]:.2f}%.</p>')
        parts.append(table(header, rows, best_cols=range(1, len(header)),
                           selected=[i for i, n in enumerate(names) if n == metrics.get("normalizer")]))
    return parts


_CARD_ROWS = (("queries", "num_queries"), ("gallery", "gallery_size"), ("chance R@1 (%)", "chance_r1"),
              ("caption policy", "caption_policy"), ("captions per video", "captions_per_video"),
              ("video -> text protocol", "v2t"), ("tie rule", "tie_rule"), ("selected normaliser", "normalizer"),
              ("its bank", "bank_source"), ("uses the test queries", "uses_test_queries"),
              ("split sha256", "split_sha256"), ("git revision", "git_revision"), ("uncommitted changes", "git_dirty"))


def protocol_section(metrics: dict) -> list[str]:
    """The protocol card of each split (``metrics.json[split]["protocol"]``), as a table."""
    cards = {s: (metrics.get(s) or {}).get("protocol") for s in ("val", "test")}
    cards = {s: c for s, c in cards.items() if isinstance(c, dict)}
    if not cards:
        return []

    def cell(v: Any) -> str:
        if isinstance(v, dict):
            return ", ".join(f"{k} {format_metric('chance', x) if isinstance(x, float) else x}" for k, x in v.items())
        return "–" if v is None else str(v)

    rows = [[label] + [cell(c.get(key)) for c in cards.values()] for label, key in _CARD_ROWS]
    return ["<h2>Protocol card</h2>",
            '<p class="muted">How the numbers were made (<code>metrics.json[split]["protocol"]</code>); '
            "<code>xmodal compare</code> pairs two results only when these agree.</p>",
            table([""] + list(cards), rows, left_cols=len(cards) + 1)]


def selection_section(metrics: dict) -> list[str]:
    """How the run chose its normaliser on val (the paired test of each candidate against none)."""
    sel = metrics.get("selection") or {}
    if not sel.get("tests"):
        return []
    level = f"{100 * sel.get('level', 0.95):.0f}%"
    rows = [[n, format_diff(t["diff"], 2, (t["ci_low"], t["ci_high"])),
             "[" + ", ".join(format_diff(x, 2, (t["diff"],)) for x in (t["ci_low"], t["ci_high"])) + "]",
             format_p(t["p_value"], t.get("p_floor", False)),
             "clear" if t["clear"] else "not clear"] for n, t in sel["tests"].items()]
    note = sel.get("index_note") or (f"'xmodal index --normalizer selected' folds {sel.get('index_normalizer')}, "
                                     f"the selected normaliser.")
    return ["<h2>Normaliser selection on val</h2>",
            f'<p class="muted">Rule <b>{_e(sel["rule"])}</b>: a normaliser replaces none only when the lower end of '
            f"the {level} paired bootstrap interval of its val {_e(sel['metric'])} minus none's is above 0. "
            f"Selected: <b>{_e(sel['selected'])}</b>. {_e(note)}</p>",
            table(["normaliser", f"val {sel['metric']} − none", f"{level} CI", "p", "verdict"], rows, left_cols=1,
                  digits=2)]


def intervals_section(path: Path, n_boot: int = 2000) -> list[str]:
    """R@1 of every normaliser with its bootstrap interval over the queries, and its paired
    difference to none (interval, p-value), from ``per_query.npz``."""
    from xmodal.metrics.paired import bootstrap_interval, paired_test
    from xmodal.retrieval.perquery_read import read_per_query

    if not path.is_file():
        return []
    results, _ = read_per_query(path)
    parts = ["<h2>Intervals (per-query bootstrap)</h2>",
             f'<p class="muted">R@1 with its 95% percentile bootstrap interval over the queries ({n_boot} '
             "resamples), and the paired difference to none with its interval and sign-flip p-value "
             "(<code>xmodal.metrics.paired_test</code>; <code>xmodal compare</code> does the same between runs).</p>"]
    for split in ("val", "test"):
        res = results.get(split)
        if not res or "none" not in res:
            continue
        dirs = [d for d in ("t2v", "v2t", "p2v", "v2p") if d in res["none"]][:2]
        header = ["normaliser"] + [f"{d} {h}" for d in dirs for h in ("R@1", "95% CI", "− none", "CI", "p")]
        rows = []
        for name, by_dir in res.items():
            row: list[Any] = [name]
            for d in dirs:
                value, lo, hi = bootstrap_interval(by_dir[d]["rank"], n_boot=n_boot)
                row += [value, f"[{lo:.2f}, {hi:.2f}]"]
                if name == "none":
                    row += ["–", "–", "–"]
                else:
                    t = paired_test(res["none"][d]["rank"], by_dir[d]["rank"], n_boot=n_boot)
                    ends = (t["ci_low"], t["ci_high"])
                    row += [format_diff(t["diff"], 2, ends),
                            "[" + ", ".join(format_diff(x, 2, (t["diff"],)) for x in ends) + "]",
                            format_p(t["p_value"], t["p_floor"])]
            rows.append(row)
        parts += [f"<h3>{_e(split)}</h3>", table(header, rows, left_cols=1)]
    return parts


def comparison_section(run: Path, others: list[str], n_boot: int = 10000) -> list[str]:
    """``xmodal compare RUN OTHERS`` as HTML: what is compared, one table per comparison (heads alone,
    and as deployed), the verdicts and how to read them (:func:`xmodal.reporting.compare.compare`)."""
    from xmodal.reporting.compare import compare, load_result, markdown

    a, b = [load_result(run)], [load_result(p) for p in others]
    try:
        out = compare(a, b, n_boot=n_boot)
    finally:
        for r in (*a, *b):
            if r.source is not None:
                r.source.close()
    text = markdown(out).split("\n")
    parts = ["<h2>Comparison (xmodal compare)</h2>",
             f'<p class="muted">A = this run, B = {_e(", ".join(others))}. {_e(text[0])}</p>']
    parts += [f'<p class="muted">{_e(line)}</p>' for line in text[1:] if line.startswith(("NOTE", "WARNING"))]
    level = f"{100 * out['level']:.0f}%"
    for c in out["comparisons"]:
        seeds = any(r["unit"] == "seeds" for r in c["rows"])
        rows = [[r["direction"], r["metric"], format_metric(r["metric"], r["a"]), format_metric(r["metric"], r["b"]),
                 format_diff(r["diff"], 1 if r["metric"] in LOWER_IS_BETTER else 2, (r["ci_low"], r["ci_high"])),
                 "[" + ", ".join(format_diff(x, 1 if r["metric"] in LOWER_IS_BETTER else 2, (r["diff"],))
                                 for x in (r["ci_low"], r["ci_high"])) + "]",
                 format_p(r["p_value"], r["p_floor"]), format_p(r["p_holm"], r["p_floor"]), r["verdict"]]
                for r in c["rows"]]
        who = lambda side: ", ".join(f"{p} ({n})" for p, n in zip(side["runs"], side["normalizers"]))  # noqa: E731
        parts += [f"<h3>{_e(c['label'])}: {_e(c['normalizer_a'])} vs {_e(c['normalizer_b'])}</h3>",
                  f'<p class="muted">A: {_e(who(c["a"]))}; B: {_e(who(c["b"]))}</p>',
                  table(["direction", "metric", "A", "B", "B − A", f"{level} CI",
                         "p (seeds)" if seeds else "p", "p (Holm)", "verdict"], rows, left_cols=2)]
    parts += [f'<p class="muted">{_e(line)}</p>' for line in text if line.startswith(("B − A", "p (seeds)", "p: "))]
    return parts


def _summary(run: Path, metrics: dict) -> str:
    keys = [("best epoch", "best_epoch"), ("epochs run", "epochs_run"), ("selection metric", "metric"),
            ("val score", "val_score"), ("test-time temperature", "temperature"),
            ("selected normaliser", "normalizer"), ("train time (s)", "train_time_s")]
    rows = [[label, metrics[k] if not isinstance(metrics[k], float) else f"{metrics[k]:.4g}"]
            for label, k in keys if k in metrics]
    return table(["", "value"], rows, left_cols=2)


def _provenance_section(run: Path) -> list[str]:
    """``provenance.json`` (xmodal.training.provenance): command, versions, git, times, data hashes."""
    path = run / "provenance.json"
    if not path.is_file():
        return []
    try:
        p = json.loads(path.read_text())
    except (OSError, ValueError):
        return ["<h2>Provenance</h2>", f'<p class="muted">{_e(path.name)} is unreadable.</p>']
    keys = ["command", "xmodal_version", "torch_version", "python_version", "git_revision", "git_dirty",
            "started", "resumed", "finished"]
    rows = [[k, ", ".join(map(str, p[k])) if isinstance(p.get(k), list) else
             ("–" if p.get(k) is None else str(p[k]))] for k in keys if k in p]
    parts = ["<h2>Provenance</h2>", table(["", "value"], rows, left_cols=2)]
    data = p.get("data") or {}
    if data:
        parts.append(table(["data file read", "sha256"], [[f, h] for f, h in data.items()], left_cols=2))
    else:
        parts.append('<p class="muted">No data files read (built-in synthetic data).</p>')
    return parts


def _head_tail_section(model: Any, splits: dict, name: str, cfg: Any, item: str = "video",
                       model_val: Any = None) -> list[str]:
    """t2v R@K per head/tail group of the val texts (classes: labels, else k-means of the layout's caption
    features); ``model_val``: the val split as the model reads it (a clip4clip run's tokens), default val."""
    from xmodal.data import kmeans_classes
    from xmodal.metrics import head_tail_groups, retrieval_by_group
    from xmodal.reporting.plots import t2v_similarity

    if "train" not in splits:  # a zero-shot run on val / test alone (xmodal.config.zero_shot_without_train)
        return ['<p class="muted">No head / tail breakdown: its groups are the training classes by frequency, '
                "and this zero-shot run has no train split.</p>"]
    train, val = splits["train"], splits["val"]
    if train.text_labels is not None and val.text_labels is not None:
        counts = np.bincount(train.text_labels, minlength=int(max(train.text_labels.max(),
                                                                   val.text_labels.max())) + 1)
        ids, how = val.text_labels, "dataset class labels"
    else:
        k = int(getattr(getattr(cfg, "schedule", None), "k", 200) or 200)
        both = np.concatenate([train.text, val.text])
        k = min(k, len(both))
        lab = kmeans_classes(both, k=k, seed=0)
        counts = np.bincount(lab[:train.num_texts], minlength=k)
        ids, how = lab[train.num_texts:], f"k-means classes of the captions (k={k}, TS++ Sec. 4.1.2)"
    groups = head_tail_groups(ids, class_counts=counts, head_mass=0.8)
    parts = [f'<p class="muted">Classes: {_e(how)}; head = the most frequent training classes '
             f"holding 80% of the training texts, tail = the rest. Text-to-{_e(item)} on val.</p>"]
    header = ["normaliser", "group", "queries", "R@1", "R@5", "R@10", "MdR", "MnR"]
    rows = []
    for n in dict.fromkeys(["none", name]):
        sim = t2v_similarity(model, val if model_val is None else model_val, n)
        res = retrieval_by_group(sim, val.text_to_video, groups, ks=(1, 5, 10))
        for g, r in res.items():
            rows.append([n, g, r["num_queries"], r["R@1"], r["R@5"], r["R@10"], r["MdR"], r["MnR"]])
    return parts + [table(header, rows, left_cols=2)]


def _names(root: Any, split: str, stem: str, n: int) -> list[str] | None:
    if not root:
        return None
    for item in ("image", "video"):
        p = Path(root) / f"{split}_{item}s.txt"
        if p.is_file():
            names = [line.strip() for line in p.read_text().splitlines()]
            return names if len(names) == n else None
    return None


def _val_names(root: Any, d: Any, n: int) -> list[str] | None:
    """Names of the validation split's videos: the held-out training rows when
    ``data.val_from_train`` carved it (:func:`xmodal.training.loop.carved_rows`)."""
    if not d.val_from_train:
        return _names(root, d.val_split, "images", n) if d.val_split else None
    from xmodal.training.loop import carved_rows

    names = None
    if root:
        for item in ("image", "video"):
            p = Path(root) / f"{d.train_split}_{item}s.txt"
            if p.is_file():
                names = [line.strip() for line in p.read_text().splitlines()]
                break
    if names is None or len(names) <= d.val_from_train:
        return None
    held = carved_rows(len(names), d.val_from_train)[1]
    return [names[i] for i in held] if held.size == n else None


def examples_section(model: Any, split: Any, name: str, *, num: int = 8, seed: int = 0, top: int = 5,
                     video_names: list[str] | None = None, images: Path | None = None,
                     item: str | None = None) -> list[str]:
    """For a seeded sample of text queries: the top results, the correct one marked, its rank."""
    import torch

    from xmodal.reporting.plots import t2v_similarity

    duck(model, "model", "a loaded model (similarity)", ("similarity",))
    duck(split, "split", "a PairedSplit", ("video_input",), ("text", "text_to_video", "num_texts", "captions"))
    if not isinstance(name, str):
        raise TypeError(f"name: expected a normaliser name, got {short_repr(name)}")
    num, top = whole_number(num, "num"), positive_int(top, "top")  # num 0: no examples (--examples 0)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an integer, got {short_repr(seed)}")
    if seed < 0:
        raise ValueError(f"seed: must be >= 0, got {int(seed)}")
    if video_names is not None and not _seq(video_names):
        raise TypeError(f"video_names: expected a list of names or None, got {short_repr(video_names)}")
    if item is not None and not isinstance(item, str):
        raise TypeError(f"item: expected a string or None, got {short_repr(item)}")
    if images is not None and not isinstance(images, (str, os.PathLike)):
        raise TypeError(f"images: expected a folder path or None, got {short_repr(images)}")
    sim = t2v_similarity(model, split, name)
    rng = np.random.default_rng(seed)
    queries = np.sort(rng.choice(split.num_texts, size=min(num, split.num_texts), replace=False))
    t2v = split.text_to_video
    item = item or ("image" if images else "video")
    parts = [f'<p class="muted">Text -&gt; {_e(item)} retrieval on '
             f"{_e(split.name or 'val')} with normaliser <b>{_e(name)}</b>; {len(queries)} queries "
             f"drawn with seed {seed}. Green: the correct item. Rank: pessimistic ties.</p>"]
    for q in queries:
        row = sim[int(q)]
        order = torch.argsort(row, descending=True, stable=True)[:top].tolist()
        correct = int(t2v[q])
        rank = int((row >= row[correct]).sum())
        text = split.captions[q] if split.captions else f"text #{q}"
        badge = f'<span class="badge {"ok" if rank == 1 else "miss"}">rank {rank}</span>'
        items = []
        shown = order if correct in order else order + [correct]
        for pos, j in enumerate(shown):
            label = video_names[j] if video_names else f"{item} {j}"
            r = pos + 1 if j in order else rank
            img = ""
            if images is not None and video_names:
                uri = _thumb(find_media(images, video_names[j]))
                img = f'<img alt="{_e(label)}" src="{uri}">' if uri else '<div class="muted">(no image)</div>'
            gap = ' style="margin-left:18px"' if j not in order else ""
            items.append(f'<div class="item{" hit" if j == correct else ""}"{gap}>{img}'
                         f"<b>#{r}</b> {_e(label)}<br><span class=\"muted\">score {float(row[j]):.3f}"
                         "</span></div>")
        parts.append(f'<div class="query"><div class="q">“{_e(text)}” {badge}</div>'
                     f'<div class="ranks">{"".join(items)}</div></div>')
    return parts


def _read_metrics(path: Path) -> dict:
    """``metrics.json`` as written by ``xmodal train`` (``{}`` when absent); anything else
    is a one-line ValueError naming the file."""
    if not path.is_file():
        return {}
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(metrics, dict):
        raise ValueError(f"{path}: expected a JSON object written by 'xmodal train', got a "
                         f"{type(metrics).__name__}")
    for split in ("val", "test"):
        res = metrics.get(split)
        if res is None:
            continue
        if not (isinstance(res, dict) and all(isinstance(m, dict) and all(isinstance(m.get(d, {}), dict)
                                                                          for d in ("t2v", "v2t"))
                                              for k, m in res.items() if k != "protocol")):
            raise ValueError(f"{path}: '{split}' is not a table of metrics per normaliser")
    return metrics


def _read_text(path: Path) -> str:
    """A run's text file as UTF-8; anything else is a one-line ValueError naming the file."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file ({str(exc).splitlines()[0]})") from None


def _read_log(path: Path) -> list[dict]:
    """``log.jsonl`` records (one JSON object with an ``epoch`` per line); anything else is a
    one-line ValueError naming the file and line."""
    records = []
    for i, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}: line {i} is not valid JSON ({str(exc).splitlines()[0]})") from None
        if not isinstance(r, dict) or "epoch" not in r:
            raise ValueError(f"{path}: line {i} is not an epoch record written by 'xmodal train'")
        records.append(r)
    return records


def run_report(run: Path, *, images: Path | None = None, num_examples: int = 8, seed: int = 0,
               data: Path | None = None, log: Any = None, compare: list[str] | None = None) -> str:
    if log is not None and not callable(log):
        raise TypeError(f"log: expected a callable or None, got {type(log).__name__}")
    say = log if log is not None else (lambda line: None)  # xmodal report's progress lines
    from xmodal.config import load_config
    from xmodal.metrics import normalization_error
    from xmodal.models import load_model
    from xmodal.reporting.plots import (gallery_item, mass_analysis, plot_curves, plot_fn_fp, plot_retrieval_mass,
                              t2v_similarity)
    from xmodal.training.loop import load_splits

    metrics = _read_metrics(run / "metrics.json")
    compared = []
    if compare:  # first: a comparison that cannot be made stops the report before its slow parts
        say("report: comparing with " + ", ".join(compare))
        compared = comparison_section(run, compare)
    body = [f"<h1>xmodal run report</h1><p class=\"muted\">{_e(run.resolve())}</p>"]
    if not (run / "metrics.json").is_file() and (run / "checkpoint.pt").is_file():
        body.append("<p><b>This run has not finished</b> (no metrics.json: it was stopped or killed). The page shows "
                    "its last checkpoint, with no fitted test-time normaliser; <code>xmodal train CONFIG --out "
                    f"{_e(run.name)}</code> resumes it.</p>")
    body += ["<h2>Summary</h2>", _summary(run, metrics)]
    body += _provenance_section(run)
    config_text = _read_text(run / "config.yaml") if (run / "config.yaml").is_file() else None
    if config_text is not None:
        body.append("<details><summary>config.yaml</summary><pre>"
                    f"{_e(config_text)}</pre></details>")
    cfg = splits = None
    if config_text is not None:
        if not config_text.strip():  # never the default synthetic data instead
            raise ValueError(f"{run / 'config.yaml'}: empty; the run's data cannot be known "
                             f"(restore the config the run was trained with)")
        # --data: the data folder moved since training
        cfg = load_config(run / "config.yaml", [f"data.root={data.resolve()}"] if data is not None else ())
        if data is not None and cfg.data.name == "synthetic":  # never a folder silently left unread
            raise ValueError(f"--data: {run} was trained on synthetic data (data.name: synthetic), which "
                             f"reads no data folder; drop --data {data}")
        say("report: reading the run's data")
        splits = load_splits(cfg)
    elif data is not None:
        raise ValueError(f"--data: {run} has no config.yaml saying which splits to read from {data}")
    sizes = {k: chance_levels(v.text_to_video, v.num_videos) for k, v in (splits or {}).items()}
    body += ["<h2>Results per test-time normaliser</h2>",
             '<p class="muted">Recall in %, ranks 1-based. Yellow row: the normaliser selected on val; '
             "bold green: best per column.</p>"] + results_tables(metrics, sizes)
    body += protocol_section(metrics) + selection_section(metrics) + intervals_section(run / "per_query.npz")
    body += compared
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        log = _read_log(run / "log.jsonl") if (run / "log.jsonl").is_file() else []
        if log:  # an empty log: the run died before its first epoch ended, no curves to draw
            body += ["<h2>Training curves</h2>", _png(plot_curves(log, tmp / "c.png"), "curves")]
        if (run / "schedule.png").is_file():
            body += ["<h2>Schedule</h2>", _png(run / "schedule.png", "schedule")]
        if cfg is None:
            return page(f"xmodal report: {run.name}", body)
        model = load_model(run)
        from xmodal.training.finetune import splits_for

        val = splits_for(model, {"val": splits["val"]}, run)["val"]  # a clip4clip run reads its captions as tokens
        name = model.test_time.get("normalizer", "none")
        say(f"report: retrieval mass on val ({val.num_videos} videos, {val.num_texts} texts)")
        a = mass_analysis(model, val)
        item = gallery_item(cfg)
        title = f"text->{item} on val, tau={model.temperature:.3f}"
        errs = [[n, normalization_error(t2v_similarity(model, val, n), model.temperature),
                 float(np.abs(m - a["expected"]).max())] for n, m in a["masses"].items()]
        body += ["<h2>Retrieval mass (NCL Sec. 3.2, Figs. 2-3)</h2>",
                 table(["normaliser", "normalisation error (eq. 5)", "max |mass - balanced|"], errs,
                       best_cols=[1, 2], lower=lambda h: True, digits=3),
                 _png(plot_retrieval_mass(a["masses"], a["expected"], tmp / "m.png", title=title, item=item),
                      "mass"),
                 _png(plot_fn_fp(a["fn_fp"], tmp / "f.png", title=title), "fn/fp by mass")]
        say("report: head / tail breakdown")
        body += ["<h2>Head / tail breakdown (TS++)</h2>"] + _head_tail_section(model, splits, name, cfg, item,
                                                                               model_val=val)
        root = cfg.data.root if cfg.data.name != "synthetic" else None
        names = _val_names(root, cfg.data, val.num_videos)
        say(f"report: {num_examples} example rankings" + (" with thumbnails" if images and names else ""))
        body += ["<h2>Example rankings</h2>"] + examples_section(
            model, val, name, num=num_examples, seed=seed, video_names=names,
            images=images if names else None, item=item)
    return page(f"xmodal report: {run.name}", body)


# --------------------------------------------------------------------------- bench pages

def bench_report(root: Path) -> str:
    """The grid of ``results.csv`` (written by ``xmodal bench``) as tables per dataset and noise."""
    try:
        with open(root / "results.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{root / 'results.csv'}: not a CSV file written by 'xmodal bench' ({exc})") from None
    if not rows:
        raise ValueError(f"{root / 'results.csv'}: no rows")
    missing = [c for c in ("dataset", "noise", "objective", "normalizer") if c not in rows[0]]
    if missing:
        raise ValueError(f"{root / 'results.csv'}: no {', '.join(repr(c) for c in missing)} column "
                         f"(not written by 'xmodal bench')")
    metric_cols_all = [c for c in rows[0] if c.endswith(" mean")]
    if any(f"{c[:-5]} std" not in rows[0] for c in metric_cols_all):
        raise ValueError(f"{root / 'results.csv'}: a 'mean' column without its 'std' column")
    metric_cols = [c[:-5] for c in rows[0] if c.endswith(" mean")]
    body = [f"<h1>xmodal bench report</h1><p class=\"muted\">{_e(root.resolve())}</p>",
            '<p class="muted">Mean ± std over seeds. Bold green: best cell per column within a table '
            "(lowest for MdR, MnR and time). Yellow rows: the normaliser selected on val.</p>"]
    keys = list(dict.fromkeys((r["dataset"], r["noise"]) for r in rows))
    for ds, noise in keys:
        sub = [r for r in rows if r["dataset"] == ds and r["noise"] == noise]
        nz = float(noise or 0)
        split = sub[0].get("split", "")
        body.append(f"<h2>{_e(ds)}{f', {nz:.0%} of training pairs shuffled' if nz else ''}: "
                    f"{_e(split)} split, n={_e(sub[0].get('n', '?'))} seed(s)</h2>")
        header = ["objective", "normaliser"] + metric_cols

        def num(x: str) -> float:
            try:
                return float(x)
            except ValueError:
                return float("nan")

        cells = [[r["objective"], r["normalizer"]] + [(num(r[f"{c} mean"]), num(r[f"{c} std"]))
                                                      for c in metric_cols] for r in sub]
        sel = [i for i, r in enumerate(sub) if r["normalizer"] in r.get("selected", "").split(",")]
        body.append(table(header, cells, best_cols=range(2, len(header)), left_cols=2, selected=sel))
    if (root / "results.md").is_file():
        body.append("<details><summary>results.md</summary><pre>"
                    f"{_e((root / 'results.md').read_text())}</pre></details>")
    return page(f"xmodal bench report: {root.name}", body)


def build_report(path: str | Path, *, out: str | Path | None = None, images: str | Path | None = None,
                 data: str | Path | None = None,
                 num_examples: int = 8, seed: int = 0, log: Any = None, compare: list[str] | None = None) -> Path:
    """Write the HTML page of a run or bench directory; returns its path.

    Args:
        path: a run directory (``metrics.json``/``log.jsonl``/``config.yaml``) or a bench
            directory (``results.csv``).
        out: the HTML file (default ``PATH/report.html``).
        images: folder of the val split's images (named as in ``{val}_images.txt``) for
            thumbnails in the example rankings (Flickr8k: ``dev_images/``); a name is found as
            ``DIR/name`` or ``DIR/name.<ext>``, video files show their middle frame, and nothing
            outside ``DIR`` is read (no ``..``, absolute names or symlinks out).
        data: the run's data folder, overriding ``data.root`` of its config (the data moved).
        num_examples: number of example queries.
        seed: seed of the example sample.
        log: called with a line at each stage (``xmodal report``'s progress lines), or None.
        compare: runs or per-query files (B) to compare this run (A) with, as ``xmodal compare A B``
            does (a run directory only; several: seeds).
    """
    if log is not None and not callable(log):
        raise TypeError(f"log: expected a callable or None, got {type(log).__name__}")
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory")
    dest = Path(out) if out else root / "report.html"
    _check_out(dest)
    if images is not None and not Path(images).is_dir():
        raise ValueError(f"--images: {images} is not a directory")
    if data is not None and not Path(data).is_dir():
        raise ValueError(f"--data: {data} is not a directory")
    if compare is not None and (isinstance(compare, (str, bytes)) or not isinstance(compare, (list, tuple)) or
                                not compare or not all(isinstance(c, (str, os.PathLike)) for c in compare)):
        raise TypeError(f"compare: expected a list of run paths, got {short_repr(compare)}")
    if (root / "results.csv").is_file():
        if compare:
            raise ValueError(f"--compare: {root} is a bench directory; compare runs (xmodal report RUN --compare B)")
        text = bench_report(root)
    elif any((root / f).is_file() for f in ("metrics.json", "log.jsonl")):
        text = run_report(root, images=Path(images) if images else None, num_examples=num_examples, seed=seed,
                          data=Path(data) if data else None, log=log,
                          compare=[os.fspath(c) for c in compare] if compare else None)
    elif (root / "model.safetensors").is_file() and (root / "config.json").is_file():
        raise ValueError(f"{root}: a folder written by 'xmodal export': its model card is {root / 'README.md'}; "
                         f"'xmodal report' reads the run directory it was exported from")
    else:
        raise ValueError(f"{root}: neither a run directory (metrics.json, log.jsonl) nor a bench "
                         "directory (results.csv)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    from xmodal.runs import atomic_write

    atomic_write(dest, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return dest


#: Marks a page as written by :func:`build_report` (an existing --out without it is not replaced).
GENERATOR = '<meta name="generator" content="xmodal report">'


def _check_out(dest: Path) -> None:
    """``--out`` must be a new file or a page this module wrote (never a folder, a link or a user's file)."""
    if dest.is_symlink():
        raise ValueError(f"--out: {dest} is a symbolic link; refused")
    if dest.is_dir():
        raise ValueError(f"--out: {dest} is a directory; give the HTML file to write")
    if dest.exists():
        try:
            head = dest.read_bytes()[:4096].decode("utf-8", "replace")
        except OSError:
            head = ""
        if GENERATOR not in head and "<title>xmodal" not in head:
            raise ValueError(f"--out: {dest} exists and is not a page written by 'xmodal report'; "
                             f"refused (remove it or choose another name)")


__all__ = ["build_report", "run_report", "bench_report", "table", "examples_section", "results_tables"]
