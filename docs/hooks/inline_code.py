"""MkDocs hook: inline code is not broken at its hyphens.

A browser may end a line after any hyphen, so `--group-size G` could show as "-" at the end of one line
and "-group-size G" on the next, which reads as a different flag. This hook wraps each run of inline code
that holds a hyphen and no space in ``<span class="nobr">`` (``white-space: nowrap`` in
stylesheets/extra.css): lines still break at the code's spaces, never inside a flag, a file name or a
number such as 1e-3. Copied text is unchanged (a span adds no characters).
"""
from __future__ import annotations

import re

INLINE_CODE = re.compile(r"<code>([^<]*)</code>")       # inline code: no attributes, no markup inside
HYPHENATED = re.compile(r"[^\s<>]*-[^\s<>]*")


def keep_hyphens(content):
    """``content`` (a page's HTML) with each hyphenated run of inline code wrapped in a nowrap span."""
    def wrap(match):
        body = HYPHENATED.sub(lambda m: f'<span class="nobr">{m.group(0)}</span>', match.group(1))
        return f"<code>{body}</code>"

    return INLINE_CODE.sub(wrap, content)


def on_page_content(content, page, config, files):
    return keep_hyphens(content)
