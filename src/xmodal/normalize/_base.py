"""Shared pieces of the test-time normalisers: the common interface, input/output
conversion (numpy in -> numpy out, tensor in -> tensor out on the same device),
block iteration over a bank and (de)serialisation."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import numpy as np
import torch

from xmodal._validate import as_tensor, check_finite, short_repr

# Elements of one [rows, N] score block; bounds the working memory of every bank pass.
BLOCK_ELEMENTS = 1 << 22


def to_work(x: Any, name: str, *, ndim: int = 2) -> torch.Tensor:
    """A finite float tensor (float32, or float64 when the input is float64).

    Finiteness is screened with one ``sum`` (NaN/inf make it non-finite) and only
    then checked element-wise, to name the count; large blocks stay one cheap pass.
    """
    t = as_tensor(x, name)
    if t.dtype == torch.bool:
        raise TypeError(f"{name}: expected floating values, got bool")
    t = t if t.dtype == torch.float64 else t.to(torch.float32)
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name}: empty input, shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t.sum())):
        check_finite(t, name)
    return t


def positive_int(v: Any, name: str, *, maximum: int | None = None) -> int:
    """A positive integer (bools, non-integral and non-numeric values rejected), at most ``maximum``."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer, float, np.floating)):
        raise TypeError(f"{name}: expected a positive integer, got {short_repr(v)}")
    if isinstance(v, (float, np.floating)) and not math.isfinite(v) or int(v) != v or v < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {short_repr(v)}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name}: must be at most {maximum}, got {short_repr(v)}")
    return int(v)


def like_input(t: torch.Tensor, ref: Any) -> Any:
    """Return ``t`` as the caller's container type: numpy for numpy input, else a
    tensor on ``ref``'s device with ``ref``'s floating dtype."""
    if isinstance(ref, torch.Tensor):
        dtype = ref.dtype if ref.is_floating_point() else t.dtype
        return t.to(device=ref.device, dtype=dtype)
    arr = t.detach().cpu().numpy()
    ref_dtype = getattr(ref, "dtype", None)
    if ref_dtype is not None and np.issubdtype(ref_dtype, np.floating):
        arr = arr.astype(ref_dtype, copy=False)
    return arr


def optional_block_size(v: Any) -> int | None:
    """``block_size`` of a normaliser: None (automatic) or a positive integer."""
    return None if v is None else positive_int(v, "block_size")


def default_block_rows(num_columns: int, block_rows: int | None = None) -> int:
    if block_rows is not None:
        return positive_int(block_rows, "block_size")
    return max(1, BLOCK_ELEMENTS // max(1, num_columns))


def score_blocks(query_bank: torch.Tensor, gallery: torch.Tensor,
                 block_rows: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Yield ``(start, stop, query_bank[start:stop] @ gallery.T)`` block by block,
    so a [K, N] bank score matrix is never held in memory at once."""
    for start in range(0, query_bank.shape[0], block_rows):
        stop = min(start + block_rows, query_bank.shape[0])
        yield start, stop, query_bank[start:stop] @ gallery.T


def matrix_blocks(scores: Any, block_rows: int, name: str = "scores"
                  ) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Yield row blocks of a precomputed score matrix (numpy, memmap or tensor)
    as finite float tensors, converting one block at a time."""
    for start in range(0, scores.shape[0], block_rows):
        stop = min(start + block_rows, scores.shape[0])
        block = scores[start:stop]
        if isinstance(block, np.ndarray) and not block.flags.writeable:
            block = np.array(block)  # one block copied: torch warns on read-only memory
        yield start, stop, to_work(block, name)


def check_scores(scores: Any, name: str = "scores") -> tuple[int, int]:
    """Shape of a precomputed ``[K, N]`` score matrix (validated block by block later)."""
    if not isinstance(scores, (np.ndarray, torch.Tensor)):
        raise TypeError(f"{name}: expected a numpy array or torch tensor, got {type(scores).__name__}")
    if scores.ndim != 2 or scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty [K, N] matrix, got shape {tuple(scores.shape)}")
    return int(scores.shape[0]), int(scores.shape[1])


def check_pair(query_bank: Any, gallery: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a (bank, gallery) pair of embedding matrices with one dimension."""
    q = to_work(query_bank, "query_bank")
    g = to_work(gallery, "gallery")
    if q.shape[1] != g.shape[1]:
        raise ValueError(f"query_bank and gallery: embedding sizes differ "
                         f"({q.shape[1]} vs {g.shape[1]})")
    dtype = torch.promote_types(q.dtype, g.dtype)
    return q.to(dtype), g.to(device=q.device, dtype=dtype)


class Normalizer:
    """Interface of every test-time normaliser.

    ``fit(query_bank, gallery)`` reads bank statistics (embeddings ``[K, D]`` and
    ``[N, D]``); ``__call__(sim)`` maps a similarity block ``[Q, N]`` to a new
    block (the input is never modified). ``uses_test_queries`` says whether the
    statistics come from the test queries themselves (an oracle, not a
    deployable setting). ``row_independent`` says whether each output row depends
    only on its own input row, so the normaliser can be applied block by block as
    ``transform=`` of :func:`xmodal.metrics.streaming_retrieval`.
    """

    name: str = ""
    oracle: bool = False
    row_independent: bool = True

    @property
    def uses_test_queries(self) -> bool:
        """True when the fitted statistics come from the test queries (``oracle``)."""
        return self.oracle

    def fit(self, query_bank: Any, gallery: Any) -> "Normalizer":
        return self

    def __call__(self, sim: Any) -> Any:
        raise NotImplementedError

    # -- serialisation ---------------------------------------------------------
    def hparams(self) -> dict[str, Any]:
        return {}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """``{"name", "hparams", "tensors"}`` (tensors detached, on CPU) for checkpoints."""
        return {"name": self.name, "hparams": dict(self.hparams()),
                "tensors": {k: v.detach().cpu().clone() for k, v in self.tensors().items()}}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "Normalizer":
        if not isinstance(state, dict) or "hparams" not in state:
            raise TypeError("state: expected a dict written by state_dict()")
        if state.get("name", cls.name) != cls.name:
            raise ValueError(f"state: written by normaliser {state.get('name')!r}, not {cls.name!r}")
        obj = cls(**state["hparams"])
        obj._load_tensors({k: as_tensor(v, f"state[{k!r}]") for k, v in state.get("tensors", {}).items()})
        return obj

    def _load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        for key, value in tensors.items():
            setattr(self, "_" + key, value)

    def streaming_kwargs(self) -> dict[str, Callable | torch.Tensor]:
        """Keyword arguments for :func:`xmodal.metrics.streaming_retrieval`."""
        if not self.row_independent:
            raise ValueError(f"{self.name}: not row-independent; apply it to the full matrix")
        return {"transform": self}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hparams().items())
        return f"{type(self).__name__}({args})"


class Identity(Normalizer):
    """No normalisation: returns a copy of ``sim``."""

    name = "none"

    def __call__(self, sim: Any) -> Any:
        s = to_work(sim, "sim")
        return like_input(s.clone(), sim)

    def streaming_kwargs(self) -> dict[str, Any]:
        return {}
