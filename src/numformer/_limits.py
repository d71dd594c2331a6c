"""Bounds on the text numformer parses from files and arguments: its size and how deeply it nests.

Python's ``json`` and ``tomllib`` parsers recurse once per nested ``[`` or ``{``, so a file of 100,000 ``[``
ends in a RecursionError; a file of gigabytes would be read whole. Both are checked before the parser sees
the text: the nesting depth is counted over the brackets outside strings (one vectorized pass), which is at
least the depth the parser would reach.

    data = bounded_json(text, "config file run/config.json")     # ValueError naming it when out of bounds
"""
from __future__ import annotations

import json
import re

import numpy as np

MAX_DEPTH = 100              # no file numformer reads nests deeper than about 10 levels
MAX_JSON_BYTES = 256 << 20   # config.json, tokenizer.json (a large Hugging Face one is ~10 MB), metadata

_JSON_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_TOML_STRINGS = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*')


def nesting_depth(text: str, strings=_JSON_STRINGS) -> int:
    """The deepest nesting of ``[``/``{`` in ``text`` outside the strings (and comments) ``strings`` matches."""
    code = strings.sub("", text).encode("utf-8", "surrogatepass")
    b = np.frombuffer(code, dtype=np.uint8)
    if b.size == 0:
        return 0
    step = np.isin(b, (ord("["), ord("{"))).astype(np.int64) - np.isin(b, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


def check_bounds(text, where, toml=False, max_bytes=MAX_JSON_BYTES, max_depth=MAX_DEPTH,
                 hint="it is not a file numformer wrote: restore it"):
    """ValueError naming ``where`` (and ending with ``hint``) when ``text`` is larger than ``max_bytes`` or nests
    deeper than ``max_depth``."""
    if len(text) > max_bytes:
        raise ValueError(f"{where} is {len(text):,} bytes, more than numformer reads ({max_bytes:,}); {hint}")
    depth = nesting_depth(text, _TOML_STRINGS if toml else _JSON_STRINGS)
    if depth > max_depth:
        raise ValueError(f"{where} nests {depth:,} levels deep (more than {max_depth}); {hint}")


def bounded_json(data, where, max_bytes=MAX_JSON_BYTES):
    """``json.loads(data)`` (bytes or str) after ``check_bounds``; bad UTF-8 or bad JSON is a ValueError naming
    ``where`` (its text ends with what to do)."""
    if isinstance(data, bytes):
        if len(data) > max_bytes:
            check_bounds(data, where, max_bytes=max_bytes)
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where} is not UTF-8 text ({e.reason} at byte {e.start}); restore it") from None
    check_bounds(data, where, max_bytes=max_bytes)
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON ({e}); restore it") from None
