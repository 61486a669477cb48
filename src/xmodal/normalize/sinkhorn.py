"""NCL test-time gallery biases from a blockwise log-domain Sinkhorn (Park et al.,
"Normalized Contrastive Learning for Text-Video Cross-Modal Retrieval", EMNLP
2022, sec. 3.3: the Sinkhorn-Knopp scaling of eqs. 7-9, the video bias of eq. 11 (eq. 10
for texts), the biased score of eq. 12 and its normalisation property, eq. 13; Fig. 4)."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

from xmodal._validate import as_tensor, check_finite, flag, positive_number, short_repr
from xmodal.normalize._base import (Normalizer, check_pair, check_scores, default_block_rows,
                                    like_input, matrix_blocks, optional_block_size, positive_int,
                                    score_blocks, to_work)

#: Upper bound on Sinkhorn iterations (NCL uses 4).
MAX_ITERS = 10_000

Blocks = Callable[[], Iterable[tuple[int, int, torch.Tensor]]]


def _log_marginal(m: Any, size: int, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if m is None:
        return torch.full((size,), -math.log(size), dtype=dtype, device=device)
    t = as_tensor(m, name)
    t = (t if t.is_floating_point() else t.to(torch.float64)).to(dtype=torch.float64, device=device)
    if t.ndim != 1 or t.shape[0] != size:
        raise ValueError(f"{name}: expected shape ({size},), got {tuple(t.shape)}")
    check_finite(t, name)
    if bool((t < 0).any()) or float(t.sum()) <= 0:
        raise ValueError(f"{name}: must be non-negative with a positive sum")
    return torch.log(t / t.sum()).to(dtype)


def blockwise_log_sinkhorn(blocks: Blocks, num_rows: int, num_cols: int, *, gamma: float,
                           iters: int, log_r: torch.Tensor, log_c: torch.Tensor,
                           track_error: bool = True) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Log-domain Sinkhorn on ``M = exp(S / gamma)`` reading ``S`` in row blocks.

    Same iteration as :func:`xmodal.functional.sinkhorn.log_sinkhorn` (rows, then
    columns; ``log beta`` starts at 0), fused into ONE pass and ONE ``exp`` over
    ``S`` per iteration. For a block, ``E_ij = exp(S_ij / gamma + log beta_j - m_i)``
    with ``m_i`` the row maximum gives the row ``logsumexp`` (``m_i + log sum_j E_ij``,
    hence the new ``log alpha_i``), and the plan's column sums follow from the same
    buffer by a matrix-vector product: ``sum_i P_ij = sum_i E_ij r_i / sum_j' E_ij'``.
    Columns whose sum falls where float underflow could bias it (below
    ``tiny * K / eps``, e.g. at tiny ``gamma`` in the first iteration) are recomputed
    exactly with a blockwise ``logsumexp``. Memory is ``O(block * N + K + N)``.

    Args:
        blocks: a callable returning a fresh iterator of ``(start, stop, S[start:stop])``.
        num_rows, num_cols: ``K`` and ``N``.
        gamma: temperature; iters: iterations (>= 1).
        log_r, log_c: log marginals ``[K]`` / ``[N]`` (each summing to 1).
        track_error: compute the marginal error of the LAST iteration too (one extra
            pass over ``S``); errors of earlier iterations come for free.

    Returns:
        ``(log_alpha [K], log_beta [N], errors)``, ``errors[t] = max(max_i |P 1 - r|_i,
        max_j |P^T 1 - c|_j)`` after iteration ``t`` (``iters`` values, or
        ``iters - 1`` without ``track_error``).

    Raises:
        TypeError, ValueError: naming the argument, for a ``blocks`` that is not callable,
            sizes or ``iters`` that are not positive integers, a non-positive ``gamma``, or
            log marginals that are not floating tensors of shape ``[K]`` / ``[N]`` on one device.
            Only types and shapes are checked (no pass over the values).
    """
    num_rows, num_cols, gamma, iters, track_error = _check_sinkhorn_args(
        blocks, num_rows, num_cols, gamma, iters, log_r, log_c, track_error)
    dtype, device = log_c.dtype, log_c.device
    inv_gamma = 1.0 / gamma
    finfo = torch.finfo(dtype)
    risky_below = finfo.tiny * num_rows / finfo.eps
    log_alpha = torch.zeros(num_rows, dtype=dtype, device=device)
    log_beta = torch.zeros(num_cols, dtype=dtype, device=device)
    r, c = log_r.exp(), log_c.exp()
    ones = torch.ones(num_cols, dtype=dtype, device=device)
    errors: list[float] = []
    col_err = None
    for it in range(iters + (1 if track_error else 0)):
        last = it == iters  # the extra pass only measures the final row marginals
        col_sum = torch.zeros(num_cols, dtype=dtype, device=device)
        row_err = torch.zeros((), dtype=dtype, device=device)
        for start, stop, s in blocks():
            buf = torch.add(log_beta[None, :], s.to(device=device, dtype=dtype), alpha=inv_gamma)
            m = buf.amax(dim=1, keepdim=True)
            # row sums as a BLAS matrix-vector product: several times faster than sum(dim=1)
            log_row_sum = (buf.sub_(m).exp_() @ ones).log_()
            row_lse = m.squeeze(1) + log_row_sum
            if it > 0:  # row marginals of the previous iterate, before updating it
                row_err = torch.maximum(row_err, (torch.exp(log_alpha[start:stop] + row_lse)
                                                  - r[start:stop]).abs().max())
            if last:
                continue
            log_alpha[start:stop] = log_r[start:stop] - row_lse
            col_sum += torch.exp(log_r[start:stop] - log_row_sum) @ buf
        if it > 0:
            errors.append(float(torch.maximum(row_err, col_err)))
        if last:
            break
        col_lse = torch.log(col_sum) - log_beta
        risky = (col_sum < risky_below) & (c > 0)
        if bool(risky.any()):
            col_lse[risky] = _exact_column_lse(blocks, risky, log_alpha, inv_gamma)
        log_beta = torch.where(c > 0, log_c - col_lse, torch.full_like(col_lse, float("-inf")))
        col_err = (torch.exp(log_beta + col_lse) - c).nan_to_num(0.0).abs().max()
    return log_alpha, log_beta, errors


