"""Benchmark the metrics against references measured in the same run (ratios printed).

    .venv/bin/python bench/bench_metrics.py            # full sizes (several minutes)
    .venv/bin/python bench/bench_metrics.py --quick    # small sizes (seconds)
    .venv/bin/python bench/bench_metrics.py --only a --only b --write docs/results/data/bench_metrics.json

(a) retrieval on a 25,000 x 5,000 matrix vs a full argsort reference and vs the one-pass
    floor ``(sim > sim_of_correct[:, None]).sum(1)``;
(b) mir on 9,668 x 3,842 vs the official-style argsort code, with the real EPIC-100 test
    relevancy when ../shared/data/epic100 is present (else an EPIC-like synthetic one) and
    scores = 0.5 * relevancy + standard normal noise; both timed as the median of
    ``--repeat`` runs;
(c) streaming_retrieval on 100,000 x 100,000 (256-d) vs the bare block-wise matmul;
    peak memory from ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of a fresh subprocess
    that only builds the embeddings and runs the evaluator (whole-process peak RSS, so it
    includes Python, torch and the embeddings themselves).
Timings are wall clock, best of ``--repeat`` runs ((b): medians); on a shared machine
they are noisy. ``--write FILE.json`` also stores every printed value with the run's provenance
(``bench/resultfile.py``), for the docs pages to render.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from xmodal.metrics import mir, retrieval, streaming_retrieval  # noqa: E402


def best_of(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def median_of(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), out


def bench_retrieval(q, g, repeat):
    rng = np.random.default_rng(0)
    sim = rng.standard_normal((q, g), dtype=np.float32)
    pos = rng.integers(0, g, q)

    def full_sort():  # the usual reference: sort every row, find the correct item
        order = np.argsort(-sim, axis=1)
        return np.nonzero(order == pos[:, None])[1] + 1

    def floor():
        correct = sim[np.arange(q), pos]
        return (sim > correct[:, None]).sum(1) + 1

    t_sort, ranks_sort = best_of(full_sort, 1)
    t_floor, ranks_floor = best_of(floor, repeat)
    t_ours, out = best_of(lambda: retrieval(sim, pos), repeat)
    # float32 normals do tie now and then: the argsort rank lies between the optimistic
    # (floor) and the pessimistic rank; ours (pessimistic by default) is exact
    correct = sim[np.arange(q), pos]
    pess = (sim >= correct[:, None]).sum(1)
    assert np.all(ranks_floor <= ranks_sort) and np.all(ranks_sort <= pess)
    assert abs(out["MnR"] - float(np.mean(pess))) < 1e-9, (out["MnR"], np.mean(pess))
    n_tied = int(np.sum(pess != ranks_floor))
    t_avg, _ = best_of(lambda: retrieval(sim, pos, ties="average"), repeat)
    print(f"(a) retrieval {q} x {g}: ours {t_ours:.3f} s | full argsort {t_sort:.3f} s "
          f"-> {t_sort / t_ours:.1f}x faster | floor {t_floor:.3f} s -> ours/floor "
          f"{t_ours / t_floor:.2f} | ties='average' {t_avg:.3f} s | ranks exact "
          f"({n_tied} queries tied with their correct item)")
    return {"queries": q, "gallery": g, "ours_s": t_ours, "argsort_s": t_sort, "floor_s": t_floor,
            "average_ties_s": t_avg, "speedup_vs_argsort": t_sort / t_ours, "ratio_to_floor": t_ours / t_floor,
            "tied_queries": n_tied}


def epic_like_relevancy(n_clips, n_sent, rng):
    """Clips carry the classes of one (long-tailed) sentence, so each clip has at least
    one relevancy-1 sentence as in EPIC; sentences: one verb (of 97) and 1-3 nouns (of
    300) from Zipf-like class frequencies. relevancy = (verb IoU + noun IoU) / 2."""
    pv = 1.0 / np.arange(1, 98) ** 1.1
    pn = 1.0 / np.arange(1, 301) ** 1.1
    verbs = rng.choice(97, n_sent, p=pv / pv.sum())
    nouns = np.zeros((n_sent, 300), dtype=bool)
    for j in range(n_sent):
        nouns[j, rng.choice(300, rng.integers(1, 4), replace=False, p=pn / pn.sum())] = True
    ps = 1.0 / np.arange(1, n_sent + 1) ** 0.8
    clip_sent = rng.choice(n_sent, n_clips, p=ps / ps.sum())
    clip_sent[:n_sent] = rng.permutation(n_sent)[:min(n_sent, n_clips)]
    cv, cn = verbs[clip_sent], nouns[clip_sent].astype(np.float32)
    verb_iou = (cv[:, None] == verbs[None, :]).astype(np.float32)
    inter = cn @ nouns.T.astype(np.float32)
    union = cn.sum(1)[:, None] + nouns.sum(1)[None, :] - inter
    return (0.5 * verb_iou + 0.5 * inter / union).astype(np.float32)


def bench_mir(q, g, repeat, epic_root=None):
    from test_metrics_naive import official_map, official_ndcg

    rng = np.random.default_rng(1)
    source = "EPIC-like synthetic"
    rel = None
    if epic_root is not None and Path(epic_root).is_dir() and (q, g) == (9668, 3842):
        from xmodal.data import epic_relevancy

        rel = epic_relevancy(epic_root, "test")[0]
        source = "real EPIC-100 test"
    if rel is None:
        rel = epic_like_relevancy(q, g, rng)
    sim = (0.5 * rel + rng.standard_normal((q, g))).astype(np.float32)

    def official():
        with np.errstate(invalid="ignore"):
            return official_map(sim, rel), official_ndcg(sim, rel)

    # medians of ``repeat`` runs for both sides (the machine is shared: best-of would
    # flatter whichever side got the quiet moment)
    t_off, _ = median_of(official, repeat)
    t_ours, out = median_of(lambda: mir(sim, rel), repeat)
    # the official mAP is NaN when a query has no relevancy-1 item (0/0); mir leaves such
    # queries out (empty="skip"), i.e. it equals the official code on the defined queries
    defined = (rel == 1).any(1)
    ref = (100 * official_map(sim[defined], rel[defined]), 100 * official_ndcg(sim, rel))
    dmap, dndcg = abs(out["mAP"] - ref[0]) / 100, abs(out["nDCG"] - ref[1]) / 100
    assert dmap < 1e-6 and dndcg < 1e-6, (out, ref)
    n_undef = int((~defined).sum())
    print(f"(b) mir {q} x {g} ({source} relevancy; relevancy>0: {100 * (rel > 0).mean():.1f}%, ==1 per query: "
          f"{(rel == 1).sum(1).mean():.1f}): ours {t_ours:.3f} s | official-style argsort "
          f"{t_off:.3f} s -> {t_off / t_ours:.1f}x faster (medians of {repeat}) | mAP {out['mAP']:.4f} nDCG "
          f"{out['nDCG']:.4f} | max |diff| (fraction) {max(dmap, dndcg):.1e} | {n_undef} queries "
          f"without a relevancy-1 item")
    return {"queries": q, "gallery": g, "relevancy": source, "ours_s": t_ours, "official_s": t_off,
            "speedup": t_off / t_ours, "repeats": repeat, "mAP": float(out["mAP"]), "nDCG": float(out["nDCG"]),
            "max_abs_diff": float(max(dmap, dndcg)), "queries_without_relevancy_1": n_undef}


def _embeddings(n, d, seed):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.normalize(x, dim=1)


def child_streaming(n, d, block, what):
    """Runs in a fresh process so ru_maxrss is this job's peak only."""
    torch.manual_seed(0)
    g = _embeddings(n, d, 1)
    q = torch.nn.functional.normalize(g + 1.5 * _embeddings(n, d, 0), dim=1)  # noisy copies
    pos = torch.arange(n)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    if what == "matmul":
        b = min(block, (1 << 25) // n)
        for start in range(0, n, b):
            s = q[start:start + b] @ g.t()
        out = {}
    else:
        out = streaming_retrieval(q, g, pos, block_size=block)
    sec = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": sec, "peak_mb": peak, "before_mb": base, "out": out}))


def bench_streaming(n, d, block):
    res = {}
    for what in ("matmul", "streaming"):
        cmd = [sys.executable, __file__, "--child", what, str(n), str(d), str(block)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        res[what] = json.loads(proc.stdout.strip().splitlines()[-1])
    m, s = res["matmul"], res["streaming"]
    print(f"(c) streaming {n} x {n}, {d}-d: ours {s['seconds']:.2f} s | bare block matmul "
          f"{m['seconds']:.2f} s -> ratio {s['seconds'] / m['seconds']:.2f} | peak RSS "
          f"{s['peak_mb']:.0f} MB (after building embeddings {s['before_mb']:.0f} MB; bare "
          f"matmul peak {m['peak_mb']:.0f} MB) | R@1 {s['out']['R@1']:.3f}")
    return {"n": n, "dim": d, "ours_s": s["seconds"], "matmul_s": m["seconds"], "ratio": s["seconds"] / m["seconds"],
            "peak_rss_mb": s["peak_mb"], "embeddings_mb": s["before_mb"], "matmul_peak_rss_mb": m["peak_mb"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=("a", "b", "c"), action="append")
    ap.add_argument("--epic-root", default=str(Path(__file__).resolve().parents[2] / "shared/data/epic100"),
                    help="EPIC-100 CSVs for the real relevancy in (b) (synthetic if absent)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--write", metavar="FILE.json",
                    help="also write the values as a result file the docs pages render (bench/resultfile.py)")
    args = ap.parse_args()
    if args.child:
        what, n, d, block = args.child
        child_streaming(int(n), int(d), int(block), what)
        return
    only = set(args.only or "abc")
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}, "
          f"load average {load:.1f}")
    result = {"load_average": load}
    if "a" in only:
        result["a"] = bench_retrieval(*((5000, 1000) if args.quick else (25000, 5000)), args.repeat)
    if "b" in only:
        result["b"] = bench_mir(*((2000, 800) if args.quick else (9668, 3842)), args.repeat, args.epic_root)
    if "c" in only:
        result["c"] = bench_streaming(*((10000, 64) if args.quick else (100000, 256)), 4096)
    if args.write:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import resultfile

        data = resultfile.provenance("bench/bench_metrics.py", None, "bench/bench_metrics.py --write (this file is its output)")
        resultfile.write_json(args.write, {**data, **result})


if __name__ == "__main__":
    main()
