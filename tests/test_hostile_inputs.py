"""Hostile values found by trying every command on odd inputs (issue 25.7, "attack inputs"): each was
a traceback or an error that did not name its input; now one line naming it."""

from __future__ import annotations

import numpy as np
import pytest

from xmodal.cli import main


def _layout(root, **extra):
    root.mkdir()
    np.save(root / "train_video_features.npy", np.random.default_rng(0).random((4, 3)).astype(np.float32))
    np.save(root / "train_text_features.npy", np.random.default_rng(1).random((4, 3)).astype(np.float32))
    np.save(root / "train_text_to_video.npy", np.arange(4))
    for name, arr in extra.items():
        np.save(root / f"train_{name}.npy", arr)
    return root


def test_data_check_names_a_huge_group_number_instead_of_failing(tmp_path, capsys):
    """``data check`` counted clips per group with ``np.bincount`` up to the largest group number
    (2**62 here): 'array is too big', naming no file."""
    root = _layout(tmp_path / "d", video_to_group=np.array([0, 0, 1, 2 ** 62]))
    assert main(["data", "check", str(root)]) == 1
    out = capsys.readouterr().out
    assert "train_video_to_group.npy: group numbers skip from 1 to 4611686018427387904 at row 3" in out


def test_class_counts_refuses_a_class_id_past_memory():
    from xmodal.data import class_counts

    with pytest.raises(ValueError, match=r"labels: class id 4611686018427387904 would need"):
        class_counts(np.array([0, 2 ** 62]))
    assert class_counts(np.array([0, 2, 2])).tolist() == [1, 0, 2]


def test_load_array_names_a_bad_label_or_path():
    from xmodal.data.npyfile import load_array

    with pytest.raises(TypeError, match="label: expected a string"):
        load_array("x.npy", label=np.zeros((3, 3)))
    with pytest.raises(TypeError, match="path: expected a .npy file path"):
        load_array(np.zeros(3))
