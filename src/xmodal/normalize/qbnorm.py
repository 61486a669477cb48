"""Inverted softmax (Smith et al., ICLR 2017, sec. 3.2 / eq. 4) and QB-Norm's
dynamic inverted softmax (Bogolin et al., "Cross Modal Retrieval with Querybank
Normalisation", CVPR 2022, eq. 4 and sec. 3.2), in the log domain."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from xmodal._validate import choice, flag, positive_number
from xmodal.normalize._base import (Normalizer, check_pair, check_scores, default_block_rows,
                                    like_input, matrix_blocks, optional_block_size, positive_int, score_blocks,
                                    to_work)


def bank_column_logsumexp(blocks: Iterable[tuple[int, int, torch.Tensor]], beta: float,
                          topk: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log sum_b exp(beta * s_bj)`` ``[N]`` over the bank's ``[b, N]`` score blocks;
    with ``topk > 0`` also the boolean ``[N]`` mask of items in some bank query's top-k.

    The first block is shifted by its column maxima; later blocks by the running
    ``logsumexp`` itself (``>= beta * max`` so far), which saves the column-max pass:
    ``lse += log1p(sum_b exp(beta * s_bj - lse_j))``. A block whose values exceed the
    running value by more than the float range (a non-finite column sum) is redone
    with its own column maxima; entries that underflow lie ``> 87`` (float32) below a
    term already in the sum, so they are below its rounding.
    """
    lse = active = buf = ones = None
    for _, _, s in blocks:
        if lse is None:
            lse = torch.full((s.shape[1],), float("-inf"), dtype=s.dtype, device=s.device)
            active = torch.zeros(s.shape[1], dtype=torch.bool, device=s.device) if topk else None
        if buf is None or buf.shape != s.shape:
            buf = torch.empty_like(s)  # scratch reused across blocks (``s`` may be the caller's)
            ones = torch.ones(s.shape[0], dtype=s.dtype, device=s.device)
        if topk == 1:  # before ``buf`` is written: ``s`` may share nothing with it
            active[s.max(dim=1).indices] = True       # first maximal index, as argmax
        elif topk:
            active[s.topk(min(topk, s.shape[1]), dim=1).indices.reshape(-1)] = True
        if bool(torch.isfinite(lse).all()):
            torch.add(-lse, s, alpha=beta, out=buf)
            # column sums as a BLAS matrix-vector product: several times faster than sum(dim=0)
            rel = ones @ buf.exp_()
            if bool(torch.isfinite(rel).all()):
                lse = lse + torch.log1p(rel)
                continue
        m = s.amax(dim=0) * beta
        torch.add(-m, s, alpha=beta, out=buf)
        lse = torch.logaddexp(lse, (ones @ buf.exp_()).log_() + m)
    return lse, active


