"""``xmodal serve``: a local search page and JSON API over an index written by ``xmodal index``.

Optional extra ``xmodal[serve]`` (Starlette, uvicorn, Pillow for thumbnails). Modules:
``app`` (``create_app``: routes, parameter bounds, request limits), ``page`` (the HTML),
``thumbs`` (thumbnails confined to ``--images``), ``net`` (socket and uvicorn server).
"""

from xmodal.serve.app import MAX_K, MAX_QUERY_CHARS, create_app, parse_query
from xmodal.serve.net import bind_socket, is_loopback, make_server

__all__ = ["create_app", "parse_query", "bind_socket", "make_server", "is_loopback", "MAX_K",
           "MAX_QUERY_CHARS"]
