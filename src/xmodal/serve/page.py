"""The HTML of ``xmodal serve``'s search page (no JavaScript; every text escaped).

One page for the three directions: a text query (text -> video), a gallery item's "more like this"
(video -> video) and "captions" (video -> text) links, and an upload form (video -> text or video).
The words follow the collection's kind (``kind``: ``videos``, or ``images`` for an image gallery,
whose upload form takes an image file)."""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import urlencode

from xmodal.metrics.formatting import format_metric

#: Response headers of the page: nothing runs, nothing is fetched from elsewhere.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
                               "form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
#: Captions shown under a video result (the rest are counted).
SHOWN_CAPTIONS = 3
#: The gallery's kind -> (an item, items, an item with its article, the upload's MIME family).
WORDS = {"videos": ("video", "videos", "a video", "video/*"), "images": ("image", "images", "an image", "image/*")}


def _words(kind: str) -> tuple[str, str, str, str]:
    return WORDS.get(kind, WORDS["videos"])

_STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:14px 24px}
header h1{font-size:19px;margin:0 0 4px}header p{margin:0;color:#c5cbd8;font-size:13px}
main{padding:16px 24px}form{display:flex;gap:8px;flex-wrap:wrap;align-items:center;margin:0 0 8px}
input[type=search]{flex:1;min-width:240px;font-size:16px;padding:8px 10px;border:1px solid #b8bfcc;
border-radius:6px}input[type=number]{width:64px;font-size:16px;padding:7px;border:1px solid #b8bfcc;
border-radius:6px}button{font-size:16px;padding:8px 18px;border:0;border-radius:6px;background:#2f6fed;color:#fff}
form.upload{font-size:13px;color:#4b5468;background:#eef1f6;border-radius:8px;padding:8px 10px}
form.upload button{font-size:14px;padding:6px 12px}select{font-size:14px;padding:5px}
.status{color:#4b5468;font-size:13px;margin:10px 0}.error{color:#b3261e;font-weight:600}
ol{list-style:none;padding:0;margin:0}
ol.videos{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:14px}
ol.videos>li{background:#fff;border:1px solid #dde1e8;border-radius:8px;overflow:hidden}
ol.texts>li{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:8px 12px;margin:0 0 8px}
.thumb{height:150px;background:#e8ebf0;display:flex;align-items:center;justify-content:center;color:#8a93a6}
.thumb img{max-width:100%;max-height:150px}.meta{padding:8px 10px;font-size:13px}
.rank{font-weight:700;margin-right:6px}.score{color:#4b5468;float:right}
.name{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
ul.captions{margin:6px 0 0;padding-left:16px;color:#39414f;font-size:12.5px}ul.captions li{margin:2px 0}
.more{color:#8a93a6;font-size:12px}.links a{margin-right:10px;font-size:12.5px;color:#2f6fed}
.caption{font-size:15px}.texts .name{font-size:12.5px;color:#4b5468;margin-top:3px}
#source{display:flex;gap:14px;align-items:flex-start;background:#fff;border:1px solid #dde1e8;border-radius:8px;
padding:10px;margin:10px 0}#source img{max-height:110px;border-radius:4px}#source h2{font-size:16px;margin:0 0 4px}
"""


def _href(params: dict) -> str:
    return escape("/?" + urlencode(params))


def _recall(info: dict[str, Any]) -> str:
    """The FAISS index's search quality: 'exact search' or its measured recall@10."""
    kind = escape(str(info.get("kind", "flat")))
    if info.get("exact"):
        return f"<span id=\"recall\" data-recall=\"1\">exact search ({kind} index)</span>"
    recall = info.get("recall_at_10")
    if recall is None:
        return f"<span id=\"recall\" data-recall=\"\">approximate search ({kind} index), recall not measured</span>"
    params = info.get("search_params") or {}
    extra = [f"{escape(str(k))} {escape(str(v))}" for k, v in params.items()] if isinstance(params, dict) else []
    if info.get("recall_queries") is not None:
        extra.append(f"{format_metric('queries', info['recall_queries'])} queries")
    return (f"<span id=\"recall\" data-recall=\"{float(recall):.6f}\">recall@10 "
            f"{format_metric('R@10', 100.0 * float(recall))}% of exact search ({kind} index"
            f"{'; ' + ', '.join(extra) if extra else ''})</span>")


def _captions(captions: list[str]) -> str:
    if not captions:
        return ""
    shown = "".join(f"<li>{escape(c)}</li>" for c in captions[:SHOWN_CAPTIONS])
    more = (f"<li class=\"more\">+{len(captions) - SHOWN_CAPTIONS} more</li>"
            if len(captions) > SHOWN_CAPTIONS else "")
    return f"<ul class=\"captions\">{shown}{more}</ul>"


def _video_links(name: str, k: int, texts: bool) -> str:
    links = [f"<a class=\"more-like\" href=\"{_href({'video': name, 'k': k})}\">more like this</a>"]
    if texts:
        links.append(f"<a class=\"v2t\" href=\"{_href({'video': name, 'direction': 'v2t', 'k': k})}\">captions</a>")
    return f"<div class=\"links\">{''.join(links)}</div>"


def _upload_form(upload: dict[str, Any], info: dict[str, Any], k: int, max_k: int, kind: str = "videos") -> str:
    if not upload or not upload.get("available"):
        return ""
    one, many, a_one, mime = _words(kind)
    options = ([("v2t", "captions for it")] if info.get("texts") else []) + \
        ([("v2v", f"{many} like it")] if info.get("videos") else [])
    if not options:
        return ""
    choices = "".join(f"<option value=\"{v}\">{label}</option>" for v, label in options)
    bounds = (f"up to {upload['max_bytes'] / 2**20:g} MiB; the file is deleted afterwards" if kind == "images" else
              f"up to {upload['max_bytes'] / 2**20:g} MiB and {upload['max_seconds']:g} s; "
              f"{upload['frames']} frames are encoded, the file is deleted afterwards")
    return ("<form class=\"upload\" id=\"upload\" method=\"post\" action=\"/upload\" enctype=\"multipart/form-data\">"
            f"<label>or {a_one} file <input type=\"file\" id=\"{one}-file\" name=\"{one}\" accept=\"{mime}\" "
            f"required></label><select id=\"direction\" name=\"direction\">{choices}</select>"
            f"<label>top <input type=\"number\" name=\"k\" value=\"{k}\" min=\"1\" max=\"{max_k}\"></label>"
            f"<button type=\"submit\" id=\"upload-go\">Search with this {one}</button>"
            f"<span>{bounds}</span></form>")


def _source(source: dict[str, Any], result: dict[str, Any], thumbnails: dict[int, str], k: int,
            texts: bool, kind: str = "videos") -> str:
    what = "Captions for" if result["direction"] == "v2t" else "More like"
    if "upload" in source:
        return (f"<div id=\"source\"><div><h2>{what} your {_words(kind)[0]} <b>{escape(source['upload'])}</b></h2>"
                "<span class=\"status\">(uploaded, encoded and deleted)</span></div></div>")
    url = thumbnails.get(source["item"])
    img = f"<img src=\"{escape(url)}\" alt=\"{escape(source['name'])}\">" if url else ""
    return (f"<div id=\"source\">{img}<div><h2>{what} <b id=\"source-name\">{escape(source['name'])}</b></h2>"
            f"{_captions(source.get('captions') or [])}{_video_links(source['name'], k, texts)}</div></div>")


def _latency(result: dict[str, Any], params: dict, kind: str = "videos") -> str:
    lat = result["latency_ms"]
    first = {"t2v": "text encoding", "v2v": "lookup", "v2t": "lookup"}[result["direction"]]
    if result.get("upload"):
        first = f"{_words(kind)[0]} decoding and encoding"
    json_link = (f" &middot; <a href=\"/api/search?{escape(urlencode(params))}\">JSON</a>"
                 if not result.get("upload") else "")
    return (f"<p class=\"status\" id=\"latency\">{len(result['results'])} results in {lat['total']:.1f} ms "
            f"({first} {lat['encode']:.1f} ms, "
            f"{'exact' if result['direction'] != 't2v' and result.get('exact') else 'index'} search "
            f"{lat['search']:.2f} ms){json_link}</p>")


def _results(result: dict[str, Any], thumbnails: dict[int, str], k: int, texts: bool) -> list[str]:
    if result["direction"] == "v2t":
        parts = ["<ol id=\"results\" class=\"texts\">"]
        for r in result["results"]:
            caption = r["caption"] if r["caption"] is not None else f"text #{r['item']}"
            video = ""
            if r["name"] is not None:
                video = (f"<div class=\"name\">of <a href=\"{_href({'video': r['name'], 'k': k})}\">"
                         f"{escape(r['name'])}</a></div>")
            parts.append(f"<li class=\"result\" data-rank=\"{r['rank']}\" data-score=\"{r['score']:.6f}\" "
                         f"data-item=\"{r['item']}\"><span class=\"rank\">#{r['rank']}</span>"
                         f"<span class=\"score\">{r['score']:.4f}</span><span class=\"caption\">"
                         f"{escape(caption)}</span>{video}</li>")
        return parts + ["</ol>"]
    parts = ["<ol id=\"results\" class=\"videos\">"]
    for r in result["results"]:
        url = thumbnails.get(r["item"])
        img = (f"<img src=\"{escape(url)}\" alt=\"{escape(r['name'])}\" loading=\"lazy\">" if url
               else "no thumbnail")
        parts.append(f"<li class=\"result\" data-rank=\"{r['rank']}\" data-score=\"{r['score']:.6f}\" "
                     f"data-item=\"{r['item']}\"><div class=\"thumb\">{img}</div><div class=\"meta\">"
                     f"<span class=\"rank\">#{r['rank']}</span><span class=\"score\">{r['score']:.4f}</span>"
                     f"<div class=\"name\" title=\"{escape(r['name'])}\">{escape(r['name'])}</div>"
                     f"{_captions(r.get('captions') or [])}{_video_links(r['name'], k, texts)}</div></li>")
    return parts + ["</ol>"]


def _text_encoder(info: dict[str, Any]) -> str:
    """The header's words on the text encoder: its spec, and *assumed* where nothing was recorded."""
    spec, status = info.get("text_encoder"), info.get("text_encoder_status")
    if spec is None:
        return "<span id=\"text-encoder\" data-status=\"off\">no text encoder</span>"
    from xmodal.features.identity import shown_spec

    shown = f"text encoder {escape(str(info.get('text_encoder_shown') or shown_spec(spec)))}"
    if status == "assumed":
        shown += (f" <i title=\"{escape(str(info.get('text_reason') or ''))}\">(assumed: nothing recorded, "
                  f"its size matches)</i>")
    return f"<span id=\"text-encoder\" data-status=\"{escape(str(status))}\">{shown}</span>"


def _video_form(k: int, max_k: int, kind: str = "videos") -> str:
    """Search from a gallery item by its name (the page without a text box)."""
    return ("<form method=\"get\" action=\"/\" id=\"by-video\"><input type=\"search\" id=\"video\" name=\"video\" "
            f"placeholder=\"{_words(kind)[2]}'s name (its line in names.txt)\" required>"
            f"<label>top <input type=\"number\" name=\"k\" value=\"{k}\" min=\"1\" max=\"{max_k}\"></label>"
            "<button type=\"submit\" id=\"go-video\">More like this</button></form>")


def _browse(browse: dict[str, Any], k: int, texts: bool, kind: str = "videos") -> list[str]:
    """The gallery's first items (the page without a text box starts from them)."""
    names, thumbs = browse.get("names") or [], browse.get("thumbnails") or {}
    parts = [f"<p class=\"status\" id=\"browse-title\">The gallery's first {len(names)} items: pick one to find "
             f"{_words(kind)[1]} like it{' or its captions' if texts else ''}.</p>", "<ol id=\"browse\" class=\"videos\">"]
    for i, name in enumerate(names):
        url = thumbs.get(i)
        img = f"<img src=\"{escape(url)}\" alt=\"{escape(name)}\" loading=\"lazy\">" if url else "no thumbnail"
        parts.append(f"<li class=\"item\" data-item=\"{i}\"><div class=\"thumb\">{img}</div><div class=\"meta\">"
                     f"<div class=\"name\" title=\"{escape(name)}\">{escape(name)}</div>"
                     f"{_video_links(name, k, texts)}</div></li>")
    return parts + ["</ol>"]


def render_page(*, title: str, info: dict[str, Any] | None, query: str = "", k: int = 10, max_k: int = 100,
                max_chars: int = 500, result: dict[str, Any] | None = None,
                thumbnails: dict[int, str] | None = None, error: str | None = None,
                source: dict[str, Any] | None = None, upload: dict[str, Any] | None = None,
                upload_error: bool = False, browse: dict[str, Any] | None = None, kind: str = "videos") -> str:
    """The whole page: the query forms, then the results of ``result`` (``Searcher.search``'s dict).

    Args:
        title: the index's name for the heading.
        info: ``{"items", "normalizer", "text_encoder", "kind", "texts", "videos", "recall_at_10", ...}``
            shown under the heading; None while the index is unavailable.
        query, k: the form's values.
        result: the search's dict, or None before the first query.
        thumbnails: ``{item: url}`` of items that have a thumbnail.
        error: a message shown instead of results (a bad parameter, an unavailable index).
        source: the video searched from: ``{"name", "item", "captions"}`` or ``{"upload": file name}``.
        upload: the upload form's bounds (``{"available", "max_bytes", "max_seconds", "frames"}``).
        upload_error: the error is an upload's.
        browse: ``{"names", "thumbnails"}`` of the gallery's first items, listed when there is no text box.
        kind: ``videos`` or ``images`` (:func:`xmodal.serve.images.gallery_kind`): the page's words and the
            upload form's file (an image for an image gallery).

    Without a text encoder (``info["text_encoder"]`` None) there is no text box: the page says why
    (``info["text_reason"]``) and offers a video's name, the gallery's first items and uploads.
    """
    thumbnails = thumbnails or {}
    texts = bool(info and info.get("texts"))
    if info is None:
        head = "index unavailable"
    else:
        head = (f"{info['items']:,} items &middot; normaliser <b id=\"normalizer\">{escape(str(info['normalizer']))}"
                f"</b> folded into the index &middot; {_text_encoder(info)} &middot; {_recall(info)}")
        if texts:
            head += f" &middot; {info['texts']:,} captions for {_words(kind)[0]} &rarr; text"
        if info.get("normalizer_choice"):  # how the build chose it (xmodal index --normalizer auto)
            head += f"</p><p class=\"note\" id=\"normalizer-choice\">normaliser: {escape(str(info['normalizer_choice'])[:600])}"
    parts = [
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">",
        f"<title>{escape(query + ' - ' if query else '')}xmodal search</title><style>{_STYLE}</style></head><body>",
        f"<header><h1>xmodal search &mdash; {escape(title)}</h1><p>{head}</p></header><main>",
    ]
    text_box = info is None or info.get("text_encoder") is not None
    if text_box:
        parts += [
            "<form method=\"get\" action=\"/\" role=\"search\">",
            f"<input type=\"search\" id=\"q\" name=\"q\" value=\"{escape(query)}\" maxlength=\"{max_chars}\" "
            "placeholder=\"describe what you are looking for\" autofocus required>",
            f"<label>top <input type=\"number\" id=\"k\" name=\"k\" value=\"{k}\" min=\"1\" max=\"{max_k}\"></label>",
            "<button type=\"submit\" id=\"go\">Search</button></form>"]
    else:
        uploads = bool(_upload_form(upload or {}, info, k, max_k, kind))
        one, _, a_one, _ = _words(kind)
        parts += [f"<p class=\"status\" id=\"text-off\">Text search is off: {escape(str(info.get('text_reason')))}"
                  f". Search from {a_one} instead: its name{f', an item below, or {a_one} file' if uploads else ' or an item below'}"
                  f".</p>", _video_form(k, max_k, kind)]
    if info is not None:
        parts.append(_upload_form(upload or {}, info, k, max_k, kind))
    if error:
        cls = "status error upload-error" if upload_error else "status error"
        parts.append(f"<p class=\"{cls}\" id=\"error\">{escape(error)}</p>")
    elif result is None and browse is not None and info is not None:
        parts.extend(_browse(browse, k, texts, kind))
    elif result is not None:
        if source is not None:
            parts.append(_source(source, result, thumbnails, k, texts, kind))
        params = ({"q": query, "k": k} if result["direction"] == "t2v" else
                  {"video": result.get("video") or "", "direction": result["direction"], "k": k})
        parts.append(_latency(result, params, kind))
        parts.extend(_results(result, thumbnails, k, texts))
    parts.append("</main></body></html>")
    return "".join(parts)
