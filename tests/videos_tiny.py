"""Generated videos whose content decides the caption (colour, shape, direction of motion): frames as
a frame store holds them (uint8 ``[N, F, S*S*3]``) for the ``model.kind: clip4clip`` tests."""

from __future__ import annotations

import numpy as np

# short words: the tiny test tokenizer has one token per character and 16 positions
COLOURS = {"red": (230, 30, 30), "lime": (30, 200, 40), "blue": (40, 60, 230), "gold": (230, 220, 40)}
SHAPES = ("box", "bar")
MOTIONS = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}


def video(colour: str, shape: str, motion: str, *, size: int, frames: int, rng: np.random.Generator) -> np.ndarray:
    """``[frames, size * size * 3]`` uint8: a shape of one colour sweeping across a grey, lightly noisy
    background from one edge to the other in the direction of ``motion``."""
    h, w = (size // 4, size // 4) if shape == "box" else (size // 8, size // 2)
    if motion in ("up", "down"):
        h, w = w, h  # a bar lies along its motion
    dy, dx = MOTIONS[motion]
    y0 = int(rng.integers(0, size - h + 1))
    x0 = int(rng.integers(0, size - w + 1))
    out = np.empty((frames, size, size, 3), np.uint8)
    for f in range(frames):
        t = f / max(1, frames - 1)  # 0 -> 1: from the start edge to the end edge
        img = rng.integers(110, 130, size=(size, size, 3)).astype(np.uint8)
        y = y0 if dy == 0 else int(round((size - h) * (t if dy > 0 else 1 - t)))
        x = x0 if dx == 0 else int(round((size - w) * (t if dx > 0 else 1 - t)))
        img[y:y + h, x:x + w] = COLOURS[colour]
        out[f] = img
    return out.reshape(frames, -1)


def caption(colour: str, shape: str, motion: str) -> str:
    return f"{colour} {shape} {motion}"


def split(n: int, *, size: int = 16, frames: int = 6, seed: int = 0, captions_per_video: int = 1):
    """A :class:`~xmodal.data.PairedSplit` of ``n`` generated videos (random length 3..frames, padded)."""
    from xmodal.data import PairedSplit

    rng = np.random.default_rng(seed)
    keys = [(c, s, m) for c in COLOURS for s in SHAPES for m in MOTIONS]
    video_rows, mask, caps, t2v = [], [], [], []
    for i in range(n):
        c, s, m = keys[int(rng.integers(len(keys)))]
        length = int(rng.integers(3, frames + 1))
        v = np.zeros((frames, size * size * 3), np.uint8)
        v[:length] = video(c, s, m, size=size, frames=length, rng=rng)
        video_rows.append(v)
        mask.append(np.arange(frames) < length)
        for k in range(captions_per_video):
            caps.append(caption(c, s, m) if k == 0 else f"{m} {c} {s}")
            t2v.append(i)
    return PairedSplit(video=np.stack(video_rows), text=np.zeros((len(caps), 1), np.float32),
                       text_to_video=np.array(t2v), video_mask=np.stack(mask), captions=caps)
