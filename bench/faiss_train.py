"""Training a product quantiser with FAISS's BLAS threshold as xmodal sets it, against FAISS's default.

    python bench/faiss_train.py [--rows 20000] [--dim 128] [--repeats 3] [--write docs/results/data/faiss_train.json]

FAISS 1.15 raised ``distance_compute_blas_threshold`` from 20 to 128,000; a product quantiser's k-means
over sub-vectors of 4 values (``PQ{D/4}x8``, xmodal's :data:`~xmodal.retrieval.index.PQ_DSUB`) then assigns
with FAISS's scalar path. In one process, one thread, interleaved, best of ``--repeats``: the same
``ProductQuantizer.train`` and the same ``IVF{n},PQ{m}x8np`` training under
:func:`xmodal.retrieval.index.quantiser_training` and under FAISS's default. Also reports whether the two
trained codebooks are equal (the BLAS and the scalar paths may round distances differently). Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--write", default=None, help="a result file under docs/results/data/")
    args = p.parse_args(argv)
    import faiss

    from xmodal.retrieval.index import PQ_DSUB, quantiser_training

    faiss.omp_set_num_threads(1)
    x = np.random.default_rng(0).standard_normal((args.rows, args.dim)).astype(np.float32)
    m = args.dim // PQ_DSUB
    nlist = max(1, int(np.sqrt(args.rows)))
    jobs = {"ProductQuantizer": lambda: faiss.ProductQuantizer(args.dim, m, 8),
            f"IVF{nlist},PQ{m}x8np": lambda: faiss.index_factory(args.dim, f"IVF{nlist},PQ{m}x8np",
                                                                 faiss.METRIC_INNER_PRODUCT)}
    rows, codebooks = [], {}
    for name, make in jobs.items():
        best = {"xmodal": float("inf"), "faiss default": float("inf")}
        for _ in range(args.repeats):
            for who, ctx in (("xmodal", quantiser_training), ("faiss default", contextlib.nullcontext)):
                obj = make()
                with ctx():
                    start = time.perf_counter()
                    obj.train(x)
                    best[who] = min(best[who], time.perf_counter() - start)
                pq = obj if name == "ProductQuantizer" else faiss.downcast_index(faiss.extract_index_ivf(obj)).pq
                codebooks[who] = faiss.vector_to_array(pq.centroids)
        same = bool(np.array_equal(codebooks["xmodal"], codebooks["faiss default"]))
        rows.append([name, best["faiss default"], best["xmodal"], best["faiss default"] / best["xmodal"], str(same)])
        print(f"{name} on {args.rows:,} x {args.dim}: FAISS default {best['faiss default']:.2f} s, xmodal "
              f"{best['xmodal']:.2f} s ({best['faiss default'] / best['xmodal']:.1f}x); same codebook: {same}",
              flush=True)
    if args.write:
        sys.path.insert(0, str(ROOT / "bench"))
        from resultfile import provenance, write_json

        write_json(args.write, {**provenance("bench/faiss_train.py", argv if argv is not None else sys.argv[1:],
                                             "bench/faiss_train.py --write"),
                                "faiss": faiss.__version__, "rows": args.rows, "dim": args.dim,
                                "table": {"columns": ["training", "FAISS default s", "xmodal s", "speed-up",
                                                      "same codebook"],
                                          "formats": [None, ".2f", ".2f", ".1f", None], "rows": rows}})
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
