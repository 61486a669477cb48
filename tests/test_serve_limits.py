"""``xmodal serve`` stays up (issue 25 items 2, 3 and the serve part of 7): idle and slow-header
connections, a quick 503 past the request limit, thumbnails of huge images within a memory budget
(peak RSS measured in a subprocess), ``/thumb/<5000 digits>``, a replaced or deleted index folder,
``report --images`` on a decompression bomb, and one-line errors for junk arguments.

Real clients over real sockets on 127.0.0.1; timeouts are small settings of the server under test,
and a test fails only when the server never closes or never answers (a 30 s socket timeout), never on
how fast it was.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import shutil
import socket
import struct
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("starlette", reason="starlette not installed (pip install 'xmodal[serve]')")
pytest.importorskip("uvicorn", reason="uvicorn not installed (pip install 'xmodal[serve]')")
pytest.importorskip("httpx", reason="httpx (Starlette's TestClient) not installed (pip install 'xmodal[serve-test]')")
Image = pytest.importorskip("PIL.Image", reason="Pillow not installed (pip install 'xmodal[serve]')")

from starlette.testclient import TestClient  # noqa: E402

from xmodal.cli import main  # noqa: E402
from xmodal.data.synthetic import synthetic  # noqa: E402
from xmodal.features import encoders  # noqa: E402
from xmodal.retrieval.build import write_index  # noqa: E402
from xmodal.serve import bind_socket, create_app, is_loopback, make_server, parse_query, parse_request  # noqa: E402
from xmodal.serve.app import RequestLimits  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
HAVE_AV = importlib.util.find_spec("av") is not None
TEXT_DIM = 32


def png_header_only(path: Path, width: int, height: int, color_type: int = 2, channels: int = 3) -> Path:
    """A valid PNG of ``width x height`` black pixels: a few hundred KB at most (zeros compress)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    z = zlib.compressobj(9)
    row = b"\x00" * (1 + width * channels)
    body = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0))
                     + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


