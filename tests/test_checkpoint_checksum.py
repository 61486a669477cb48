"""A damaged mid-epoch checkpoint is never resumed (issue 44 item 5): 64 flipped bytes in a weight resumed
silently into other weights (no checksum); a ``batch`` past the epoch ended in ``UnboundLocalError`` and
``partial=5`` in ``AttributeError``. Now the payload's SHA-256 is checked before a resume and every field
of the resume record is checked against the run: each is one line, and nothing of the run is changed."""

from __future__ import annotations

import hashlib
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from test_midepoch_resume import Crash, _config, _crash_at, _same_weights, _weights
from xmodal.runs import atomic_save
from xmodal.training.checkpoints import CHECKSUM_KEY, payload_checksum
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A run stopped inside epoch 2 (batch 3 of 6 done), its mid-epoch checkpoint's bytes, and the weights
    of the same run never interrupted."""
    root = tmp_path_factory.mktemp("killed")
    mp = pytest.MonkeyPatch()
    try:
        _crash_at(mp, 10)
        with pytest.raises(Crash):
            train(_config({}, 1e-9), root / "run", progress=False, verbose=False)
    finally:
        mp.undo()
    train(_config({}, 0), root / "full", progress=False, verbose=False)
    data = (root / "run" / "checkpoint.pt").read_bytes()
    assert torch.load(root / "run" / "checkpoint.pt", weights_only=True)["state"]["batch"] == 3
    return {"root": root, "bytes": data}


def _fresh(killed, tmp_path: Path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(killed["root"] / "run", run)
    return run


def _refused(run: Path, needle: str) -> str:
    before = (run / "checkpoint.pt").read_bytes()
    with pytest.raises(ValueError) as err:
        train(_config({}, 1e-9), run, progress=False, verbose=False)
    msg = str(err.value)
    assert "\n" not in msg and needle in msg and "checkpoint.pt" in msg, msg
    assert (run / "checkpoint.pt").read_bytes() == before and not (run / "model.pt").exists()  # nothing changed
    return msg


def _largest_entry(data: bytes, path: Path) -> tuple[int, int]:
    """``(offset, size)`` in the file of the largest tensor storage (the zip stores them uncompressed)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    header = info.header_offset
    name_len, extra_len = int.from_bytes(data[header + 26:header + 28], "little"), \
        int.from_bytes(data[header + 28:header + 30], "little")
    return header + 30 + name_len + extra_len, info.file_size


def _bump_first_weight(ck: dict) -> None:
    sd = ck["model"]["state_dict"]
    name = next(iter(sd))
    w = sd[name].clone()
    w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(math.inf))  # one ulp: one bit of one weight
    sd[name] = w


def test_the_checksum_covers_every_value_and_an_intact_checkpoint_resumes_bit_identical(killed, tmp_path):
    ck = torch.load(killed["root"] / "run" / "checkpoint.pt", weights_only=True)
    saved = ck.pop(CHECKSUM_KEY)
    assert saved == payload_checksum(ck) and len(saved) == 64  # what was written is what is read back
    for change in (lambda c: c["state"].update(step=c["state"]["step"] + 1),
                   lambda c: c["state"].update(train_time=c["state"]["train_time"] + 1e-9),
                   _bump_first_weight,
                   lambda c: c["state"]["partial"].update(losses=tuple(c["state"]["partial"]["losses"]))):
        other = torch.load(killed["root"] / "run" / "checkpoint.pt", weights_only=True)
        other.pop(CHECKSUM_KEY)
        change(other)
        assert payload_checksum(other) != saved
    run = _fresh(killed, tmp_path)
    train(_config({}, 1e-9), run, progress=False, verbose=False)
    _same_weights(_weights(killed["root"] / "full"), _weights(run))


