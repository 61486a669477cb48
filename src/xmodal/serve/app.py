"""``xmodal serve``'s ASGI app (Starlette): the search page, ``/api/search``, thumbnails and uploads.

``create_app(index)`` needs no socket (Starlette's ``TestClient`` drives it); the
command binds it to ``127.0.0.1`` by default through :mod:`xmodal.serve.net`. Three directions:

- ``t2v`` (``?q=TEXT``): the query is encoded exactly as ``xmodal query --captions`` encodes it
  (:meth:`xmodal.retrieval.search.SearchIndex.encode_captions`, the index's recorded text encoder, or
  a built-in one its text size matches, shown as *assumed*) and searched in the FAISS index, so the
  scores are the run's normalised text -> video scores; ``POST /api/search`` takes the caption
  features themselves (an ``.npy`` ``[T, Dt]``, at most ``max_feature_bytes`` and
  ``max_feature_rows``). Without a usable text encoder the page has no text box and says why;
  the other directions work for any run;
- ``v2v`` (``?video=NAME``, "more like this"): the other gallery items by the cosine of the run's video
  embeddings (``videos.npy``; exact, no normaliser; the item itself left out);
- ``v2t`` (``?video=NAME&direction=v2t``, or an uploaded video): the index's captions (``texts.npy``,
  from ``xmodal index --data`` or ``--texts``) by the run's raw similarity (exact, no normaliser).

The index folder is checked at every request (a ``stat`` of each of its files): replaced by
``xmodal index --overwrite`` -> reopened; deleted or half-written -> 503 with a message that says so.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from xmodal.serve.searcher import IndexHolder, IndexUnavailable, Searcher

#: Longest query, in characters.
MAX_QUERY_CHARS = 500
#: Largest ``k``.
MAX_K = 100
#: Longest request target (path + query string), in bytes.
MAX_TARGET_BYTES = 8192
#: Most header bytes per request (uvicorn's own cap applies only to headers arriving in pieces).
MAX_HEADER_BYTES = 16 * 1024
#: Most requests in progress at once; another gets a 503 at once.
MAX_REQUESTS = 32
#: Search directions: text -> video, video -> video ("more like this"), video -> text.
DIRECTIONS = ("t2v", "v2v", "v2t")
#: The route that takes a video upload's body.
UPLOAD_PATH = "/upload"
#: The route that takes POSTed query features.
SEARCH_PATH = "/api/search"
#: Largest POSTed ``.npy`` of query features, in bytes.
MAX_FEATURE_BYTES = 4 * 1024 * 1024
#: Most rows (queries) in a POSTed ``.npy``.
MAX_FEATURE_ROWS = 64
#: ``.npy`` bodies received at once from one client address (as uploads: ``uploads.MAX_RECEIVING``);
#: another from it gets a quick 503. A body being received holds no request slot.
MAX_FEATURE_BODIES_PER_CLIENT = 4
#: ``.npy`` bodies received at once from all clients (each at most ``max_feature_bytes`` in memory).
MAX_FEATURE_RECEIVING = 64


def _error(status: int, message: str, headers: dict | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers=headers)


class _HungUp(Exception):
    """The client closed its connection before its whole request body arrived."""


class RequestLimits:
    """ASGI middleware: no request target over ``max_target`` bytes (414), no headers over
    ``max_headers`` bytes (431), at most ``max_requests`` in progress (503 at once), and no request
    body (413) except a ``POST`` to :data:`UPLOAD_PATH` with a ``Content-Length`` (411 without one)
    of at most ``max_upload`` bytes (413), or to :data:`SEARCH_PATH` of at most ``max_features`` bytes.

    A ``POST`` to :data:`SEARCH_PATH` is received here before it takes a request slot, by the rule of
    uploads (:func:`xmodal.serve.uploads.receive_deadline`): within ``min(feature_timeout, grace +
    Content-Length / min_rate)`` seconds (408 past it), at most ``per_client`` bodies at once from one
    client address and ``max_receiving`` from all (503 at once beyond), so slow bodies delay only their
    own client; a client that hangs up mid-body is one line in the server's log."""

    def __init__(self, app, max_target: int = MAX_TARGET_BYTES, max_headers: int = MAX_HEADER_BYTES,
                 max_requests: int = MAX_REQUESTS, max_upload: int = 0, upload_off: str = "uploads are off",
                 max_features: int = MAX_FEATURE_BYTES, feature_timeout: float | None = None,
                 per_client: int = MAX_FEATURE_BODIES_PER_CLIENT, max_receiving: int = MAX_FEATURE_RECEIVING,
                 counters: dict | None = None) -> None:
        from xmodal.serve import uploads as up

        self.app, self.max_target, self.max_headers = app, int(max_target), int(max_headers)
        self.max_requests, self.max_upload, self.upload_off = int(max_requests), int(max_upload), str(upload_off)
        self.max_features = int(max_features)
        self.feature_timeout = float(up.UPLOAD_TIMEOUT if feature_timeout is None else feature_timeout)
        self.per_client, self.max_receiving = int(per_client), int(max_receiving)
        self.in_progress = 0
        self.receiving: dict[str, int] = {} if counters is None else counters  # client address -> bodies

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if scope["path"] == SEARCH_PATH and scope.get("method") == "POST":
            await self._features(scope, receive, send)
            return
        await self._run(scope, receive, send)

    async def _run(self, scope, receive, send) -> None:
        if self.in_progress >= self.max_requests:
            await _error(503, f"server: busy ({self.in_progress} requests in progress); try again",
                         headers={"Retry-After": "1"})(scope, receive, send)
            return
        self.in_progress += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_progress -= 1

    async def _features(self, scope, receive, send) -> None:
        """Receive a ``.npy`` body (class doc), then hand it to the app as one message."""
        from xmodal.serve.uploads import MIN_RATE, receive_deadline

        host, port = (list(scope.get("client") or ()) + ["client", 0])[:2]
        length = int(dict(scope.get("headers") or [])[b"content-length"])
        mine, everyone = self.receiving.get(host, 0), sum(self.receiving.values())
        if mine >= self.per_client or everyone >= self.max_receiving:
            who = f"{mine} from this client" if mine >= self.per_client else str(everyone)
            await _error(503, f"features: {who} .npy bodies are being received; try again in a moment",
                         headers={"Retry-After": "1"})(scope, receive, send)
            return
        deadline = receive_deadline(length, max_bytes=self.max_features, timeout=self.feature_timeout)
        got = bytearray()

        async def read() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _HungUp
                got.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    return

        self.receiving[host] = mine + 1
        outcome = "received"
        try:
            await asyncio.wait_for(read(), deadline)
        except asyncio.TimeoutError:
            outcome = "late"
        except _HungUp:
            outcome = "gone"
        finally:  # the budget is given back before any answer
            self.receiving[host] -= 1
            if not self.receiving[host]:
                del self.receiving[host]
        if outcome == "late":
            await _error(408, f"features: not received within {deadline:.3g} s (bodies must arrive at "
                              f"{MIN_RATE / 1024:g} KiB/s or more)")(scope, receive, send)
            return
        if outcome == "gone":
            logging.getLogger("uvicorn.error").warning(
                "xmodal serve: %s:%s hung up while sending its .npy to %s (%d of %d bytes received)",
                host, port, SEARCH_PATH, len(got), length)
            return
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(got), "more_body": False}
            return await receive()  # after the body: the client's disconnect, as the server reports it

        await self._run(scope, replay, send)

    def _refusal(self, scope):
        target = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b""))
        headers = dict(scope.get("headers") or [])
        if sum(len(k) + len(v) + 4 for k, v in scope.get("headers") or []) > self.max_headers:
            return _error(431, f"request: headers longer than {self.max_headers} bytes")
        if target > self.max_target:
            return _error(414, f"request: URL longer than {self.max_target} bytes")
        length = headers.get(b"content-length", b"").strip()
        upload = scope["path"] == UPLOAD_PATH and scope.get("method") == "POST"
        if scope["path"] == SEARCH_PATH and scope.get("method") == "POST":
            if b"transfer-encoding" in headers or not length.isdigit() or len(length) > 18:
                return _error(411, "features: send the .npy with a Content-Length")
            if int(length) > self.max_features:
                return _error(413, f"features: larger than {self.max_features:,} bytes")
            return None
        if upload and self.max_upload <= 0:
            return _error(403, f"upload: {self.upload_off}")
        if not upload:
            if b"transfer-encoding" in headers or length not in (b"", b"0"):
                return _error(413, "request: this server takes no request body here (use GET)")
            return None
        if b"transfer-encoding" in headers or not length.isdigit() or len(length) > 18:
            return _error(411, "upload: send the file with a Content-Length (an HTML form does)")
        if int(length) > self.max_upload:
            return _error(413, f"upload: larger than {self.max_upload:,} bytes")
        return None


