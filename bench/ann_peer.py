"""xmodal's index against autofaiss at autofaiss's own memory budgets, on the same vectors (issue 43).

    make peer-env     # autofaiss in its own environment (.peer-venv; never in .venv), pins in the Makefile
    OMP_NUM_THREADS=1 python bench/ann_peer.py --clips 50000 --root /tmp/ann_peer \\
        --write docs/results/data/ann_peer.json

Two collections, each a gallery of float32 vectors saved once (``ROOT/COLL/gallery/emb.npy``), searched by
held-out queries with ground truth:

- ``synthetic``: a seeded generator (:func:`make_layout`): 768-d video / 256-d text features, clips of
  ``N / 200`` topics drawn by a Zipf law (exponent 1), a caption a noisy view of its clip. A run trained on a
  separate ``train`` split (``xmodal train``, linear 128-d heads, InfoNCE, one epoch) embeds ``N`` further
  clips (the gallery) and 2,000 captions of gallery clips (the queries; R@1: the caption's own clip). The
  xmodal build measures its recall on the run's held-out train captions, as ``xmodal index`` does.
- ``flickr8k``: real features, not the generator's: the all-MiniLM-L6-v2 caption embeddings of
  ``../shared/data/flickr8k`` (384-d, train + dev). Queries: caption 0 of each dev image; R@1: one of the
  same image's captions 2-4 ranks first. Caption 1 of each dev image is the xmodal build's recall sample.
  Nothing derived from it is written into the repository but the table's numbers.

Where autofaiss writes a file larger than its budget, xmodal is also built within the bytes autofaiss
wrote (the row "BUDGET: autofaiss's bytes"): equal bytes, as the issue asks.

Budgets (autofaiss's ``max_index_memory_usage``, bytes): ``float32`` = ``1.05 N (4 (D + 1) + 8)`` (room for an
IVF index of float32 vectors with 8-byte ids and its centroids, xmodal's bias column included), ``30%`` and
``8%`` of it (:func:`budgets`). For each, two child processes build from the
same ``emb.npy``: autofaiss (``build_index(embeddings=DIR, max_index_memory_usage=..., metric_type="ip")``,
its own choice of index and search parameters, run by ``--peer-python``) and xmodal
(:func:`xmodal.retrieval.budget.choose_index` over the rows read in blocks, as ``xmodal index --max-memory``
chooses: the kind, factory and search setting with the best measured recall@10 whose file fits). Each child's wall time, CPU time (``wait4``) and peak RssAnon + RssShmem (``/proc/PID/status``
every 20 ms, bench/scale.py's sampler) are measured. Then both index files are loaded here (the project's
FAISS searches both; autofaiss builds with faiss-cpu 1.13.2, the newest its calls run on) and searched with the held-out queries, one thread, interleaved, best of
``--repeats``: recall@10 against exact search, R@1, queries/s, the vectors each query compares
(:func:`vectors_compared`, a count, independent of the load) and the file's bytes.

``--cli``: also ``xmodal index --kind ivf --normalizer none`` of the synthetic gallery's raw features (the
whole command: embedding by the run's head, cell-count choice, training, adding) against autofaiss given
the same factory (``index_key``), peak memory and CPU (issue 43 item 7).

Timings are wall-clock on whatever else the machine runs; nothing here is asserted (``tests/`` checks the
helpers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DV, DT, LATENT, DIM = 768, 256, 64, 128
QUERIES = 2000
ZIPF = 1.0
#: autofaiss's memory units (``autofaiss.utils.cast.cast_memory_to_bytes``): powers of 1024.
UNITS = {u: 1024 ** i for i, u in enumerate("BKMGTPEZ")}
#: Budgets as fractions of the float32 size.
BUDGETS = (("float32", 1.0), ("30%", 0.30), ("8%", 0.08))
#: The kinds xmodal falls back to without a budget option, most accurate first.
FALLBACK_KINDS = ("ivf", "ivfpqr", "ivfpq")


# ----------------------------------------------------------------------------- pure helpers (tested)
def parse_size(text: str) -> int:
    """A memory size as autofaiss reads one (``16G``, ``22MB``, ``1.5K``, ``4096B``, ``4096``): bytes, units
    of 1024. Raises ValueError in one line for anything else.

    >>> parse_size("16G") == 16 * 2**30, parse_size("1.5KB"), parse_size("300")
    (True, 1536, 300)
    """
    m = re.fullmatch(r"\s*([0-9]*\.[0-9]+|[0-9]+)\s*([BKMGTPEZ]?)B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"size: expected a number with an optional unit (B, K, M, G, ...), got {text!r}")
    return int(float(m.group(1)) * UNITS[(m.group(2) or "B").upper()])


def vectors_compared(probed: np.ndarray, list_sizes: np.ndarray, coarse: float, refine: float = 0.0) -> float:
    """Vectors one query compares in an IVF search, averaged over queries: ``coarse`` (the centroids, or the
    distance computations of a graph quantiser) + the sizes of the lists it probes (``probed [Q, nprobe]`` cell
    numbers, ``-1`` for none) + ``refine`` (candidates re-ranked). Independent of the machine's load.

    >>> vectors_compared(np.array([[0, 1], [2, -1]]), np.array([5, 3, 7]), coarse=3)
    10.5
    """
    p = np.asarray(probed, dtype=np.int64)
    sizes = np.asarray(list_sizes, dtype=np.int64)
    scanned = np.where(p >= 0, sizes[np.maximum(p, 0)], 0).sum(axis=1)
    return float(coarse + scanned.mean() + refine)


def estimated_bytes(kind: str, n: int, d: int, nlist: int) -> int:
    """The index file of an xmodal kind over ``n`` vectors of ``d`` values (xmodal's widths: ``d + 1``, PQ
    kinds padded to 4 plus the bias sub-vector), 8-byte ids, float32 centroids."""
    w = d + 1 if kind in ("ivf", "flat") else -(-d // 4) * 4 + 4
    per = {"flat": 4 * w, "ivf": 4 * w + 8, "ivfpq": w // 4 + 8, "ivfpqr": w // 8 + w + 8}[kind]
    return n * per + (0 if kind == "flat" else 4 * w * nlist)


def budgets(n: int, d: int) -> list[tuple[str, int]]:
    """``[(label, bytes)]``: :data:`BUDGETS` of the float32 size ``1.05 n (4 (d + 1) + 8)``.

    >>> budgets(1000, 127)
    [('float32', 546000), ('30%', 163800), ('8%', 43680)]
    """
    f32 = 1.05 * n * (4 * (d + 1) + 8)
    return [(label, int(round(f32 * frac))) for label, frac in BUDGETS]


def kind_for_budget(budget: int, n: int, d: int) -> str:
    """The most accurate of :data:`FALLBACK_KINDS` whose estimated file fits ``budget`` (4 sqrt(N) cells)."""
    nlist = int(4 * np.sqrt(n))
    for kind in FALLBACK_KINDS:
        if estimated_bytes(kind, n, d, nlist) <= budget:
            return kind
    return FALLBACK_KINDS[-1]


# ----------------------------------------------------------------------------- child processes
def child_autofaiss(a: argparse.Namespace) -> None:
    """Run in the peer environment: autofaiss's own choice within the budget (or ``--index-key``)."""
    import logging

    from autofaiss import build_index

    out = Path(a.out)
    _, infos = build_index(embeddings=a.emb_dir, index_path=str(out / "knn.index"),
                           index_infos_path=str(out / "infos.json"), max_index_memory_usage=a.budget,
                           current_memory_available="8G", metric_type="ip", nb_cores=a.threads,
                           index_key=a.index_key or None, verbose=logging.WARNING)
    (out / "child.json").write_text(json.dumps({"infos": infos}, default=str))


