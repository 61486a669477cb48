"""Test-time similarity normalisers (one interface: ``fit`` on banks, ``__call__``
on a similarity block, ``uses_test_queries``, ``state_dict``/``from_state_dict``).

| key | class | statistics used |
|---|---|---|
| ``none`` | :class:`Identity` | none |
| ``dn`` | :class:`DistributionNormalization` | sample means of queries / gallery |
| ``sinkhorn`` | :class:`SinkhornBias` | query bank (train, or test = oracle) |
| ``qbnorm`` | :class:`QBNorm` | query bank |
| ``is`` | :class:`InvertedSoftmax` | query bank |
| ``dsl`` | :class:`DualSoftmax` | the test queries (or a bank) |

Row-independent normalisers stream through
``xmodal.metrics.streaming_retrieval(..., **normalizer.streaming_kwargs())``;
DN and Sinkhorn are per-gallery biases, which :class:`xmodal.retrieval.index.BiasedIndex`
also folds into a FAISS index.
"""

from __future__ import annotations

from typing import Any

from xmodal._validate import choice
from xmodal.normalize._base import Identity, Normalizer
from xmodal.normalize.dn import DistributionNormalization
from xmodal.normalize.dsl import DualSoftmax
from xmodal.normalize.qbnorm import InvertedSoftmax, QBNorm
from xmodal.normalize.sinkhorn import SinkhornBias, blockwise_log_sinkhorn

__all__ = ["NORMALIZERS", "build_normalizer", "normalizer_from_state_dict", "Normalizer",
           "Identity", "DistributionNormalization", "SinkhornBias", "QBNorm",
           "InvertedSoftmax", "DualSoftmax", "blockwise_log_sinkhorn"]

NORMALIZERS: dict[str, type[Normalizer]] = {
    "none": Identity,
    "dn": DistributionNormalization,
    "sinkhorn": SinkhornBias,
    "qbnorm": QBNorm,
    "is": InvertedSoftmax,
    "dsl": DualSoftmax,
}


def build_normalizer(name: str, **kwargs: Any) -> Normalizer:
    """Construct the normaliser registered under ``name`` (see :data:`NORMALIZERS`)."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a string, got {type(name).__name__}")
    choice(name.lower(), "name", tuple(NORMALIZERS))
    return NORMALIZERS[name.lower()](**kwargs)


def normalizer_from_state_dict(state: dict[str, Any]) -> Normalizer:
    """Rebuild any normaliser from its :meth:`Normalizer.state_dict` (checkpoints)."""
    if not isinstance(state, dict) or "name" not in state:
        raise TypeError("state: expected a dict written by Normalizer.state_dict()")
    choice(state["name"], "state['name']", tuple(NORMALIZERS))
    return NORMALIZERS[state["name"]].from_state_dict(state)