def _int_in(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"{name}: expected an integer in [{low}, {high}], got {str(value)[:40]!r}")
    return int(value)


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive number of seconds, got {str(value)[:40]!r}")
    return float(value)


def _parse_k(raw: Any, default_k: int, max_k: int) -> int:
    if raw is None or raw == "":
        return default_k
    try:
        k = int(raw) if isinstance(raw, str) and len(raw) <= 20 else None
    except ValueError:
        k = None
    if k is None or not 1 <= k <= max_k:
        raise ValueError(f"k: expected an integer in [1, {max_k}], got {str(raw)[:20]!r}")
    return k


def parse_query(params, *, default_k: int, max_k: int = MAX_K, max_chars: int = MAX_QUERY_CHARS
                ) -> tuple[str, int]:
    """``(q, k)`` from request parameters, or a ValueError naming ``q`` or ``k``.

    >>> parse_query({"q": " a dog ", "k": "3"}, default_k=10)
    ('a dog', 3)
    """
    if not hasattr(params, "get"):
        raise TypeError(f"params: expected a mapping of request parameters, got {type(params).__name__}")
    max_k = _int_in(max_k, "max_k", 1, 10**6)
    default_k = _int_in(default_k, "default_k", 1, max_k)
    max_chars = _int_in(max_chars, "max_chars", 1, 10**6)
    q = str(params.get("q") or "").strip()
    if not q:
        raise ValueError("q: empty query (pass ?q=TEXT)")
    if len(q) > max_chars:
        raise ValueError(f"q: longer than {max_chars} characters ({len(q)})")
    return q, _parse_k(params.get("k"), default_k, max_k)


