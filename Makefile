# Two commands set up everything on a fresh machine (Python >= 3.10 with venv):
#   make demo   -- main job on the embedded synthetic dataset (train, normalise, evaluate, table)
#   make test   -- the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU wheel pinned first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,faiss,encoders]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/xmodal demo

test: $(STAMP)
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
