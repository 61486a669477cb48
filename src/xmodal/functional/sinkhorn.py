"""Log-domain Sinkhorn-Knopp scaling (NCL, Park et al. EMNLP 2022, eqs. 7-9).

Given scores ``S`` ``[K, N]`` and a temperature ``gamma``, find positive vectors
``alpha`` ``[K]`` and ``beta`` ``[N]`` such that the plan
``P = diag(alpha) exp(S / gamma) diag(beta)`` has row sums ``r`` and column sums
``c`` (uniform ``1/K`` and ``1/N`` unless given). Everything is done on
logarithms (``logsumexp``), so scores of any magnitude divided by a small
``gamma`` never overflow, unlike the plain ``exp`` iteration.
"""

from __future__ import annotations

import math

import torch

from xmodal._validate import as_tensor, check_finite, float_matrix, positive_number, short_repr

__all__ = ["log_sinkhorn", "sinkhorn_plan"]


def _log_marginal(m: torch.Tensor | None, size: int, name: str, like: torch.Tensor) -> torch.Tensor:
    """Log of a marginal normalised to sum 1 (uniform when ``m`` is None)."""
    if m is None:
        return torch.full((size,), -math.log(size), dtype=like.dtype, device=like.device)
    t = as_tensor(m, name)
    if not t.is_floating_point():
        t = t.to(torch.float64)
    t = t.to(dtype=like.dtype, device=like.device)
    if t.ndim != 1 or t.shape[0] != size:
        raise ValueError(f"{name}: expected shape ({size},), got {tuple(t.shape)}")
    check_finite(t, name)
    if bool((t < 0).any()) or float(t.sum()) <= 0:
        raise ValueError(f"{name}: must be non-negative with a positive sum")
    return torch.log(t / t.sum())


def log_sinkhorn(scores: torch.Tensor, *, gamma: float, iters: int,
                 row_marginal: torch.Tensor | None = None,
                 col_marginal: torch.Tensor | None = None, track_errors: bool = True,
                 ) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Sinkhorn-Knopp scaling of ``M = exp(scores / gamma)`` in the log domain.

    Each iteration first rescales the rows, then the columns (NCL eqs. 8-9; eq. 7: ``P = diag(alpha) M diag(beta)``):
    ``log alpha = log r - logsumexp_j(S_ij / gamma + log beta_j)`` and
    ``log beta = log c - logsumexp_i(S_ij / gamma + log alpha_i)``. After an
    iteration the column marginals are exact; the row marginals converge. The
    row-then-column order is our reading (NCL gives only the fixed point, eqs. 7-9; its
    Fig. 4 code is not in the extracted text); with few iterations it changes the result.
    The operations are differentiable (callers such as NCL detach the result).
    Zero entries in a marginal give ``-inf`` log scalings for that row/column.

    Args:
        scores: similarity matrix ``[K, N]`` (queries x gallery).
        gamma: temperature (> 0); the kernel is ``exp(scores / gamma)``.
        iters: number of row+column iterations (>= 1).
        row_marginal: target row sums ``[K]`` (normalised to sum 1); default uniform.
        col_marginal: target column sums ``[N]`` (normalised to sum 1); default uniform.
        track_errors: record the marginal error of every iteration.

    Returns:
        ``(log_alpha [K], log_beta [N], marginal_errors)`` where
        ``marginal_errors[t]`` is ``max_i |P 1 - r|_i`` after iteration ``t`` (a list
        of ``iters`` floats; the column sums are exact after each iteration up to
        rounding, so this is the largest marginal error), or ``[]`` when
        ``track_errors=False`` (saves one ``logsumexp`` per iteration). Half-precision
        scores are processed (and returned) in float32; other dtypes are kept.

    Shape:
        scores ``[K, N]`` -> ``[K]``, ``[N]``.

    Raises:
        ValueError: bad shapes, NaN/inf, a non-positive ``gamma``, ``iters < 1`` or negative
            marginals (``TypeError`` for a wrong type).
    """
    s = float_matrix(scores, "scores")
    gamma = positive_number(gamma, "gamma")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters: must be an integer >= 1, got {short_repr(iters)}")
    if s.dtype in (torch.float16, torch.bfloat16):
        s = s.float()
    k, n = s.shape
    log_r = _log_marginal(row_marginal, k, "row_marginal", s)
    log_c = _log_marginal(col_marginal, n, "col_marginal", s)
    log_m = s / gamma
    log_beta = torch.zeros(n, dtype=s.dtype, device=s.device)
    errors = []
    for _ in range(iters):
        log_alpha = log_r - torch.logsumexp(log_m + log_beta[None, :], dim=1)
        log_beta = log_c - torch.logsumexp(log_m + log_alpha[:, None], dim=0)
        if track_errors:
            with torch.no_grad():  # columns are exact after the column update: rows only
                log_rows = log_alpha + torch.logsumexp(log_m + log_beta[None, :], dim=1)
                errors.append((log_rows.exp() - log_r.exp()).abs().max())
    return log_alpha, log_beta, torch.stack(errors).tolist() if errors else []


def sinkhorn_plan(scores: torch.Tensor, *, gamma: float, iters: int,
                  row_marginal: torch.Tensor | None = None,
                  col_marginal: torch.Tensor | None = None) -> torch.Tensor:
    """The scaled plan ``P = diag(alpha) exp(scores / gamma) diag(beta)`` ``[K, N]``.

    A convenience wrapper around :func:`log_sinkhorn`, computed as
    ``exp(log_alpha_i + S_ij / gamma + log_beta_j)`` so it never overflows.
    """
    log_alpha, log_beta, _ = log_sinkhorn(scores, gamma=gamma, iters=iters,
                                          row_marginal=row_marginal, col_marginal=col_marginal)
    s = as_tensor(scores, "scores").to(device=log_alpha.device, dtype=log_alpha.dtype)  # numpy in: as log_sinkhorn
    return torch.exp(log_alpha[:, None] + s / gamma + log_beta[None, :])
