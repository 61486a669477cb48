"""``xmodal serve``: a local search page (and ``/api/search``) for an 'xmodal index'."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "serve"
HELP = "a local search page and JSON API for an index written by 'xmodal index'"
DESCRIPTION = """Serve a search page for an index written by 'xmodal index' (extra [serve]):

  xmodal serve --index DIR [--images IMAGES_DIR] [--host 127.0.0.1] [--port 8000]

Open http://127.0.0.1:8000/ and type a caption: the query is encoded as 'xmodal query
--captions' does (the index's recorded text encoder, offline; where nothing is recorded, the
built-in one its text size matches, shown as assumed on the page and in the API; otherwise,
or with --text-encoder none, the page has no text box and says why) and the top-k
items are shown with thumbnails of the files under --images (item names are paths
relative to it; a video file shows its middle frame when the [video] extra is there),
the captions of each item (an index built with --data), the normaliser folded into the
index, its recall (exact, or measured for an approximate index) and the latency. Each
result links "more like this" (video -> video) and, for an index built with --data or
--texts, "captions" (video -> text); a video file can be uploaded for either (an image file for an
index of images). Scripts use
  GET /api/search?q=TEXT&k=K                    text -> video
  GET /api/search?video=NAME&k=K                more like this
  GET /api/search?video=NAME&direction=v2t&k=K  captions for a video
  POST /api/search?k=K[&encoder=SPEC]           body: an .npy of caption features [T, Dt]
  POST /upload?format=json (multipart: video=FILE or, for images, image=FILE; direction=v2t|v2v, k=K)
The page starts for any valid index: "more like this" and video -> text work for every run.
Binds 127.0.0.1 (this machine only) unless --host says otherwise. The index folder is
re-read when 'xmodal index --overwrite' replaces it (503 while it is missing)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args
    from xmodal.serve import uploads

    parser.add_argument("--index", required=True, metavar="DIR", help="directory written by 'xmodal index'")
    parser.add_argument("--images", metavar="DIR", default=None,
                        help="directory holding the indexed files (names.txt entries are relative to it)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)")
    parser.add_argument("--k", type=int, default=10, help="results shown when the request gives no k (default 10)")
    parser.add_argument("--text-encoder", default=None, metavar="SPEC",
                        help="none: no text box; a spec: a local copy of the index's recorded text encoder (another "
                             "one is refused), or the encoder of an index that records none")
    parser.add_argument("--uploads", choices=("auto", "on", "off"), default="auto",
                        help="accept video uploads (decoded by PyAV's FFmpeg, encoded, searched, deleted): "
                             "auto (default) = on for a loopback --host, off otherwise")
    parser.add_argument("--max-upload-mb", type=float, default=uploads.MAX_UPLOAD_BYTES / 2**20, metavar="MB",
                        help=f"largest upload in MiB (default {uploads.MAX_UPLOAD_BYTES / 2**20:g})")
    parser.add_argument("--max-upload-seconds", type=float, default=uploads.MAX_UPLOAD_SECONDS, metavar="S",
                        help=f"longest uploaded video in seconds (default {uploads.MAX_UPLOAD_SECONDS:g})")
    parser.add_argument("--upload-frames", type=int, default=uploads.UPLOAD_FRAMES, metavar="N",
                        help=f"frames sampled from an uploaded video, as 'encode videos --frames N' "
                             f"(default {uploads.UPLOAD_FRAMES}; use the gallery's sampling)")
    parser.add_argument("--image-encoder", default=None, metavar="SPEC",
                        help="encoder of an uploaded video's frames (default: the one the index records; else "
                             "efficientnet-lite0 for 1280-d video features, shown as assumed; none: no uploads)")
    parser.add_argument("--device", default="auto", metavar="DEV",
                        help="the hf:DIR / open_clip:DIR encoders of text queries and uploads: auto (CUDA when "
                             "present, else CPU; default), cpu, cuda, cuda:N")
    parser.add_argument("--max-upload-decode", type=int, default=None, metavar="N",
                        help="most frames decoded from an uploaded video, whatever its header declares (default "
                             f"{uploads.DECODE_FRAMES_PER_SECOND} per second of --max-upload-seconds)")
    add_common_args(parser, threads=None, progress=False)


