"""Uploaded videos of ``xmodal serve``: received into a private temporary folder, checked, encoded as
``xmodal encode videos`` encodes a file, embedded with the run's video head, and removed.

Bounds (``create_app`` arguments, ``xmodal serve`` flags):

- the request body: at most ``max_bytes`` (its ``Content-Length`` is checked before a byte is read,
  and the bytes are counted), one ``multipart/form-data`` file field, read within ``timeout`` seconds
  and at :data:`MIN_RATE` bytes a second after a grace of :data:`RECEIVE_GRACE` seconds (a client that
  trickles its body is cut off early); at most :data:`MAX_RECEIVING` bodies are received at once;
- the video: its first video stream's frame size (at most :data:`xmodal.features.media.MAX_VIDEO_PIXELS`,
  probed with the decoder capped there), its duration (at most ``max_seconds``) and its number of frame
  packets (at most ``max_decoded``, counted by demuxing, whatever the header declares) are checked
  before any decoding, and decoding stops past ``max_decoded`` frames;
- one upload is encoded at a time (another gets a quick 503); receiving does not take that slot;
- error messages never show the server's private folder (the file is "the uploaded file");
- the file lives in ``tempfile.mkdtemp()`` (mode 0700) under a fixed name, and the folder is removed
  when the request ends, however it ends.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

#: Largest upload, in bytes.
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
#: Longest uploaded video, in seconds.
MAX_UPLOAD_SECONDS = 120.0
#: Frames sampled from an uploaded video (``xmodal encode videos --frames``).
UPLOAD_FRAMES = 16
#: Seconds to receive an upload's body (at most).
UPLOAD_TIMEOUT = 120.0
#: Bytes a second an upload's body must keep arriving at after :data:`RECEIVE_GRACE` seconds.
MIN_RATE = 64 * 1024
#: Seconds an upload may take before :data:`MIN_RATE` applies.
RECEIVE_GRACE = 10.0
#: Upload bodies received at once (each up to ``max_bytes`` on disk); another gets a quick 503.
MAX_RECEIVING = 4
#: Frames decoded from an uploaded video, at most, per second of ``max_seconds`` (30 a second: the
#: default ``--max-upload-seconds`` 120 allows 3,600 decoded frames).
DECODE_FRAMES_PER_SECOND = 30
#: Longest value of a form field other than the file.
MAX_FIELD_BYTES = 64


class UploadError(Exception):
    """An upload refused: ``status`` (HTTP) and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def unavailable_reason(model: Any, image_encoder: str | None, why_none: str | None = None, *,
                       item: str = "video") -> str | None:
    """Why this run cannot embed an uploaded ``item`` ("video" or "image") here (None: it can): PyAV
    (a video) or Pillow (an image), python-multipart or the image encoder missing (``image_encoder``
    None: ``why_none``), a run that fuses experts an uploaded file does not give, or an encoder whose
    size is not the run's."""
    import importlib.util

    from xmodal.features import encoders

    if item == "video" and importlib.util.find_spec("av") is None:
        return "decoding an uploaded video needs PyAV (pip install 'xmodal[video]')"
    if item == "image" and importlib.util.find_spec("PIL") is None:
        return "reading an uploaded image needs Pillow (pip install 'xmodal[serve]')"
    if importlib.util.find_spec("python_multipart") is None:
        return "receiving an upload needs python-multipart (pip install 'xmodal[serve]')"
    if image_encoder is None:
        return why_none or ("no image encoder for the uploaded video's frames" if item == "video"
                            else "no image encoder for the uploaded image")
    try:
        enc = encoders.get_encoder(image_encoder, item)
    except ValueError as exc:
        return str(exc).removeprefix("model: ")
    experts = [e for e in (getattr(model, "experts", None) or []) if e != "video"]
    if experts:
        return f"this run fuses the experts {', '.join(experts)}, which an uploaded file does not give"
    known, want = encoders.FEATURE_DIMS.get(image_encoder), _video_in_dim(model)
    if known is None and enc.identity is not None:
        try:
            known = enc.identity().get("dim")
        except (ValueError, OSError, ModuleNotFoundError):
            known = None
    if known is not None and want is not None and known != want:
        per, tower = ("a frame", "video tower") if item == "video" else ("an image", "image tower")
        return (f"the image encoder {image_encoder} gives {known} values {per}, but this run's {tower} "
                f"takes {want} (it was trained on other features)")
    return None


def receive_deadline(declared: int, *, max_bytes: int, timeout: float, min_rate: float = MIN_RATE,
                     grace: float = RECEIVE_GRACE) -> float:
    """Seconds a request body of ``declared`` bytes may take to arrive: ``min(timeout, grace +
    min(declared, max_bytes) / min_rate)`` (uploads and ``POST /api/search`` bodies alike).

    >>> receive_deadline(1000, max_bytes=10**6, timeout=120, min_rate=1000, grace=0.05)
    1.05
    """
    return min(float(timeout), float(grace) + min(int(declared), int(max_bytes)) / float(min_rate))


