"""Prompt templates for zero-shot classification: a class name ``c`` becomes ``template.format(c)``.

* ``clip``: the 80 ImageNet prompts of CLIP (Radford et al. 2021, Sec. 3.1.4; the list of OpenAI's
  ``Prompt_Engineering_for_ImageNet.ipynb``, as open_clip's ``zero_shot_metadata.OPENAI_IMAGENET_TEMPLATES``
  keeps it), in that order.
* ``photo``: the single ``"a photo of a {}."`` (CLIP's default prompt; DN Sec. 4.1 encodes each class
  as "a photo of {class_name}.").
* a file: one template per line, each with exactly one ``{}`` where the class name goes.
"""

from __future__ import annotations

import os
from pathlib import Path

from xmodal._validate import short_repr

CLIP_IMAGENET_TEMPLATES = (
    "a bad photo of a {}.", "a photo of many {}.", "a sculpture of a {}.", "a photo of the hard to see {}.",
    "a low resolution photo of the {}.", "a rendering of a {}.", "graffiti of a {}.", "a bad photo of the {}.",
    "a cropped photo of the {}.", "a tattoo of a {}.", "the embroidered {}.", "a photo of a hard to see {}.",
    "a bright photo of a {}.", "a photo of a clean {}.", "a photo of a dirty {}.", "a dark photo of the {}.",
    "a drawing of a {}.", "a photo of my {}.", "the plastic {}.", "a photo of the cool {}.",
    "a close-up photo of a {}.", "a black and white photo of the {}.", "a painting of the {}.",
    "a painting of a {}.", "a pixelated photo of the {}.", "a sculpture of the {}.", "a bright photo of the {}.",
    "a cropped photo of a {}.", "a plastic {}.", "a photo of the dirty {}.", "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.", "a photo of the {}.", "a good photo of the {}.", "a rendering of the {}.",
    "a {} in a video game.", "a photo of one {}.", "a doodle of a {}.", "a close-up photo of the {}.",
    "a photo of a {}.", "the origami {}.", "the {} in a video game.", "a sketch of a {}.", "a doodle of the {}.",
    "a origami {}.", "a low resolution photo of a {}.", "the toy {}.", "a rendition of the {}.",
    "a photo of the clean {}.", "a photo of a large {}.", "a rendition of a {}.", "a photo of a nice {}.",
    "a photo of a weird {}.", "a blurry photo of a {}.", "a cartoon {}.", "art of a {}.", "a sketch of the {}.",
    "a embroidered {}.", "a pixelated photo of a {}.", "itap of the {}.", "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.", "a plushie {}.", "a photo of the nice {}.", "a photo of the small {}.",
    "a photo of the weird {}.", "the cartoon {}.", "art of the {}.", "a drawing of the {}.",
    "a photo of the large {}.", "a black and white photo of a {}.", "the plushie {}.", "a dark photo of a {}.",
    "itap of a {}.", "graffiti of the {}.", "a toy {}.", "itap of my {}.", "a photo of a cool {}.",
    "a photo of a small {}.", "a tattoo of the {}.",
)
PHOTO_TEMPLATES = ("a photo of a {}.",)
#: ``--templates`` names.
TEMPLATE_SETS = {"clip": CLIP_IMAGENET_TEMPLATES, "photo": PHOTO_TEMPLATES}

__all__ = [
    "CLIP_IMAGENET_TEMPLATES",
    "PHOTO_TEMPLATES",
    "TEMPLATE_SETS",
    "get_templates",
    "prompts",
    "read_class_names",
]


def _lines(path: Path, flag: str) -> list[str]:
    from xmodal._files.textfile import nonblank_lines

    return nonblank_lines(path, label=flag)


def get_templates(spec: str | os.PathLike) -> tuple[str, ...]:
    """``clip``, ``photo`` or a file of templates (one per line, each with one ``{}``).

    >>> len(get_templates("clip")), get_templates("photo")
    (80, ('a photo of a {}.',))
    """
    if isinstance(spec, str) and spec in TEMPLATE_SETS:
        return TEMPLATE_SETS[spec]
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"--templates: expected clip, photo or a file, got {short_repr(spec)}")
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--templates: expected {', '.join(TEMPLATE_SETS)} or a file of templates, got {short_repr(str(spec))}")
    lines = _lines(path, "--templates")
    bad = [i for i, t in enumerate(lines, 1) if t.count("{}") != 1 or t.replace("{}", "").count("{") or
           t.replace("{}", "").count("}")]
    if not lines or bad:
        raise ValueError(f"--templates: {path}: every line must hold exactly one {{}} where the class name goes "
                         f"(and no other brace){f'; line(s) {bad[:5]} do not' if bad else '; the file is empty'}")
    return tuple(lines)


def read_class_names(path: str | os.PathLike) -> list[str]:
    """Class names, one per line: line ``i`` names label ``i``.

    Raises:
        ValueError: a missing or empty file, or a name given twice.
    """
    names = _lines(Path(path), "--classes")
    if not names:
        raise ValueError(f"--classes: {path} holds no class name")
    seen: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in seen:
            raise ValueError(f"--classes: {path}: {n!r} is named twice (labels {seen[n]} and {i})")
        seen[n] = i
    return names


def prompts(class_names: list[str], templates: tuple[str, ...]) -> list[str]:
    """Every template filled with every class name, class by class (``C * T`` prompts, class-major).

    >>> prompts(["cat", "dog"], ("a {}.", "the {}!"))
    ['a cat.', 'the cat!', 'a dog.', 'the dog!']
    """
    from xmodal._validate import short_repr

    for name, seq in (("class_names", class_names), ("templates", templates)):
        if isinstance(seq, str) or not isinstance(seq, (list, tuple)) or not all(isinstance(v, str) for v in seq):
            raise TypeError(f"{name}: expected a list of strings, got {short_repr(seq)}")
        if not seq:
            raise ValueError(f"{name}: empty")
    for t in templates:
        if t.count("{}") != 1 or t.replace("{}", "").count("{") or t.replace("{}", "").count("}"):
            raise ValueError(f"templates: each template holds '{{}}' once and no other braces, got {short_repr(t)}")
    return [t.format(c) for c in class_names for t in templates]
