"""``xmodal serve``: a local search page and JSON API over an index written by ``xmodal index``.

Optional extra ``xmodal[serve]`` (Starlette, uvicorn, Pillow for thumbnails, python-multipart for
uploads). Modules: ``app`` (``create_app``: routes, parameter bounds, request limits),
``searcher`` (the index folder, re-checked per request, searched three ways), ``page`` (the HTML),
``thumbs`` (thumbnails confined to ``--images``, a bounded cache), ``uploads`` (an uploaded video:
received, bounded, encoded, deleted), ``net`` (socket and uvicorn server with bounded connections). May import ``xmodal.retrieval``, ``xmodal.features``
and ``xmodal.metrics``, never ``xmodal.commands``.
"""

from xmodal.serve.app import MAX_K, MAX_QUERY_CHARS, create_app, parse_query, parse_request
from xmodal.serve.net import bind_socket, is_loopback, make_server

__all__ = ["create_app", "parse_query", "parse_request", "bind_socket", "make_server", "is_loopback", "MAX_K",
           "MAX_QUERY_CHARS"]