async def receive(request: Any, folder: Path, *, max_bytes: int, timeout: float,
                  min_rate: float = MIN_RATE, grace: float = RECEIVE_GRACE, field: str = "video"
                  ) -> tuple[Path, str, dict]:
    """Stream a ``multipart/form-data`` body into ``folder/upload``: ``(path, client file name, fields)``;
    the file comes in the field named ``field`` (``video``; ``image`` for an image gallery).

    The body must arrive within ``min(timeout, grace + Content-Length / min_rate)`` seconds: a client
    trickling a few bytes now and then is cut off after ``grace`` seconds for a small declared body.

    Raises:
        UploadError: not multipart (415), no or two files (400), over ``max_bytes`` (413), slower
            than that (408), a malformed body (400).
    """
    from python_multipart.multipart import MultipartParser, parse_options_header

    ctype, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise UploadError(415, f"upload: send multipart/form-data with the {field} in a file field named '{field}'")
    state: dict[str, Any] = {"headers": {}, "field": b"", "value": b"", "file": None, "name": None,
                             "filename": None, "fields": {}, "files": 0, "error": None}
    path = folder / "upload"

    def on_header_field(data, start, end):
        state["field"] += data[start:end]

    def on_header_value(data, start, end):
        state["value"] += data[start:end]

    def on_header_end():
        state["headers"][state["field"].lower()] = state["value"]
        state["field"], state["value"] = b"", b""

    def on_headers_finished():
        _, disp = parse_options_header(state["headers"].get(b"content-disposition", b""))
        state["name"] = disp.get(b"name", b"").decode("latin-1")
        filename = disp.get(b"filename")
        state["headers"] = {}
        if filename is not None:
            if state["name"] != field or state["files"]:
                state["error"] = UploadError(400, f"upload: one file, in the field named '{field}'")
                return
            state["files"] += 1
            state["filename"] = filename.decode("utf-8", "replace")[:120]
            state["file"] = open(path, "wb")  # noqa: SIM115 - closed at the part's end or below
        else:
            state["fields"][state["name"]] = b""

    def on_part_data(data, start, end):
        if state["error"] is not None:
            return
        if state["file"] is not None:
            state["file"].write(data[start:end])
        elif state["name"] in state["fields"]:
            value = state["fields"][state["name"]] + data[start:end]
            if len(value) > MAX_FIELD_BYTES:
                state["error"] = UploadError(400, f"upload: field {state['name'][:40]!r} is longer than "
                                                  f"{MAX_FIELD_BYTES} bytes")
            state["fields"][state["name"]] = value

    def on_part_end():
        if state["file"] is not None:
            state["file"].close()
            state["file"] = None

    callbacks = {"on_header_field": on_header_field, "on_header_value": on_header_value,
                 "on_header_end": on_header_end, "on_headers_finished": on_headers_finished,
                 "on_part_data": on_part_data, "on_part_end": on_part_end}
    parser = MultipartParser(boundary, callbacks, max_size=max_bytes)

    async def read_all():
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_bytes:
                raise UploadError(413, f"upload: larger than {max_bytes:,} bytes")
            parser.write(chunk)
            if state["error"] is not None:
                raise state["error"]
        parser.finalize()

    length = request.headers.get("content-length", "")
    declared = int(length) if length.isdigit() and len(length) <= 18 else max_bytes
    deadline = receive_deadline(declared, max_bytes=max_bytes, timeout=timeout, min_rate=min_rate, grace=grace)
    try:
        await asyncio.wait_for(read_all(), deadline)
    except asyncio.TimeoutError:
        raise UploadError(408, f"upload: not received within {deadline:.3g} s (bodies must arrive at "
                               f"{min_rate / 1024:g} KiB/s or more)") from None
    except UploadError:
        raise
    except Exception as exc:  # noqa: BLE001 - the parser's and the client's errors: a bad upload
        text = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise UploadError(400, f"upload: malformed form body ({text})") from None
    finally:
        if state["file"] is not None:
            state["file"].close()
    if not state["files"] or not path.is_file() or path.stat().st_size == 0:
        raise UploadError(400, f"upload: no {field} file (choose one in the field named '{field}')")
    fields = {k: v.decode("utf-8", "replace") for k, v in state["fields"].items()}
    return path, state["filename"] or "upload", fields