def test_64_flipped_bytes_in_a_weight_are_refused(killed, tmp_path):
    run = _fresh(killed, tmp_path)
    data = bytearray(killed["bytes"])
    offset, size = _largest_entry(bytes(data), run / "checkpoint.pt")
    rng = np.random.default_rng(0)
    for i in rng.choice(size, 64, replace=False):
        data[offset + int(i)] ^= 0xFF
    (run / "checkpoint.pt").write_bytes(bytes(data))
    torch.load(run / "checkpoint.pt", weights_only=True)  # still loads: only the checksum can tell
    _refused(run, "damaged checkpoint (its payload does not match the checksum")


@pytest.mark.parametrize("seed", range(4))
def test_64_bytes_flipped_anywhere_are_never_resumed(killed, tmp_path, seed):
    run = _fresh(killed, tmp_path)
    data = bytearray(killed["bytes"])
    for i in np.random.default_rng(seed).choice(len(data), 64, replace=False):
        data[int(i)] ^= 1 << int(i % 8)
    (run / "checkpoint.pt").write_bytes(bytes(data))
    _refused(run, "checkpoint.pt")


def _with_state(killed, tmp_path, edit) -> Path:
    """The checkpoint with its state edited and a checksum recomputed: only the value checks can refuse it."""
    run = _fresh(killed, tmp_path)
    ck = torch.load(run / "checkpoint.pt", weights_only=True)
    ck.pop(CHECKSUM_KEY)
    edit(ck["state"])
    ck[CHECKSUM_KEY] = payload_checksum(ck)
    atomic_save(ck, run / "checkpoint.pt")
    return run


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.update(batch=99), "state 'batch': past the 6 batches of epoch 2"),
    (lambda s: s.update(batch=6), "state 'batch': past the 6 batches of epoch 2"),
    (lambda s: s.update(partial=5), "state 'partial': expected the epoch's running losses"),
    (lambda s: s.update(batch="3"), "state 'batch': expected an integer"),
    (lambda s: s.update(batch=True), "state 'batch': expected an integer"),
    (lambda s: s.update(epoch=5), "state 'epoch': expected an integer in 0..2"),
    (lambda s: s.update(epoch=-1), "state 'epoch': expected an integer in 0..2"),
    (lambda s: s.update(step=-3), "state 'step': expected an integer >= 0"),
    (lambda s: s.update(step=2), "state 'step': expected at least the 3 batches"),
    (lambda s: s.update(best_epoch=7), "state 'best_epoch'"),
    (lambda s: s.update(bad_epochs=4), "state 'bad_epochs'"),
    (lambda s: s.update(history="x"), "state 'history': expected 1 epoch record"),
    (lambda s: s.update(done="yes"), "state 'done': expected true or false"),
    (lambda s: s.update(done=True), "state 'batch': expected 0 once"),
    (lambda s: s.update(train_time=math.nan), "state 'train_time'"),
    (lambda s: s.update(best_score=math.nan), "state 'best_score'"),
    (lambda s: s.update(best_model=None, best_loss=3), "state 'best_model'"),
    (lambda s: s.pop("epoch"), "state 'epoch': missing"),
    (lambda s: s["partial"].update(losses=[1.0]), "state 'partial.losses': expected the 3 finite losses"),
    (lambda s: s["partial"].update(losses=["a", "b", "c"]), "state 'partial.losses'"),
    (lambda s: s["partial"].update(losses=[1.0, math.inf, 2.0]), "state 'partial.losses'"),
    (lambda s: s["partial"].update(terms=[1]), "state 'partial.terms'"),
    (lambda s: s["partial"].update(seconds=-1.0), "state 'partial.seconds'"),
])
def test_every_field_of_the_resume_record_is_checked(killed, tmp_path, edit, needle):
    _refused(_with_state(killed, tmp_path, edit), needle)


def test_a_checkpoint_without_a_checksum_is_refused(killed, tmp_path):
    run = _fresh(killed, tmp_path)
    ck = torch.load(run / "checkpoint.pt", weights_only=True)
    ck.pop(CHECKSUM_KEY)
    atomic_save(ck, run / "checkpoint.pt")
    _refused(run, "no checksum of its payload")
    assert hashlib.sha256(killed["bytes"]).hexdigest() != hashlib.sha256((run / "checkpoint.pt").read_bytes()).hexdigest()
