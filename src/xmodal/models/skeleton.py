"""The model an architecture record describes, built on the ``meta`` device with what building it
for real would allocate bounded first (:func:`skeleton`); used by checkpoint loading
(:mod:`xmodal.models.io`) and export folders (:mod:`xmodal.models.export`)."""

from __future__ import annotations

from typing import Any

import torch

from xmodal._validate import short_repr
from xmodal.models.two_tower import TwoTower

#: What a model file may make xmodal allocate beyond the tensors it stores: buffers computed from the
#: architecture's sizes alone (the release block's sine/cosine position tables, ``max_frames x hidden``
#: and ``max_len x dim``). A 61 KB file declaring ``max_frames: 134217728`` asked for 8 GB.
MAX_DERIVED_BYTES = 64 << 20
#: Most video experts an architecture record may declare (each is a tower of modules).
MAX_EXPERTS = 64


def skeleton(arch: Any) -> TwoTower:
    """The model an architecture record describes, built on the ``meta`` device (shapes and dtypes, no
    memory), after bounding what building it for real would allocate beyond the stored weights.

    Raises:
        ValueError: a malformed record, more than :data:`MAX_EXPERTS` experts, or computed buffers
            larger than :data:`MAX_DERIVED_BYTES` (naming the buffer and the sizes behind it).
    """
    cls = _model_class(arch)
    experts = arch.get("experts")
    if isinstance(experts, dict) and len(experts) > MAX_EXPERTS:
        raise ValueError(f"architecture['experts']: {len(experts)} experts, at most {MAX_EXPERTS}")
    with torch.device("meta"):
        model = cls.from_architecture(arch)
    stored = set(model.state_dict())
    derived = {name: b for name, b in model.named_buffers() if name not in stored}
    total = sum(b.numel() * b.element_size() for b in derived.values())
    if total > MAX_DERIVED_BYTES:
        name, big = max(derived.items(), key=lambda kv: kv[1].numel())
        raise ValueError(f"architecture: the sine/cosine position table {name} ({list(big.shape)}: max_frames or "
                         f"max_len x width) and any other computed buffers would take {total / 2 ** 20:,.0f} MiB at "
                         f"load; a model file may ask for at most {MAX_DERIVED_BYTES >> 20} MiB beyond its weights")
    return model


def _model_class(arch: dict) -> type[TwoTower]:
    """The class an architecture record rebuilds: clips inside videos (``hierarchy``) add
    global towers; otherwise a :class:`TwoTower` (several experts + fusion head included)."""
    if not isinstance(arch, dict):
        raise ValueError(f"architecture: expected a mapping, got {short_repr(arch)}")
    if "hierarchy" in arch:
        from xmodal.models.hierarchy import HierarchicalTwoTower

        return HierarchicalTwoTower
    if "clip4clip" in arch:  # a CLIP encoder trained end to end (model.kind: clip4clip)
        from xmodal.models.clip4clip import Clip4Clip

        return Clip4Clip
    return TwoTower


__all__ = ["skeleton", "MAX_DERIVED_BYTES", "MAX_EXPERTS"]