def png_bomb(path: Path, side: int = 100_000) -> Path:
    """68 bytes declaring ``side x side`` pixels."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    return path


@pytest.fixture(scope="module")
def split():
    return synthetic(num_train=10, num_val=10, num_test=12, num_concepts=4, text_dim=TEXT_DIM, seed=1)["test"]


@pytest.fixture(scope="module")
def text_encoder(split):
    def fn(texts, *, batch_size, progress):
        return np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(TEXT_DIM)
                         for t in texts]).astype(np.float32)

    encoders.register_encoder("limits-test", fn, overwrite=True)
    yield "limits-test"
    encoders.ENCODERS.pop("limits-test", None)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("run")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 60, "num_val": 30, "num_test": 12,
                                                     "num_concepts": 4, "text_dim": TEXT_DIM}},
        "model": {"kind": "linear", "dim": 8}, "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none"], "bank_size": 30}, "train": {"seed": 0, "epochs": 1, "batch_size": 16},
    })
    train(cfg, root / "run", resume=False, progress=False)
    return root / "run"


@pytest.fixture(scope="module")
def index_dir(run_dir, split, text_encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "index"
    write_index(str(run_dir), split.video, out, normalizer="none", names=[f"a{i}" for i in range(len(split.video))],
                text_encoder=text_encoder)
    return out


class LiveServer:
    def __init__(self, app, **kwargs):
        self.sock = bind_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(app, **kwargs)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()
        assert not self.thread.is_alive()

    def open_connections(self) -> int:
        return len(self.server.server_state.connections)


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as res:
            return res.status, res.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def closed_by_server(sock: socket.socket, trickle: bytes = b"") -> bool:
    """Whether the server closes ``sock`` (read b'' or a reset) before a 30 s socket timeout, while the
    client sends one byte of ``trickle`` now and then."""
    sock.settimeout(0.25)
    for i in range(120):
        try:
            if trickle:
                sock.sendall(trickle[i % len(trickle):i % len(trickle) + 1])
            if sock.recv(64) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


# ----------------------------------------------------------------------------- connections
def test_many_idle_connections_do_not_deny_service(index_dir):
    """Was: 64 idle connections -> every other request 503 (uvicorn's limit_concurrency counted them)."""
    app = create_app(index_dir, warm_up=False)
    with LiveServer(app, header_timeout=30, max_connections=32) as live:
        idle = [socket.create_connection(("127.0.0.1", live.port), timeout=30) for _ in range(100)]
        try:
            for _ in range(3):
                status, body = http_get(live.url + "/api/search?q=a%20dog&k=3")
                assert status == 200 and len(json.loads(body)["results"]) == 3
            assert live.open_connections() <= 33
            assert sum(closed_by_server(s) for s in idle[:10]) == 10  # the oldest idle ones were closed
        finally:
            for s in idle:
                s.close()


def test_slow_header_client_is_closed_and_others_served(index_dir):
    app = create_app(index_dir, warm_up=False)
    with LiveServer(app, header_timeout=1.0) as live:
        slow = socket.create_connection(("127.0.0.1", live.port), timeout=30)
        silent = socket.create_connection(("127.0.0.1", live.port), timeout=30)
        try:
            slow.sendall(b"GET /api/search?q=x HTTP/1.1\r\nHost: x\r\n")
            assert http_get(live.url + "/api/search?q=dog")[0] == 200
            assert closed_by_server(slow, trickle=b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaa")  # bytes keep coming
            assert closed_by_server(silent)  # never sent anything
            # after a response, a keep-alive connection gets the same deadline for its next request head
            keep = socket.create_connection(("127.0.0.1", live.port), timeout=30)
            keep.sendall(b"GET /api/search?q=dog HTTP/1.1\r\nHost: x\r\n\r\n")
            assert keep.recv(12).startswith(b"HTTP/1.1 200")
            assert closed_by_server(keep, trickle=b"GET / HTTP/1.1\r\nHost: x\r\n")
            assert http_get(live.url + "/api/search?q=dog")[0] == 200
        finally:
            slow.close()
            silent.close()


def test_requests_past_the_limit_get_a_quick_503():
    async def scenario():
        gate = asyncio.Event()
        started = []

        async def slow_app(scope, receive, send):
            started.append(scope["path"])
            await gate.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        mw = RequestLimits(slow_app, max_requests=2)
        sent: list[list] = [[], [], []]

        def call(i):
            scope = {"type": "http", "path": "/", "raw_path": b"/", "query_string": b"", "headers": [],
                     "method": "GET"}

            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message):
                sent[i].append(message)

            return mw(scope, receive, send)

        first = [asyncio.ensure_future(call(i)) for i in range(2)]
        while len(started) < 2:
            await asyncio.sleep(0)
        await call(2)  # answered while the two others still wait
        third = sent[2][0]["status"], json.loads(sent[2][1]["body"])["error"]
        gate.set()
        await asyncio.gather(*first)
        return third, [s[0]["status"] for s in sent[:2]], mw.in_progress

    (status, message), others, left = asyncio.run(scenario())
    assert status == 503 and message.startswith("server: busy (2 requests in progress)")
    assert others == [200, 200] and left == 0


def test_thumb_with_5000_digits_is_404_not_500(index_dir, tmp_path):
    (tmp_path / "a0.png").write_bytes(b"")
    client = TestClient(create_app(index_dir, images=tmp_path, warm_up=False))
    for path in ("/thumb/" + "9" * 5000, "/thumb/" + "1" * 19, "/thumb/٣", "/thumb/0x1", "/thumb/-1", "/thumb/0"):
        res = client.get(path)
        assert res.status_code == 404 and res.json() == {"error": "thumbnail: none for this item"}, path


# ----------------------------------------------------------------------------- the index folder changes
def test_replaced_index_is_reloaded_and_deleted_one_is_a_clear_503(run_dir, split, text_encoder, tmp_path, capsys):
    out = tmp_path / "idx"
    write_index(str(run_dir), split.video, out, normalizer="none", names=[f"a{i}" for i in range(12)],
                text_encoder=text_encoder)
    client = TestClient(create_app(out, warm_up=False))
    first = client.get("/api/search", params={"q": "dog", "k": 12}).json()["results"]
    assert {r["name"] for r in first} == {f"a{i}" for i in range(12)}
    np.save(tmp_path / "v.npy", split.video[:5])
    (tmp_path / "names.txt").write_text("".join(f"b{i}\n" for i in range(5)))
    assert main(["index", "--run", str(run_dir), "--video-features", str(tmp_path / "v.npy"), "--out", str(out),
                 "--names", str(tmp_path / "names.txt"), "--text-encoder", text_encoder, "--overwrite"]) == 0
    capsys.readouterr()
    again = client.get("/api/search", params={"q": "dog", "k": 12}).json()
    assert {r["name"] for r in again["results"]} == {f"b{i}" for i in range(5)}  # was: still a0..a11
    assert client.get("/api/search", params={"video": "b3"}).status_code == 200
    assert '5 items' in client.get("/").text
    shutil.rmtree(out)
    for path in ("/api/search?q=dog", "/api/search?video=b1", "/thumb/1"):
        res = client.get(path)
        assert res.status_code == 503 and "has no meta.json: it was deleted" in res.json()["error"]
    page = client.get("/")
    assert page.status_code == 503 and "it was deleted" in page.text
    write_index(str(run_dir), split.video, out, normalizer="none", names=[f"c{i}" for i in range(12)],
                text_encoder=text_encoder)
    assert client.get("/api/search", params={"q": "dog"}).json()["results"][0]["name"].startswith("c")
    (out / "index.faiss").write_bytes(b"garbage")  # a broken file: 503 naming the folder, not a 500
    res = client.get("/api/search", params={"q": "dog"})
    assert res.status_code == 503 and "cannot be opened now" in res.json()["error"]


# ----------------------------------------------------------------------------- thumbnails' memory
MEASURE = r"""
import json, sys, threading
from pathlib import Path
from xmodal.serve.thumbs import Thumbnails

def hwm_kib():  # this process's peak RSS (VmHWM: ru_maxrss would count the forking parent's)
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])

root, names = Path(sys.argv[1]), json.loads(sys.argv[2])
th = Thumbnails(root, names)
before = hwm_kib()
out = {}
threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, (th.get(i) is not None, th.reason(i))))
           for i in range(len(names))]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"before_mib": before / 1024, "peak_mib": hwm_kib() / 1024,
                  "made": [out[i][0] for i in range(len(names))], "reasons": [out[i][1] for i in range(len(names))]}))
"""


def measure(root: Path, names: list[str]) -> dict:
    res = subprocess.run([sys.executable, "-c", MEASURE, str(root), json.dumps(names)], capture_output=True,
                         text=True, timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def test_huge_images_in_20_concurrent_requests_stay_within_the_budget(tmp_path):
    """Was: 1.26 GB per request of a 12000x12000 PNG, 12.9-14.2 GB for 20 at once (1683 MiB for one here)."""
    png_header_only(tmp_path / "huge.png", 12000, 12000)
    r = measure(tmp_path, ["huge.png"] * 20)
    assert r["made"] == [False] * 20 and r["peak_mib"] < 150, r
    assert r["reasons"][0] == "huge.png: 12000x12000 pixels, over the thumbnail budget of 36,000,000 pixels"
    # images inside the budget are decoded one at a time: 4 RGBA 25 MP files at once cost what one does
    png_header_only(tmp_path / "big0.png", 5000, 5000, color_type=6, channels=4)
    for i in (1, 2, 3):
        shutil.copy(tmp_path / "big0.png", tmp_path / f"big{i}.png")
    png_bomb(tmp_path / "bomb.png")
    r = measure(tmp_path, [f"big{i}.png" for i in range(4)] + ["bomb.png"])
    assert r["made"] == [True] * 4 + [False] and r["peak_mib"] < 450, r  # one 25 MP RGBA decode: ~100 MB x 2
    assert "bomb.png: declares more than" in r["reasons"][4]


@pytest.mark.skipif(not HAVE_AV, reason="PyAV not installed (pip install 'xmodal[video]')")
def test_8192_video_frame_is_refused_from_its_header(tmp_path):
    """Was: the whole video decoded at 8192x8192 (1010 MiB peak here) for a 192 px thumbnail."""
    import av

    with av.open(str(tmp_path / "v.mp4"), "w") as c:
        s = c.add_stream("libx264", rate=5)
        s.width, s.height, s.pix_fmt = 8192, 8192, "yuv420p"
        for p in s.encode(av.VideoFrame.from_ndarray(np.zeros((8192, 8192, 3), np.uint8), format="rgb24")):
            c.mux(p)
        for p in s.encode():
            c.mux(p)
    r = measure(tmp_path, ["v.mp4"])
    assert r["made"] == [False] and r["peak_mib"] < 200, r
    assert r["reasons"][0] == "v.mp4: video frames of 8192x8192 pixels, over the thumbnail budget of 9,437,184 pixels"


@pytest.mark.usefixtures("one_thread")
def test_report_names_a_decompression_bomb_on_one_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 16), ("val", 6)):
        np.save(data / f"{split}_video_features.npy", rng.standard_normal((n, 6)).astype(np.float32))
        np.save(data / f"{split}_text_features.npy", rng.standard_normal((n, 5)).astype(np.float32))
        np.save(data / f"{split}_text_to_video.npy", np.arange(n))
        (data / f"{split}_videos.txt").write_text("".join(f"{split}{i}\n" for i in range(n)))
    run = tmp_path / "run"
    assert main(["train", str(ROOT / "configs/synthetic.yaml"), "--out", str(run), "data.name=paired",
                 f"data.root={data}", "data.val_split=val", "model.dim=8", "train.epochs=1", "train.batch_size=8",
                 "test_time.bank_size=6", "--quiet", "--no-plots"]) == 0
    capsys.readouterr()
    images = tmp_path / "images"
    images.mkdir()
    for i in range(6):
        png_bomb(images / f"val{i}.png") if i == 2 else Image.new("RGB", (20, 20), (9 * i, 50, 50)).save(
            images / f"val{i}.png")
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"), "--images", str(images),
                 "--examples", "6", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "DecompressionBomb" not in err
    lines = [line for line in err.splitlines() if "val2.png" in line]
    assert len(lines) == 1 and set(lines) == {"xmodal report: warning: --images: val2.png: declares more than 178,956,970 "
                                    "pixels, over the thumbnail budget of 36,000,000 pixels; shown without a "
                                    "thumbnail"}


