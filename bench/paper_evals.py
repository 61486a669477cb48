"""The papers' other evaluations on trained Flickr8k runs, as Markdown tables (issue 10 item 5).

Given run directories written by ``xmodal train`` on Flickr8k (train -> dev), grouped by a
label (e.g. the objective), print / write:

1. **Linear probe and image-to-image retrieval by class** (Cali-NCE Sec. 5.1, "action
   recognition" and "video-to-video retrieval"): Flickr8k has no class labels, so an
   image's class is the k-means cluster (``--k``, seed 0) of its mean caption feature,
   fitted on the train images; dev images take the nearest centroid (cosine).
   :func:`xmodal.metrics.linear_probe` (train -> dev) and
   :func:`xmodal.metrics.label_retrieval` (dev -> dev) on each run's image embeddings, and
   on the input image features as a reference.
2. **DN zero-shot classification** (DN Sec. 4.4, Table 2): the same classes; the class
   "prompt" is the caption of its train images nearest its centroid, embedded by the run's text head.
   :func:`xmodal.metrics.zero_shot` with ``normalizer=None`` vs a
   :class:`~xmodal.normalize.DistributionNormalization` (lambda 0.25) whose means come from
   100 random unlabeled samples (DN protocol), here train images / train captions (dev is
   the evaluated split), mean ± std over 5 sampling seeds (each seed and side its own
   sample). DN is applied BEFORE the final L2 norm, as the official zero-shot code does
   (DN sec. 4.4: "we perform DN before the final norm normalization layer"): the means
   are of the towers' un-normalised outputs (``encode_*(..., unit=False)``), the dev
   images and class prompts are shifted by ``lam`` times them, and then
   :func:`~xmodal.metrics.zero_shot` L2-normalises both.
3. **FN / FP rate by retrieval mass** (NCL Sec. 3.2, Fig. 3; definitions in
   :mod:`xmodal.metrics.mass`): text -> image on dev for the first run of each label, under
   ``none`` and the run's selected normaliser, on the same mass bins (quantiles of the
   ``none`` masses).
4. **Head / tail text -> image R@1** (TS++ Ch. 4-5): classes are k-means clusters of the
   train captions (k=200, seed 0, as the TS++ trainer builds them), dev captions take the
   nearest centroid; head = the most frequent classes holding 80 % of the train captions
   (:func:`xmodal.metrics.head_tail_groups`); mean ± std over the runs of each label.

5. **Paired tests** (``--compare A:B``, repeatable; and every label's DN gain): each claim above as
   :func:`xmodal.metrics.paired_test` on the same dev queries, the runs of a label as seeds
   (resampled as clusters): difference, 95 % bootstrap interval, sign-flip p-value and the exact
   run-label permutation p-value, instead of judging mean ± std by eye.

Usage (from the repository root; runs trained with e.g. ``xmodal train configs/flickr8k/...``)::

    python bench/paper_evals.py --data ../shared/data/flickr8k \\
        --runs infonce=runs/a,runs/b,runs/c --runs calince=runs/d,runs/e \\
        --compare infonce:calince --out docs/results/paper_evals.md \\
        --write docs/results/data/paper_evals.json

``--write`` stores the tables with their command, commit, date and machine as the result file
``docs/results/paper_evals.md`` and the pages that quote it render (``docs/hooks/numbers.py``).

Budget: about 5-15 s per run on one CPU thread (the linear probe dominates).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from xmodal.metrics.formatting import markdown_table


def parse_runs(specs: list[str]) -> dict[str, list[Path]]:
    """``["infonce=a,b", "ncl=c"]`` -> ``{"infonce": [a, b], "ncl": [c]}`` (each a run directory)."""
    out: dict[str, list[Path]] = {}
    for spec in specs:
        label, sep, dirs = spec.partition("=")
        if not sep or not label or not dirs.strip(","):
            raise ValueError(f"--runs: expected LABEL=DIR[,DIR...], got {spec!r}")
        paths = [Path(d) for d in dirs.split(",") if d]
        for p in paths:
            if not (p / "model.pt").is_file():
                raise ValueError(f"--runs: {p} is not a finished run directory (no model.pt)")
        out.setdefault(label, []).extend(paths)
    if not out:
        raise ValueError("--runs: give at least one LABEL=DIR")
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def centroids(x: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Unit-norm mean of the unit-norm rows of each cluster, ``[k, D]``."""
    x = _unit(x)
    c = np.zeros((k, x.shape[1]))
    np.add.at(c, labels, x)
    return _unit(c)


