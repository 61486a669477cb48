"""Video file decoding, streamed (optional extra ``[video]``: PyAV, which bundles its own FFmpeg libraries).

Frames come out as RGB ``uint8`` arrays, the same pixels an image file of that frame would give, so
:func:`xmodal.features.encoders.encode_videos` can send them through the image encoder's preprocessing.

Sampling (``decode_frames``, ``xmodal encode videos``):

- ``frames=N``: N frames spread uniformly over the whole video, frame ``i`` of ``N`` being the one at
  index ``floor((i + 0.5) * T / N)`` of the ``T`` decoded frames (the centre of the i-th of N equal
  segments); ``F = min(N, T)`` (a video shorter than N frames gives all of its frames, none repeated).
- ``fps=R``: one frame every ``1 / R`` seconds of presentation time, starting with the first frame
  (the first frame at or after each tick ``k / R`` after the first frame's time). A stream without
  timestamps is timed by its declared frame rate (frame ``i`` at ``i / rate``).
- neither: every frame (the library's default; ``xmodal encode videos`` samples 1 frame per second
  unless told otherwise, :data:`DEFAULT_FPS`).

Memory is bounded by the settings, not by the file: frames are decoded one at a time and only the
chosen ones are converted (nothing holds a whole video's frames unless the caller keeps them, as
:func:`decode_frames` does by returning an array); the stream's declared frame size is checked against
``max_pixels`` before any frame is decoded (and every decoded frame again, for streams whose size
changes); ``max_side`` converts large frames straight to a reduced size (area averaging in FFmpeg's
scaler), never to a full-size RGB array first; the decoder runs :data:`DECODE_THREADS` threads, so the
number of frames it holds does not grow with the machine's cores.

``T`` is first counted from the stream's packets (demuxing only, no decoding; the container's declared
frame count is often missing or wrong); should the decoder give a different number of frames, the
choice is redone on the decoded count. A file whose decoding stops early (an error after some frames)
or whose decoded frames fall well short of its declared length is *truncated*: its frames are kept (or
refused by the caller, ``xmodal encode videos --truncated skip``) and the reason is named
(:func:`truncation`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["VIDEO_EXTENSIONS", "DEFAULT_FPS", "DEFAULT_MAX_PIXELS", "VideoInfo", "TruncatedVideo", "probe",
           "is_video", "estimate_frames", "decode_frames", "middle_frame", "uniform_indices"]

#: Extensions tried first by name (``xmodal encode videos`` also probes files with other extensions).
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".qt", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".m2v", ".vob",
                    ".ts", ".mts", ".m2ts", ".3gp", ".3g2", ".flv", ".f4v", ".wmv", ".asf", ".ogv", ".mxf",
                    ".dv", ".y4m", ".divx", ".h264", ".264", ".hevc", ".h265", ".ivf")
#: ``xmodal encode videos`` without ``--frames`` / ``--fps`` / ``--all-frames``: one frame per second.
DEFAULT_FPS = 1.0
#: Largest frame (width x height) decoded by default: 8192 x 8192. The decoder holds a few frames of
#: the declared size (about 1.5 bytes per pixel each, YUV 4:2:0) whatever ``max_side`` is.
DEFAULT_MAX_PIXELS = 8192 * 8192
#: Decoder threads: each frame thread holds its own frames, so this bounds the decoder's memory.
DECODE_THREADS = 2
#: FFmpeg demuxers that read still images or text, not videos (a ``.jpg``, ``.png``, ``.nfo`` ...).
_NOT_VIDEO_FORMATS = re.compile(r"^(image2|image2pipe|tty|gif|apng|webp|.*_pipe)$")
#: Decoded length under the declared one by more than this (seconds, or this fraction of it) = truncated.
_SHORT_SECONDS, _SHORT_FRACTION = 0.5, 0.1


class TruncatedVideo(ValueError):
    """A file whose decoded frames fall short of its declared length (refused by ``truncated="skip"``)."""

__all__ = ["decode_frames", "middle_frame", "uniform_indices", "VIDEO_EXTENSIONS"]


def _av():
    try:
        import av
    except ImportError:
        raise ModuleNotFoundError("decoding video files needs PyAV (pip install 'xmodal[video]')") from None
    return av


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _shown(v) -> str:
    """A value for a one-line message (arrays and long things by type and shape only)."""
    if isinstance(v, np.ndarray) or type(v).__module__.startswith("torch"):
        return f"an array of shape {tuple(getattr(v, 'shape', ()))}"
    text = repr(v)
    return text if len(text) <= 60 and "\n" not in text else f"a {type(v).__name__}"


def uniform_indices(total: int, frames: int) -> np.ndarray:
    """Indices of ``min(frames, total)`` frames spread uniformly over ``total`` frames (segment centres).

    >>> uniform_indices(10, 4).tolist()
    [1, 3, 6, 8]
    >>> uniform_indices(3, 8).tolist()
    [0, 1, 2]
    """
    if not _is_int(total) or total < 0:
        raise ValueError(f"total: expected an integer >= 0, got {_shown(total)}")
    if not _is_int(frames) or frames < 1:
        raise ValueError(f"frames: expected a positive integer, got {_shown(frames)}")
    if total <= frames:
        return np.arange(total)
    return np.floor((np.arange(frames) + 0.5) * total / frames).astype(np.int64)


def _check_sampling(frames, fps) -> None:
    if frames is not None and fps is not None:
        raise ValueError("frames/fps: give one of them, not both")
    if frames is not None and (not _is_int(frames) or frames < 1):
        raise ValueError(f"frames: expected a positive integer, got {_shown(frames)}")
    if fps is not None and (isinstance(fps, (bool, np.bool_)) or not isinstance(fps, (int, float, np.number))
                            or not np.isfinite(fps) or fps <= 0):
        raise ValueError(f"fps: expected a positive number, got {_shown(fps)}")


def _check_limits(max_side, max_pixels) -> None:
    if max_side is not None and (not _is_int(max_side) or max_side < 1):
        raise ValueError(f"max_side: expected a positive integer or None, got {_shown(max_side)}")
    if not _is_int(max_pixels) or max_pixels < 1:
        raise ValueError(f"max_pixels: expected a positive integer, got {_shown(max_pixels)}")


def _short(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc).strip()
    text = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return text[:200]


def _named(exc: BaseException, name: str) -> ValueError:
    """Any failure on one file as a one-line ValueError that starts with the file's name."""
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    if isinstance(exc, ValueError) and text.startswith(f"{name}:"):
        return exc
    what = text or type(exc).__name__
    if not isinstance(exc, ValueError):
        what = f"{type(exc).__name__}: {what}" if text else what
    return ValueError(f"{name}: {what}")


