"""Distribution Normalization (Zhou et al., "Test-Time Distribution Normalization
for Contrastively Learned Vision-language Models", NeurIPS 2023, eq. 7; eqs. 6 and 8
as the ``form="exponential"`` / ``form="full"`` options)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xmodal._validate import choice, flag, integer, number, positive_number
from xmodal.normalize._base import Normalizer, like_input, to_work


class DistributionNormalization(Normalizer):
    """DN: ``S(x, y) = (x - lam * mu_x) . (y - lam * mu_y)`` (eq. 7, sec. 3).

    ``mu_x`` / ``mu_y`` are the means of a seeded random sample of ``num_samples``
    unlabeled queries and gallery items (all of them when fewer, or when
    ``num_samples`` is None). The paper's protocol (sec. 4.3; Tables 1-2) estimates each
    mean from 100 random unlabeled VALIDATION samples and reports recalls averaged over 5
    sampling seeds; test-set means appear only as the upper bound of the sec. 4.6.1
    ablation (Table 5, "(test)"). For that protocol fit one normaliser per seed with
    :meth:`fit_per_seed` and average the metrics. ``seeds > 1`` instead averages the
    means of ``seeds`` samples (seeds ``seed .. seed + seeds - 1``; the average of the
    per-seed means of :meth:`fit_per_seed`), a lower-variance estimate of one mean.
    Every (sampling seed, side) pair draws its rows from its own generator
    (``np.random.default_rng([seed_k, side])``, side 0 = queries, 1 = gallery), so no
    seed's query sample reuses another seed's gallery sample.

    ``form`` picks the paper's score (sec. 3.1.2, 3.2, 4.7):

    - ``"linear"`` (default, eq. 7): the DN above.
    - ``"exponential"`` (eq. 6): ``exp(x.(mu_y - y) / tau) + exp((mu_x - x).y / tau)``.
    - ``"full"`` (eq. 8): ``mean_{y1} exp(x.(0.5 y1 - y) / tau) +
      mean_{x1} exp((0.5 x1 - x).y / tau)`` over the sampled rows ``x1`` / ``y1``
      themselves (the paper iterates over the validation samples; here the
      ``num_samples`` rows drawn for the means, one seed only). The 0.5 is the
      paper's literal coefficient (``coef``).

    Eqs. 6 and 8 are loss terms (smaller = better match); :meth:`score` returns their
    NEGATIVE so that, as for eq. 7, larger means more similar (our reading; the paper
    correlates them with human judgements, sec. 4.7, Table 6). They are not a
    per-gallery bias, so only :meth:`score` is defined for them (``__call__``,
    :meth:`transform`, :meth:`gallery_bias` raise ValueError). ``lam`` is unused by
    eq. 6 (its means have coefficient 1) and eq. 8 (coefficient ``coef``).

    DN acts on embeddings, not on a similarity matrix. Expanding the product,
    ``x.y - lam x.mu_y - lam mu_x.y + lam^2 mu_x.mu_y``: for ranking the gallery
    for a fixed query only the per-gallery bias ``-lam mu_x . y_j`` matters
    (:meth:`gallery_bias`), which also lets DN be folded into the streaming
    evaluator (``bias=``) or a FAISS index (:class:`xmodal.retrieval.index.BiasedIndex`).
    :meth:`fit` caches that bias for the gallery it was given, so ``__call__(sim)``
    with ``sim`` ``[Q, N]`` over the same gallery returns ``sim + bias`` (rank-
    equivalent to DN) or, with ``queries=``, the exact DN scores. Use
    :meth:`transform` / :meth:`score` for embeddings.

    Args:
        lam: the DN weight ``lambda`` (paper default 0.25; 0 disables).
        num_samples: sample size for each mean (paper: 100); None uses all rows.
        seed: seed of the sampling (the first one when ``seeds > 1``).
        oracle: True when the samples are the test queries themselves (not the
            paper's protocol, which samples validation data); only reported by
            ``uses_test_queries``.
        seeds: number of sampling seeds whose sample means are averaged (default 1).
        form: ``"linear"`` (eq. 7), ``"exponential"`` (eq. 6) or ``"full"`` (eq. 8).
        tau: the temperature of eqs. 6 and 8 (CLIP's learned 0.01 by default; unused by eq. 7).
        coef: the sample coefficient of eq. 8 (paper: 0.5).

    Examples:
        >>> import torch
        >>> from xmodal.normalize import DistributionNormalization
        >>> g = torch.Generator().manual_seed(0)
        >>> val_q, val_g = torch.randn(500, 8, generator=g), torch.randn(500, 8, generator=g)
        >>> runs = DistributionNormalization.fit_per_seed(val_q, val_g, num_samples=100, seeds=5)
        >>> len(runs), runs[0].seed, runs[4].seed
        (5, 0, 4)
        >>> avg = DistributionNormalization(num_samples=100, seeds=5).fit(val_q, val_g)
        >>> bool(torch.allclose(avg.mu_queries, sum(r.mu_queries for r in runs) / 5))
        True
    """

    name = "dn"
    FORMS = ("linear", "exponential", "full")

    def __init__(self, lam: float = 0.25, num_samples: int | None = 100, seed: int = 0,
                 oracle: bool = False, seeds: int = 1, form: str = "linear", tau: float = 0.01,
                 coef: float = 0.5) -> None:
        self.oracle = flag(oracle, "oracle")
        lam = number(lam, "lam", minimum=0.0)
        if num_samples is not None:
            num_samples = int(positive_number(num_samples, "num_samples"))
        seeds = integer(seeds, "seeds", minimum=1)
        choice(form, "form", self.FORMS)
        if form == "full" and seeds != 1:
            raise ValueError(f"seeds: form 'full' (eq. 8) uses one sample, got seeds={seeds}")
        tau, coef = float(positive_number(tau, "tau")), number(coef, "coef")
        seed = integer(seed, "seed", minimum=0)
        self.lam, self.num_samples, self.seed, self.seeds = lam, num_samples, seed, seeds
        self.form, self.tau, self.coef = form, tau, coef
        self._xs_q: torch.Tensor | None = None  # eq. 8's samples x1 / y1
        self._xs_g: torch.Tensor | None = None
        self._mu_q: torch.Tensor | None = None
        self._mu_g: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def hparams(self) -> dict[str, Any]:
        return {"lam": self.lam, "num_samples": self.num_samples, "seed": self.seed,
                "oracle": self.oracle, "seeds": self.seeds, "form": self.form, "tau": self.tau,
                "coef": self.coef}

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for key in ("mu_q", "mu_g", "bias", "xs_q", "xs_g"):
            if getattr(self, "_" + key) is not None:
                out[key] = getattr(self, "_" + key)
        return out

    def sample_rows(self, n: int, k: int, side: int) -> np.ndarray | None:
        """Sorted rows drawn for sampling seed ``seed + k`` on ``side`` (0 queries, 1 gallery)
        out of ``n``, from a generator of its own; None when all rows are used."""
        if self.num_samples is None or self.num_samples >= n:
            return None
        rng = np.random.default_rng([self.seed + k, side])
        return np.sort(rng.choice(n, size=self.num_samples, replace=False))

    def _sample_mean(self, x: torch.Tensor, side: int) -> torch.Tensor:
        """Mean of the per-seed sample means (seed ``seed + k``, ``side`` 0 / 1)."""
        means = []
        for k in range(self.seeds):
            rows = self.sample_rows(x.shape[0], k, side)
            if rows is None:
                return x.mean(0)
            means.append(x[torch.from_numpy(rows).to(x.device)].mean(0))
        return torch.stack(means).mean(0)

    def _sample(self, x: torch.Tensor, side: int) -> torch.Tensor:
        rows = self.sample_rows(x.shape[0], 0, side)
        return x if rows is None else x[torch.from_numpy(rows).to(x.device)]

    @classmethod
    def fit_per_seed(cls, query_samples: Any, gallery_samples: Any, *, lam: float = 0.25,
                     num_samples: int | None = 100, seeds: int = 5, seed: int = 0,
                     oracle: bool = False) -> list["DistributionNormalization"]:
        """The paper's protocol (sec. 4.3): one DN per sampling seed ``seed .. seed + seeds - 1``,
        each fitted on ``num_samples`` random rows; evaluate each and average the metrics.

        Shape:
            query_samples ``[K, D]``, gallery_samples ``[N, D]`` -> a list of ``seeds``
            fitted normalisers.
        """
        seeds = integer(seeds, "seeds", minimum=1)
        return [cls(lam=lam, num_samples=num_samples, seed=seed + k, oracle=oracle)
                .fit(query_samples, gallery_samples) for k in range(seeds)]

    def fit(self, query_samples: Any, gallery_samples: Any) -> "DistributionNormalization":
        """Estimate ``mu_x`` and ``mu_y``; cache :meth:`gallery_bias` of ``gallery_samples``.

        Shape:
            query_samples ``[K, D]``, gallery_samples ``[N, D]`` (pass the whole
            gallery to use ``__call__`` on ``[Q, N]`` blocks).
        """
        q = to_work(query_samples, "query_samples")
        g = to_work(gallery_samples, "gallery_samples")
        if q.shape[1] != g.shape[1]:
            raise ValueError(f"query_samples and gallery_samples: embedding sizes differ "
                             f"({q.shape[1]} vs {g.shape[1]})")
        self._mu_q = self._sample_mean(q, 0)
        self._mu_g = self._sample_mean(g.to(q.device), 1)
        if self.form == "linear":
            self._bias = self._gallery_bias(g.to(q.device))
        if self.form == "full":
            self._xs_q, self._xs_g = self._sample(q, 0), self._sample(g.to(q.device), 1)
        return self

    def _linear_only(self, what: str) -> None:
        if self.form != "linear":
            raise ValueError(f"{what}: DN form {self.form!r} is not a per-gallery bias; use score()")

    def _check_fitted(self) -> None:
        if self._mu_q is None:
            raise ValueError("DistributionNormalization: call fit(query_samples, gallery_samples) first")

    def _dims(self, x: torch.Tensor, name: str, mu: torch.Tensor) -> torch.Tensor:
        """``x`` if its embedding size is the fitted means' (else a ValueError naming ``name``)."""
        if x.ndim != 2 or x.shape[1] != mu.shape[0]:
            raise ValueError(f"{name}: embedding size {tuple(x.shape)[1:]} != {mu.shape[0]} of the fitted means")
        return x

    def _gallery_bias(self, g: torch.Tensor) -> torch.Tensor:
        return -self.lam * (g @ self._mu_q.to(g.device, g.dtype))

    @property
    def mu_queries(self) -> torch.Tensor:
        self._check_fitted()
        return self._mu_q

    @property
    def mu_gallery(self) -> torch.Tensor:
        self._check_fitted()
        return self._mu_g

    @property
    def bias(self) -> torch.Tensor:
        """The cached per-gallery bias ``[N]`` of the gallery given to :meth:`fit`."""
        self._check_fitted()
        return self._bias

    def gallery_bias(self, gallery: Any) -> Any:
        """Per-gallery bias ``-lam * mu_x . y_j`` ``[N]`` (the rank-relevant part of DN)."""
        self._check_fitted()
        self._linear_only("gallery_bias")
        g = self._dims(to_work(gallery, "gallery"), "gallery", self._mu_q)
        return like_input(self._gallery_bias(g), gallery)

    def query_term(self, queries: Any) -> Any:
        """Per-query term ``-lam x_i . mu_y + lam^2 mu_x . mu_y`` ``[Q]`` (rank-irrelevant)."""
        self._check_fitted()
        self._linear_only("query_term")
        q = self._dims(to_work(queries, "queries"), "queries", self._mu_g)
        mu_g, mu_q = self._mu_g.to(q.device, q.dtype), self._mu_q.to(q.device, q.dtype)
        return like_input(-self.lam * (q @ mu_g) + self.lam ** 2 * (mu_q @ mu_g), queries)

    def transform(self, queries: Any, gallery: Any) -> tuple[Any, Any]:
        """``(queries - lam * mu_x, gallery - lam * mu_y)`` (new arrays).

        Shape:
            queries ``[Q, D]``, gallery ``[N, D]`` -> same shapes.
        """
        self._check_fitted()
        self._linear_only("transform")
        q = self._dims(to_work(queries, "queries"), "queries", self._mu_q)
        g = self._dims(to_work(gallery, "gallery"), "gallery", self._mu_g)
        q2 = q - self.lam * self._mu_q.to(q.device, q.dtype)
        g2 = g - self.lam * self._mu_g.to(g.device, g.dtype)
        return like_input(q2, queries), like_input(g2, gallery)

    def score(self, queries: Any, gallery: Any) -> Any:
        """DN similarity matrix ``[Q, N]`` of ``form`` (eq. 7; minus eq. 6 or 8).

        Shape:
            queries ``[Q, D]``, gallery ``[N, D]`` -> ``[Q, N]``.
        """
        self._check_fitted()
        if self.form == "linear":
            q, g = self.transform(to_work(queries, "queries"), to_work(gallery, "gallery"))
            return like_input(q @ g.to(q.device).T, queries)
        q = self._dims(to_work(queries, "queries"), "queries", self._mu_q)
        g = self._dims(to_work(gallery, "gallery"), "gallery", self._mu_g).to(q.device, q.dtype)
        qg, t = q @ g.T, self.tau
        if self.form == "exponential":  # eq. 6: x.(mu_y - y) and (mu_x - x).y
            a = (q @ self._mu_g.to(q.device, q.dtype))[:, None] - qg
            b = (g @ self._mu_q.to(q.device, q.dtype))[None, :] - qg
            return like_input(-(torch.exp(a / t) + torch.exp(b / t)), queries)
        ys, xs = self._xs_g.to(q.device, q.dtype), self._xs_q.to(q.device, q.dtype)
        out = torch.empty_like(qg)
        qy, xg = q @ ys.T, xs @ g.T  # [Q, M], [K, N]
        for j in range(g.shape[0]):  # eq. 8, one gallery column at a time (memory [Q, M])
            a = torch.exp((self.coef * qy - qg[:, j:j + 1]) / t).mean(1)
            b = torch.exp((self.coef * xg[:, j][None, :] - qg[:, j:j + 1]) / t).mean(1)
            out[:, j] = -(a + b)
        return like_input(out, queries)

    def __call__(self, sim: Any, queries: Any | None = None) -> Any:
        """``sim + bias`` (rank-equivalent DN); with ``queries`` ``[Q, D]`` the exact
        eq. 7 scores ``sim + bias[None] + query_term(queries)[:, None]``.

        Shape:
            sim ``[Q, N]`` with ``N`` the size of the gallery given to :meth:`fit`.
        """
        self._check_fitted()
        self._linear_only("sim")
        s = to_work(sim, "sim")
        if s.shape[1] != self._bias.shape[0]:
            raise ValueError(f"sim: has {s.shape[1]} columns but DN was fitted on a gallery "
                             f"of {self._bias.shape[0]} items")
        out = s + self._bias.to(s.device, s.dtype)[None, :]
        if queries is not None:
            q = to_work(queries, "queries")
            if q.shape[0] != s.shape[0]:
                raise ValueError(f"queries: {q.shape[0]} rows but sim has {s.shape[0]}")
            out = out + self.query_term(q).to(s.device, s.dtype)[:, None]
        return like_input(out, sim)

    def streaming_kwargs(self) -> dict[str, Any]:
        self._linear_only("streaming_kwargs")
        return {"bias": self.bias}
