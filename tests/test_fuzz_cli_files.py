"""Every input file or folder of every ``xmodal`` command, fed junk (issue 15).

Property: for each argument that names an input file or folder, each kind of junk (an
empty file, random bytes, non-UTF-8 text, a directory where a file is expected and a file
where a directory is expected, an ``.npz`` where an ``.npy`` is expected, an ``.npy`` of the
wrong shape or dtype, a missing path, a data folder with a broken file) exits with status 2
and exactly one line on stderr, ``xmodal CMD: error: ...``, naming the argument (its flag or
the path given); never a traceback, and nothing is left at the command's output path.
An output of the wrong kind (a folder where a file is written, a file where a folder is) is
refused the same way and left as it was.

The arguments come from the parser itself: :func:`test_every_argument_is_classified` fails
when a command grows an argument this file does not know, so a new file argument is fuzzed
(added to ``FILE_ARGS``) or declared not a file (``OTHER_ARGS``) by whoever adds it.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.synthetic={num_train: 120, num_val: 60, num_test: 60, num_concepts: 10}", "train.epochs=1",
        "train.batch_size=32", "model.dim=16", "test_time.bank_size=100", "train.progress=false"]

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------ the parsers
def _parsers() -> dict[str, argparse.ArgumentParser]:
    """``{"eval": parser, ..., "data import": parser, "data check": parser}``."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and prefix:
            out[prefix] = parser
        for action in subs:
            for name, p in action.choices.items():
                walk(p, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return out


def _arguments(parser: argparse.ArgumentParser) -> set[str]:
    """Every argument that takes a value: its last option string, or a positional's dest."""
    names = set()
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction)) or a.nargs == 0:
            continue
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._StoreConstAction):
            continue
        names.add(a.option_strings[-1] if a.option_strings else a.dest)
    return names


#: (command, argument) -> the kind of input it names (the junk it is fed depends on it).
FILE_ARGS: dict[tuple[str, str], str] = {
    ("config", "items"): "text",
    ("train", "config"): "text",
    ("data check", "root"): "folder",
    ("data check", "--config"): "text",
    ("data import", "pairs"): "text",
    ("data import", "--features"): "feature folder",
    ("data import", "--text-features"): "npy",
    ("data import", "--expert"): "named folder",
    ("encode", "source"): "folder or list",
    ("encode", "--captions"): "text",
    ("encode", "--dir"): "folder",
    ("encode", "--list"): "text",
    ("eval", "--run"): "run",
    ("export", "run"): "run",
    ("eval", "--video-features"): "npy",
    ("eval", "--text-features"): "npy",
    ("eval", "--text-mask"): "npy",
    ("eval", "--video-mask"): "npy",
    ("eval", "--expert"): "named npy",
    ("eval", "--expert-mask"): "named npy",
    ("eval", "--data"): "data folder",
    ("eval", "--queries"): "npy",
    ("eval", "--gallery"): "npy",
    ("eval", "--text"): "npy",
    ("eval", "--video"): "npy",
    ("eval", "--bias"): "npy",
    ("eval", "--sim"): "npy",
    ("eval", "--relevancy"): "npy",
    ("eval", "--positives"): "npy",
    ("eval", "--text-to-video"): "npy",
    ("eval", "--labels"): "npy",
    ("index", "--run"): "run",
    ("index", "--video-features"): "npy",
    ("index", "--video-mask"): "npy",
    ("index", "--expert"): "named npy",
    ("index", "--expert-mask"): "named npy",
    ("index", "--data"): "data folder",
    ("index", "--names"): "text",
    ("index", "--texts"): "text",
    ("index", "--select-data"): "data folder",
    ("normalize", "--queries"): "npy",
    ("normalize", "--gallery"): "npy",
    ("normalize", "--positives"): "npy",
    ("normalize", "--bank"): "npy",
    ("normalize", "--gallery-marginal"): "npy",
    ("query", "--index"): "index",
    ("query", "--text-features"): "npy",
    ("query", "--text-mask"): "npy",
    ("report", "path"): "run folder",
    ("report", "--images"): "folder",
    ("report", "--data"): "data folder",
    ("serve", "--index"): "index",
    ("serve", "--images"): "folder",
    ("compare", "A"): "per-query run",
    ("compare", "B"): "per-query run",
    ("compare", "--a"): "per-query run",
    ("compare", "--b"): "per-query run",
    ("report", "--compare"): "per-query",
    ("data import", "--ids"): "folder or list",
    ("data import", "--images"): "folder",
    ("classify", "--data"): "labelled data folder",
    ("classify", "--classes"): "text",
    ("classify", "--templates"): "text",
}
#: Outputs (checked to be left untouched by a refused command) and arguments that name no file.
OUTPUT_ARGS = {("bench", "--out"), ("demo", "--out"), ("train", "--out"), ("data import", "--out"),
               ("data synthetic", "--out"),
               ("encode", "--out"), ("encode", "--mask-out"), ("index", "--out"), ("normalize", "--save-bias"),
               ("query", "--out"), ("report", "--out"), ("export", "--out"), ("eval", "--per-query"),
               ("classify", "--out")}
