"""Encoder identity records (:mod:`xmodal.features.identity`): what counts as the same encoder, what an
unrecorded size is assumed to be, and sidecars read with bounded size and checked values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xmodal.features import encoders, identity

HEX_A, HEX_B = "a" * 64, "b" * 64


def rec(**kw) -> dict:
    return {"spec": "hf:/m/a", "kind": "text", "level": "sentence", "weights_sha256": HEX_A, "dim": 512, **kw}


def test_same_encoder_by_hashes_else_by_spec():
    assert identity.mismatch(rec(), rec(spec="hf:/elsewhere/a")) is None  # a moved copy: same weights
    assert "other weights" in identity.mismatch(rec(), rec(weights_sha256=HEX_B))
    assert "preprocesses" in identity.mismatch(rec(preprocessing_sha256=HEX_A), rec(preprocessing_sha256=HEX_B))
    assert "512-d" in identity.mismatch(rec(), rec(dim=384))
    assert "tokens features" in identity.mismatch(rec(level="tokens"), rec())
    named = {"spec": "mine", "kind": "text", "dim": 512}
    assert identity.mismatch(named, dict(named)) is None
    assert "is not the recorded encoder mine" in identity.mismatch(named, {**named, "spec": "theirs"})
    assert identity.mismatch(None, rec()) is None and identity.mismatch(rec(), None) is None


def test_resolution_statuses():
    def fn(texts, *, batch_size, progress):
        return np.zeros((len(texts), 12), np.float32)

    encoders.register_encoder("records-test", fn, overwrite=True)
    try:
        assert identity.resolve_text(None, 12)["status"] == "off"
        assert identity.resolve_text(None, 384) == {**identity.resolve_text(None, 384), "spec": "minilm",
                                                    "status": "assumed"}
        mine = identity.resolve_text(None, 12, "records-test")
        assert (mine["spec"], mine["status"]) == ("records-test", "stated")
        recorded = {"spec": "records-test", "kind": "text", "level": "tokens", "dim": 12}
        assert identity.resolve_text(recorded, 12)["status"] == "recorded"  # token features of the same encoder
        gone = identity.resolve_text({**recorded, "spec": "hf:/no/such/folder"}, 12)
        assert gone["status"] == "off" and "is not usable here" in gone["reason"]
        with pytest.raises(ValueError, match="^--text-encoder: minilm gives 384-d features"):
            identity.resolve_text(recorded, 12, "minilm")
        assert identity.resolve_text(recorded, 12, "none")["status"] == "off"
    finally:
        encoders.ENCODERS.pop("records-test", None)


def test_sidecars_are_read_bounded_and_checked(tmp_path):
    npy = tmp_path / "f.npy"
    np.save(npy, np.zeros((2, 3), np.float32))
    assert identity.read_sidecar(npy) is None
    path = identity.write_sidecar(npy, rec(dim=3))
    assert path.name == "f.npy.encoder.json" and identity.read_sidecar(npy)["dim"] == 3
    cases = [("[" * 100_000 + "]" * 100_000, "levels deep"), ('{"format": "other"}', "was not written by"),
             (json.dumps({"format": "xmodal-encoder", **rec(dim=-1)}), "'dim' must be"),
             (json.dumps({"format": "xmodal-encoder", **rec(weights_sha256="xyz")}), "'weights_sha256'"),
             (json.dumps({"format": "xmodal-encoder", **rec(kind="audio")}), "'kind' must be"),
             ("x" * (identity.MAX_BYTES + 1), "more than an encoder record")]
    for body, needle in cases:
        path.write_text(body)
        with pytest.raises(ValueError, match="^--text-features: ") as err:
            identity.read_sidecar(npy, "--text-features")
        assert needle in str(err.value) and "\n" not in str(err.value), needle


def test_an_export_names_a_portable_spec():
    out = identity.portable(rec(spec="hf:/home/me/models/clip-b32"))
    assert out["spec"] == "hf:clip-b32" and out["weights_sha256"] == HEX_A
    assert identity.portable(rec(hub_name="openai/clip-vit-base-patch32"))["spec"] == "hf:openai/clip-vit-base-patch32"
    assert identity.portable({"spec": "minilm", "kind": "text"})["spec"] == "minilm"


def nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


def test_a_deep_layout_record_is_refused_at_train_so_no_run_holds_one(tmp_path, capsys):
    """Issue 44 item 7: a 6 KB DATA/encoders.json nested 900 deep trained, and the run's RUN/encoders.json
    (824 KB with its indentation) was then refused by index and export. Now the layout's file is refused
    by train in one line, and nothing written by the producers can exceed what their readers take."""
    from xmodal.cli import main
    from xmodal.data import write_synthetic

    data = tmp_path / "data"
    write_synthetic(data, seed=0, num_train=40, num_val=20, num_test=20, num_concepts=4)
    body = {"format": "xmodal-encoders", "version": 1, "text": rec(preprocessing=nested(900)), "video": None,
            "experts": {}}
    text = json.dumps(body)
    assert len(text) < 16_000 and len(json.dumps(body, indent=1)) > identity.MAX_BYTES  # the finding's shape
    (data / "encoders.json").write_text(text)
    with pytest.raises(ValueError, match=r"^data: .*encoders.json is JSON nested 90\d levels deep") as err:
        identity.read_encoders(data)
    assert "\n" not in str(err.value)
    rc = main(["train", "configs/synthetic.yaml", "--out", str(tmp_path / "run"), "--quiet", "data.name=paired",
               f"data.root={data}", "train.epochs=1", "train.batch_size=16", "model.dim=8",
               "test_time.bank_size=20"])
    err_text = capsys.readouterr().err.strip()
    assert rc != 0 and "levels deep" in err_text and len(err_text.splitlines()) == 1, err_text
    assert not (tmp_path / "run" / "encoders.json").exists()


@pytest.mark.parametrize("record", [rec(preprocessing=nested(5)), rec(preprocessing=nested(3000)),
                                    rec(sampling={"k": [[[[[1]]]]]})])
def test_records_nested_past_the_bound_are_refused_by_the_producers(tmp_path, record):
    for write in (lambda: identity.write_encoders(tmp_path, {"text": record, "video": None, "experts": {}}),
                  lambda: identity.write_sidecar(tmp_path / "f.npy", record)):
        with pytest.raises(ValueError, match="nested more than 4 levels") as err:
            write()
        assert "\n" not in str(err.value)
    assert not list(tmp_path.iterdir())


def test_what_the_producers_write_their_readers_take(tmp_path):
    """A record at the depth bound, and one as large as a record may be: written, then read back."""
    deep = rec(preprocessing=nested(4))
    path = identity.write_encoders(tmp_path, {"text": deep, "video": deep, "experts": {f"e{i}": deep for i in range(3)}})
    assert identity.read_encoders(tmp_path)["experts"]["e2"]["preprocessing"] == nested(4)
    wide = rec(preprocessing={f"k{i}": "v" * 200 for i in range(2000)})  # 400 KB: more than a file holds
    with pytest.raises(ValueError, match="more than an identity file holds") as err:
        identity.write_encoders(tmp_path, {"text": wide, "video": None, "experts": {}})
    assert "\n" not in str(err.value) and identity.read_encoders(tmp_path)["text"] == deep  # the last good file kept
    assert path.stat().st_size <= identity.MAX_BYTES
