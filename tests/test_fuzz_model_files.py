"""Generated hostile files where a model or a run's trackers are read (issue 36: export folders, model.pt,
trackers.json and its journal), in the manner of ``test_fuzz_cli_files.py``: hypothesis rewrites one part of
a good file with junk (other JSON types, huge or negative sizes, NaN, deep nesting, strings, extra keys or
tensors, a header that lies about its tensors).

Properties: ``xmodal.load_model`` returns a model whose towers embed finite inputs to finite unit vectors,
or raises one-line ``ValueError`` / ``FileNotFoundError``; the process's peak memory stays within 1 GiB of
where it started; a garbled ``trackers.json`` or journal never stops a resume and the resume continues the
run's own MLflow run.
"""

from __future__ import annotations

import copy
import json
import resource
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import xmodal  # noqa: E402
from xmodal.cli import main  # noqa: E402
from xmodal.models import build_model, model_payload  # noqa: E402
from xmodal.retrieval.testtime import fit_test_time  # noqa: E402
from xmodal.runs import atomic_save  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                derandomize=False)
LEAVES = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.sampled_from([2 ** 31, 2 ** 40, -1, 0])
          | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
JSON = st.recursive(LEAVES, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=8)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A release-block transformer (computed position tables) with every stored normaliser, exported."""
    root = tmp_path_factory.mktemp("fuzzmodel")
    model = build_model(video_dim=12, text_dim=8, dim=16, kind="transformer", hidden=16, heads=2, block="release")
    g = torch.Generator().manual_seed(0)
    model.test_time = fit_test_time(["none", "dn", "sinkhorn", "ncl"], text_bank=torch.randn(40, 16, generator=g),
                                    video_bank=torch.randn(30, 16, generator=g),
                                    ncl_bank=(torch.randn(12, 16, generator=g), torch.randn(9, 16, generator=g)),
                                    temperature=0.07, dn_num_samples=None)
    (root / "run").mkdir()
    atomic_save({"model": model_payload(model.eval())}, root / "run" / "model.pt")
    assert main(["export", str(root / "run"), "--out", str(root / "ex")]) == 0
    return root


def _paths(value, prefix=()):
    """Every path into a JSON value (dict keys, list indices)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:5]):
            yield from _paths(v, (*prefix, i))


def _set(value, path, new):
    if not path:
        return new
    value = copy.deepcopy(value)
    target = value
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = new
    return value


def _loads_or_refuses(folder: Path) -> None:
    try:
        model = xmodal.load_model(folder)
    except (ValueError, FileNotFoundError) as exc:
        assert "\n" not in str(exc), str(exc)
        return
    spec = model.text_tower.spec
    t = torch.randn(3, 2, spec.in_dim) if spec.tokens else torch.randn(3, spec.in_dim)
    v = torch.randn(2, 3, model.video_tower.spec.in_dim) if not model.experts else None
    out = [model.encode_text(t)] + ([model.encode_video(v)] if v is not None else [])
    for e in out:
        assert torch.isfinite(e).all()


def test_hostile_config_json(exported, tmp_path):
    good = json.loads((exported / "ex" / "config.json").read_text())
    paths = [p for p in _paths(good) if p[:1] != ("run_config",)]
    start = _peak_mb()

    @settings(max_examples=60, **SETTINGS)
    @given(where=st.sampled_from(paths), junk=JSON, extra=st.sampled_from(["", "deep", "wide"]))
    def check(where, junk, extra):
        folder = tmp_path / "ex"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(exported / "ex", folder)
        text = json.dumps(_set(good, where, junk))
        if extra == "deep":
            text = text[:-1] + ', "run_config": ' + "[" * 50_000 + "]" * 50_000 + "}"
        elif extra == "wide":
            text = text[:-1] + ', "run_config": [' + "{}," * 400_000 + "{}]}"
        (folder / "config.json").write_text(text)
        _loads_or_refuses(folder)

    check()
    assert _peak_mb() - start < 1024, f"peak memory grew by {_peak_mb() - start:.0f} MB"