def nearest(x: np.ndarray, cents: np.ndarray) -> np.ndarray:
    return (_unit(x) @ cents.T).argmax(1).astype(np.int64)


def mean_caption(split) -> np.ndarray:
    """Each image's mean (unit-norm) caption feature, ``[N, Dt]``."""
    out = np.zeros((split.num_videos, split.text.shape[1]))
    np.add.at(out, split.text_to_video, _unit(split.text))
    return out / np.maximum(np.bincount(split.text_to_video, minlength=split.num_videos), 1)[:, None]


def image_classes(train, dev, k: int) -> dict:
    """Classes of train/dev images (k-means of mean caption features) and one prompt caption per class."""
    from xmodal.data import kmeans_classes

    mtr, mdev = mean_caption(train), mean_caption(dev)
    ytr = kmeans_classes(mtr, k=k, seed=0)
    cents = centroids(mtr, ytr, k)
    # the prompt of class c: of the captions of class c's train images, the one nearest its
    # centroid (distinct classes get distinct prompts, never one shared caption)
    cos = _unit(train.text) @ cents.T
    own = ytr[train.text_to_video][:, None] == np.arange(k)[None, :]
    prompts = np.where(own, cos, -np.inf).argmax(0)
    return {"train": ytr, "dev": nearest(mdev, cents), "prompts": prompts, "k": k}


def caption_classes(train, dev, k: int = 200) -> dict:
    """TS++ classes of the captions (trainer: k-means of train captions); dev by nearest centroid."""
    from xmodal.data import class_counts, kmeans_classes

    k = min(k, train.num_texts)
    ytr = kmeans_classes(train.text, k=k, seed=0)
    return {"counts": class_counts(ytr, k), "dev": nearest(dev.text, centroids(train.text, ytr, k))}


def _pm(values: list[float], digits: int = 2) -> str:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 1:
        return f"{v[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def evaluate_run(run: Path, train, dev, img_cls: dict, cap_cls: dict, *, dn_seeds: int = 5) -> dict:
    """Every per-run number of the tables."""
    from xmodal.metrics import head_tail_groups, label_retrieval, linear_probe, retrieval_by_group, zero_shot
    from xmodal.models import load_model
    from xmodal.normalize import DistributionNormalization

    model = load_model(run)
    img_tr = model.encode_video(*train.video_input())
    img_dev = model.encode_video(*dev.video_input())
    out: dict = {"normalizer": model.test_time.selected}
    out["probe"] = linear_probe(img_tr, img_cls["train"], img_dev, img_cls["dev"])
    out["retrieval"] = label_retrieval(img_dev, img_cls["dev"], ks=(1, 10))
    class_emb = model.encode_text(train.text[img_cls["prompts"]])
    out["zs_none"] = zero_shot(img_dev, class_emb, img_cls["dev"])
    # DN before the final norm (official zero-shot code): means of un-normalised outputs;
    # zero_shot L2-normalises after the DN shift
    raw_img_tr = model.encode_video(*train.video_input(), unit=False)
    raw_img_dev = model.encode_video(*dev.video_input(), unit=False)
    raw_cls = model.encode_text(train.text[img_cls["prompts"]], unit=False)
    raw_txt_tr = model.encode_text(train.text, unit=False)
    dns = DistributionNormalization.fit_per_seed(raw_img_tr, raw_txt_tr, lam=0.25, num_samples=100, seeds=dn_seeds)
    out["zs_dn"] = [zero_shot(raw_img_dev, raw_cls, img_cls["dev"], normalizer=dn) for dn in dns]
    groups = head_tail_groups(cap_cls["dev"], class_counts=cap_cls["counts"], head_mass=0.8)
    video, mask = dev.video_input()
    out["head_tail"] = {}
    for name in dict.fromkeys(["none", out["normalizer"]]):
        sim = model.similarity(dev.text, video, normalizer=name, video_mask=mask)
        out["head_tail"][name] = retrieval_by_group(sim, dev.text_to_video, groups, ks=(1, 5, 10))
    out["model"], out["temperature"] = model, float(model.temperature)
    out["ranks"] = per_query_ranks(model, img_dev, img_cls, class_emb, raw_img_dev, raw_cls, dns, dev,
                                   list(out["head_tail"]))
    return out