def _path(path) -> Path:
    if isinstance(path, (bool, np.bool_)) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a file path, got {_shown(path)}")
    try:
        path = Path(os.fspath(path))
        if path.is_dir():
            raise ValueError(f"{path.name or path}: a directory, not a video file")
        if not path.is_file():
            if path.is_symlink():
                raise ValueError(f"{path.name}: broken or looping symbolic link")
            if path.exists():  # never opened: reading a FIFO would block
                raise ValueError(f"{path.name}: not a regular file (FIFO, socket or device)")
            raise ValueError(f"{path}: video file not found")
        if path.stat().st_size == 0:
            raise ValueError(f"{path.name}: empty file")
    except (OSError, TypeError) as exc:  # a symlink loop, a name too long, a NUL byte
        raise ValueError(f"{os.fspath(path)!s:.200}: cannot read ({_short(exc)})") from None
    return path


def _frac(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _tag_seconds(text) -> float | None:
    """Matroska's per-track ``DURATION`` tag, ``HH:MM:SS.nnnnnnnnn``."""
    m = re.fullmatch(r"\s*(\d+):(\d{1,2}):(\d{1,2}(?:\.\d*)?)\s*", str(text or ""))
    return None if m is None else int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])


@dataclass(frozen=True)
class VideoInfo:
    """What a file's header declares (nothing decoded): container and codec names, frame size,
    frame count, duration (s) and frame rate of the first video stream (None when not declared)."""

    format: str
    codec: str
    width: int
    height: int
    frames: int | None
    duration: float | None
    rate: float | None


