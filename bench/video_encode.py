"""Speed and memory of ``xmodal encode videos`` against a bare loop, on generated clips.

The bare loop is the least one could write: PyAV decode of every frame, the same uniform choice, the same
PIL resize + ImageNet normalisation, one EfficientNet-Lite0 forward pass per batch of the same size. The
CLI run adds the per-video bookkeeping, the atomic ``.npy`` writes and the re-run check. Both are timed
in this process, alternating, the model loaded beforehand; the ratio is what to read (the machine may
be shared). Memory is the peak resident set size (``ru_maxrss``: what a scheduler's memory limit sees,
torch and FFmpeg included) of a fresh ``xmodal encode videos`` process over 4 and over 16 videos, and
with ``--big`` over one 1920x1080 clip with every frame: it must not grow with the number of videos or
with the frame size.

    python bench/video_encode.py [--videos 8] [--frames 24] [--sample 16] [--batch 32] [--repeats 2] [--big]
        [--write docs/results/data/video_encode.json]

(``--write FILE.json``: every printed value with the run's provenance, ``bench/resultfile.py``, for the docs.)

``--workers N`` instead times ``xmodal encode videos --workers N`` against ``--workers 1`` (issue 34.7) on
clips where decoding costs what it costs on real footage: ``--clips`` clips of ``--size`` (1280x720) at
``--rate`` (30) fps, ``--seconds`` (10) s long, a smooth texture panning across the frame, encoded at
``--fps`` (1) frame per second (30 frames decoded per frame encoded). Both runs go through the CLI in
this process, alternating, best of ``--repeats``, with ``--threads`` torch threads; the features of the
two must be equal byte for byte. Printed after them: decoding alone and encoding alone in one process,
and the most overlapping the two can give. ``--stand-in`` replaces EfficientNet-Lite0 by an encoder that
costs next to nothing (each frame's mean colour), as a GPU encoder nearly does next to CPU decoding.

    python bench/video_encode.py --workers 2 [--clips 8] [--size 1280x720] [--seconds 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import subprocess
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def make_clips(root: Path, n: int, frames: int, size: int = 224, width: int | None = None) -> list[Path]:
    """``n`` h264 clips (``width`` x ``size``): a smooth random pattern drifting across the frame."""
    import av

    rng = np.random.default_rng(0)
    paths = []
    width = width or size
    yy, xx = np.mgrid[0:size, 0:width].astype(np.float32) / size
    for v in range(n):
        phase = rng.uniform(0, 6.28, 3)
        path = root / f"clip{v:03d}.mp4"
        with av.open(str(path), "w") as c:
            s = c.add_stream("libx264", rate=25)
            s.width, s.height = width, size
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


def peak_rss(src: Path, out: Path, sampling: list[str], batch: int, threads: int) -> float:
    """Peak RSS (MiB) of a fresh process running ``xmodal encode videos SRC`` (the model loaded inside)."""
    code = ("import resource, sys; from xmodal.cli import main; rc = main(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
    shutil.rmtree(out, ignore_errors=True)
    res = subprocess.run([sys.executable, "-c", code, "encode", "videos", str(src), "--out", str(out), *sampling,
                          "--batch-size", str(batch), "--threads", str(threads), "--quiet"],
                         capture_output=True, text=True, check=True)
    return int(res.stdout.split()[-1]) / 1024


def make_footage(root: Path, n: int, *, width: int, height: int, rate: int, seconds: float) -> list[Path]:
    """``n`` h264 clips: a smooth random texture (bicubic upsampling of noise) panning across the frame."""
    import av
    from PIL import Image

    rng = np.random.default_rng(1)
    frames = int(round(rate * seconds))
    paths = []
    for v in range(n):
        small = rng.integers(0, 256, (height // 16 + 2, (width + frames * 4) // 16 + 2, 3), dtype=np.uint8)
        texture = np.asarray(Image.fromarray(small).resize((small.shape[1] * 16, small.shape[0] * 16),
                                                         Image.BICUBIC))
        path = root / f"footage{v:03d}.mp4"
        with av.open(str(path), "w") as c:
            s = c.add_stream("libx264", rate=rate)
            s.width, s.height, s.pix_fmt = width, height, "yuv420p"
            s.options = {"preset": "veryfast", "crf": "23"}
            for t in range(frames):
                img = np.ascontiguousarray(texture[:height, 4 * t:4 * t + width])
                for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        paths.append(path)
    return paths


STAND_IN = "stand-in-mean-rgb"


def _stand_in(images, *, batch_size, progress):
    """An image encoder that costs next to nothing (each frame's mean R, G, B), as a GPU encoder nearly does
    next to CPU decoding: the run then measures the decoding pipeline."""
    return np.stack([np.asarray(im.convert("RGB"), np.float32).mean((0, 1)) for im in images])


def workers_run(src: Path, out: Path, workers: int, fps: float, batch: int, model: str) -> float:
    from xmodal.cli import main as cli

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    rc = cli(["encode", "videos", str(src), "--out", str(out), "--fps", str(fps), "--batch-size", str(batch),
              "--workers", str(workers), "--no-progress", "--model", model])
    assert rc == 0, rc
    return time.perf_counter() - t0


from xmodal.features.video import DECODE_THREADS  # noqa: E402  (the path is set above)


def components(paths: list[Path], fps: float, batch: int, model: str) -> tuple[float, float]:
    """Seconds to decode the clips alone (sampled frames as RGB, in this process) and to encode those
    frames alone (the image encoder, batches of ``batch``)."""
    from PIL import Image

    from xmodal.features.decoders import FRAME, video_events
    from xmodal.features.encoders import ENCODE_MAX_SIDE, get_encoder

    t0 = time.perf_counter()
    frames = [Image.fromarray(v) for p in paths
              for k, v in video_events(p, frames=None, fps=fps, max_side=ENCODE_MAX_SIDE, max_pixels=2**40)
              if k == FRAME]
    decode = time.perf_counter() - t0
    enc = get_encoder(model, "image")
    t0 = time.perf_counter()
    for start in range(0, len(frames), batch):
        enc.fn(frames[start:start + batch], batch_size=batch, progress=False)
    return decode, time.perf_counter() - t0


def workers_section(args: argparse.Namespace) -> dict:
    from xmodal.features.encoders import register_encoder

    w, h = (int(x) for x in args.size.lower().split("x"))
    model = "efficientnet-lite0"
    if args.stand_in:
        register_encoder(STAND_IN, _stand_in, kind="image", overwrite=True)
        model = STAND_IN
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "footage"
        src.mkdir()
        t0 = time.perf_counter()
        make_footage(src, args.clips, width=w, height=h, rate=args.rate, seconds=args.seconds)
        made = time.perf_counter() - t0
        times: dict[int, list[float]] = {1: [], args.workers: []}
        for _ in range(args.repeats):  # alternating: the machine's load drifts
            for n in (1, args.workers):
                times[n].append(workers_run(src, tmp / f"w{n}", n, args.fps, args.batch, model))
        decode, encode = components(sorted(src.glob("*.mp4")), args.fps, args.batch, model)
        feats = {n: {p.name: np.load(p) for p in sorted((tmp / f"w{n}").glob("*.npy"))} for n in times}
        frames = sum(f.shape[0] for f in feats[1].values())
        same = feats[1].keys() == feats[args.workers].keys() and all(
            feats[1][k].tobytes() == feats[args.workers][k].tobytes() for k in feats[1])
        one, many = min(times[1]), min(times[args.workers])
        decoded = args.clips * int(round(args.rate * args.seconds))
        print(f"encoder {model}; {args.clips} clips {w}x{h}, {args.rate} fps, {args.seconds:g} s (made in {made:.0f} s); --fps "
              f"{args.fps:g}: {frames} frames encoded of {decoded} decoded; batch {args.batch}, {args.threads} torch "
              f"thread(s), {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; best of {args.repeats}")
        print("| --workers | wall | frames/s | x --workers 1 |")
        print("| ---: | ---: | ---: | ---: |")
        for n, t in ((1, one), (args.workers, many)):
            print(f"| {n} | {t:.1f} s ({', '.join(f'{x:.1f}' for x in times[n])}) | {frames / t:.2f} | "
                  f"{one / t:.2f} |")
        print(f"features of --workers {args.workers} equal to --workers 1, byte for byte: {same}")
        print(f"in one process, after the runs: decoding alone {decode:.1f} s (FFmpeg's own {DECODE_THREADS} "
              f"threads), encoding alone {encode:.1f} s (no number of decoding workers brings the wall time below "
              f"the encoder's; on a machine whose cores are all busy, more processes gain nothing)")
        return {"encoder": model, "clips": args.clips, "size": args.size, "rate": args.rate, "seconds": args.seconds,
                "fps": args.fps, "frames_encoded": frames, "frames_decoded": decoded, "batch": args.batch,
                "threads": args.threads, "repeats": args.repeats, "workers": args.workers,
                "load_average": os.getloadavg()[0], "wall_s": {"1": one, str(args.workers): many},
                "walls_s": {str(n): t for n, t in times.items()}, "frames_per_s": {"1": frames / one,
                str(args.workers): frames / many}, "speedup": one / many, "features_equal": "yes" if same else "no",
                "decode_alone_s": decode, "encode_alone_s": encode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--frames", type=int, default=24, help="frames per generated clip")
    ap.add_argument("--sample", type=int, default=16, help="--frames given to encode videos")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--big", action="store_true", help="also the peak RSS of one 1920x1080 clip, every frame")
    ap.add_argument("--workers", type=int, default=0, help="time --workers N against --workers 1 (only that)")
    ap.add_argument("--clips", type=int, default=8, help="--workers: clips generated")
    ap.add_argument("--size", default="1280x720", help="--workers: frame size WxH")
    ap.add_argument("--rate", type=int, default=30, help="--workers: frames per second of the clips")
    ap.add_argument("--seconds", type=float, default=10.0, help="--workers: length of each clip")
    ap.add_argument("--fps", type=float, default=1.0, help="--workers: frames encoded per second of video")
    ap.add_argument("--stand-in", action="store_true",
                    help="--workers: a stand-in encoder that costs nothing (a GPU's share, nearly): decoding alone")
    ap.add_argument("--write", metavar="FILE.json",
                    help="also write the values as a result file the docs pages render")
    args = ap.parse_args()
    import torch

    from xmodal.features.encoders import _efficientnet_lite0_model

    torch.set_num_threads(args.threads)
    _efficientnet_lite0_model()
    if args.workers:
        result = workers_section(args)
        if args.write:
            _write(args.write, result)
        return
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
        four, sixteen = tmp / "four", tmp / "sixteen"
        four.mkdir()
        sixteen.mkdir()
        for p in (paths + extra)[:16]:
            shutil.copy(p, sixteen / p.name)
            if len(list(four.iterdir())) < 4:
                shutil.copy(p, four / p.name)
        sampling = ["--frames", str(args.sample)]
        m4 = peak_rss(four, tmp / "f4", sampling, args.batch, args.threads)
        m16 = peak_rss(sixteen, tmp / "f16", sampling, args.batch, args.threads)
        print(f"peak RSS of encode videos: 4 videos {m4:.0f} MiB, 16 videos {m16:.0f} MiB (ratio {m16 / m4:.2f})")
        result = {"videos": args.videos, "frames": args.frames, "sample": args.sample, "batch": args.batch,
                  "threads": args.threads, "repeats": args.repeats, "load_average": os.getloadavg()[0],
                  "encode_videos_fps": n_frames / cli, "bare_loop_fps": n_frames / bare, "ratio": cli / bare,
                  "decode_fps": decoded / dt, "peak_rss_mib": {"4": m4, "16": m16}}
        if args.big:
            big = tmp / "big"
            big.mkdir()
            make_clips(big, 1, 30, size=1080, width=1920)
            mb = peak_rss(big, tmp / "fb", ["--all-frames"], args.batch, args.threads)
            frames = 30 * 1920 * 1080 * 3 / 2**20
            print(f"peak RSS, one 1920x1080 clip, every frame (30 frames, {frames:.0f} MiB of RGB): {mb:.0f} MiB "
                  f"(ratio to 4 small videos {mb / m4:.2f})")
            result["peak_rss_mib"]["big"], result["big_rgb_mib"] = mb, frames
    if args.write:
        _write(args.write, result)


def _write(path: str, result: dict) -> None:
    """``result`` with this run's provenance, as a result file the docs render (``bench/resultfile.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import resultfile

    data = resultfile.provenance("bench/video_encode.py", None, "bench/video_encode.py --write (this file is its output)")
    resultfile.write_json(path, {**data, **result})


if __name__ == "__main__":
    main()
