"""Raw media to features: frozen text / image encoders (:mod:`~xmodal.features.encoders`), video
decoding (:mod:`~xmodal.features.video`) and gallery files by name (:mod:`~xmodal.features.media`).

May import: numpy, torch, the optional encoder / video extras, ``xmodal._validate`` and ``xmodal.runs``;
nothing else of xmodal (training, retrieval, reporting and the CLI build on this package).
"""

from __future__ import annotations

import importlib

#: Public names re-exported lazily (importing the package loads neither PyAV nor an encoder).
_EXPORTS = {
    "encode_text": "encoders", "encode_text_tokens": "encoders", "encode_images": "encoders",
    "encode_videos": "encoders", "iter_encode_videos": "encoders", "register_encoder": "encoders",
    "list_images": "encoders", "list_videos": "encoders", "IMAGE_EXTENSIONS": "encoders",
    "decode_frames": "video", "middle_frame": "video", "VIDEO_EXTENSIONS": "video",
    "find_media": "media", "thumbnail": "media",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"xmodal.features.{_EXPORTS[name]}"), name)
    if name in ("encoders", "video", "media"):
        return importlib.import_module(f"xmodal.features.{name}")
    raise AttributeError(f"module 'xmodal.features' has no attribute {name!r}")
