"""Two-tower heads over pre-extracted features, and checkpoint loading.

A :class:`TwoTower` maps frozen video/image features ``[N, Dv]`` (or ``[N, F, Dv]``
with a frame axis) and text features ``[N, Dt]`` into a joint ``D``-dimensional
space where retrieval is a dot product of L2-normalised embeddings.

Towers (``kind``):
    - ``linear``: one linear map (the frozen-expert baseline of CrossCLR / TS++).
    - ``mlp``: ``depth`` hidden layers of ``width`` units, GELU, dropout, then linear.
    - ``meanp``: CLIP4Clip "meanP": mean over the frame axis, then a linear map.
    - ``transformer``: Cali-NCE style temporal pooling, a small transformer encoder
      (2 layers, 512 hidden, 8 heads) over frames with a learned position
      embedding, mean-pooled, then a linear map.
Features without a frame axis pass through ``meanp``/``transformer`` as one frame;
features with a frame axis given to ``linear``/``mlp`` are mean-pooled first.

Input standardisation (per-feature mean/std measured on the training split) is a
buffer of each tower, so it is saved and restored with the weights.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from xmodal._validate import as_tensor, choice, check_finite
from xmodal.runs import atomic_save, load_checkpoint  # noqa: F401  (atomic_save: former home)
from xmodal.testtime import TestTime

TOWER_KINDS = ("linear", "mlp", "meanp", "transformer")
CHECKPOINT_NAMES = ("model.pt", "checkpoint.pt")


@dataclass(frozen=True)
class TowerSpec:
    """Architecture of one tower (plain values, stored in checkpoints)."""

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


class Standardize(nn.Module):
    """``(x - mean) / std`` with statistics kept as buffers (saved with the model)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))

    @torch.no_grad()
    def fit(self, features: torch.Tensor) -> "Standardize":
        """Set statistics from training features ``[N, D]`` or ``[N, F, D]`` (all rows/frames)."""
        flat = features.reshape(-1, features.shape[-1]).to(torch.float64)
        self.mean.copy_(flat.mean(0).to(self.mean.dtype))
        self.std.copy_(flat.std(0, unbiased=False).clamp_min(1e-6).to(self.std.dtype))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Tower(nn.Module):
    """One modality's head: standardise -> (pool frames) -> project.

    Shape:
        - input: ``[N, Din]`` or ``[N, F, Din]``
        - output: ``[N, out_dim]`` (not normalised)
    """

    def __init__(self, spec: TowerSpec) -> None:
        super().__init__()
        choice(spec.kind, "model.kind", TOWER_KINDS)
        if spec.in_dim <= 0 or spec.out_dim <= 0:
            raise ValueError(f"model: in_dim and out_dim must be positive, got {spec.in_dim}, {spec.out_dim}")
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
        elif spec.kind == "transformer":
            self.inp = nn.Linear(spec.in_dim, spec.hidden)
            self.pos = nn.Parameter(torch.zeros(spec.max_frames, spec.hidden))
            nn.init.normal_(self.pos, std=0.02)
            layer = nn.TransformerEncoderLayer(spec.hidden, spec.heads, dim_feedforward=4 * spec.hidden,
                                               dropout=spec.dropout, activation="gelu", batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, spec.layers, enable_nested_tensor=False)
            self.net = nn.Linear(spec.hidden, spec.out_dim)
        else:  # linear, meanp
            self.net = nn.Linear(spec.in_dim, spec.out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.standardize(x)
        if self.spec.kind == "transformer":
            if x.ndim == 2:
                x = x[:, None, :]
            if x.shape[1] > self.spec.max_frames:
                raise ValueError(f"features: {x.shape[1]} frames, the model supports at most "
                                 f"{self.spec.max_frames}")
            h = self.encoder(self.inp(self.drop(x)) + self.pos[: x.shape[1]])
            return self.net(h.mean(1))
        if x.ndim == 3:  # meanP (and frame-averaged input for linear/mlp)
            x = x.mean(1)
        return self.net(self.drop(x))


class TwoTower(nn.Module):
    """Video and text towers into one joint space, plus test-time metadata.

    Args:
        video: :class:`TowerSpec` of the video/image tower.
        text: :class:`TowerSpec` of the text tower.
        temperature: the softmax temperature used at test time (e.g. by Sinkhorn
            test-time biases); the trainer sets it from the loss after training.

    Attributes:
        test_time: the :class:`~xmodal.testtime.TestTime` of a trained run: the
            normalisers fitted at the end of training and the one selected on
            validation (assigning a dict converts it).
    """

    def __init__(self, video: TowerSpec, text: TowerSpec, temperature: float = 0.05) -> None:
        super().__init__()
        if video.out_dim != text.out_dim:
            raise ValueError(f"model: video and text out_dim differ ({video.out_dim} vs {text.out_dim})")
        self.video_tower = Tower(video)
        self.text_tower = Tower(text)
        self.register_buffer("_temperature", torch.tensor(float(temperature)))
        self.test_time = TestTime(temperature=float(temperature))

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

    def forward_video(self, features: torch.Tensor) -> torch.Tensor:
        """Unnormalised video embeddings (trainer path: no validation, keeps grad)."""
        return self.video_tower(features)

    def forward_text(self, features: torch.Tensor) -> torch.Tensor:
        return self.text_tower(features)

    def encode_video(self, features: Any, batch_size: int = 8192) -> torch.Tensor:
        """L2-normalised video embeddings (eval mode, no grad).

        Shape:
            - features: ``[N, Dv]`` or ``[N, F, Dv]`` (numpy or torch)
            - output: ``[N, D]`` on the model's device
        """
        return self._encode(self._prepare(features, "features", self.video_tower), self.video_tower, batch_size)

    def encode_text(self, features: Any, batch_size: int = 8192) -> torch.Tensor:
        """L2-normalised text embeddings. Shape: ``[N, Dt]`` -> ``[N, D]``."""
        return self._encode(self._prepare(features, "features", self.text_tower), self.text_tower, batch_size)

    @torch.no_grad()
    def _encode(self, x: torch.Tensor, tower: Tower, batch_size: int) -> torch.Tensor:
        was_training = self.training
        self.eval()
        try:
            out = [F.normalize(tower(x[i:i + batch_size]).float(), dim=-1) for i in range(0, len(x), batch_size)]
        finally:
            self.train(was_training)
        return torch.cat(out) if out else x.new_zeros(0, tower.spec.out_dim)

    def similarity(self, text_features: Any, video_features: Any, normalizer: str = "selected", *,
                   direction: str = "t2v", video_mask: Any = None, batch_size: int = 8192) -> torch.Tensor:
        """Retrieval scores of raw input features under the run's test-time normaliser.

        Raw features -> the run's heads -> cosine scores -> the stored normaliser of
        :attr:`test_time` (fitted once at the end of training, never refitted; bank-based
        gallery biases are computed against this gallery, see :mod:`xmodal.testtime`).

        Args:
            text_features: ``[T, Dt]``.
            video_features: ``[V, Dv]`` or ``[V, F, Dv]``.
            normalizer: ``"selected"`` (chosen on val when training), ``"none"`` or a fitted name.
            direction: ``"t2v"`` (texts query videos, ``[T, V]``) or ``"v2t"`` (``[V, T]``;
                the transpose for ``none``/``dn``, its own gallery biases otherwise).
            video_mask: optional bool ``[V, F]`` (True = real frame).

        Shape:
            ``[T, V]`` (``direction="t2v"``) or ``[V, T]``, on the model's device.

        >>> m = build_model(video_dim=6, text_dim=4, dim=3)
        >>> m.similarity(torch.randn(5, 4), torch.randn(2, 6), normalizer="none").shape
        torch.Size([5, 2])
        """
        text = self.encode_text(text_features, batch_size=batch_size)
        video = (self.encode_video(video_features, batch_size=batch_size) if video_mask is None
                 else self.encode_video(video_features, mask=video_mask, batch_size=batch_size))
        return self.test_time.similarity(text, video, normalizer, direction=direction)

    def fit_standardization(self, video: torch.Tensor, text: torch.Tensor) -> None:
        """Measure input mean/std on training features (stored as buffers)."""
        self.video_tower.standardize.fit(video)
        self.text_tower.standardize.fit(text)

    def architecture(self) -> dict:
        return {"video": asdict(self.video_tower.spec), "text": asdict(self.text_tower.spec)}


def build_model(*, video_dim: int, text_dim: int, kind: str = "linear", dim: int = 256, width: int = 1024,
                depth: int = 1, dropout: float = 0.0, layers: int = 2, heads: int = 8, hidden: int = 512,
                text_kind: str | None = None, temperature: float = 0.05) -> TwoTower:
    """A :class:`TwoTower` from explicit keywords.

    ``kind`` sets the video tower; the text tower uses ``text_kind`` (default: the
    same kind, with frame pooling kinds mapped to ``linear`` since texts have no frames).
    """
    choice(kind, "model.kind", TOWER_KINDS)
    if text_kind is None:
        text_kind = "linear" if kind in ("meanp", "transformer") else kind
    choice(text_kind, "model.text_kind", TOWER_KINDS)
    common = dict(out_dim=dim, width=width, depth=depth, dropout=dropout, layers=layers, heads=heads,
                  hidden=hidden)
    return TwoTower(TowerSpec(kind=kind, in_dim=video_dim, **common),
                    TowerSpec(kind=text_kind, in_dim=text_dim, **common), temperature=temperature)


def model_payload(model: TwoTower) -> dict:
    """What a checkpoint stores about the model (plain tensors and dicts)."""
    return {"architecture": model.architecture(), "state_dict": model.state_dict(),
            "test_time": model.test_time.state_dict()}


def model_from_payload(payload: dict) -> TwoTower:
    arch = payload["architecture"]
    model = TwoTower(TowerSpec(**arch["video"]), TowerSpec(**arch["text"]))
    model.load_state_dict(payload["state_dict"])
    model.test_time = TestTime.from_state_dict(payload.get("test_time"))
    model.eval()
    return model


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> TwoTower:
    """Load a model written by ``xmodal train``.

    Args:
        path: a run directory (its ``model.pt``, the selected best model, or else its
            last ``checkpoint.pt``) or a checkpoint file.

    Returns:
        A :class:`TwoTower` in eval mode with ``temperature`` and ``test_time`` set.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: the file is corrupt, truncated, not an xmodal checkpoint, or holds
            Python objects that could run code (refused: loading is weights-only).
    """
    p = Path(path)
    if p.is_dir():
        for name in CHECKPOINT_NAMES:
            if (p / name).is_file():
                p = p / name
                break
        else:
            raise FileNotFoundError(f"path: no {' or '.join(CHECKPOINT_NAMES)} in {path}")
    elif not p.is_file():
        raise FileNotFoundError(f"path: {path} does not exist")
    payload = load_checkpoint(p, map_location=map_location)
    try:
        return model_from_payload(payload["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"path: {p} is not a loadable xmodal model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
