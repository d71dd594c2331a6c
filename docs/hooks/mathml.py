"""MkDocs hook: typeset the pages' LaTeX as MathML when the site is built (no JavaScript, no fonts).

``pymdownx.arithmatex`` (generic mode) finds ``$...$`` and ``$$...$$`` outside code and wraps them in
``<span class="arithmatex">\\(...\\)</span>`` / ``<div class="arithmatex">\\[...\\]</div>``; this hook
replaces each by the MathML of ``latex2mathml``, which every current browser renders offline.
A formula latex2mathml cannot read (an unknown command left as text) stops the build, naming it.
"""
from __future__ import annotations

import html
import re

from latex2mathml.converter import convert
from mkdocs.exceptions import PluginError

ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
DELIMITERS = {"span": (r"\(", r"\)"), "div": (r"\[", r"\]")}
# latex2mathml reads align* (a table) but not aligned inside a display; both mean the same here
ALIGNED = re.compile(r"\\(begin|end)\{aligned\}")
UNREAD = re.compile(r"<mi>(\\[A-Za-z]*|&amp;)</mi>")


def typeset(latex, display, where):
    latex = ALIGNED.sub(r"\\\1{align*}", latex)
    mathml = convert(latex, display="block" if display else "inline")
    unread = UNREAD.search(mathml)
    if unread:
        raise PluginError(f"{where}: latex2mathml cannot read {html.unescape(unread.group(1))!r} "
                          f"in ${latex}$; rewrite the formula with commands it knows")
    return mathml


def on_page_content(content, page, config, files):
    def replace(match):
        tag, body = match.group(1), html.unescape(match.group(2)).strip()
        start, end = DELIMITERS[tag]
        if not (body.startswith(start) and body.endswith(end)):
            raise PluginError(f"{page.file.src_uri}: unexpected arithmatex output {body[:60]!r}")
        mathml = typeset(body[len(start):-len(end)].strip(), tag == "div", page.file.src_uri)
        return f'<div class="math-display">{mathml}</div>' if tag == "div" else mathml

    return ARITHMATEX.sub(replace, content)