def parse_request(params, *, default_k: int, max_k: int = MAX_K, max_chars: int = MAX_QUERY_CHARS) -> dict:
    """``{"direction", "q", "video", "k"}`` from request parameters: ``q=TEXT`` (t2v) or ``video=NAME``
    with ``direction`` ``v2v`` (default) or ``v2t``; a ValueError naming the parameter otherwise.

    >>> parse_request({"video": "clip_7", "direction": "v2t"}, default_k=10)
    {'direction': 'v2t', 'q': None, 'video': 'clip_7', 'k': 10}
    """
    if not hasattr(params, "get"):
        raise TypeError(f"params: expected a mapping of request parameters, got {type(params).__name__}")
    video, direction = params.get("video"), params.get("direction") or None
    if direction is not None and direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {', '.join(DIRECTIONS)}, got {str(direction)[:20]!r}")
    if video is None:
        if direction not in (None, "t2v"):
            raise ValueError(f"video: direction {direction} searches from a video (pass ?video=NAME)")
        q, k = parse_query(params, default_k=default_k, max_k=max_k, max_chars=max_chars)
        return {"direction": "t2v", "q": q, "video": None, "k": k}
    if params.get("q") not in (None, ""):
        raise ValueError("q: give q (text -> video) or video (video -> video / text), not both")
    if direction == "t2v":
        raise ValueError("direction: t2v searches from text (pass ?q=TEXT)")
    video = str(video)
    if not video or len(video) > 4096:
        raise ValueError("video: expected an item's name (a line of the index's names.txt)")
    _, k = parse_query({"q": "-", "k": params.get("k")}, default_k=default_k, max_k=max_k, max_chars=max_chars)
    return {"direction": direction or "v2v", "q": None, "video": video, "k": k}