def child_xmodal(a: argparse.Namespace) -> None:
    """Run in the project's environment: BiasedIndex over the rows read in blocks (``xmodal index``'s path)."""
    import faiss
    import torch

    from xmodal.retrieval.index import BiasedIndex
    from xmodal.retrieval.rowstore import RowStore

    torch.set_num_threads(a.threads)
    faiss.omp_set_num_threads(a.threads)
    out = Path(a.out)
    emb = np.load(a.emb, mmap_mode="r")
    store = RowStore(*emb.shape, directory=out)
    for s in range(0, emb.shape[0], 16384):
        store.append(np.asarray(emb[s:s + 16384], dtype=np.float32))
    del emb
    tune = np.load(a.tune)
    choice = None
    if a.budget:  # xmodal index --max-memory: the kind, factory and setting chosen for the budget
        from xmodal.retrieval.budget import choose_index

        index, choice = choose_index(store, None, max_bytes=parse_size(a.budget), queries=tune, seed=0,
                                     workdir=out, next_up=False)
    else:
        index = BiasedIndex(store, queries=tune, seed=0, kind=a.kind)
    index.save(out / "index.faiss")
    store.close()
    (out / "child.json").write_text(json.dumps({
        "kind": index.kind, "factory": index.factory, "search_params": index.search_params,
        "recall_at_10_build": index.recall_at_10, "nlist_choice": index.nlist_choice,
        "budget_option": choice is not None, "choice": choice}, default=str))


