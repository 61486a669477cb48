"""``hf:DIR`` folders are data, never code (issue 44, items 1-3): each attack of the issue on a tiny
random-weight CLIP folder saved here is refused in one line (``model: hf:DIR: ...`` naming the file)
before anything is built or encoded, and no code of the folder runs even with ``y`` on standard input.
The honest folder's features stay the library's own (tests/test_encoders_hf.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_tiny  # noqa: E402

from xmodal.cli import main  # noqa: E402
from xmodal.features import encoders  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTIONS = ["a dog runs on the grass", "two cats"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return hf_tiny.save_clip(tmp_path_factory.mktemp("hf") / "clip")


def copy(clean: Path, tmp_path: Path, name: str = "bad") -> Path:
    return Path(shutil.copytree(clean, tmp_path / name))


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def edit_weights(folder: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def one_line(fn, *needles: str) -> str:
    """``fn()`` raises a one-line ValueError starting ``model: `` that holds every needle."""
    with pytest.raises(ValueError) as err:
        fn()
    text = str(err.value)
    assert text.startswith("model: ") and "\n" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


def text_of(folder: Path):
    return lambda: encoders.encode_text(CAPTIONS, model=f"hf:{folder}", batch_size=2, progress=False)


def images_of(folder: Path, tmp_path: Path):
    paths = hf_tiny.write_images(tmp_path / "imgs", 1)
    return lambda: encoders.encode_images(paths, model=f"hf:{folder}", batch_size=1, progress=False)


def test_evil_auto_map_never_runs_even_when_stdin_says_yes(clean, tmp_path):
    """Item 1: ``printf 'y\\n' | xmodal encode text ... --model hf:EVIL`` ran the folder's evil.py."""
    evil = copy(clean, tmp_path, "evil")
    marker = tmp_path / "RAN"
    (evil / "evil.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('evil.py ran')\n"
        "from transformers import CLIPModel, CLIPProcessor\n"
        "class EvilProcessor(CLIPProcessor):\n    pass\n"
        "class EvilModel(CLIPModel):\n    pass\n")
    auto = {"AutoProcessor": "evil.EvilProcessor", "AutoModel": "evil.EvilModel"}
    for name in ("config.json", "processor_config.json", "tokenizer_config.json"):
        extra = {} if name == "config.json" else {"processor_class": "EvilProcessor"}  # no class of the library
        edit_json(evil / name, lambda d, extra=extra: d.update(auto_map=auto, **extra))
    caps = tmp_path / "caps.txt"
    caps.write_text("a dog\n")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": os.pathsep.join(
        [str(Path(encoders.__file__).resolve().parents[2])] + os.environ.get("PYTHONPATH", "").split(os.pathsep))}
    run = subprocess.run([sys.executable, "-m", "xmodal", "encode", "text", "--captions", str(caps), "--out",
                          str(tmp_path / "t.npy"), "--model", f"hf:{evil}", "--quiet"], check=False, input="y\n", text=True,
                         capture_output=True, env=env, timeout=600)
    assert not marker.exists(), "the folder's code ran"
    err = run.stderr.strip()
    assert run.returncode == 2 and len(err.splitlines()) == 1, run.stderr[-2000:]
    assert "auto_map" in err and "config.json" in err, err
    assert not (tmp_path / "t.npy").exists()


def test_no_tokenizer_means_no_text_encoder(clean, tmp_path):
    """Item 2: a folder saved with its image processor only encoded every caption to one vector."""
    from transformers import CLIPImageProcessor

    bad = copy(clean, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "processor_config.json"):
        (bad / name).unlink()
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(bad)
    one_line(text_of(bad), "no tokenizer", "text")
    with pytest.raises(ValueError, match=r"^model: .*no tokenizer"):  # before any caption is read
        encoders.get_encoder(f"hf:{bad}", "text")
    feats = images_of(bad, tmp_path)()  # its images still encode
    assert feats.shape == (1, hf_tiny.DIMS["clip"]) and np.isfinite(feats).all()