def exposure(host: str, uploads: bool, images: str | None, max_upload_mb: float) -> str:
    """What a non-loopback ``--host`` exposes, in one line."""
    what = ["the search page and /api/search (every item name, score and caption of the index)"]
    if images is not None:
        what.append(f"thumbnails of the files under --images {images}")
    if uploads:
        what.append(f"video uploads of up to {max_upload_mb:g} MiB decoded by FFmpeg")
    return (f"xmodal serve: warning: --host {host} is not a loopback address: anyone who can reach this machine "
            f"gets {'; '.join(what)}; there is no login and no TLS")


def run(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"xmodal serve needs starlette and uvicorn: pip install 'xmodal[serve]' ({exc})") from None
    import math

    from xmodal.retrieval.search import SearchIndex
    from xmodal.serve import bind_socket, create_app, is_loopback, make_server
    from xmodal.serve.app import MAX_K

    if not 1 <= args.k <= MAX_K:
        raise ValueError(f"--k: must be in [1, {MAX_K}], got {args.k}")
    if not math.isfinite(args.max_upload_mb) or not 0 < args.max_upload_mb <= 2**20:
        raise ValueError(f"--max-upload-mb: expected a positive number of MiB, got {args.max_upload_mb:g}")
    if not math.isfinite(args.max_upload_seconds) or args.max_upload_seconds <= 0:
        raise ValueError(f"--max-upload-seconds: expected a positive number, got {args.max_upload_seconds:g}")
    if not 1 <= args.upload_frames <= 1024:
        raise ValueError(f"--upload-frames: must be in [1, 1024], got {args.upload_frames}")
    if args.max_upload_decode is not None and not 1 <= args.max_upload_decode <= 10**7:
        raise ValueError(f"--max-upload-decode: must be in [1, 10000000], got {args.max_upload_decode}")
    from xmodal.commands._device import query_device

    device = query_device(getattr(args, "device", "auto"))
    index = SearchIndex(args.index)
    if args.images is not None and not Path(args.images).is_dir():  # every input checked before the port is bound
        raise ValueError(f"--images: {args.images} is not a directory")
    uploads = args.uploads == "on" or (args.uploads == "auto" and is_loopback(args.host))
    sock = bind_socket(args.host, args.port)  # a busy port fails before the encoder loads
    try:
        app = create_app(index, images=args.images, text_encoder=args.text_encoder, default_k=args.k,
                         uploads=uploads, max_upload_bytes=int(args.max_upload_mb * 2**20),
                         max_upload_seconds=args.max_upload_seconds, upload_frames=args.upload_frames,
                         image_encoder=args.image_encoder, max_upload_decode=args.max_upload_decode, device=device)
        from xmodal.commands._device import check_placed

        check_placed(device, [app.state.holder.searcher.text_encoder,  # a --device that places nothing: refused
                              app.state.upload["image_encoder"] if app.state.upload["available"] else None])
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    if not is_loopback(args.host):
        print(exposure(args.host, uploads, args.images, args.max_upload_mb), file=sys.stderr)
    reason = app.state.upload["reason"]
    if uploads and reason:
        print(f"xmodal serve: note: no uploads: {reason}", file=sys.stderr)
    searcher = app.state.holder.searcher
    if searcher.text_encoder is None:
        print(f"xmodal serve: note: no text box: {searcher.text_choice['reason']}", file=sys.stderr)
    elif searcher.text_choice["status"] == "assumed":
        print(f"xmodal serve: note: {searcher.text_choice['reason']}", file=sys.stderr)
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {args.index} ({index.index.num_items} items, normaliser {index.meta.get('normalizer')} "
          f"folded in) at http://{shown}:{port}/  (Ctrl-C stops)", flush=True)
    try:
        make_server(app).run(sockets=[sock])
    finally:
        sock.close()
    return 0
