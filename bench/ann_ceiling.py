"""What a budget can hold: FAISS factories built on bench/ann_peer.py's vectors, each at every nprobe.

    OMP_NUM_THREADS=1 python bench/ann_ceiling.py --collection synthetic --root /tmp/ann_peer \\
        --write docs/results/data/ann_ceiling.json

Reads the collection bench/ann_peer.py saved under ``--root`` (run that first: ``ROOT/synthetic_50000`` or
``ROOT/flickr8k``). Each factory (``--factories``, ``;``-separated; default: around the ``8%`` budget of the synthetic
collection, codes that xmodal's budget does not build there: autofaiss's 32-byte code over few cells, with and
without OPQ, a flat 4-bit fast-scan code without ids, 1-bit RaBitQ with and without cells) is trained on the first
25,600 rows (as ``index.PQ_TRAIN_ROWS``) with 10 k-means iterations, filled, written to learn its bytes, and
searched by the bench's 2,000 queries at nprobe 1, 2, 4, ... up to every cell (one thread): recall@10 against
exact search (faiss ``IndexFlatIP``) and queries/s. RaBitQ factories search with 8-bit queries. Its question:
whether any of them reaches autofaiss's recall within the budget autofaiss was given (the row's ``best``
recall and ``within_budget``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT = "IVF64,PQ32;OPQ32_128,IVF16,PQ32;PQ128x4fs;IVF256,RaBitQ;RaBitQ"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collection", default="synthetic", choices=["synthetic", "flickr8k"])
    p.add_argument("--clips", type=int, default=50000, help="the synthetic collection's size (its folder name)")
    p.add_argument("--root", default="/tmp/ann_peer")
    p.add_argument("--factories", default=DEFAULT, help="FAISS factory strings, ';'-separated")
    p.add_argument("--budget", default="8%", choices=["float32", "30%", "8%"], help="the budget rows are compared with")
    p.add_argument("--write", default=None, help="the result file")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(HERE))
    import faiss

    import ann_peer
    from xmodal.retrieval.recall import recall_at_k

    work = Path(args.root) / (f"synthetic_{args.clips}" if args.collection == "synthetic" else "flickr8k")
    if not (work / "gallery" / "emb.npy").is_file():
        print(f"{work}: no gallery; run bench/ann_peer.py --root {args.root} first", file=sys.stderr)
        return 2
    x = np.load(work / "gallery" / "emb.npy", mmap_mode="r")
    if x.dtype != np.float32 or x.ndim != 2 or not np.isfinite(x).all():
        print(f"{work}/gallery/emb.npy: expected finite float32 [N, D]", file=sys.stderr)
        return 2
    x = np.ascontiguousarray(x)
    q = (np.load(work / "queries.npy") if args.collection == "synthetic"
         else ann_peer.flickr8k(work)["queries"]).astype(np.float32)
    n, d = x.shape
    budget = dict(ann_peer.budgets(n, d))[args.budget]
    faiss.omp_set_num_threads(1)
    flat = faiss.IndexFlatIP(d)
    flat.add(x)
    exact = flat.search(q, 10)[1]
    rows = []
    for factory in [f for f in args.factories.split(";") if f]:
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.cp.niter, ivf.cp.seed = 10, 0
        start = time.perf_counter()
        index.train(x[:25_600])
        index.add(x)
        build_s = time.perf_counter() - start
        nbytes = int(faiss.serialize_index(index).nbytes)
        rabitq = "RaBitQ" in factory
        curve = []
        for nprobe in ([2 ** i for i in range(0, 20) if 2 ** i < ivf.nlist] + [ivf.nlist]) if ivf is not None else [None]:
            if rabitq:
                params = faiss.IVFRaBitQSearchParameters() if ivf is not None else faiss.RaBitQSearchParameters()
                params.qb = 8
                if ivf is not None:
                    params.nprobe = nprobe
            else:
                params = None if ivf is None else faiss.SearchParametersIVF(nprobe=nprobe)
                if ivf is not None and "HNSW" in factory:
                    params.quantizer_params = faiss.SearchParametersHNSW(efSearch=max(2048, nprobe))
            best = float("inf")
            for _ in range(2):
                t = time.perf_counter()
                got = index.search(q, 10, params=params)[1]
                best = min(best, time.perf_counter() - t)
            curve.append({"nprobe": nprobe, "recall_at_10": float(recall_at_k(got, exact, 10)),
                          "queries_per_s": float(len(q) / best)})
        top = max(curve, key=lambda r: r["recall_at_10"])
        rows.append({"factory": factory, "bytes": nbytes, "within_budget": nbytes <= budget, "build_s": round(build_s, 1),
                     "best": top, "curve": curve})
        print(f"{factory}: {nbytes / 1e6:.3f} MB ({'within' if nbytes <= budget else 'over'} {budget / 1e6:.3f} MB), "
              f"best recall@10 {top['recall_at_10']:.3f} at nprobe {top['nprobe']} ({top['queries_per_s']:,.0f} q/s), "
              f"build {build_s:.1f} s", flush=True)
    if args.write:
        import resultfile

        data = resultfile.provenance("bench/ann_ceiling.py", argv, "bench/ann_ceiling.py --write (this file is its output)")
        table = {"title": f"FAISS factories at the {args.budget} budget ({budget:,} bytes), {args.collection}",
                 "columns": ["factory", "bytes", "within budget", "best recall@10", "at nprobe", "queries/s", "build s"],
                 "formats": [None, None, None, ".3f", None, None, ".1f"],
                 "rows": [[r["factory"], r["bytes"], "yes" if r["within_budget"] else "no",
                           round(r["best"]["recall_at_10"], 3), r["best"]["nprobe"] or "-",
                           round(r["best"]["queries_per_s"]), r["build_s"]] for r in rows]}
        resultfile.write_json(args.write, {**data, "collection": args.collection, "budget": args.budget,
                                           "budget_bytes": int(budget), "rows": rows, "tables": [table]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
