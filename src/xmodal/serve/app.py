"""``xmodal serve``'s ASGI app (Starlette): the search page, ``/api/search`` and thumbnails.

``create_app(index)`` needs no socket (Starlette's ``TestClient`` drives it); the
command binds it to ``127.0.0.1`` by default through :mod:`xmodal.serve.net`. A query
is encoded exactly as ``xmodal query --captions`` encodes it
(:meth:`xmodal.retrieval.search.SearchIndex.encode_captions`) and searched in the same
index, so the scores are the run's normalised text -> video scores.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

#: Longest query, in characters.
MAX_QUERY_CHARS = 500
#: Largest ``k``.
MAX_K = 100
#: Longest request target (path + query string), in bytes.
MAX_TARGET_BYTES = 8192
#: Most header bytes per request (uvicorn's own cap applies only to headers arriving in pieces).
MAX_HEADER_BYTES = 16 * 1024


def _error(status: int, message: str):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status)


class RequestLimits:
    """ASGI middleware: no request bodies (413), no request target over ``max_target`` bytes (414),
    no headers over ``max_headers`` bytes (431)."""

    def __init__(self, app, max_target: int = MAX_TARGET_BYTES, max_headers: int = MAX_HEADER_BYTES) -> None:
        self.app, self.max_target, self.max_headers = app, int(max_target), int(max_headers)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            target = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b""))
            headers = dict(scope.get("headers") or [])
            if sum(len(k) + len(v) + 4 for k, v in scope.get("headers") or []) > self.max_headers:
                await _error(431, f"request: headers longer than {self.max_headers} bytes")(scope, receive, send)
                return
            if target > self.max_target:
                await _error(414, f"request: URL longer than {self.max_target} bytes")(scope, receive, send)
                return
            if b"transfer-encoding" in headers or headers.get(b"content-length", b"0").strip() not in (b"", b"0"):
                await _error(413, "request: this server takes no request body (use GET)")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def parse_query(params, *, default_k: int, max_k: int = MAX_K, max_chars: int = MAX_QUERY_CHARS
                ) -> tuple[str, int]:
    """``(q, k)`` from request parameters, or a ValueError naming ``q`` or ``k``.

    >>> parse_query({"q": " a dog ", "k": "3"}, default_k=10)
    ('a dog', 3)
    """
    q = str(params.get("q") or "").strip()
    if not q:
        raise ValueError("q: empty query (pass ?q=TEXT)")
    if len(q) > max_chars:
        raise ValueError(f"q: longer than {max_chars} characters ({len(q)})")
    raw = params.get("k")
    if raw is None or raw == "":
        return q, default_k
    try:
        k = int(raw)
    except ValueError:
        k = None
    if k is None or not 1 <= k <= max_k:
        raise ValueError(f"k: expected an integer in [1, {max_k}], got {str(raw)[:20]!r}")
    return q, k


class Searcher:
    """An opened index plus its text encoder: ``search(q, k)`` -> the API's dict (thread-safe)."""

    def __init__(self, index: Any, *, text_encoder: str | None = None) -> None:
        from xmodal.retrieval.search import SearchIndex

        self.index = index if isinstance(index, SearchIndex) else SearchIndex(index)
        self.text_encoder = text_encoder or self.index.meta.get("text_encoder", "minilm")
        self.num_items = int(self.index.index.num_items)
        self._lock = threading.Lock()  # one query at a time through the encoder and FAISS

    def name(self, item: int) -> str:
        names = self.index.names
        return names[item] if names is not None and item < len(names) else str(item)

    def search(self, q: str, k: int) -> dict[str, Any]:
        """``{"query", "results": [{"rank", "name", "score", "item"}], "normalizer", "k", "latency_ms"}``."""
        with self._lock:
            t0 = time.perf_counter()
            feats = self.index.encode_captions([q], text_encoder=self.text_encoder)
            t1 = time.perf_counter()
            scores, indices = self.index.search(feats, k)
            t2 = time.perf_counter()
        results = [{"rank": rank, "name": self.name(int(j)), "score": float(s), "item": int(j)}
                   for rank, (s, j) in enumerate(zip(scores[0], indices[0]), 1) if j >= 0]
        return {"query": q, "results": results, "normalizer": self.index.meta.get("normalizer"), "k": k,
                "latency_ms": {"encode": 1e3 * (t1 - t0), "search": 1e3 * (t2 - t1), "total": 1e3 * (t2 - t0)}}