def create_app(index: Any, *, images: str | os.PathLike | None = None, text_encoder: str | None = None,
               default_k: int = 10, max_k: int = MAX_K, max_query_chars: int = MAX_QUERY_CHARS,
               warm_up: bool = True, max_requests: int = MAX_REQUESTS, uploads: bool = True,
               max_upload_bytes: int | None = None, max_upload_seconds: float | None = None,
               upload_frames: int | None = None, image_encoder: str | None = None,
               upload_timeout: float | None = None, max_upload_decode: int | None = None,
               max_feature_bytes: int = MAX_FEATURE_BYTES, max_feature_rows: int = MAX_FEATURE_ROWS,
               device: str | None = None):
    """The Starlette app of ``xmodal serve``.

    Args:
        index: a directory written by ``xmodal index`` or an opened ``SearchIndex``.
        images: directory the index's item names are relative to (thumbnails); None: none.
        text_encoder: the encoder of text queries: None = the one the index records (else a built-in
            its text size matches, shown as assumed; else no text box), ``"none"`` = no text box, a spec
            = a local copy of the recorded encoder (another encoder is a ValueError) or the encoder
            of an index that records none.
        default_k: results when the request gives no ``k``.
        max_k, max_query_chars: bounds of ``k`` and of the query's length (400 beyond).
        warm_up: encode one query now, so the first request is not slow and a missing
            encoder fails here (ValueError) instead of at the first search.
        max_requests: requests in progress at once (another gets a 503 at once).
        uploads: accept ``POST /upload`` (a video searched v2t / v2v; needs PyAV and the image encoder).
        max_upload_bytes, max_upload_seconds, upload_frames, upload_timeout: bounds of an upload
            (:mod:`xmodal.serve.uploads`; defaults there).
        image_encoder: the encoder of an uploaded video (as ``text_encoder``: None = the recorded one,
            else ``efficientnet-lite0`` for 1280-d video features, shown as assumed; else no uploads).
        max_upload_decode: most frames decoded from an upload (default 30 a second of
            ``max_upload_seconds``); max_feature_bytes, max_feature_rows: bounds of POSTed features
            (received by the uploads' rule within ``upload_timeout`` at most, :class:`RequestLimits`).
        device: where the ``hf:`` / ``open_clip:`` encoders of queries and uploads run (``xmodal serve
            --device``; None: CUDA when present, else CPU); other encoders run as they are built.

    Routes: ``GET /`` (page; ``?q=TEXT`` or ``?video=NAME[&direction=v2t]``, ``&k=K``),
    ``GET /api/search`` (the same as JSON; ``POST`` an ``.npy`` of caption features ``[T, Dt]`` with
    ``?k=K[&encoder=SPEC]``: ``{"direction", "queries", "answers": [...]}``), ``GET /thumb/{item}`` (JPEG, 404 when none),
    ``POST /upload`` (multipart ``video`` file, ``direction``, ``k``; the page, or JSON with ``?format=json``).
    """
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    from xmodal.features.media import MAX_VIDEO_PIXELS
    from xmodal.retrieval.search import placed
    from xmodal.serve import images as up_images
    from xmodal.serve import uploads as up
    from xmodal.serve.images import gallery_kind
    from xmodal.serve.page import PAGE_HEADERS, render_page
    from xmodal.serve.thumbs import Thumbnails

    max_k = _int_in(max_k, "max_k", 1, 10_000)
    default_k = _int_in(default_k, "--k", 1, max_k)
    max_query_chars = _int_in(max_query_chars, "max_query_chars", 1, 100_000)
    max_requests = _int_in(max_requests, "max_requests", 1, 10_000)
    max_upload_bytes = _int_in(up.MAX_UPLOAD_BYTES if max_upload_bytes is None else max_upload_bytes,
                               "--max-upload-mb", 1, 2**40)
    max_upload_seconds = _seconds(up.MAX_UPLOAD_SECONDS if max_upload_seconds is None else max_upload_seconds,
                                  "--max-upload-seconds")
    upload_frames = _int_in(up.UPLOAD_FRAMES if upload_frames is None else upload_frames, "--upload-frames", 1, 1024)
    upload_timeout = _seconds(up.UPLOAD_TIMEOUT if upload_timeout is None else upload_timeout, "upload_timeout")
    max_upload_decode = _int_in(int(up.DECODE_FRAMES_PER_SECOND * max_upload_seconds) if max_upload_decode is None
                                else max_upload_decode, "--max-upload-decode", 1, 10**7)
    max_feature_bytes = _int_in(max_feature_bytes, "max_feature_bytes", 128, 2**31)
    max_feature_rows = _int_in(max_feature_rows, "max_feature_rows", 1, 10**5)
    for value, name in ((warm_up, "warm_up"), (uploads, "uploads")):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected True or False, got {str(value)[:40]!r}")
    for value, name in ((text_encoder, "--text-encoder"), (image_encoder, "--image-encoder")):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{name}: expected an encoder name, got {str(value)[:40]!r}")
    if images is not None and not isinstance(images, (str, os.PathLike)):
        raise TypeError(f"--images: expected a directory path, got {type(images).__name__}")
    if not isinstance(index, (str, os.PathLike)) and type(index).__name__ != "SearchIndex":
        raise TypeError(f"--index: expected an index directory or a SearchIndex, got {type(index).__name__}")

    holder = IndexHolder(index, text_encoder=text_encoder, device=device)
    if images is not None and not Path(images).is_dir():
        raise ValueError(f"--images: {images} is not a directory")
    thumbs: dict[int, Any] = {}  # id(searcher) -> its Thumbnails (names change with the index)

    def thumbnails_of(searcher: Searcher):
        if images is None:
            return None
        if id(searcher) not in thumbs:
            thumbs.clear()
            thumbs[id(searcher)] = Thumbnails(images, searcher.index.names)
        return thumbs[id(searcher)]

    if warm_up and holder.searcher.text_encoder is not None:
        try:  # a missing encoder fails here, not at the first search
            holder.searcher.search("warm up", 1)
        except (ValueError, LookupError, ModuleNotFoundError) as exc:
            if text_encoder is not None:  # named by the user: their error
                raise ValueError(f"--text-encoder: {str(exc).removeprefix('text encoder: ')}") from None
            holder.searcher.text_off(f"the text encoder {holder.searcher.text_encoder} could not be used "
                                     f"({str(exc)[:200]})")
    limits = {"default_k": default_k, "max_k": max_k, "max_chars": max_query_chars}
    video_choice = _image_encoder(holder.searcher, image_encoder)
    image_encoder = video_choice["spec"]
    kind = gallery_kind(holder.searcher.meta)  # images: an uploaded image, encoded as 'encode images' does
    unavailable = up_images.unavailable_reason if kind == "images" else up.unavailable_reason
    no_upload = "uploads are off (xmodal serve --uploads on)" if not uploads else \
        unavailable(holder.searcher.index.model, image_encoder, video_choice["reason"])
    upload_info = {"available": no_upload is None, "reason": no_upload, "max_bytes": max_upload_bytes,
                   "max_seconds": max_upload_seconds, "frames": upload_frames, "image_encoder": image_encoder,
                   "image_encoder_status": video_choice["status"], "max_decode": max_upload_decode,
                   "kind": kind, "field": up_images.FIELDS[kind]}
    busy = {"upload": False, "receiving": 0}
    receiving: dict[str, int] = {}

    from xmodal.features.identity import shown_spec

    def info(searcher: Searcher) -> dict:
        choice = searcher.meta.get("normalizer_choice")
        return {"items": searcher.num_items, "normalizer": searcher.meta.get("normalizer"),
                "normalizer_choice": choice.get("why") if isinstance(choice, dict) and
                isinstance(choice.get("why"), str) else None,  # shown as text, cut to 600 characters
                "text_encoder": searcher.text_encoder, "text_encoder_status": searcher.text_choice["status"],
                "text_encoder_shown": shown_spec(searcher.text_encoder, searcher.text_choice.get("record")),
                "text_reason": searcher.text_choice["reason"], "kind": searcher.meta.get("kind", "flat"),
                "texts": 0 if searcher.extras.texts is None else int(searcher.extras.texts.shape[0]),
                "videos": searcher.extras.videos is not None, **searcher.recall()}

    def common(searcher: Searcher | None) -> dict:
        return {"title": "/".join(holder.path.resolve().parts[-2:]),  # e.g. shapes/index
                "info": None if searcher is None else info(searcher), "max_k": max_k,
                "max_chars": max_query_chars, "upload": upload_info, "kind": kind}

    def shown_thumbs(searcher: Searcher, result: dict, extra: list[int] = ()) -> dict[int, str]:
        th = thumbnails_of(searcher)
        if th is None:
            return {}
        items = [] if result["direction"] == "v2t" else [r["item"] for r in result["results"]]  # v2t: captions
        return {i: f"/thumb/{i}" for i in items + list(extra) if th.get(i) is not None}

    def run_search(searcher: Searcher, req: dict) -> dict:
        if req["direction"] == "t2v":
            return searcher.search(req["q"], req["k"])
        return searcher.search_video(req["video"], req["k"], req["direction"])

    async def api_search(request):
        try:
            searcher = holder.current()
        except IndexUnavailable as exc:
            return _error(503, str(exc), headers={"Retry-After": "1"})
        if request.method == "POST":
            return await search_features(request, searcher)
        try:
            req = parse_request(request.query_params, **limits)
            return JSONResponse(run_search(searcher, req))
        except ValueError as exc:
            return _error(400, str(exc))
        except KeyError as exc:
            return _error(404, exc.args[0])
        except LookupError as exc:
            return _error(400, str(exc))

    async def search_features(request, searcher: Searcher):
        from starlette.requests import ClientDisconnect

        from xmodal.serve.features import parse_features

        try:
            k = _parse_k(request.query_params.get("k"), default_k, max_k)
            _check_encoder_param(searcher, request.query_params.get("encoder"))

            async def read() -> bytes:
                body = bytearray()
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > max_feature_bytes:
                        raise ValueError(f"features: larger than {max_feature_bytes:,} bytes")
                return bytes(body)

            try:  # (RequestLimits received the body already; kept for an app called without it)
                body = await asyncio.wait_for(read(), upload_timeout)
            except asyncio.TimeoutError:
                return _error(408, f"features: not received within {upload_timeout:g} s")
            except ClientDisconnect:
                logging.getLogger("uvicorn.error").warning(
                    "xmodal serve: a client hung up while sending its .npy to %s", SEARCH_PATH)
                return Response(status_code=400)
            feats = parse_features(body, max_rows=max_feature_rows)
            return JSONResponse(searcher.search_features(feats, k))
        except ValueError as exc:
            return _error(400, str(exc))

    def page(request):
        params = request.query_params
        try:
            searcher = holder.current()
        except IndexUnavailable as exc:
            return HTMLResponse(render_page(**common(None), k=default_k, error=str(exc)), status_code=503,
                                headers={**PAGE_HEADERS, "Retry-After": "1"})
        if "q" not in params and "video" not in params:
            browse = None if searcher.text_encoder is not None else {
                "names": [searcher.name(i) for i in range(min(default_k, searcher.num_items))],
                "thumbnails": shown_thumbs(searcher, {"direction": "v2v", "results": []},
                                           list(range(min(default_k, searcher.num_items))))}
            return HTMLResponse(render_page(**common(searcher), k=default_k, browse=browse), headers=PAGE_HEADERS)
        status, req, result, error = 200, None, None, None
        try:
            req = parse_request(params, **limits)
            result = run_search(searcher, req)
        except ValueError as exc:
            status, error = 400, str(exc)
        except KeyError as exc:
            status, error = 404, exc.args[0]
        except LookupError as exc:
            status, error = 400, str(exc)
        query = str(params.get("q", ""))[:max_query_chars]
        k = req["k"] if req else default_k
        source = None
        if req and req["video"] is not None and status == 200:
            item = searcher.item(req["video"])
            source = {"name": req["video"], "item": item, "captions": searcher.extras.captions_of(item)}
        extra = [source["item"]] if source else []
        body = render_page(**common(searcher), query=query if not source else "", k=k, result=result,
                           error=error, source=source,
                           thumbnails={} if result is None else shown_thumbs(searcher, result, extra))
        return HTMLResponse(body, status_code=status, headers=PAGE_HEADERS)

    def thumb(request):
        raw = request.path_params["item"]
        try:
            searcher = holder.current()
        except IndexUnavailable as exc:
            return _error(503, str(exc), headers={"Retry-After": "1"})
        th = thumbnails_of(searcher)
        # digits only, at most 18 (int() of 5000 digits is a ValueError in Python >= 3.11: was a 500)
        data = None if th is None or not raw.isdigit() or not raw.isascii() or len(raw) > 18 else th.get(int(raw))
        if data is None:
            return _error(404, "thumbnail: none for this item")
        return Response(data, media_type="image/jpeg",
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})

    async def upload(request):
        from starlette.concurrency import run_in_threadpool

        as_json = request.query_params.get("format") == "json"

        def refuse(status, message):
            if as_json:
                return _error(status, message)
            return HTMLResponse(render_page(**common(searcher), k=default_k, error=message, upload_error=True),
                                status_code=status, headers=PAGE_HEADERS)

        try:
            searcher = holder.current()
        except IndexUnavailable as exc:
            return _error(503, str(exc), headers={"Retry-After": "1"})
        if not upload_info["available"]:  # (the middleware answers first; kept for a direct call)
            return refuse(403, f"upload: {upload_info['reason']}")
        if busy["receiving"] >= up.MAX_RECEIVING:
            return refuse(503, f"upload: {up.MAX_RECEIVING} uploads are being received; try again in a moment")
        mine = False  # whether this request holds the one encoding slot
        folder = None
        try:
            with up.PrivateFolder() as folder:
                busy["receiving"] += 1
                try:  # receiving never holds the encoding slot: a slow client delays only itself
                    path, filename, fields = await up.receive(request, folder, max_bytes=max_upload_bytes,
                                                              timeout=upload_timeout, field=upload_info["field"])
                finally:
                    busy["receiving"] -= 1
                direction = fields.get("direction") or ("v2t" if searcher.extras.texts is not None else "v2v")
                if direction not in ("v2t", "v2v"):
                    raise up.UploadError(400, f"direction: expected v2t or v2v, got {direction[:20]!r}")
                k = _parse_k(fields.get("k"), default_k, max_k)
                if busy["upload"]:
                    return refuse(503, f"upload: another {upload_info['field']} is being encoded; try again in a moment")
                busy["upload"] = mine = True

                def work():
                    t0 = time.perf_counter()
                    if kind == "images":
                        up_images.probe_image(path, max_pixels=up_images.MAX_UPLOAD_IMAGE_PIXELS)
                        emb = up_images.embed_image(path, searcher.index.model, image_encoder=image_encoder,
                                                    filename=filename, device=placed(image_encoder, device))
                        return searcher.search_embedding(emb, k, direction, t0=t0)
                    up.probe(path, max_seconds=max_upload_seconds, max_pixels=MAX_VIDEO_PIXELS,
                             max_decoded=max_upload_decode)
                    emb = up.embed(path, searcher.index.model, frames=upload_frames, image_encoder=image_encoder,
                                   max_decoded=max_upload_decode, filename=filename,
                                   device=placed(image_encoder, device))
                    return searcher.search_embedding(emb, k, direction, t0=t0)

                result = await run_in_threadpool(work)
        except up.UploadError as exc:
            return refuse(exc.status, _private(str(exc), folder))
        except (ValueError, LookupError) as exc:
            return refuse(400, _private(str(exc), folder))
        finally:
            if mine:
                busy["upload"] = False
        result["upload"] = filename
        if as_json:
            return JSONResponse(result)
        body = render_page(**common(searcher), k=k, result=result, source={"upload": filename},
                           thumbnails=shown_thumbs(searcher, result))
        return HTMLResponse(body, headers=PAGE_HEADERS)

    app = Starlette(routes=[Route("/", page, methods=["GET"]),
                            Route(SEARCH_PATH, api_search, methods=["GET", "POST"]),
                            Route("/thumb/{item}", thumb, methods=["GET"]),
                            Route(UPLOAD_PATH, upload, methods=["POST"])],
                    middleware=[Middleware(RequestLimits, max_requests=max_requests,
                                           max_upload=max_upload_bytes if upload_info["available"] else 0,
                                           upload_off=str(no_upload), max_features=max_feature_bytes,
                                           feature_timeout=upload_timeout, counters=receiving)])
    app.state.holder = holder
    app.state.receiving = receiving  # client address -> .npy bodies being received (RequestLimits)
    app.state.upload = upload_info
    return app


