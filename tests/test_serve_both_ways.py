"""The search page both ways (issue 26 item 8): captions of each result, "more like this" (video -> video),
video -> text for a gallery item and for an uploaded video file, the index's recall, all checked against
float64 brute force of the run's own embeddings, and in a real Chromium.

The index is built by the CLI (``xmodal index --data``: the layout's captions and names; ``--texts``).
Uploaded videos are real files written with PyAV; a registered test image encoder turns a frame's colour
back into the gallery row it was drawn for, so an upload must give exactly what ``?video=NAME`` gives.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import re
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("starlette", reason="starlette not installed (pip install 'xmodal[serve]')")
pytest.importorskip("httpx", reason="httpx (Starlette's TestClient) not installed (pip install 'xmodal[serve-test]')")
Image = pytest.importorskip("PIL.Image", reason="Pillow not installed (pip install 'xmodal[serve]')")

from starlette.testclient import TestClient  # noqa: E402

import xmodal  # noqa: E402
from xmodal.cli import main  # noqa: E402
from xmodal.data.synthetic import synthetic  # noqa: E402
from xmodal.features import encoders  # noqa: E402
from xmodal.serve import create_app  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT_DIM = 384
HAVE_AV = importlib.util.find_spec("av") is not None
HAVE_MULTIPART = importlib.util.find_spec("python_multipart") is not None
CHROMIUM = "/usr/bin/chromium"
HAVE_PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
needs_upload = pytest.mark.skipif(not (HAVE_AV and HAVE_MULTIPART),
                                  reason="uploads need PyAV and python-multipart (pip install 'xmodal[serve,video]')")


def red_of(item: int) -> int:
    return 24 + 9 * item  # items 0..24 stay apart after yuv420 + h264


@pytest.fixture(scope="module")
def split():
    s = synthetic(num_train=10, num_val=10, num_test=24, num_concepts=6, text_dim=TEXT_DIM, seed=3)["test"]
    captions = [f"caption {t}" for t in range(s.num_texts)]
    return dataclasses.replace(s, captions=captions, video_names=[f"clip_{i:03d}" for i in range(len(s.video))])


@pytest.fixture(scope="module")
def encoders_registered(split):
    """'caption N' -> the split's text N (any other text: a CRC-seeded vector); a frame -> the video
    features of the gallery row its red channel was drawn for."""
    def text(texts, *, batch_size, progress):
        out = []
        for t in texts:
            if t.startswith("caption ") and t[8:].isdigit() and int(t[8:]) < split.num_texts:
                out.append(split.text[int(t[8:])])
            else:
                out.append(np.random.default_rng(zlib.crc32(t.encode())).standard_normal(TEXT_DIM))
        return np.stack(out).astype(np.float32)

    def image(frames, *, batch_size, progress):
        rows = []
        for im in frames:
            red = float(np.asarray(im.convert("RGB"), np.float64)[..., 0].mean())
            rows.append(split.video[int(round((red - 24) / 9))])
        return np.stack(rows).astype(np.float32)

    encoders.register_encoder("both-text", text, overwrite=True)
    encoders.register_encoder("both-image", image, kind="image", overwrite=True)
    yield
    encoders.ENCODERS.pop("both-text", None)
    encoders.ENCODERS.pop("both-image", None)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("run")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 120, "num_val": 60, "num_test": 20,
                                                     "num_concepts": 6, "text_dim": TEXT_DIM}},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none", "dn"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 2, "batch_size": 32},
    })
    train(cfg, root / "run", resume=False, progress=False)
    return root / "run"


@pytest.fixture(scope="module")
def layout(split, tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    split.save(root, "test")
    return root


@pytest.fixture(scope="module")
def images(split, tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    for i, name in enumerate(split.video_names):
        Image.new("RGB", (40, 30), (red_of(i), 90, 140)).save(root / f"{name}.png")
    return root


@pytest.fixture(scope="module")
def index_dir(run_dir, layout, encoders_registered, tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "index"
    assert main(["index", "--run", str(run_dir), "--data", str(layout), "--split", "test", "--out", str(out),
                 "--normalizer", "dn", "--text-encoder", "both-text"]) == 0
    return out


@pytest.fixture(scope="module")
def client(index_dir, images):
    return TestClient(create_app(index_dir, images=images, image_encoder="both-image"))


def embeddings(run_dir, split):
    model = xmodal.load_model(run_dir)
    return (model.encode_video(split.video).double().numpy(), model.encode_text(split.text).double().numpy())


def reference_order(scores: np.ndarray, k: int, exclude: int | None = None) -> list[int]:
    """Top-k rows by an explicit loop: highest score first, the lower row first on a tie."""
    rows = [j for j in range(len(scores)) if j != exclude]
    rows.sort(key=lambda j: (-scores[j], j))
    return rows[:k]


def check(results, scores, order, key="item"):
    assert [r["rank"] for r in results] == list(range(1, len(order) + 1))
    np.testing.assert_allclose([r["score"] for r in results], scores[order], atol=1e-5)
    for r, j in zip(results, order):
        if r[key] != j:  # only a near-tie may swap two rows
            assert abs(scores[r[key]] - scores[j]) < 1e-5


# ----------------------------------------------------------------------------- the index's files
def test_index_with_data_writes_video_and_caption_embeddings(index_dir, run_dir, split):
    meta = json.loads((index_dir / "meta.json").read_text())
    assert meta["texts"] == split.num_texts and meta["captions"] is True
    v, t = embeddings(run_dir, split)
    np.testing.assert_allclose(np.load(index_dir / "videos.npy"), v, atol=1e-5)
    np.testing.assert_allclose(np.load(index_dir / "texts.npy"), t, atol=1e-5)
    body = json.loads((index_dir / "texts.json").read_text())
    assert body == {"captions": split.captions, "video": split.text_to_video.tolist()}


def test_index_without_texts_removes_a_previous_indexs_texts(index_dir, run_dir, split, tmp_path, capsys):
    """--overwrite with --video-features (no captions) must not leave the old gallery's captions behind."""
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(index_dir, out)
    np.save(tmp_path / "v.npy", split.video[:5])
    assert main(["index", "--run", str(run_dir), "--video-features", str(tmp_path / "v.npy"), "--out", str(out),
                 "--overwrite"]) == 0
    capsys.readouterr()
    assert not (out / "texts.npy").exists() and not (out / "texts.json").exists()
    assert np.load(out / "videos.npy").shape[0] == 5
    assert json.loads((out / "meta.json").read_text())["texts"] == 0


