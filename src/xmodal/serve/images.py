"""Uploaded images of ``xmodal serve`` (an image gallery): what kind of collection an index holds, an
uploaded image checked and embedded as ``xmodal encode images`` encodes a file.

An index is an image gallery when the encoder of its items is recorded at the ``image`` level
(``encode images`` / ``data import --images``: one vector an item, :mod:`xmodal.features.identity`);
frames or clips make a video gallery, and so does an index that records nothing (as before).
An image is received as a video is (:func:`xmodal.serve.uploads.receive`, the file field named
``image``); its header is read before any decoding, and one over :data:`MAX_UPLOAD_IMAGE_PIXELS` or in
another format than :data:`xmodal.features.media.IMAGE_FORMATS` is refused in one line that never
names the server's private folder.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from xmodal.features.media import IMAGE_FORMATS, MAX_VIDEO_PIXELS
from xmodal.serve.uploads import UploadError, _video_in_dim, scrub

#: Largest uploaded image, in pixels (as a video frame's bound).
MAX_UPLOAD_IMAGE_PIXELS = MAX_VIDEO_PIXELS
#: The kinds of gallery, and the file field an upload of each comes in.
FIELDS = {"images": "image", "videos": "video"}


def gallery_kind(meta: Any) -> str:
    """``images`` or ``videos``: what an index's items are, from the encoder its ``meta.json`` records
    for them (level ``image``: images; ``frame`` / ``clip`` or no record: videos).

    >>> gallery_kind({"encoders": {"video": {"spec": "x", "kind": "image", "level": "image"}}})
    'images'
    >>> gallery_kind({})
    'videos'
    """
    enc = meta.get("encoders") if isinstance(meta, dict) else None
    record = enc.get("video") if isinstance(enc, dict) else None
    return "images" if isinstance(record, dict) and record.get("level") == "image" else "videos"


def unavailable_reason(model: Any, image_encoder: str | None, why_none: str | None = None) -> str | None:
    """Why this run cannot embed an uploaded image here (None: it can): Pillow, python-multipart or
    the image encoder missing, a run that fuses experts an image does not give, or an encoder whose
    size is not the run's (:func:`xmodal.serve.uploads.unavailable_reason` for an image)."""
    from xmodal.serve.uploads import unavailable_reason as reason

    return reason(model, image_encoder, why_none, item="image")


def probe_image(path: Path, *, max_pixels: int = MAX_UPLOAD_IMAGE_PIXELS) -> dict:
    """``{"width", "height", "format"}`` of an uploaded image from its header (nothing decoded);
    UploadError 400 (not an image of :data:`IMAGE_FORMATS`) or 413 (over ``max_pixels``)."""
    from PIL import Image

    Image.init()
    with warnings.catch_warnings():  # the bound below is the check; PIL's own warning is noise
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(path, formats=[f for f in IMAGE_FORMATS if f in Image.OPEN]) as im:
                (width, height), fmt = im.size, im.format
        except Image.DecompressionBombError:
            raise UploadError(413, f"upload: an image of more than {max_pixels:,} pixels") from None
        except (OSError, ValueError, SyntaxError) as exc:
            text = scrub(str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__, path)
            raise UploadError(400, f"upload: not a readable image file ({', '.join(IMAGE_FORMATS)}): "
                                   f"{text[:120]}") from None
    if not width * height or width * height > max_pixels:
        raise UploadError(413, f"upload: an image of {width}x{height}, over {max_pixels:,} pixels")
    return {"width": int(width), "height": int(height), "format": fmt}


def embed_image(path: Path, model: Any, *, image_encoder: str, filename: str = "the uploaded file",
                device: str | None = None) -> np.ndarray:
    """The run's embedding ``[D]`` of an image file: the image through ``image_encoder``
    (:func:`xmodal.features.encoders.encode_images`, as ``xmodal encode images`` encodes it), then the
    run's image (video) head on ``[1, Dv]``. Errors name ``filename``, never ``path``; ``device``: where an
    ``hf:`` / ``open_clip:`` encoder runs (None: CUDA when present)."""
    from xmodal.features.encoders import encode_images

    try:
        feats = encode_images([path], model=image_encoder, batch_size=1, progress=False, device=device)
    except (ValueError, OSError) as exc:
        text = scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, path)
        raise UploadError(400, f"upload: {filename}: {text.removeprefix('the uploaded file: ')}"[:240]) from None
    want = _video_in_dim(model)
    if want is not None and feats.shape[1] != want:
        raise UploadError(400, f"upload: the image encoder {image_encoder!r} gives {feats.shape[1]} values an image "
                               f"but this run's image head takes {want} (start serve with the gallery's "
                               f"--image-encoder)")
    return model.encode_video(feats, None)[0].cpu().numpy().astype(np.float32)