def _private(text: str, folder: Any) -> str:
    """An error message without the private upload folder's path (:func:`xmodal.serve.uploads.scrub`)."""
    from xmodal.serve.uploads import scrub

    return text if folder is None else scrub(text, Path(folder) / "upload")


def _image_encoder(searcher: Searcher, given: str | None) -> dict:
    """The encoder of uploaded videos (:func:`xmodal.features.identity.resolve` for ``video``)."""
    from xmodal.features.identity import recorded_video, resolve
    from xmodal.serve.uploads import _video_in_dim

    return resolve("video", recorded_video(searcher.meta), _video_in_dim(searcher.index.model), given,
                   flag="--image-encoder")


def _check_encoder_param(searcher: Searcher, given: str | None) -> None:
    """POSTed features that say which encoder made them (``?encoder=SPEC``) must be the recorded one's."""
    if given is None:
        return
    record = searcher.text_choice.get("record")
    if record is None:
        return
    from xmodal.features.identity import mismatch, portable, shown_spec, stated

    names = {record["spec"], portable(record)["spec"], record.get("hub_name"), searcher.text_encoder}
    if given in names:
        return
    refusal = (f"encoder: {shown_spec(given)[:200]} is not the encoder of this index's text features "
               f"({shown_spec(record['spec'], record)})")
    try:  # another spelling of the same folder, or a copy: the same hashes (the spelling never decides)
        mine = stated(given, "text", record.get("dim"), "encoder")
    except (ValueError, TypeError):
        raise ValueError(refusal) from None
    why = mismatch(record, mine) if mine.get("weights_sha256") and record.get("weights_sha256") else "no hashes"
    if why is not None:
        raise ValueError(refusal)