@pytest.mark.parametrize("attack, needles", [
    ("missing", ("text_projection.weight", "missing")),
    ("int8", ("text_projection.weight", "I8")),
    ("nan", ("text_projection.weight", "not finite")),
    ("inf_f16", ("text_projection.weight", "F16")),
])
def test_text_projection_missing_cast_or_nan_is_refused(clean, tmp_path, attack, needles):
    """Item 2: a missing, int8 or NaN text_projection gave random, cast or NaN features, rc 0."""
    bad = copy(clean, tmp_path)

    def damage(t):
        key = "text_projection.weight"
        if attack == "missing":
            del t[key]
        elif attack == "int8":
            t[key] = (t[key] * 100).to(torch.int8)
        elif attack == "nan":
            t[key][3, 5] = float("nan")
        else:  # another dtype than the rest of the folder (and an inf in it)
            t[key] = t[key].half()
            t[key][0, 0] = float("inf")
    edit_weights(bad, damage)
    text = one_line(text_of(bad), *needles)
    assert "model.safetensors" in text


def test_layer_count_beyond_the_weights_is_refused_before_building(clean, tmp_path, monkeypatch):
    """Item 2: ``num_hidden_layers: 2000`` built 2,000 random layers and encoded for minutes."""
    import transformers

    bad = copy(clean, tmp_path)
    edit_json(bad / "config.json", lambda d: d["text_config"].update(num_hidden_layers=2000))
    built = []
    monkeypatch.setattr(transformers.CLIPTextConfig, "__init__",
                        _spy(transformers.CLIPTextConfig.__init__, built))
    one_line(text_of(bad), "num_hidden_layers", "2000", "2 layers", "config.json")
    assert not built, "a config was built from the folder before it was refused"


def _spy(fn, calls):
    def wrapped(self, *a, **k):
        if k.get("num_hidden_layers") == 2000:
            calls.append(k)
        return fn(self, *a, **k)
    return wrapped


@pytest.mark.parametrize("side", [2049, 20000])
def test_huge_resize_is_refused(clean, tmp_path, side):
    """Item 3: a processor asking for a 20000 x 20000 resize took 5.5 GB for one 40 x 30 image."""
    bad = copy(clean, tmp_path)
    edit_json(bad / "processor_config.json", lambda d: d["image_processor"].update(size={"shortest_edge": side}))
    if side > 2049:  # refused from the folder alone (never run on the unfixed code: it would resize)
        one_line(lambda: encoders.get_encoder(f"hf:{bad}", "image"), "processor_config.json", str(side))
        return
    one_line(images_of(bad, tmp_path), "processor_config.json", "size", str(side))


def test_tokenizer_json_past_its_cap_is_refused_before_parsing(clean, tmp_path):
    """Item 3: a 100 MB tokenizer.json took 1.3 GB; one just past the 32 MiB cap is refused unread."""
    bad = copy(clean, tmp_path)
    path = bad / "tokenizer.json"
    with open(path, "ab") as f:  # trailing spaces: still valid JSON, one byte past the cap
        f.write(b" " * (32 * 2 ** 20 + 1 - path.stat().st_size))
    one_line(text_of(bad), "tokenizer.json", "larger than")


def test_truncated_safetensors_is_one_line(clean, tmp_path):
    bad = copy(clean, tmp_path)
    path = bad / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    one_line(text_of(bad), "model.safetensors", "truncated")
    path.write_bytes(b"\x05\x00")  # not even a header length
    one_line(text_of(bad), "model.safetensors", "truncated")


def test_tokenizer_of_another_model_is_refused(clean, tmp_path):
    """Item 3: a tokenizer whose ids run past the text tower's embedding table (IndexError traceback)."""
    from transformers import CLIPTokenizer

    bad = copy(clean, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bad / name).unlink()
    base = hf_tiny.tokenizer()
    vocab = dict(base.get_vocab())
    for i in range(600):
        vocab[f"w{i}</w>"] = len(vocab)
    CLIPTokenizer(vocab=vocab, merges=[], model_max_length=16).save_pretrained(bad)
    one_line(text_of(bad), "tokenizer", "vocab_size")


def test_pickle_bin_weights_are_refused(clean, tmp_path):
    from safetensors.torch import load_file

    bad = copy(clean, tmp_path)
    torch.save(load_file(str(bad / "model.safetensors")), bad / "pytorch_model.bin")
    (bad / "model.safetensors").unlink()
    one_line(text_of(bad), "pytorch_model.bin", "pickle")
    with pytest.raises(ValueError, match=r"^model: .*pickle"):
        encoders.identity_of(f"hf:{bad}", "text")


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # unpickling this writes the marker
        return (self.marker.write_text, ("a pickle ran",))


