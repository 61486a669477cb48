"""Peak memory of thumbnails and service under idle connections (issue 25 items 2, 3), for docs/search.md.

    .venv/bin/python bench/serve_memory.py [--limit-gb 8] [--idle 64]

Each thumbnail case runs in a fresh subprocess that calls ``xmodal.features.media.thumbnail`` from
several threads at once (as the server's thread pool does) and prints its peak RSS (``VmHWM``: the
process's own high-water mark); the subprocess's address space is capped at ``--limit-gb`` so that
code without bounds cannot take the machine down (a case that hits the cap says so). The idle case
starts ``xmodal.serve.make_server`` on 127.0.0.1 with a trivial app, opens ``--idle`` TCP
connections that send nothing, then makes one normal request (status, or the error).

The script uses only names that existed before the bounds (``media.thumbnail``, ``serve.make_server``),
so the same script measures an older checkout: ``PYTHONPATH=OLD/src python bench/serve_memory.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

CHILD = r"""
import json, resource, sys, threading
limit = int(float(sys.argv[1]) * 2**30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from xmodal.features.media import thumbnail

def hwm():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024

paths = sys.argv[2:]
made, errors = [], []

def one(p):
    try:
        made.append(thumbnail(p, 192) is not None)
    except MemoryError:
        errors.append("MemoryError")

threads = [threading.Thread(target=one, args=(p,)) for p in paths]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"peak_mib": hwm(), "made": sum(made), "errors": errors}))
"""


def png(path: Path, width: int, height: int, rgba: bool = False) -> Path:
    """A valid all-black PNG (zeros compress: a few hundred KB at most)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    z = zlib.compressobj(9)
    row = b"\x00" * (1 + width * (4 if rgba else 3))
    body = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6 if rgba else 2,
                                                                     0, 0, 0)) + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


def video(path: Path, width: int, height: int, frames: int) -> Path | None:
    try:
        import av
        import numpy as np
    except ImportError:
        return None
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        img = np.zeros((height, width, 3), np.uint8)
        img[..., 0] = 180
        for _ in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def thumbs(paths: list[Path], limit_gb: float) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", CHILD, str(limit_gb), *map(str, paths)], capture_output=True,
                         text=True, env=env, timeout=1800)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        return f"failed (exit {res.returncode}: {last[:100]})"
    r = json.loads(res.stdout)
    extra = f", {len(r['errors'])} MemoryError at the {limit_gb:g} GiB cap" if r["errors"] else ""
    return f"peak {r['peak_mib']:.0f} MiB, {r['made']}/{len(paths)} thumbnails made{extra}"


def idle_connections(n: int) -> str:
    from xmodal.serve import bind_socket, make_server

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = make_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(n)]
    out = []
    try:
        for wait in (1, 30):
            time.sleep(wait)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as res:
                    out.append(f"after {wait} s: {res.status}")
            except urllib.error.HTTPError as err:
                out.append(f"after {wait} s: {err.code}")
            except OSError as err:
                out.append(f"after {wait} s: {type(err).__name__}")
        out.append(f"{len(server.server_state.connections)} connections open")
    finally:
        for s in idle:
            s.close()
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    return ", ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit-gb", type=float, default=8.0, help="address-space cap of each thumbnail subprocess")
    ap.add_argument("--idle", type=int, default=64, help="idle TCP connections before the normal request")
    args = ap.parse_args()
    import xmodal.features.media as media

    print(f"xmodal.features.media from {media.__file__}")
    tmp = Path(tempfile.mkdtemp(prefix="xmodal-serve-bench-"))
    try:
        huge = png(tmp / "huge.png", 12000, 12000)
        rgba = [png(tmp / "rgba0.png", 5000, 5000, rgba=True)]
        for i in (1, 2, 3):
            rgba.append(Path(shutil.copy(rgba[0], tmp / f"rgba{i}.png")))
        from PIL import Image

        Image.new("RGB", (8192, 8192), (200, 30, 30)).save(tmp / "big.jpg", quality=80)
        cases = [("1 x 12000x12000 PNG (%d KB)" % (huge.stat().st_size // 1024), [huge]),
                 ("20 x 12000x12000 PNG at once", [huge] * 20),
                 ("4 different 5000x5000 RGBA PNGs at once", rgba),
                 ("20 x 8192x8192 JPEG at once", [tmp / "big.jpg"] * 20)]
        for name, w, h, n in (("8192x8192", 8192, 8192, 5), ("4096x4096", 4096, 4096, 10),
                              ("3840x2160", 3840, 2160, 20)):
            v = video(tmp / f"v{w}.mp4", w, h, n)
            if v is not None:
                cases.append((f"video, {n} frames of {name}", [v]))
        for name, paths in cases:
            print(f"{name:42s} {thumbs(paths, args.limit_gb)}", flush=True)
        print(f"{args.idle} idle connections, then GET /       {idle_connections(args.idle)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
