"""CLIP4Clip (Luo et al. 2022): a trainable CLIP encoder as the two towers of a :class:`TwoTower`.

``model.kind: clip4clip`` with ``model.encoder: hf:DIR`` (a ``transformers`` ``CLIPModel`` folder): the
vision tower runs CLIP's image encoder on each sampled frame (uint8 frames, normalised here as
``CLIPImageProcessor`` does for frames already at the model's size: ``x / 255``, then ``(x - mean) /
std``), the text tower CLIP's text encoder on the caption's token ids (``-1`` = padding). Both are
trained by the loop of :mod:`xmodal.training.loop`; every loss works on top, since the towers output
embeddings.

A ``SiglipModel`` folder (Zhai et al. 2023) gives the towers the same way: its image and text
transformers with their own pooling heads (the attention-pooling head, the last token's linear head)
in place of CLIP's projections, exactly what its ``get_image_features`` / ``get_text_features`` return.
Only the towers: the loss is the config's (SigLIP's sigmoid loss is not part of this). Two differences
from SigLIP's own processor: a frame store's frames are centre-cropped squares (the processor resizes the
whole image to a square), and the captions are padded to ``data.max_words`` tokens (SigLIP was trained
padded to ``max_position_embeddings``; set ``data.max_words`` to that to match).

Similarity headers (CLIP4Clip Sec. 3.3, ``modules/modeling.py`` ``_loose_similarity``):
    - ``meanP``: each frame embedding L2-normalised, then the masked mean over the real frames
      (``_mean_pooling_for_similarity_visual``); the loss normalises the mean again.
    - ``seqTransf``: frame position embeddings added, a temporal transformer over the frames (padded
      frames masked out by an additive ``-1e6``), a residual to the frame embeddings, then as meanP.
      Initialised as CLIP4Clip does: the position table is CLIP's text position embedding, the
      blocks are the first ``temporal_layers`` blocks of CLIP's text transformer (their layer norms
      with CLIP4Clip's ``eps`` 1e-12, ``modules/until_module.py``), so they need CLIP's text width
      equal to its projection width (ViT-B/32 and B/16: 512).
    - ``tightTransf`` (the tight type, ``_cross_similarity``) is refused (:data:`TIGHT_REFUSED`): it scores
      pairs with a cross transformer instead of embedding each side, so nothing of the loop, the test-time
      normalisers, the index or serve could read it.

Frame sampling (``frame_pos``, CLIP4Clip's ``slice_framepos``): a video with more real frames than
``max_frames`` keeps the first (``head``), the last (``tail``) or ``np.linspace(0, n - 1, max_frames)``
of them (``uniform``), see :func:`frame_positions`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from xmodal._validate import as_tensor, choice, integer, short_repr
from xmodal.models.towers import masked_mean
from xmodal.models.two_tower import TwoTower

SIM_HEADERS = ("meanP", "seqTransf")
#: ``model_type`` of the folders a clip4clip model starts from -> (model class, config class) in transformers.
FAMILIES = {"clip": ("CLIPModel", "CLIPConfig"), "siglip": ("SiglipModel", "SiglipConfig")}
#: Why CLIP4Clip's third header is refused (one line, said alike by the config check and the library).
TIGHT_REFUSED = ("model.sim_header: tightTransf (CLIP4Clip Sec. 3.3's tight type) is a cross-encoder: a transformer "
                 "over each caption-video pair gives that pair's score (B x B passes a batch, every caption x every "
                 "video at test time) and no embedding of either side, while xmodal's losses, queues, test-time "
                 "normalisers, index and serve read embeddings; it is not offered: use meanP or seqTransf")
FRAME_POS = ("head", "tail", "uniform")
#: CLIP4Clip's TF-style LayerNorm epsilon in its temporal transformer (``modules/until_module.py``).
TEMPORAL_EPS = 1e-12
#: Videos per forward pass when embedding a split (frames are large; the caller's batch is capped).
ENCODE_VIDEOS = 32


def frame_positions(n: int, max_frames: int, frame_pos: str) -> np.ndarray:
    """Which of ``n`` frames a video keeps (CLIP4Clip ``dataloader_msrvtt_retrieval._get_rawvideo``).

    >>> frame_positions(10, 4, "uniform").tolist(), frame_positions(10, 4, "tail").tolist()
    ([0, 3, 6, 9], [6, 7, 8, 9])
    """
    choice(frame_pos, "data.frame_pos", FRAME_POS)
    if n <= max_frames:
        return np.arange(n)
    if frame_pos == "head":
        return np.arange(max_frames)
    if frame_pos == "tail":
        return np.arange(n - max_frames, n)
    return np.linspace(0, n - 1, num=max_frames, dtype=int)


def sample_frames(frames: torch.Tensor, mask: torch.Tensor | None, max_frames: int, frame_pos: str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each video's real frames sampled to at most ``max_frames`` (:func:`frame_positions`), packed
    to the front: ``(frames [N, M, P], mask [N, M])`` with ``M = min(F, max_frames)``."""
    n, f = frames.shape[:2]
    if mask is None:
        mask = torch.ones(n, f, dtype=torch.bool, device=frames.device)
    m = min(f, max_frames)
    index = torch.zeros(n, m, dtype=torch.long)
    out_mask = torch.zeros(n, m, dtype=torch.bool)
    real = mask.cpu()
    counts = real.sum(1)
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)  # each row's real frames first, in order
    for c in torch.unique(counts).tolist():  # the positions kept depend on the real-frame count alone
        rows = torch.nonzero(counts == c).flatten()
        pos = torch.from_numpy(frame_positions(int(c), max_frames, frame_pos))
        index[rows[:, None], torch.arange(len(pos))[None, :]] = order[rows][:, pos]
        out_mask[rows, :len(pos)] = True
    index = index.to(frames.device)
    picked = torch.gather(frames, 1, index[..., None].expand(-1, -1, frames.shape[2]))
    return picked, out_mask.to(frames.device)