OTHER_ARGS = {
    "compare": {"--split", "--normalizer", "--normalizer-b", "--metrics", "--directions", "--n-boot", "--seed",
                "--level"},
    "bench": {"--datasets", "--objectives", "--seeds", "--ts", "--noise", "--epochs", "--ncl-queue-sizes",
              "--threads"},
    "config": {"--set"},
    "data check": {"--split", "--threads"},
    "data synthetic": {"--seed", "--threads"},
    "data import": {"--split", "--text-model", "--max-frames", "--threads", "--dtype", "--format", "--model"},
    "classify": {"--split", "--text-model", "--dn-split", "--dn-lam", "--dn-num-samples", "--dn-seeds", "--dn-seed",
                 "--threads"},
    "demo": {"--losses", "--normalizers", "--seed", "--epochs", "--num-train", "--num-eval", "--threads"},
    "encode": {"kind", "--frames", "--fps", "--size", "--model", "--batch-size", "--threads", "--truncated",
               "--max-pixels", "--workers", "--shard", "--device", "--precision", "--cluster", "--cluster-shards"},
    "eval": {"--split", "--normalizer", "--v2t-scores", "--ties", "--v2t", "--block-size", "--threads", "--ks"},
    "index": {"--split", "--normalizer", "--kind", "--bits", "--text-encoder", "--threads", "--target-recall",
              "--recall-queries", "--nlist", "--nprobe", "--ef-search", "--store", "--select-split", "--shard",
              "--train-rows", "--cluster", "--cluster-shards", "--merge", "--max-memory"},
    "export": {"--text-encoder", "--video-encoder", "--threads", "--license", "--dataset"},
    "normalize": {"--method", "--temperature", "--iters", "--k", "--beta", "--lam", "--num-samples", "--seed",
                  "--threads", "--ks"},
    "query": {"--captions", "--k", "--text-encoder", "--threads", "--nprobe", "--ef-search", "--device"},
    "report": {"--examples", "--seed", "--threads"},
    "serve": {"--host", "--port", "--k", "--text-encoder", "--threads", "--uploads", "--max-upload-mb",
              "--max-upload-seconds", "--upload-frames", "--image-encoder", "--max-upload-decode",
              "--device"},
    "train": {"rest", "--set", "--threads"},
}

#: Hostile per-query results: (file made hostile, how) -> the culprit is that file of a copied run.
HOSTILE_RUNS = tuple(f"hostile: {h}" for h in (
    "truncated per_query.npz", "per_query.npz card 100,000 deep", "metrics.json 100,000 deep",
    "card without uses_test_queries", "card with a list for a dict", "0-d ranks", "ranks above the gallery",
    "fractional ranks", "string ranks", "complex ranks", "mAP above 100", "a rank entry declaring 10^12 values",
    "a pickled entry", "a foreign entry", "metrics.json card of another split", "metrics.json not an object"))


