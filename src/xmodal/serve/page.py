"""The HTML of ``xmodal serve``'s search page (no JavaScript; every text escaped)."""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import urlencode

#: Response headers of the page: nothing runs, nothing is fetched from elsewhere.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
                               "form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

_STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:14px 24px}
header h1{font-size:19px;margin:0 0 4px}header p{margin:0;color:#c5cbd8;font-size:13px}
main{padding:16px 24px}form{display:flex;gap:8px;flex-wrap:wrap;align-items:center}
input[type=search]{flex:1;min-width:240px;font-size:16px;padding:8px 10px;border:1px solid #b8bfcc;
border-radius:6px}input[type=number]{width:64px;font-size:16px;padding:7px;border:1px solid #b8bfcc;
border-radius:6px}button{font-size:16px;padding:8px 18px;border:0;border-radius:6px;background:#2f6fed;color:#fff}
.status{color:#4b5468;font-size:13px;margin:10px 0}.error{color:#b3261e;font-weight:600}
ol{list-style:none;padding:0;margin:0;display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:14px}
li{background:#fff;border:1px solid #dde1e8;border-radius:8px;overflow:hidden}
.thumb{height:150px;background:#e8ebf0;display:flex;align-items:center;justify-content:center;color:#8a93a6}
.thumb img{max-width:100%;max-height:150px}.meta{padding:8px 10px;font-size:13px}
.rank{font-weight:700;margin-right:6px}.score{color:#4b5468;float:right}
.name{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
"""


def render_page(*, title: str, info: dict[str, Any], query: str = "", k: int = 10, max_k: int = 100,
                max_chars: int = 500, result: dict[str, Any] | None = None,
                thumbnails: dict[int, str] | None = None, error: str | None = None) -> str:
    """The whole page: the query form, then the results of ``result`` (``Searcher.search``'s dict).

    Args:
        title: the index's name for the heading.
        info: ``{"items", "normalizer", "text_encoder"}`` shown under the heading.
        query, k: the form's values.
        result: the search's dict, or None before the first query.
        thumbnails: ``{item: url}`` of results that have a thumbnail.
        error: a message shown instead of results (a bad parameter).
    """
    thumbnails = thumbnails or {}
    head = (f"{info['items']:,} items &middot; normaliser <b id=\"normalizer\">{escape(str(info['normalizer']))}"
            f"</b> folded into the index &middot; text encoder {escape(str(info['text_encoder']))}")
    parts = [
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">",
        f"<title>{escape(query + ' - ' if query else '')}xmodal search</title><style>{_STYLE}</style></head><body>",
        f"<header><h1>xmodal search &mdash; {escape(title)}</h1><p>{head}</p></header><main>",
        "<form method=\"get\" action=\"/\" role=\"search\">",
        f"<input type=\"search\" id=\"q\" name=\"q\" value=\"{escape(query)}\" maxlength=\"{max_chars}\" "
        "placeholder=\"describe what you are looking for\" autofocus required>",
        f"<label>top <input type=\"number\" id=\"k\" name=\"k\" value=\"{k}\" min=\"1\" max=\"{max_k}\"></label>",
        "<button type=\"submit\" id=\"go\">Search</button></form>",
    ]
    if error:
        parts.append(f"<p class=\"status error\" id=\"error\">{escape(error)}</p>")
    elif result is not None:
        lat = result["latency_ms"]
        parts.append(f"<p class=\"status\" id=\"latency\">{len(result['results'])} results in "
                     f"{lat['total']:.1f} ms (text encoding {lat['encode']:.1f} ms, index search "
                     f"{lat['search']:.2f} ms) &middot; <a href=\"/api/search?"
                     f"{escape(urlencode({'q': query, 'k': k}))}\">JSON</a></p>")
        parts.append("<ol id=\"results\">")
        for r in result["results"]:
            url = thumbnails.get(r["item"])
            img = (f"<img src=\"{escape(url)}\" alt=\"{escape(r['name'])}\" loading=\"lazy\">" if url
                   else "no thumbnail")
            parts.append(f"<li class=\"result\" data-rank=\"{r['rank']}\" data-score=\"{r['score']:.6f}\">"
                         f"<div class=\"thumb\">{img}</div><div class=\"meta\"><span class=\"rank\">"
                         f"#{r['rank']}</span><span class=\"score\">{r['score']:.4f}</span>"
                         f"<div class=\"name\" title=\"{escape(r['name'])}\">{escape(r['name'])}</div></div></li>")
        parts.append("</ol>")
    parts.append("</main></body></html>")
    return "".join(parts)