@dataclass(frozen=True)
class ClipTowerSpec:
    """What the rest of xmodal reads of a tower (``kind``, ``in_dim``, ``out_dim``, ``tokens``,
    ``max_frames``); ``in_dim`` is a flattened frame ``S * S * 3`` (video) or ``max_words`` (text)."""

    kind: str
    in_dim: int
    out_dim: int
    max_frames: int = 1
    tokens: bool = False


class TemporalHead(nn.Module):
    """CLIP4Clip's seqTransf: positions + transformer blocks + residual (``_loose_similarity``).

    Shape:
        - x: ``[N, M, D]`` frame embeddings; mask: ``[N, M]`` bool
        - output: ``[N, M, D]``
    """

    def __init__(self, text_model: nn.Module, layers: int) -> None:
        super().__init__()
        emb = text_model.embeddings.position_embedding
        self.position = nn.Embedding(emb.num_embeddings, emb.embedding_dim)
        self.position.weight.data.copy_(emb.weight.data)
        self.blocks = nn.ModuleList(copy.deepcopy(text_model.encoder.layers[i]) for i in range(layers))
        for module in self.blocks.modules():
            if isinstance(module, nn.LayerNorm):
                module.eps = TEMPORAL_EPS

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > self.position.num_embeddings:
            raise ValueError(f"frames: {x.shape[1]} frames, the position table holds {self.position.num_embeddings}")
        h = x + self.position.weight[: x.shape[1]][None]
        additive = (1.0 - mask.to(x.dtype))[:, None, None, :] * -1000000.0
        additive = additive.expand(-1, 1, x.shape[1], -1)
        for block in self.blocks:
            out = block(h, additive)
            h = out[0] if isinstance(out, tuple) else out
        return h + x


