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
    cases = [("[" * 100_000 + "]" * 100_000, "not valid JSON"), ('{"format": "other"}', "was not written by"),
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
