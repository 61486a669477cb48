"""Towers: one modality's head over pre-extracted features (standardise -> pool frames -> project).

Tower kinds (``TOWER_KINDS``): ``linear``, ``mlp``, ``meanp`` (CLIP4Clip meanP), ``transformer``
(Cali-NCE style temporal pooling), ``identity`` (no parameters: the features themselves, frames
averaged, as the embedding: zero-shot retrieval with an aligned encoder such as CLIP). See
:mod:`xmodal.models` for the overview.

A ``transformer`` tower's block (``BLOCKS``): ``xmodal`` (standardise -> Linear -> learned positions
-> pre-norm GELU encoder, feed-forward 4x -> pool -> output Linear) or ``release`` (COOT's local
transformer as the CrossCLR release builds it, :mod:`xmodal.models.coot`: input layer norm ->
Linear + GELU -> fixed sine/cosine positions -> post-norm encoder, feed-forward = width ->
pool; no output Linear, so ``hidden == out_dim``; truncated-normal init, std 0.01). Its pooling
(``POOLINGS``): ``mean`` over the real frames, ``max`` over the real frames (per channel; CrossCLR
Table 7, LSMDC: "Pooler Max", which the release's ``config/lsmdc.yaml`` sets at the local level) or
``atn``, COOT's attention-aware feature aggregation with ``pool_heads`` heads (Table 7, YouCook2:
"Pooler ATN", "AF heads 2").
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import nn

from xmodal._validate import choice, flag, integer, number, short_repr
from xmodal.models.coot import AttentionPool, CootLayerNorm, ReleaseEncoder, init_release, sinusoid_table

TOWER_KINDS = ("linear", "mlp", "meanp", "transformer", "identity")
BLOCKS = ("xmodal", "release")
POOLINGS = ("mean", "max", "atn")


@dataclass(frozen=True)
class TowerSpec:
    """Architecture of one tower (plain values, stored in checkpoints).

    ``tokens``: a text tower trained on token features ``[N, L, D]`` (COOT's word level), so
    raw captions are encoded at the token level for it (``xmodal query --captions``, ``serve``).
    ``block``, ``pooling``, ``pool_heads``, ``pool_hidden`` (the attention pooler's scoring width,
    0 = ``hidden``): a ``transformer`` tower's block and frame pooling (module docstring).
    """

    kind: str = "linear"
    in_dim: int = 0
    out_dim: int = 256
    width: int = 1024
    depth: int = 1
    dropout: float = 0.0
    layers: int = 2
    heads: int = 8
    hidden: int = 512
    max_frames: int = 64
    tokens: bool = False
    block: str = "xmodal"
    pooling: str = "mean"
    pool_heads: int = 1
    pool_hidden: int = 0


#: Smallest value of each integer field of a :class:`TowerSpec` (``depth`` 0: an mlp without
#: hidden layers, i.e. a linear map).
_SPEC_MINIMUM = {"in_dim": 1, "out_dim": 1, "width": 1, "depth": 0, "layers": 0, "heads": 1, "hidden": 1,
                 "max_frames": 1, "pool_heads": 1, "pool_hidden": 0}

#: Largest value of each integer field in a stored architecture record (the config's own bounds,
#: ``xmodal.config.MAX_MODEL_SIZE``, for what it sets; feature sizes and frames up to 2**31 - 1).
_SPEC_MAXIMUM = {"in_dim": 2 ** 31 - 1, "out_dim": 1 << 16, "width": 1 << 17, "depth": 64, "layers": 64, "heads": 256,
                 "hidden": 1 << 17, "max_frames": 2 ** 31 - 1, "pool_heads": 256, "pool_hidden": 1 << 17}


def check_spec(spec: Any, name: str = "spec") -> TowerSpec:
    """Validate a :class:`TowerSpec` (its values are plain, unchecked dataclass fields).

    Raises:
        TypeError: ``spec`` is not a TowerSpec, or a field has the wrong type.
        ValueError: naming the field (``{name}.width`` ...): unknown kind, a size below 1,
            dropout outside ``[0, 1]``, transformer ``hidden`` not divisible by ``heads`` or
            ``pool_heads``, a ``release`` block whose ``hidden`` differs from ``out_dim``.
    """
    if not isinstance(spec, TowerSpec):
        raise TypeError(f"{name}: expected a TowerSpec, got {short_repr(spec)}")
    choice(spec.kind, "model.kind", TOWER_KINDS)
    for field, low in _SPEC_MINIMUM.items():
        integer(getattr(spec, field), f"{name}.{field}", minimum=low)
    if not 0.0 <= number(spec.dropout, f"{name}.dropout") <= 1.0:
        raise ValueError(f"{name}.dropout: must lie in [0, 1], got {spec.dropout!r}")
    flag(spec.tokens, f"{name}.tokens")
    choice(spec.block, "model.block", BLOCKS)
    choice(spec.pooling, "model.local_pooling", POOLINGS)
    if spec.kind == "identity" and spec.out_dim != spec.in_dim:
        raise ValueError(f"{name}.out_dim: an identity tower keeps its {spec.in_dim} input values, got out_dim "
                         f"{spec.out_dim}")
    if spec.kind == "transformer" and spec.hidden % spec.heads:
        raise ValueError(f"{name}.heads: must divide {name}.hidden ({spec.hidden}), got {spec.heads}")
    if spec.kind == "transformer" and spec.pooling == "atn" and (
            spec.hidden % spec.pool_heads or (spec.pool_hidden or spec.hidden) % spec.pool_heads):
        raise ValueError(f"{name}.pool_heads: must divide {name}.hidden ({spec.hidden}) and the pooler's width "
                         f"({spec.pool_hidden or spec.hidden}), got {spec.pool_heads}")
    if spec.kind == "transformer" and spec.block == "release" and spec.hidden != spec.out_dim:
        raise ValueError(f"{name}.hidden: the release block has no output layer, so hidden must equal the "
                         f"embedding size {spec.out_dim}, got {spec.hidden}")
    return spec


def spec_from_dict(d: Any, name: str) -> TowerSpec:
    """A validated :class:`TowerSpec` from a checkpoint's architecture record (``asdict``)."""
    if not isinstance(d, dict):
        raise ValueError(f"{name}: expected a mapping of tower fields, got {short_repr(d)}")
    unknown = sorted(map(str, set(d) - {f.name for f in fields(TowerSpec)}))
    if unknown:
        raise ValueError(f"{name}: unknown tower field(s) {', '.join(unknown)}")
    for field, top in _SPEC_MAXIMUM.items():  # a file's record: bounded before anything is built
        if field in d:
            integer(d[field], f"{name}.{field}", minimum=_SPEC_MINIMUM[field], maximum=top)
    if "dropout" in d and (isinstance(d["dropout"], bool) or not isinstance(d["dropout"], (int, float))):
        raise ValueError(f"{name}.dropout: expected a number, got {short_repr(d['dropout'])}")
    return check_spec(TowerSpec(**d), name)


class Standardize(nn.Module):
    """``(x - mean) / std`` with statistics kept as buffers (saved with the model)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        dim = integer(dim, "dim", minimum=1)
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))

    @torch.no_grad()
    def fit(self, features: Any, mask: Any = None, *, block_rows: int | None = None) -> "Standardize":
        """Set statistics from training features ``[N, D]`` or ``[N, F, D]``: all rows and
        frames, or only those where ``mask`` (``[N]`` or ``[N, F]``) is True, so padded
        frames and missing experts never enter the statistics.

        ``features`` may be a tensor or a numpy array (a memory-mapped one is read in row
        blocks of about 2**22 values, ``block_rows`` to choose, never upcast whole): two
        float64 passes, the mean then the mean squared deviation (population std)."""
        d = features.shape[-1]
        n = int(features.shape[0])
        per_row = max(1, int(np.prod(features.shape[1:])))
        step = int(block_rows) if block_rows else max(1, (1 << 22) // per_row)

        def tensor(a: Any) -> torch.Tensor:  # a copy of one block: never a view of a read-only file
            return torch.from_numpy(np.array(a)) if isinstance(a, np.ndarray) else a

        def blocks():
            for i in range(0, n, step):
                x = tensor(features[i:i + step])
                if mask is not None:
                    m = tensor(mask[i:i + step])
                    x = x[m.to(device=x.device, dtype=torch.bool)]
                yield x.reshape(-1, d).to(torch.float64)

        total, count = torch.zeros(d, dtype=torch.float64), 0
        for x in blocks():
            total += x.sum(0).cpu()
            count += x.shape[0]
        if count == 0:
            raise ValueError("features: no real rows or frames to measure the standardisation on")
        mean = total / count
        sq = torch.zeros(d, dtype=torch.float64)
        for x in blocks():
            sq += (x - mean.to(x.device)).square().sum(0).cpu()
        self.mean.copy_(mean.to(self.mean.dtype))
        self.std.copy_((sq / count).sqrt().clamp_min(1e-6).to(self.std.dtype))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def _check_frames(x: Any, mask: Any) -> bool:
    """The arguments of :func:`masked_mean` / :func:`masked_max` checked: ``x`` a floating ``[N, F, D]``
    tensor, ``mask`` None or a bool ``[N, F]`` tensor. True when ``mask`` is None (every frame real)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x: expected a floating tensor, got {short_repr(x)}")
    if x.ndim != 3:
        raise ValueError(f"x: expected shape [N, F, D], got {tuple(x.shape)}")
    if x.shape[1] == 0 and x.shape[0] > 0:
        raise ValueError(f"x: {x.shape[0]} clips of no frame (shape {list(x.shape)}): nothing to pool")
    if mask is None:
        return True
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask: expected a bool tensor (True = real frame), got {short_repr(mask)}")
    if mask.shape != x.shape[:2]:
        raise ValueError(f"mask: expected shape {list(x.shape[:2])} for x of shape {list(x.shape)}, "
                         f"got {list(mask.shape)}")
    return False


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the frame axis of the real frames (CLIP4Clip meanP with padding).

    Padded values are replaced (``masked_fill``), never multiplied by zero, so NaN or
    huge values in padded frames cannot leak in. A row without real frames gives 0.

    Shape:
        - x: ``[N, F, D]``; mask: ``[N, F]`` bool, True = real frame
        - output: ``[N, D]``

    >>> x = torch.tensor([[[1.0], [3.0], [1e30]]])
    >>> masked_mean(x, torch.tensor([[True, True, False]]))
    tensor([[2.]])
    """
    if _check_frames(x, mask):
        return x.mean(1)
    total = x.masked_fill(~mask[..., None], 0.0).sum(1)
    return total / mask.sum(1, keepdim=True).clamp_min(1).to(x.dtype)


def masked_max(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Per-channel maximum over the frame axis of the real frames (the CrossCLR release's
    ``MaxPool``, ``models/model.py`` l. 653-656, which takes it over every row, padding included).

    Padded values are replaced by ``-inf`` (``masked_fill``), so nothing in a padded frame can
    win. A row without real frames gives 0 (as :func:`masked_mean`).

    Shape:
        - x: ``[N, F, D]``; mask: ``[N, F]`` bool, True = real frame
        - output: ``[N, D]``

    >>> x = torch.tensor([[[1.0, 5.0], [3.0, -2.0], [1e30, 1e30]]])
    >>> masked_max(x, torch.tensor([[True, True, False]]))
    tensor([[3., 5.]])
    """
    if _check_frames(x, mask):
        return x.amax(1)
    out = x.masked_fill(~mask[..., None], float("-inf")).amax(1)
    return out.masked_fill(~mask.any(1, keepdim=True), 0.0)


def position_table(length: int, width: int) -> nn.Parameter:
    """A learned position embedding ``[length, width]``, initialised N(0, 0.02^2)."""
    table = nn.Parameter(torch.zeros(length, width))
    nn.init.normal_(table, std=0.02)
    return table


def transformer_encoder(width: int, heads: int, layers: int, dropout: float) -> nn.TransformerEncoder:
    """Pre-norm GELU transformer encoder (feed-forward 4x ``width``, batch first): the frame
    encoder of ``transformer`` towers and the global (clips -> video) encoder of the hierarchy."""
    layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=dropout,
                                       activation="gelu", batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class Tower(nn.Module):
    """One modality's head: standardise -> (pool frames) -> project.

    ``mask`` (bool ``[N, F]``, True = real frame) makes padded frames invisible:
    they are zeroed before anything else, excluded from the meanP average and from
    the transformer's attention (``src_key_padding_mask``) and pooling.

    Shape:
        - input: ``[N, Din]`` or ``[N, F, Din]``; mask: ``[N, F]``
        - output: ``[N, out_dim]`` (not normalised)
    """

    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        check_spec(spec)
        self.spec = spec
        self.standardize = Standardize(spec.in_dim)
        self.drop = nn.Dropout(spec.dropout)
        if spec.kind == "mlp":
            layers: list[nn.Module] = []
            d = spec.in_dim
            for _ in range(spec.depth):
                layers += [nn.Linear(d, spec.width), nn.GELU(), nn.Dropout(spec.dropout)]
                d = spec.width
            layers.append(nn.Linear(d, spec.out_dim))
            self.net = nn.Sequential(*layers)
        elif spec.kind == "transformer" and spec.block == "release":  # CrossCLR release models/model.py l. 471-516
            self.input_norm = CootLayerNorm(spec.in_dim)
            self.inp = nn.Sequential(nn.Linear(spec.in_dim, spec.hidden), nn.GELU())
            self.register_buffer("pos", sinusoid_table(spec.max_frames, spec.hidden), persistent=False)
            self.encoder = ReleaseEncoder(spec.hidden, spec.heads, spec.layers, spec.dropout)
            self.net = nn.Identity()
        elif spec.kind == "transformer":
            self.inp = nn.Linear(spec.in_dim, spec.hidden)
            self.pos = position_table(spec.max_frames, spec.hidden)
            self.encoder = transformer_encoder(spec.hidden, spec.heads, spec.layers, spec.dropout)
            self.net = nn.Linear(spec.hidden, spec.out_dim)
        elif spec.kind == "identity":  # zero-shot: the (frame-averaged) features are the embedding
            self.net = nn.Identity()
        else:  # linear, meanp
            self.net = nn.Linear(spec.in_dim, spec.out_dim)
        if spec.kind == "transformer" and spec.pooling == "atn":
            self.pool = AttentionPool(spec.hidden, spec.pool_hidden, spec.pool_heads, spec.dropout)
        if spec.kind == "transformer" and spec.block == "release":
            init_release(self)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.ndim == 2:
            mask = None  # one vector per row: nothing to pad
        elif mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)
            # A row with no real frame (an expert missing for that video; the fusion head
            # discards its output) attends to its zeros, so no softmax is over -inf only.
            mask = mask | ~mask.any(1, keepdim=True)
        x = self.standardize(x)
        if self.spec.kind == "transformer":
            if x.ndim == 2:
                x = x[:, None, :]
            if x.shape[1] > self.spec.max_frames:
                raise ValueError(f"features: {x.shape[1]} frames, the model supports at most "
                                 f"{self.spec.max_frames}")
            pad = None if mask is None else ~mask
            if self.spec.block == "release":  # input norm -> Linear + GELU -> sin/cos (+ dropout) -> encoder
                h = self.encoder(self.drop(self.inp(self.input_norm(x)) + self.pos[: x.shape[1]]), pad)
            else:
                h = self.encoder(self.inp(self.drop(x)) + self.pos[: x.shape[1]], src_key_padding_mask=pad)
            if self.spec.pooling == "atn":
                pooled = self.pool(h, mask)
            elif self.spec.pooling == "max":
                pooled = masked_max(h, mask)
            else:
                pooled = masked_mean(h, mask)
            return self.net(pooled)
        if x.ndim == 3:  # meanP (and frame-averaged input for linear/mlp)
            x = masked_mean(x, mask)
        return self.net(self.drop(x))