def _check_sinkhorn_args(blocks: Any, num_rows: Any, num_cols: Any, gamma: Any, iters: Any, log_r: Any,
                         log_c: Any, track_error: Any) -> tuple[int, int, float, int, bool]:
    """The arguments of :func:`blockwise_log_sinkhorn` checked by type and shape only."""
    if not callable(blocks):
        raise TypeError(f"blocks: expected a callable returning (start, stop, block) triples, "
                        f"got {short_repr(blocks)}")
    num_rows, num_cols = positive_int(num_rows, "num_rows"), positive_int(num_cols, "num_cols")
    gamma = positive_number(gamma, "gamma")
    iters = positive_int(iters, "iters", maximum=MAX_ITERS)
    for t, name, size in ((log_r, "log_r", num_rows), (log_c, "log_c", num_cols)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating tensor of log marginals, got {short_repr(t)}")
        if tuple(t.shape) != (size,):
            raise ValueError(f"{name}: expected shape ({size},), got {tuple(t.shape)}")
    if log_r.device != log_c.device:
        raise ValueError(f"log_r and log_c: on different devices ({log_r.device} vs {log_c.device})")
    return num_rows, num_cols, gamma, iters, flag(track_error, "track_error")


def _exact_column_lse(blocks: Blocks, columns: torch.Tensor, log_alpha: torch.Tensor,
                      inv_gamma: float) -> torch.Tensor:
    """``logsumexp_i(S_ij / gamma + log alpha_i)`` for the masked columns, block by block."""
    idx = columns.nonzero().squeeze(1)
    acc = torch.full((idx.numel(),), float("-inf"), dtype=log_alpha.dtype, device=log_alpha.device)
    for start, stop, s in blocks():
        sub = s.to(log_alpha.device, log_alpha.dtype)[:, idx] * inv_gamma + log_alpha[start:stop, None]
        acc = torch.logaddexp(acc, torch.logsumexp(sub, dim=0))
    return acc


def gallery_block_log_sinkhorn(query_bank: torch.Tensor, gallery: torch.Tensor, *, gamma: float,
                                iters: int, log_r: torch.Tensor, log_c: torch.Tensor,
                                block_cols: int, track_error: bool = True,
                                ) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """The iteration of :func:`blockwise_log_sinkhorn` from embeddings, reading ``S`` in
    GALLERY (column) blocks ``S[:, J] = query_bank @ gallery[J].T``.

    Same iterates (rows, then columns; ``log beta`` starts at 0), same errors, in
    ``iters + 1`` passes over ``S`` WITH the last iteration's error: pass 0 gives the
    first ``log alpha`` (a streamed row ``logsumexp``); pass ``t`` computes, per column
    block, the exact column ``logsumexp`` (``E = exp(X - max_i X)``, ``X = S / gamma +
    log alpha``) hence ``log beta_J``, and from the same buffer the row sums of the new
    plan, ``sum_j P_ij = sum_j E_ij c_j / sum_i' E_i'j``: iteration ``t``'s row marginal
    error and the next ``log alpha`` with no extra pass (the row-block form needs one
    more pass for the last error). Rows whose plan mass falls where float underflow
    could bias it (below ``tiny * N / eps``) get an exact blockwise row ``logsumexp``.
    Each GEMM is ``[K, D] x [D, block_cols]``: the bank stays in cache instead of the
    whole gallery being streamed once per row block. From iteration 2 on, while
    ``log alpha`` moved by less than 30 (float32; 300 float64) across rows, each column is
    shifted by a bound on its maximum (previous column ``logsumexp`` + largest move of
    ``log alpha``), and ``log alpha`` and the shift enter the GEMM as two extra columns,
    so a pass is GEMM, one in-place ``exp`` and two matrix-vector products.
    Memory ``O(K * block_cols + K + N)``.

    Shape:
        query_bank ``[K, D]``, gallery ``[N, D]``, log marginals ``[K]`` / ``[N]`` ->
        ``(log_alpha [K], log_beta [N], errors)`` as :func:`blockwise_log_sinkhorn`.
    """
    dtype, device = log_c.dtype, log_c.device
    k, n = query_bank.shape[0], gallery.shape[0]
    qs = query_bank * (1.0 / gamma)
    finfo = torch.finfo(dtype)
    risky_below = finfo.tiny * n / finfo.eps
    r, c = log_r.exp(), log_c.exp()
    live = log_r > float("-inf")        # (r > 0 would miss masses below float32's range)
    ones = torch.ones(k, dtype=dtype, device=device)

    def blocks():
        for start in range(0, n, block_cols):
            stop = min(n, start + block_cols)
            yield start, stop, qs @ gallery[start:stop].T        # S[:, J] / gamma

    def fused_blocks(q_aug, shift):   # S[:, J] / gamma + log alpha_i - shift_j from one GEMM
        for start in range(0, n, block_cols):
            stop = min(n, start + block_cols)
            g_aug = torch.cat([gallery[start:stop], torch.ones(stop - start, 1, dtype=dtype, device=device),
                               -shift[start:stop, None]], 1)
            yield start, stop, q_aug @ g_aug.T

    # pass 0: log alpha_1 = log r - logsumexp_j(S_ij / gamma), streamed over column blocks
    run_max = run_sum = None
    for _, _, x in blocks():
        bm = x.amax(dim=1)
        if run_max is None:
            run_max, run_sum = bm, torch.zeros(k, dtype=dtype, device=device)
        else:
            bm = torch.maximum(run_max, bm)
            run_sum = run_sum * torch.exp(run_max - bm)
            run_max = bm
        # row sums as a BLAS matrix-vector product: several times faster than sum(dim=1)
        run_sum = run_sum + x.sub_(run_max[:, None]).exp_() @ torch.ones(x.shape[1], dtype=dtype, device=device)
    log_alpha = log_r - (run_max + run_sum.log())
    log_beta = torch.zeros(n, dtype=dtype, device=device)
    errors: list[float] = []
    col_lse_all = prev_alpha = None
    spread_limit = 30.0 if finfo.bits <= 32 else 300.0
    for it in range(1, iters + 1):
        measure = track_error or it < iters   # the last row sums only measure the error
        row_mass = torch.zeros(k, dtype=dtype, device=device)
        col_err = torch.zeros((), dtype=dtype, device=device)
        fused = False
        if prev_alpha is not None and bool(live.any()):
            # shift each column by a bound on its maximum, from the previous column logsumexp:
            # max_i X_ij <= col_lse_prev_j + max_i (log alpha_i - log alpha_prev_i); then the
            # shift and log alpha enter the GEMM as two extra columns: one exp pass, no
            # max / add / sub passes. Only while that bound is tight (small spread).
            step = (log_alpha - prev_alpha)[live]
            spread = float(step.max() - step.min())
            fused = spread <= spread_limit
            if fused:
                top = step.max()
                la = torch.where(live, log_alpha, torch.full_like(log_alpha, finfo.min / 8))
                q_aug = torch.cat([qs, la[:, None], torch.ones(k, 1, dtype=dtype, device=device)], 1)
                slack = math.exp(min(spread + math.log(k), 80.0))
        for start, stop, x in (fused_blocks(q_aug, col_lse_all + top) if fused else blocks()):
            if fused:
                col_sum = ones @ x.exp_()
                col_lse = (col_lse_all[start:stop] + top) + col_sum.log()
            else:
                x.add_(log_alpha[:, None])
                cm = x.amax(dim=0)
                col_sum = ones @ x.sub_(cm[None, :]).exp_()   # >= 1: no underflow
                col_lse = cm + col_sum.log()
            if col_lse_all is None:
                col_lse_all = torch.empty(n, dtype=dtype, device=device)
            col_lse_all[start:stop] = col_lse
            cj = c[start:stop]
            log_beta[start:stop] = torch.where(cj > 0, log_c[start:stop] - col_lse,
                                               torch.full_like(col_lse, float("-inf")))
            col_err = torch.maximum(col_err, (torch.exp(log_beta[start:stop] + col_lse) - cj)
                                    .nan_to_num(0.0).abs().max())
            if measure:   # row sums of the plan with the new log beta: E_ij c_j / col_sum_j
                row_mass += x @ (cj / col_sum)
        if not measure:
            break
        row_lse = row_mass.log() - log_alpha
        # entries lost to underflow sum to < tiny (x slack when the shift exceeds the max)
        risky = (row_mass < risky_below * (slack if fused else 1.0)) & live
        if bool(risky.any()):
            row_lse[risky] = _exact_row_lse(blocks, risky, qs, gallery, log_beta, block_cols)
        row_err = (torch.exp(log_alpha + row_lse) - r).nan_to_num(0.0).abs().max()
        errors.append(float(torch.maximum(row_err, col_err)))
        if it < iters:
            prev_alpha = log_alpha
            log_alpha = torch.where(live, log_r - row_lse, torch.full_like(row_lse, float("-inf")))
    return log_alpha, log_beta, errors


def _exact_row_lse(blocks: Blocks, rows: torch.Tensor, qs: torch.Tensor, gallery: torch.Tensor,
                   log_beta: torch.Tensor, block_cols: int) -> torch.Tensor:
    """``logsumexp_j(S_ij / gamma + log beta_j)`` for the masked rows, block by block."""
    idx = rows.nonzero().squeeze(1)
    sub_q = qs[idx]
    acc = torch.full((idx.numel(),), float("-inf"), dtype=qs.dtype, device=qs.device)
    for start in range(0, gallery.shape[0], block_cols):
        stop = min(gallery.shape[0], start + block_cols)
        x = sub_q @ gallery[start:stop].T + log_beta[None, start:stop]
        acc = torch.logaddexp(acc, torch.logsumexp(x, dim=1))
    return acc


class SinkhornBias(Normalizer):
    """NCL test-time normalisation: gallery biases from Sinkhorn on a query bank.

    For a ``[K, N]`` pseudo-similarity ``S`` between ``K`` bank queries and the
    ``N`` gallery items, scale ``M = exp(S / gamma)`` so that ``diag(alpha) M
    diag(beta)`` (eq. 7) has row sums ``r`` (uniform, eq. 8) and column sums ``c``
    (uniform, eq. 9, or e.g. proportional to each item's number of matching captions),
    and add ``b_j = gamma * log(beta_j / sum(beta))`` (eq. 11) to every query's scores. The
    softmax retrieval probabilities of the biased scores are eq. 13 of NCL; with
    the test queries as the bank and ``K = N`` uniform they sum to 1 per item.

    The bank can be train queries (``losses.NCL.query_bank()``), any stored
    queries, or the test queries themselves (``oracle=True``: flagged, since it
    uses test statistics). Everything runs block by block in the log domain:
    stable for ``gamma`` down to 0.005 and ``K, N`` up to 10^5 without a dense
    ``K x N`` matrix. ``history`` holds the marginal error per iteration.
    Zero-mass marginal entries give a ``-inf`` bias (the item is never retrieved).

    Args:
        temperature: ``gamma`` (the model's test temperature).
        iters: Sinkhorn iterations (NCL: 4; at most ``MAX_ITERS`` = 10000).
        oracle: True when the bank is the test queries.
        block_size: bank rows per block, or gallery items per block when :meth:`fit`
            reads ``S`` in gallery blocks (``K <= N``); auto when None.
        track_error: also measure the last iteration's error (one more pass).

    Examples:
        >>> import torch; _ = torch.manual_seed(0)
        >>> unit = lambda x: torch.nn.functional.normalize(x, dim=1)
        >>> bank, gallery = unit(torch.randn(64, 8)), unit(torch.randn(5, 8))
        >>> sb = SinkhornBias(temperature=0.05).fit(bank, gallery)
        >>> sim = bank[:3] @ gallery.T
        >>> tuple(sb.bias.shape), torch.allclose(sb(sim), sim + sb.bias[None, :])
        ((5,), True)
    """

    name = "sinkhorn"

    def __init__(self, temperature: float = 0.05, iters: int = 4, oracle: bool = False,
                 block_size: int | None = None, track_error: bool = True) -> None:
        self.temperature = positive_number(temperature, "temperature")
        # NCL uses 4; the marginal error is ~1e-6 within a few hundred iterations, and an
        # unbounded count (1e9) would run for days with no output.
        iters = positive_int(iters, "iters", maximum=MAX_ITERS)
        self.iters, self.oracle = iters, flag(oracle, "oracle")
        self.block_size = optional_block_size(block_size)
        self.track_error = flag(track_error, "track_error")
        self.history: list[float] = []
        self._bias: torch.Tensor | None = None
        self._log_alpha: torch.Tensor | None = None
        self._log_beta: torch.Tensor | None = None

    def hparams(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "iters": self.iters, "oracle": self.oracle,
                "block_size": self.block_size, "track_error": self.track_error}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {} if self._bias is None else {"bias": self._bias, "log_beta": self._log_beta}

    def _run(self, blocks: Blocks, k: int, n: int, dtype: torch.dtype, device: torch.device,
             query_marginal: Any, gallery_marginal: Any) -> "SinkhornBias":
        log_r = _log_marginal(query_marginal, k, "query_marginal", dtype, device)
        log_c = _log_marginal(gallery_marginal, n, "gallery_marginal", dtype, device)
        self._log_alpha, self._log_beta, self.history = blockwise_log_sinkhorn(
            blocks, k, n, gamma=self.temperature, iters=self.iters, log_r=log_r, log_c=log_c,
            track_error=self.track_error)
        self._bias = self.temperature * (self._log_beta - torch.logsumexp(self._log_beta, dim=0))
        return self

    def fit(self, query_bank: Any, gallery: Any, *, query_marginal: Any = None,
            gallery_marginal: Any = None) -> "SinkhornBias":
        """Fit on ``S = query_bank @ gallery.T``, computed block by block: in gallery
        (column) blocks of ``block_size`` items when ``K <= N``
        (:func:`gallery_block_log_sinkhorn`: ``iters + 1`` passes including the last
        error), else in bank row blocks (:func:`blockwise_log_sinkhorn`).

        Shape:
            query_bank ``[K, D]``, gallery ``[N, D]``, marginals ``[K]`` / ``[N]``.
        """
        q, g = check_pair(query_bank, gallery)
        k, n = q.shape[0], g.shape[0]
        if k <= n:   # gallery-scale: column blocks, the last error without an extra pass
            log_r = _log_marginal(query_marginal, k, "query_marginal", q.dtype, q.device)
            log_c = _log_marginal(gallery_marginal, n, "gallery_marginal", q.dtype, q.device)
            cols = default_block_rows(k, self.block_size)
            self._log_alpha, self._log_beta, self.history = gallery_block_log_sinkhorn(
                q, g, gamma=self.temperature, iters=self.iters, log_r=log_r, log_c=log_c,
                block_cols=cols, track_error=self.track_error)
            self._bias = self.temperature * (self._log_beta - torch.logsumexp(self._log_beta, dim=0))
            return self
        rows = default_block_rows(n, self.block_size)
        return self._run(lambda: score_blocks(q, g, rows), k, n, q.dtype,
                         q.device, query_marginal, gallery_marginal)

    def fit_scores(self, scores: Any, *, query_marginal: Any = None,
                   gallery_marginal: Any = None) -> "SinkhornBias":
        """Fit on a precomputed pseudo-similarity ``[K, N]`` (numpy, memmap or tensor)."""
        k, n = check_scores(scores)
        rows = default_block_rows(n, self.block_size)
        _, _, first = next(iter(matrix_blocks(scores[:1], 1)))
        return self._run(lambda: matrix_blocks(scores, rows), k, n, first.dtype, first.device,
                         query_marginal, gallery_marginal)

    @property
    def bias(self) -> torch.Tensor:
        """``[N]`` gallery biases ``gamma * log(beta_j / sum beta)``."""
        if self._bias is None:
            raise ValueError("SinkhornBias: call fit(query_bank, gallery) first")
        return self._bias

    def __call__(self, sim: Any) -> Any:
        """``sim + bias[None, :]``.  Shape: ``[Q, N]`` -> ``[Q, N]`` (a new array)."""
        s = to_work(sim, "sim")
        b = self.bias
        if s.shape[1] != b.shape[0]:
            raise ValueError(f"sim: has {s.shape[1]} columns but the bias has {b.shape[0]}")
        return like_input(s + b.to(s.device, s.dtype)[None, :], sim)

    def streaming_kwargs(self) -> dict[str, Any]:
        return {"bias": self.bias}
