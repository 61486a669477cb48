"""Dual softmax (DSL; Cheng et al., "Improving Video-Text Retrieval by Multi-Stream
Corpus Alignment and Dual Softmax Loss" (CAMoE), 2021, eq. 9 at inference)."""

from __future__ import annotations

from typing import Any

import torch

from xmodal._validate import flag, positive_number
from xmodal.normalize._base import (Normalizer, check_pair, check_scores, default_block_rows,
                                    like_input, matrix_blocks, optional_block_size, score_blocks, to_work)
from xmodal.normalize.qbnorm import bank_column_logsumexp


class DualSoftmax(Normalizer):
    """DSL: ``sim' = sim * softmax_over_queries(sim / temperature)`` (dim 0).

    The prior ``softmax`` is taken over the test queries (the columns of the
    full ``[Q, N]`` matrix), so DSL uses the test queries' statistics
    (``uses_test_queries = True``) and is not row-independent: call it on the
    full similarity matrix, or first :meth:`fit` the test queries (``oracle=True``)
    so blocks can be streamed with the fitted column normalisers. With
    ``oracle=False`` a :meth:`fit` bank of other queries (e.g. train captions)
    plus the query itself replaces the test queries in the softmax
    (``sim_qj * exp(s_qj / T) / (exp(s_qj / T) + sum_b exp(s_bj / T))``; as in the
    oracle, where each query is part of its own column), a deployable variant
    whose prior stays in ``[0, 1]``. The softmax is computed as
    ``exp(sim / T - logsumexp)``, never overflowing.

    Args:
        temperature: softmax temperature (CAMoE uses 1 / 100 on cosine scores).
        oracle: True when the statistics are the test queries' own.
        block_size: bank rows per block in :meth:`fit`.
    """

    name = "dsl"

    def __init__(self, temperature: float = 0.01, oracle: bool = True,
                 block_size: int | None = None) -> None:
        self.temperature = positive_number(temperature, "temperature")
        self.oracle = flag(oracle, "oracle")
        self.block_size = optional_block_size(block_size)
        self._lse: torch.Tensor | None = None

    @property
    def row_independent(self) -> bool:  # type: ignore[override]
        return self._lse is not None

    def hparams(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "oracle": self.oracle, "block_size": self.block_size}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {} if self._lse is None else {"lse": self._lse}

    def fit(self, query_bank: Any, gallery: Any) -> "DualSoftmax":
        """Column normalisers ``logsumexp_b(s_bj / T)`` ``[N]`` of a query bank
        (the test queries when ``oracle``).  Shape: ``[K, D]``, ``[N, D]``."""
        q, g = check_pair(query_bank, gallery)
        rows = default_block_rows(g.shape[0], self.block_size)
        self._lse, _ = bank_column_logsumexp(score_blocks(q, g, rows), 1.0 / self.temperature)
        return self

    def fit_scores(self, bank_sim: Any) -> "DualSoftmax":
        """As :meth:`fit` from precomputed bank similarities ``[K, N]``."""
        _, n = check_scores(bank_sim, "bank_sim")
        rows = default_block_rows(n, self.block_size)
        self._lse, _ = bank_column_logsumexp(matrix_blocks(bank_sim, rows, "bank_sim"),
                                             1.0 / self.temperature)
        return self

    def __call__(self, sim: Any) -> Any:
        """Shape: ``sim`` ``[Q, N]`` -> ``[Q, N]`` (a new array). Unfitted, the
        column softmax runs over the rows of ``sim`` itself (pass all test queries)."""
        s = to_work(sim, "sim")
        logits = s / self.temperature
        if self._lse is None:
            if not self.oracle:
                raise ValueError("DualSoftmax(oracle=False): call fit(query_bank, gallery) first")
            lse = torch.logsumexp(logits, dim=0, keepdim=True)
        else:
            if s.shape[1] != self._lse.shape[0]:
                raise ValueError(f"sim: has {s.shape[1]} columns but the bank was fitted on "
                                 f"{self._lse.shape[0]} gallery items")
            lse = self._lse.to(s.device, s.dtype)[None, :]
            if not self.oracle:  # the query itself joins the bank in its column's softmax
                lse = torch.logaddexp(lse, logits)
        return like_input(s * torch.exp(logits - lse), sim)

    def streaming_kwargs(self) -> dict[str, Any]:
        if self._lse is None:
            raise ValueError("DualSoftmax: fit the test queries (or a bank) before streaming")
        return {"transform": self}