def per_query_ranks(model, img_dev, img_cls: dict, class_emb, raw_img_dev, raw_cls, dns, dev, names) -> dict:
    """Each dev query's rank behind the tables (pessimistic ties, as the metrics): image -> image by
    class, zero-shot without and with each DN seed, text -> image under each normaliser."""
    from torch.nn import functional as F

    from xmodal.metrics import query_ranks

    lab = torch.as_tensor(img_cls["dev"])
    q = F.normalize(torch.as_tensor(np.asarray(img_dev)).double(), dim=1)
    sim = q @ q.T
    eye = torch.eye(len(lab), dtype=torch.bool)
    sim = sim.masked_fill(eye, -1e9)  # the query itself: below every cosine, so never ahead of a positive
    pos = (lab[:, None] == lab[None, :]) & ~eye
    keep = pos.any(1)
    def zs(x, c):  # zero_shot's scores: cosine in float64
        return F.normalize(torch.as_tensor(x).double(), dim=1) @ F.normalize(torch.as_tensor(c).double(), dim=1).T

    video, mask = dev.video_input()
    return {"retrieval": query_ranks(sim[keep], pos[keep]),
            "zs_none": query_ranks(zs(img_dev, class_emb), img_cls["dev"]),
            "zs_dn": [query_ranks(zs(*dn.transform(torch.as_tensor(raw_img_dev), torch.as_tensor(raw_cls))),
                                  img_cls["dev"]) for dn in dns],
            "t2v": {n: query_ranks(model.similarity(dev.text, video, normalizer=n, video_mask=mask),
                                   dev.text_to_video) for n in names}}


