"""The explorer's one HTML page: the template, its stylesheet and script inlined, the data embedded.

    html = render_page(data)                  # data: ``numformer.explorer.data.page_data``
    write_static_page("explorer.html", data)   # self-contained: opens from file://, no server, no network
    data = read_page_data("explorer.html")     # the data a written page embeds
    refresh_static_page("explorer.html")       # today's template, stylesheet and script around that data

The page is plain HTML, CSS and JavaScript (``assets/explorer.{html,css,js}`` beside this module): no library,
no font or script from elsewhere, so it works offline. The data travels in a ``<script type="application/json">``
element; every ``<`` in it is written ``\\u003c``, so no text of a token can end the element.
"""
from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path

from .._limits import MAX_JSON_BYTES, bounded_json
from .data import FORMAT

PLACEHOLDER = re.compile(r"\{\{(TITLE|CSS|JS|DATA)\}\}")
DATA_ELEMENT = re.compile(r'<script type="application/json" id="explorer-data">(.*?)</script>', re.S)


def _asset(name):
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def data_json(data):
    """The data as JSON that can sit inside a ``<script>`` element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c")


def render_page(data):
    """The whole page (a str) showing ``data``."""
    values = {"TITLE": html.escape(data["model"]["source"]), "CSS": _asset("explorer.css"),
              "JS": _asset("explorer.js"), "DATA": data_json(data)}
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], _asset("explorer.html"))


def write_static_page(path, data):
    """Write the page with ``data`` (its ``mode`` set to "static") to ``path`` (``check_static_path``; its
    missing folders made, as ``numformer train`` and ``export`` make their --out); returns the path."""
    path = check_static_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_page({**data, "mode": "static"}), encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path} cannot be written ({e.strerror or e}); give a path in a folder you can "
                         f"write to") from None
    return path


def check_static_path(path):
    """``path`` as a Path where a static page may be written: a name ending in .html, in a folder (or under
    one that exists) that takes new files, new or a page ``write_static_page`` wrote (numformer replaces only
    its own pages); a ValueError naming the problem and what to do otherwise."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"{path}: the static page is an HTML file; give a name ending in .html")
    _check_page_folder(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give the name of a new .html file (e.g. {path / 'explorer.html'})")
    if path.exists() and not is_explorer_page(path):
        raise ValueError(f"{path} exists and is not a page `numformer explore --static` wrote: numformer replaces "
                         f"only its own pages; give another name, or move the file away")
    return path


def _check_page_folder(path):
    """A ValueError when a file stands where a folder of ``path`` should be, or when its folder exists but
    takes no new file: tried, since a folder can refuse one whatever its permissions say (/proc, a read-only
    mount, or any folder for root)."""
    for p in path.parents:
        if p.exists() or p.is_symlink():
            break
    if not p.is_dir():
        raise ValueError(f"{path}: {p} is a file, not a folder; give a path in a folder")
    if p != path.parent or path.exists():
        return          # folders made later, or a page replaced: their writing names any failure
    try:
        path.open("x", encoding="utf-8").close()
        path.unlink()
    except OSError as e:
        raise ValueError(f"{path}: a new file cannot be made in the folder {p} ({e.strerror or e}); give a path "
                         f"in a folder you can write to") from None


def is_explorer_page(path):
    """Whether ``path`` is a file holding a page written by ``write_static_page``."""
    try:
        read_page_data(path)
    except ValueError:
        return False
    return True


def read_page_data(path):
    """The data a page written by ``write_static_page`` embeds (read within ``_limits``' bounds)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file() or size > MAX_JSON_BYTES:
            raise ValueError(f"{path} is not a page written by `numformer explore --static` (not a file, or larger "
                             f"than {MAX_JSON_BYTES:,} bytes)")
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} cannot be read as a page written by `numformer explore --static` ({e})") from None
    m = DATA_ELEMENT.search(text)
    if m is None:
        raise ValueError(f"{path} is not a page written by `numformer explore --static` (no explorer data in it)")
    return bounded_json(m.group(1), f"the explorer data of {path}")


def refresh_static_page(path):
    """Rewrite a page written by ``write_static_page`` with this numformer's template, stylesheet and script
    around the data it embeds (no model needed; the data's ``format`` must be today's). Returns the path."""
    data = read_page_data(path)
    if data.get("format") != FORMAT:
        raise ValueError(f"{path} holds data of format {data.get('format')}; this numformer writes format "
                         f"{FORMAT}: write the page again from its model with `numformer explore --static`")
    return write_static_page(path, data)


__all__ = ["render_page", "write_static_page", "read_page_data", "refresh_static_page", "data_json"]
