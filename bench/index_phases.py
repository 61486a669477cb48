"""Peak RssAnon of an ``xmodal index`` build, per phase (issue 43 item 7): the build runs in this process,
its own progress lines and BiasedIndex's steps (exact top-10, cell-count choice, adding, tuning) mark the
phases, and a thread samples ``/proc/self/status`` every 20 ms.

    PYTHONPATH=src python bench/index_phases.py RUN GALLERY_VIDEO.npy OUT_DIR ivf none

Prints each progress line with the time and RssAnon when it was printed, then the peak of every phase.
"""
import sys, threading, time, json
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024
phase = ["start"]; peaks = {}; order = []
stop = threading.Event()
def sample():
    while not stop.is_set():
        a = anon(); p = phase[0]
        peaks[p] = max(peaks.get(p, 0), a)
        stop.wait(0.02)
threading.Thread(target=sample, daemon=True).start()
import faiss, torch
faiss.omp_set_num_threads(1); torch.set_num_threads(1)
from xmodal.models import load_model
from xmodal.retrieval import build
import numpy as np
run, feats, out, kind, norm = sys.argv[1:6]
t0 = time.time()
def log(line):
    phase[0] = f"{len(order):02d} {line[:90]}"; order.append(phase[0])
    print(f"{time.time()-t0:7.1f}s anon {anon()/2**20:7.0f} MB  {line}", flush=True)
log("import + load model")
model = load_model(run)
v = np.load(feats, mmap_mode="r")
# BiasedIndex's own phases, marked by wrapping its methods
from xmodal.retrieval import index as ix
for name in ("_exact", "_choose_nlist", "_tune"):
    f = getattr(ix.BiasedIndex, name)
    def wrap(*a, _f=f, _n=name, **k):
        log(f"BiasedIndex.{_n}"); r = _f(*a, **k); log(f"after BiasedIndex.{_n}"); return r
    setattr(ix.BiasedIndex, name, wrap)
f = ix._add_presized
def add(*a, **k):
    log("_add_presized"); r = f(*a, **k); log("after _add_presized"); return r
ix._add_presized = add
build.write_index(run, v, out, normalizer=norm, kind=kind, overwrite=True, model=model, log=log)
log("done")
stop.set(); time.sleep(0.05)
for p in order:
    print(f"peak {peaks.get(p, 0)/2**20:7.0f} MB  {p}")