# ----------------------------------------------------------------------------- junk arguments: one line
@pytest.mark.parametrize("kwargs, exc, needle", [
    ({"default_k": math.inf}, ValueError, "--k: expected an integer"),
    ({"default_k": 0}, ValueError, "--k:"), ({"default_k": True}, ValueError, "--k:"),
    ({"max_k": -1}, ValueError, "max_k:"), ({"max_query_chars": "x"}, ValueError, "max_query_chars:"),
    ({"max_requests": 0}, ValueError, "max_requests:"), ({"warm_up": "yes"}, TypeError, "warm_up:"),
    ({"uploads": None}, TypeError, "uploads:"), ({"images": 3}, TypeError, "--images:"),
    ({"text_encoder": 5}, TypeError, "--text-encoder:"), ({"max_upload_bytes": -5}, ValueError, "--max-upload-mb"),
    ({"max_upload_seconds": math.nan}, ValueError, "--max-upload-seconds"),
    ({"upload_frames": 0}, ValueError, "--upload-frames"), ({"upload_timeout": -1}, ValueError, "upload_timeout"),
])
def test_create_app_junk_is_one_line(index_dir, kwargs, exc, needle):
    with pytest.raises(exc) as err:
        create_app(index_dir, **({"warm_up": False} | kwargs))
    assert needle in str(err.value) and len(str(err.value).splitlines()) == 1


