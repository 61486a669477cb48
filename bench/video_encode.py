"""Speed and memory of ``xmodal encode videos`` against a bare loop, on generated clips.

The bare loop is the least one could write: PyAV decode of every frame, the same uniform choice, the same
PIL resize + ImageNet normalisation, one EfficientNet-Lite0 forward pass per batch of the same size. The
CLI run adds the per-video bookkeeping, the atomic ``.npy`` writes and the re-run check. Both are timed
in this process, alternating, the model loaded beforehand; the ratio is what to read (the machine may
be shared). Peak traced memory (tracemalloc: numpy and Python allocations, not torch's) of
``iter_encode_videos`` over 4 and 16 videos shows whether memory grows with the number of videos.

    python bench/video_encode.py [--videos 8] [--frames 24] [--sample 16] [--batch 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def make_clips(root: Path, n: int, frames: int, size: int = 224) -> list[Path]:
    """``n`` h264 clips: a smooth random pattern drifting across the frame."""
    import av

    rng = np.random.default_rng(0)
    paths = []
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for v in range(n):
        phase = rng.uniform(0, 6.28, 3)
        path = root / f"clip{v:03d}.mp4"
        with av.open(str(path), "w") as c:
            s = c.add_stream("libx264", rate=25)
            s.width = s.height = size
            s.pix_fmt = "yuv420p"
            for t in range(frames):
                img = np.stack([127 + 120 * np.sin(6 * xx + 3 * yy * (k + 1) + phase[k] + 0.2 * t)
                                for k in range(3)], axis=-1).astype(np.uint8)
                for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        paths.append(path)
    return paths


def bare_loop(paths, sample: int, batch: int) -> int:
    import av
    import torch
    from PIL import Image

    from xmodal.features.encoders import _efficientnet_lite0_model, preprocess_image
    from xmodal.features.video import uniform_indices

    net = _efficientnet_lite0_model()
    buf, outs, n = [], [], 0
    with torch.inference_mode():
        for path in paths:
            with av.open(str(path)) as c:
                frames = [f for f in c.decode(c.streams.video[0])]
            for i in uniform_indices(len(frames), sample):
                buf.append(preprocess_image(Image.fromarray(frames[i].to_ndarray(format="rgb24"))))
                if len(buf) == batch:
                    outs.append(net.extract_features(torch.from_numpy(np.stack(buf))).mean(dim=(2, 3)).numpy())
                    n += len(buf)
                    buf = []
        if buf:
            outs.append(net.extract_features(torch.from_numpy(np.stack(buf))).mean(dim=(2, 3)).numpy())
            n += len(buf)
    return n


def cli_run(src: Path, out: Path, sample: int, batch: int) -> None:
    from xmodal.cli import main

    shutil.rmtree(out, ignore_errors=True)
    rc = main(["encode", "videos", str(src), "--out", str(out), "--frames", str(sample),
               "--batch-size", str(batch), "--no-progress"])
    assert rc == 0, rc


def peak_traced(paths, sample: int, batch: int) -> float:
    from xmodal.features.encoders import iter_encode_videos

    tracemalloc.start()
    for _ in iter_encode_videos(paths, frames=sample, batch_size=batch):
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--frames", type=int, default=24, help="frames per generated clip")
    ap.add_argument("--sample", type=int, default=16, help="--frames given to encode videos")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from xmodal.features.encoders import _efficientnet_lite0_model

    torch.set_num_threads(args.threads)
    _efficientnet_lite0_model()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "videos"
        src.mkdir()
        paths = make_clips(src, max(args.videos, 16), args.frames)
        for p in paths[args.videos:]:  # the extra clips are for the memory check only
            p.rename(tmp / p.name)
        extra = [tmp / p.name for p in paths[args.videos:]]
        paths = paths[:args.videos]
        n_frames = args.videos * min(args.sample, args.frames)
        t_cli, t_bare = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            cli_run(src, tmp / "feats", args.sample, args.batch)
            t_cli.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert bare_loop(paths, args.sample, args.batch) == n_frames
            t_bare.append(time.perf_counter() - t0)
        cli, bare = min(t_cli), min(t_bare)
        print(f"{args.videos} clips x {args.frames} frames (224x224 h264), --frames {args.sample}, "
              f"batch {args.batch}, {args.threads} thread(s), best of {args.repeats}")
        print(f"encode videos: {n_frames / cli:.1f} frames/s ({cli:.2f} s)")
        print(f"bare loop:     {n_frames / bare:.1f} frames/s ({bare:.2f} s)")
        print(f"ratio (encode videos time / bare loop time): {cli / bare:.2f}")
        from xmodal.features.video import decode_frames

        t0 = time.perf_counter()
        decoded = sum(len(decode_frames(p)) for p in paths)
        dt = time.perf_counter() - t0
        print(f"PyAV decode alone (every frame, RGB): {decoded / dt:.0f} frames/s")
        all16 = paths + extra
        m4, m16 = peak_traced(all16[:4], args.sample, args.batch), peak_traced(all16[:16], args.sample, args.batch)
        print(f"peak traced memory: 4 videos {m4:.1f} MiB, 16 videos {m16:.1f} MiB (ratio {m16 / m4:.2f})")


if __name__ == "__main__":
    main()