def _info(container, stream) -> VideoInfo:
    ctx = stream.codec_context
    rate = next((r for r in (_frac(stream.average_rate), _frac(getattr(stream, "guessed_rate", None)),
                             _frac(stream.base_rate)) if r is not None and r < 1000), None)
    duration = None
    if stream.duration and stream.time_base:
        duration = _frac(stream.duration * stream.time_base)
    if duration is None:
        duration = _tag_seconds((stream.metadata or {}).get("DURATION"))
    if duration is None and len(container.streams) == 1 and container.duration:
        duration = _frac(container.duration / 1_000_000)  # the container's: only when it is the video's
    return VideoInfo(format=str(container.format.name), codec=str(ctx.name), width=int(ctx.width or 0),
                     height=int(ctx.height or 0), frames=int(stream.frames) if stream.frames else None,
                     duration=duration, rate=rate)


def _open(path: Path, max_pixels: int):
    """``(container, stream, info)``; a one-line ValueError naming the file when it is not a video
    or its declared frame size exceeds ``max_pixels``."""
    av = _av()
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path.name}: cannot read video file ({_short(exc)})") from None
    try:
        if _NOT_VIDEO_FORMATS.match(str(container.format.name)):
            raise ValueError(f"{path.name}: not a video ({container.format.long_name or container.format.name})")
        if not container.streams.video:
            raise ValueError(f"{path.name}: no video stream in the file")
        stream = container.streams.video[0]
        info = _info(container, stream)
        _check_size(path, info.width, info.height, max_pixels, "declares")
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = DECODE_THREADS
    except BaseException:
        container.close()
        raise
    return container, stream, info


def _check_size(path: Path, width: int, height: int, max_pixels: int, verb: str) -> None:
    if width * height > max_pixels:
        raise ValueError(f"{path.name}: {verb} {width}x{height} frames, over the limit of {max_pixels:,} pixels "
                         f"(max_pixels; 'xmodal encode videos --max-pixels')")