# ----------------------------------------------------------------------------- API, three directions
def test_t2v_results_carry_their_videos_captions(client, split):
    body = client.get("/api/search", params={"q": "caption 4", "k": 5}).json()
    assert body["direction"] == "t2v" and body["normalizer"] == "dn"
    for r in body["results"]:
        want = [split.captions[t] for t in range(split.num_texts) if split.text_to_video[t] == r["item"]]
        assert r["captions"] == want and want


def test_more_like_this_equals_brute_force_cosine(client, run_dir, split):
    v, _ = embeddings(run_dir, split)
    for item in (0, 7, 23):
        body = client.get("/api/search", params={"video": split.video_names[item], "k": 6}).json()
        assert body["direction"] == "v2v" and body["video"] == split.video_names[item]
        assert body["recall_at_10"] == 1.0 and body["exact"] is True
        scores = v @ v[item]
        order = reference_order(scores, 6, exclude=item)
        check(body["results"], scores, order)
        assert [r["name"] for r in body["results"]] == [split.video_names[j] for j in order]
    every = client.get("/api/search", params={"video": "clip_003", "k": 100}).json()["results"]
    assert sorted(r["item"] for r in every) == [i for i in range(len(split.video)) if i != 3]


def test_video_to_text_equals_brute_force(client, run_dir, split):
    v, t = embeddings(run_dir, split)
    for item in (1, 12):
        body = client.get("/api/search", params={"video": split.video_names[item], "direction": "v2t",
                                                 "k": 7}).json()
        assert body["direction"] == "v2t"
        scores = t @ v[item]
        order = reference_order(scores, 7)
        check(body["results"], scores, order)
        for r in body["results"]:
            assert r["caption"] == split.captions[r["item"]]
            assert r["name"] == split.video_names[split.text_to_video[r["item"]]]