class ClipVideoTower(nn.Module):
    """CLIP's image encoder on each sampled frame, then the similarity header (module docstring).

    Shape:
        - frames: ``[N, F, S * S * 3]`` uint8 (RGB, row-major ``S x S x 3``) or float 0-255;
          mask: ``[N, F]`` bool, True = real frame
        - output: ``[N, D]`` (the masked mean of unit frame embeddings)
    """

    def __init__(self, clip: nn.Module, *, sim_header: str, temporal_layers: int, max_frames: int,
                 frame_pos: str, image_mean: list[float], image_std: list[float]) -> None:
        super().__init__()
        self.vision_model = clip.vision_model
        self.visual_projection = _projection(clip, "visual_projection")
        self.size = int(clip.config.vision_config.image_size)
        self.sim_header, self.max_frames, self.frame_pos = sim_header, max_frames, frame_pos
        self.register_buffer("mean", torch.tensor(image_mean, dtype=torch.float32).view(1, 3, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(image_std, dtype=torch.float32).view(1, 3, 1, 1),
                             persistent=False)
        dim = embedding_dim(clip)
        self.temporal = TemporalHead(clip.text_model, temporal_layers) if sim_header == "seqTransf" else None
        self.spec = ClipTowerSpec("clip4clip", self.size * self.size * 3, dim, max_frames)

    def pixels(self, frames: torch.Tensor) -> torch.Tensor:
        """Flattened RGB frames ``[R, S*S*3]`` -> CLIP's normalised input ``[R, 3, S, S]``."""
        x = frames.reshape(-1, self.size, self.size, 3).permute(0, 3, 1, 2).float() / 255.0
        return (x - self.mean) / self.std

    def frame_embeddings(self, frames: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(CLIP image features [N, M, D] of the sampled frames, mask [N, M])``; padded frames 0."""
        frames, mask = sample_frames(frames, mask, self.max_frames, self.frame_pos)
        real = frames[mask]
        dtype = self.vision_model.embeddings.patch_embedding.weight.dtype
        pooled = self.vision_model(pixel_values=self.pixels(real).to(dtype)).pooler_output
        emb = self.visual_projection(pooled)
        out = emb.new_zeros(*mask.shape, emb.shape[-1])
        return out.masked_scatter(mask[..., None], emb), mask

    def forward(self, frames: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if frames.ndim != 3 or frames.shape[-1] != self.spec.in_dim:
            raise ValueError(f"frames: expected [N, F, {self.spec.in_dim}] ({self.size}x{self.size} RGB frames, "
                             f"flattened), got {tuple(frames.shape)}")
        x, mask = self.frame_embeddings(frames, mask)
        if self.temporal is not None:
            x = self.temporal(x, mask)
        return masked_mean(F.normalize(x, dim=-1).masked_fill(~mask[..., None], 0.0), mask)


class ClipTextTower(nn.Module):
    """CLIP's text encoder on token ids (``-1`` = padding): the projected end-of-text feature.

    Shape:
        - ids: ``[N, L]`` integer; output: ``[N, D]``
    """

    def __init__(self, clip: nn.Module, *, max_words: int, pad_id: int) -> None:
        super().__init__()
        self.text_model = clip.text_model
        self.text_projection = _projection(clip, "text_projection")
        self.pad_id = int(pad_id)
        self.spec = ClipTowerSpec("clip4clip", max_words, embedding_dim(clip))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if ids.ndim != 2 or ids.is_floating_point():
            raise ValueError(f"ids: expected integer token ids [N, L], got {short_repr(ids)}")
        real = ids >= 0
        tokens = ids.long().masked_fill(~real, self.pad_id)
        out = self.text_model(input_ids=tokens, attention_mask=real.long())
        return self.text_projection(out.pooler_output)


@dataclass(frozen=True)
class Clip4ClipSpec:
    """Everything a :class:`Clip4Clip` is rebuilt from (plain values, stored with the weights)."""

    clip_config: dict
    sim_header: str = "meanP"
    temporal_layers: int = 4
    max_frames: int = 12
    frame_pos: str = "head"
    max_words: int = 32
    image_mean: tuple = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple = (0.26862954, 0.26130258, 0.27577711)
    pad_id: int = 0
    encoder: str = ""


def check_clip4clip_spec(spec: Clip4ClipSpec) -> Clip4ClipSpec:
    """Validate a :class:`Clip4ClipSpec`; ``ValueError`` naming the field."""
    if spec.sim_header == "tightTransf":
        raise ValueError(TIGHT_REFUSED)
    choice(spec.sim_header, "model.sim_header", SIM_HEADERS)
    choice(spec.frame_pos, "data.frame_pos", FRAME_POS)
    integer(spec.max_frames, "data.max_frames", minimum=1, maximum=4096)
    integer(spec.max_words, "data.max_words", minimum=2, maximum=4096)
    integer(spec.temporal_layers, "model.temporal_layers", minimum=0, maximum=64)
    if not isinstance(spec.clip_config, dict):
        raise ValueError(f"clip_config: expected a mapping, got {short_repr(spec.clip_config)}")
    return spec


class Clip4Clip(TwoTower):
    """A CLIPModel's towers trained end to end (module docstring); the :class:`TwoTower` API holds.

    ``encode_video`` takes frames ``[N, F, S*S*3]`` (uint8) with a mask, ``encode_text`` token ids
    ``[N, L]`` (``-1`` = padding, :func:`tokenize`).
    """

    def __init__(self, spec: Clip4ClipSpec, temperature: float = 0.05, clip: nn.Module | None = None) -> None:
        from xmodal.retrieval.testtime import TestTime

        nn.Module.__init__(self)
        check_clip4clip_spec(spec)
        if clip is None:
            clip = new_model(spec.clip_config)
        text_width = clip.text_model.config.hidden_size
        if spec.sim_header == "seqTransf":
            if text_width != embedding_dim(clip):
                raise ValueError(f"model.sim_header: seqTransf reuses CLIP's text blocks, which need the text width "
                                 f"({text_width}) equal to the projection width ({embedding_dim(clip)})")
            if spec.temporal_layers > len(clip.text_model.encoder.layers):
                raise ValueError(f"model.temporal_layers: CLIP's text transformer has "
                                 f"{len(clip.text_model.encoder.layers)} blocks, got {spec.temporal_layers}")
            if spec.max_frames > clip.text_model.config.max_position_embeddings:
                raise ValueError(f"data.max_frames: the position table (CLIP's text positions) holds "
                                 f"{clip.text_model.config.max_position_embeddings}, got {spec.max_frames}")
        self.spec = spec
        self.video_tower = ClipVideoTower(clip, sim_header=spec.sim_header, temporal_layers=spec.temporal_layers,
                                          max_frames=spec.max_frames, frame_pos=spec.frame_pos,
                                          image_mean=list(spec.image_mean), image_std=list(spec.image_std))
        self.text_tower = ClipTextTower(clip, max_words=spec.max_words, pad_id=spec.pad_id)
        self.register_buffer("_temperature", torch.tensor(float(temperature)))
        self.test_time = TestTime(temperature=float(temperature))

    @property
    def dim(self) -> int:
        return self.video_tower.spec.out_dim

    @property
    def experts(self) -> list[str]:
        return []

    def encoder_parameters(self) -> list[nn.Parameter]:
        """CLIP's own parameters (at ``optim.encoder_lr_scale`` x lr); the rest is the temporal head."""
        own = {id(p) for p in self.video_tower.temporal.parameters()} if self.video_tower.temporal else set()
        return [p for p in self.parameters() if id(p) not in own]

    def freeze(self, layers: int) -> None:
        """CLIP4Clip's ``freeze_layer_num`` (``main_task_retrieval.py``): ``layers >= 0`` freezes the
        embeddings and the first ``layers`` blocks of both encoders; final norms, projections and the
        temporal head stay trained. ``-1``: nothing frozen."""
        if layers < 0:
            return
        for prefix, model in (("video_tower.vision_model.", self.video_tower.vision_model),
                              ("text_tower.text_model.", self.text_tower.text_model)):
            for name, p in model.named_parameters():
                if name.startswith(("post_layernorm.", "final_layer_norm.", "head.")):  # head.: SigLIP's pooling
                    continue
                if name.startswith("encoder.layers.") and int(name.split(".")[2]) >= layers:
                    continue
                p.requires_grad_(False)

    def _prepare_video(self, features: Any, mask: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = as_tensor(features, "features")
        want = self.video_tower.spec.in_dim
        if x.ndim != 3 or x.shape[-1] != want:
            raise ValueError(f"features: expected frames [N, F, {want}] (uint8 RGB, flattened), got {tuple(x.shape)}")
        p = self._temperature
        m = None
        if mask is not None:
            m = as_tensor(mask, "mask")
            if m.dtype != torch.bool or tuple(m.shape) != tuple(x.shape[:2]):
                raise ValueError(f"mask: expected bool {list(x.shape[:2])}, got {m.dtype} {tuple(m.shape)}")
            if not bool(m.any(1).all()):
                raise ValueError("mask: some videos have no real frame; every video needs at least one")
            m = m.to(p.device)
        return x.to(p.device), m

    def _prepare_text(self, features: Any, mask: Any) -> tuple[torch.Tensor, None]:
        x = as_tensor(features, "features")
        if x.ndim != 2 or x.is_floating_point() or x.dtype == torch.bool:
            raise ValueError(f"features: expected integer token ids [N, L] (-1 = padding), got {x.dtype} "
                             f"{tuple(x.shape)}")
        return x.to(self._temperature.device), None

    def encode_video(self, features: Any, mask: Any = None, *, batch_size: int = 8192,
                     unit: bool = True) -> torch.Tensor:
        return super().encode_video(features, mask, batch_size=min(batch_size, ENCODE_VIDEOS), unit=unit)

    def encode_text(self, features: Any, text_mask: Any = None, batch_size: int = 8192, *,
                    unit: bool = True) -> torch.Tensor:
        return super().encode_text(features, None, batch_size=min(batch_size, 8 * ENCODE_VIDEOS), unit=unit)

    def fit_standardization(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to fit: CLIP's processor normalises the pixels."""

    def architecture(self) -> dict:
        return {"clip4clip": asdict(self.spec)}

    @classmethod
    def from_architecture(cls, arch: dict) -> Clip4Clip:
        rec = arch.get("clip4clip") if isinstance(arch, dict) else None
        if not isinstance(rec, dict):
            raise ValueError(f"architecture['clip4clip']: expected a mapping, got {short_repr(rec)}")
        try:
            spec = Clip4ClipSpec(**{k: tuple(v) if k in ("image_mean", "image_std") else v for k, v in rec.items()})
        except TypeError as exc:
            raise ValueError(f"architecture['clip4clip']: {exc}") from None
        return cls(spec)

    def clip_model(self) -> nn.Module:
        """A ``transformers`` CLIPModel (SiglipModel) holding the trained encoders (``logit_scale`` = 1 /
        temperature; a SigLIP's ``logit_bias`` as its config initialises it: the towers are what was trained)."""
        clip = new_model(self.spec.clip_config)
        clip.vision_model.load_state_dict(self.video_tower.vision_model.state_dict())
        clip.text_model.load_state_dict(self.text_tower.text_model.state_dict())
        for name, tower in (("visual_projection", self.video_tower.visual_projection),
                            ("text_projection", self.text_tower.text_projection)):
            if hasattr(clip, name):
                getattr(clip, name).load_state_dict(tower.state_dict())
        clip.logit_scale.data.fill_(float(np.log(1.0 / self.temperature)))
        return clip


#: The folder inside an ``xmodal export`` of a clip4clip run holding the fine-tuned CLIP (``hf:DIR``).
ENCODER_FOLDER = "encoder"


def save_encoder(model: Clip4Clip, folder: Path) -> Path:
    """The fine-tuned towers as a ``transformers`` ``save_pretrained`` folder with the base model's processor
    (tokenizer and image processor), usable as ``hf:folder``; the temporal head stays in the xmodal export.

    Raises:
        ValueError: the base model's folder (``model.encoder`` of the run), whose processor is copied, is gone.
    """
    from transformers import AutoProcessor

    base = Path(model.spec.encoder[3:]) if model.spec.encoder.startswith("hf:") else None
    if base is None or not (base / "config.json").is_file():
        raise ValueError(f"export: the run's base encoder {model.spec.encoder or '(not recorded)'} is not on this "
                         f"machine; its processor (tokenizer, image settings) goes into the encoder folder")
    folder = Path(folder)
    model.clip_model().save_pretrained(folder)
    AutoProcessor.from_pretrained(str(base), local_files_only=True).save_pretrained(folder)
    return folder


def run_tokenizer(model: Clip4Clip, path: Any = None) -> Any:
    """The CLIP tokenizer of a clip4clip run or export at ``path``: the export's ``encoder/`` folder, else
    the base encoder the run was trained from (``model.encoder``).

    Raises:
        ValueError: neither folder is on this machine.
    """
    from transformers import AutoProcessor

    folders = ([Path(path) / ENCODER_FOLDER] if path is not None else []) + (
        [Path(model.spec.encoder[3:])] if model.spec.encoder.startswith("hf:") else [])
    for folder in folders:
        if (folder / "config.json").is_file():
            return AutoProcessor.from_pretrained(str(folder), local_files_only=True).tokenizer
    raise ValueError(f"run: a clip4clip run tokenises captions with its CLIP's tokenizer; neither "
                     f"{' nor '.join(map(str, folders)) or 'a recorded encoder'} is on this machine")


def tokenized_text(model: Any, split: Any, path: Any = None) -> tuple[Any, Any]:
    """``(text input, mask)`` of ``split`` for ``model``: its features as they are, or for a clip4clip model
    its captions as token ids (``S_texts.tsv``)."""
    if not isinstance(model, Clip4Clip):
        return split.text_input()
    if split.captions is None:
        raise ValueError(f"{split.name or 'split'}: a clip4clip run reads the captions (S_texts.tsv); there are none")
    return tokenize(split.captions, run_tokenizer(model, path), model.spec.max_words), None


def plain_config(config: Any) -> dict:
    """A ``transformers`` config as plain JSON values (what a weights-only checkpoint may hold)."""
    return json.loads(config.to_json_string(use_diff=False))


def load_encoder(spec: str) -> tuple[nn.Module, Any]:
    """``(model, processor)`` of ``hf:DIR``: a local CLIPModel or SiglipModel folder (nothing is downloaded).

    Raises:
        ValueError: not ``hf:DIR``, no such folder, or neither a CLIP nor a SigLIP model.
    """
    if not isinstance(spec, str) or not spec.startswith("hf:"):
        raise ValueError(f"model.encoder: expected hf:DIR (a local transformers CLIPModel or SiglipModel folder), "
                         f"got {spec!r}")
    folder = Path(spec[3:]).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"model.encoder: {folder} is not a transformers model folder (no config.json)")
    import transformers

    try:
        model_type = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True).model_type
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"model.encoder: {folder}: unreadable config.json ({str(exc).splitlines()[0][:200]})") \
            from None
    if model_type not in FAMILIES:
        raise ValueError(f"model.encoder: {folder} holds a {str(model_type)[:40]!r} model; clip4clip fine-tunes "
                         f"a CLIPModel or a SiglipModel")
    try:
        clip = getattr(transformers, FAMILIES[model_type][0]).from_pretrained(str(folder), local_files_only=True)
        processor = transformers.AutoProcessor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"model.encoder: {folder} is not a {FAMILIES[model_type][0]} folder "
                         f"({str(exc).splitlines()[0][:200]})") from None
    return clip.float(), processor