def probe(path: Path, *, max_seconds: float, max_pixels: int, max_decoded: int | None = None) -> dict:
    """``{"width", "height", "seconds", "packets"}`` of an uploaded video from its header and packets (the
    decoder capped at ``max_pixels``, one thread; packets counted by demuxing, nothing decoded);
    UploadError 400/413 when it is not a video or over a bound (``max_decoded``: frame packets, default
    :data:`DECODE_FRAMES_PER_SECOND` x ``max_seconds``). Messages never name the file's path."""
    if max_decoded is None:
        max_decoded = int(DECODE_FRAMES_PER_SECOND * max_seconds)
    import av

    try:
        with av.open(str(path), stream_options=[{"max_pixels": str(max_pixels), "threads": "1"}]) as container:
            if not container.streams.video:
                raise UploadError(400, "upload: the file has no video stream")
            stream = container.streams.video[0]
            width, height = int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)
            if stream.duration is not None and stream.time_base is not None:
                seconds = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                seconds = container.duration / 1e6  # AV_TIME_BASE
            else:
                seconds = None
            if not width * height or width * height > max_pixels:
                shown = f"{width}x{height}" if width * height else "a size not readable within the budget"
                raise UploadError(413, f"upload: video frames of {shown}, over {max_pixels:,} pixels")
            packets = 0  # counted whatever the header declares (demuxing only, no decoding)
            for packet in container.demux(stream):
                packets += bool(packet.size)
                if packets > max_decoded:
                    raise UploadError(413, f"upload: more than {max_decoded:,} frames to decode (the limit; "
                                           f"xmodal serve --max-upload-decode N)")
            if seconds is None:  # no declared duration: at 30 frames a second, as the decode bound counts
                seconds = packets / DECODE_FRAMES_PER_SECOND
    except UploadError:
        raise
    except (av.FFmpegError, OSError, UnicodeDecodeError, ValueError) as exc:
        text = scrub(str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__, path)
        raise UploadError(400, f"upload: not a readable video file ({text[:120]})") from None
    if seconds > max_seconds:
        raise UploadError(413, f"upload: {seconds:.1f} s of video, longer than {max_seconds:g} s")
    return {"width": width, "height": height, "seconds": seconds, "packets": packets}


def scrub(text: str, path: Path) -> str:
    """``text`` without the server's private folder: the file's path (quoted or not) becomes "the
    uploaded file", any other mention of its folder "the upload folder".

    >>> scrub("Invalid data: '/tmp/xmodal-serve-upload-ab/upload'", Path("/tmp/xmodal-serve-upload-ab/upload"))
    'Invalid data: the uploaded file'
    """
    for quoted in (f"'{path}'", f'"{path}"', str(path)):
        text = text.replace(quoted, "the uploaded file")
    return text.replace(str(path.parent), "the upload folder")


def embed(path: Path, model: Any, *, frames: int, image_encoder: str, max_decoded: int | None = None,
          filename: str = "the uploaded file", device: str | None = None) -> np.ndarray:
    """The run's video embedding ``[D]`` of a video file: ``frames`` frames through ``image_encoder``
    (:func:`xmodal.features.encoders.iter_encode_videos`, as ``xmodal encode videos --frames``; a clip
    encoder takes its own number of frames), then the run's video head on ``[1, F, Dv]`` with every
    frame real. Decoding stops past ``max_decoded`` frames; errors name ``filename``, never ``path``;
    ``device``: where an ``hf:`` / ``open_clip:`` encoder runs (None: CUDA when present)."""
    from xmodal.features.encoders import get_encoder, iter_encode_videos

    if get_encoder(image_encoder, "video").kind == "video":
        frames = None  # a clip encoder samples exactly its num_frames
    feats = None
    for _, result in iter_encode_videos([path], frames=frames, model=image_encoder, max_decoded=max_decoded,
                                        device=device):
        if isinstance(result, Exception):
            text = str(result)
            if text.startswith(f"{path.name}: "):  # iter_encode_videos names the file: the client's name here
                text = text[len(path.name) + 2:]
            status = 413 if "frames to decode" in text else 400
            raise UploadError(status, f"upload: {filename}: {scrub(text, path)}"[:240])
        feats = result
    if feats is None or feats.ndim != 2 or not feats.shape[0]:
        raise UploadError(400, "upload: no decodable video frame")
    want = _video_in_dim(model)
    if want is not None and feats.shape[1] != want:
        raise UploadError(400, f"upload: the image encoder {image_encoder!r} gives {feats.shape[1]} values a frame "
                               f"but this run's video head takes {want} (start serve with the gallery's "
                               f"--image-encoder)")
    emb = model.encode_video(feats[None], np.ones((1, feats.shape[0]), dtype=bool))
    return emb[0].cpu().numpy().astype(np.float32)


class PrivateFolder:
    """``with PrivateFolder() as folder``: a new ``mkdtemp`` folder (mode 0700), removed at the end."""

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="xmodal-serve-upload-"))
        os.chmod(self.path, 0o700)
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _video_in_dim(model: Any) -> int | None:
    """Feature size the run's (single) video tower takes, None when it does not say."""
    tower = getattr(model, "video_tower", None)
    towers = getattr(tower, "towers", None)
    spec = getattr(towers["video"] if towers is not None and "video" in towers else tower, "spec", None)
    return None if spec is None else int(spec.in_dim)