def run_child(cmd: list[str], log: Path, threads: int) -> dict:
    """Run ``cmd`` with ``threads`` OpenMP / BLAS threads: wall, CPU (user + system, ``wait4``), peak memory."""
    sys.path.insert(0, str(HERE))
    from scale import Sampler  # noqa: PLC0415  (bench/ is not a package)

    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT / "src"))
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        sampler = Sampler(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return {"wall_s": time.perf_counter() - t0, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_anon": sampler.peak_anon, "peak_rss": sampler.peak_rss}


# ----------------------------------------------------------------------------- collections
def make_layout(root: Path, n: int, train: int, *, seed: int = 0) -> None:
    """The synthetic layout: ``train`` / ``val`` / ``test`` splits for the run and a gallery of ``n`` clips
    (``gallery_video.npy``) with ``QUERIES`` captions of evenly spaced clips. Zipf topic sizes."""
    from numpy.lib.format import open_memmap

    done = root / ".complete"
    if done.is_file() and json.loads(done.read_text()) == {"n": n, "train": train, "seed": seed}:
        return
    (root / "data").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    topics = max(100, n // 200)
    centres = rng.standard_normal((topics, LATENT)).astype(np.float32)
    p = 1.0 / np.arange(1, topics + 1) ** ZIPF
    p /= p.sum()
    wv = (rng.standard_normal((LATENT, DV)) / np.sqrt(LATENT)).astype(np.float32)
    wt = (rng.standard_normal((LATENT, DT)) / np.sqrt(LATENT)).astype(np.float32)
    for split, count, sub in (("train", train, 1), ("val", 2000, 2), ("test", 2000, 3), ("gallery", n, 4)):
        g = np.random.default_rng([seed, sub])
        vpath = root / "gallery_video.npy" if split == "gallery" else root / "data" / f"{split}_video_features.npy"
        video = open_memmap(vpath, "w+", np.float16, (count, DV))
        text = np.empty((count, DT), np.float16) if split != "gallery" else None
        described = np.arange(0, count, max(1, count // QUERIES))[:QUERIES]
        captions = np.empty((len(described), DT), np.float32)
        for s in range(0, count, 65536):
            m = min(count, s + 65536) - s
            z = centres[g.choice(topics, size=m, p=p)] + 0.6 * g.standard_normal((m, LATENT), dtype=np.float32)
            video[s:s + m] = (z + 0.3 * g.standard_normal((m, LATENT), dtype=np.float32)) @ wv
            t = (z + 0.5 * g.standard_normal((m, LATENT), dtype=np.float32)) @ wt
            t /= np.linalg.norm(t, axis=1, keepdims=True)
            if text is not None:
                text[s:s + m] = t
            inside = (described >= s) & (described < s + m)
            captions[inside] = t[described[inside] - s]
        video.flush()
        del video
        if split == "gallery":
            np.save(root / "gallery_captions.npy", captions)
            np.save(root / "gallery_caption_to_video.npy", described.astype(np.int64))
        else:
            np.save(root / "data" / f"{split}_text_features.npy", text)
            np.save(root / "data" / f"{split}_text_to_video.npy", np.arange(count, dtype=np.int32))
    done.write_text(json.dumps({"n": n, "train": train, "seed": seed}))


def synthetic(work: Path, n: int, train: int, threads: int) -> dict:
    """Layout, run, embedded gallery / queries / recall sample of the synthetic collection."""
    make_layout(work, n, train)
    run = work / "run"
    if not (run / "model.pt").is_file():
        import yaml

        cfg = yaml.safe_load((ROOT / "configs" / "scale" / "linear_1m.yaml").read_text())
        cfg["data"]["root"] = str(work / "data")
        cfg["model"]["dim"] = DIM
        cfg["train"].update(progress=False, device="cpu")
        (work / "train.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        subprocess.run([sys.executable, "-m", "xmodal", "train", str(work / "train.yaml"), "--out", str(run),
                        "--threads", str(threads), "--no-plots"], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    emb = work / "gallery" / "emb.npy"
    if not emb.is_file():
        from numpy.lib.format import open_memmap

        from xmodal.models import load_model
        from xmodal.retrieval.build import _recall_sample

        model = load_model(run)
        video = np.load(work / "gallery_video.npy", mmap_mode="r")
        emb.parent.mkdir(exist_ok=True)
        out = open_memmap(work / "emb.tmp.npy", "w+", np.float32, (video.shape[0], DIM))
        for s in range(0, video.shape[0], 16384):
            out[s:s + 16384] = model.encode_video(np.asarray(video[s:s + 16384]), batch_size=8192).numpy()
        out.flush()
        del out
        np.save(work / "queries.npy", model.encode_text(np.load(work / "gallery_captions.npy")).numpy())
        np.save(work / "tune.npy", _recall_sample(model, 1000, 0)[0])
        os.replace(work / "emb.tmp.npy", emb)
    t2v = np.load(work / "gallery_caption_to_video.npy")
    return {"emb": emb, "queries": np.load(work / "queries.npy"), "tune": work / "tune.npy",
            "positives": t2v[:, None], "note": f"{n:,} clips x {DIM}-d (run embeddings)", "raw": work / "gallery_video.npy",
            "run": run}


FLICKR = ROOT.parent / "shared" / "data" / "flickr8k"


def flickr8k(work: Path, data: Path = FLICKR) -> dict | None:
    """The flickr8k caption embeddings: gallery = train captions + dev captions 2-4; queries = dev caption 0."""
    if not (data / "dev_caption_features.npy").is_file():
        print(f"flickr8k: {data} not found; collection skipped", file=sys.stderr)
        return None
    tr = np.load(data / "train_caption_features.npy").astype(np.float32)
    dev = np.load(data / "dev_caption_features.npy").astype(np.float32)
    img = np.load(data / "dev_caption_to_image.npy").astype(np.int64)
    first = {}  # the captions of each dev image, in file order
    for row, i in enumerate(img.tolist()):
        first.setdefault(i, []).append(row)
    groups = [first[i] for i in sorted(first) if len(first[i]) >= 3]
    q_rows = [g[0] for g in groups]
    t_rows = [g[1] for g in groups]
    rest = [r for g in groups for r in g[2:]]
    gallery = np.vstack([tr, dev[rest]])
    where = {r: tr.shape[0] + j for j, r in enumerate(rest)}
    width = max(len(g) - 2 for g in groups)
    positives = np.full((len(groups), width), -1, np.int64)
    for qi, g in enumerate(groups):
        positives[qi, :len(g) - 2] = [where[r] for r in g[2:]]
    (work / "gallery").mkdir(parents=True, exist_ok=True)
    np.save(work / "gallery" / "emb.npy", gallery)
    np.save(work / "tune.npy", dev[t_rows])
    return {"emb": work / "gallery" / "emb.npy", "queries": dev[q_rows], "tune": work / "tune.npy",
            "positives": positives, "note": f"{gallery.shape[0]:,} captions x {gallery.shape[1]}-d (real)"}


# ----------------------------------------------------------------------------- measuring a built index
def compared_per_query(index, q: np.ndarray, k: int = 10) -> float:
    """:func:`vectors_compared` of a FAISS index (IVF with a flat or HNSW quantiser, optionally behind an
    OPQ rotation and / or a refine stage; flat: every vector; HNSW: its distance count)."""
    import faiss

    index = faiss.downcast_index(index)
    refine = 0.0
    if isinstance(index, faiss.IndexRefine):
        refine = float(index.k_factor) * k
        index = faiss.downcast_index(index.base_index)
    if isinstance(index, faiss.IndexPreTransform):
        for i in range(index.chain.size()):
            q = faiss.downcast_VectorTransform(index.chain.at(i)).apply(q)
        index = faiss.downcast_index(index.index)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        if isinstance(index, faiss.IndexHNSW):
            faiss.cvar.hnsw_stats.reset()
            index.search(q, k)
            return faiss.cvar.hnsw_stats.ndis / len(q) + refine
        return float(index.ntotal) + refine
    quant = faiss.downcast_index(ivf.quantizer)
    if isinstance(quant, faiss.IndexHNSW):
        faiss.cvar.hnsw_stats.reset()
        probed = quant.search(q, ivf.nprobe)[1]
        coarse = faiss.cvar.hnsw_stats.ndis / len(q)
    else:
        probed, coarse = quant.search(q, ivf.nprobe)[1], float(ivf.nlist)
    sizes = np.array([ivf.invlists.list_size(c) for c in range(ivf.nlist)])
    return vectors_compared(probed, sizes, coarse, refine)


def r_at_1(top1: np.ndarray, positives: np.ndarray) -> float:
    """Percent of queries whose first result is one of its positives (``[Q, P]``, ``-1`` padding)."""
    return 100.0 * float(((positives == top1[:, None]) & (positives >= 0)).any(axis=1).mean())


def equal_recall_nprobe(search, tune: np.ndarray, exact_tune: np.ndarray, start: int, nlist: int,
                        target: float) -> tuple[int, float]:
    """The smallest nprobe from ``start`` (growing by a quarter, at least one) whose recall@10 on the held-out
    ``tune`` queries reaches ``target``, or ``nlist`` (every cell) when none does: ``(nprobe, its tune recall)``.
    ``search(q, nprobe)`` returns ids. Chosen on the tune queries, as the build chose its own setting, so the
    bench's queries are not used to tune what they measure.

    >>> ids = lambda q, p: np.tile(np.r_[np.arange(min(p, 10)), -np.ones(10 - min(p, 10), int)], (len(q), 1))
    >>> equal_recall_nprobe(ids, np.zeros((2, 1)), np.tile(np.arange(10), (2, 1)), 3, 64, 0.7)
    (7, 0.7)
    """
    from xmodal.retrieval.recall import recall_at_k

    p = max(1, int(start))
    while True:
        r = recall_at_k(search(tune, p), exact_tune, 10)
        if r >= target or p >= nlist:
            return p, r
        p = min(nlist, max(p + 1, int(p * 1.25)))


def evaluate(entries: list[dict], coll: dict, repeats: int) -> None:
    """Search every built index with the collection's queries (1 thread, interleaved, best of ``repeats``).
    Where autofaiss's index reaches a higher recall@10 than xmodal's at a budget (xmodal's row within
    autofaiss's bytes where there is one), xmodal's index is also searched at the nprobe reaching that recall
    on its tune queries (:func:`equal_recall_nprobe`): the row "xmodal at autofaiss's recall", queries/s at
    equal recall."""
    import faiss

    from xmodal.retrieval.index import BiasedIndex
    from xmodal.retrieval.recall import recall_at_k

    faiss.omp_set_num_threads(1)
    g = np.load(coll["emb"])
    q = np.ascontiguousarray(coll["queries"], dtype=np.float32)
    tune = np.ascontiguousarray(np.load(coll["tune"]), dtype=np.float32)
    flat = faiss.IndexFlatIP(g.shape[1])
    flat.add(g)
    exact = flat.search(q, 10)[1]
    exact_tune = flat.search(tune, 10)[1]
    coll["exact_r1"] = r_at_1(exact[:, 0], coll["positives"])
    flat_path = Path(coll["emb"]).parent.parent / "flat.index"
    faiss.write_index(flat, str(flat_path))
    entries.insert(0, {"who": "exact (faiss Flat)", "budget": "-", "factory": "Flat", "setting": "", "path": flat_path})
    del flat, g
    searchers = []
    loaded = {}
    for e in entries:
        if e["who"].startswith("xmodal"):
            idx = loaded[str(e["path"])] = BiasedIndex.load(e["path"], dim=q.shape[1])
            searchers.append(lambda idx=idx: idx.search(q, 10)[1])
            e["compared"] = compared_per_query(idx.index, idx._fold_queries(q))
        else:
            idx = faiss.read_index(str(e["path"]))
            if e.get("index_param"):
                faiss.ParameterSpace().set_index_parameters(idx, e["index_param"])
            searchers.append(lambda idx=idx: idx.search(q, 10)[1])
            e["compared"] = compared_per_query(idx, q)
        e["bytes"] = Path(e["path"]).stat().st_size
        got = searchers[-1]()
        e["recall_at_10"], e["r1"] = recall_at_k(got, exact, 10), r_at_1(got[:, 0], coll["positives"])
    for peer in [e for e in entries if e["who"] == "autofaiss" and e.get("budget_bytes")]:
        mine = [e for e in entries if e["who"] == "xmodal" and str(e["budget"]).split(":")[0] == peer["budget"]]
        if not mine or mine[-1]["recall_at_10"] >= peer["recall_at_10"] or "nprobe" not in mine[-1]["setting"]:
            continue
        x = mine[-1]
        idx = loaded[str(x["path"])]
        nprobe, tune_recall = equal_recall_nprobe(lambda t, p, idx=idx: idx.search(t, 10, nprobe=p)[1], tune,
                                                  exact_tune, idx.search_params["nprobe"], idx.nlist,
                                                  peer["recall_at_10"])
        row = {k: v for k, v in x.items() if k not in ("choice", "recall_at_10", "r1", "compared", "qps")}
        row.update(who="xmodal at autofaiss's recall", setting=f"nprobe={nprobe}", tune_recall=tune_recall,
                   compared=_compared_at(idx.index, nprobe, idx._fold_queries(q)))
        searchers.append(lambda idx=idx, p=nprobe: idx.search(q, 10, nprobe=p)[1])
        entries.append(row)
    best = [float("inf")] * len(entries)
    for _ in range(repeats):
        for i, (e, search) in enumerate(zip(entries, searchers)):
            t0 = time.perf_counter()
            got = search()
            best[i] = min(best[i], time.perf_counter() - t0)
            e["recall_at_10"] = recall_at_k(got, exact, 10)
            e["r1"] = r_at_1(got[:, 0], coll["positives"])
    for e, t in zip(entries, best):
        e["qps"] = len(q) / t


def _compared_at(index, nprobe: int, q: np.ndarray) -> float:
    """:func:`compared_per_query` of an IVF ``index`` (possibly behind a transform) at ``nprobe``; the index's
    own nprobe is restored."""
    import faiss

    ivf = faiss.extract_index_ivf(index)
    kept, ivf.nprobe = ivf.nprobe, int(nprobe)
    try:
        return compared_per_query(index, q)
    finally:
        ivf.nprobe = kept


# ----------------------------------------------------------------------------- the bench
def build_pair(work: Path, coll: dict, label: str, budget: int, args: argparse.Namespace,
               index_key: str | None = None, sides: tuple = ("autofaiss", "xmodal")) -> list[dict]:
    """autofaiss and xmodal built in child processes within ``budget`` bytes."""
    d = int(np.load(coll["emb"], mmap_mode="r").shape[1])
    n = int(np.load(coll["emb"], mmap_mode="r").shape[0])
    out = []
    for who in sides:
        folder = work / f"{label}_{who}"
        folder.mkdir(parents=True, exist_ok=True)
        if args.reuse and (folder / "cost.json").is_file():  # built by an earlier run of this command
            out.append(_entry(who, label, budget, json.loads((folder / "cost.json").read_text()), folder))
            continue
        for stale in folder.glob("*"):
            stale.unlink()
        me = [str(HERE / "ann_peer.py"), f"child-{who}", "--out", str(folder), "--budget", f"{budget}B",
              "--threads", str(args.threads)]
        if who == "autofaiss":
            cmd = [args.peer_python, *me, "--emb-dir", str(Path(coll["emb"]).parent),
                   *(["--index-key", index_key] if index_key else [])]
        else:
            kind = kind_for_budget(budget, n, d)
            cmd = [sys.executable, *me, "--emb", str(coll["emb"]), "--tune", str(coll["tune"]), "--kind", kind]
        cost = run_child(cmd, folder / "log.txt", args.threads)
        (folder / "cost.json").write_text(json.dumps(cost))
        out.append(_entry(who, label, budget, cost, folder))
    return out


def _entry(who: str, label: str, budget: int, cost: dict, folder: Path) -> dict:
    """A built index's row: its build cost and what the child recorded (``child.json``)."""
    info = json.loads((folder / "child.json").read_text())
    e = {"who": who, "budget": label, "budget_bytes": budget, **cost}
    if who == "autofaiss":
        infos = info["infos"] or {}
        e.update(path=folder / "knn.index", factory=infos.get("index_key", "?"),
                 index_param=infos.get("index_param", ""), setting=infos.get("index_param", ""))
    else:
        e.update(path=folder / "index.faiss", factory=info["factory"], kind=info["kind"],
                 setting=",".join(f"{k}={v}" for k, v in info["search_params"].items()),
                 budget_option=info["budget_option"], choice=info.get("choice"))
    return e


def cli_rows(work: Path, coll: dict, args: argparse.Namespace) -> list[dict]:
    """``xmodal index --kind ivf --normalizer none`` of the raw gallery against autofaiss with its factory."""
    folder = work / "cli_index"
    if args.reuse and (work / "cli_cost.json").is_file():
        cost = json.loads((work / "cli_cost.json").read_text())
    else:
        cost = run_child([sys.executable, "-m", "xmodal", "index", "--run", str(coll["run"]), "--video-features",
                          str(coll["raw"]), "--kind", "ivf", "--normalizer", "none", "--out", str(folder),
                          "--overwrite", "--threads", str(args.threads), "--no-progress"], work / "cli_log.txt",
                         args.threads)
        (work / "cli_cost.json").write_text(json.dumps(cost))
    meta = json.loads((folder / "meta.json").read_text())
    x = {"who": "xmodal index (CLI)", "budget": "same factory", "factory": meta["factory"],
         "setting": ",".join(f"{k}={v}" for k, v in meta["search_params"].items()),
         "path": folder / "index.faiss", "kind": "ivf", **cost}
    n = int(np.load(coll["emb"], mmap_mode="r").shape[0])
    peer = build_pair(work, coll, "cli", 4 * n * (DIM + 2) * 2, args, index_key=meta["factory"], sides=("autofaiss",))[0]
    peer["budget"], peer["budget_bytes"] = "same factory", None  # no budget: the factory is given
    return [x, peer]


def table(rows: list[dict], title: str) -> dict:
    """The result file's table (rendered by docs/hooks/numbers.py) and its Markdown, printed: the numbers
    first, the factory and the search setting (long strings) last."""
    columns = ["collection", "budget", "index", "MB", "within budget", "recall@10", "R@1", "queries/s",
               "compared / query", "build wall s", "build CPU s", "build peak MB", "factory", "search setting"]
    cells = []
    for r in rows:
        mb = r["bytes"] / 2**20
        within = "-" if not r.get("budget_bytes") else ("yes" if r["bytes"] <= r["budget_bytes"] else "no")
        built = "wall_s" in r
        cells.append([r["collection"], r["budget"], r["who"], round(mb, 1), within, round(r["recall_at_10"], 3),
                      round(r["r1"], 2), int(round(r["qps"])), int(round(r["compared"])),
                      round(r["wall_s"], 1) if built else "-", round(r["cpu_s"], 1) if built else "-",
                      int(round(r["peak_anon"] / 2**20)) if built else "-", r["factory"], r["setting"] or "-"])
    formats = [None, None, None, ".1f", None, ".3f", ".2f", None, None, ".1f", ".1f", None, None, None]
    print(f"\n## {title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for c in cells:
        print("| " + " | ".join(format(v, f) if f and not isinstance(v, str) else str(v)
                                for v, f in zip(c, formats)) + " |")
    return {"title": title, "columns": columns, "formats": formats, "rows": cells}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", nargs="?", default="bench", choices=["bench", "child-autofaiss", "child-xmodal"])
    p.add_argument("--clips", type=int, default=50000, help="synthetic gallery size")
    p.add_argument("--train-clips", type=int, default=50000, help="synthetic train split of the run")
    p.add_argument("--collections", nargs="+", default=["synthetic", "flickr8k"])
    p.add_argument("--root", default="/tmp/ann_peer")
    p.add_argument("--peer-python", default=str(ROOT / ".peer-venv" / "bin" / "python"))
    p.add_argument("--budgets", nargs="+", default=[b for b, _ in BUDGETS], choices=[b for b, _ in BUDGETS] + ["none"],
                   help="which budgets to build (default all; none: only --cli)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--reuse", action="store_true", help="keep the indexes (and their measured build cost) an earlier "
                   "run under --root left; build only the missing ones")
    p.add_argument("--cli", action="store_true", help="also xmodal index (CLI) vs autofaiss, same factory")
    p.add_argument("--write", default=None, help="the result file (docs/results/data/ann_peer.json)")
    # children
    p.add_argument("--out"), p.add_argument("--budget"), p.add_argument("--emb"), p.add_argument("--emb-dir")
    p.add_argument("--tune"), p.add_argument("--kind"), p.add_argument("--index-key")
    args = p.parse_args(argv)
    if args.what == "child-autofaiss":
        child_autofaiss(args)
        return 0
    if args.what == "child-xmodal":
        child_xmodal(args)
        return 0
    if not Path(args.peer_python).is_file():
        print(f"--peer-python: {args.peer_python} not found (make peer-env)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "src"))
    root = Path(args.root)
    rows: list[dict] = []
    notes: dict[str, str] = {}
    for name in args.collections:
        work = root / (f"synthetic_{args.clips}" if name == "synthetic" else name)
        work.mkdir(parents=True, exist_ok=True)
        coll = synthetic(work, args.clips, args.train_clips, args.threads) if name == "synthetic" else flickr8k(work)
        if coll is None:
            continue
        n, d = np.load(coll["emb"], mmap_mode="r").shape
        built = []
        for label, budget in budgets(n, d):
            if label not in args.budgets:
                continue
            built += build_pair(work, coll, label.replace("%", "pct"), budget, args)
            built[-2]["budget"] = built[-1]["budget"] = label
            peer_bytes = Path(built[-2]["path"]).stat().st_size
            if peer_bytes > budget:  # autofaiss wrote more than its budget: xmodal at the bytes autofaiss took
                built += build_pair(work, coll, label.replace("%", "pct") + "_peerbytes", peer_bytes, args,
                                    sides=("xmodal",))
                built[-1]["budget"] = f"{label}: autofaiss's bytes"
        if args.cli and name == "synthetic":
            built += cli_rows(work, coll, args)
        evaluate(built, coll, args.repeats)
        for e in built:
            e["collection"] = name
        notes[name] = coll["note"]
        rows += built
        print(f"{name}: exact R@1 {coll['exact_r1']:.2f}", file=sys.stderr)
    title = f"xmodal against autofaiss 2.18.0 at its budgets (--threads {args.threads}, best of {args.repeats})"
    t = table(rows, title)
    if args.write:
        sys.path.insert(0, str(HERE))
        import resultfile

        data = resultfile.provenance("bench/ann_peer.py", argv, "bench/ann_peer.py --write (this file is its output)")
        data["peer_pins"] = "autofaiss==2.18.0 faiss-cpu==1.13.2 numpy==1.26.4 pandas==2.2.3 pyarrow==18.1.0"
        data["raw"] = [{k: (str(v) if isinstance(v, Path) else v) for k, v in r.items()} for r in rows]
        resultfile.write_json(args.write, {**data, "collections": notes, "tables": [t]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