def new_model(config: dict) -> nn.Module:
    """A CLIPModel or SiglipModel (by the config's ``model_type``) built from a plain config, random weights."""
    import transformers

    family = config.get("model_type", "clip") if isinstance(config, dict) else None
    if family not in FAMILIES:
        raise ValueError(f"clip_config: model_type {short_repr(family)}, expected one of {', '.join(FAMILIES)}")
    model_cls, config_cls = (getattr(transformers, name) for name in FAMILIES[family])
    return model_cls(config_cls.from_dict(config))


def _projection(clip: nn.Module, name: str) -> nn.Module:
    """CLIP's linear projection ``name``; a SigLIP has none (its pooling heads sit inside the towers)."""
    layer = getattr(clip, name, None)
    return nn.Identity() if layer is None else layer


def config_dim(config: dict) -> int:
    """:func:`embedding_dim` from a plain config (an export's ``clip_config``): CLIP's ``projection_dim``, a
    SigLIP's vision ``hidden_size``."""
    if config.get("model_type", "clip") == "siglip":
        return int(config["vision_config"]["hidden_size"])
    return int(config["projection_dim"])


def embedding_dim(clip: nn.Module) -> int:
    """The towers' embedding size: CLIP's projection width, a SigLIP's vision width (what ``get_image_features``
    returns; its text head maps to the same size)."""
    if hasattr(clip, "visual_projection"):
        return int(clip.visual_projection.out_features)
    return int(clip.config.vision_config.hidden_size)