def _hostile_run(how: str, where: Path, w: dict) -> tuple[Path, Path]:
    """A copy of the good run with ``how`` done to its per_query.npz or metrics.json; returns (run, culprit)."""
    import io
    import json
    import zipfile

    run = where / "hostile_run"
    shutil.copytree(w["run"], run)
    pq, mj = run / "per_query.npz", run / "metrics.json"

    def entries() -> dict:
        with zipfile.ZipFile(pq) as z:
            return {i.filename: z.read(i) for i in z.infolist()}

    def put(items: dict) -> None:
        with zipfile.ZipFile(pq, "w") as z:
            for name, blob in items.items():
                z.writestr(name, blob)

    def npy(array) -> bytes:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, array, allow_pickle=True)
        return buf.getvalue()

    items = entries()
    card_key = "test/protocol.npy"
    card = json.loads(str(np.load(io.BytesIO(items[card_key]))))
    rank_key = "test/none/t2v/rank.npy"
    q, g = card["num_queries"]["t2v"], card["gallery_size"]["t2v"]
    if how == "truncated per_query.npz":
        pq.write_bytes(pq.read_bytes()[:-200])
        return run, pq
    if how == "metrics.json 100,000 deep":
        mj.write_text("[" * 100_000 + "]" * 100_000)
        return run, mj
    if how == "metrics.json not an object":
        mj.write_text("[1, 2]")
        return run, mj
    if how == "metrics.json card of another split":
        m = json.loads(mj.read_text())
        m["test"]["protocol"] = m["val"]["protocol"]
        mj.write_text(json.dumps(m))
        return run, run
    if how == "per_query.npz card 100,000 deep":
        items[card_key] = npy(np.array("[" * 100_000 + "]" * 100_000))
    elif how == "card without uses_test_queries":
        del card["uses_test_queries"]
        items[card_key] = npy(np.array(json.dumps(card)))
        mj.unlink()
    elif how == "card with a list for a dict":
        card["num_queries"] = [1, 2]
        items[card_key] = npy(np.array(json.dumps(card)))
        mj.unlink()
    elif how == "mAP above 100":
        items["test/none/t2v/ap.npy"] = npy(np.full(q, 150.0, np.float32))
    elif how == "a rank entry declaring 10^12 values":
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, {"descr": "<i4", "fortran_order": False, "shape": (10 ** 12,)})
        items[rank_key] = np.lib.format.magic(1, 0) + head.getvalue()
    elif how == "a pickled entry":
        items[rank_key] = npy(np.array([{"rank": 1}] * q, dtype=object))
    elif how == "a foreign entry":
        items["weights.npy"] = npy(np.zeros(3))
    else:
        items[rank_key] = npy({"0-d ranks": np.array(3, np.int32), "ranks above the gallery": np.full(q, g + 1, np.int32),
                               "fractional ranks": np.full(q, 1.5), "string ranks": np.full(q, "1"),
                               "complex ranks": np.full(q, 1 + 1j, np.complex64)}[how])
    put(items)
    return run, pq


#: The junk each kind of input is fed.
NPY_JUNK = ("missing", "empty", "random bytes", "non-UTF-8 text", "a directory", "npz for npy", "wrong shape",
            "wrong dtype")
TEXT_JUNK = ("missing", "empty", "random bytes", "non-UTF-8 text", "a directory")
FOLDER_JUNK = ("missing", "empty", "random bytes", "npz for npy")  # a file where a folder is expected
JUNK: dict[str, tuple[str, ...]] = {
    "npy": NPY_JUNK,
    "named npy": ("missing", "random bytes", "a directory"),  # the tiny run has no experts: refused by NAME
    "text": TEXT_JUNK,
    "folder": FOLDER_JUNK,
    "feature folder": (*FOLDER_JUNK, "an empty directory", "features: junk --features file"),
    "named folder": ("missing", "random bytes", "an empty directory", "features: junk --expert file"),
    "folder or list": ("missing", "empty", "random bytes", "non-UTF-8 text", "an empty directory"),
    "run": ("missing", "empty", "random bytes", "npz for npy", "an empty directory"),
    "run folder": ("missing", "empty", "random bytes", "an empty directory"),
    "per-query": ("missing", "empty", "random bytes", "npz for npy", "an empty directory"),
    # generated hostile runs (issue 36.5 / 36.6): each a copy of a good run with one file made hostile
    "per-query run": ("missing", "empty", "random bytes", "npz for npy", "an empty directory", *HOSTILE_RUNS),
    "index": ("missing", "empty", "random bytes", "an empty directory", "index: junk meta.json",
              "index: junk query_shift.npy", "index: names.txt a directory"),
    "data folder": ("missing", "empty", "random bytes", "an empty directory", "layout: optional file a directory",
                    "layout: names not UTF-8", "layout: junk required file"),
    "labelled data folder": ("missing", "empty", "random bytes", "an empty directory", "labelled: junk labels",
                             "labelled: junk features", "labelled: labels a directory"),
}


def test_every_argument_is_classified():
    parsers = _parsers()
    known = {(c, a) for c, a in FILE_ARGS} | OUTPUT_ARGS | {(c, a) for c, args in OTHER_ARGS.items() for a in args}
    found = {(c, a) for c, p in parsers.items() for a in _arguments(p)}
    assert found - known == set(), ("arguments this test does not know: add each input file/folder to FILE_ARGS "
                                    "(it is then fuzzed), an output to OUTPUT_ARGS, anything else to OTHER_ARGS")
    assert known - found == set(), "arguments listed here that the parser no longer has"
    assert {c for c, _ in FILE_ARGS} >= set(parsers) - {"bench", "demo", "data synthetic"}  # no input file


