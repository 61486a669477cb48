"""The search page of an image gallery takes an image upload (issue 42.1): a real ``xmodal serve`` on
127.0.0.1 over an index of images encoded by a tiny random-weight CLIP folder (saved here) answers an
uploaded PNG exactly as ``xmodal encode images`` on the same file followed by brute-force search in
Python (the run's own embeddings, an explicit loop); the page's words and form are the images'; a bad
image is one line; Chromium sees and uses the image form."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("transformers")
pytest.importorskip("starlette", reason="starlette not installed (pip install 'xmodal[serve]')")
httpx = pytest.importorskip("httpx", reason="httpx not installed (pip install 'xmodal[serve-test]')")
pytest.importorskip("python_multipart", reason="python-multipart not installed (pip install 'xmodal[serve]')")
Image = pytest.importorskip("PIL.Image")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_tiny  # noqa: E402
from test_serve_both_ways import CHROMIUM, CHROMIUM_FLAGS, HAVE_PLAYWRIGHT, LiveServer  # noqa: E402

import xmodal  # noqa: E402
from xmodal.cli import main  # noqa: E402
from xmodal.config import from_dict  # noqa: E402
from xmodal.serve import create_app  # noqa: E402
from xmodal.training.loop import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
N = 24  # images: 8 train, 8 val, 8 test (the gallery)


def png(path: Path, seed: int, size: tuple[int, int] = (40, 34)) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    """A CLIP folder, N PNGs with a caption each, encoded and imported through the CLI, a zero-shot run
    and its index of the test split (images 16..23)."""
    root = tmp_path_factory.mktemp("imgal")
    clip = hf_tiny.save_clip(root / "clip")
    imgs = root / "imgs"
    imgs.mkdir()
    rows = []
    for i in range(N):
        png(imgs / f"im{i:02d}.png", i, (36 + i, 30 + (i % 5)))
        rows.append(f"im{i:02d},picture {i} of things,{('train', 'val', 'test')[i // 8]}\n")
    (root / "pairs.csv").write_text("image,caption,split\n" + "".join(rows))
    assert main(["encode", "images", "--dir", str(imgs), "--out", str(root / "img.npy"), "--model", f"hf:{clip}",
                 "--no-progress"]) == 0
    assert main(["data", "import", str(root / "pairs.csv"), "--features", str(root / "img.npy"), "--ids", str(imgs),
                 "--text-model", f"hf:{clip}", "--out", str(root / "data"), "--no-progress", "--quiet"]) == 0
    cfg = from_dict({"data": {"name": "paired", "root": str(root / "data")},
                     "model": {"kind": "identity", "standardize": False}, "loss": {"name": "infonce", "temperature": 0.01},
                     "test_time": {"normalizers": ["none"], "bank_size": 8}, "train": {"seed": 0, "epochs": 0, "batch_size": 8}})
    train(cfg, root / "run", resume=False, progress=False, verbose=False)
    assert main(["index", "--run", str(root / "run"), "--data", str(root / "data"), "--split", "test",
                 "--out", str(root / "index"), "--store", "float32"]) == 0
    return root, clip, imgs


def reference(root: Path, clip: Path, image: Path, k: int, scratch: Path) -> dict:
    """The upload by hand: ``xmodal encode images`` on the file, the run's own towers, float64 scores of
    every gallery image and caption, the top k by an explicit loop (ties: the lower row)."""
    (scratch / "one.txt").write_text(image.name + "\n")
    out = scratch / "one.npy"
    assert main(["encode", "images", "--dir", str(image.parent), "--list", str(scratch / "one.txt"), "--out", str(out),
                 "--model", f"hf:{clip}", "--no-progress"]) == 0
    model = xmodal.load_model(root / "run")
    q = model.encode_video(np.load(out)).double().numpy()[0]
    gallery = model.encode_video(np.load(root / "data" / "test_video_features.npy")).double().numpy()
    texts = model.encode_text(np.load(root / "data" / "test_text_features.npy")).double().numpy()
    res = {}
    for direction, rows in (("v2v", gallery), ("v2t", texts)):
        scores = [float(np.dot(rows[j], q)) for j in range(len(rows))]
        order = sorted(range(len(rows)), key=lambda j: (-scores[j], j))[:k]
        res[direction] = (order, [scores[j] for j in order])
    return res


def post(url: str, path: Path, field: str = "image", **data) -> httpx.Response:
    with open(path, "rb") as fh:
        return httpx.post(url + "/upload?format=json", files={field: (path.name, fh.read(), "image/png")},
                          data={k: str(v) for k, v in data.items()}, timeout=120)


def test_an_uploaded_image_equals_encode_images_and_search_by_hand(gallery, tmp_path, monkeypatch):
    root, clip, imgs = gallery
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    mine = png(tmp_path / "query.png", 99, (45, 31))  # not in the gallery
    ref = reference(root, clip, mine, 5, tmp_path)
    app = create_app(root / "index", images=imgs)
    assert app.state.upload["available"] and app.state.upload["kind"] == "images"
    with LiveServer(app) as live:
        for direction in ("v2v", "v2t"):
            res = post(live.url, mine, direction=direction, k=5)
            assert res.status_code == 200, res.text
            body = res.json()
            assert body["upload"] == "query.png" and body["direction"] == direction
            assert [r["item"] for r in body["results"]] == ref[direction][0]
            np.testing.assert_allclose([r["score"] for r in body["results"]], ref[direction][1], atol=1e-5)
        page = httpx.post(live.url + "/upload", files={"image": ("query.png", mine.read_bytes(), "image/png")},
                          data={"direction": "v2v", "k": "3"}, timeout=120)
    assert page.status_code == 200 and "More like your image <b>query.png</b>" in page.text
    assert "image decoding and encoding" in page.text and page.text.count('class="result"') == 3
    assert list((tmp_path / "tmp").iterdir()) == []  # the private folder is gone


def test_the_page_words_an_image_gallery_and_refuses_bad_images_in_one_line(gallery, tmp_path):
    from starlette.testclient import TestClient

    root, clip, imgs = gallery
    client = TestClient(create_app(root / "index", images=imgs))
    html = client.get("/").text
    form = html[html.index('<form class="upload"'):]
    form = form[:form.index("</form>")]
    assert 'name="image" accept="image/*"' in form and "or an image file" in form and "images like it" in form
    assert "Search with this image" in form and "video" not in form.lower()
    assert "captions for image &rarr; text" in html
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image at all" * 10)
    huge = tmp_path / "huge.png"
    Image.new("L", (5000, 2000)).save(huge)  # 10,000,000 pixels: over a video frame's 9,437,184
    ok = png(tmp_path / "ok.png", 5)
    for res, status, needle in (
            (client.post("/upload?format=json", files={"image": ("junk.png", junk.read_bytes())}), 400,
             "upload: not a readable image file"),
            (client.post("/upload?format=json", files={"image": ("huge.png", huge.read_bytes())}), 413,
             "upload: an image of 5000x2000, over 9,437,184 pixels"),
            (client.post("/upload?format=json", files={"video": ("ok.png", ok.read_bytes())}), 400,
             "upload: one file, in the field named 'image'"),
            (client.post("/upload?format=json", files={"image": ("", b"")}), 400, "upload: no image file")):
        error = res.json()["error"]
        assert res.status_code == status and needle in error, (status, res.text)
        assert len(error.splitlines()) == 1 and "xmodal-serve-upload" not in error and str(tmp_path) not in error


def test_a_video_gallery_keeps_its_video_form():
    """The kind comes from the items' encoder record: frames (or nothing recorded) stay a video gallery."""
    from xmodal.serve.images import gallery_kind
    from xmodal.serve.page import render_page

    assert gallery_kind({"encoders": {"video": {"spec": "x", "level": "frame"}}}) == "videos"
    assert gallery_kind({"encoders": {"video": {"spec": "x", "level": "image"}}}) == "images"
    info = {"items": 3, "normalizer": "none", "text_encoder": None, "text_reason": "r", "kind": "flat", "texts": 2,
            "videos": True, "exact": True}
    upload = {"available": True, "max_bytes": 2**20, "max_seconds": 5, "frames": 4}
    video = render_page(title="t", info=info, upload=upload)
    image = render_page(title="t", info=info, upload=upload, kind="images")
    assert 'name="video" accept="video/*"' in video and "or a video file" in video and "4 frames" in video
    assert 'name="image" accept="image/*"' in image and "Search from an image instead" in image
    assert "frames" not in image