def create_app(index: Any, *, images: str | os.PathLike | None = None, text_encoder: str | None = None,
               default_k: int = 10, max_k: int = MAX_K, max_query_chars: int = MAX_QUERY_CHARS,
               warm_up: bool = True):
    """The Starlette app of ``xmodal serve``.

    Args:
        index: a directory written by ``xmodal index`` or an opened ``SearchIndex``.
        images: directory the index's item names are relative to (thumbnails); None: none.
        text_encoder: override the index's text encoder (default: the one in its ``meta.json``).
        default_k: results when the request gives no ``k``.
        max_k, max_query_chars: bounds of ``k`` and of the query's length (400 beyond).
        warm_up: encode one query now, so the first request is not slow and a missing
            encoder fails here (ValueError) instead of at the first search.

    Routes: ``GET /`` (page; ``?q=TEXT&k=K`` shows results), ``GET /api/search?q=TEXT&k=K``
    (JSON), ``GET /thumb/{item}`` (JPEG, 404 when the item has none).
    """
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    from xmodal.serve.page import PAGE_HEADERS, render_page
    from xmodal.serve.thumbs import Thumbnails

    if isinstance(default_k, bool) or not 1 <= int(default_k) <= int(max_k):
        raise ValueError(f"--k: must be in [1, {max_k}], got {default_k!r}")
    searcher = Searcher(index, text_encoder=text_encoder)
    thumbs = Thumbnails(images, searcher.index.names) if images is not None else None
    if warm_up:
        searcher.search("warm up", 1)
    limits = {"default_k": int(default_k), "max_k": int(max_k), "max_chars": int(max_query_chars)}
    info = {"items": searcher.num_items, "normalizer": searcher.index.meta.get("normalizer"),
            "text_encoder": searcher.text_encoder}
    title = "/".join(Path(searcher.index.path).resolve().parts[-2:])  # e.g. shapes/index

    def api_search(request):
        try:
            q, k = parse_query(request.query_params, **limits)
        except ValueError as exc:
            return _error(400, str(exc))
        return JSONResponse(searcher.search(q, k))

    def page(request):
        params = request.query_params
        common = {"title": title, "info": info, "max_k": limits["max_k"], "max_chars": limits["max_chars"]}
        if "q" not in params:
            return HTMLResponse(render_page(**common, k=limits["default_k"]), headers=PAGE_HEADERS)
        try:
            q, k = parse_query(params, **limits)
        except ValueError as exc:
            body = render_page(**common, query=str(params.get("q", ""))[:limits["max_chars"]],
                               k=limits["default_k"], error=str(exc))
            return HTMLResponse(body, status_code=400, headers=PAGE_HEADERS)
        result = searcher.search(q, k)
        shown = {} if thumbs is None else {r["item"]: f"/thumb/{r['item']}" for r in result["results"]
                                           if thumbs.get(r["item"]) is not None}
        return HTMLResponse(render_page(**common, query=q, k=k, result=result, thumbnails=shown),
                            headers=PAGE_HEADERS)

    def thumb(request):
        data = None if thumbs is None else thumbs.get(int(request.path_params["item"]))
        if data is None:
            return _error(404, "thumbnail: none for this item")
        return Response(data, media_type="image/jpeg",
                        headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})

    app = Starlette(routes=[Route("/", page, methods=["GET"]),
                            Route("/api/search", api_search, methods=["GET"]),
                            Route("/thumb/{item:int}", thumb, methods=["GET"])],
                    middleware=[Middleware(RequestLimits)])
    app.state.searcher = searcher
    return app
