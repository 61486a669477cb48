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
--captions' does (the index's text encoder, MiniLM by default, offline) and the top-k
items are shown with thumbnails of the files under --images (item names are paths
relative to it; a video file shows its middle frame when the [video] extra is there),
the normaliser folded into the index and the latency. Scripts use
  GET /api/search?q=TEXT&k=K -> {"query": TEXT, "results": [{"rank", "name", "score", ...}]}
Binds 127.0.0.1 (this machine only) unless --host says otherwise."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args

    parser.add_argument("--index", required=True, metavar="DIR", help="directory written by 'xmodal index'")
    parser.add_argument("--images", metavar="DIR", default=None,
                        help="directory holding the indexed files (names.txt entries are relative to it)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)")
    parser.add_argument("--k", type=int, default=10, help="results shown when the request gives no k (default 10)")
    parser.add_argument("--text-encoder", default=None, metavar="NAME",
                        help="override the index's text encoder")
    add_common_args(parser, threads=None, progress=False)


def run(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"xmodal serve needs starlette and uvicorn: pip install 'xmodal[serve]' ({exc})") from None
    from xmodal.retrieval.search import SearchIndex
    from xmodal.serve import bind_socket, create_app, is_loopback, make_server
    from xmodal.serve.app import MAX_K

    if not 1 <= args.k <= MAX_K:
        raise ValueError(f"--k: must be in [1, {MAX_K}], got {args.k}")
    index = SearchIndex(args.index)
    if args.images is not None and not Path(args.images).is_dir():  # every input checked before the port is bound
        raise ValueError(f"--images: {args.images} is not a directory")
    sock = bind_socket(args.host, args.port)  # a busy port fails before the encoder loads
    try:
        app = create_app(index, images=args.images, text_encoder=args.text_encoder, default_k=args.k)
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    if not is_loopback(args.host):
        print(f"xmodal serve: warning: --host {args.host} is not a loopback address: anyone who can reach "
              "this machine can search the index", file=sys.stderr)
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {args.index} ({index.index.num_items} items, normaliser {index.meta.get('normalizer')} "
          f"folded in) at http://{shown}:{port}/  (Ctrl-C stops)", flush=True)
    try:
        make_server(app).run(sockets=[sock])
    finally:
        sock.close()
    return 0
