# Two commands set up everything on a fresh machine (Python >= 3.10 with venv):
#   make demo   -- main job on the embedded synthetic dataset (train, normalise, evaluate, table)
#   make test   -- the whole test suite
#   make bench  -- installs the bench-only references, then runs every bench in its quick mode
#   make docs   -- builds the documentation site into site/ (mkdocs build --strict)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench docs venv clean peer-env

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU wheel pinned first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,faiss,encoders,clip,serve,serve-test,tensorboard,video,onnx,mlflow,mlflow-ui,wandb,docs,cluster]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/xmodal demo

test: $(STAMP)
	$(BIN)/python -m pytest tests

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,faiss,encoders,clip,serve,serve-test,tensorboard,video,onnx,mlflow,mlflow-ui,wandb,docs,cluster,bench]'
	# open_clip_torch without its dependencies: its torchvision requirement would replace torch.
	$(BIN)/pip install --quiet --no-deps open_clip_torch
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/bench_metrics.py --quick
	$(BIN)/python bench/bench_losses.py --rounds 3 --iters 2 --threads 1
	$(BIN)/python bench/bench_normalize.py --quick --repeats 1
	$(BIN)/python bench/bench_gpu.py --quick

# bench/ann_peer.py's peer: autofaiss in its own environment (never in .venv: it pins numpy < 2).
# faiss-cpu 1.13.2: the newest whose Python wrappers take the keyword arguments autofaiss 2.18.0 passes
# (1.14 and 1.15 refuse faiss.OPQMatrix(d, M=..., d2=...)); both index files are searched under the project's FAISS.
PEER_VENV ?= .peer-venv
PEER_STAMP := $(PEER_VENV)/.installed
PEER_PINS := autofaiss==2.18.0 faiss-cpu==1.13.2 numpy==1.26.4 pandas==2.2.3 pyarrow==18.1.0
$(PEER_STAMP):
	$(PY) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install --quiet $(PEER_PINS)
	touch $(PEER_STAMP)

peer-env: $(PEER_STAMP)

clean:
	rm -rf $(VENV) $(PEER_VENV) runs site .pytest_cache .hypothesis
