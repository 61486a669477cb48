"""Video file decoding (optional extra ``[video]``: PyAV, which bundles its own FFmpeg libraries).

Frames come out as RGB ``uint8`` arrays, the same pixels an image file of that frame would give, so
:func:`xmodal.features.encoders.encode_videos` can send them through the image encoder's preprocessing.

Sampling (``decode_frames``):

- ``frames=N``: N frames spread uniformly over the whole video, frame ``i`` of ``N`` being the one at
  index ``floor((i + 0.5) * T / N)`` of the ``T`` decoded frames (the centre of the i-th of N equal
  segments); ``F = min(N, T)`` (a video shorter than N frames gives all of its frames, none repeated).
- ``fps=R``: one frame every ``1 / R`` seconds of presentation time, starting with the first frame
  (the first frame at or after each tick ``k / R`` after the first frame's time).
- neither: every frame.

Frames are decoded sequentially (no seeking, so no keyframe drift) and only the chosen ones are kept, so
memory does not grow with the video's length. ``T`` is first counted from the stream's packets (demuxing
only, no decoding; the container's declared frame count is often missing or wrong); should the decoder
give a different number of frames, the choice is redone on the decoded count.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg")

__all__ = ["decode_frames", "middle_frame", "uniform_indices", "VIDEO_EXTENSIONS"]


def _av():
    try:
        import av
    except ImportError:
        raise ModuleNotFoundError("decoding video files needs PyAV (pip install 'xmodal[video]')") from None
    return av


def uniform_indices(total: int, frames: int) -> np.ndarray:
    """Indices of ``min(frames, total)`` frames spread uniformly over ``total`` frames (segment centres).

    >>> uniform_indices(10, 4).tolist()
    [1, 3, 6, 8]
    >>> uniform_indices(3, 8).tolist()
    [0, 1, 2]
    """
    if total <= frames:
        return np.arange(total)
    return np.floor((np.arange(frames) + 0.5) * total / frames).astype(np.int64)


def _check_sampling(frames, fps) -> None:
    if frames is not None and fps is not None:
        raise ValueError("frames/fps: give one of them, not both")
    if frames is not None and (isinstance(frames, bool) or not isinstance(frames, (int, np.integer))
                               or frames < 1):
        raise ValueError(f"frames: expected a positive integer, got {frames!r}")
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float, np.number))
                            or not np.isfinite(fps) or fps <= 0):
        raise ValueError(f"fps: expected a positive number, got {fps!r}")


def _decoded(path: Path):
    """Yield ``(time_seconds_or_None, av.VideoFrame)`` for every frame of the first video stream."""
    av = _av()
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path.name}: cannot read video file ({_short(exc)})") from None
    with container:
        if not container.streams.video:
            raise ValueError(f"{path.name}: no video stream in the file")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                yield frame.time, frame
        except (av.FFmpegError, OSError, ValueError) as exc:
            raise ValueError(f"{path.name}: cannot decode video ({_short(exc)})") from None


def _count_packets(path: Path) -> int:
    """Number of frame packets of the first video stream (demuxing only)."""
    av = _av()
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError(f"{path.name}: no video stream in the file")
            return sum(1 for p in container.demux(container.streams.video[0]) if p.size)
    except (av.FFmpegError, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path.name}: cannot read video file ({_short(exc)})") from None


def _pick(path: Path, choose) -> list[np.ndarray]:
    """RGB frames at ``choose(T)`` (sorted indices) of the ``T`` decoded frames, one decoding pass
    (two when the packet count was not the frame count)."""
    guess = _count_packets(path)
    want = set(choose(guess).tolist())
    out, total = [], 0
    for i, (_, f) in enumerate(_decoded(path)):
        if i in want:
            out.append(_rgb(f))
        total = i + 1
    if total == guess:
        return out
    want = set(choose(total).tolist())
    return [_rgb(f) for i, (_, f) in enumerate(_decoded(path)) if i in want]


def _short(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc).strip()
    text = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return text[:200]


def _path(path) -> Path:
    path = Path(os.fspath(path))
    if not path.is_file():
        raise ValueError(f"{path}: video file not found")
    if path.stat().st_size == 0:
        raise ValueError(f"{path.name}: empty file")
    return path


def _rgb(frame) -> np.ndarray:
    return frame.to_ndarray(format="rgb24")


def decode_frames(path: str | os.PathLike, *, frames: int | None = None,
                  fps: float | None = None) -> np.ndarray:
    """Decode a video file's frames as RGB.

    Args:
        path: a video file (any container/codec FFmpeg reads: mp4/h264, webm/vp9, avi/mpeg4, ...).
        frames: sample ``min(frames, T)`` frames uniformly over the whole video (see module doc).
        fps: sample one frame every ``1 / fps`` seconds instead.

    Returns:
        uint8 array of the sampled frames, in time order.

    Shape:
        ``[F, H, W, 3]``.

    Raises:
        ValueError: naming the file when it is missing, empty, unreadable, has no video stream or
            no decodable frame; or for bad ``frames`` / ``fps``.
    """
    _check_sampling(frames, fps)
    path = _path(path)
    if frames is not None:
        out = _pick(path, lambda total: uniform_indices(total, int(frames)))
    elif fps is not None:
        out, t0, k = [], None, 0
        step = 1.0 / float(fps)
        for i, (t, f) in enumerate(_decoded(path)):
            t = float(i) if t is None else float(t)
            if t0 is None:
                t0 = t
            if t - t0 >= k * step - 1e-6:
                out.append(_rgb(f))
                k = int(np.floor((t - t0) / step + 1e-6)) + 1
    else:
        out = [_rgb(f) for _, f in _decoded(path)]
    if not out:
        raise ValueError(f"{path.name}: no decodable video frame")
    return np.stack(out)


def middle_frame(path: str | os.PathLike) -> np.ndarray:
    """The middle frame (index ``T // 2`` of the ``T`` decoded frames) of a video file, RGB.

    Shape:
        ``[H, W, 3]`` uint8.

    Raises:
        ValueError: naming the file, as :func:`decode_frames`.
    """
    path = _path(path)
    out = _pick(path, lambda total: np.array([total // 2]) if total else np.array([], np.int64))
    if not out:
        raise ValueError(f"{path.name}: no decodable video frame")
    return out[0]
