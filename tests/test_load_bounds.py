"""``xmodal.load_model`` on hostile model files (issue 36 items 1, 7, 8, 12): every size a file declares is
bounded before anything is allocated, only the tensors config.json names are read, and values are checked
(dtype, finiteness), not only shapes. Each case is one ``ValueError`` naming the file and the culprit."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import xmodal
from xmodal.cli import main
from xmodal.models import build_model, model_payload
from xmodal.models.hierarchy import GlobalSpec, with_global_towers
from xmodal.retrieval.testtime import fit_test_time
from xmodal.runs import atomic_save

pytestmark = pytest.mark.usefixtures("one_thread")


def _fitted(model):
    g = torch.Generator().manual_seed(0)
    d = model.dim
    model.test_time = fit_test_time(["none", "dn", "sinkhorn", "ncl"], text_bank=torch.randn(40, d, generator=g),
                                    video_bank=torch.randn(30, d, generator=g),
                                    ncl_bank=(torch.randn(12, d, generator=g), torch.randn(9, d, generator=g)),
                                    temperature=0.07, dn_num_samples=None)
    return model.eval()


def _release(tmp_path: Path, *, hierarchy: bool = False) -> tuple[Path, Path]:
    """A tiny release-block transformer (sine/cosine positions, a non-persistent buffer): its model.pt and its
    export folder."""
    model = build_model(video_dim=12, text_dim=8, dim=16, kind="transformer", hidden=16, heads=2, block="release")
    if hierarchy:
        model = with_global_towers(model, GlobalSpec(dim=16, heads=2, block="release"))
    _fitted(model)
    run = tmp_path / "run"
    run.mkdir()
    atomic_save({"model": model_payload(model)}, run / "model.pt")
    assert main(["export", str(run), "--out", str(tmp_path / "ex")]) == 0
    return run, tmp_path / "ex"


def _config(folder: Path, fn) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def _refused(path, *words):
    with pytest.raises(ValueError) as err:
        xmodal.load_model(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


@pytest.fixture
def no_real_tables(monkeypatch):
    """Fails the test when a sine/cosine position table is computed anywhere but on the meta device (the
    refusal must come before the allocation, not after it)."""
    from xmodal.models import coot, hierarchy, towers

    real = coot.sinusoid_table
    built = []

    def watched(length, dim):
        if torch.get_default_device().type != "meta":
            built.append((length, dim))
            assert length * dim <= 1 << 20, f"a {length} x {dim} position table was allocated"
        return real(length, dim)

    monkeypatch.setattr(towers, "sinusoid_table", watched)
    monkeypatch.setattr(hierarchy, "sinusoid_table", watched)
    return built


# ------------------------------------------------------------------- 36.1: sizes a file declares

def test_a_position_table_declared_by_config_json_alone_is_refused_before_allocation(tmp_path, no_real_tables):
    _, ex = _release(tmp_path)
    _config(ex, lambda c: c["architecture"]["video"].update(max_frames=2 ** 21))  # 2**21 x 16 floats: 128 MiB
    assert (ex / "config.json").stat().st_size + (ex / "model.safetensors").stat().st_size < 100_000
    _refused(ex, "video_tower.pos", "max_frames", "128 MiB", "at most 64 MiB")


def test_a_weights_only_model_pt_declaring_a_huge_table_is_refused(tmp_path, no_real_tables):
    run, _ = _release(tmp_path)
    payload = torch.load(run / "model.pt", weights_only=True)
    payload["model"]["architecture"]["text"]["max_frames"] = 2 ** 31 - 1  # a linear tower: no table
    payload["model"]["architecture"]["video"]["max_frames"] = 2 ** 21
    atomic_save(payload, run / "model.pt")
    _refused(run, "video_tower.pos", "at most 64 MiB")


def test_a_hierarchy_max_len_and_the_cli_are_bounded_too(tmp_path, capsys, no_real_tables):
    _, ex = _release(tmp_path, hierarchy=True)
    xmodal.load_model(ex)  # the honest folder loads
    _config(ex, lambda c: c["architecture"]["hierarchy"].update(max_len=2 ** 21))
    _refused(ex, "global_video.pos")
    np.save(tmp_path / "v.npy", np.zeros((3, 12), np.float32))
    capsys.readouterr()
    assert main(["index", "--run", str(ex), "--video-features", str(tmp_path / "v.npy"),
                 "--out", str(tmp_path / "idx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xmodal index: error: --run:") and "global_video.pos" in err and err.count("\n") == 1


@pytest.mark.parametrize("field, value, words", [
    ("layers", 65, "architecture['video'].layers: must be at most 64"),
    ("heads", "8", "architecture['video'].heads: expected an integer"),
    ("dropout", "0.1", "architecture['video'].dropout: expected a number"),
])
def test_tower_fields_are_typed_and_bounded(tmp_path, field, value, words):
    _, ex = _release(tmp_path)
    _config(ex, lambda c: c["architecture"]["video"].update({field: value}))
    _refused(ex, words)


def test_hierarchy_fields_are_typed_and_too_many_experts_refused(tmp_path):
    _, ex = _release(tmp_path, hierarchy=True)
    _config(ex, lambda c: c["architecture"]["hierarchy"].update(dim="16"))
    _refused(ex, "architecture['hierarchy'].dim: expected an integer")
    _config(ex, lambda c: c["architecture"]["hierarchy"].update(dim=16, bogus=1))
    _refused(ex, "architecture['hierarchy']: unknown field(s) bogus")
    _config(ex, lambda c: (c["architecture"]["hierarchy"].pop("bogus"),
                           c["architecture"].update(experts={f"e{i}": c["architecture"]["text"] for i in range(65)})))
    _refused(ex, "65 experts, at most 64")


# ------------------------------------------------------------------- 36.7: values, not only shapes

def _set_tensor(ex: Path, name: str, fn) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ex / "model.safetensors"))
    tensors[name] = fn(tensors[name])
    save_file(tensors, str(ex / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.float64])
def test_weights_of_another_dtype_are_refused(tmp_path, dtype):
    _, ex = _release(tmp_path)
    _set_tensor(ex, "video_tower.inp.0.weight", lambda t: t.to(dtype))
    _refused(ex, "video_tower.inp.0.weight", str(dtype).removeprefix("torch."), "float32")


def test_nan_weights_are_refused_in_an_export_and_a_model_pt(tmp_path):
    run, ex = _release(tmp_path)
    _set_tensor(ex, "text_tower.net.weight", lambda t: t.index_fill(0, torch.tensor([2]), float("nan")))
    _refused(ex, "NaN or inf in text_tower.net.weight")
    payload = torch.load(run / "model.pt", weights_only=True)
    payload["model"]["state_dict"]["video_tower.standardize.std"][3] = float("inf")
    atomic_save(payload, run / "model.pt")
    _refused(run, "NaN or inf in video_tower.standardize.std")


def test_half_precision_weights_in_a_model_pt_are_refused(tmp_path):
    run, _ = _release(tmp_path)
    payload = torch.load(run / "model.pt", weights_only=True)
    sd = payload["model"]["state_dict"]
    payload["model"]["state_dict"] = {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
    atomic_save(payload, run / "model.pt")
    _refused(run, "as float16, the architecture's is float32")


def test_nan_in_the_dn_means_or_a_bank_is_refused(tmp_path):
    run, ex = _release(tmp_path)
    _config(ex, lambda c: c["test_time"]["dn"]["tensors"]["mu_q"]["values"].__setitem__(0, float("nan")))
    _refused(ex, "test_time.dn.tensors.mu_q: holds NaN or inf")
    payload = torch.load(run / "model.pt", weights_only=True)
    payload["model"]["test_time"]["banks"]["ncl"][1][0, 0] = float("nan")
    atomic_save(payload, run / "model.pt")
    _refused(run, "test_time.banks.ncl.video: holds NaN or inf")
    payload["model"]["test_time"]["banks"]["ncl"][1] = torch.zeros(9, 5)
    atomic_save(payload, run / "model.pt")
    _refused(run, "test_time.banks.ncl.video: expected float32 [K, 16] embeddings, got float32 (9, 5)")


# ------------------------------------------------------------------- 36.8: config.json and the tensors read

def test_config_json_of_a_million_empty_objects_is_refused_unparsed(tmp_path, monkeypatch):
    _, ex = _release(tmp_path)
    cfg = (ex / "config.json").read_text().rstrip()
    (ex / "config.json").write_text(cfg[:-1] + ', "run_config": {"x": [' + "{}," * 1_500_000 + "{}]}}")
    parsed = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda *a, **k: parsed.append(1) or real(*a, **k))
    _refused(ex, "JSON values, more than the 1,048,576")
    assert parsed == []  # measured, never parsed


def test_deeply_nested_config_json_is_one_line(tmp_path):
    _, ex = _release(tmp_path)
    cfg = (ex / "config.json").read_text().rstrip()
    (ex / "config.json").write_text(cfg[:-1] + ', "run_config": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _refused(ex, "is JSON nested 100001 levels deep, more than the 32")


@pytest.mark.parametrize("change, words", [
    (lambda c: c.update(bogus=1), "key(s) an xmodal export does not write: bogus"),
    (lambda c: c.update(version="1"), "\"version\" must be a whole number >= 1, got '1'"),
    (lambda c: c.update(version=-7), "\"version\" must be a whole number >= 1, got '-7'"),
    (lambda c: c.update(version=2), "export version 2, written by a newer xmodal; this xmodal reads version 1"),
    (lambda c: c["test_time"].update(bogus=1), "test_time holds unknown key(s) bogus"),
    (lambda c: c["test_time"]["dn"]["tensors"]["mu_q"].update(values=["a"] * 16),
     "test_time.dn.tensors.mu_q.values: expected numbers only"),
    (lambda c: c["test_time"]["dn"]["tensors"]["mu_q"].update(shape="16"),
     "test_time.dn.tensors.mu_q.shape: expected a list"),
    (lambda c: c["test_time"].update(names="none"), "test_time.names has the wrong type"),
])
def test_config_json_keys_and_types_are_checked(tmp_path, change, words):
    _, ex = _release(tmp_path)
    _config(ex, change)
    msg = _refused(ex, words)
    for junk in ("too many dimensions", "this xmodal reads 1)"):
        assert junk not in msg


def test_a_tensor_config_json_never_names_is_refused_unread(tmp_path):
    """A 128 MiB entry nobody names (a sparse file: it takes no disk) is refused from the header alone."""
    from safetensors import safe_open

    _, ex = _release(tmp_path)
    p = ex / "model.safetensors"
    data = p.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = len(data) - 8 - n
    big = 1 << 27
    header["zz.unnamed"] = {"dtype": "F32", "shape": [big // 4], "data_offsets": [body, body + big]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
        f.truncate(8 + len(raw) + body + big)
    with safe_open(str(p), framework="pt") as f:  # a valid file: safetensors itself accepts it
        assert "zz.unnamed" in f.keys()
    _refused(ex, "holds tensor(s) config.json never names: zz.unnamed")


def test_re_export_of_a_folder_whose_banks_share_one_tensor(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    _, ex = _release(tmp_path)
    # both banks name the train bank's entries (the ncl ones leave the file): one tensor, two banks
    _config(ex, lambda c: c["test_time"]["banks"].update(ncl=c["test_time"]["banks"]["train"]))
    tensors = {k: v for k, v in load_file(str(ex / "model.safetensors")).items() if ".ncl." not in k}
    save_file(tensors, str(ex / "model.safetensors"), metadata={"format": "pt"})
    model = xmodal.load_model(ex)
    assert model.test_time.banks["ncl"][0] is model.test_time.banks["train"][0]
    capsys.readouterr()
    assert main(["export", str(ex), "--out", str(tmp_path / "again")]) == 0, capsys.readouterr().err
    again = xmodal.load_model(tmp_path / "again")
    assert torch.equal(again.test_time.banks["ncl"][1], model.test_time.banks["train"][1])
