"""Griffe extension for the API reference: doctest examples render as code, Sphinx roles as code.

Google-style docstrings here often show a ``>>>`` example in their description; Markdown would
read it as a paragraph (and ``r["R@1"]`` as a link reference). Each run of ``>>>`` / ``...`` lines
with its output (up to a blank line) becomes a fenced ``pycon`` block. Docstrings with an
``Examples:`` section are left to griffe, which renders that section itself. Sphinx roles
(``:func:`x.y```, ``:class:`~x.Y```) become code spans naming the object.
"""

from __future__ import annotations

import re

import griffe

_PROMPT = re.compile(r"^(\s*)>>> ")
_SECTION = re.compile(r"^\s*Examples?:\s*$", re.M)
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc):`~?([^`]+)`")


def plain_roles(text: str) -> str:
    """``:func:`~a.b``` -> ```a.b``` (a Markdown code span)."""
    return _ROLE.sub(lambda m: f"`{m.group(1)}`", text)


def fence_doctests(text: str) -> str:
    """``text`` with each bare doctest run wrapped in a fenced ``pycon`` block."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = _PROMPT.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent = m.group(1)
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFence(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        doc = obj.docstring
        if doc is None:
            return
        doc.value = plain_roles(doc.value)
        if ">>>" in doc.value and not _SECTION.search(doc.value):
            doc.value = fence_doctests(doc.value)
