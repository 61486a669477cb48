"""A search page for any run (issue 33.3, 33.2) and bounded uploads (issue 36 item 11).

- A run on 12-d text features: ``index`` records no text encoder (it used to write ``minilm`` silently),
  ``serve`` starts (it used to warm MiniLM up against the 12-d text head and fail), the page has no text
  box and says why, and answers ``?video=NAME`` with thumbnails; ``POST /api/search`` searches with the
  caption features themselves; ``--text-encoder none`` turns the text box off.
- Where nothing is recorded and the text size matches a built-in encoder, that encoder is *assumed*, and
  the page header, ``/api/search`` and ``query`` say so.
- Uploads: receiving a body never holds the one encoding slot (a trickling client used to keep it for
  up to 120 s), a slow body is cut off by a minimum rate, decoding is bounded by a setting whatever the
  header declares (a file without a duration could decode 7,200 frames), errors never show the server's
  private folder, and name the client's file once ("upload: upload: ..." before).
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import socket
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("starlette")
pytest.importorskip("httpx")
Image = pytest.importorskip("PIL.Image")

from starlette.testclient import TestClient  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_tiny  # noqa: E402

from xmodal.cli import main  # noqa: E402
from xmodal.data.synthetic import synthetic  # noqa: E402
from xmodal.data.writer import save_split  # noqa: E402
from xmodal.features import encoders, identity  # noqa: E402
from xmodal.serve import bind_socket, create_app, make_server  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
HAVE_AV = importlib.util.find_spec("av") is not None
HAVE_UPLOADS = HAVE_AV and importlib.util.find_spec("python_multipart") is not None
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
needs_uploads = pytest.mark.skipif(not HAVE_UPLOADS, reason="uploads need PyAV and python-multipart")
VIDEO_DIM, TEXT_DIM = 16, 12


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("anyrun")
    data = root / "data"
    for name, split in synthetic(num_train=60, num_val=20, num_test=12, video_dim=VIDEO_DIM, text_dim=TEXT_DIM,
                                 num_concepts=4, seed=2).items():
        save_split(split, data, name)
    names = [f"clip_{i:02d}" for i in range(12)]
    (data / "test_videos.txt").write_text("".join(n + "\n" for n in names))
    images = root / "images"
    images.mkdir()
    for i, n in enumerate(names):
        Image.new("RGB", (40, 30), (20 * i, 90, 140)).save(images / f"{n}.png")
    run = root / "run"
    assert main(["train", str(ROOT / "configs/synthetic.yaml"), "--out", str(run), "data.name=paired",
                 f"data.root={data}", "model.dim=8", "train.epochs=1", "train.batch_size=8", "test_time.bank_size=20",
                 "test_time.normalizers=[none,dn]", "--quiet", "--no-plots"]) == 0
    index = root / "index"
    assert main(["index", "--run", str(run), "--data", str(data), "--split", "test", "--out", str(index),
                 "--quiet"]) == 0
    return {"root": root, "data": data, "run": run, "index": index, "images": images, "names": names}


def test_index_records_no_encoder_it_was_not_told(world):
    meta = json.loads((world["index"] / "meta.json").read_text())
    assert meta["text_encoder"] is None and meta["encoders"] == {"text": None, "video": None}


def test_page_of_a_12d_run_starts_without_a_text_box_and_says_why(world):
    app = create_app(world["index"], images=world["images"])  # used to fail: MiniLM warmed up on a 12-d head
    client = TestClient(app)
    page = client.get("/")
    assert page.status_code == 200 and 'name="q"' not in page.text and 'id="text-off"' in page.text
    assert "12-d text features match no built-in encoder" in page.text and 'id="browse"' in page.text
    assert 'data-status="off">no text encoder' in page.text
    res = client.get("/", params={"video": "clip_03", "k": 4})
    assert res.status_code == 200 and 'id="source-name">clip_03' in res.text
    assert res.text.count('<img src="/thumb/') >= 4 and client.get("/thumb/3").status_code == 200
    api = client.get("/api/search", params={"q": "a dog"})
    assert api.status_code == 400 and api.json()["error"].startswith("q: text search is off for this index: no text")
    v2t = client.get("/api/search", params={"video": "clip_03", "direction": "v2t", "k": 3}).json()
    assert v2t["direction"] == "v2t" and len(v2t["results"]) == 3
    off = TestClient(create_app(world["index"], text_encoder="none")).get("/")
    assert "Text search is off: --text-encoder none" in off.text


def test_posted_features_search_as_query_does(world, capsys):
    test = np.load(world["data"] / "test_text_features.npy")[:3].astype(np.float32)
    np.save(world["root"] / "q.npy", test)
    capsys.readouterr()
    assert main(["query", "--index", str(world["index"]), "--text-features", str(world["root"] / "q.npy"), "--k", "5",
                 "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    buf = io.BytesIO()
    np.save(buf, test.astype(np.float16).astype(np.float64))  # any float dtype; float16 values survive exactly
    np.save(world["root"] / "q16.npy", test.astype(np.float16))
    client = TestClient(create_app(world["index"]))
    body = client.post("/api/search?k=5", content=buf.getvalue()).json()
    assert body["queries"] == 3 and body["text_encoder"]["status"] == "off"
    assert main(["query", "--index", str(world["index"]), "--text-features", str(world["root"] / "q16.npy"),
                 "--k", "5", "--json"]) == 0
    want16 = json.loads(capsys.readouterr().out)
    assert [[r["item"] for r in a["results"]] for a in body["answers"]] == want16["indices"]
    assert want16["indices"][0][0] == want["indices"][0][0]
    bad = io.BytesIO()
    np.save(bad, np.zeros((2, 7), np.float32))
    for content, needle in [(bad.getvalue(), "features: expected [T, 12]"), (b"\x93NUMPY junk", "features: not a"),
                            (_npy(np.full((1, 12), np.nan)), "features: NaN"), (_npy(np.ones((65, 12))), "65 queries"),
                            (_npy(np.ones((2, 12), np.int64)), "expected float")]:
        res = client.post("/api/search?k=5", content=content)
        assert res.status_code == 400 and needle in res.json()["error"], (needle, res.text)
    lying = bytearray(_npy(np.ones((1, 12), np.float32)))
    lying[lying.index(b"(1, 12)"):lying.index(b"(1, 12)") + 7] = b"(9**99)"[:7]
    assert client.post("/api/search?k=5", content=bytes(lying)).status_code == 400
    big = client.post("/api/search?k=5", content=b"\0" * (4 * 1024 * 1024 + 1))
    assert big.status_code == 413


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_an_unrecorded_size_that_matches_a_builtin_is_shown_as_assumed(world, monkeypatch, capsys):
    """(With a registered encoder standing in for a built-in of the same size: MiniLM is not needed.)"""
    def fn(texts, *, batch_size, progress):
        return np.stack([np.random.default_rng(len(t)).standard_normal(TEXT_DIM) for t in texts]).astype(np.float32)

    encoders.register_encoder("tiny12", fn, overwrite=True)
    monkeypatch.setitem(identity.BUILTIN_DIMS, "text", {"tiny12": TEXT_DIM})
    try:
        client = TestClient(create_app(world["index"]))
        assert "text encoder tiny12 <i" in client.get("/").text and "(assumed" in client.get("/").text
        body = client.get("/api/search", params={"q": "a dog", "k": 2}).json()
        assert body["text_encoder"]["spec"] == "tiny12" and body["text_encoder"]["status"] == "assumed"
        capsys.readouterr()
        assert main(["query", "--index", str(world["index"]), "--captions", "a dog", "--k", "2"]) == 0
        out = capsys.readouterr().out
        assert "text encoder tiny12 (assumed)" in out and "note: no text encoder is recorded" in out
    finally:
        encoders.ENCODERS.pop("tiny12", None)


class LiveServer:
    def __init__(self, app):
        self.sock = bind_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()


@pytest.mark.skipif(not (importlib.util.find_spec("playwright") and os.access(CHROMIUM, os.X_OK)),
                    reason=f"needs playwright and Debian's chromium at {CHROMIUM}")
def test_browser_shows_the_text_box_off_and_its_reason(world, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("XMODAL_SERVE_SHOTS", tmp_path))
    app = create_app(world["index"], images=world["images"], uploads=False)
    with LiveServer(app) as live, sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                    args=CHROMIUM_FLAGS, viewport={"width": 1200, "height": 800})
        try:
            page = ctx.new_page()
            page.goto(live.url + "/")
            assert page.locator("#q").count() == 0
            reason = page.locator("#text-off").inner_text()
            assert reason.startswith("Text search is off: no text encoder is recorded, and 12-d text features")
            assert page.locator("#text-encoder").inner_text() == "no text encoder"
            page.screenshot(path=str(shots / "serve_text_off.png"), full_page=True)
            page.locator("#browse li.item").nth(2).locator("a.more-like").click()
            page.wait_for_selector("#results li.result")
            assert page.locator("#source-name").inner_text() == "clip_02"
            assert page.locator("#results li.result img").count() >= 1
            page.fill("#video", "clip_05")
            page.click("#go-video")
            page.wait_for_selector("#source-name")
            assert page.locator("#source-name").inner_text() == "clip_05"
        finally:
            ctx.close()


# ----------------------------------------------------------------------------- uploads (issue 36.11)
@pytest.fixture(scope="module")
def image_encoder():
    def fn(images, *, batch_size, progress):
        return np.stack([np.resize(np.asarray(im, np.float32).mean((0, 1)), VIDEO_DIM) for im in images])

    encoders.register_encoder("anyrun-image", fn, kind="image", overwrite=True)
    yield "anyrun-image"
    encoders.ENCODERS.pop("anyrun-image", None)


def multipart(path: Path, name: str, boundary: str = "xmodalboundary") -> tuple[bytes, str]:
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"direction\"\r\n\r\nv2v\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"video\"; filename=\"{name}\"\r\n"
            f"Content-Type: video/mp4\r\n\r\n").encode() + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


@needs_uploads
def test_a_trickling_upload_never_holds_the_encoding_slot(world, image_encoder, tmp_path):
    clip = hf_tiny.write_video(tmp_path / "ok.avi", frames(4))
    body, ctype = multipart(clip, "ok.avi")
    app = create_app(world["index"], image_encoder=image_encoder, upload_timeout=60, warm_up=False)
    with LiveServer(app) as live:
        slow = socket.create_connection(("127.0.0.1", live.port), timeout=30)
        try:  # a client that sends its headers and a few bytes of a 1 MB body, then waits
            slow.sendall(f"POST /upload?format=json HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
                         f"Content-Length: 1000000\r\n\r\n".encode() + body[:50])
            req = urllib.request.Request(live.url + "/upload?format=json", data=body, method="POST",
                                         headers={"Content-Type": ctype})
            with urllib.request.urlopen(req, timeout=60) as res:  # was: 503 "another video is being encoded"
                got = json.loads(res.read())
            assert res.status == 200 and got["upload"] == "ok.avi" and got["direction"] == "v2v"
        finally:
            slow.close()


@needs_uploads
def test_a_slow_body_is_cut_off_by_the_minimum_rate(tmp_path):
    from xmodal.serve import uploads as up

    class Stalling:
        headers = {"content-type": "multipart/form-data; boundary=b", "content-length": "1000"}

        async def stream(self):
            yield b"--b\r\n"
            await asyncio.sleep(3600)

    async def go():
        return await up.receive(Stalling(), tmp_path, max_bytes=10**6, timeout=3600, min_rate=1000, grace=0.05)

    with pytest.raises(up.UploadError) as err:  # deadline 0.05 s + 1000 B / 1000 B/s, not the hour
        asyncio.run(go())
    assert err.value.status == 408 and "1.05 s" in str(err.value)


@needs_uploads
def test_decoding_is_bounded_by_a_setting_not_by_the_header(world, image_encoder, tmp_path):
    import av

    raw = tmp_path / "raw.h264"  # an elementary stream declares no duration: 60 a second were assumed
    with av.open(str(raw), "w", format="h264") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 32, 32, "yuv420p"
        for f in frames(70):
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    client = TestClient(create_app(world["index"], image_encoder=image_encoder, max_upload_seconds=2.0,
                                   warm_up=False))
    res = client.post("/upload?format=json", files={"video": ("raw.h264", raw.read_bytes(), "video/h264")},
                      data={"direction": "v2v"})
    assert res.status_code == 413 and "more than 60 frames to decode" in res.json()["error"]  # 30/s of 2 s
    client = TestClient(create_app(world["index"], image_encoder=image_encoder, max_upload_seconds=120.0,
                                   max_upload_decode=20, warm_up=False))
    res = client.post("/upload?format=json", files={"video": ("raw.h264", raw.read_bytes(), "video/h264")},
                      data={"direction": "v2v"})
    assert res.status_code == 413 and "more than 20 frames to decode" in res.json()["error"]
    from xmodal.features.encoders import iter_encode_videos

    (_, result), = list(iter_encode_videos([raw], frames=4, model=image_encoder, max_decoded=10))
    assert isinstance(result, ValueError) and "more than 10 frames to decode" in str(result)


@needs_uploads
def test_upload_errors_name_the_clients_file_once_and_never_the_private_folder(world, image_encoder, tmp_path):
    ok = hf_tiny.write_video(tmp_path / "ok.mp4", frames(10), codec="libx264")
    b = bytearray(ok.read_bytes())
    start, end = b.find(b"mdat") + 8, b.find(b"moov") - 8
    b[start:end] = b"\xab" * (end - start)  # frames that cannot decode behind a readable header
    client = TestClient(create_app(world["index"], image_encoder=image_encoder, warm_up=False))
    res = client.post("/upload?format=json", files={"video": ("mine.mp4", bytes(b), "video/mp4")})
    err = res.json()["error"]
    assert res.status_code == 400 and err.startswith("upload: mine.mp4: cannot decode video"), err
    assert "upload: upload:" not in err
    junk = client.post("/upload?format=json", files={"video": ("junk.mp4", b"not a video at all" * 10, "video/mp4")})
    text = junk.json()["error"]
    assert junk.status_code == 400 and text.startswith("upload: not a readable video file"), text
    assert tempfile.gettempdir() not in text and "xmodal-serve-upload" not in text and "the uploaded file" in text
    page = client.post("/upload", files={"video": ("junk.mp4", b"not a video at all" * 10, "video/mp4")})
    assert "xmodal-serve-upload" not in page.text