def probe(path: str | os.PathLike, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> VideoInfo:
    """Open a file's header (no frame is decoded) and return what it declares.

    Raises:
        ValueError: naming the file when it is missing, empty, not a container FFmpeg reads, an image
            or text file, has no video stream, or declares frames larger than ``max_pixels``.

    >>> probe("missing.mp4")
    Traceback (most recent call last):
    ...
    ValueError: missing.mp4: video file not found
    """
    _check_limits(None, max_pixels)
    path = _path(path)
    container, _, info = _open(path, int(max_pixels))
    container.close()
    return info


def is_video(path: str | os.PathLike) -> bool:
    """Whether FFmpeg opens ``path`` as a video (a container with a video stream, not an image or text
    file): what ``xmodal encode videos DIR`` asks of files whose extension it does not know."""
    try:
        probe(path, max_pixels=2**62)
    except (ValueError, TypeError, ModuleNotFoundError):
        return False
    return True


def estimate_frames(info: VideoInfo, *, frames: int | None = None, fps: float | None = None) -> int | None:
    """The number of frames a sampling will give, from the header alone (None when it declares too
    little): ``min(frames, T)``, ``duration * fps`` (rounded up) or ``T``, with ``T`` the declared frame
    count or ``duration * rate``.

    >>> estimate_frames(VideoInfo("mov,mp4", "h264", 64, 48, 300, 10.0, 30.0), fps=1.0)
    10
    """
    if not isinstance(info, VideoInfo):
        raise TypeError(f"info: expected a VideoInfo (from probe), got {_shown(info)}")
    _check_sampling(frames, fps)
    total = info.frames
    if total is None and info.duration is not None and info.rate is not None:
        total = max(1, round(info.duration * info.rate))
    if fps is not None:
        if info.duration is None:
            return None
        n = max(1, math.ceil(info.duration * float(fps) - 1e-6))
        return n if total is None else min(n, total)
    if total is None:
        return None
    return total if frames is None else min(int(frames), total)


class _Tally:
    """What one decoding pass saw: frames decoded, first / last presentation time, a mid-stream error."""

    def __init__(self) -> None:
        self.count, self.first, self.last, self.error, self.info = 0, None, None, None, None

    def note(self) -> str | None:
        return None if self.info is None else truncation(self.info, self.count, self.first, self.last, self.error)


def _times(info: VideoInfo, path: Path, need: bool):
    """``frame -> seconds`` (or None): the frame's timestamp, else its index over the declared rate."""
    rate = info.rate

    def at(i: int, frame) -> float | None:
        t = frame.time
        if t is not None:
            return float(t)
        if rate is None:
            if need:
                raise ValueError(f"{path.name}: no timestamps and no declared frame rate; sample with frames=N "
                                 f"(--frames N) instead of fps")
            return None
        return i / rate

    return at


def _frames(path: Path, max_pixels: int, tally: _Tally, need_time: bool = False,
            max_decoded: int | None = None) -> Iterator[tuple]:
    """Yield ``(index, seconds or None, av.VideoFrame)`` for every frame of the first video stream,
    one at a time. An error after the first frame ends the pass (recorded in ``tally``: truncated);
    a frame past ``max_decoded`` is a ValueError naming the file (the bound is a setting's)."""
    av = _av()
    container, stream, info = _open(path, max_pixels)
    tally.info = info
    at = _times(info, path, need_time)
    with container:
        frames = container.decode(stream)
        while True:
            try:
                frame = next(frames)
            except StopIteration:
                return
            except MemoryError as exc:  # av.error.MemoryError is an FFmpegError too: not a truncation
                raise ValueError(f"{path.name}: out of memory while decoding ({_short(exc)})") from None
            except (av.FFmpegError, OSError, ValueError) as exc:
                if tally.count == 0:
                    raise ValueError(f"{path.name}: cannot decode video ({_short(exc)})") from None
                tally.error = _short(exc)
                return
            _check_size(path, frame.width, frame.height, max_pixels, "has")
            if max_decoded is not None and tally.count >= max_decoded:
                raise ValueError(f"{path.name}: more than {max_decoded} frames to decode (the limit)")
            t = at(tally.count, frame)
            if tally.count == 0:
                tally.first = t
            tally.last = t
            tally.count += 1
            yield tally.count - 1, t, frame


def _count_packets(path: Path, max_pixels: int) -> int:
    """Number of frame packets of the first video stream (demuxing only)."""
    av = _av()
    container, stream, _ = _open(path, max_pixels)
    with container:
        n = 0
        try:
            for p in container.demux(stream):
                n += 1 if p.size else 0
        except (av.FFmpegError, OSError, ValueError):  # a cut-off file: count what is there
            pass
        return n


def truncation(info: VideoInfo, decoded: int, first: float | None, last: float | None,
               error: str | None = None) -> str | None:
    """Why a pass that decoded ``decoded`` frames (presentation times ``first`` .. ``last``) looks
    truncated against the header ``info``, or None. Truncated: decoding stopped on an error after
    some frames, or fewer frames / a shorter span than declared by more than 0.5 s or 10%."""
    shown = f"decoded {decoded} frame(s)"
    if error is not None:
        return f"{shown}, then the decoder stopped ({error})"
    step = 1.0 / info.rate if info.rate else 0.0
    span = None if first is None or last is None else last - first + step
    if info.duration is not None and span is not None:
        if info.duration - span > max(_SHORT_SECONDS, _SHORT_FRACTION * info.duration):
            return f"{shown} covering {span:.1f} s of a declared {info.duration:.1f} s"
    if info.frames and info.frames - decoded > max(_SHORT_SECONDS * (info.rate or 0), _SHORT_FRACTION * info.frames,
                                                   1):
        return f"{shown} of {info.frames} declared"
    return None


RESTART = object()  #: marks "the frames so far were chosen on a wrong count; start again" in _sampled


def _sampled(path: Path, *, frames: int | None, fps: float | None, max_pixels: int,
             stop_after: Callable[[int], int | None] | None = None, max_decoded: int | None = None) -> Iterator:
    """Yield ``(index, av.VideoFrame)`` of the sampled frames (and :data:`RESTART` before a second
    pass, when ``frames=N`` was chosen on a packet count the decoder did not match); returns, at
    ``StopIteration``, ``(info, truncation note or None)``.

    ``stop_after(T)``: the last index needed for a guess ``T`` (middle_frame stops decoding there)."""
    if frames is not None or stop_after is not None:
        guess = _count_packets(path, max_pixels)
        for attempt in range(2):
            tally = _Tally()
            want = (uniform_indices(guess, int(frames)) if frames is not None
                    else np.array([stop_after(guess)] if guess else [], np.int64))
            wanted, last_needed = set(want.tolist()), (int(want.max()) if want.size else -1)
            for i, _, frame in _frames(path, max_pixels, tally, max_decoded=max_decoded):
                if i in wanted:
                    yield i, frame
                if stop_after is not None and i >= last_needed:
                    return tally.info, None
            if tally.count == guess or attempt == 1 or tally.count == 0:
                break
            guess = tally.count
            yield RESTART
        return tally.info, tally.note()
    tally = _Tally()
    if fps is None:
        for i, _, frame in _frames(path, max_pixels, tally, max_decoded=max_decoded):
            yield i, frame
    else:
        step, t0, k = 1.0 / float(fps), None, 0
        for i, t, frame in _frames(path, max_pixels, tally, need_time=True, max_decoded=max_decoded):
            if t0 is None:
                t0 = t
            if t - t0 >= k * step - 1e-6:
                yield i, frame
                k = int(np.floor((t - t0) / step + 1e-6)) + 1
    return tally.info, tally.note()


def to_rgb(frame, max_side: int | None = None, size: tuple[int, int] | None = None) -> np.ndarray:
    """An ``av.VideoFrame`` as RGB ``uint8 [H, W, 3]``: at ``size`` ``(width, height)`` when given, else
    scaled (area averaging, aspect kept) so that its longer side is at most ``max_side``."""
    w, h = frame.width, frame.height
    if size is None and max_side is not None and max(w, h) > max_side:
        scale = max_side / max(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
    if size is None or size == (w, h):
        return frame.to_ndarray(format="rgb24")
    return frame.to_ndarray(format="rgb24", width=size[0], height=size[1], interpolation="AREA")


def decode_frames(path: str | os.PathLike, *, frames: int | None = None, fps: float | None = None,
                  max_side: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode a video file's frames as RGB.

    Args:
        path: a video file (any container/codec FFmpeg reads: mp4/h264, webm/vp9, avi/mpeg4, ...).
        frames: sample ``min(frames, T)`` frames uniformly over the whole video (see module doc).
        fps: sample one frame every ``1 / fps`` seconds instead.
        max_side: scale frames whose longer side exceeds this (area averaging, aspect kept).
        max_pixels: refuse a stream that declares (or decodes) larger frames, before decoding them.

    Returns:
        uint8 array of the sampled frames, in time order (a stream whose frame size changes is
        scaled to its first frame's size). A truncated file gives the frames it has.

    Shape:
        ``[F, H, W, 3]``.

    Raises:
        ValueError: naming the file when it is missing, empty, unreadable, has no video stream, no
            decodable frame or too large frames; or for bad ``frames`` / ``fps`` / limits.

    >>> decode_frames("missing.mp4", frames=4)
    Traceback (most recent call last):
    ...
    ValueError: missing.mp4: video file not found
    """
    _check_sampling(frames, fps)
    _check_limits(max_side, max_pixels)
    path = _path(path)
    out: list[np.ndarray] = []
    size = None
    for item in _sampled(path, frames=frames, fps=fps, max_pixels=int(max_pixels)):
        if item is RESTART:
            out, size = [], None
            continue
        rgb = to_rgb(item[1], max_side, size)
        size = size or (rgb.shape[1], rgb.shape[0])
        out.append(rgb)
    if not out:
        raise ValueError(f"{path.name}: no decodable video frame")
    return np.stack(out)


def middle_frame(path: str | os.PathLike, *, max_side: int | None = None,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """The middle frame (index ``T // 2`` of the stream's ``T`` frame packets) of a video file, RGB;
    decoding stops there. ``max_side`` / ``max_pixels`` as in :func:`decode_frames` (a thumbnail needs
    no more than its own size).

    Shape:
        ``[H, W, 3]`` uint8.

    Raises:
        ValueError: naming the file, as :func:`decode_frames`.
    """
    _check_limits(max_side, max_pixels)
    path = _path(path)
    out = None
    for item in _sampled(path, frames=None, fps=None, max_pixels=int(max_pixels), stop_after=lambda t: t // 2):
        if item is not RESTART:
            out = to_rgb(item[1], max_side)
    if out is None:
        raise ValueError(f"{path.name}: no decodable video frame")
    return out
