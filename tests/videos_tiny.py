"""Generated videos whose content decides the caption (colour, shape, direction of motion): frames as
a frame store holds them (uint8 ``[N, F, S*S*3]``) for the ``model.kind: clip4clip`` tests."""

from __future__ import annotations

import numpy as np

# short words: the tiny test tokenizer has one token per character and 16 positions
COLOURS = {"red": (230, 30, 30), "lime": (30, 200, 40), "blue": (40, 60, 230), "gold": (230, 220, 40)}
SHAPES = ("box", "bar")
MOTIONS = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}


def video(colour: str, shape: str, motion: str, *, size: int, frames: int, rng: np.random.Generator) -> np.ndarray:
    """``[frames, size * size * 3]`` uint8: a shape of one colour moving over a noisy grey background."""
    h, w = (4, 4) if shape == "box" else (2, 8)
    dy, dx = MOTIONS[motion]
    y0 = int(rng.integers(2, size - h - 2))
    x0 = int(rng.integers(2, size - w - 2))
    step = max(1, (size - max(h, w) - 4) // max(1, frames - 1))
    out = np.empty((frames, size, size, 3), np.uint8)
    for f in range(frames):
        img = rng.integers(90, 140, size=(size, size, 3)).astype(np.uint8)
        y = int(np.clip(y0 + dy * step * f - (dy * step * (frames - 1)) // 2, 0, size - h))
        x = int(np.clip(x0 + dx * step * f - (dx * step * (frames - 1)) // 2, 0, size - w))
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