def paired_section(results: dict[str, list[dict]], pairs: list[tuple[str, str]], cap_cls: dict) -> str:
    """The claims as paired tests on the same dev queries (runs of a label = seeds; the verdict from the
    seed-level test, Holm over the table's rows)."""
    from xmodal.metrics import head_tail_groups, paired_test
    from xmodal.metrics.paired import format_diff, format_p, holm

    groups = head_tail_groups(cap_cls["dev"], class_counts=cap_cls["counts"], head_mass=0.8)
    head, tail = np.asarray(groups) == "head", np.asarray(groups) == "tail"
    tests = []

    def add(what: str, metric: str, a: list, b: list, paired: bool = False) -> None:
        tests.append((what, metric, {**paired_test(a, b, metric=metric, paired_seeds=paired), "paired": paired}))

    for la, lb in pairs:
        ra, rb = results[la], results[lb]
        add(f"{lb} − {la}: image -> image by class", "R@1", [r["ranks"]["retrieval"] for r in ra],
            [r["ranks"]["retrieval"] for r in rb])
        add(f"{lb} − {la}: zero-shot, no DN", "R@1", [r["ranks"]["zs_none"] for r in ra],
            [r["ranks"]["zs_none"] for r in rb])
        for pick in ("none", "selected"):
            for g, rows_g in (("head", head), ("tail", tail)):
                add(f"{lb} − {la}: text -> image, {g} queries, {pick}", "R@1",
                    [r["ranks"]["t2v"]["none" if pick == "none" else r["normalizer"]][rows_g] for r in ra],
                    [r["ranks"]["t2v"]["none" if pick == "none" else r["normalizer"]][rows_g] for r in rb])
    for label, rs in results.items():  # DN's zero-shot gain, per run: no DN vs DN averaged over its DN seeds
        hits = lambda ranks: 100.0 * (np.asarray(ranks) <= 1)  # noqa: E731  (R@1 as per-query values)
        add(f"{label}: zero-shot, DN − no DN", "mAP", [hits(r["ranks"]["zs_none"]) for r in rs],
            [np.mean([hits(x) for x in r["ranks"]["zs_dn"]], axis=0) for r in rs], paired=True)
    adjusted = holm([t["p_value"] for _, _, t in tests])
    reachable = len(tests) * min(t["p_value_min"] for _, _, t in tests) <= 0.05
    rows = []
    for (what, metric, t), q in zip(tests, adjusted):
        if t["unit"] == "seeds" and (not reachable or t["p_value_min"] > 0.05):
            verdict = (f"cannot be decided with {t['seeds_a']} paired runs" if t["paired"]  # one run, two scorings
                       else f"cannot be decided with {t['seeds_a']} + {t['seeds_b']} seeds")
        else:
            verdict = ("B better" if q < 0.05 and t["ci_low"] > 0 else "A better" if q < 0.05 and t["ci_high"] < 0
                       else "no clear difference")
        ends = (t["ci_low"], t["ci_high"])
        rows.append([what, "R@1", f"{t['a']:.2f}", f"{t['b']:.2f}", format_diff(t["diff"], 2, ends),
                     "[" + ", ".join(format_diff(x, 2, (t["diff"],)) for x in ends) + "]",
                     f"{format_p(t['p_value'], t['p_floor'])} (min {t['p_value_min']:.2f})", format_p(q, t["p_floor"]),
                     format_p(t["p_value_queries"], t.get("p_floor_queries", False)) if "p_value_queries" in t else "–",
                     verdict])
    return ("\n## Paired tests of the claims\n\n"
            "`xmodal.metrics.paired_test` on the same dev queries (zero-shot top-1 is R@1 of the true class); "
            "the runs of a label are seeds, resampled as clusters in the 95 % bootstrap interval (10,000 "
            "resamples). p (seeds): the seed-level test the verdict rests on, the exact permutation of the run "
            "labels (the recipe as the unit; with 3 + 3 runs it cannot go below 0.10) or, for DN, the sign flip "
            "over the paired runs (each run without DN vs the same run with DN averaged over its DN sampling "
            "seeds; 3 runs: at least 0.25); Holm over the table's rows; 'cannot be decided' where that floor "
            "cannot pass Holm at 0.05. p, these runs (queries): the paired sign flip of the seed-averaged "
            "per-query values, the runs held fixed.\n\n"
            + markdown_table(["comparison", "metric", "A", "B", "B − A", "95% CI", "p (seeds)", "p (Holm)",
                              "p, these runs (queries)", "verdict"], rows))


def mass_table(label: str, run: Path, res: dict, dev, bins: int = 5) -> str:
    """NCL Fig. 3 as a table: FN / FP rates (top-1) per mass bin, none vs the selected normaliser."""
    from xmodal.metrics import fn_fp_by_mass, retrieval_mass

    model, tau = res["model"], res["temperature"]
    video, mask = dev.video_input()
    names = list(dict.fromkeys(["none", res["normalizer"]]))
    sims = {n: model.similarity(dev.text, video, normalizer=n, video_mask=mask) for n in names}
    masses = {n: retrieval_mass(s, tau) for n, s in sims.items()}
    edges = np.quantile(masses["none"], np.linspace(0, 1, bins + 1))
    edges[0] = 0.0
    edges[-1] = max(float(m.max()) for m in masses.values()) + 1e-9
    edges = np.unique(edges)
    rows = []
    res_by = {n: fn_fp_by_mass(sims[n], dev.text_to_video, tau, bins=edges, k=1) for n in names}
    for b in range(len(edges) - 1):
        row = [f"[{edges[b]:.2f}, {edges[b + 1]:.2f})"]
        for n in names:
            r = res_by[n]
            fn, fp = r["fn_rate"][b], r["fp_rate"][b]
            row += [r["num_items"][b], "-" if fn is None else f"{fn:.1f}", "-" if fp is None else f"{fp:.1f}"]
        rows.append(row)
    header = ["mass bin"] + [f"{h} ({n})" for n in names for h in ("images", "FN %", "FP %")]
    note = "" if len(names) > 1 else " (this run selected `none`: no normaliser to compare)"
    return (f"#### {label}: `{run}`, tau {tau:.4f}, expected mass {dev.num_texts / dev.num_videos:g}{note}\n\n"
            + markdown_table(header, rows))


