"""The loop's wiring for ``model.kind: clip4clip`` (an encoder trained end to end,
:mod:`xmodal.models.clip4clip`): the model from the config, captions tokenised into the splits,
two learning rates (CLIP4Clip's ``coef_lr``) and the forward precision."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from xmodal.config import Config


def is_finetune(cfg: Config) -> bool:
    return cfg.model.kind == "clip4clip"


def build(cfg: Config):
    """``(Clip4Clip, CLIPProcessor)`` from ``model.encoder`` and the clip4clip keys."""
    from xmodal.models.clip4clip import build_clip4clip

    m, d = cfg.model, cfg.data
    return build_clip4clip(m.encoder, sim_header=m.sim_header, temporal_layers=m.temporal_layers,
                           max_frames=d.max_frames, frame_pos=d.frame_pos, max_words=d.max_words,
                           freeze_layers=m.freeze_layers, gradient_checkpointing=m.gradient_checkpointing,
                           temperature=cfg.loss.temperature or 0.05)


def tokenized(splits: dict, tokenizer: Any, max_words: int) -> dict:
    """Each split with its captions as CLIP token ids ``[T, max_words]`` (``-1`` = padding) in place of
    its text features, and its video features checked to be frames (a frame store, ``encode frames``).

    Raises:
        ValueError: a split without captions (``S_texts.tsv``) or without uint8 frames.
    """
    from xmodal.models.clip4clip import tokenize

    out = {}
    for role, split in splits.items():
        if split.captions is None:
            raise ValueError(f"model.kind: clip4clip reads the captions themselves; the {role} split "
                             f"{split.name or ''} has none ({role}_texts.tsv with a caption column)")
        if split.video.dtype.kind != "u":
            raise ValueError(f"model.kind: clip4clip trains on frames; the {role} split's video features are "
                             f"{split.video.dtype} (make a frame store with 'xmodal encode frames' and import it)")
        out[role] = dataclasses.replace(split, text=tokenize(split.captions, tokenizer, max_words), text_mask=None)
    return out


def param_groups(cfg: Config, model: torch.nn.Module, extra: list[torch.nn.Parameter]) -> list[dict]:
    """Optimiser groups: the head (temporal transformer) and the loss at ``optim.lr``; CLIP's own
    parameters at ``lr x optim.encoder_lr_scale`` (CLIP4Clip ``main_task_retrieval.prep_optimizer``).
    Each group carries ``lr_scale``; frozen parameters are left out."""
    encoder = [p for p in model.encoder_parameters() if p.requires_grad] if hasattr(model, "encoder_parameters") \
        else []
    ids = {id(p) for p in encoder}
    head = [p for p in list(model.parameters()) + list(extra) if p.requires_grad and id(p) not in ids]
    groups = [{"params": head, "lr_scale": 1.0}]
    if encoder:
        groups.append({"params": encoder, "lr_scale": float(cfg.optim.encoder_lr_scale)})
    return [g for g in groups if g["params"]]


def autocast(cfg: Config, device: torch.device):
    """The forward's precision: ``train.precision`` bf16 / fp16 autocast on the training device; fp32
    keeps the former rule (``train.amp``: bfloat16 on a GPU only)."""
    p = cfg.train.precision
    if p == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if p == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    if cfg.train.amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def grad_scaler(cfg: Config, device: torch.device):
    """A gradient scaler for ``train.precision: fp16`` (float16 gradients underflow without one), else None."""
    if cfg.train.precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def splits_for(model: Any, splits: dict, path: Any = None) -> dict:
    """``splits`` as ``model`` reads them: unchanged, or for a clip4clip model (a run or export at ``path``)
    with its captions tokenised by the run's CLIP tokenizer (:func:`tokenized`), as the trainer fed them.

    Raises:
        ValueError: as :func:`tokenized`, or the run's tokenizer is not on this machine.
    """
    from xmodal.models.clip4clip import Clip4Clip, run_tokenizer

    if not isinstance(model, Clip4Clip) or all(np.asarray(s.text).dtype.kind in "iu" for s in splits.values()):
        return splits
    return tokenized(splits, run_tokenizer(model, path), model.spec.max_words)
