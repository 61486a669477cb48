"""The argument helpers of ``xmodal._validate`` added for the fuzz suite: one-line messages
naming the argument, arrays described by type and shape, valid values returned unchanged."""

import numpy as np
import pytest
import torch

from xmodal._validate import duck, finite_number, option, positive_int, whole_number


def test_whole_number_accepts_integral_values_and_refuses_junk():
    assert whole_number(3, "k") == 3 and whole_number(np.int64(2), "k") == 2 and whole_number(4.0, "k") == 4
    assert whole_number(0, "k") == 0
    for bad, exc in ((True, TypeError), (None, TypeError), (np.ones((3, 4)), TypeError), (2.5, ValueError),
                     (float("nan"), ValueError), (-1, ValueError)):
        with pytest.raises(exc, match=r"^k: ") as info:
            whole_number(bad, "k")
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=">= 1"):
        whole_number(0, "k", minimum=1)


def test_positive_int_finite_number_and_option():
    assert positive_int(np.int32(5), "n") == 5
    for bad in (0, -2, 1.0, False, torch.ones(2)):
        with pytest.raises((TypeError, ValueError), match=r"^n: "):
            positive_int(bad, "n")
    assert finite_number(torch.tensor(-0.5), "lam") == -0.5
    with pytest.raises(TypeError, match=r"^lam: expected a number, got an array of shape \(2, 3\)"):
        finite_number(torch.ones(2, 3), "lam")
    with pytest.raises(ValueError, match=r"^lam: must be a finite number"):
        finite_number(float("inf"), "lam")
    assert option("val", "dn_source", ("train", "val")) == "val"
    with pytest.raises(TypeError, match=r"^dn_source: expected one of train, val, got an array of shape \(5, 1\)"):
        option(np.zeros((5, 1)), "dn_source", ("train", "val"))
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        option("bogus", "dn_source", ("train", "val"))


def test_duck_names_the_argument_and_what_is_missing():
    class Model:
        def encode_video(self):
            pass

    m = Model()
    assert duck(m, "model", "a model", ("encode_video",)) is m
    with pytest.raises(TypeError, match=r"^model: expected a model, got Model \(no encode_text, test_time\)$"):
        duck(m, "model", "a model", ("encode_video", "encode_text"), ("test_time",))
    with pytest.raises(TypeError, match=r"^split: expected a split, got NoneType"):
        duck(None, "split", "a split", ("video_input",))