def build_clip4clip(encoder: str, *, sim_header: str = "meanP", temporal_layers: int = 4, max_frames: int = 12,
                    frame_pos: str = "head", max_words: int = 32, freeze_layers: int = -1,
                    gradient_checkpointing: bool = False, temperature: float = 0.05) -> tuple[Clip4Clip, Any]:
    """``(model, processor)``: :class:`Clip4Clip` initialised from the CLIPModel at ``encoder`` (``hf:DIR``)."""
    if sim_header == "tightTransf":  # before the weights load
        raise ValueError(TIGHT_REFUSED)
    clip, processor = load_encoder(encoder)
    positions = int(clip.text_model.config.max_position_embeddings)
    if isinstance(max_words, int) and max_words > positions:  # else transformers fails mid-epoch, unhelpfully
        raise ValueError(f"data.max_words: {max_words} tokens, but the text tower of model.encoder holds "
                         f"{positions} positions (set data.max_words={positions} or fewer)")
    ip = processor.image_processor
    tok = processor.tokenizer
    spec = Clip4ClipSpec(clip_config=plain_config(clip.config), sim_header=sim_header,
                         temporal_layers=temporal_layers, max_frames=max_frames, frame_pos=frame_pos,
                         max_words=max_words, image_mean=tuple(float(v) for v in ip.image_mean),
                         image_std=tuple(float(v) for v in ip.image_std),
                         pad_id=int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id),
                         encoder=encoder)
    if gradient_checkpointing:  # transformers' own switch: each encoder block recomputed in backward
        if hasattr(clip, "activation_checkpointing_enable"):  # transformers >= 5 (the former name is deprecated)
            clip.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            clip.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = Clip4Clip(spec, temperature=temperature, clip=clip)
    model.freeze(freeze_layers)
    return model, processor


def tokenize(captions: list[str], tokenizer: Any, max_words: int) -> np.ndarray:
    """Token ids ``[T, max_words]`` int64, ``-1`` = padding: start token, the caption's tokens cut to
    ``max_words - 2``, end token (CLIP4Clip ``_get_text``: ``words[:max_words - 1] + [SEP]``)."""
    enc = tokenizer(list(captions), max_length=max_words, truncation=True, padding="max_length",
                    return_attention_mask=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    ids[np.asarray(enc["attention_mask"]) == 0] = -1
    return ids