def test_hostile_safetensors_header(exported, tmp_path):
    data = (exported / "ex" / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    names = sorted(k for k in header if k != "__metadata__")
    start = _peak_mb()

    @settings(max_examples=40, **SETTINGS)
    @given(name=st.sampled_from(names), field=st.sampled_from(["dtype", "shape", "data_offsets", "entry", "new"]),
           junk=JSON, length=st.sampled_from([None, 0, 7, 2 ** 40]))
    def check(name, field, junk, length):
        h = copy.deepcopy(header)
        if field == "entry":
            h[name] = junk
        elif field == "new":
            h["zz.unnamed"] = {"dtype": "F32", "shape": [1 << 28], "data_offsets": [0, 1 << 30]}
        else:
            h[name][field] = junk
        raw = json.dumps(h).encode()
        raw += b" " * (-len(raw) % 8)
        folder = tmp_path / "ex"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(exported / "ex", folder)
        head = struct.pack("<Q", len(raw) if length is None else length)
        (folder / "model.safetensors").write_bytes(head + raw + data[8 + n:])
        _loads_or_refuses(folder)

    check()
    assert _peak_mb() - start < 1024, f"peak memory grew by {_peak_mb() - start:.0f} MB"


def test_hostile_model_pt_architecture(exported, tmp_path):
    good = torch.load(exported / "run" / "model.pt", weights_only=True)
    paths = list(_paths(good["model"]["architecture"]))
    start = _peak_mb()

    @settings(max_examples=40, **SETTINGS)
    @given(where=st.sampled_from(paths), junk=JSON)
    def check(where, junk):
        payload = copy.deepcopy(good)
        payload["model"]["architecture"] = _set(payload["model"]["architecture"], where, junk)
        (tmp_path / "run").mkdir(exist_ok=True)
        atomic_save(payload, tmp_path / "run" / "model.pt")
        _loads_or_refuses(tmp_path / "run")

    check()
    assert _peak_mb() - start < 1024, f"peak memory grew by {_peak_mb() - start:.0f} MB"


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A run stopped after 2 of 3 epochs with MLflow on: its folder, to copy for each example."""
    pytest.importorskip("mlflow.tracking", reason="the [mlflow] extra is not installed (pip install 'xmodal[mlflow]')")
    from test_workbench_logs import tiny

    from xmodal.config import from_dict
    from xmodal.training.loop import train

    run = tmp_path_factory.mktemp("tracked") / "run"
    cfg = tiny(train={"log_to": ["mlflow"], "epochs": 3})
    assert train(from_dict(cfg), run, stop_after_epochs=2, verbose=False) == {"stopped": True, "epoch": 2}
    return run, cfg


def test_hostile_trackers_json_and_journal(tracked, tmp_path):
    from xmodal.config import from_dict
    from xmodal.training.loop import train
    from xmodal.training.trackers import read_journal

    run, cfg = tracked
    good = json.loads((run / "trackers.json").read_text())
    paths = list(_paths(good))

    @settings(max_examples=12, **SETTINGS)
    @given(where=st.sampled_from(paths), junk=JSON,
           journal=st.lists(st.sampled_from([b"{", b"\xff\xfe", b'{"s": -1, "v": {}}', b'{"s": 3, "v": {"x": "a"}}',
                                             b"[" * 10_000, b'{"s": 1e400}', b"\x00" * 50]), max_size=4),
           raw=st.sampled_from([None, b"", b"\xff", b"[" * 100_000, b'{"mlflow": {"run_id": "../../x"}}']))
    def check(where, junk, journal, raw):
        copy_ = tmp_path / "run"
        shutil.rmtree(copy_, ignore_errors=True)
        shutil.copytree(run, copy_)
        (copy_ / "trackers.json").write_bytes(raw if raw is not None else json.dumps(_set(good, where, junk)).encode())
        with open(copy_ / "trackers.jsonl", "ab") as f:
            f.write(b"\n".join(journal) + (b"\n" if journal else b""))
        read_journal(copy_, 10 ** 6)  # never raises on junk lines
        train(from_dict(cfg), copy_, verbose=False)
        after = json.loads((copy_ / "trackers.json").read_text())
        assert after["mlflow"]["run_id"] == good["mlflow"]["run_id"]  # found again by the run's identity

    check()


def test_cli_on_hostile_export_folders_is_one_line(exported, tmp_path, capsys):
    """``eval --run`` / ``index --run`` / ``export`` of an export folder with a hostile file: exit 2, one line."""
    np.save(tmp_path / "v.npy", np.zeros((3, 12), np.float32))
    cases = {
        "max_frames": lambda f: _edit(f, lambda c: c["architecture"]["video"].update(max_frames=2 ** 30)),
        "nan": lambda f: _edit(f, lambda c: c["test_time"]["dn"]["tensors"]["mu_g"]["values"].__setitem__(1, float("nan"))),
        "deep": lambda f: (f / "config.json").write_text("[" * 200_000 + "]" * 200_000),
        "version": lambda f: _edit(f, lambda c: c.update(version="1")),
    }
    for name, damage in cases.items():
        folder = tmp_path / name
        shutil.copytree(exported / "ex", folder)
        damage(folder)
        for argv in (["eval", "--run", str(folder), "--video-features", str(tmp_path / "v.npy"), "--text-features",
                      str(tmp_path / "v.npy"), "--text-to-video", str(tmp_path / "v.npy")],
                     ["index", "--run", str(folder), "--video-features", str(tmp_path / "v.npy"), "--out",
                      str(tmp_path / f"idx_{name}")],
                     ["export", str(folder), "--out", str(tmp_path / f"re_{name}")]):
            capsys.readouterr()
            assert main(argv) == 2, (name, argv[0])
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "Traceback" not in err and str(folder) in err, (name, err)


def _edit(folder: Path, fn) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
