"""The encoder's identity travels with the features (issue 33.2): ``encode`` -> ``data import`` ->
``train`` -> ``export`` -> ``index`` -> ``serve`` / ``query`` name one encoder everywhere (a tiny
random-weight CLIP folder, ``hf:DIR``), and an encoder that is not the recorded one (another folder
of the same size, or another size) is refused in one line at each consumer."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("av")
pytest.importorskip("faiss")
pytest.importorskip("starlette")
pytest.importorskip("httpx")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_tiny  # noqa: E402

from xmodal.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
SPLITS = ["train"] * 8 + ["val"] * 3 + ["test"] * 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """hf:A made every feature file; hf:B is another CLIP of the same size."""
    root = tmp_path_factory.mktemp("identity")
    a, b = hf_tiny.save_clip(root / "clipA", seed=0), hf_tiny.save_clip(root / "clipB", seed=1)
    vids = root / "videos"
    vids.mkdir()
    rng = np.random.default_rng(0)
    rows, captions = [], []
    for v, split in enumerate(SPLITS):
        base = rng.integers(0, 256, size=(1, 32, 32, 3))
        frames = np.clip(base + rng.integers(-20, 20, size=(4, 32, 32, 3)), 0, 255).astype(np.uint8)
        hf_tiny.write_video(vids / f"v{v:02d}.avi", frames)
        for c in range(2):
            rows.append({"video_id": f"v{v:02d}", "caption": f"clip {v} caption {c} {'red' if v % 2 else 'blue'}",
                         "split": split})
            captions.append(rows[-1]["caption"])
    with open(root / "pairs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["video_id", "caption", "split"])
        w.writeheader()
        w.writerows(rows)
    (root / "caps.txt").write_text("\n".join(captions) + "\n")
    feats, text, data, run = root / "feats", root / "t.npy", root / "data", root / "run"
    assert main(["encode", "videos", str(vids), "--out", str(feats), "--model", f"hf:{a}", "--frames", "2",
                 "--no-progress", "--quiet"]) == 0
    assert main(["encode", "text", "--captions", str(root / "caps.txt"), "--out", str(text), "--model", f"hf:{a}",
                 "--quiet"]) == 0
    assert main(["data", "import", str(root / "pairs.csv"), "--features", str(feats), "--text-features", str(text),
                 "--out", str(data)]) == 0
    assert main(["train", str(ROOT / "configs/synthetic.yaml"), "--out", str(run), "data.name=paired",
                 f"data.root={data}", "data.val_split=val", "model.kind=meanp", "model.dim=8", "train.epochs=1",
                 "train.batch_size=4", "test_time.bank_size=8", "test_time.normalizers=[none,dn]", "--quiet",
                 "--no-plots"]) == 0
    assert main(["export", str(run), "--out", str(root / "export")]) == 0
    assert main(["index", "--run", str(run), "--data", str(data), "--split", "test", "--out", str(root / "index"),
                 "--quiet"]) == 0
    return {"root": root, "a": a.resolve(), "b": b.resolve(), "feats": feats, "text": text, "data": data, "run": run,
            "export": root / "export", "index": root / "index", "vids": vids}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_error(capsys, cmd: str, needle: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"xmodal {cmd}: error: "), err
    assert needle in err, err
    return err


def test_one_encoder_named_everywhere(world, capsys):
    a, spec = world["a"], f"hf:{world['a']}"
    weights = sha(a / "model.safetensors")
    from xmodal.features.identity import read_encoders, read_sidecar

    files = {"feats": world["feats"] / "encoder.json", "text": Path(str(world["text"]) + ".encoder.json"),
             "data": world["data"] / "encoders.json", "run": world["run"] / "encoders.json",
             "index": world["index"] / "meta.json"}
    for name, path in files.items():  # each file names the folder relative to itself, never by this machine's path
        raw = path.read_text()
        assert str(world["root"]) not in raw and '"spec_relative_to": "file"' in raw, name
    assert '"spec": "hf:../clipA"' in files["feats"].read_text() and '"spec": "hf:clipA"' in files["text"].read_text()
    side_v, side_t = read_sidecar(world["feats"]), read_sidecar(world["text"])  # read back: the folder itself
    assert (side_v["spec"], side_v["kind"], side_v["level"], side_v["dim"]) == (spec, "image", "frame", 24)
    assert side_v["sampling"] == {"frames": 2, "fps": None} and side_v["weights_sha256"] == weights
    assert (side_t["spec"], side_t["kind"], side_t["dim"], side_t["normalized"]) == (spec, "text", 24, False)
    layout, run = read_encoders(world["data"]), read_encoders(world["run"])
    assert layout == run and layout["text"]["spec"] == layout["video"]["spec"] == spec
    assert layout["video"]["weights_sha256"] == layout["text"]["weights_sha256"] == weights
    config = json.loads((world["export"] / "config.json").read_text())["encoders"]
    for side in ("text", "video"):  # the export names the folder, never this machine's path
        assert config[side]["spec"] == "hf:clipA" and config[side]["name"] == "hf:clipA"
        assert config[side]["weights_sha256"] == weights and config[side]["dim"] == 24
        assert str(world["root"]) not in json.dumps(config[side])
    meta = json.loads((world["index"] / "meta.json").read_text())
    assert meta["text_encoder"] == "hf:../clipA" and meta["text_encoder_source"] == "recorded"
    assert meta["encoders"]["video"]["spec"] == "hf:../clipA" and meta["run"] == "../run"
    capsys.readouterr()
    assert main(["query", "--index", str(world["index"]), "--captions", "clip 12 caption 0 blue", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text_encoder"] == spec and out["text_encoder_status"] == "recorded"
    # the caption is encoded exactly as 'encode text' encoded the layout's captions: the same scores
    row = np.load(world["text"])[24:25]  # v12's first caption (rows: 2 per video, in table order)
    np.save(world["root"] / "q.npy", row)
    assert main(["query", "--index", str(world["index"]), "--text-features", str(world["root"] / "q.npy"),
                 "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["indices"] == out["indices"]
    np.testing.assert_allclose(again["scores"], out["scores"], rtol=0, atol=1e-5)


def test_serve_uses_the_recorded_encoders(world):
    from starlette.testclient import TestClient

    from xmodal.serve import create_app

    spec = f"hf:{world['a']}"
    app = create_app(world["index"], upload_frames=2)
    client = TestClient(app)
    body = client.get("/api/search", params={"q": "clip 12 caption 0 blue", "k": 3}).json()
    shown = f"hf:clipA (sha256 {sha(world['a'] / 'model.safetensors')[:12]})"  # the folder's name, never its path
    assert body["text_encoder"] == {"spec": shown, "status": "recorded", "reason": None}
    page = client.get("/").text
    assert f"text encoder {shown}" in page
    assert str(world["root"]) not in page and str(world["root"]) not in json.dumps(body)
    assert app.state.upload["image_encoder"] == spec and app.state.upload["available"]
    # an uploaded gallery video, encoded by the recorded hf: encoder with the gallery's sampling, finds itself
    clip = world["vids"] / "v12.avi"
    res = client.post("/upload?format=json", files={"video": ("v12.avi", clip.read_bytes(), "video/x-msvideo")},
                      data={"direction": "v2v", "k": "3"})
    assert res.status_code == 200, res.text
    top = res.json()["results"][0]
    assert top["name"] == "v12" and top["score"] == pytest.approx(1.0, abs=1e-5)


def test_an_export_names_a_portable_spec_and_a_local_copy_is_checked(world, capsys):
    idx2, idx3 = world["root"] / "index_export", world["root"] / "index_export_named"
    capsys.readouterr()
    assert main(["index", "--run", str(world["export"]), "--data", str(world["data"]), "--split", "test",
                 "--out", str(idx2), "--quiet"]) == 0
    meta = json.loads((idx2 / "meta.json").read_text())
    assert meta["text_encoder"] == "hf:clipA"  # what the export knows: no folder of this machine
    capsys.readouterr()
    assert main(["query", "--index", str(idx2), "--captions", "a dog"]) == 2
    one_line_error(capsys, "query", "the recorded text encoder hf:clipA is not usable here")
    assert main(["query", "--index", str(idx2), "--captions", "a dog", "--text-encoder", f"hf:{world['a']}"]) == 0
    out = capsys.readouterr().out  # a copy named by the user is stated (checked by its hashes), not "recorded"
    assert "text encoder hf:clipA (stated)" in out and "(recorded)" not in out and str(world["a"]) not in out
    assert main(["index", "--run", str(world["export"]), "--data", str(world["data"]), "--split", "test",
                 "--out", str(idx3), "--text-encoder", f"hf:{world['a']}", "--quiet"]) == 0
    assert json.loads((idx3 / "meta.json").read_text())["text_encoder"] == "hf:../clipA"
    assert json.loads((idx3 / "meta.json").read_text())["text_encoder_source"] == "stated"


def test_posted_features_name_their_encoder_by_any_spelling_or_copy(world, tmp_path, monkeypatch):
    """?encoder= is compared by hashes: a relative path to the recorded folder, or a byte-identical copy
    of it, is the recorded encoder; another CLIP of the same size is not (issue 42)."""
    import io

    from starlette.testclient import TestClient

    from xmodal.serve import create_app

    buf = io.BytesIO()
    np.save(buf, np.load(world["text"])[:2])
    client = TestClient(create_app(world["index"], warm_up=False))
    copy = shutil.copytree(world["a"], tmp_path / "copy-of-A")
    monkeypatch.chdir(world["root"])
    for spelling in ("hf:clipA", "hf:./clipA/", f"hf:{copy}"):
        res = client.post("/api/search?k=2&encoder=" + spelling, content=buf.getvalue())
        assert res.status_code == 200, (spelling, res.text)
    res = client.post("/api/search?k=2&encoder=hf:clipB", content=buf.getvalue())
    assert res.status_code == 400 and res.json()["error"].startswith("encoder: hf:clipB")
    assert str(world["root"]) not in res.text  # no path of the server in the answer


def test_text_encoder_none_and_no_uploads_are_said_as_they_are(world, tmp_path, capsys):
    from starlette.testclient import TestClient

    from xmodal.serve import create_app

    out = tmp_path / "idx"
    assert main(["index", "--run", str(world["run"]), "--data", str(world["data"]), "--split", "test", "--out",
                 str(out), "--text-encoder", "none", "--quiet"]) == 0
    assert "--text-encoder none" in capsys.readouterr().out
    page = TestClient(create_app(out, warm_up=False, uploads=False)).get("/").text
    assert "Text search is off: the index was built with --text-encoder none" in page
    assert "no text encoder is recorded" not in page
    assert "or a video file" not in page and 'id="upload"' not in page  # no upload form: none offered
    page = TestClient(create_app(out, warm_up=False)).get("/").text
    assert "or a video file" in page and 'id="upload"' in page


def test_another_encoder_is_refused_at_each_consumer(world, capsys, tmp_path):
    from xmodal.serve import create_app

    b = f"hf:{world['b']}"
    capsys.readouterr()
    # encode: a features folder of hf:A never takes hf:B's videos (or another sampling)
    assert main(["encode", "videos", str(world["vids"]), "--out", str(world["feats"]), "--model", b, "--frames", "2",
                 "--quiet"]) == 2
    one_line_error(capsys, "encode", "holds features of another encoder: hf:")
    assert main(["encode", "videos", str(world["vids"]), "--out", str(world["feats"]), "--model", f"hf:{world['a']}",
                 "--frames", "3", "--quiet"]) == 2
    one_line_error(capsys, "encode", "sampled with")
    # data import: a record that says another size than the file holds
    bad = tmp_path / "t.npy"
    shutil.copy(world["text"], bad)
    side = json.loads(Path(str(world["text"]) + ".encoder.json").read_text())
    Path(str(bad) + ".encoder.json").write_text(json.dumps({**side, "dim": 512}))
    assert main(["data", "import", str(world["root"] / "pairs.csv"), "--features", str(world["feats"]),
                 "--text-features", str(bad), "--out", str(tmp_path / "d")]) == 2
    one_line_error(capsys, "data", "says 512-d features, but the files hold 24-d")
    assert not (tmp_path / "d").exists()
    # export, index: the run records hf:A
    assert main(["export", str(world["run"]), "--out", str(tmp_path / "e"), "--text-encoder", b]) == 2
    one_line_error(capsys, "export", "has other weights than the recorded encoder")
    assert main(["export", str(world["run"]), "--out", str(tmp_path / "e"), "--text-encoder", "minilm"]) == 2
    one_line_error(capsys, "export", "minilm makes 384-d features but the run's text tower takes 24-d")
    assert main(["index", "--run", str(world["run"]), "--data", str(world["data"]), "--split", "test", "--out",
                 str(tmp_path / "i"), "--text-encoder", b]) == 2
    one_line_error(capsys, "index", "has other weights than the recorded encoder")
    assert not (tmp_path / "i").exists()
    # query: another encoder for --captions, or --text-features made by one
    assert main(["query", "--index", str(world["index"]), "--captions", "x", "--text-encoder", b]) == 2
    one_line_error(capsys, "query", "--text-encoder: hf:")
    np.save(tmp_path / "tb.npy", np.zeros((1, 24), np.float32))
    Path(str(tmp_path / "tb.npy") + ".encoder.json").write_text(json.dumps(
        {**side, "spec": b, "weights_sha256": sha(world["b"] / "model.safetensors")}))
    assert main(["query", "--index", str(world["index"]), "--text-features", str(tmp_path / "tb.npy")]) == 2
    one_line_error(capsys, "query", "--text-features: hf:")
    # serve: flags naming another encoder, and POSTed features that say they are another encoder's
    for kwargs, flag in (({"text_encoder": b}, "--text-encoder"), ({"image_encoder": b}, "--image-encoder")):
        with pytest.raises(ValueError, match=f"^{flag}: .*other weights than the recorded encoder"):
            create_app(world["index"], **kwargs)
    assert main(["serve", "--index", str(world["index"]), "--text-encoder", b, "--port", "0"]) == 2
    one_line_error(capsys, "serve", "--text-encoder: ")
    from starlette.testclient import TestClient
    import io

    buf = io.BytesIO()
    np.save(buf, np.load(world["text"])[:2])
    client = TestClient(create_app(world["index"], warm_up=False))
    res = client.post("/api/search?k=2&encoder=" + b, content=buf.getvalue())
    assert res.status_code == 400 and res.json()["error"].startswith("encoder: ")
    res = client.post("/api/search?k=2&encoder=" + f"hf:{world['a']}", content=buf.getvalue())
    assert res.status_code == 200 and res.json()["queries"] == 2 and len(res.json()["answers"][0]["results"]) == 2


def test_a_zero_shot_run_on_two_encoders_is_refused(world, tmp_path, capsys):
    """clipA's video features and clipB's captions have the same size but live in two embedding spaces:
    a zero-shot (identity) run over them is refused in one line naming both; clipA on both sides runs."""
    text_b, data_b = tmp_path / "tb.npy", tmp_path / "data_b"
    assert main(["encode", "text", "--captions", str(world["root"] / "caps.txt"), "--out", str(text_b), "--model",
                 f"hf:{world['b']}", "--quiet"]) == 0
    assert main(["data", "import", str(world["root"] / "pairs.csv"), "--features", str(world["feats"]),
                 "--text-features", str(text_b), "--out", str(data_b)]) == 0
    zero_shot = ["model.kind=identity", "model.standardize=false", "train.epochs=0", "data.val_split=val",
                 "test_time.normalizers=[none]", "--quiet", "--no-plots"]
    capsys.readouterr()
    assert main(["train", str(ROOT / "configs/synthetic.yaml"), "--out", str(tmp_path / "run_b"), "data.name=paired",
                 f"data.root={data_b}", *zero_shot]) == 2
    err = one_line_error(capsys, "train", "model.kind: identity compares text and video features directly")
    assert "hf:clipB" in err and "hf:clipA" in err
    assert not (tmp_path / "run_b" / "metrics.json").exists()
    assert main(["train", str(ROOT / "configs/synthetic.yaml"), "--out", str(tmp_path / "run_a"), "data.name=paired",
                 f"data.root={world['data']}", *zero_shot]) == 0


def test_a_moved_index_says_why_without_server_paths(world, tmp_path):
    """An index copied away from the encoder folder it names (relative to itself): text search is off, and
    the reason on the page and in /api/search names the folder, not the server's paths."""
    from starlette.testclient import TestClient

    from xmodal.serve import create_app

    moved = shutil.copytree(world["index"], tmp_path / "deep" / "moved")
    client = TestClient(create_app(moved, warm_up=False, uploads=False))
    page, body = client.get("/").text, client.get("/api/search", params={"q": "a"}).text
    assert "is not usable here" in page and "no such folder" in page
    for text in (page, body):
        assert str(tmp_path) not in text and str(world["root"]) not in text