@pytest.mark.parametrize("params, status, needle", [
    ({"video": "nope"}, 404, "video: no item named 'nope'"),
    ({"video": "clip_001", "q": "dog"}, 400, "not both"),
    ({"video": "clip_001", "direction": "sideways"}, 400, "direction: expected one of t2v, v2v, v2t"),
    ({"video": "clip_001", "direction": "t2v"}, 400, "direction: t2v searches from text"),
    ({"q": "dog", "direction": "v2t"}, 400, "video: direction v2t searches from a video"),
    ({"video": "clip_001", "k": "0"}, 400, "k: expected an integer in [1, 100]"),
    ({"video": "clip_001", "k": "9" * 5000}, 400, "k:"),
])
def test_bad_video_parameters(client, params, status, needle):
    res = client.get("/api/search", params=params)
    assert res.status_code == status and needle in res.json()["error"], res.json()
    page = client.get("/", params=params)
    assert page.status_code == status and 'id="error"' in page.text and 'id="results"' not in page.text


def test_v2t_without_texts_says_how_to_get_them(run_dir, split, tmp_path, encoders_registered, capsys):
    np.save(tmp_path / "v.npy", split.video)
    (tmp_path / "names.txt").write_text("".join(n + "\n" for n in split.video_names))
    out = tmp_path / "idx"
    assert main(["index", "--run", str(run_dir), "--video-features", str(tmp_path / "v.npy"), "--out", str(out),
                 "--names", str(tmp_path / "names.txt"), "--text-encoder", "both-text"]) == 0
    capsys.readouterr()
    client = TestClient(create_app(out))
    res = client.get("/api/search", params={"video": "clip_002", "direction": "v2t"})
    assert res.status_code == 400 and "--texts FILE" in res.json()["error"]
    assert client.get("/api/search", params={"video": "clip_002"}).status_code == 200  # v2v needs no texts
    assert "captions" not in client.get("/api/search", params={"q": "caption 1"}).json()["results"][0]
    html = client.get("/", params={"q": "caption 1"}).text
    assert 'class="more-like"' in html and 'class="v2t"' not in html