@pytest.mark.skipif(not (HAVE_PLAYWRIGHT and os.access(CHROMIUM, os.X_OK)),
                    reason=f"needs playwright and Debian's chromium at {CHROMIUM}")
def test_browser_uploads_an_image(gallery, tmp_path):
    from playwright.sync_api import sync_playwright

    root, clip, imgs = gallery
    mine = png(tmp_path / "mine.png", 7, (33, 47))
    ref = reference(root, clip, mine, 4, tmp_path)
    app = create_app(root / "index", images=imgs)
    with LiveServer(app) as live, sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                    args=CHROMIUM_FLAGS, viewport={"width": 1200, "height": 900})
        try:
            page = ctx.new_page()
            page.goto(live.url + "/")
            assert page.locator("#upload-go").inner_text() == "Search with this image"
            page.set_input_files("#image-file", str(mine))
            page.select_option("#direction", "v2v")
            page.locator("#upload input[name=k]").fill("4")
            page.click("#upload-go")
            page.wait_for_selector("#results li.result")
            items = page.locator("#results li.result")
            got = [int(items.nth(i).get_attribute("data-item")) for i in range(items.count())]
            heading = page.locator("#source h2").inner_text()
        finally:
            ctx.close()
    assert got == ref["v2v"][0] and "your image mine.png" in heading
    meta = json.loads((root / "index" / "meta.json").read_text())
    assert meta["encoders"]["video"]["level"] == "image"


def test_index_and_query_word_an_image_gallery_and_show_no_server_path(gallery, tmp_path, capsys):
    """`index` and `query` of an image gallery say "images" (the table's column "image"), and the text
    encoder shows by its folder name, never this machine's path (issue 42's smaller findings)."""
    root, clip, _ = gallery
    capsys.readouterr()
    assert main(["index", "--run", str(root / "run"), "--data", str(root / "data"), "--split", "test",
                 "--out", str(tmp_path / "index"), "--store", "float32"]) == 0
    out = capsys.readouterr().out
    assert f"{N // 3} images x " in out and "videos x" not in out
    assert main(["query", "--index", str(tmp_path / "index"), "--captions", "picture 17 of things", "--k", "3"]) == 0
    out = capsys.readouterr().out
    assert "| query | rank | image | score |" in out
    assert f"against {N // 3} images" in out and str(clip) not in out and "hf:clip" in out