# ----------------------------------------------------------------------------- the inputs
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Good inputs for every command (a tiny trained run, its index, a data folder, ...)."""
    import torch

    from xmodal.features import encoders
    from xmodal.config import load_config
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("fuzzfiles")
    rng = np.random.default_rng(0)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config(REPO / "configs/synthetic.yaml", TINY), root / "run")
    finally:
        torch.set_num_threads(prev)
    w = {"run": root / "run"}

    def save(name, arr):
        np.save(root / name, arr)
        w[name] = root / name

    save("v.npy", rng.standard_normal((40, 64)).astype(np.float32))
    save("vmask.npy", np.ones((40, 1), dtype=bool))
    save("v3.npy", rng.standard_normal((40, 1, 64)).astype(np.float32))
    save("t.npy", rng.standard_normal((40, 48)).astype(np.float32))
    save("tok.npy", rng.standard_normal((40, 3, 48)).astype(np.float32))
    save("tmask.npy", np.ones((40, 3), dtype=bool))
    save("t2v.npy", np.arange(40)[::-1].copy())
    g = rng.standard_normal((6, 4)).astype(np.float32)
    save("q.npy", g[[0, 1, 2, 3, 4, 5, 0, 1]] + 0.1)
    save("g.npy", g)
    save("p.npy", np.array([0, 1, 2, 3, 4, 5, 0, 1]))
    save("b.npy", g[:5])
    save("bias.npy", np.zeros(6, np.float32))
    save("marg.npy", np.ones(6, np.float32))
    save("sim.npy", (g[[0, 1, 2, 3, 4, 5, 0, 1]] @ g.T).astype(np.float32))
    save("rel.npy", rng.uniform(size=(8, 6)).astype(np.float32))
    save("labels.npy", np.array([0, 0, 1, 1, 2, 2]))
    (root / "names.txt").write_text("".join(f"video{i}\n" for i in range(40)))
    w["names.txt"] = root / "names.txt"
    data = root / "data"  # the layout: splits train, val, test (the same rows)
    data.mkdir()
    for split in ("train", "val", "test"):
        shutil.copy(w["v.npy"], data / f"{split}_video_features.npy")
        shutil.copy(w["t.npy"], data / f"{split}_text_features.npy")
        shutil.copy(w["t2v.npy"], data / f"{split}_text_to_video.npy")
        shutil.copy(w["names.txt"], data / f"{split}_videos.txt")
    w["data"] = data
    torch.set_num_threads(1)
    try:  # a run on the data folder (report --data)
        train(load_config(REPO / "configs/synthetic.yaml", [*TINY, "data.name=paired", f"data.root={data}"]),
              root / "paired_run")
    finally:
        torch.set_num_threads(prev)
    w["paired_run"] = root / "paired_run"
    (root / "check.yaml").write_text("data: {name: paired, root: data, train_split: test, val_split: test, "
                                     "test_split: test}\n")
    w["check.yaml"] = root / "check.yaml"
    shutil.copy(REPO / "configs/synthetic.yaml", root / "synthetic.yaml")
    w["config"] = root / "synthetic.yaml"
    assert main(["index", "--run", str(w["run"]), "--video-features", str(w["v.npy"]), "--names",
                 str(w["names.txt"]), "--out", str(root / "idx"), "--threads", "1"]) == 0
    w["idx"] = root / "idx"
    images = root / "images"  # files the dummy image encoder never opens
    images.mkdir()
    for i in range(3):
        (images / f"{i}.jpg").write_bytes(b"")
    w["images"] = images
    (root / "list.txt").write_text("0.jpg\n2.jpg\n")
    w["list.txt"] = root / "list.txt"
    (root / "captions.txt").write_text("a dog\na cat\n")
    w["captions.txt"] = root / "captions.txt"
    videos = root / "videos"
    videos.mkdir()
    w["videos"] = videos
    feats = root / "feats"  # data import: per-video features and a pairs table
    feats.mkdir()
    lines = ["video,caption"]
    for i in range(6):
        np.save(feats / f"v{i}.npy", rng.standard_normal((3, 8)).astype(np.float32))
        lines.append(f"v{i},caption {i}")
    w["feats"] = feats
    (root / "pairs.csv").write_text("\n".join(lines) + "\n")
    w["pairs.csv"] = root / "pairs.csv"
    save("pairs_t.npy", rng.standard_normal((6, 16)).astype(np.float32))
    audio = root / "audio"
    audio.mkdir()
    np.save(audio / "v0.npy", rng.standard_normal((2, 5)).astype(np.float32))
    w["audio"] = audio

    def text(inputs, *, batch_size, progress):
        return np.ones((len(inputs), 8), np.float32)

    def text48(inputs, *, batch_size, progress):  # the tiny run's text width (index --texts)
        return np.ones((len(inputs), 48), np.float32)

    save("img.npy", rng.standard_normal((6, 8)).astype(np.float32))  # encode images' one array (data import --ids)
    (root / "img_list.txt").write_text("".join(f"v{i}.jpg\n" for i in range(6)))
    w["img_list.txt"] = root / "img_list.txt"
    (root / "img_pairs.csv").write_text("image,caption\n0,a zero\n1,a one\n2,a two\n2,two again\n")
    w["img_pairs.csv"] = root / "img_pairs.csv"
    save("img_pairs_t.npy", rng.standard_normal((4, 16)).astype(np.float32))
    cdata = root / "cdata"  # a labelled layout (classify): 8-d features, the width of fuzz-text
    cdata.mkdir()
    for split, n in (("test", 12), ("val", 9)):
        np.save(cdata / f"{split}_video_features.npy", rng.standard_normal((n, 8)).astype(np.float32))
        np.save(cdata / f"{split}_video_labels.npy", np.arange(n) % 3)
    w["cdata"] = cdata
    (root / "classes.txt").write_text("dog\ncat\nboat\n")
    w["classes.txt"] = root / "classes.txt"
    (root / "templates.txt").write_text("a photo of a {}.\nthe {}\n")
    w["templates.txt"] = root / "templates.txt"

    encoders.register_encoder("fuzz-text", text, kind="text")
    encoders.register_encoder("fuzz-text48", text48, kind="text")
    encoders.register_encoder("fuzz-image", text, kind="image")
    yield w
    del encoders.ENCODERS["fuzz-text"], encoders.ENCODERS["fuzz-image"], encoders.ENCODERS["fuzz-text48"]


def _base(cmd: str, arg: str, w: dict, out: Path) -> list[str]:
    """A good command line that uses ``arg`` (``out``: where the command's output goes)."""
    s = {k: str(v) for k, v in w.items()}
    run_feats = ["--run", s["run"], "--video-features", s["v.npy"], "--text-features", s["t.npy"],
                 "--text-to-video", s["t2v.npy"]]
    if cmd == "eval":
        if arg in ("--queries", "--gallery", "--positives", "--bias"):
            return ["eval", "--queries", s["q.npy"], "--gallery", s["g.npy"], "--positives", s["p.npy"],
                    "--bias", s["bias.npy"]]
        if arg in ("--text", "--video"):
            return ["eval", "--text", s["q.npy"], "--video", s["g.npy"], "--text-to-video", s["p.npy"]]
        if arg == "--sim":
            return ["eval", "--sim", s["sim.npy"], "--positives", s["p.npy"]]
        if arg == "--relevancy":
            return ["eval", "--sim", s["sim.npy"], "--relevancy", s["rel.npy"]]
        if arg == "--labels":
            return ["eval", "--video", s["g.npy"], "--labels", s["labels.npy"]]
        if arg == "--data":
            return ["eval", "--run", s["run"], "--data", s["data"], "--split", "test"]
        if arg == "--text-mask":
            return ["eval", *run_feats, "--text-features", s["tok.npy"], "--text-mask", s["tmask.npy"]]
        if arg == "--video-mask":
            return ["eval", *run_feats, "--video-features", s["v3.npy"], "--video-mask", s["vmask.npy"]]
        if arg in ("--expert", "--expert-mask"):
            return ["eval", *run_feats, arg, f"audio={s['v.npy']}"]
        if arg == "--per-query":
            return ["eval", *run_feats, "--per-query", str(out)]
        return ["eval", *run_feats]
    if cmd == "compare":
        return ["compare", s["run"], s["run"], "--n-boot", "200"] if arg in ("A", "B") else \
            ["compare", "--a", s["run"], "--b", s["run"], "--n-boot", "200"]
    if cmd == "index":
        base = ["index", "--run", s["run"], "--video-features", s["v.npy"], "--out", str(out), "--names",
                s["names.txt"]]
        if arg == "--data":
            return ["index", "--run", s["run"], "--data", s["data"], "--split", "test", "--out", str(out)]
        if arg == "--select-data":  # the split the default normaliser is measured on (issue 34.1)
            return [*base, "--select-data", s["data"], "--select-split", "test"]
        if arg == "--video-mask":
            return [*base, "--video-features", s["v3.npy"], "--video-mask", s["vmask.npy"]]
        if arg in ("--expert", "--expert-mask"):
            return [*base, arg, f"audio={s['v.npy']}"]
        if arg == "--texts":
            return [*base, "--texts", s["captions.txt"], "--text-encoder", "fuzz-text48"]
        return base
    if cmd == "export":
        return ["export", s["run"], "--out", str(out)]
    if cmd == "normalize":
        return ["normalize", "--method", "sinkhorn", "--queries", s["q.npy"], "--gallery", s["g.npy"],
                "--positives", s["p.npy"], "--bank", s["b.npy"], "--gallery-marginal", s["marg.npy"], "--l2",
                "--save-bias", str(out)]
    if cmd == "query":
        if arg == "--text-mask":
            return ["query", "--index", s["idx"], "--text-features", s["tok.npy"], "--text-mask", s["tmask.npy"],
                    "--out", str(out)]
        return ["query", "--index", s["idx"], "--text-features", s["t.npy"], "--out", str(out)]
    if cmd == "serve":
        return ["serve", "--index", s["idx"], "--images", s["images"], "--port", "0"]
    if cmd == "report":
        return ["report", s["paired_run" if arg == "--data" else "run"], "--out", str(out), "--examples", "2",
                "--threads", "1",
                *(["--images", s["images"]] if arg == "--images" else []),
                *(["--data", s["data"]] if arg == "--data" else []),
                *(["--compare", s["run"]] if arg == "--compare" else [])]
    if cmd == "train":
        return ["train", s["config"], "--out", str(out), "--no-plots", "--quiet", *TINY]
    if cmd == "config":
        return ["config", s["config"]]
    if cmd == "data check":
        return ["data", "check", s["data"], "--split", "test", "--config", s["check.yaml"]]
    if cmd == "classify":
        return ["classify", "--data", s["cdata"], "--classes", s["classes.txt"], "--text-model", "fuzz-text",
                "--templates", s["templates.txt"], "--out", str(out)]
    if cmd == "data import":
        if arg == "--images":  # the table's images encoded here (fuzz-image never opens them)
            return ["data", "import", s["img_pairs.csv"], "--images", s["images"], "--model", "fuzz-image",
                    "--text-features", s["img_pairs_t.npy"], "--out", str(out)]
        if arg == "--ids":
            return ["data", "import", s["pairs.csv"], "--features", s["img.npy"], "--ids", s["img_list.txt"],
                    "--text-features", s["pairs_t.npy"], "--out", str(out)]
        return ["data", "import", s["pairs.csv"], "--features", s["feats"], "--text-features", s["pairs_t.npy"],
                "--out", str(out), "--expert", f"audio={s['audio']}"]
    if cmd == "encode":
        if arg == "source":
            return ["encode", "videos", s["videos"], "--out", str(out), "--model", "fuzz-image", "--no-progress"]
        if arg == "--captions":
            return ["encode", "text", "--captions", s["captions.txt"], "--out", str(out), "--model", "fuzz-text"]
        return ["encode", "images", "--dir", s["images"], "--list", s["list.txt"], "--out", str(out),
                "--model", "fuzz-image", "--no-progress"]
    raise AssertionError(cmd)


#: index in the base argv of each positional file argument
POSITION = {("compare", "A"): 1, ("compare", "B"): 2, ("config", "items"): 1, ("train", "config"): 1,
            ("data check", "root"): 2, ("data import", "pairs"): 2, ("encode", "source"): 2, ("report", "path"): 1,
            ("export", "run"): 1}


#: the name a junk file gets (the suffix the argument expects, so that the junk is read, not refused by name)
SUFFIX = {"text": ".txt", ("config", "items"): ".yaml", ("train", "config"): ".yaml",
          ("data check", "--config"): ".yaml", ("data import", "pairs"): ".csv"}


def _junk(kind: str, where: Path, w: dict, suffix: str = ".npy") -> tuple[Path, Path | None]:
    """A fresh junk input of ``kind`` under ``where``, and the file inside it that is junk (the
    error must name that one by its full path) when the input is a folder."""
    rng = np.random.default_rng(7)
    p = where / f"junk{suffix}"
    culprit = None
    if kind == "missing":
        return where / f"no-such-file{suffix}", None
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "random bytes":
        p.write_bytes(bytes([0x93, 0xff, 0x00]) + rng.bytes(300))
    elif kind == "non-UTF-8 text":
        p.write_bytes("caf\u00e9 au lait\nna\u00efve\n".encode("latin-1"))
    elif kind in ("a directory", "an empty directory"):
        p = where / f"junkdir{suffix}"
        p.mkdir()
    elif kind == "npz for npy":
        np.savez(p.with_suffix(".npz"), a=np.zeros(3))
        p.with_suffix(".npz").rename(p)
    elif kind == "wrong shape":
        np.save(p, rng.standard_normal((5, 3, 2, 7)).astype(np.float32))
    elif kind == "wrong dtype":
        np.save(p, np.full((40, 64), "x"))
    elif kind.startswith("layout: "):
        p = where / "data"
        shutil.copytree(w["data"], p)
        if kind == "layout: optional file a directory":
            culprit = p / "test_video_mask.npy"
            culprit.mkdir()
        elif kind == "layout: names not UTF-8":
            culprit = p / "test_videos.txt"
            culprit.write_bytes(b"v\xe9\n" * 40)
        else:
            culprit = p / "test_text_to_video.npy"
            culprit.write_bytes(rng.bytes(200))
    elif kind.startswith("labelled: "):  # classify's layout: features and labels are what it reads
        p = where / "cdata"
        shutil.copytree(w["cdata"], p)
        culprit = p / ("test_video_features.npy" if kind == "labelled: junk features" else "test_video_labels.npy")
        if kind == "labelled: labels a directory":
            culprit.unlink()
            culprit.mkdir()
        else:
            culprit.write_bytes(rng.bytes(200))
    elif kind.startswith("index: "):
        p = where / "idx"
        shutil.copytree(w["idx"], p)
        if kind == "index: junk meta.json":
            culprit = p / "meta.json"
            culprit.write_bytes(b"\xff\xfe{")
        elif kind == "index: junk query_shift.npy":
            culprit = p / "query_shift.npy"
            culprit.write_bytes(b"")
        else:
            culprit = p / "names.txt"
            culprit.unlink()
            culprit.mkdir()
    elif kind.startswith("hostile: "):
        return _hostile_run(kind[len("hostile: "):], where, w)
    elif kind.startswith("features: "):
        p = where / "feats"
        shutil.copytree(w["feats"] if "--features" in kind else w["audio"], p)
        culprit = p / "v0.npy"
        culprit.write_bytes(rng.bytes(100))
    else:
        raise AssertionError(kind)
    return p, culprit


CASES = [(c, a, j) for (c, a), kind in FILE_ARGS.items() for j in JUNK[kind]]


@pytest.mark.parametrize("cmd, arg, junk", CASES, ids=[f"{c}|{a}|{j}" for c, a, j in CASES])
def test_junk_input_is_one_line_naming_the_argument(world, tmp_path, capsys, monkeypatch, cmd, arg, junk):
    import xmodal.serve

    def no_bind(*args, **kwargs):
        raise AssertionError("serve bound its port before checking its inputs")

    monkeypatch.setattr(xmodal.serve, "bind_socket", no_bind)
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / ("result.html" if cmd == "report" else "result")
    kind = FILE_ARGS[(cmd, arg)]
    bad, culprit = _junk(junk, tmp_path, world, SUFFIX.get((cmd, arg), SUFFIX.get(kind, ".npy")))
    argv = _base(cmd, arg, world, out)
    if arg.startswith("--"):
        i = len(argv) - 1 - argv[::-1].index(arg)
        name = argv[i + 1].partition("=")[0] + "=" if FILE_ARGS[(cmd, arg)].startswith("named") else ""
        argv[i + 1] = name + str(bad)
    else:
        argv[POSITION[(cmd, arg)]] = str(bad)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert code == 2, f"exit {code}: {err}"
    top = cmd.split()[0]
    assert len(lines) == 1 and lines[0].startswith(f"xmodal {top}: error: "), err
    if culprit is not None:  # a broken file inside the folder given: named by its full path
        assert str(culprit) in lines[0], lines[0]
    elif arg.startswith("--"):
        assert arg in lines[0] or str(bad) in lines[0], lines[0]
    else:  # a positional argument has no flag to name: the path given
        assert str(bad) in lines[0], lines[0]
    assert list(outdir.iterdir()) == [], f"left behind: {list(outdir.iterdir())}"


GOOD = [("eval", "--queries"), ("eval", "--text"), ("eval", "--sim"), ("eval", "--relevancy"), ("eval", "--labels"),
        ("eval", "--run"), ("eval", "--data"), ("eval", "--text-mask"), ("eval", "--video-mask"),
        ("normalize", "--queries"), ("index", "--run"), ("index", "--data"), ("index", "--video-mask"),
        ("index", "--texts"), ("index", "--select-data"),
        ("query", "--index"), ("query", "--text-mask"), ("config", "items"), ("data import", "pairs"),
        ("encode", "--captions"), ("encode", "--dir"), ("data check", "root"), ("export", "run"), ("compare", "A"),
        ("compare", "--a"), ("data import", "--ids"), ("data import", "--images"), ("classify", "--data")]


@pytest.mark.parametrize("cmd, arg", GOOD, ids=[f"{c}|{a}" for c, a in GOOD])
def test_the_good_command_lines_are_good(world, tmp_path, capsys, cmd, arg):
    """The base command lines the junk goes into run (so the junk is what fails above); not run here:
    train, report and encode videos (slow, or a video needed) and serve (it would keep serving)."""
    out = tmp_path / "result"
    code = main(_base(cmd, arg, world, out))
    assert code == 0, capsys.readouterr().err


#: (command, output argument, a base argument of _base giving the command line) -> what --out must be.
OUTPUTS = {("encode", "--out", "--captions"): "file", ("encode", "--out", "--dir"): "file",
           ("encode", "--out", "source"): "folder", ("normalize", "--save-bias", "--queries"): "file",
           ("query", "--out", "--index"): "file", ("report", "--out", "path"): "file",
           ("index", "--out", "--run"): "folder", ("eval", "--per-query", "--per-query"): "file",
           ("data import", "--out", "pairs"): "folder", ("train", "--out", "config"): "folder",
           ("export", "--out", "run"): "folder", ("classify", "--out", "--data"): "folder"}


def test_every_output_is_fuzzed():
    # data synthetic's --out: tests/test_data_synthetic.py (a file, a symlink, a folder of other files)
    assert {(c, a) for c, a, _ in OUTPUTS} == OUTPUT_ARGS - {("bench", "--out"), ("demo", "--out"),
                                                              ("encode", "--mask-out"), ("data synthetic", "--out")}


@pytest.mark.parametrize("cmd, arg, base", sorted(OUTPUTS), ids=[f"{c}|{a}|{b}" for c, a, b in sorted(OUTPUTS)])
def test_output_of_the_wrong_kind_is_one_line_naming_it(world, tmp_path, capsys, cmd, arg, base):
    """A folder where a file is written (or a file where a folder is): refused, left as it was."""
    if OUTPUTS[(cmd, arg, base)] == "file":
        out = tmp_path / "out.npy"
        out.mkdir()
    else:
        out = tmp_path / "out"
        out.write_bytes(b"mine")
    if (cmd, base) == ("encode", "source"):  # one readable video, so that the output is reached
        pytest.importorskip("av", reason="xmodal encode videos needs the [video] extra (PyAV)")
        from test_video_encode import gradient_frames, write_video

        (tmp_path / "videos").mkdir()
        write_video(tmp_path / "videos" / "a.mp4", gradient_frames(4), "mpeg4")
    argv = _base(cmd, base, world, out)
    if (cmd, base) == ("encode", "source"):
        argv[POSITION[(cmd, base)]] = str(tmp_path / "videos")
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, f"exit {code}: {err}"
    assert arg in lines[0] or str(out) in lines[0], lines[0]
    assert (list(out.iterdir()) == [] if out.is_dir() else out.read_bytes() == b"mine")


@pytest.mark.parametrize("target", ["per_query.npz", "metrics.json"])
def test_random_corruptions_of_per_query_results_are_one_line_or_a_result(world, tmp_path, capsys, target):
    """Seeded byte flips and truncations of a run's per_query.npz / metrics.json (issue 36.5): `compare`
    either still compares (a flip that changes nothing read) or exits 2 with one line; never a traceback."""
    rng = np.random.default_rng(20261127)
    good = (world["run"] / target).read_bytes()
    for i in range(20):
        run = tmp_path / f"run{i}"
        shutil.copytree(world["run"], run)
        data = bytearray(good)
        if i % 4 == 3:
            data = data[: int(rng.integers(1, len(data)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        (run / target).write_bytes(bytes(data))
        capsys.readouterr()
        code = main(["compare", str(world["run"]), str(run), "--n-boot", "200"])
        err = capsys.readouterr().err
        assert "Traceback" not in err and code in (0, 2), (i, code, err)
        if code == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("xmodal compare: error: ") and str(run) in lines[0], err