def test_texts_flag_encodes_captions_with_the_text_encoder(run_dir, split, tmp_path, encoders_registered, capsys):
    np.save(tmp_path / "v.npy", split.video)
    (tmp_path / "caps.txt").write_text("caption 5\ncaption 9\na dog in the snow\n")
    out = tmp_path / "idx"
    assert main(["index", "--run", str(run_dir), "--video-features", str(tmp_path / "v.npy"), "--out", str(out),
                 "--texts", str(tmp_path / "caps.txt"), "--text-encoder", "both-text"]) == 0
    assert "3 captions for video -> text" in capsys.readouterr().out
    model = xmodal.load_model(run_dir)
    feats = encoders.encode_text(["caption 5", "caption 9", "a dog in the snow"], model="both-text")
    t = model.encode_text(feats).double().numpy()
    v = model.encode_video(split.video).double().numpy()
    body = TestClient(create_app(out)).get("/api/search", params={"video": "4", "direction": "v2t"}).json()
    scores = t @ v[4]
    check(body["results"], scores, reference_order(scores, 3))
    assert {r["caption"] for r in body["results"]} == {"caption 5", "caption 9", "a dog in the snow"}
    assert all(r["name"] is None for r in body["results"])  # a caption file says nothing of its videos
    for argv, needle in ((["--texts", str(tmp_path / "none.txt")], "--texts: "),
                         (["--texts", str(tmp_path)], "--texts: ")):
        assert main(["index", "--run", str(run_dir), "--video-features", str(tmp_path / "v.npy"),
                     "--out", str(tmp_path / "other"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"xmodal index: error: {needle}") and len(err.splitlines()) == 1, err


def test_page_shows_captions_and_links_both_ways(client, split):
    html = client.get("/", params={"q": "caption 10", "k": 4}).text
    assert html.count('<li class="result"') == 4
    first = re.search(r'data-item="(\d+)"', html).group(1)
    name = split.video_names[int(first)]
    assert f'href="/?video={name}&amp;k=4">more like this</a>' in html
    assert f'href="/?video={name}&amp;direction=v2t&amp;k=4">captions</a>' in html
    assert '<ul class="captions"><li>caption ' in html
    v2v = client.get("/", params={"video": name, "k": 4}).text
    assert f'More like <b id="source-name">{name}</b>' in v2v and 'class="videos"' in v2v
    assert f'<img src="/thumb/{first}"' in v2v  # the source's own thumbnail
    v2t = client.get("/", params={"video": name, "direction": "v2t", "k": 4}).text
    assert "Captions for" in v2t and 'class="texts"' in v2t and v2t.count('<span class="caption">') == 4


# ----------------------------------------------------------------------------- recall on the page and in the API
def test_recall_shown_exact_or_measured(index_dir, tmp_path):
    import shutil

    client = TestClient(create_app(index_dir))
    body = client.get("/api/search", params={"q": "caption 1"}).json()
    assert body["recall_at_10"] == 1.0 and body["exact"] is True
    assert 'id="recall" data-recall="1">exact search (flat index)' in client.get("/").text
    out = tmp_path / "ivf"
    shutil.copytree(index_dir, out)
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "recall_at_10": 1.0, "recall_queries": 0, "exact": True,
                                               "search_params": {}}))  # a flat index as 'index --kind' writes it
    assert 'data-recall="1">exact search (flat index)' in TestClient(create_app(out)).get("/").text
    meta.update({"kind": "ivf", "recall_at_10": 0.95312, "recall_queries": 1000, "search_params": {"nprobe": 32}})
    (out / "meta.json").write_text(json.dumps(meta))
    client = TestClient(create_app(out))
    body = client.get("/api/search", params={"q": "caption 1"}).json()
    assert body["recall_at_10"] == 0.95312 and body["recall_queries"] == 1000 and body["exact"] is False
    assert body["search_params"] == {"nprobe": 32}
    html = client.get("/").text
    assert "recall@10 95.31% of exact search (ivf index; nprobe 32, 1000 queries)" in html
    meta.pop("recall_at_10")
    (out / "meta.json").write_text(json.dumps(meta))
    assert "recall not measured" in TestClient(create_app(out)).get("/").text


# ----------------------------------------------------------------------------- uploads
def write_clip(path: Path, item: int, frames: int = 6, size: tuple[int, int] = (48, 32), rate: int = 6) -> Path:
    import av

    w, h = size
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=rate)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((h, w, 3), (red_of(item), 90, 140), np.uint8), format="rgb24")
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def post_video(client, path: Path | None, data: dict | None = None, fmt: str = "json", name: str = "video"):
    # no file: what a browser sends when none was chosen (an empty part without a file name)
    files = {name: ("", b"", "application/octet-stream")} if path is None else \
        {name: (path.name, path.read_bytes(), "video/mp4")}
    return client.post("/upload" + ("?format=json" if fmt == "json" else ""), files=files, data=data or {})


