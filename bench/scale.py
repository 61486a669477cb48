"""Millions of clips on one machine (issue 24): training memory and speed on memory-mapped
float16 features, and the approximate index kinds' build cost, recall and speed.

    .venv/bin/python bench/scale.py --videos 1000000 --root /tmp/xmodal_scale --threads 1

One run, on one seeded layout:

1. **Layout** (``ROOT/data``, reused when present): ``N`` clips of float16 features,
   512-d video / 384-d text, one caption per clip. Clips belong to ``N / 200`` topics
   (latent centres); a clip is its topic's centre plus noise, its video and text
   features are two noisy linear views of it (the caption a noisy view of its clip).
   ``val`` and ``test`` splits of 5,000 clips each from the same topics, and a gallery of
   ``N`` further clips (``ROOT/gallery_video_features.npy``, videos only).
2. **Train** ``xmodal train`` (linear 256-d heads, InfoNCE, Adam, batch 256, one epoch,
   ``test_time.normalizers [none, sinkhorn]``) as a child process: its peak anonymous
   memory (RssAnon + RssShmem of every process of its tree, sampled from
   ``/proc/PID/status`` every 20 ms; pages of the memory-mapped files are page cache and
   do not count) and clips/s over the epoch's steps (``metrics.json``'s ``train_time_s``),
   against a **bare loop** (a child process too: the same memory-mapped arrays, gather +
   upcast, the same head, loss, optimiser and batch; nothing else) measured in the same run.
3. **Index** ``xmodal index --video-features ROOT/gallery_video_features.npy --normalizer
   sinkhorn --kind K``: a gallery of ``N`` further clips of the same topics (no caption in
   training describes them, as for a new collection), for each kind: build time, peak
   anonymous memory and peak RSS (file pages included), the index file's size, the
   recall@10 and parameter written to ``meta.json``.
4. **Recall vs speed**: 2,000 ``test`` captions through the run's text head (queries the
   build never saw) searched in each index: recall@10 against the exact (flat) answer and
   queries/s, for a sweep of nprobe / efSearch and at the stored parameter, beside flat.
5. **Gallery bias in bare passes**: the Sinkhorn gallery-bias fit over the gallery's
   embeddings (blockwise, ``iters + 1`` passes) timed against one bare pass (read a block,
   one bank GEMM) over the same blocks.
6. **Defaults at scale** (issue 34; ``--only default,eval,peer``; the gallery has 2,000 captions of its own
   clips, ``gallery_text_features.npy`` / ``gallery_text_to_video.npy``): ``default``: ``xmodal index
   --kind ivf`` with its default (measured) normaliser against ``--normalizer none``, the gallery's
   captions queried in each (R@1 / R@10); ``eval``: ``xmodal eval --run`` of those captions against the
   whole gallery (text -> video only, by blocks), its peak anonymous memory; ``peer``: autofaiss's
   factory strings at 500k x 128 built with faiss directly against xmodal's ivf kinds on the same
   embeddings, recall@10 and queries/s per setting, bytes per vector. The index table also gives each
   folder's size and prints the curve each build stored in ``meta.json``.

``--ddp``: also train under ``torchrun --nproc_per_node 2`` (gloo) and report each rank's
peak anonymous memory against the single process's.

Timings are wall-clock on whatever else the machine runs: compare the ratios, which are
measured in the same run. Nothing here is asserted; ``tests/`` checks correctness.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DV, DT, LATENT = 512, 384, 64
#: Captions written for gallery clips (``gallery_text_features.npy``, ``gallery_text_to_video.npy``).
GALLERY_CAPTIONS = 2000


# ----------------------------------------------------------------------------- layout
def make_layout(root: Path, n: int, *, seed: int = 0, held: int = 5000, chunk: int = 65536,
                gallery: bool = True) -> dict:
    """Write the layout (streaming, ``chunk`` clips at a time); returns its sizes."""
    from numpy.lib.format import open_memmap

    root.mkdir(parents=True, exist_ok=True)
    done = root / ".complete"
    sizes = {"train": n, "val": held, "test": held, **({"gallery": n, "gallery_captions": GALLERY_CAPTIONS}
                                                        if gallery else {})}
    if done.is_file() and sizes.items() <= json.loads(done.read_text()).items():
        return sizes
    rng = np.random.default_rng(seed)
    topics = max(100, n // 200)
    centres = rng.standard_normal((topics, LATENT)).astype(np.float32)
    wv = (rng.standard_normal((LATENT, DV)) / np.sqrt(LATENT)).astype(np.float32)
    wt = (rng.standard_normal((LATENT, DT)) / np.sqrt(LATENT)).astype(np.float32)
    for split, count in ((k, v) for k, v in sizes.items() if k != "gallery_captions"):
        g = np.random.default_rng([seed, {"train": 1, "val": 2, "test": 3, "gallery": 4}[split]])
        # the gallery: videos only, outside the layout's splits (indexed with --video-features)
        path = (root.parent / "gallery_video_features.npy" if split == "gallery"
                else root / f"{split}_video_features.npy")
        video = open_memmap(path, "w+", np.float16, (count, DV))
        text = None if split == "gallery" else open_memmap(root / f"{split}_text_features.npy", "w+", np.float16,
                                                           (count, DT))
        # the gallery: captions of GALLERY_CAPTIONS evenly spaced clips (the queries of a t2v evaluation of
        # the whole gallery, issue 34), drawn from the same stream: the other files do not change
        every = max(1, count // GALLERY_CAPTIONS)
        described = np.arange(0, count, every)[:GALLERY_CAPTIONS] if split == "gallery" else None
        captions = None if described is None else np.empty((len(described), DT), np.float16)
        for start in range(0, count, chunk):
            m = min(count, start + chunk) - start
            z = centres[g.integers(topics, size=m)] + 0.6 * g.standard_normal((m, LATENT), dtype=np.float32)
            v = (z + 0.3 * g.standard_normal((m, LATENT), dtype=np.float32)) @ wv
            t = (z + 0.5 * g.standard_normal((m, LATENT), dtype=np.float32)) @ wt
            video[start:start + m] = v
            if text is not None:
                text[start:start + m] = t / np.linalg.norm(t, axis=1, keepdims=True)
            if captions is not None:
                inside = (described >= start) & (described < start + m)
                rows = described[inside] - start
                captions[inside] = t[rows] / np.linalg.norm(t[rows], axis=1, keepdims=True)
        video.flush()
        del video, text
        if split != "gallery":
            np.save(root / f"{split}_text_to_video.npy", np.arange(count, dtype=np.int32))
        else:
            np.save(root.parent / "gallery_text_features.npy", captions)
            np.save(root.parent / "gallery_text_to_video.npy", described.astype(np.int64))
    done.write_text(json.dumps(sizes))
    return sizes


# ----------------------------------------------------------------------------- memory of a process tree
def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("RssAnon", "RssShmem", "VmRSS"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return pids


class Sampler(threading.Thread):
    """Peak of RssAnon + RssShmem (and of VmRSS) summed over a process tree, and per process."""

    def __init__(self, pid: int, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_anon = self.peak_rss = 0
        self.per_pid: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            anon = rss = 0
            for p in _tree(self.pid):
                s = _status(p)
                a = s.get("RssAnon", 0) + s.get("RssShmem", 0)
                anon += a
                rss += s.get("VmRSS", 0)
                self.per_pid[p] = max(self.per_pid.get(p, 0), a)
                if p not in self.names:
                    try:
                        self.names[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:160].decode()
                    except OSError:
                        self.names[p] = "?"
            self.peak_anon, self.peak_rss = max(self.peak_anon, anon), max(self.peak_rss, rss)
            self._done.wait(self.every)

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_measured(cmd: list[str], *, env: dict | None = None, log: Path | None = None) -> dict:
    t0 = time.perf_counter()
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    sampler = Sampler(proc.pid)
    sampler.start()
    rc = proc.wait()
    sampler.stop()
    if log:
        out.close()
    if rc != 0:
        tail = log.read_text()[-3000:] if log else ""
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}):\n{tail}")
    return {"wall_s": time.perf_counter() - t0, "peak_anon": sampler.peak_anon, "peak_rss": sampler.peak_rss,
            "per_pid": {f"{p} {sampler.names.get(p, '?')}": v for p, v in sampler.per_pid.items()}}


def mb(x: float) -> str:
    return f"{x / 2**20:,.0f} MB"


# ----------------------------------------------------------------------------- training
#: The training recipe of the scale numbers (one source: the shipped config).
RECIPE = ROOT / "configs" / "scale" / "linear_1m.yaml"


def write_config(path: Path, data: Path, batch: int, epochs: int, workers: int, bank: int, dim: int | None = None) -> None:
    """:data:`RECIPE` with this run's layout and flags (CPU, no bars: the numbers are this machine's);
    ``dim``: the embedding size (``--dim``; default the recipe's)."""
    import yaml

    d = yaml.safe_load(RECIPE.read_text())
    d["data"]["root"] = str(data)
    d["test_time"]["bank_size"] = bank
    if dim is not None:
        d["model"]["dim"] = dim
    d["train"].update(epochs=epochs, batch_size=batch, workers=workers, progress=False, device="cpu")
    path.write_text(yaml.safe_dump(d, sort_keys=False))


def bare_loop(data: Path, batch: int, threads: int, seed: int = 0) -> None:
    """One epoch of the bare loop over the memory-mapped train split; prints JSON."""
    import torch

    from xmodal.config import load_config
    from xmodal.models import build_model
    from xmodal.training.parts import build_loss_from_config

    torch.set_num_threads(threads)
    video = np.load(data / "train_video_features.npy", mmap_mode="r")
    text = np.load(data / "train_text_features.npy", mmap_mode="r")
    cfg = load_config(data.parent / "train.yaml")
    torch.manual_seed(seed)
    model = build_model(video_dim=video.shape[1], text_dim=text.shape[1], kind="linear", dim=256)
    loss_fn = build_loss_from_config(cfg, video_dim=video.shape[1], text_dim=text.shape[1])
    params = [p for p in list(model.parameters()) + list(loss_fn.parameters()) if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-3)
    order = np.random.default_rng(seed).permutation(text.shape[0])
    steps = len(order) // batch
    t0 = time.perf_counter()
    for i in range(steps):
        rows = order[i * batch:(i + 1) * batch]
        t = torch.from_numpy(np.asarray(text[rows], dtype=np.float32))
        v = torch.from_numpy(np.asarray(video[rows], dtype=np.float32))  # clip i's caption is text i
        loss = loss_fn(model.forward_video(v), model.forward_text(t), ids=torch.as_tensor(rows))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        float(loss.detach())  # the trainer's one host sync per step
    seconds = time.perf_counter() - t0
    print(json.dumps({"steps": steps, "seconds": seconds, "clips_per_s": steps * batch / seconds}))


def train_section(work: Path, data: Path, args: argparse.Namespace, results: dict) -> Path:
    xmodal = str(Path(sys.executable).parent / "xmodal")
    write_config(work / "train.yaml", data, args.batch, 1, args.workers, args.bank, args.dim)
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    size = sum(p.stat().st_size for p in data.glob("train_*.npy"))
    size_all = sum(p.stat().st_size for p in data.glob("*.npy"))
    def bare_run(tag: str) -> dict:
        log = work / f"bare_{tag}.log"
        r = run_measured([sys.executable, __file__, "--bare-loop", str(data), "--batch", str(args.batch),
                          "--threads", str(args.threads)], log=log)
        r.update(json.loads(log.read_text().strip().splitlines()[-1]))
        return r

    before = bare_run("before")  # the bare loop before and after the trainer: the load drifts
    tr = run_measured([xmodal, "train", str(work / "train.yaml"), "--out", str(run_dir), "--threads",
                       str(args.threads), "--no-plots"], log=work / "train.log")
    after = bare_run("after")
    bare = dict(before, clips_per_s=(before["clips_per_s"] + after["clips_per_s"]) / 2,
                wall_s=(before["wall_s"] + after["wall_s"]) / 2, runs=[before["clips_per_s"], after["clips_per_s"]],
                peak_anon=max(before["peak_anon"], after["peak_anon"]), peak_rss=max(before["peak_rss"], after["peak_rss"]))
    summary = json.loads((run_dir / "metrics.json").read_text())
    steps = args.videos // args.batch
    tr["clips_per_s"] = steps * args.batch / summary["train_time_s"]
    tr["train_time_s"] = summary["train_time_s"]
    results["train"] = {"train_files_bytes": size, "layout_bytes": size_all, "trainer": tr, "bare": bare,
                        "speed_ratio": tr["clips_per_s"] / bare["clips_per_s"],
                        "val_t2v_R@1": summary["val"]["none"]["t2v"]["R@1"]}
    print(f"\n## Train ({args.videos:,} clips, batch {args.batch}, 1 epoch, --threads {args.threads}, "
          f"workers {args.workers})\n")
    print(f"layout: train files {mb(size)}, all splits {mb(size_all)} (float16)")
    print("| | peak RssAnon+RssShmem | peak RSS (incl. file pages) | clips/s | wall |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| xmodal train | {mb(tr['peak_anon'])} | {mb(tr['peak_rss'])} | {tr['clips_per_s']:,.0f} | "
          f"{tr['wall_s']:.0f} s |")
    print(f"| bare loop (mean of a run before and after) | {mb(bare['peak_anon'])} | {mb(bare['peak_rss'])} | "
          f"{bare['clips_per_s']:,.0f} ({bare['runs'][0]:,.0f}, {bare['runs'][1]:,.0f}) | {bare['wall_s']:.0f} s |")
    print(f"trainer / bare clips/s: {results['train']['speed_ratio']:.2f}; trainer peak anon / train files: "
          f"{tr['peak_anon'] / size:.2f}; val t2v R@1 (none) {results['train']['val_t2v_R@1']:.2f}")
    if args.ddp:
        ddp_dir = work / "run_ddp"
        shutil.rmtree(ddp_dir, ignore_errors=True)
        torchrun = str(Path(sys.executable).parent / "torchrun")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        dd = run_measured([torchrun, "--standalone", "--nproc_per_node", "2", xmodal, "train",
                           str(work / "train.yaml"), "--out", str(ddp_dir), "--threads", "1", "--no-plots"],
                          env=env, log=work / "ddp.log")
        ranks = {k: v for k, v in dd["per_pid"].items() if " train " in k and "torchrun" not in k}  # pid + cmdline
        import torch

        a = torch.load(run_dir / "model.pt", weights_only=True)["model"]["state_dict"]
        b = torch.load(ddp_dir / "model.pt", weights_only=True)["model"]["state_dict"]
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        results["ddp"] = {"rank_peaks": list(ranks.values()), "tree_peak": dd["peak_anon"],
                          "single_peak": tr["peak_anon"], "max_weight_diff": diff}
        print(f"\ntorchrun 2 ranks (gloo): per-rank peak anon {', '.join(mb(v) for v in ranks.values())} "
              f"vs single process {mb(tr['peak_anon'])} (ratio {max(ranks.values()) / tr['peak_anon']:.2f}); "
              f"whole tree incl. launcher {mb(dd['peak_anon'])}; max |weight difference| {diff:.2e}")
    return run_dir


# ----------------------------------------------------------------------------- index
def index_section(work: Path, data: Path, run_dir: Path, args: argparse.Namespace, results: dict) -> None:
    import torch

    from xmodal.retrieval.recall import recall_at_k
    from xmodal.retrieval.search import SearchIndex

    xmodal = str(Path(sys.executable).parent / "xmodal")
    torch.set_num_threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    rows = []
    built = {}
    for kind in args.kinds:
        out = work / f"idx_{args.normalizer}_{kind}"
        shutil.rmtree(out, ignore_errors=True)
        r = run_measured([xmodal, "index", "--run", str(run_dir), "--video-features",
                          str(work / "gallery_video_features.npy"), "--normalizer", args.normalizer, "--kind", kind,
                          "--out", str(out), "--threads", str(args.threads)], log=work / f"index_{kind}.log")
        meta = json.loads((out / "meta.json").read_text())
        r.update(meta=meta, file_bytes=(out / "index.faiss").stat().st_size,
                 folder_bytes=sum(p.stat().st_size for p in out.iterdir()))
        built[kind] = r
        rows.append(r)
    text = np.load(data / "test_text_features.npy", mmap_mode="r")
    q_rows = np.sort(np.random.default_rng(5).choice(text.shape[0], min(args.queries, text.shape[0]), replace=False))
    feats = np.asarray(text[q_rows], dtype=np.float32)
    sweeps = {}
    exact = None
    for kind in args.kinds:
        idx = SearchIndex(work / f"idx_{args.normalizer}_{kind}")
        emb = idx.model.encode_text(feats).numpy() - idx.shift[None, :]
        if exact is None:
            flat_dir = work / f"idx_{args.normalizer}_flat"
            ex = SearchIndex(flat_dir) if kind != "flat" and flat_dir.is_dir() else idx
            emb_ex = ex.model.encode_text(feats).numpy() - ex.shift[None, :]
            t0 = time.perf_counter()
            exact = ex.index.search(emb_ex, 10, **({"exact": True} if ex.index.kind != "ivfpq" else {}))[1]
            results.setdefault("flat_qps", len(feats) / (time.perf_counter() - t0))
        params = ([None] if kind == "flat" else
                  [{"ef_search": e} for e in (16, 32, 64, 128, 256, 512)] if kind == "hnsw" else
                  [{"nprobe": p} for p in (1, 4, 16, 32, 64, 128, 256)])
        stored = {"ef_search" if k == "efSearch" else k: v for k, v in idx.index.search_params.items()}
        if kind != "flat" and stored not in params:
            params.append(stored)
        sweep = []
        for p in params:
            kw = p or {}
            best = None
            for _ in range(args.repeats):  # best of a few: the machine is shared
                t0 = time.perf_counter()
                _, got = idx.index.search(emb, 10, **kw)
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
            sweep.append({"params": kw, "recall": recall_at_k(got, exact, 10), "qps": len(feats) / best,
                          "stored": kw == stored})
        sweeps[kind] = sweep
        del idx
    flat_qps = next(s["qps"] for s in sweeps.get("flat", [{"qps": results.get("flat_qps")}]))
    results["index"] = {k: {kk: v for kk, v in r.items() if kk != "per_pid"} for k, r in built.items()}
    results["sweeps"] = sweeps
    print(f"\n## Index ({args.videos:,}-video gallery of clips no caption in training describes, normaliser "
          f"{args.normalizer} folded in, --threads {args.threads})\n")
    print("| kind | factory | build | peak anon | peak RSS | index file | folder | anon / file | stored param | "
          "recall@10 in meta.json (queries) | recall@10 on test captions |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for kind, r in built.items():
        m = r["meta"]
        on_test = next((s["recall"] for s in sweeps[kind] if s["stored"] or kind == "flat"), None)
        param = ", ".join(f"{k} {v}" for k, v in m["search_params"].items()) or "-"
        missed = " (target missed)" if m.get("target_met") is False else ""
        print(f"| {kind} | {m['factory']} | {r['wall_s']:.0f} s | {mb(r['peak_anon'])} | {mb(r['peak_rss'])} | "
              f"{mb(r['file_bytes'])} | {mb(r['folder_bytes'])} | {r['peak_anon'] / r['file_bytes']:.2f} | "
              f"{param}{missed} | {m['recall_at_10']:.3f} ({m['recall_queries']}) | {on_test:.3f} |")
    print_curves(built)
    print(f"\n## Recall@10 vs queries/s ({len(feats)} test captions, batch search, best of {args.repeats})\n")
    print("| kind | setting | recall@10 | queries/s | x flat |")
    print("| --- | --- | ---: | ---: | ---: |")
    for kind, sweep in sweeps.items():
        for s in sweep:
            setting = ", ".join(f"{k} {v}" for k, v in s["params"].items()) or "exact"
            mark = " (stored)" if s["stored"] else ""
            print(f"| {kind} | {setting}{mark} | {s['recall']:.3f} | {s['qps']:,.0f} | {s['qps'] / flat_qps:.1f} |")


# ----------------------------------------------------------------------------- issue 34: defaults at 1M
def print_curves(built: dict) -> None:
    """The curve each approximate build measured and stored (meta.json "curve"), the kept setting marked."""
    print("\n## The settings each build measured (meta.json \"curve\", 1,000 held-out train captions)\n")
    print("| kind | cells | setting | recall@10 | queries/s (in the build) |")
    print("| --- | ---: | --- | ---: | ---: |")
    for kind, r in built.items():
        m = r["meta"]
        cells = m["factory"].split(",")[0].replace("IVF", "") if "IVF" in m["factory"] else "-"
        for point in m.get("curve") or []:
            name = "efSearch" if kind == "hnsw" else "nprobe"
            setting = "exact scan" if point.get("exact") else f"{name} {point.get(name)}"
            kept = " (kept)" if not point.get("exact") and {name: point.get(name)} == m["search_params"] else ""
            print(f"| {kind} | {cells} | {setting}{kept} | {point['recall_at_10']:.3f} | "
                  f"{point['queries_per_s']:,.0f} |")


def _gallery_queries(work: Path) -> tuple[np.ndarray, np.ndarray]:
    return (np.load(work / "gallery_text_features.npy").astype(np.float32), np.load(work / "gallery_text_to_video.npy"))


def sinkhorn_run(run_dir: Path, work: Path) -> tuple[Path, str]:
    """The run as issue 34's 1M run was: its record naming Sinkhorn as the normaliser it selected and an
    index folds. This synthetic layout's 5,000-video val split is easy (R@1 ~100 with or without a
    normaliser), so the paired rule keeps none there; the copy (``run_sinkhorn/model.pt``, the record
    edited, nothing else) asks what the default does with a run that chose Sinkhorn on val."""
    import torch

    ckpt = torch.load(run_dir / "model.pt", weights_only=True)
    tt = ckpt["model"]["test_time"]
    if tt.get("selection", {}).get("index_normalizer") == "sinkhorn":
        return run_dir, "the run's own record"
    tt["selected"] = "sinkhorn"
    tt["selection"] = dict(tt.get("selection") or {}, selected="sinkhorn", index_normalizer="sinkhorn",
                           index_note=None)
    out = work / "run_sinkhorn"
    out.mkdir(exist_ok=True)
    torch.save(ckpt, out / "model.pt")
    return out / "model.pt", "a copy of the run whose record names sinkhorn (the run itself kept none on val)"


def default_section(work: Path, data: Path, run_dir: Path, args: argparse.Namespace, results: dict) -> None:
    """The index's default normaliser against none on the whole gallery (issue 34.1): ``xmodal index --kind ivf``
    with the default (measured) normaliser, with ``--normalizer selected`` (the run's own choice: the old
    default) and with ``--normalizer none``; the gallery's 2,000 captions queried in each
    (``xmodal query --out``), R@1 / R@10 of their own videos."""
    xmodal = str(Path(sys.executable).parent / "xmodal")
    feats, t2v = _gallery_queries(work)
    np.save(work / "gallery_queries_f32.npy", feats)
    run, how = sinkhorn_run(run_dir, work)
    rows = {}
    for label, extra in (("default", []), ("selected", ["--normalizer", "selected"]), ("none", ["--normalizer", "none"])):
        out = work / f"idx_{label}_ivf"
        shutil.rmtree(out, ignore_errors=True)
        r = run_measured([xmodal, "index", "--run", str(run), "--video-features",
                          str(work / "gallery_video_features.npy"), "--kind", "ivf", "--out", str(out), "--threads",
                          str(args.threads), *extra], log=work / f"index_{label}.log")
        meta = json.loads((out / "meta.json").read_text())
        top = work / f"top_{label}.npy"
        run_measured([xmodal, "query", "--index", str(out), "--text-features", str(work / "gallery_queries_f32.npy"),
                      "--k", "10", "--out", str(top), "--threads", str(args.threads)], log=work / f"query_{label}.log")
        found = np.load(top)
        rank1 = found[:, 0] == t2v
        in10 = (found == t2v[:, None]).any(1)
        rows[label] = {"normalizer": meta["normalizer"], "choice": meta.get("normalizer_choice"),
                       "R@1": 100 * float(rank1.mean()), "R@10": 100 * float(in10.mean()), "build_s": r["wall_s"],
                       "peak_anon": r["peak_anon"], "search_params": meta["search_params"],
                       "recall_at_10": meta["recall_at_10"]}
    results["default_vs_none"] = dict(rows, run=how)
    d, n = rows["default"], rows["none"]
    print(f"\n## The index's default normaliser vs none ({args.videos:,}-video gallery, ivf, its "
          f"{len(t2v):,} captions as queries; run: {how})\n")
    print("| index | normaliser folded | build | t2v R@1 | t2v R@10 | stored recall@10 (setting) |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for label, r in rows.items():
        setting = ", ".join(f"{k} {v}" for k, v in r["search_params"].items())
        print(f"| {label} | {r['normalizer']} | {r['build_s']:.0f} s | {r['R@1']:.2f} | {r['R@10']:.2f} | "
              f"{r['recall_at_10']:.3f} ({setting}) |")
    choice = d["choice"] or {}
    print(f"\nthe default's measurement: {choice.get('why')}")
    if choice.get("bank_note"):
        print(f"note: {choice['bank_note']}")
    print(f"default R@1 - none R@1 = {d['R@1'] - n['R@1']:+.2f} (goal >= -0.5)")


def eval_section(work: Path, data: Path, run_dir: Path, args: argparse.Namespace, results: dict) -> None:
    """``xmodal eval --run`` on the whole gallery (issue 34.2): its 2,000 captions against every video, text ->
    video only (most videos have no caption), by blocks; peak anonymous memory of the process tree."""
    xmodal = str(Path(sys.executable).parent / "xmodal")
    rows = {}
    for name in ("none", "sinkhorn"):
        log = work / f"eval_{name}.log"
        r = run_measured([xmodal, "eval", "--run", str(run_dir), "--video-features",
                          str(work / "gallery_video_features.npy"), "--text-features",
                          str(work / "gallery_text_features.npy"), "--text-to-video",
                          str(work / "gallery_text_to_video.npy"), "--normalizer", name, "--json", "--threads",
                          str(args.threads)], log=log)
        text = log.read_text()
        out = json.loads(text[text.index("{"):])
        rows[name] = {"peak_anon": r["peak_anon"], "peak_rss": r["peak_rss"], "wall_s": r["wall_s"],
                      "R@1": out["t2v"]["R@1"], "R@10": out["t2v"]["R@10"], "scores": out["info"]["scores"],
                      "v2t": "v2t" in out}
    results["eval"] = rows
    dim = int(json.loads((work / "idx_none_ivf" / "meta.json").read_text())["dim"]) \
        if (work / "idx_none_ivf" / "meta.json").is_file() else args.dim
    emb = args.videos * dim * 4
    print(f"\n## eval --run on the whole gallery ({GALLERY_CAPTIONS:,} captions x {args.videos:,} videos, "
          f"float16 features, text -> video only)\n")
    print("| normaliser | peak anon (process tree) | peak RSS | wall | t2v R@1 | t2v R@10 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows.items():
        print(f"| {name} ({r['scores'].split('normaliser ')[-1].split(' ')[0]}) | {mb(r['peak_anon'])} | "
              f"{mb(r['peak_rss'])} | {r['wall_s']:.0f} s | {r['R@1']:.2f} | {r['R@10']:.2f} |")
    print(f"(the video embeddings alone: {mb(emb)}; goal: peak <= 1.5 GB)")


def peer_section(work: Path, data: Path, run_dir: Path, args: argparse.Namespace, results: dict) -> None:
    """The peer a user would otherwise pick (issue 34.4): autofaiss's choices at 500k x 128, built with faiss
    directly on the same embeddings (the first ``--peer-rows`` gallery videos, no normaliser), against
    xmodal's kinds built as ``xmodal index`` builds them (recall queries: the run's held-out train captions,
    target 0.95); every index searched with the gallery's captions (none of them seen by any build):
    recall@10 against exact search and queries/s, per setting, and bytes per vector."""
    import faiss
    import torch

    from xmodal.models import load_model
    from xmodal.retrieval.build import _recall_sample
    from xmodal.retrieval.index import BiasedIndex
    from xmodal.retrieval.recall import recall_at_k

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    model = load_model(run_dir)
    video = np.load(work / "gallery_video_features.npy", mmap_mode="r")
    n = min(args.peer_rows, video.shape[0])
    g = np.empty((n, model.dim), np.float32)
    for a in range(0, n, 16384):
        g[a:a + 16384] = model.encode_video(video[a:min(n, a + 16384)], batch_size=8192).numpy()
    q = model.encode_text(_gallery_queries(work)[0]).numpy()
    flat = faiss.IndexFlatIP(model.dim)
    flat.add(g)
    t0 = time.perf_counter()
    exact = flat.search(q, 10)[1]
    flat_qps = len(q) / (time.perf_counter() - t0)
    del flat

    def measure(search, settings) -> list[dict]:
        out = []
        for setting in settings:
            best = None
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                got = search(setting)
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
            out.append({"nprobe": setting, "recall": recall_at_k(got, exact, 10), "qps": len(q) / best})
        return out

    rows = []
    probes = (1, 2, 4, 8, 16, 32, 64)
    for factory in PEER_FACTORIES:
        t0 = time.perf_counter()
        index = faiss.index_factory(model.dim, factory, faiss.METRIC_INNER_PRODUCT)
        sample = g[np.sort(np.random.default_rng(0).choice(n, min(n, PEER_TRAIN_ROWS), replace=False))]
        index.train(sample)
        index.add(g)
        build = time.perf_counter() - t0
        ivf = faiss.extract_index_ivf(index)

        def search(p, index=index, ivf=ivf):
            ivf.nprobe = p
            return index.search(q, 10)[1]

        size = faiss.serialize_index(index).nbytes
        rows.append({"who": "autofaiss's choice (faiss)", "factory": factory, "build_s": build, "bytes": size / n,
                     "curve": measure(search, [p for p in probes if p <= ivf.nlist]), "kept": None})
        del index
    held, _ = _recall_sample(model, 1000, 0)
    for kind in ("ivf", "ivfpq", "ivfpqr"):
        t0 = time.perf_counter()
        index = BiasedIndex(g, kind=kind, queries=held)
        build = time.perf_counter() - t0
        kept = index.search_params["nprobe"]
        size = faiss.serialize_index(index.index).nbytes
        settings = sorted({p for p in probes if p <= index.nlist} | {kept})
        rows.append({"who": f"xmodal --kind {kind}", "factory": index.factory, "build_s": build, "bytes": size / n,
                     "curve": measure(lambda p, index=index: index.search(q, 10, nprobe=p)[1], settings),
                     "kept": kept, "nlist_choice": index.nlist_choice})
        del index
    results["peer"] = {"rows": n, "flat_qps": flat_qps, "indexes": rows}
    print(f"\n## Against the peer ({n:,} gallery videos x {model.dim}, no normaliser; {len(q):,} gallery captions; "
          f"--threads {args.threads}; flat {flat_qps:,.0f} queries/s)\n")
    print("| index | factory | bytes / vector | build | best recall@10 (nprobe) | fastest reaching 0.95: nprobe, "
          "recall@10, queries/s | kept by the build: recall@10, queries/s |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- |")
    for r in rows:
        top = max(r["curve"], key=lambda c: (c["recall"], -c["nprobe"]))
        reach = [c for c in r["curve"] if c["recall"] >= 0.95]
        fast = max(reach, key=lambda c: c["qps"]) if reach else None
        kept = next((c for c in r["curve"] if c["nprobe"] == r["kept"]), None)
        print(f"| {r['who']} | {r['factory']} | {r['bytes']:.0f} | {r['build_s']:.0f} s | {top['recall']:.3f} "
              f"({top['nprobe']}) | " + (f"{fast['nprobe']}, {fast['recall']:.3f}, {fast['qps']:,.0f}" if fast else "-")
              + " | " + (f"{kept['recall']:.3f} at nprobe {kept['nprobe']}, {kept['qps']:,.0f}" if kept else "-") + " |")
    print("\ncurves (nprobe: recall@10 / queries/s):")
    for r in rows:
        print(f"- {r['who']} {r['factory']}: " + "; ".join(f"{c['nprobe']}: {c['recall']:.3f} / {c['qps']:,.0f}"
                                                         for c in r["curve"]))


#: autofaiss's choices at 500k x 128 (issue 34): compressed to 32 bytes, and full precision.
PEER_FACTORIES = ("OPQ32_160,IVF2048_HNSW32,PQ32x8", "IVF2048,Flat")
#: Rows the peer indexes are trained on (a seeded sample of the gallery).
PEER_TRAIN_ROWS = 50_000


def bias_section(work: Path, data: Path, run_dir: Path, args: argparse.Namespace, results: dict) -> None:
    """The Sinkhorn gallery-bias fit against bare passes over the same gallery blocks."""
    import torch

    from xmodal.models import load_model
    from xmodal.normalize._base import default_block_rows
    from xmodal.retrieval.index import gallery_bias
    from xmodal.retrieval.rowstore import RowStore

    torch.set_num_threads(args.threads)
    model = load_model(run_dir)
    video = np.load(work / "gallery_video_features.npy", mmap_mode="r")
    store = RowStore(video.shape[0], model.dim, directory=work)
    try:
        for start in range(0, video.shape[0], 16384):
            store.append(model.encode_video(video[start:start + 16384], batch_size=8192))
        tt = model.test_time
        bank = tt.banks["train"][0].float()
        t0 = time.perf_counter()
        gallery_bias("sinkhorn", store, bank, **tt._hp())
        fit = time.perf_counter() - t0
        cols = default_block_rows(bank.shape[0])
        t0 = time.perf_counter()
        for start in range(0, store.num_rows, cols):  # one bare pass: read a block, one bank GEMM
            (bank @ store[start:start + cols].T).amax()
        bare = time.perf_counter() - t0
    finally:
        store.close()
    iters = tt.hparams.get("iters", 4)
    results["bias"] = {"fit_s": fit, "bare_pass_s": bare, "passes": fit / bare, "iters": iters,
                       "bank": int(bank.shape[0])}
    print(f"\n## Gallery bias (Sinkhorn, bank {bank.shape[0]}, {iters} iterations, {store.num_rows:,} videos)\n")
    print(f"fit {fit:.1f} s = {fit / bare:.1f} bare passes (one bare pass: read the block, bank GEMM, "
          f"{bare:.1f} s); {iters + 1} passes expected")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--videos", type=int, default=200_000, help="clips in the train split (the gallery)")
    p.add_argument("--root", default="/tmp/xmodal_scale", help="work folder (layout, runs, indexes)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch / faiss threads (1: on a shared machine, OpenMP threads that wait for a busy "
                        "core make a step 10x slower)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=0, help="train.workers of the trainer")
    p.add_argument("--bank", type=int, default=2000, help="test_time.bank_size (Sinkhorn bank, recall queries)")
    p.add_argument("--kinds", default="flat,ivf,ivfpq,ivfpqr,hnsw")
    p.add_argument("--dim", type=int, default=256, help="the linear heads' output size (issue 34's 1M run: 128)")
    p.add_argument("--peer-rows", type=int, default=500_000, help="gallery videos of the peer comparison")
    p.add_argument("--queries", type=int, default=2000, help="test captions searched for recall / queries/s")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--normalizer", default="sinkhorn", help="folded into the indexes (sinkhorn: the bias of "
                   "issue 24's measurements; selected / none / dn)")
    p.add_argument("--only", default="train,index,bias", help="sections to run (also: default, eval, peer)")
    p.add_argument("--ddp", action="store_true", help="also train under torchrun with 2 ranks (gloo)")
    p.add_argument("--json", default=None, help="also write the numbers here")
    p.add_argument("--clean", action="store_true", help="delete the work folder at the end")
    p.add_argument("--bare-loop", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.bare_loop:
        bare_loop(Path(args.bare_loop), args.batch, args.threads)
        return 0
    args.kinds = [k for k in args.kinds.split(",") if k]
    work = Path(args.root) / f"n{args.videos}"
    data = work / "data"
    t0 = time.perf_counter()
    only = set(args.only.split(","))
    sizes = make_layout(data, args.videos, gallery=bool(only & {"index", "bias", "default", "eval", "peer"}))
    print(f"layout {data}: {sizes} ({time.perf_counter() - t0:.0f} s)")
    results: dict = {"videos": args.videos, "threads": args.threads, "batch": args.batch}
    run_dir = work / "run"
    write_config(work / "train.yaml", data, args.batch, 1, args.workers, args.bank, args.dim)
    if "train" in only:
        run_dir = train_section(work, data, args, results)
    if "index" in only:
        index_section(work, data, run_dir, args, results)
    if "bias" in only:
        bias_section(work, data, run_dir, args, results)
    if "default" in only:
        default_section(work, data, run_dir, args, results)
    if "eval" in only:
        eval_section(work, data, run_dir, args, results)
    if "peer" in only:
        peer_section(work, data, run_dir, args, results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.clean:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