def test_pickle_beside_safetensors_is_never_read(clean, tmp_path):
    """A hub snapshot holds pytorch_model.bin beside model.safetensors: the safetensors load, the pickle
    is never opened (a pickle that writes a marker file when read proves it), the features are the
    clean folder's."""
    folder = copy(clean, tmp_path, "snapshot")
    marker = tmp_path / "PICKLE_RAN"
    torch.save({"x": _Evil(marker)}, folder / "pytorch_model.bin")
    got = text_of(folder)()
    assert not marker.exists()
    np.testing.assert_array_equal(got, text_of(clean)())


@pytest.mark.parametrize("field, value, needles", [
    ("num_attention_heads", 0, ("text_config.num_attention_heads", "at least 1")),
    ("num_attention_heads", 5, ("text_config.num_attention_heads", "divide")),
    ("hidden_size", "32", ("text_config.hidden_size", "str")),
    ("num_hidden_layers", 2.0, ("text_config.num_hidden_layers", "float")),
    ("layer_norm_eps", "tiny", ("text_config.layer_norm_eps", "str")),
    ("hidden_act", 3, ("text_config.hidden_act", "int")),
    ("max_position_embeddings", True, ("text_config.max_position_embeddings", "bool")),
])
def test_bad_config_fields_are_one_line(clean, tmp_path, field, value, needles):
    """Item 3: 0 attention heads or a wrongly typed field ended in a traceback."""
    bad = copy(clean, tmp_path)
    edit_json(bad / "config.json", lambda d: d["text_config"].update({field: value}))
    one_line(text_of(bad), "config.json", *needles)


@pytest.mark.parametrize("name, depth", [("processor_config.json", 100), ("tokenizer_config.json", 50000),
                                         ("tokenizer.json", 40000), ("config.json", 64)])
def test_deeply_nested_json_is_refused_before_parsing(clean, tmp_path, name, depth):
    bad = copy(clean, tmp_path)
    nest = "[" * depth + "]" * depth
    raw = (bad / name).read_text().rstrip()
    assert raw.endswith("}")
    (bad / name).write_text(raw[:-1] + f', "deep": {nest}' + "}")
    one_line(text_of(bad), name, "nested")


def test_auto_map_nested_in_a_processor_config_is_refused(clean, tmp_path):
    bad = copy(clean, tmp_path)
    edit_json(bad / "processor_config.json", lambda d: d["image_processor"].update(
        auto_map={"AutoImageProcessor": "evil.Evil"}))
    one_line(lambda: encoders.get_encoder(f"hf:{bad}", "image"), "processor_config.json", "auto_map")


def test_unclosed_escaped_string_is_scanned_in_one_pass(clean, tmp_path):
    """The nesting scan masks strings with one regular expression; an unclosed string of escaped quotes
    made it quadratic (80 KB took 80 s). 400 KB of it now passes the scan, and the library's refusal
    of the file is one line naming it."""
    from xmodal._files.jsonfile import json_shape

    assert json_shape(b'["a", ["b\\"]]') == (2, 4) and json_shape(b'[["ab') == (2, 3)  # open to the end
    bad = copy(clean, tmp_path)
    (bad / "tokenizer.json").write_bytes(b'{"x": "' + b'\\"' * 200_000)
    one_line(text_of(bad), "tokenizer.json")


def test_library_failures_are_one_line_naming_the_file(clean, tmp_path):
    """What is left for the library to refuse (a tokenizer.json it cannot read) is one line too."""
    bad = copy(clean, tmp_path)
    (bad / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    one_line(text_of(bad), "tokenizer.json")


def test_cli_refuses_in_one_line(clean, tmp_path, capsys):
    bad = copy(clean, tmp_path)
    edit_weights(bad, lambda t: t.pop("text_projection.weight"))
    caps = tmp_path / "caps.txt"
    caps.write_text("a dog\n")
    out = tmp_path / "t.npy"
    assert main(["encode", "text", "--captions", str(caps), "--out", str(out), "--model", f"hf:{bad}",
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("xmodal encode: error: model: hf:"), err
    assert "text_projection.weight" in err and not out.exists()
