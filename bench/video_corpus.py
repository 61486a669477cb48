"""The video corpus of issue 26, generated: a flat folder of 420 clips (Ken-Burns pans and multi-shot cuts over
Flickr8k dev images, so that their captions describe them) in many codecs and containers (h264, hevc, vp9, AV1,
ProRes, mpeg4, mjpeg, MPEG-2; mp4, mkv, webm, avi, mov, MPEG-TS, MPEG-PS), odd sizes, 10-bit, portrait,
1 frame to 60 s, variable frame rate, audio, broken and truncated files, macOS leftovers, with ``pairs.csv``
(the images' captions, 300/60/60 train/val/test); and a camera folder (subfolders, AVCHD ``.MTS``, ``.3gp``,
``.ts``/``.m2ts``, a file without extension, a folder named ``trip.mp4``, a FIFO, a symlink loop, a dangling
link, hidden files) with ``camera_pairs.csv``. The "From video files" numbers (docs/video.md) come from running its
commands on these (``--out /tmp/vcorpus``; seeded).

    python bench/video_corpus.py --out /tmp/vcorpus [--flickr ../shared/data/flickr8k] [--big]

``--big`` also writes the two files of issue 25's memory measurements, each alone in a folder:
``in8k/huge_8192.mp4`` (30 flat 8192x8192 h264 frames) and ``in720/clip_720p_30s.mp4`` (900 moving
1280x720 h264 frames, 30 s at 30 fps).
"""
import argparse
import csv
import fractions
import os
from pathlib import Path

import av
import numpy as np
from PIL import Image

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--out", required=True, help="folder to create (flat/, camera/, pairs.csv, camera_pairs.csv)")
ap.add_argument("--big", action="store_true", help="also the 8192x8192 and the 30 s 720p file (memory checks)")
ap.add_argument("--flickr", default=str(Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "flickr8k"))
args = ap.parse_args()
SH = Path(args.flickr)
ROOT = Path(args.out)
OUT = ROOT / "flat"
rng = np.random.default_rng(0)
caps = {}
with open(SH / "dev_captions.tsv") as f:
    for r in csv.DictReader(f, delimiter="\t"):
        caps.setdefault(r["image"], []).append(r["caption"])
images = sorted(caps)[:420]

def frames_of(img, n, w, h, shots=None):
    with Image.open(SH / "dev_images" / img) as im:
        big = im.convert("RGB")
    W, H = big.size
    out = []
    for i in range(n):
        if shots:  # multi-shot: cut to another image every n // shots frames
            k = (i * shots) // max(n, 1)
            src = big if k % 2 == 0 else big.transpose(Image.FLIP_LEFT_RIGHT)
            out.append(np.asarray(src.resize((w, h), Image.BILINEAR)))
            continue
        t = i / max(n - 1, 1)
        side = min(W, H) * (1.0 - 0.3 * t)
        x0 = (W - side) * t
        crop = big.crop((int(x0), 0, int(x0 + side), int(side)))
        out.append(np.asarray(crop.resize((w, h), Image.BILINEAR)))
    return out

SPECS = [  # (ext, codec, pix, fmt, kw)
    ("mp4", "libx264", "yuv420p", None, {}), ("mkv", "libx265", "yuv420p", None, {"x265-params": "log-level=error"}),
    ("webm", "libvpx-vp9", "yuv420p", None, {}), ("mp4", "libsvtav1", "yuv420p", None, {}),
    ("mov", "prores", "yuv422p10le", None, {}), ("avi", "mpeg4", "yuv420p", None, {}),
    ("avi", "mjpeg", "yuvj420p", None, {}), ("ts", "mpeg2video", "yuv420p", "mpegts", {}),
    ("mpg", "mpeg2video", "yuv420p", None, {}), ("mp4", "libx264", "yuv420p10le", None, {}),
]

def write(path, frames, codec, pix, fmt, opts, rate=10, vfr=False, audio=False):
    h, w = frames[0].shape[:2]
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=rate, options=opts)
        s.width, s.height, s.pix_fmt = w, h, pix
        if codec == "mpeg4":
            s.bit_rate = 2_000_000
        if vfr:
            s.time_base = fractions.Fraction(1, 1000)
            s.codec_context.time_base = fractions.Fraction(1, 1000)
        a = c.add_stream("aac", rate=16000) if audio else None
        t = 0
        for i, arr in enumerate(frames):
            fr = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            if vfr:
                fr.pts = t
                fr.time_base = fractions.Fraction(1, 1000)
                t += int(rng.choice([40, 100, 250]))
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
        if a is not None:
            for k in range(int(len(frames) / rate * 16000 / 1024) + 1):
                af = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
                af.sample_rate, af.pts = 16000, k * 1024
                for p in a.encode(af):
                    c.mux(p)
            for p in a.encode():
                c.mux(p)

