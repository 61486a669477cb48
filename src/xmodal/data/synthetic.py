"""Seeded synthetic paired video/text embeddings with the structure real data has.

Generative model (all draws from ``numpy.random.default_rng`` streams derived from
``seed``; every knob has its own stream, so changing one knob leaves the draws of
the others unchanged):

1. ``num_concepts`` concept centres ``mu_c = common + specific_c`` in a latent space
   of ``latent_dim`` dimensions. The shared ``common`` direction (norm
   ``common_scale``) is the "cone" real embeddings live in; it is what makes
   central items hubs.
2. Each video draws a concept ``c`` with long-tail (Zipf) probability
   ``p_c ~ 1 / (c + 1) ** zipf_exponent`` (class 0 is the most frequent) and a
   latent ``z_v = mu_c + instance_scale * e_v``: instance detail separates videos
   of one concept, so retrieval is harder than classification.
3. Each of its ``captions_per_video`` captions is ``z_t = z_v + caption_noise * e_t``.
4. Hubs: a fraction ``hub_fraction`` of the videos of every split is pulled towards
   the common direction, ``z_v += hub_strength * |z_v| * common / |common|``: they
   are central, close to every query, and so appear in many top-K lists (high
   k-occurrence), which test-time normalisation (QB-Norm, Sinkhorn, DN) corrects.
5. Features: ``video = A_v z + feature_noise * eps`` (``[video_dim]``),
   ``text = A_t z + feature_noise * eps`` (``[text_dim]``), with fixed random linear
   maps ``A_v``, ``A_t`` shared by all splits (so video and text dims may differ),
   followed by an optional ``tanh`` warp of strength ``nonlinearity`` (0 = linear).
6. Modality gap: each modality's features are shifted by ``modality_gap`` times
   their typical norm (the RMS norm of the concept centres' features) along a fixed
   random direction of its own feature space, so the modal means differ. Feature
   noise and frame noise are likewise relative to the centres' per-dimension RMS.
7. Noisy pairs: in the train split only, a fraction ``noisy_fraction`` of captions
   is shuffled among themselves, so that their text describes another video while
   ``text_to_video`` still names the original one (Cali-NCE Table 7 protocol).
   ``text_labels`` keep the concept the text actually describes.
8. Optional frame axis: with ``frames > 0`` videos are ``[N, frames, video_dim]``,
   frame ``f = video + frame_noise * eps_f`` (the mean over frames is a noisy
   estimate of the clip feature).

Defaults (train 2,000 videos x 3 captions, val/test 500 videos) give a linear
InfoNCE head (64-d, temperature 0.05, 20 epochs, ~1 s on one CPU thread) a test
t2v R@1 of about 33% (32.6 seed 0, 34.1 seed 1); an inverted softmax over a bank of
train queries adds 1.3-1.8 points, and 0.3 with ``hub_strength=0`` (the hubs are
what test-time normalisation corrects; the effect is modest, as on real data).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from xmodal._validate import positive_number, short_repr
from xmodal.data.types import PairedSplit

# One child stream per concern: adding/changing one knob never shifts another's draws.
_STREAMS = ("concepts", "maps", "gap", "labels", "instances", "captions", "hubs",
            "feature_noise", "frames", "noisy")


def _nonneg(v, name: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name}: expected a number, got {short_repr(v)}") from None
    if not np.isfinite(f) or f < 0:
        raise ValueError(f"{name}: must be a finite number >= 0, got {short_repr(v)}")
    return f


def _count(v, name: str, *, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer, got {short_repr(v)}")
    if v < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {v}")
    return int(v)


def _fraction(v, name: str) -> float:
    f = _nonneg(v, name)
    if f > 1:
        raise ValueError(f"{name}: must lie in [0, 1], got {short_repr(v)}")
    return f


def zipf_probabilities(num_concepts: int, exponent: float) -> np.ndarray:
    """Long-tail class probabilities ``p_c ~ (c + 1) ** -exponent`` (0 = uniform)."""
    num_concepts = _count(num_concepts, "num_concepts")
    exponent = _nonneg(exponent, "exponent")
    p = np.arange(1, num_concepts + 1, dtype=np.float64) ** -float(exponent)
    return p / p.sum()


def synthetic(*, num_train: int = 2000, num_val: int = 500, num_test: int = 500,
              captions_per_video: int = 3, num_concepts: int = 50, zipf_exponent: float = 1.0,
              latent_dim: int = 32, video_dim: int = 64, text_dim: int = 48,
              common_scale: float = 1.5, instance_scale: float = 0.8, caption_noise: float = 1.3,
              feature_noise: float = 0.5, nonlinearity: float = 0.0, modality_gap: float = 0.5,
              hub_fraction: float = 0.03, hub_strength: float = 2.0, noisy_fraction: float = 0.0,
              frames: int = 0, frame_noise: float = 0.5, clips_per_group: int = 0,
              seed: int = 0) -> dict[str, PairedSplit]:
    """Generate the seeded synthetic dataset (see the module docstring for the model).

    Args:
        num_train, num_val, num_test: videos per split.
        captions_per_video: captions per video (texts are grouped: video ``i`` owns
            texts ``i*k .. i*k+k-1`` before any noisy shuffling).
        num_concepts: latent concepts (class labels ``0 .. num_concepts-1``).
        zipf_exponent: long-tail strength of concept frequency (0 = balanced).
        latent_dim: dimension of the shared latent space.
        video_dim, text_dim: feature dimensions of each modality.
        common_scale: norm of the component shared by all concepts (the cone).
        instance_scale: spread of videos around their concept centre (relative to
            the unit-norm concept-specific part); larger = instances more distinct.
        caption_noise: latent noise of a caption around its video.
        feature_noise: isotropic noise added in feature space (relative to the
            per-dimension signal scale).
        nonlinearity: strength of a ``tanh`` warp of the features (0 = purely linear maps).
        modality_gap: shift of each modality's mean, in units of its typical feature norm.
        hub_fraction: fraction of videos per split made central (hubs).
        hub_strength: how far hubs move towards the common direction.
        noisy_fraction: fraction of train captions shuffled to mismatched videos.
        frames: 0 for ``[N, Dv]`` videos, else the length of a frame axis ``[N, F, Dv]``.
        frame_noise: per-frame noise around the clip feature (only with ``frames > 0``).
        clips_per_group: > 0: consecutive videos form groups ("long videos") of this many
            clips (the last one may be shorter), ``video_to_group`` of each split
            (:mod:`xmodal.data.groups`); the groups carry no extra semantics.
        seed: the seed; equal seeds give identical arrays.

    Returns:
        ``{"train", "val", "test"}`` -> :class:`PairedSplit` with float32 features,
        ``video_labels`` / ``text_labels`` (concept ids) and ``name="synthetic/<split>"``.

    Raises:
        ValueError / TypeError: a knob out of range, naming it.
    """
    clips_per_group = _count(clips_per_group, "clips_per_group", minimum=0)
    sizes = {"train": _count(num_train, "num_train"), "val": _count(num_val, "num_val"),
             "test": _count(num_test, "num_test")}
    k = _count(captions_per_video, "captions_per_video")
    n_c = _count(num_concepts, "num_concepts")
    lat = _count(latent_dim, "latent_dim")
    dv, dt = _count(video_dim, "video_dim"), _count(text_dim, "text_dim")
    zipf = _nonneg(zipf_exponent, "zipf_exponent")
    common_scale = _nonneg(common_scale, "common_scale")
    instance_scale = positive_number(instance_scale, "instance_scale")
    caption_noise = _nonneg(caption_noise, "caption_noise")
    feature_noise = _nonneg(feature_noise, "feature_noise")
    nonlinearity = _nonneg(nonlinearity, "nonlinearity")
    modality_gap = _nonneg(modality_gap, "modality_gap")
    hub_fraction = _fraction(hub_fraction, "hub_fraction")
    hub_strength = _nonneg(hub_strength, "hub_strength")
    noisy_fraction = _fraction(noisy_fraction, "noisy_fraction")
    n_frames = _count(frames, "frames", minimum=0)
    frame_noise = _nonneg(frame_noise, "frame_noise")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an integer, got {short_repr(seed)}")
    _check_memory(sizes, k=k, lat=lat, dv=dv, dt=dt, frames=n_frames)

    root = np.random.SeedSequence(int(seed))
    streams = dict(zip(_STREAMS, root.spawn(len(_STREAMS))))

    def rng(stream: str, split: str = "") -> np.random.Generator:
        # Split-specific sub-streams derived deterministically from the stream.
        salt = {"": 0, "train": 1, "val": 2, "test": 3}[split]
        return np.random.default_rng([int(streams[stream].generate_state(1)[0]), salt])

    g = rng("concepts")
    common = g.standard_normal(lat)
    common *= common_scale / max(np.linalg.norm(common), 1e-12)
    specific = g.standard_normal((n_c, lat)) / np.sqrt(lat)
    centres = common[None, :] + specific
    common_unit = common / max(np.linalg.norm(common), 1e-12) if common_scale > 0 else np.zeros(lat)

    g = rng("maps")
    a_v = g.standard_normal((lat, dv)) / np.sqrt(lat)
    a_t = g.standard_normal((lat, dt)) / np.sqrt(lat)

    g = rng("gap")
    gap_v = g.standard_normal(dv)
    gap_v /= np.linalg.norm(gap_v)
    gap_t = g.standard_normal(dt)
    gap_t /= np.linalg.norm(gap_t)

    probs = zipf_probabilities(n_c, zipf)

    # Fixed, data-independent units (from the concept centres), so that changing one
    # knob (e.g. the hubs) never rescales the other rows.
    def unit_scales(a: np.ndarray) -> tuple[float, float]:
        x = centres @ a
        return float(np.sqrt(np.mean(x ** 2))), float(np.sqrt(np.mean(np.sum(x ** 2, axis=1))))

    scales = {"video": unit_scales(a_v), "text": unit_scales(a_t)}

    def features(z: np.ndarray, a: np.ndarray, gap_dir: np.ndarray, modality: str,
                 g_noise: np.random.Generator) -> np.ndarray:
        per_dim, typical = scales[modality]
        x = z @ a
        x = x + feature_noise * per_dim * g_noise.standard_normal(x.shape)
        if nonlinearity > 0:
            x = np.tanh(nonlinearity * x / per_dim) * per_dim / nonlinearity
        return x + modality_gap * typical * gap_dir[None, :]

    out: dict[str, PairedSplit] = {}
    for split, n in sizes.items():
        labels = rng("labels", split).choice(n_c, size=n, p=probs)
        z_v = centres[labels] + instance_scale * rng("instances", split).standard_normal((n, lat)) / np.sqrt(lat)
        n_hubs = int(round(hub_fraction * n))
        if n_hubs and hub_strength > 0:
            hubs = rng("hubs", split).choice(n, size=n_hubs, replace=False)
            z_v[hubs] += hub_strength * np.linalg.norm(z_v[hubs], axis=1, keepdims=True) * common_unit[None, :]
        t2v = np.repeat(np.arange(n, dtype=np.int64), k)
        z_t = z_v[t2v] + caption_noise * rng("captions", split).standard_normal((n * k, lat)) / np.sqrt(lat)
        g_noise = rng("feature_noise", split)
        video = features(z_v, a_v, gap_v, "video", g_noise)
        text = features(z_t, a_t, gap_t, "text", g_noise)
        text_labels = labels[t2v]
        if n_frames:
            g_f = rng("frames", split)
            video = video[:, None, :] + frame_noise * scales["video"][0] * g_f.standard_normal((n, n_frames, dv))
        if split == "train" and noisy_fraction > 0:
            text, text_labels = _shuffle_pairs(text, text_labels, t2v, noisy_fraction, rng("noisy"))
        out[split] = PairedSplit(video=video.astype(np.float32), text=text.astype(np.float32),
                                 text_to_video=t2v, video_labels=labels.astype(np.int64),
                                 text_labels=text_labels.astype(np.int64), name=f"synthetic/{split}",
                                 video_to_group=np.arange(n) // clips_per_group if clips_per_group else None)
    return out


def _check_memory(sizes: dict[str, int], *, k: int, lat: int, dv: int, dt: int, frames: int) -> None:
    """Refuse sizes whose float64 working arrays alone exceed the machine's memory (a
    ``num_train: 1000000000000`` in a config was a MemoryError traceback; a merely too-large
    size would thrash): one line naming the largest knob."""
    from xmodal.data.npyfile import memory_limit

    per_split = {s: 8 * n * (lat * (1 + k) + 2 * dv * max(frames, 1) + 2 * k * dt) for s, n in sizes.items()}
    need, have = sum(per_split.values()), memory_limit()
    if need > have:
        split = max(per_split, key=per_split.get)
        raise ValueError(f"num_{split}: {sizes[split]} videos (x {k} captions, {max(frames, 1)} frame(s)) need about "
                         f"{need / 2**30:.3g} GiB of memory, more than this machine's {have / 2**30:.3g} GiB")


def _shuffle_pairs(text: np.ndarray, text_labels: np.ndarray, t2v: np.ndarray, fraction: float,
                   g: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Move a ``fraction`` of the captions to other captions' slots (a cyclic shift of
    the chosen rows after a random order, so every chosen caption changes video)."""
    m = text.shape[0]
    n_noisy = int(round(fraction * m))
    if n_noisy < 2:
        return text, text_labels
    rows = g.choice(m, size=n_noisy, replace=False)
    # Sort chosen rows by video so that the cyclic shift never maps a caption onto a
    # slot of its own video (unless all chosen rows belong to one video).
    rows = rows[np.argsort(t2v[rows], kind="stable")]
    src = np.roll(rows, max(1, n_noisy // 2))
    text, text_labels = text.copy(), text_labels.copy()
    text[rows], text_labels[rows] = text[src], text_labels[src]
    return text, text_labels


#: The layout roles :func:`write_synthetic` writes (and so may replace on a second run).
SYNTHETIC_ROLES = ("video", "text", "text_to_video", "video_labels", "text_labels")


def write_synthetic(out: str | os.PathLike, *, seed: int = 0, **knobs: Any) -> dict[str, PairedSplit]:
    """Write :func:`synthetic` (``train``, ``val``, ``test``) as a data layout under ``out``.

    The folder is built beside ``out`` and renamed at the end (a failure leaves the previous
    folder as it was); a second call replaces the files of the first, and an ``out`` holding
    any other file is refused. ``xmodal train ... data.name=paired data.root=OUT`` then trains
    on exactly the splits that ``data.name: synthetic`` generates for ``train.seed: seed``.

    Args:
        out: the data directory to write.
        seed: the generator's seed (``train.seed`` of a synthetic run).
        **knobs: keyword arguments of :func:`synthetic`.

    Returns:
        The splits written, ``{"train", "val", "test"}``.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp()) / "synth"
    >>> splits = write_synthetic(root, num_train=20, num_val=5, num_test=5)
    >>> sorted(p.name for p in root.iterdir())[:3]
    ['test_text_features.npy', 'test_text_labels.npy', 'test_text_to_video.npy']
    """
    import shutil
    from pathlib import Path

    from xmodal._validate import short_repr
    from xmodal.data import layout
    from xmodal.runs import replace_dir, staging_dir

    if not isinstance(out, (str, os.PathLike)) or not str(out).strip():
        raise ValueError(f"out: expected a folder to write, got {short_repr(out)}")
    out = Path(out)
    if out.name in ("", ".", "..") or str(out) in (".", ".."):
        raise ValueError(f"out: expected a folder name (it is built beside it and renamed), got {str(out)!r}")
    splits = synthetic(seed=seed, **knobs)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"out: {out} is a file or a symbolic link; give a folder")
    if out.is_dir():  # only files an earlier write_synthetic wrote may be replaced
        foreign = sorted(p.name for p in out.iterdir() if not (p.is_file() and not p.is_symlink() and (
            (parsed := layout.parse(p.name)) is not None and parsed[3] and parsed[1] in SYNTHETIC_ROLES)))
        if foreign:
            raise ValueError(f"out: {out} holds {len(foreign)} file(s) that 'xmodal data synthetic' does not write "
                             f"({', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}); give a new or "
                             f"empty folder")
    tmp = staging_dir(out)  # beside out; staging folders of killed writes are removed first
    try:
        for name, split in splits.items():
            split.save(tmp, name)
        replace_dir(tmp, out)  # the last good folder stays until the new one is in place
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return splits
