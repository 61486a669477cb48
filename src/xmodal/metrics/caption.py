"""Caption-evaluation scores from embeddings: CLIPScore, RefCLIPScore and their DN forms.

CLIPScore (Hessel et al., EMNLP 2021): ``CLIP-S(c, v) = w * max(cos(c, v), 0)`` with
``w = 2.5``; RefCLIPScore: the harmonic mean of ``CLIP-S`` and
``max(max_{r in R} cos(c, r), 0)``.

DN (Zhou et al., NeurIPS 2023), Sec. 4.5: with distribution normalisation the
reference-free score is ``S(x, y)`` of eq. 7, ``(x - lam mu_x) . (y - lam mu_y)`` on the
L2-normalised embeddings, and the reference-based score is the arithmetic mean
``(S(x, y) + 0.25 * max_{c in R} y . c) / 2``. The means are estimated "from the images to
be captioned and the references provided" (Sec. 3.2): fit the
:class:`~xmodal.normalize.DistributionNormalization` on those (L2-normalised) features.
(The authors' released code scores DN with the exponential form of eq. 6 and adds the
reference term; this module follows the paper's text.)

Scores are compared with human ratings by Kendall's tau (:func:`kendall_tau`): the paper
reports ``tau_c`` on Flickr8k-Expert and THumB and ``tau_b`` on Flickr8k-CF (Table 3).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xmodal._validate import choice, positive_number
from xmodal.metrics._common import similarity

KENDALL_VARIANT = {"flickr8k-expert": "c", "flickr8k-cf": "b", "thumb": "c"}


def _refs(references: Any, n: int, dim: int) -> list[torch.Tensor]:
    if isinstance(references, (list, tuple)):
        if len(references) != n:
            raise ValueError(f"references: expected {n} reference sets (one per caption), got {len(references)}")
        refs = [similarity(r, f"references[{i}]") for i, r in enumerate(references)]
    else:
        r = similarity(references, "references", ndim=3)
        if r.shape[0] != n:
            raise ValueError(f"references: expected {n} reference sets (one per caption), got {r.shape[0]}")
        refs = list(r)
    for i, r in enumerate(refs):
        if r.shape[1] != dim:
            raise ValueError(f"references[{i}]: dimension {r.shape[1]} differs from the captions' {dim}")
    return [F.normalize(r.double(), dim=1) for r in refs]


@torch.no_grad()
def caption_score(image_features: Any, caption_features: Any, *, references: Any = None,
                  normalizer: Any = None, w: float = 2.5) -> np.ndarray:
    """Per-pair caption score: CLIPScore / RefCLIPScore, or their DN forms (module docstring).

    Args:
        image_features: ``[N, D]`` embedding of each image.
        caption_features: ``[N, D]`` embedding of the candidate caption of each image.
        references: optional reference caption embeddings, ``[N, R, D]`` or a list of
            ``N`` arrays ``[R_i, D]`` (reference-based score).
        normalizer: optional fitted ``DistributionNormalization`` (images = queries,
            captions = gallery).
        w: CLIPScore weight (2.5).

    Returns:
        float64 ``[N]`` scores (higher = better caption).

    Shape:
        image_features: [N, D]; caption_features: [N, D]; references: [N, R, D].

    Examples:
        >>> import numpy as np
        >>> caption_score(np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[1.0, 1.0], [-1.0, 0.0]])).round(4)
        array([1.7678, 0.    ])
    """
    x = F.normalize(similarity(image_features, "image_features").double(), dim=1)
    y = F.normalize(similarity(caption_features, "caption_features").double(), dim=1).to(x.device)
    if x.shape != y.shape:
        raise ValueError(f"caption_features: shape {tuple(y.shape)} differs from image_features' {tuple(x.shape)}")
    w = positive_number(w, "w")
    ref = None
    if references is not None:
        refs = _refs(references, x.shape[0], x.shape[1])
        ref = torch.stack([(r.to(y.device) @ y[i]).max() for i, r in enumerate(refs)])
    if normalizer is None:
        clip = w * (x * y).sum(1).clamp(min=0)
        if ref is None:
            return clip.cpu().numpy()
        ref = ref.clamp(min=0)
        den = clip + ref
        hm = torch.where(den > 0, 2 * clip * ref / den.clamp(min=1e-300), torch.zeros_like(den))
        return hm.cpu().numpy()
    if not hasattr(normalizer, "transform"):
        raise TypeError("normalizer: expected a fitted DistributionNormalization (with .transform)")
    xd, yd = (torch.as_tensor(t).double().to(x.device) for t in normalizer.transform(x, y))
    s = (xd * yd).sum(1)
    if ref is None:
        return s.cpu().numpy()
    return ((s + 0.25 * ref) / 2).cpu().numpy()


def kendall_tau(scores: Any, human: Any, *, variant: str = "c") -> float:
    """Kendall's tau between metric scores and human ratings (``scipy.stats.kendalltau``).

    Args:
        scores: ``[N]`` metric scores.
        human: ``[N]`` human ratings.
        variant: ``"b"`` or ``"c"``, or a dataset name in :data:`KENDALL_VARIANT`
            (Flickr8k-Expert and THumB: ``tau_c``; Flickr8k-CF: ``tau_b``; DN Table 3).

    Returns:
        tau in [-1, 1] (the papers' tables print ``100 * tau``).

    Examples:
        >>> round(kendall_tau([0.1, 0.4, 0.3, 0.9], [1, 3, 2, 4], variant="b"), 3)
        1.0
    """
    from scipy.stats import kendalltau

    v = KENDALL_VARIANT.get(str(variant).lower(), variant)
    v = choice(v, "variant", ("b", "c"))
    a = similarity(scores, "scores", ndim=1).double().cpu().numpy()
    b = similarity(human, "human", ndim=1).double().cpu().numpy()
    if a.shape != b.shape:
        raise ValueError(f"human: {b.shape[0]} ratings for {a.shape[0]} scores")
    if a.size < 2:
        raise ValueError("scores: need at least two items")
    tau = kendalltau(a, b, variant=v).statistic
    return float(tau) if np.isfinite(tau) else 0.0


__all__ = ["caption_score", "kendall_tau", "KENDALL_VARIANT"]