OUT.mkdir(parents=True, exist_ok=True)
rows = []
for i, img in enumerate(images):
    ext, codec, pix, fmt, opts = SPECS[i % len(SPECS)]
    w, h = [(160, 120), (224, 224), (120, 160), (320, 180), (96, 96)][i % 5]  # portrait every 5th
    if codec == "libsvtav1":
        w, h = 160, 120
    n = [1, 8, 20, 35, 50][(i // 10) % 5]
    if i == 7:
        n = 600  # a 60 s clip at 10 fps
    name = f"v{i:03d}.{ext}"
    frames = frames_of(img, n, w, h, shots=3 if i % 7 == 3 else None)
    try:
        write(OUT / name, frames, codec, pix, fmt, opts, vfr=(i % 13 == 5 and ext in ("mp4", "mkv")),
              audio=(i % 11 == 4 and ext in ("mp4", "mkv", "mov")))
    except Exception as e:
        print("could not write", name, codec, e)
        continue
    split = "train" if i < 300 else ("val" if i < 360 else "test")
    for c in caps[img]:
        rows.append((f"v{i:03d}", c, split, img))
# odd sizes (x264 4:4:4 allows odd widths)
write(OUT / "odd_173x97.mp4", frames_of(images[0], 12, 173, 97), "libx264", "yuv444p", None, {})
# broken files
full = OUT / "v001.mp4"
data = (OUT / "v002.webm").read_bytes()
(OUT / "broken_half.webm").write_bytes(data[: len(data) // 2])
(OUT / "broken_random.mp4").write_bytes(rng.bytes(3000))
(OUT / "broken_empty.mp4").write_bytes(b"")
write(OUT / "cut_src.mkv", frames_of(images[1], 75, 160, 120), "libx264", "yuv420p", "matroska", {}, rate=25)
d = (OUT / "cut_src.mkv").read_bytes(); (OUT / "truncated.mkv").write_bytes(d[: len(d) // 2]); (OUT / "cut_src.mkv").unlink()
# macOS leftovers and notes
for k in range(3):
    (OUT / f"._v{k:03d}.mp4").write_bytes(b"\x00\x05\x16\x07" + bytes(200))
(OUT / ".DS_Store").write_bytes(bytes(100))
(OUT / "README.txt").write_text("clips for the retrieval test\n")
with open(ROOT / "pairs.csv", "w", newline="") as f:
    wr = csv.writer(f)
    wr.writerow(["video_id", "caption", "split"])
    for v, c, s, _ in rows:
        wr.writerow([v, c, s])
    for b in ("broken_half", "broken_random", "truncated"):
        wr.writerow([b, "a clip that may not decode", "train"])
print(len(os.listdir(OUT)), "entries;", len(rows), "pairs")

# --- the camera folder
CAM = ROOT / "camera"
layout = [("DCIM/100CANON/MVI_0001.MOV", "libx264", "yuv420p", "mov"), ("DCIM/100CANON/MVI_0002.MOV", "libx264", "yuv420p", "mov"),
          ("PRIVATE/AVCHD/BDMV/STREAM/00000.MTS", "libx264", "yuv420p", "mpegts"),
          ("PRIVATE/AVCHD/BDMV/STREAM/00001.MTS", "mpeg2video", "yuv420p", "mpegts"),
          ("phone/VID_20240501.3gp", "h263", "yuv420p", "3gp"), ("phone/VID_20240502.3gp", "libx264", "yuv420p", "3gp"),
          ("GoPro/GH010001.MP4", "libx264", "yuv420p", "mp4"), ("recorder/rec.ts", "mpeg2video", "yuv420p", "mpegts"),
          ("recorder/rec2.m2ts", "libx264", "yuv420p", "mpegts"), ("exports/no_extension", "libx264", "yuv420p", "mp4"),
          ("trip.mp4/inside.webm", "libvpx-vp9", "yuv420p", "webm"), ("top.mp4", "libx264", "yuv420p", "mp4")]
rows = []
for k, (rel, codec, pix, fmt) in enumerate(layout):
    p = CAM / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    w, h = (176, 144) if codec == "h263" else (160, 120)
    write(p, frames_of(images[k], 30, w, h), codec, pix, fmt, {})
    vid = rel.rsplit(".", 1)[0] if "." in Path(rel).name else rel
    for c in caps[images[k]]:
        rows.append((vid, c, "train" if k < 8 else "val"))
(CAM / ".hidden").mkdir()
write(CAM / ".hidden" / "secret.mp4", frames_of(images[30], 5, 64, 48), "libx264", "yuv420p", None, {})
(CAM / "DCIM" / "100CANON" / "._MVI_0001.MOV").write_bytes(b"\x00\x05\x16\x07" + bytes(300))
os.mkfifo(CAM / "pipe.mp4")
(CAM / "loop.mp4").symlink_to(CAM / "loop.mp4")
(CAM / "dangling.mov").symlink_to(CAM / "gone.mov")
(CAM / "notes.txt").write_text("holiday\n")
with open(ROOT / "camera_pairs.csv", "w", newline="") as f:
    wr = csv.writer(f); wr.writerow(["video_id", "caption", "split"]); wr.writerows(rows)
print("camera:", sum(len(fs) + len(ds) for _, ds, fs in os.walk(CAM)), "entries")


# --- the memory cases of issue 25 item 1
def _plain(path, w, h, n, rate, pattern):
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=rate, options={"preset": "ultrafast"})
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            for p in s.encode(av.VideoFrame.from_ndarray(pattern(i), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


if args.big:
    (ROOT / "in8k").mkdir(exist_ok=True)
    (ROOT / "in720").mkdir(exist_ok=True)
    flat = np.zeros((8192, 8192, 3), np.uint8)

    def huge(i):
        flat[:] = (i * 8) % 256
        return flat

    _plain(ROOT / "in8k" / "huge_8192.mp4", 8192, 8192, 30, 10, huge)
    yy, xx = np.mgrid[0:720, 0:1280]

    def moving(i):
        return np.ascontiguousarray(np.stack([((xx + 8 * i) % 256).astype(np.uint8), ((yy + 4 * i) % 256).astype(np.uint8),
                                              (((xx // 64 + yy // 64 + i // 30) % 2) * 200).astype(np.uint8)], -1))

    _plain(ROOT / "in720" / "clip_720p_30s.mp4", 1280, 720, 900, 30, moving)
    print("memory cases:", ROOT / "in8k", ROOT / "in720")