class InvertedSoftmax(Normalizer):
    """IS: ``exp(beta * s_qj) / sum_{b in bank} exp(beta * s_bj)`` (Smith et al. eq. 4).

    Computed in the log domain (no ``exp(beta * s)`` overflow), with three outputs
    of the same ranking (``output=``):

    - ``"similarity"`` (default): ``log(score) / beta = s_qj + bias_j`` with
      ``bias_j = -logsumexp_b(beta * s_bj) / beta``, in similarity units, so
      temperatures and :func:`xmodal.metrics.normalization_error` keep their
      meaning. IS is thus a per-gallery bias (:attr:`bias`), which streams and
      folds into :class:`xmodal.retrieval.index.BiasedIndex`.
    - ``"log"``: ``log(score) = beta * s_qj - logsumexp_b(beta * s_bj)``.
    - ``"ratio"``: the paper's score itself (``exp`` of the log; finite whenever it is).

    Args:
        beta: inverse temperature (QB-Norm default 20).
        output: ``"similarity"``, ``"log"`` or ``"ratio"``.
        block_size: bank rows per block in :meth:`fit` (auto when None).
        oracle: True when the bank is the test queries (``uses_test_queries``).
    """

    name = "is"

    def __init__(self, beta: float = 20.0, output: str = "similarity",
                 block_size: int | None = None, oracle: bool = False) -> None:
        self.oracle = flag(oracle, "oracle")
        self.beta = positive_number(beta, "beta")
        self.output = choice(output, "output", ("similarity", "log", "ratio"))
        self.block_size = optional_block_size(block_size)
        self._lse: torch.Tensor | None = None
        self._active: torch.Tensor | None = None

    def hparams(self) -> dict[str, Any]:
        return {"beta": self.beta, "output": self.output, "block_size": self.block_size,
                "oracle": self.oracle}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {} if self._lse is None else {"lse": self._lse}

    def fit(self, query_bank: Any, gallery: Any) -> "InvertedSoftmax":
        """Column log-normalisers of the bank.  Shape: ``[K, D]``, ``[N, D]``."""
        q, g = check_pair(query_bank, gallery)
        rows = default_block_rows(g.shape[0], self.block_size)
        self._lse, self._active = bank_column_logsumexp(score_blocks(q, g, rows), self.beta,
                                                        topk=self._topk())
        return self

    def fit_scores(self, bank_sim: Any) -> "InvertedSoftmax":
        """Fit from precomputed bank similarities ``[K, N]`` (numpy, memmap or tensor),
        read block by block (the QB-Norm authors' train-test similarity files)."""
        _, n = check_scores(bank_sim, "bank_sim")
        rows = default_block_rows(n, self.block_size)
        self._lse, self._active = bank_column_logsumexp(matrix_blocks(bank_sim, rows, "bank_sim"),
                                                        self.beta, topk=self._topk())
        return self

    def _topk(self) -> int:
        return 0

    def _normalised(self, s: torch.Tensor) -> torch.Tensor:
        if self._lse is None:
            raise ValueError(f"{type(self).__name__}: call fit(query_bank, gallery) first")
        if s.shape[1] != self._lse.shape[0]:
            raise ValueError(f"sim: has {s.shape[1]} columns but the bank was fitted on "
                             f"{self._lse.shape[0]} gallery items")
        lse = self._lse.to(s.device, s.dtype)[None, :]
        if self.output == "similarity":
            return s - lse / self.beta
        log_scores = self.beta * s - lse
        return log_scores if self.output == "log" else log_scores.exp_()

    @property
    def bias(self) -> torch.Tensor:
        """``[N]`` gallery bias ``-logsumexp_b(beta * s_bj) / beta`` (similarity units)."""
        if self._lse is None:
            raise ValueError(f"{type(self).__name__}: call fit(query_bank, gallery) first")
        return -self._lse / self.beta

    def __call__(self, sim: Any) -> Any:
        """Shape: ``sim`` ``[Q, N]`` -> ``[Q, N]`` (a new array)."""
        s = to_work(sim, "sim")
        return like_input(self._normalised(s), sim)

    def streaming_kwargs(self) -> dict[str, Any]:
        return {"bias": self.bias} if self.output == "similarity" else {"transform": self}


class QBNorm(InvertedSoftmax):
    """QB-Norm with the dynamic inverted softmax (Bogolin et al. CVPR 2022).

    Activation set ``A`` = gallery items that are among the top-``k`` of at least
    one bank query. A test query whose own top-1 gallery item is in ``A`` gets the
    inverted-softmax row (as :class:`InvertedSoftmax`, log domain by default);
    any other query keeps its raw similarities (eq. 4). This is per QUERY, as in
    the authors' ``dynamic_inverted_softmax.py``; each row depends only on itself,
    so it streams. Ties for the top-1 take the lowest index. With the default
    ``output="similarity"`` normalised rows are ``s + bias`` in similarity units,
    the same units as the raw rows kept by the other queries.

    Args:
        k: top-k of each bank query defining the activation set (default 1).
        beta: inverse temperature (default 20).
        output, block_size, oracle: as :class:`InvertedSoftmax`.
    """

    name = "qbnorm"

    def __init__(self, k: int = 1, beta: float = 20.0, output: str = "similarity",
                 block_size: int | None = None, oracle: bool = False) -> None:
        super().__init__(beta=beta, output=output, block_size=block_size, oracle=oracle)
        self.k = positive_int(k, "k")

    def hparams(self) -> dict[str, Any]:
        return {"k": self.k, **super().hparams()}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {} if self._lse is None else {"lse": self._lse, "active": self._active}

    def _topk(self) -> int:
        return self.k

    @property
    def activation_set(self) -> torch.Tensor:
        """Boolean ``[N]`` mask of the gallery items in ``A``."""
        if self._active is None:
            raise ValueError("QBNorm: call fit(query_bank, gallery) first")
        return self._active

    def __call__(self, sim: Any) -> Any:
        """Shape: ``sim`` ``[Q, N]`` -> ``[Q, N]`` (a new array)."""
        s = to_work(sim, "sim")
        normalised = self._normalised(s)
        raw = ~self._active.to(s.device)[s.argmax(dim=1)]
        normalised[raw] = s[raw]  # ``normalised`` is a new tensor: safe to edit
        return like_input(normalised, sim)

    @property
    def bias(self) -> torch.Tensor:
        raise AttributeError("QBNorm is not a per-gallery bias (its activation is per query)")

    def streaming_kwargs(self) -> dict[str, Any]:
        return {"transform": self}