def tables(results: dict[str, list[dict]], runs: dict[str, list[Path]], dev, img_cls: dict, *,
           baseline: dict | None = None) -> str:
    k = img_cls["k"]
    parts = ["# Paper evaluations on Flickr8k dev (runs trained train -> dev)\n",
             "Numbers are mean ± std over the runs of each label (n = runs). Dev is also the split the runs "
             "were early-stopped and their normaliser selected on.\n",
             f"## Linear probe and image-to-image retrieval by class (Cali-NCE Sec. 5.1)\n\n"
             f"Classes: k-means (k={k}, seed 0) of each image's mean caption feature, fitted on train, dev by "
             "nearest centroid. Probe: logistic regression on frozen image embeddings, train -> dev, C chosen "
             "on a train hold-out. Retrieval: dev images query the other dev images, hit = same class.\n"]
    header = ["runs", "n", "probe top-1", "probe top-5", "retrieval R@1", "retrieval R@10", "retrieval MdR"]
    rows = []
    if baseline is not None:
        rows.append(["input image features", 1, _pm([baseline["probe"]["top1"]]), _pm([baseline["probe"]["top5"]]),
                     _pm([baseline["retrieval"]["R@1"]]), _pm([baseline["retrieval"]["R@10"]]),
                     _pm([baseline["retrieval"]["MdR"]], 1)])
    for label, rs in results.items():
        rows.append([label, len(rs), _pm([r["probe"]["top1"] for r in rs]), _pm([r["probe"]["top5"] for r in rs]),
                     _pm([r["retrieval"]["R@1"] for r in rs]), _pm([r["retrieval"]["R@10"] for r in rs]),
                     _pm([r["retrieval"]["MdR"] for r in rs], 1)])
    parts.append(markdown_table(header, rows))
    parts.append(f"\n## Zero-shot classification with and without DN (DN Sec. 4.4, Table 2)\n\n"
                 f"Same {k} classes; class prompt = the caption of the class's train images nearest its "
                 "centroid, embedded by the run's text head. DN: lambda 0.25, means of 100 random unlabeled train images / train "
                 "captions (the DN protocol's 100 samples; dev is the evaluated split), averaged over the DN "
                 "sampling seeds and then over runs.\n")
    rows = []
    for label, rs in results.items():
        dn1 = [float(np.mean([d["top1"] for d in r["zs_dn"]])) for r in rs]
        dn5 = [float(np.mean([d["top5"] for d in r["zs_dn"]])) for r in rs]
        none1 = [r["zs_none"]["top1"] for r in rs]
        rows.append([label, len(rs), _pm(none1), _pm(dn1), f"{np.mean(dn1) - np.mean(none1):+.2f}",
                     _pm([r["zs_none"]["top5"] for r in rs]), _pm(dn5)])
    parts.append(markdown_table(["runs", "n", "top-1 none", "top-1 DN", "DN gain", "top-5 none", "top-5 DN"], rows))
    parts.append("\n## Head / tail text -> image R@1 (TS++)\n\n"
                 "Caption classes: k-means (k=200, seed 0) of the train captions as the TS++ trainer builds "
                 "them, dev captions by nearest centroid; head = most frequent train classes holding 80 % of the "
                 "train captions. `selected`: each run's own selected normaliser.\n")
    rows = []
    for label, rs in results.items():
        row = [label, len(rs), int(rs[0]["head_tail"]["none"]["head"]["num_queries"]),
               int(rs[0]["head_tail"]["none"]["tail"]["num_queries"])]
        for pick in ("none", "selected"):
            for g in ("head", "tail"):
                row.append(_pm([r["head_tail"]["none" if pick == "none" else r["normalizer"]][g]["R@1"]
                                for r in rs]))
        row.append(",".join(sorted({r["normalizer"] for r in rs})))
        rows.append(row)
    parts.append(markdown_table(["runs", "n", "head queries", "tail queries", "head R@1 none", "tail R@1 none",
                                 "head R@1 selected", "tail R@1 selected", "selected"], rows))
    parts.append("\n## FN / FP rate by retrieval mass (NCL Sec. 3.2, Fig. 3)\n\n"
                 "Text -> image on dev, top-1. Mass of an image = sum over the dev captions of its softmax "
                 "retrieval probability (run temperature). FN %: of the image's own captions, those that do not "
                 "retrieve it at rank 1; FP %: of the captions that retrieve it at rank 1, those that are not its "
                 "own. Bins: quantiles of the `none` masses (first edge 0, last the largest mass).\n")
    for label, rs in results.items():
        parts.append(mass_table(label, runs[label][0], rs[0], dev) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/flickr8k", help="Flickr8k data directory")
    ap.add_argument("--runs", action="append", required=True, metavar="LABEL=DIR[,DIR...]",
                    help="run directories of one label (repeatable)")
    ap.add_argument("--k", type=int, default=50, help="image classes for probe / retrieval / zero-shot (default 50)")
    ap.add_argument("--dn-seeds", type=int, default=5, help="DN sampling seeds (DN paper: 5)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the input-feature reference row")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--out", default=None, help="also write the Markdown here")
    ap.add_argument("--write", default=None, metavar="FILE.json",
                    help="also write the tables as a result file the docs pages render (bench/resultfile.py: "
                         "provenance + every table, parsed from the Markdown above and checked to print the same)")
    ap.add_argument("--compare", action="append", default=[], metavar="A:B",
                    help="paired tests of label B against label A on the same dev queries (repeatable)")
    args = ap.parse_args(argv)
    if args.write is not None and not args.write.endswith(".json"):
        ap.error(f"--write: {args.write} is not a .json file (the bench writes data; the docs pages render it)")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"paper_evals: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from xmodal.data import load_paired_split
    from xmodal.metrics import label_retrieval, linear_probe

    if args.threads < 1 or args.k < 2 or args.dn_seeds < 1:
        raise ValueError("--threads, --dn-seeds must be >= 1 and --k >= 2")
    torch.set_num_threads(args.threads)
    runs = parse_runs(args.runs)
    if not Path(args.data).is_dir():
        raise ValueError(f"--data: {args.data} is not a directory")
    t0 = time.perf_counter()
    train, dev = load_paired_split(args.data, "train"), load_paired_split(args.data, "dev")
    img_cls = image_classes(train, dev, args.k)
    cap_cls = caption_classes(train, dev)
    baseline = None
    if not args.no_baseline:
        baseline = {"probe": linear_probe(train.video, img_cls["train"], dev.video, img_cls["dev"]),
                    "retrieval": label_retrieval(dev.video.astype(np.float32), img_cls["dev"], ks=(1, 10))}
    results = {label: [evaluate_run(r, train, dev, img_cls, cap_cls, dn_seeds=args.dn_seeds) for r in rs]
               for label, rs in runs.items()}
    text = tables(results, runs, dev, img_cls, baseline=baseline)
    pairs = []
    for spec in args.compare:
        a, sep, b = spec.partition(":")
        if not sep or a not in results or b not in results:
            raise ValueError(f"--compare: expected A:B with labels of --runs, got {spec!r}")
        pairs.append((a, b))
    text += "\n" + paired_section(results, pairs, cap_cls)
    text += f"\n\n_{sum(map(len, runs.values()))} runs, {time.perf_counter() - t0:.0f} s on {args.threads} thread(s)._\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    if args.write:
        write_result(args.write, text, args.argv)
    return 0


def write_result(path: str, text: str, argv: list[str]) -> None:
    """The Markdown ``text`` as a result file (``bench/resultfile.py``): its tables, parsed and checked to print
    exactly as above, with the command, commit, date and machine of this run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import resultfile

    tables = resultfile.markdown_tables(text)
    resultfile.check_round_trip(text, tables)
    data = resultfile.provenance("bench/paper_evals.py", argv, "bench/paper_evals.py --write (this file is its output)")
    resultfile.write_json(path, {**data, "tables": tables})


if __name__ == "__main__":
    sys.exit(main())
