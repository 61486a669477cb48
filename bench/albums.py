"""Flickr8k "albums": a real-feature testbed for the two-level model (clips inside videos).

    OMP_NUM_THREADS=1 python bench/albums.py --data ../shared/data/flickr8k --out runs/albums \\
        [--seeds 0 1 2] [--epochs 15] [--albums related unrelated fixed] [--models coot hier flat] \\
        [--controls] [--write docs/results/data/albums_fixed.json]

The docs render ``docs/results/data/albums_fixed.json`` (``--albums fixed --models coot flat --controls``)
and ``albums_related.json`` (``--albums related --losses infonce --models coot flat --controls``); their
``command`` keys hold the exact command lines.

An album is a "video" whose images are its clips (in album order); one of each image's 5 captions
(drawn at random) is the clip's sentence, so an album's paragraph is its captions in image order.
Album sizes are drawn uniformly from 3-8, so a paragraph is exactly as long as its album: a model
that encodes length (the release block's sine/cosine positions do) can match a paragraph to the
albums of its length without reading it. Three kinds (``--albums``):

- ``unrelated``: the split's images shuffled and cut into albums: an album's images have nothing
  to do with each other.
- ``related``: the images clustered by caption topic (k-means, ``k = N / 40``, on the mean of
  each image's 5 caption embeddings), each cluster shuffled and cut into albums, the images of an
  album ordered along the cluster's first principal axis (in caption space), the albums then
  shuffled. Related albums share a topic with about 6 others in the test gallery (hard negatives),
  and their order carries meaning.
- ``fixed``: related albums of exactly ``FIXED`` (5) images each, train and test, so paragraph
  length says nothing about the album; the test albums are the same for every seed (cut with seed
  0), so ``xmodal compare`` pairs the seeds' per-query results.

Train albums: Flickr8k train, 100 of them carved out as the validation split (epoch selection on
its paragraph <-> video R@1,5,10, ``train.metric: p2v_rsum``, for every model); test albums:
Flickr8k dev (never seen in training). Compared (``--models``), each with InfoNCE and with CrossCLR
(eq. 3's ``lambda * delta`` intra-modal weights, no queue) as the loss at both levels, on the same
linear local towers (Flickr8k images have no frames, so the local level is a linear map; COOT's
local transformer and its attention pooling do not apply):

- ``coot``: COOT's global level as the release builds it: ``model.block: release``,
  ``global_pooling: mean``, ``global_context: true`` (8 heads, Table 7);
- ``hier``: the global level before issue 27: ``block: xmodal``, attention pooling (one head),
  no context (4 heads);
- ``flat``: the local towers trained on (image, caption) pairs only; an album's embedding is the
  mean of its normalised image (caption) embeddings.

Every hierarchical run also reports its flat reference (``p2v_flat``: its own local embeddings
mean-pooled), so the table says whether the global level or the local training made a difference.
``--controls`` adds the rows that need no training (test albums only):

- the controls without training: the flat run's local towers under *untrained* global towers (the
  ``coot`` model's release block and mean pooling, seeded, without the context branch, whose
  untrained half is LayerNorm-amplified noise), once as built and once with the global towers'
  positions zeroed. Untrained (truncated-normal std 0.01), the block passes each clip's layer-normed
  embedding plus its sine/cosine position to the average, so the average carries the album's length
  (the mean of its positions) and, mixed by the layer norms, which clip sat where; what the control
  gains over the positions-zeroed one is what positions give without training: length and order on
  albums of 3-8, order alone among albums of one length;
- ``coot, positions zeroed at test``: the trained COOT global level without its positions;

and a column "among same-length albums": each paragraph ranked only against the albums of its own
length (on ``fixed`` the same as p2v R@1). Each row's per-query ranks go to
``OUT/perquery/KIND/LOSS/ROW/seedS.npz`` (p2v, v2p; ``ROW-samelength/`` the same-length p2v ranks as
p2v), with the protocol card of the run they come from and each album's query id (its images and
captions in order, :func:`xmodal.retrieval.perquery.query_ids`), for ``xmodal compare``.
``--diagnose`` prints, per run, the global and local loss and validation p2v R@1 per epoch, the
final model's p2v R@1 on its own training albums, and the share of a 16- and a 64-album batch
that CrossCLR's global-level pruning removes; ``--batch`` changes the albums per step; ``--tag T
--keys JSON`` trains a variant of the hierarchical models (e.g. ``--models coot --tag nocontext
--keys '{"global_context": false}'``) into runs of its own. Runs live in ``OUT/runs`` (a finished run is
reused); album splits in ``OUT/data`` (derived data: never commit).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

from xmodal.config import from_dict
from xmodal.data import PairedSplit, load_paired_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resultfile import provenance, summary, write_json  # noqa: E402  (bench/ is not a package)

LOSSES = {"infonce": {"name": "infonce", "temperature": 0.05},
          "crossclr": {"name": "crossclr", "temperature": 0.03,
                       "kwargs": {"weight_scale": 0.0035, "intra_weight": 0.8, "prune_threshold": 0.9}}}
#: The global level of each model (``model`` keys); ``flat`` trains no global towers.
MODELS = {"coot": {"hierarchy": True, "block": "release", "global_pooling": "mean", "global_context": True,
                   "global_heads": 8},
          "hier": {"hierarchy": True, "block": "xmodal", "global_pooling": "atn", "pool_heads": 1,
                   "global_context": False, "global_heads": 4},
          "flat": {"hierarchy": False}}
LABELS = {"coot": "COOT global level (release block, mean + context)",
          "hier": "global level before issue 27 (attention pooling)", "flat": "flat, mean-pooled"}
VAL_ALBUMS = 100
ALBUM_KINDS = ("related", "unrelated", "fixed")
#: Images per album of the ``fixed`` kind (train and test); test albums cut with this seed for every run.
FIXED, FIXED_TEST_SEED = 5, 0
#: Rows of ``--controls`` (no training): label, per-query folder name.
CONTROLS = {"untrained": "control, no training: flat towers + untrained release global towers (mean, no context)",
            "untrained-nopos": "control, no training: the same, positions zeroed",
            "coot-nopos": "COOT global level, positions zeroed at test"}


def _cut(rng: np.random.Generator, n: int, low: int, high: int) -> list[int]:
    """Album sizes drawn from ``[low, high]`` while at least ``low`` of ``n`` items are left."""
    sizes: list[int] = []
    while sum(sizes) + low <= n:
        sizes.append(int(min(rng.integers(low, high + 1), n - sum(sizes))))
    return sizes


def _one_caption(split: PairedSplit, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    captions_of: dict[int, list[int]] = {}
    for t, v in enumerate(split.text_to_video.tolist()):
        captions_of.setdefault(v, []).append(t)
    return np.array([captions_of[int(v)][rng.integers(len(captions_of[int(v)]))] for v in rows])


def _albums(split: PairedSplit, rows: np.ndarray, sizes: list[int], rng: np.random.Generator,
            name: str) -> PairedSplit:
    texts = _one_caption(split, rows, rng)
    return PairedSplit.from_arrays(video=split.video[rows], text=split.text[texts],
                                   text_to_video=np.arange(len(rows)),
                                   video_to_group=np.repeat(np.arange(len(sizes)), sizes), name=name)


def make_albums(split: PairedSplit, seed: int, *, low: int = 3, high: int = 8) -> PairedSplit:
    """Albums of ``low``-``high`` unrelated images (seeded), one caption per image, as a hierarchical split.

    Images are shuffled, then cut into consecutive albums with sizes drawn uniformly from
    ``[low, high]``; leftover images too few for an album are dropped. Each image keeps one of
    its captions, drawn at random. Rows: the album's images in album order
    (``video_to_group`` non-decreasing); texts: one per image, in the same order.
    """
    rng = np.random.default_rng([seed, 8])
    order = rng.permutation(split.num_videos)
    sizes = _cut(rng, len(order), low, high)
    return _albums(split, order[:sum(sizes)], sizes, rng, f"{split.name} albums seed {seed}")


def topic_clusters(split: PairedSplit, seed: int, per_cluster: int = 40) -> np.ndarray:
    """Caption-topic cluster of every image: k-means (``k = N / per_cluster``, seeded) on the
    normalised mean of each image's caption embeddings."""
    from sklearn.cluster import KMeans

    text = np.asarray(split.text, dtype=np.float64)
    mean = np.zeros((split.num_videos, text.shape[1]))
    np.add.at(mean, split.text_to_video, text)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True).clip(1e-12)
    k = max(2, split.num_videos // per_cluster)
    return KMeans(n_clusters=k, n_init=3, random_state=seed).fit_predict(mean), mean


def make_related_albums(split: PairedSplit, seed: int, *, low: int = 3, high: int = 8) -> PairedSplit:
    """Albums of ``low``-``high`` images of one caption topic (:func:`topic_clusters`), ordered.

    Each cluster's images are shuffled and cut into albums (leftovers fewer than ``low`` are
    dropped); an album's images are sorted by their projection on the cluster's first principal
    axis of caption means (an order that means something: along the topic's main variation);
    then the albums are shuffled. One caption per image, drawn at random, in image order.
    """
    rng = np.random.default_rng([seed, 9])
    cluster, mean = topic_clusters(split, seed)
    albums: list[np.ndarray] = []
    for c in range(int(cluster.max()) + 1):
        members = rng.permutation(np.flatnonzero(cluster == c))
        if len(members) < low:
            continue
        centred = mean[members] - mean[members].mean(0)
        axis = np.linalg.svd(centred, full_matrices=False)[2][0]
        start = 0
        for size in _cut(rng, len(members), low, high):
            album = members[start:start + size]
            albums.append(album[np.argsort(mean[album] @ axis, kind="stable")])
            start += size
    albums = [albums[i] for i in rng.permutation(len(albums))]
    return _albums(split, np.concatenate(albums), [len(a) for a in albums], rng,
                   f"{split.name} related albums seed {seed}")


def _save(root: Path, name: str, s: PairedSplit) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for role, arr in (("video_features", s.video), ("text_features", s.text), ("text_to_video", s.text_to_video),
                      ("video_to_group", s.video_to_group)):
        tmp = root / f"{name}_{role}.tmp.npy"
        np.save(tmp, arr)
        tmp.replace(root / f"{name}_{role}.npy")


def write_albums(data: Path, root: Path, seed: int, kind: str = "unrelated") -> None:
    if (root / "test_video_to_group.npy").is_file():
        return
    if kind == "fixed":
        train = make_related_albums(load_paired_split(data, "train"), seed, low=FIXED, high=FIXED)
        test = make_related_albums(load_paired_split(data, "dev"), FIXED_TEST_SEED, low=FIXED, high=FIXED)
    else:
        make = make_related_albums if kind == "related" else make_albums
        train = make(load_paired_split(data, "train"), seed)
        test = make(load_paired_split(data, "dev"), seed)
    cut = int(np.searchsorted(train.video_to_group, train.num_groups - VAL_ALBUMS))
    _save(root, "val", train.subset(np.arange(cut, train.num_videos)))
    _save(root, "test", test)
    _save(root, "train", train.subset(np.arange(cut)))


def config(root: Path, loss: str, model: str, seed: int, epochs: int, batch: int = 16, album_size: float = 5.5,
           **model_keys):
    hierarchy = MODELS[model]["hierarchy"]
    return from_dict({
        "data": {"name": "paired", "root": str(root), "train_split": "train", "val_split": "val",
                 "test_split": "test"},
        "model": {"kind": "linear", "dim": 256, "dropout": 0.1, **MODELS[model], **model_keys},
        "loss": {**LOSSES[loss], "global_weight": 0.6},
        "optim": {"name": "adam", "lr": 1e-3, "warmup_epochs": 1},
        "test_time": {"normalizers": ["none"], "bank_size": 1000, "oracle": False},
        # the same clips per step either way: 16 albums of 5.5 images on average (fixed: 5), or 88 (80) pairs;
        # epochs selected on the validation albums' paragraph <-> video retrieval, for both models
        "train": {"seed": seed, "epochs": epochs, "batch_size": batch if hierarchy else round(batch * album_size),
                  "patience": 4, "progress": False, "metric": "p2v_rsum"},
    })


def _run_dir(args, kind: str, loss: str, model: str, seed: int) -> Path:
    tag = ("" if args.batch == 16 else f"-b{args.batch}") + (f"-{args.tag}" if args.tag else "")
    return Path(args.out) / "runs" / kind / f"{loss}-{model}{tag}" / f"seed{seed}"


def _ranks(paragraph: torch.Tensor, video: torch.Tensor, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """Per-query ranks (pessimistic ties): p2v and v2p over the whole gallery, and p2v among the
    albums of the query's own length (``same``: 1 + the other same-length albums scoring >= the right one)."""
    from xmodal.metrics import text_video_ranks

    sim = paragraph @ video.T
    r = text_video_ranks(sim, np.arange(sim.shape[0]))
    same_length = torch.as_tensor(lengths[:, None] == lengths[None, :], device=sim.device)
    same = ((sim >= sim.diagonal()[:, None]) & same_length).sum(1).cpu().numpy()  # counts the album itself once
    if bool((lengths == lengths[0]).all()) and not np.array_equal(same, r["t2v"]):
        raise AssertionError("same-length ranks differ from the ranks on a gallery of one length")
    return {"p2v": r["t2v"].astype(np.int32), "v2p": r["v2t"].astype(np.int32), "same": same.astype(np.int32)}


def _group_embeddings(model, split: PairedSplit, flat: bool) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(paragraphs, videos, album lengths): the global towers', or the mean-pooled clips' with ``flat``."""
    from xmodal.retrieval.evaluate import mean_pooled_groups

    lengths = np.bincount(split.video_to_group)
    if flat or not hasattr(model, "encode_groups"):
        p, v = mean_pooled_groups(model, split)
        return p, v, lengths
    p, v, have = model.encode_groups(*split.video_input(), split.text, split.text_to_video, split.video_to_group)
    return p, v, lengths[have.numpy()]


def _zero_positions(model) -> None:
    with torch.no_grad():
        for tower in (model.global_video, model.global_text):
            tower.pos.zero_()


def _summary(ranks: dict[str, np.ndarray], base: dict) -> dict:
    """A table row from per-query ranks (R@K in percent); clip t2v and the best epoch from ``base``."""
    at = lambda r, k: float(100.0 * np.mean(r <= k))  # noqa: E731
    return {**base, "p2v": {"R@1": at(ranks["p2v"], 1), "R@5": at(ranks["p2v"], 5)},
            "v2p": {"R@1": at(ranks["v2p"], 1)}, "same": {"R@1": at(ranks["same"], 1)}}


def evaluate_rows(args, kind: str, loss: str, model_name: str, seed: int, run: Path, root: Path) -> dict:
    """``--controls``: each row of one run re-evaluated on the test albums from its embeddings (overall and
    same-length ranks), its per-query ranks written for ``xmodal compare``; the control rows built on it."""
    from xmodal.models import load_model
    from xmodal.models.hierarchy import with_global_towers
    from xmodal.retrieval.perquery import query_ids, write_per_query
    from xmodal.retrieval.perquery_read import read_per_query
    from xmodal.training.hierarchy import global_spec

    split = load_paired_split(root, "test")
    own, cards = read_per_query(run / "per_query.npz")
    summary = json.loads((run / "metrics.json").read_text())
    base = {"t2v": summary["test"]["none"]["t2v"], "best_epoch": summary["best_epoch"]}
    hierarchical = MODELS[model_name]["hierarchy"]
    rows: dict[str, tuple[object, bool, bool]] = {model_name: (load_model(run), False, False)}
    if hierarchical:
        rows[f"{model_name}-flatref"] = (rows[model_name][0], True, False)
    if model_name == "flat":
        # the release block's global level without the context branch: an untrained context half is
        # LayerNorm-amplified noise that drowns the pooled half (p2v R@1 about 15 on related albums)
        spec = dataclasses.replace(global_spec(config(root, loss, "coot", seed, args.epochs)), context=False)
        torch.manual_seed(seed)
        rows["untrained"] = (with_global_towers(rows[model_name][0], spec), False, False)
        rows["untrained-nopos"] = (rows["untrained"][0], False, True)
    if model_name == "coot":
        rows["coot-nopos"] = (load_model(run), False, True)
    # each album's identity (its images and captions in order), so compare pairs the rows by album
    ids = {d: x for d, x in query_ids(split).items() if d in ("p2v", "v2p")}
    out = {}
    for name, (model, flat, zero) in rows.items():
        if zero:
            model = copy.deepcopy(model)
            _zero_positions(model)
        ranks = _ranks(*_group_embeddings(model, split, flat))
        if name == model_name and not np.array_equal(ranks["p2v"], own["test"]["none"]["p2v"]["rank"]):
            raise AssertionError(f"{run}: re-evaluated p2v ranks differ from the run's per_query.npz")
        folder = Path(args.out) / "perquery" / kind / loss
        for sub, p2v in ((name, ranks["p2v"]), (f"{name}-samelength", ranks["same"])):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            write_per_query(folder / sub / f"seed{seed}.npz",
                            {"test": {"none": {"p2v": {"rank": p2v}, "v2p": {"rank": ranks["v2p"]}}}},
                            {"test": cards["test"]}, ids={"test": ids})
        out[name] = _summary(ranks, base)
    return out


def _label(args, name: str) -> str:
    if name in CONTROLS:
        return CONTROLS[name]
    if name.endswith("-flatref"):
        return f"{name[:-len('-flatref')]}: its local embeddings mean-pooled"
    return LABELS[name] + (f" [{args.tag}: {args.keys}]" if args.tag and MODELS[name]["hierarchy"] else "")


def run_seed(args, kind: str, seed: int) -> dict:
    from xmodal.training.loop import train

    root = Path(args.out) / "data" / kind / f"seed{seed}"
    write_albums(Path(args.data), root, seed, kind)
    rows = {}
    for loss in args.losses:
        for model in args.models:
            run = _run_dir(args, kind, loss, model, seed)
            if not (run / "metrics.json").is_file():
                keys = json.loads(args.keys) if MODELS[model]["hierarchy"] else {}
                train(config(root, loss, model, seed, args.epochs, args.batch,
                             album_size=FIXED if kind == "fixed" else 5.5, **keys), run)
            summary = json.loads((run / "metrics.json").read_text())
            metrics = {**summary["test"]["none"], "best_epoch": summary["best_epoch"]}
            print(f"{kind} seed {seed} {loss} {model}: p2v R@1 {metrics['p2v']['R@1']:.2f} "
                  f"(best epoch {summary['best_epoch']})", flush=True)
            if args.controls:
                for name, row in evaluate_rows(args, kind, loss, model, seed, run, root).items():
                    rows[(kind, loss, name)] = {**row, "label": _label(args, name)}
                continue
            rows[(kind, loss, model)] = {**metrics, "label": _label(args, model)}
            if "p2v_flat" in metrics:  # the hierarchical run's own local embeddings, mean-pooled
                rows[(kind, loss, f"{model}-flatref")] = {
                    **metrics, "p2v": metrics["p2v_flat"], "v2p": metrics["v2p_flat"],
                    "label": _label(args, f"{model}-flatref")}
    return rows


METRICS = {"p2v_r1": ("p2v", "R@1"), "same_r1": ("same", "R@1"), "v2p_r1": ("v2p", "R@1"),
           "p2v_r5": ("p2v", "R@5"), "t2v_r1": ("t2v", "R@1")}
COLUMNS = {"p2v_r1": "p2v R@1", "same_r1": "p2v R@1 among same-length albums", "v2p_r1": "v2p R@1",
           "p2v_r5": "p2v R@5", "t2v_r1": "clip t2v R@1"}
#: Paired tests (``xmodal compare``'s) on the fixed albums, whose test gallery is the same for every seed:
#: (A, B) rows of ``--controls``, B - A on p2v R@1.
TESTS = (("flat", "coot"), ("coot-flatref", "coot"), ("flat", "hier"), ("flat", "untrained"),
         ("untrained-nopos", "untrained"), ("coot-nopos", "coot"))


def results(per_seed: dict[int, dict]) -> tuple[list[dict], dict, dict]:
    """Per-seed rows, ``{kind: {loss: {row: summaries}}}`` and ``{kind: table}`` from the runs' rows."""
    seeds = sorted(per_seed)
    rows, nested, tables = [], {}, {}
    for key in per_seed[seeds[0]]:
        kind, loss, name = key
        cells = {m: [per_seed[s][key][d][k] for s in seeds] for m, (d, k) in METRICS.items()
                 if d in per_seed[seeds[0]][key]}
        epochs = [per_seed[s][key]["best_epoch"] for s in seeds]
        for i, s in enumerate(seeds):
            rows.append({"albums": kind, "loss": loss, "row": name, "seed": s,
                         **{m: v[i] for m, v in cells.items()}, "best_epoch": epochs[i]})
        entry = {"label": per_seed[seeds[0]][key]["label"], **{m: summary(v) for m, v in cells.items()},
                 "best_epochs": epochs}
        nested.setdefault(kind, {}).setdefault(loss, {})[name] = entry
        t = tables.setdefault(kind, {"columns": ["loss (each level)", "model"]
                                     + [COLUMNS[m] for m in cells] + ["p2v R@1 per seed", "best epochs"],
                                     "align": ["---", "---"] + ["---:"] * len(cells) + ["---", "---"], "rows": []})
        t["rows"].append([loss, entry["label"], *(entry[m] for m in cells), entry["p2v_r1"]["per_seed"], epochs])
    return rows, nested, tables


def seed_counts(nested: dict) -> dict:
    """For each pair of :data:`TESTS` on every kind and loss: on how many seeds B is above / below A
    (p2v R@1, and among same-length albums), so a page's "on every seed" is read from the file."""
    out: dict = {}
    for kind, losses in nested.items():
        for loss, rows in losses.items():
            for a, b in TESTS:
                if a not in rows or b not in rows:
                    continue
                counts = {}
                for m in ("p2v_r1", "same_r1"):
                    if m in rows[a] and m in rows[b]:
                        pairs = list(zip(rows[a][m]["per_seed"], rows[b][m]["per_seed"]))
                        counts[m] = {"higher": sum(y > x for x, y in pairs), "lower": sum(y < x for x, y in pairs),
                                     "seeds": len(pairs)}
                out.setdefault(kind, {}).setdefault(loss, {})[f"{b}-vs-{a}"] = counts
    return out


#: Pairs of :data:`TESTS` read from the same trained run per seed (its own clips, positions zeroed, the flat
#: run's towers under untrained global towers): 3 paired runs, not 3 + 3 seeds.
SAME_RUN = {("coot-flatref", "coot"), ("untrained-nopos", "untrained"), ("coot-nopos", "coot"), ("flat", "untrained")}


def _paired_runs(folder: Path, a: str, b: str, seeds: list[int]) -> dict:
    """:func:`xmodal.metrics.paired_test` with run ``i`` of A and B the same trained run (the sign flip over
    the paired runs); the per-query files of one seed list the same test split, so queries pair by position."""
    from xmodal.metrics import paired_test
    from xmodal.retrieval.perquery_read import read_per_query

    ranks = {name: [read_per_query(folder / name / f"seed{s}.npz")[0]["test"]["none"]["p2v"]["rank"] for s in seeds]
             for name in (a, b)}
    r = paired_test(ranks[a], ranks[b], metric="R@1", paired_seeds=True)
    decided = r["p_value"] < 0.05
    r["verdict"] = (f"cannot be decided with {len(seeds)} paired runs" if r["p_value_min"] >= 0.05 else
                    "B better" if decided and r["ci_low"] > 0 else "A better" if decided and r["ci_high"] < 0
                    else "no clear difference")
    return r


def paired_tests(args, kinds: list[str], nested: dict) -> dict:
    """``xmodal compare``'s seed-level test of each pair in :data:`TESTS` on the fixed albums (p2v R@1); for
    the pairs of one trained run (:data:`SAME_RUN`) the sign flip over the paired runs."""
    from xmodal.reporting.compare import compare, load_result

    out: dict = {}
    if "fixed" not in kinds or not args.controls:
        return out
    for loss in args.losses:
        folder = Path(args.out) / "perquery" / "fixed" / loss
        for a, b in TESTS:
            if not {a, b} <= set(nested["fixed"].get(loss, {})):  # rows of this invocation only
                continue
            if (a, b) in SAME_RUN:
                r = _paired_runs(folder, a, b, args.seeds)
                res = {"pairing": "position within each paired run (one run's per-query files of one test split)"}
            else:
                sides = [[load_result(folder / name / f"seed{s}.npz") for s in args.seeds] for name in (a, b)]
                res = compare(*sides, split="test", normalizer="none", metrics=["R@1"], directions=["p2v"])
                r = res["rows"][0]
            out.setdefault(loss, {})[f"{b}-vs-{a}"] = {
                "a": a, "b": b, "direction": "p2v", "metric": "R@1",
                **{k: r[k] for k in ("a", "b", "diff", "ci_low", "ci_high", "p_value", "p_value_min", "p_holm",
                                     "p_value_queries", "verdict", "seeds_a", "seeds_b", "num_queries")
                   if k in r},
                "a_row": a, "b_row": b, "pairing": res["pairing"], "paired_runs": (a, b) in SAME_RUN,
                "command": None if (a, b) in SAME_RUN else
                f"xmodal compare --a '{folder / a}/seed*.npz' --b '{folder / b}/seed*.npz' "
                "--split test --normalizer none --directions p2v --metrics R@1"}
    return out


def test_table(tests: dict, nested: dict) -> dict:
    """The paired tests as a table (B − A and its interval to two decimals, as ``xmodal compare`` prints)."""
    rows = []
    for loss, pairs in tests.items():
        for t in pairs.values():
            label = lambda name: nested["fixed"][loss][name]["label"]  # noqa: E731
            rows.append([loss, label(t["a_row"]), label(t["b_row"]), t["a"], t["b"], f"{t['diff']:+.2f}",
                         f"[{t['ci_low']:+.2f}, {t['ci_high']:+.2f}]", f"{t['p_value']:.2f}",
                         f"{t['p_value_min']:.2f}", t["verdict"]])
    return {"columns": ["loss", "A", "B", "A p2v R@1", "B p2v R@1", "B − A", "95% CI", "p (runs)",
                        "lowest p possible", "verdict"], "align": ["---"] * 3 + ["---:"] * 6 + ["---"], "rows": rows}


def table(per_seed: dict[int, dict], command: str, sizes: dict[str, int]) -> str:
    """The printed summary (mean ± std over seeds); the result file holds the same and every seed."""
    seeds = sorted(per_seed)
    lines = [f"Flickr8k albums: test = dev images ({', '.join(f'{k}: {n} albums' for k, n in sizes.items())}), "
             f"mean ± std over {len(seeds)} seeds; command: {command}", ""]
    for key, row in per_seed[seeds[0]].items():
        got = {m: summary([per_seed[s][key][d][k] for s in seeds]) for m, (d, k) in METRICS.items() if d in row}
        lines.append(f"{key[0]:9s} {key[1]:8s} {key[2]:22s} " + "  ".join(
            f"{m} {v['mean']:.1f} ± {v['std']:.1f}" for m, v in got.items()))
    return "\n".join(lines) + "\n"


def prune_share(root: Path, seed: int, batch: int, batches: int = 200) -> float:
    """Mean share of a batch of ``batch`` training albums that CrossCLR's global-level pruning
    removes (influence ``C / max C > 0.9`` on the albums' mean input features, as the trainer
    feeds the global loss; :func:`xmodal.functional.crossclr.influence_scores`)."""
    from xmodal.functional.crossclr import connectivity, influence_scores

    s = load_paired_split(root, "train")
    g = s.video_to_group
    n = int(g.max()) + 1
    rng = np.random.default_rng(seed)
    vin = torch.zeros(n, s.video.shape[1], dtype=torch.float64).index_add_(
        0, torch.as_tensor(g), torch.as_tensor(np.asarray(s.video, dtype=np.float64)))
    vin /= torch.as_tensor(np.bincount(g), dtype=torch.float64)[:, None]
    shares = []
    for _ in range(batches):
        pick = torch.as_tensor(rng.choice(n, batch, replace=False))
        shares.append(float((influence_scores(connectivity(vin[pick])) > 0.9).float().mean()))
    return float(np.mean(shares))


def diagnose(args) -> dict:
    """Per run: global / local loss and val p2v R@1 per epoch; CrossCLR's global pruning share. Printed, and
    returned as ``{kind: {"seed S": {"prune_share": {batch: share}, LOSS-MODEL: {"epochs": [...], "train": {...}}}}}``."""
    from xmodal.models import load_model
    from xmodal.retrieval.evaluate import group_metrics

    out: dict = {}
    for kind in args.albums:
        for seed in args.seeds:
            root = Path(args.out) / "data" / kind / f"seed{seed}"
            here = out.setdefault(kind, {}).setdefault(f"seed{seed}", {"prune_share": {}})
            for batch in (16, 64):
                share = 100 * prune_share(root, seed, batch)
                here["prune_share"][f"batch{batch}"] = share
                print(f"{kind} seed {seed}: CrossCLR prunes {share:.0f}% of a {batch}-album batch (video side)")
            for loss in args.losses:
                for model in args.models:
                    run = _run_dir(args, kind, loss, model, seed)
                    log = run / "log.jsonl"
                    if not log.is_file():
                        continue
                    recs = [json.loads(x) for x in log.read_text().splitlines()]
                    recs = [r for r in recs if "epoch" in r and "val" in r]
                    cells = []
                    for r in recs:
                        t = r.get("loss_terms", {})
                        cells.append(f"{r['epoch']}: " + (f"L_g {t['global']:.3f} L_l {t['local']:.3f} "
                                                          if "global" in t else f"L {r['train_loss']:.3f} ")
                                     + f"val p2v {r['val']['p2v']['R@1']:.0f}"
                                     + (f" flat {r['val']['p2v_flat']['R@1']:.0f}" if "p2v_flat" in r["val"] else ""))
                    print(f"{kind} seed {seed} {loss} {model}: " + "; ".join(cells))
                    fit = group_metrics(load_model(run), load_paired_split(root, "train"))  # the fitted albums
                    print(f"{kind} seed {seed} {loss} {model}: TRAIN albums p2v R@1 {fit['p2v']['R@1']:.1f}"
                          + (f" (flat reference {fit['p2v_flat']['R@1']:.1f})" if "p2v_flat" in fit else ""))
                    here[f"{loss}-{model}"] = {
                        "epochs": [{"epoch": r["epoch"], **({"L_g": r["loss_terms"]["global"],
                                                             "L_l": r["loss_terms"]["local"]}
                                                            if "global" in r.get("loss_terms", {})
                                                            else {"L": r["train_loss"]}),
                                    "val_p2v_r1": r["val"]["p2v"]["R@1"],
                                    **({"val_flat_r1": r["val"]["p2v_flat"]["R@1"]} if "p2v_flat" in r["val"] else {})}
                                   for r in recs],
                        "train_p2v_r1": fit["p2v"]["R@1"],
                        **({"train_flat_r1": fit["p2v_flat"]["R@1"]} if "p2v_flat" in fit else {})}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="the flickr8k folder of ../shared/data")
    p.add_argument("--out", default="runs/albums")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--albums", nargs="+", default=list(ALBUM_KINDS), choices=ALBUM_KINDS)
    p.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--batch", type=int, default=16, help="albums per step of hierarchical runs (flat: 5.5x pairs)")
    p.add_argument("--keys", default="{}", help="JSON of model keys for the hierarchical models (a variant), "
                   "e.g. '{\"global_context\": false}'; needs --tag")
    p.add_argument("--tag", default="", help="name of the variant: its runs go to LOSS-MODEL-TAG")
    p.add_argument("--diagnose", action="store_true", help="print loss curves and CrossCLR's pruning share")
    p.add_argument("--controls", action="store_true", help="re-evaluate every run on the test albums with the "
                   "same-length column, add the length-only control rows, write per-query ranks to OUT/perquery")
    p.add_argument("--write", default=None, help="also write the results (every seed, the summaries, the paired "
                   "tests, --diagnose's curves) with their command, commit, date and machine to this JSON file, "
                   "which the docs render (docs/results/data/albums*.json)")
    args = p.parse_args(argv)
    if json.loads(args.keys) and not args.tag:
        p.error("--keys: give the variant a --tag (its runs must not mix with the plain ones)")
    if args.write and not args.write.endswith(".json"):
        p.error(f"--write: {args.write} is not a .json file (the bench writes data; the docs pages render it)")
    if not Path(args.data).is_dir():
        print(f"--data: {args.data} not found", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    per_seed: dict[int, dict] = {s: {} for s in args.seeds}
    for kind in args.albums:
        for s in args.seeds:
            per_seed[s].update(run_seed(args, kind, s))
    curves = diagnose(args) if args.diagnose else None
    sizes = {k: load_paired_split(Path(args.out) / "data" / k / f"seed{args.seeds[0]}", "test").num_groups
             for k in args.albums}
    data = provenance("bench/albums.py", argv, "bench/albums.py --write (this file is its output)")
    print(table(per_seed, data["command"], sizes))
    if args.write:
        rows, nested, tables = results(per_seed)
        data.update({"seeds": args.seeds, "epochs": args.epochs, "batch": args.batch, "test_albums": sizes,
                     "setup": {"losses": LOSSES, "models": MODELS, "fixed_size": FIXED, "val_albums": VAL_ALBUMS,
                               "variant": {"tag": args.tag, "keys": json.loads(args.keys)} if args.tag else None},
                     "results": nested, "tables": tables, "tests": paired_tests(args, args.albums, nested),
                     "seed_counts": seed_counts(nested),
                     "diagnose": curves, "rows": rows})
        data["test_table"] = test_table(data["tests"], nested)
        write_json(args.write, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
