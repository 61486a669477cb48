"""The two-tower model: video (or fused experts) and text towers into one joint space."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from xmodal._validate import as_tensor, check_finite, choice, integer, number, positive_number, short_repr
from xmodal.models.fusion import FUSIONS, ExpertFusion, check_experts
from xmodal.models.towers import TOWER_KINDS, Tower, TowerSpec, check_spec, spec_from_dict
from xmodal.retrieval.testtime import TestTime

MAIN_EXPERT = "video"  # the key of the main video features among several experts


class TwoTower(nn.Module):
    """Video and text towers into one joint space, plus test-time metadata.

    Args:
        video: :class:`TowerSpec` of the video/image tower.
        text: :class:`TowerSpec` of the text tower.
        temperature: the softmax temperature used at test time (e.g. by Sinkhorn
            test-time biases); the trainer sets it from the loss after training.

    Attributes:
        test_time: the :class:`~xmodal.retrieval.testtime.TestTime` of a trained run: the
            normalisers fitted at the end of training and the one selected on
            validation (assigning a dict converts it).
    """

    def __init__(self, video: TowerSpec, text: TowerSpec, temperature: float = 0.05, *,
                 experts: dict[str, TowerSpec] | None = None, fusion: str = "gated") -> None:
        super().__init__()
        check_spec(video, "video")
        check_spec(text, "text")
        temperature = positive_number(temperature, "temperature")
        choice(fusion, "model.fusion", FUSIONS)
        if experts is not None:
            check_experts(experts, "experts")
            if MAIN_EXPERT in experts:
                raise ValueError(f"experts: {MAIN_EXPERT!r} is the main video expert (the video spec), "
                                 f"not an extra one")
        if video.out_dim != text.out_dim:
            raise ValueError(f"model: video and text out_dim differ ({video.out_dim} vs {text.out_dim})")
        # One expert keeps the plain Tower (and its state_dict keys); several get a fusion head.
        self.video_tower: Tower | ExpertFusion = (
            ExpertFusion({MAIN_EXPERT: video, **experts}, fusion) if experts else Tower(video))
        self.text_tower = Tower(text)
        self.register_buffer("_temperature", torch.tensor(temperature))
        self.test_time = TestTime(temperature=temperature)

    @property
    def test_time(self) -> TestTime:
        return self._test_time

    @test_time.setter
    def test_time(self, value: TestTime | dict | None) -> None:
        if isinstance(value, TestTime):
            self._test_time = value
        elif value is None or isinstance(value, dict):
            self._test_time = TestTime.from_state_dict(value)
        else:
            raise TypeError(f"test_time: expected a TestTime, got {type(value).__name__}")

    @property
    def experts(self) -> list[str]:
        """Names of the video experts (``["video", ...]``); empty for one expert."""
        return list(self.video_tower.names) if isinstance(self.video_tower, ExpertFusion) else []

    @property
    def temperature(self) -> float:
        return float(self._temperature)

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature.fill_(float(value))

    @property
    def dim(self) -> int:
        return self.video_tower.spec.out_dim

    def _prepare(self, features: Any, name: str, tower: Tower) -> torch.Tensor:
        x = as_tensor(features, name)
        if not x.is_floating_point():
            raise TypeError(f"{name}: expected floating features, got {x.dtype}")
        if x.ndim not in (2, 3) or x.shape[-1] != tower.spec.in_dim:
            raise ValueError(f"{name}: expected [N, {tower.spec.in_dim}] or [N, F, {tower.spec.in_dim}], "
                             f"got shape {tuple(x.shape)}")
        check_finite(x, name)
        p = tower.standardize.mean
        return x.to(device=p.device, dtype=p.dtype)

    def _prepare_one(self, features: Any, mask: Any, tower: Tower, name: str, mask_name: str,
                     row_mask_ok: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = as_tensor(features, name)
        if not x.is_floating_point():
            raise TypeError(f"{name}: expected floating features, got {x.dtype}")
        d = tower.spec.in_dim
        if x.ndim not in (2, 3) or x.shape[-1] != d:
            raise ValueError(f"{name}: expected [N, {d}] or [N, F, {d}], got shape {tuple(x.shape)}")
        p = tower.standardize.mean
        if mask is None:
            check_finite(x, name)
            return x.to(device=p.device, dtype=p.dtype), None
        m = as_tensor(mask, mask_name)
        if m.dtype != torch.bool:
            raise TypeError(f"{mask_name}: expected a bool mask (True = real frame), got {m.dtype}")
        shapes = ([tuple(x.shape[:2])] if x.ndim == 3 else []) + ([tuple(x.shape[:1])] if row_mask_ok else [])
        if tuple(m.shape) not in shapes:
            raise ValueError(f"{mask_name}: expected shape {' or '.join(map(str, map(list, shapes))) or 'none'} "
                             f"for {name} of shape {tuple(x.shape)}, got {tuple(m.shape)}")
        m = m.to(x.device)
        check_finite(x[m], name)  # padded frames / missing experts may hold anything
        return x.to(device=p.device, dtype=p.dtype), m.to(p.device)

    def _prepare_video(self, features: Any, mask: Any) -> tuple[Any, Any]:
        """Validated video input on the model's device: ``(tensor, mask)`` or dicts."""
        tower = self.video_tower
        if not isinstance(tower, ExpertFusion):
            if isinstance(features, dict) or isinstance(mask, dict):
                raise TypeError("features: this model has one video expert; pass an array, not a dict")
            x, m = self._prepare_one(features, mask, tower, "features", "mask", False)
            _refuse_empty_rows(m, "mask", "video(s) have no real frame", "every video")
            return x, m
        if not isinstance(features, dict) or set(features) != set(tower.names):
            got = sorted(features) if isinstance(features, dict) else type(features).__name__
            raise ValueError(f"features: expected a dict with the experts {tower.names}, got {got}")
        mask = {} if mask is None else mask
        if not isinstance(mask, dict) or not set(mask) <= set(tower.names):
            raise ValueError(f"mask: expected a dict over the experts {tower.names} (or None)")
        xs, ms = {}, {}
        for k in tower.names:
            xs[k], mk = self._prepare_one(features[k], mask.get(k), tower.towers[k], f"features[{k!r}]",
                                          f"mask[{k!r}]", True)
            if mk is not None:
                ms[k] = mk
        sizes = {k: x.shape[0] for k, x in xs.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"features: experts have different numbers of videos {sizes}")
        n = next(iter(sizes.values()))
        here = torch.zeros(n, dtype=torch.bool, device=next(iter(xs.values())).device)
        for k in tower.names:
            if k not in ms:
                here[:] = True
            else:
                here |= ms[k] if ms[k].ndim == 1 else ms[k].any(1)
        if not bool(here.all()):
            empty = torch.nonzero(~here).flatten()
            raise ValueError(f"mask: {len(empty)} video(s) have no expert present (rows {empty[:5].tolist()})")
        return xs, ms

    def forward_video(self, features: Any, mask: Any = None) -> torch.Tensor:
        """Unnormalised video embeddings (trainer path: tensors on the model's device,
        keeps grad). ``features``/``mask`` as :meth:`encode_video`."""
        if isinstance(self.video_tower, ExpertFusion):
            return self.video_tower(features, mask)
        if mask is not None and features.ndim == 3 and not bool(mask.any(1).all()):
            raise ValueError("mask: some videos have no real frame; every video needs at least one")
        return self.video_tower(features, mask)

    def forward_text(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Unnormalised text embeddings (trainer path, keeps grad): sentence features ``[N, Dt]``
        or token features ``[N, L, Dt]`` with an optional bool ``mask`` ``[N, L]`` (True = real token)."""
        if mask is not None and features.ndim == 3 and not bool(mask.any(1).all()):
            raise ValueError("text_mask: some texts have no real token; every text needs at least one")
        return self.text_tower(features, mask)

    def _prepare_text(self, features: Any, mask: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Validated text input on the model's device: ``(tensor [N, Dt] or [N, L, Dt], mask or None)``."""
        x, m = self._prepare_one(features, mask, self.text_tower, "features", "text_mask", False)
        _refuse_empty_rows(m, "text_mask", "text(s) have no real token", "every text")
        return x, m

    def encode_video(self, features: Any, mask: Any = None, *, batch_size: int = 8192,
                     unit: bool = True) -> torch.Tensor:
        """L2-normalised video embeddings (eval mode, no grad; ``unit=False``: before the final norm).

        Args:
            features: ``[N, Dv]`` or ``[N, F, Dv]`` (numpy or torch); with several experts
                a dict ``{"video": ..., EXPERT: ...}``.
            mask: optional bool ``[N, F]``, True = real frame (padded frames never change
                an embedding; NaN/inf there is ignored). With experts a dict of
                ``[N]`` (expert present) or ``[N, Fe]`` masks; a missing key = all real.
            batch_size: videos per forward pass.

        Raises:
            ValueError: a video with no real frame (or no expert present), shapes, NaN/inf.

        Shape:
            - features: ``[N, Dv]`` or ``[N, F, Dv]``; mask: ``[N, F]``
            - output: ``[N, D]`` on the model's device

        >>> m = build_model(video_dim=3, text_dim=2, kind="meanp", dim=4)
        >>> x = torch.randn(2, 5, 3)
        >>> mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
        >>> junk = x.clone(); junk[~mask] = 1e6
        >>> torch.allclose(m.encode_video(x, mask), m.encode_video(junk, mask))
        True
        """
        streamed = self._streamed(features, batch_size, lambda f, sl: self.encode_video(
            _rows(f, sl), _rows(mask, sl), batch_size=batch_size, unit=unit))
        if streamed is not None:
            return streamed
        x, m = self._prepare_video(features, mask)
        n = next(iter(x.values())).shape[0] if isinstance(x, dict) else x.shape[0]
        return self._encode_rows(lambda sl: self.video_tower(_rows(x, sl), _rows(m, sl)), n, batch_size, unit)

    def encode_text(self, features: Any, text_mask: Any = None, batch_size: int = 8192, *,
                    unit: bool = True) -> torch.Tensor:
        """L2-normalised text embeddings (eval mode, no grad; ``unit=False``: before the final norm).

        Args:
            features: sentence features ``[N, Dt]`` or token features ``[N, L, Dt]``
                (COOT's word level; a ``transformer`` or ``meanp`` text tower pools the tokens).
            text_mask: optional bool ``[N, L]``, True = real token (padded tokens never
                change an embedding; NaN/inf there is ignored).
            batch_size: texts per forward pass.

        Shape:
            ``[N, Dt]`` or ``[N, L, Dt]`` -> ``[N, D]``

        >>> m = build_model(video_dim=3, text_dim=2, kind="meanp", text_kind="transformer", dim=4,
        ...                 hidden=8, heads=2)
        >>> x = torch.randn(2, 5, 2); mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
        >>> junk = x.clone(); junk[~mask] = 1e6
        >>> torch.allclose(m.encode_text(x, mask), m.encode_text(junk, mask))
        True
        """
        if isinstance(text_mask, int) and not isinstance(text_mask, bool):
            raise TypeError("encode_text: pass batch_size by keyword (the second argument is text_mask)")
        streamed = self._streamed(features, batch_size, lambda f, sl: self.encode_text(
            f[sl], _rows(text_mask, sl), batch_size=batch_size, unit=unit))
        if streamed is not None:
            return streamed
        x, m = self._prepare_text(features, text_mask)
        return self._encode_rows(lambda sl: self.text_tower(x[sl], _rows(m, sl)), x.shape[0], batch_size, unit)

    def _streamed(self, features: Any, batch_size: int, encode: Any) -> torch.Tensor | None:
        """numpy features (memory-mapped ones too) of more than ``batch_size`` rows, encoded one
        block of ``batch_size`` rows at a time, so only one block is ever converted and upcast
        (the same slices, hence the same numbers, as the whole array); None for anything else."""
        arrays = list(features.values()) if isinstance(features, dict) else [features]
        if not arrays or not all(isinstance(a, np.ndarray) and a.ndim >= 2 for a in arrays):
            return None
        n = arrays[0].shape[0]
        batch_size = integer(batch_size, "batch_size", minimum=1)
        if n <= batch_size or any(a.shape[0] != n for a in arrays):
            return None  # one block (or mismatched experts: the whole-array checks name them)
        return torch.cat([encode(features, slice(i, i + batch_size)) for i in range(0, n, batch_size)])

    @torch.no_grad()
    def _encode_rows(self, fn: Any, n: int, batch_size: int, unit: bool = True) -> torch.Tensor:
        was_training = self.training
        self.eval()
        norm = (lambda t: F.normalize(t, dim=-1)) if unit else (lambda t: t)
        try:
            out = [norm(fn(slice(i, i + batch_size)).float()) for i in range(0, n, batch_size)]
        finally:
            self.train(was_training)
        return torch.cat(out) if out else self._temperature.new_zeros(0, self.dim)

    def similarity(self, text_features: Any, video_features: Any, normalizer: str = "selected", *,
                   direction: str = "t2v", video_mask: Any = None, batch_size: int = 8192,
                   text_mask: Any = None) -> torch.Tensor:
        """Retrieval scores of raw input features under the run's test-time normaliser.

        Raw features -> the run's heads -> cosine scores -> the stored normaliser of
        :attr:`test_time` (fitted once at the end of training, never refitted; bank-based
        gallery biases are computed against this gallery, see :mod:`xmodal.retrieval.testtime`).

        Args:
            text_features: ``[T, Dt]`` or token features ``[T, L, Dt]`` (with ``text_mask``).
            video_features: ``[V, Dv]`` or ``[V, F, Dv]``; for a run with experts a dict
                ``{"video": ..., EXPERT: ...}`` holding every expert of the run.
            normalizer: ``"selected"`` (chosen on val when training), ``"none"`` or a fitted name.
            direction: ``"t2v"`` (texts query videos, ``[T, V]``) or ``"v2t"`` (``[V, T]``;
                the transpose for ``none``/``dn``, its own gallery biases otherwise: the
                trainer's ``metrics.json`` scores each direction this way).
            video_mask: optional bool ``[V, F]`` (True = real frame); with experts a dict of
                ``[V]`` (expert present) / ``[V, Fe]`` masks, as :meth:`encode_video`.
            text_mask: optional bool ``[T, L]`` (True = real token), as :meth:`encode_text`.

        Shape:
            ``[T, V]`` (``direction="t2v"``) or ``[V, T]``, on the model's device.

        >>> m = build_model(video_dim=6, text_dim=4, dim=3)
        >>> m.similarity(torch.randn(5, 4), torch.randn(2, 6), normalizer="none").shape
        torch.Size([5, 2])
        """
        text = self.encode_text(text_features, text_mask, batch_size=batch_size)
        video = (self.encode_video(video_features, batch_size=batch_size) if video_mask is None
                 else self.encode_video(video_features, mask=video_mask, batch_size=batch_size))
        return self.test_time.similarity(text, video, normalizer, direction=direction)

    def fit_standardization(self, video: Any, text: torch.Tensor, video_mask: Any = None,
                            text_mask: Any = None) -> None:
        """Measure input mean/std on training features (stored as buffers); only real
        frames, present experts and real tokens count (``video``/``video_mask`` as
        :meth:`encode_video`, ``text``/``text_mask`` as :meth:`encode_text`)."""
        tower = self.video_tower
        if isinstance(tower, ExpertFusion):
            masks = video_mask or {}
            for k in tower.names:
                tower.towers[k].standardize.fit(_array(video[k]), _array(masks.get(k)))
        else:
            tower.standardize.fit(_array(video), _array(video_mask))
        self.text_tower.standardize.fit(_array(text), _array(text_mask))

    def architecture(self) -> dict:
        tower = self.video_tower
        if isinstance(tower, ExpertFusion):
            return {"video": asdict(tower.towers[MAIN_EXPERT].spec), "text": asdict(self.text_tower.spec),
                    "experts": {k: asdict(tower.towers[k].spec) for k in tower.names if k != MAIN_EXPERT},
                    "fusion": tower.fusion}
        return {"video": asdict(tower.spec), "text": asdict(self.text_tower.spec)}

    @classmethod
    def from_architecture(cls, arch: dict) -> "TwoTower":
        """An untrained model of the architecture :meth:`architecture` describes."""
        video, text, experts = specs_from_architecture(arch)
        return cls(video, text, experts=experts, fusion=arch.get("fusion", "gated"))


def specs_from_architecture(arch: Any) -> tuple[TowerSpec, TowerSpec, dict[str, TowerSpec] | None]:
    """``(video, text, experts or None)`` tower specs of an architecture record, validated."""
    if not isinstance(arch, dict):
        raise ValueError(f"architecture: expected a mapping, got {short_repr(arch)}")
    for key in ("video", "text"):
        if key not in arch:
            raise ValueError(f"architecture: no {key!r} tower")
    experts = arch.get("experts") or {}
    if not isinstance(experts, dict):
        raise ValueError(f"architecture['experts']: expected a mapping, got {short_repr(experts)}")
    specs = {k: spec_from_dict(v, f"architecture['experts'][{k!r}]") for k, v in experts.items()}
    return (spec_from_dict(arch["video"], "architecture['video']"),
            spec_from_dict(arch["text"], "architecture['text']"), specs or None)


def _rows(x: Any, sl: slice) -> Any:
    """Rows ``sl`` of a tensor, of each tensor of a dict, or None."""
    if x is None:
        return None
    return {k: v[sl] for k, v in x.items()} if isinstance(x, dict) else x[sl]


def _array(x: Any) -> Any:
    """A numpy array (memory-mapped ones included) as it is, anything else as a tensor: the
    statistics read arrays in row blocks (:meth:`Standardize.fit`)."""
    return x if x is None or isinstance(x, np.ndarray) else torch.as_tensor(x)


def build_model(*, video_dim: int, text_dim: int, kind: str = "linear", dim: int = 256, width: int = 1024,
                depth: int = 1, dropout: float = 0.0, layers: int = 2, heads: int = 8, hidden: int = 512,
                text_kind: str | None = None, temperature: float = 0.05, experts: dict[str, int] | None = None,
                fusion: str = "gated", text_tokens: int | None = None, block: str = "xmodal",
                local_pooling: str = "mean", pool_heads: int = 1, pool_hidden: int = 0) -> TwoTower:
    """A :class:`TwoTower` from explicit keywords.

    ``kind`` sets the video tower; the text tower uses ``text_kind`` (default: the
    same kind, with frame pooling kinds mapped to ``linear`` since texts have no frames).
    ``experts`` (``{name: input dim}``) adds further video experts, each with a tower
    of ``kind``, fused by ``fusion`` (``concat`` or ``gated``, see :class:`ExpertFusion`).
    ``text_tokens``: the text tower is trained on token features of up to this many
    tokens (its spec records ``tokens``; a ``transformer`` text tower's position table
    covers ``max(64, text_tokens)``).
    ``block``, ``local_pooling`` (``mean`` or ``atn``), ``pool_heads``, ``pool_hidden``: the block
    and frame pooling of ``transformer`` towers (:mod:`xmodal.models.towers`; COOT's local level).
    ``kind="identity"``: no parameters; each side's features (frames averaged over the real ones),
    L2-normalised, are the embeddings, so ``video_dim`` must equal ``text_dim`` (``dim`` is unused):
    zero-shot retrieval with an aligned encoder pair such as CLIP's (Radford et al. 2021; DN Sec. 4.1).

    >>> build_model(video_dim=4, text_dim=4, kind="identity").dim
    4
    """
    choice(fusion, "model.fusion", FUSIONS)
    choice(kind, "model.kind", TOWER_KINDS)
    video_dim, text_dim = integer(video_dim, "video_dim", minimum=1), integer(text_dim, "text_dim", minimum=1)
    for name, value, low in (("dim", dim, 1), ("width", width, 1), ("depth", depth, 0), ("layers", layers, 0),
                             ("heads", heads, 1), ("hidden", hidden, 1)):
        integer(value, name, minimum=low)
    if not 0.0 <= number(dropout, "dropout") <= 1.0:
        raise ValueError(f"dropout: must lie in [0, 1], got {short_repr(dropout)}")
    if experts is not None:
        if not isinstance(experts, dict):
            raise TypeError(f"experts: expected a dict {{expert name: input dim}}, got {short_repr(experts)}")
        experts = {k: integer(d, f"experts[{k!r}]", minimum=1) for k, d in experts.items()}
    if text_kind is None:
        text_kind = "linear" if kind in ("meanp", "transformer") else kind
    choice(text_kind, "model.text_kind", TOWER_KINDS)
    if "identity" in (kind, text_kind):
        if kind != text_kind:
            raise ValueError(f"model.text_kind: an identity model has identity towers on both sides, got "
                             f"{kind} and {text_kind}")
        if video_dim != text_dim:
            raise ValueError(f"model.kind: identity needs video and text features of one size (an aligned encoder "
                             f"such as CLIP's), got video {video_dim} and text {text_dim}")
        if experts:
            raise ValueError("model.kind: identity takes one video expert (the features of an aligned encoder)")
        if text_tokens:
            raise ValueError("model.kind: identity takes sentence features [T, Dt], not token features")
        dim = video_dim
    if text_tokens is not None and (isinstance(text_tokens, bool) or not isinstance(text_tokens, (int, np.integer))
                                    or text_tokens < 1):
        raise ValueError(f"text_tokens: expected a positive integer or None, got {short_repr(text_tokens)}")
    common = dict(out_dim=dim, width=width, depth=depth, dropout=dropout, layers=layers, heads=heads,
                  hidden=hidden, block=block, pooling=local_pooling, pool_heads=pool_heads, pool_hidden=pool_hidden)
    return TwoTower(TowerSpec(kind=kind, in_dim=video_dim, **common),
                    TowerSpec(kind=text_kind, in_dim=text_dim, **common,
                              **({"max_frames": max(64, int(text_tokens)), "tokens": True} if text_tokens else {})),
                    temperature=temperature,
                    experts={k: TowerSpec(kind=kind, in_dim=d, **common) for k, d in (experts or {}).items()} or None,
                    fusion=fusion)


def parameter_count(model: nn.Module) -> int:
    """Trainable parameters of ``model`` (those with ``requires_grad``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {short_repr(model)}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _refuse_empty_rows(mask: torch.Tensor | None, name: str, what: str, who: str) -> None:
    """``ValueError`` naming ``name`` when a row of a ``[N, L]`` mask has no True entry."""
    if mask is None:
        return
    empty = torch.nonzero(~mask.any(1)).flatten()
    if len(empty):
        raise ValueError(f"{name}: {len(empty)} {what} (rows {empty[:5].tolist()}); {who} needs at least one")