@needs_upload
def test_upload_gives_what_the_gallery_item_gives(client, split, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    clip = write_clip(tmp_path / "mine.mp4", 9)
    for direction in ("v2t", "v2v"):
        res = post_video(client, clip, {"direction": direction, "k": "5"})
        assert res.status_code == 200, res.text
        body = res.json()
        ref = client.get("/api/search", params={"video": "clip_009", "direction": direction, "k": 5}).json()
        if direction == "v2t":
            assert [r["item"] for r in body["results"]] == [r["item"] for r in ref["results"]]
            np.testing.assert_allclose([r["score"] for r in body["results"]], [r["score"] for r in ref["results"]],
                                       atol=1e-5)
        else:  # the upload is not in the gallery: its own row (score 1) comes first, then clip_009's list
            assert body["results"][0]["item"] == 9 and abs(body["results"][0]["score"] - 1) < 1e-5
            assert [r["item"] for r in body["results"][1:]] == [r["item"] for r in ref["results"][:4]]
        assert body["upload"] == "mine.mp4" and body["direction"] == direction
    assert list((tmp_path / "tmp").iterdir()) == []  # the private folder is gone
    page = post_video(client, clip, {"direction": "v2t", "k": "3"}, fmt="html")
    assert page.status_code == 200 and "Captions for your video <b>mine.mp4</b>" in page.text
    assert page.text.count('<span class="caption">') == 3


@needs_upload
def test_upload_limits_each_one_line(index_dir, images, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    client = TestClient(create_app(index_dir, images=images, image_encoder="both-image", max_upload_bytes=200_000,
                                   max_upload_seconds=2.0))
    ok = write_clip(tmp_path / "ok.mp4", 3, frames=6)
    assert post_video(client, ok).status_code == 200
    long = write_clip(tmp_path / "long.mp4", 3, frames=30, rate=6)  # 5 s
    big = tmp_path / "big.mp4"
    big.write_bytes(ok.read_bytes() + os.urandom(300_000))
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 10)
    cases = [(post_video(client, long), 413, "upload: 5.0 s of video, longer than 2 s"),
             (post_video(client, big), 413, "upload: larger than 200,000 bytes"),
             (post_video(client, junk), 400, "upload: not a readable video file"),
             (post_video(client, None, {"direction": "v2t"}), 400, "upload: no video file"),
             (post_video(client, ok, name="other"), 400, "one file, in the field named 'video'"),
             (post_video(client, ok, {"direction": "t2v"}), 400, "direction: expected v2t or v2v"),
             (post_video(client, ok, {"k": "500"}), 400, "k: expected an integer in [1, 100]"),
             (client.post("/upload?format=json", content=b"x" * 10, headers={"content-type": "video/mp4"}), 415,
              "multipart/form-data"),
             (client.post("/upload?format=json", content=iter([b"x" * 10]),
                          headers={"content-type": "multipart/form-data; boundary=b"}), 411, "Content-Length")]
    for res, status, needle in cases:
        assert res.status_code == status and needle in res.json()["error"], (status, res.text)
        assert len(res.json()["error"].splitlines()) == 1
    assert list((tmp_path / "tmp").iterdir()) == []
    big_frames = write_clip(tmp_path / "huge.mp4", 3, frames=2, size=(4096, 2400))
    res = post_video(client, big_frames)
    assert res.status_code == 413 and "4096x2400" in res.json()["error"]
    # the page shows an upload's error in place, not a JSON body
    page = post_video(client, junk, fmt="html")
    assert page.status_code == 400 and 'class="status error upload-error"' in page.text


@needs_upload
def test_uploads_off_and_other_routes_get_only(index_dir, tmp_path):
    client = TestClient(create_app(index_dir, uploads=False))
    clip = write_clip(tmp_path / "c.mp4", 1)
    res = post_video(client, clip)
    assert res.status_code == 403 and "uploads are off" in res.json()["error"]
    assert 'id="upload"' not in client.get("/").text
    for path in ("/", "/thumb/1"):
        assert client.post(path, content=b"x" * 10).status_code == 413  # only /upload and /api/search take a body
        assert client.post(path).status_code == 405


# ----------------------------------------------------------------------------- a real browser, three ways
class LiveServer:
    def __init__(self, app):
        import threading

        from xmodal.serve import bind_socket, make_server

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


def read_results(page):
    items = page.locator("#results li.result")
    return [(int(items.nth(i).get_attribute("data-rank")), int(items.nth(i).get_attribute("data-item")),
             float(items.nth(i).get_attribute("data-score"))) for i in range(items.count())]


@pytest.mark.skipif(not (HAVE_PLAYWRIGHT and os.access(CHROMIUM, os.X_OK) and HAVE_AV and HAVE_MULTIPART),
                    reason=f"needs playwright, Debian's chromium at {CHROMIUM}, PyAV and python-multipart")
def test_browser_text_more_like_this_captions_and_upload(client, index_dir, images, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("XMODAL_SERVE_SHOTS", tmp_path))
    clip = write_clip(tmp_path / "upload.mp4", 15)
    app = create_app(index_dir, images=images, image_encoder="both-image")
    with LiveServer(app) as live, sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                    args=CHROMIUM_FLAGS, viewport={"width": 1200, "height": 900})
        try:
            page = ctx.new_page()
            page.goto(live.url + "/")
            assert page.locator("#recall").inner_text().startswith("exact search")
            page.locator("#q").press_sequentially("caption 30")
            page.fill("#k", "6")
            page.press("#q", "Enter")
            page.wait_for_selector("#results li")
            t2v = read_results(page)
            first_captions = page.locator("#results li.result").first.locator("ul.captions li").all_inner_texts()
            page.screenshot(path=str(shots / "serve_t2v.png"), full_page=True)
            page.locator("#results li.result").first.locator("a.more-like").click()
            page.wait_for_selector("#source-name")
            source = page.locator("#source-name").inner_text()
            v2v = read_results(page)
            page.screenshot(path=str(shots / "serve_v2v.png"), full_page=True)
            page.locator("#source a.v2t").click()
            page.wait_for_selector("#results.texts li")
            v2t = read_results(page)
            v2t_text = page.locator("#results li.result .caption").all_inner_texts()
            page.screenshot(path=str(shots / "serve_v2t.png"), full_page=True)
            page.set_input_files("#video-file", str(clip))
            page.select_option("#direction", "v2t")
            page.locator("#upload input[name=k]").fill("5")
            page.click("#upload-go")
            page.wait_for_selector("#results.texts li")
            up = read_results(page)
            heading = page.locator("#source h2").inner_text()
            page.screenshot(path=str(shots / "serve_upload.png"), full_page=True)
        finally:
            ctx.close()
    api = client.get("/api/search", params={"q": "caption 30", "k": 6}).json()["results"]
    assert [(r, i) for r, i, _ in t2v] == [(r["rank"], r["item"]) for r in api]
    assert first_captions == api[0]["captions"][:3]
    name = api[0]["name"]
    assert source == name
    api = client.get("/api/search", params={"video": name, "k": 6}).json()["results"]
    assert [(r, i) for r, i, _ in v2v] == [(r["rank"], r["item"]) for r in api]
    np.testing.assert_allclose([s for _, _, s in v2v], [r["score"] for r in api], atol=1e-6)
    api = client.get("/api/search", params={"video": name, "direction": "v2t", "k": 6}).json()["results"]
    assert [(r, i) for r, i, _ in v2t] == [(r["rank"], r["item"]) for r in api]
    assert v2t_text == [r["caption"] for r in api]
    api = client.get("/api/search", params={"video": "clip_015", "direction": "v2t", "k": 5}).json()["results"]
    assert [i for _, i, _ in up] == [r["item"] for r in api] and "upload.mp4" in heading


def test_uploads_unavailable_when_the_encoder_does_not_fit_the_video_tower():
    """The page never offers an upload that can only fail: EfficientNet-Lite0 gives 1280 values a
    frame, a run trained on 512-d features cannot take them (the reason is shown instead)."""
    from types import SimpleNamespace

    from xmodal.serve.uploads import unavailable_reason

    pytest.importorskip("av", reason="PyAV not installed (pip install 'xmodal[video]')")
    pytest.importorskip("python_multipart", reason="python-multipart not installed (pip install 'xmodal[serve]')")

    def model(d):
        return SimpleNamespace(experts=None, video_tower=SimpleNamespace(spec=SimpleNamespace(in_dim=d)))

    why = unavailable_reason(model(512), "efficientnet-lite0")
    assert why is not None and "gives 1280 values a frame" in why and "takes 512" in why
    assert unavailable_reason(model(1280), "efficientnet-lite0") is None