def test_other_public_callables_junk_is_one_line(tmp_path):
    cases = [(lambda: create_app(3), TypeError, "--index:"), (lambda: create_app(tmp_path), ValueError, "--index:"),
             (lambda: bind_socket("127.0.0.1", "80"), ValueError, "--port:"),
             (lambda: bind_socket("127.0.0.1", 2**20), ValueError, "--port:"),
             (lambda: bind_socket(None, 0), ValueError, "--host:"), (lambda: is_loopback(None), TypeError, "host:"),
             (lambda: make_server(None), TypeError, "app:"),
             (lambda: make_server(lambda *a: None, header_timeout=math.nan), ValueError, "header_timeout:"),
             (lambda: make_server(lambda *a: None, keep_alive=0), ValueError, "keep_alive:"),
             (lambda: make_server(lambda *a: None, max_connections=0), ValueError, "max_connections:"),
             (lambda: make_server(lambda *a: None, log_level="loud"), ValueError, "log_level:"),
             (lambda: parse_query(None, default_k=1), TypeError, "params:"),
             (lambda: parse_query({"q": "x"}, default_k=math.inf), ValueError, "default_k:"),
             (lambda: parse_request({"video": "a", "direction": "up"}, default_k=3), ValueError, "direction:"),
             (lambda: parse_request([], default_k=3), TypeError, "params:")]
    for fn, exc, needle in cases:
        with pytest.raises(exc) as err:
            fn()
        assert needle in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def test_cli_states_what_a_public_host_exposes():
    from xmodal.commands.serve import exposure

    line = exposure("0.0.0.0", True, "media", 64)
    assert "anyone who can reach this machine" in line and "thumbnails of the files under --images media" in line
    assert "video uploads of up to 64 MiB" in line and "no login and no TLS" in line
    assert "uploads" not in exposure("0.0.0.0", False, None, 64)
