"""Applying a trained run: embeddings and metrics of a split (:mod:`~xmodal.retrieval.evaluate`), the
stored test-time normalisers (:mod:`~xmodal.retrieval.testtime`), the choice among them
(:mod:`~xmodal.retrieval.selection`), per-query results and protocol cards (:mod:`~xmodal.retrieval.perquery`),
FAISS indexes (:mod:`~xmodal.retrieval.index`), and index folders: how one is made
(:mod:`~xmodal.retrieval.build`) and how it is searched (:mod:`~xmodal.retrieval.search`).

May import: metrics, normalize, models, data, ``xmodal._validate`` and ``xmodal.runs``; never training,
reporting or the CLI.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "embed_split": "evaluate", "retrieval_metrics": "evaluate", "evaluate": "evaluate",
    "evaluate_normalizers": "evaluate", "group_metrics": "evaluate", "score": "evaluate",
    "TestTime": "testtime", "fit_test_time": "testtime", "fit_normalizer": "testtime",
    "BiasedIndex": "index", "SearchIndex": "search", "write_index": "build",
    "fold_run_normalizer": "index", "selected_normalizer": "index",
    "query_results": "evaluate", "protocol_card": "perquery", "read_per_query": "perquery_read",
    "write_per_query": "perquery", "select_normalizer": "selection",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"xmodal.retrieval.{_EXPORTS[name]}"), name)
    if name in ("evaluate", "testtime", "index", "build", "search", "perquery", "selection", "recall", "rowstore"):
        return importlib.import_module(f"xmodal.retrieval.{name}")
    raise AttributeError(f"module 'xmodal.retrieval' has no attribute {name!r}")
