"""Bounds on the text numformer parses from files and arguments: its size and how deeply it nests.

Python's ``json`` and ``tomllib`` parsers recurse once per nested ``[`` or ``{``, so a file of 100,000 ``[``
ends in a RecursionError; a file of gigabytes would be read whole. Both are checked before the parser sees
the text: the nesting depth is counted over the brackets outside strings (one vectorized pass), which is at
least the depth the parser would reach.

    data = bounded_json(text, "config file run/config.json")     # ValueError naming it when out of bounds

A record numformer wrote (a run's summary.json, a results/*.json) is read with ``read_json_file`` and its
shape checked with ``check_record`` against a small schema, so that a damaged one is one line naming the file
and the key, never a KeyError or an AttributeError deep in the code that uses it:

    summary = check_record(read_json_file(path, "summary"), {"steps": int, "loss": NUMBER}, f"summary {path}")
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

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
    if text.count("[") + text.count("{") <= max_depth:        # it cannot nest deeper than its brackets
        return
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


def read_json_file(path, what, max_bytes=MAX_JSON_BYTES):
    """The JSON content of the file ``path``, read within the bounds (its size is checked before it is read);
    a file that cannot be read, is too large, is not UTF-8 or not JSON, or nests too deep is a ValueError
    naming ``what`` and the path."""
    path = Path(path)
    where = f"{what} {path}"
    try:
        size = os.stat(path).st_size
        if size > max_bytes:
            raise ValueError(f"{where} is {size:,} bytes, more than numformer reads ({max_bytes:,}); it is not a "
                             f"file numformer wrote: restore it")
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{where} cannot be read ({e.strerror or e})") from None
    return bounded_json(data, where, max_bytes)


# -- the shape of a record ------------------------------------------------------------------------------------
NUMBER = (int, float)          # a JSON number (never a boolean)


def _kind(value):
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _types(schema):
    """The types of a type schema, flat: ``(NUMBER, type(None))`` is (int, float, NoneType)."""
    if not isinstance(schema, tuple):
        return (schema,)
    return tuple(t for part in schema for t in _types(part))


def _expected(schema):
    if isinstance(schema, dict):
        return "an object"
    if isinstance(schema, list):
        return "a list"
    types = _types(schema)
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null",
             dict: "an object", list: "a list"}
    words = list(dict.fromkeys("a number" if t is int and float in types else names.get(t, t.__name__)
                               for t in types))
    return " or ".join(words)


def _fits(value, schema):
    types = _types(schema)
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def check_record(value, schema, where, key=""):
    """``value`` after checking it against ``schema``; ValueError ``"{where}: key K is ..., expected ..."`` at the
    first difference. A schema is a type or a tuple of types (``NUMBER``; ``float`` takes integers; a boolean
    is never a number), a dict of key -> schema (a key written ``"name?"`` may be absent, ``"*"`` stands for
    every key; other keys may exist), or a list ``[schema]`` (every item) or ``[schema, n]`` (at least n
    items)."""
    at = f"key {key!r}" if key else "the file"
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {at} is {_kind(value)}, expected an object; restore the file or "
                             f"write it again")
        if "*" in schema:
            for name, item in value.items():
                check_record(item, schema["*"], where, f"{key}.{name}" if key else name)
        for name, sub in schema.items():
            if name == "*":
                continue
            optional = name.endswith("?")
            name = name.rstrip("?")
            path = f"{key}.{name}" if key else name
            if name not in value:
                if optional:
                    continue
                raise ValueError(f"{where}: key {path!r} is missing; restore the file or write it again")
            check_record(value[name], sub, where, path)
        return value
    if isinstance(schema, list):
        if not isinstance(value, list):
            raise ValueError(f"{where}: {at} is {_kind(value)}, expected a list; restore the file or write it again")
        if len(value) < (schema[1] if len(schema) > 1 else 0):
            raise ValueError(f"{where}: {at} has {len(value)} items, expected at least {schema[1]}; restore the "
                             f"file or write it again")
        for i, item in enumerate(value):
            check_record(item, schema[0], where, f"{key}[{i}]")
        return value
    types = _types(schema)
    if float in types and int not in types:
        types = types + (int,)
    if not _fits(value, types):
        raise ValueError(f"{where}: {at} is {_kind(value)}, expected {_expected(types)}; restore the file or "
                         f"write it again")
    return value
