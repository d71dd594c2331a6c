"""The type and range of a config key (``Key``) and the check of one section (``check_section``).

Each section's rules live with the code that owns the section: ``[train]``
in ``numformer.config``, ``[model]`` in ``numformer.models`` (``model_keys``),
``[data]`` in ``numformer.data.base`` (``DATA_KEYS``, ``check_data_section``).
This module imports nothing of numformer's, so every layer may use it.
"""
from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass


def did_you_mean(words, choices):
    """' (did you mean 'n_layers'?)' for the close matches among ``choices`` of each of ``words`` (one word or a
    list), naming which word each is for when there are several; '' when none is close (``_meant``)."""
    if words is None:
        return ""
    words = [words] if isinstance(words, str) else list(words)
    choices = [str(c) for c in choices]
    matches = [(w, " or ".join(map(repr, m))) for w in words if isinstance(w, str) for m in [_meant(w, choices)] if m]
    if not matches:
        return ""
    if len(words) == 1:
        return f" (did you mean {matches[0][1]}?)"
    return " (did you mean " + ", ".join(f"{m} for {w!r}" for w, m in matches) + "?)"


def _meant(word, choices):
    """The choices ``word`` may have meant: the one it is but for the case, else the closest by spelling
    (difflib) when it is a typo of it (ratio 0.8), else the names that hold it as a part, closest first
    ('steps': 'max_steps' or 'decay_steps' or 'warmup_steps'; at most three), else the closest by spelling
    above 0.6."""
    same = [c for c in choices if c.lower() == word.lower()]
    if same:                                                    # 'Q_proj': only the case is wrong
        return same[:1]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close and difflib.SequenceMatcher(None, word, close[0]).ratio() >= 0.8:
        return close
    holding = sorted((c for c in choices if word in c.split("_")),
                     key=lambda c: -difflib.SequenceMatcher(None, word, c).ratio())
    return holding[:3] or close


# -- the type and range of a key --------------------------------------------------------------------------
# No integer of a config is larger: a count, a size or a seed beyond it overflows NumPy's 64-bit integers (an
# OverflowError, or "Maximum allowed dimension exceeded") before it could mean anything.
MAX_INT = 2 ** 53


@dataclass(frozen=True)
class Key:
    """What a config value may be: ``kind`` (int, float, bool, str, list), ``lo``/``hi`` bounds (``open``
    makes them strict), ``choices`` for a string or the entries of a list, ``none`` when null is allowed."""

    kind: type
    lo: float | None = None
    hi: float | None = None
    open: tuple = (False, False)
    choices: tuple | None = None
    none: bool = False
    item: type | None = None      # the type of a list's entries

    def describe(self):
        if self.kind is str and self.choices is not None:
            return f"one of {list(self.choices)}"
        what = {int: "an integer", float: "a number", bool: "a boolean", str: "a string",
                list: "a list", dict: "a table"}[self.kind]
        if self.item is not None:
            what += {int: " of integers", str: " of strings"}[self.item]
        parts = []
        if self.lo is not None and self.hi is not None:
            interval = f"{'(' if self.open[0] else '['}{self.lo:g}, {self.hi:g}{')' if self.open[1] else ']'}"
            return f"in {interval}" if self.kind is float else f"{what} in {interval}"
        if self.lo is not None:
            parts.append(f"{'>' if self.open[0] else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"{'<' if self.open[1] else '<='} {self.hi:g}")
        if self.choices is not None:
            parts.append(f"with entries among {list(self.choices)}")
        if self.kind is int and self.hi is None:
            parts.append("at most 2**53")
        return what + (" " + " and ".join(parts) if parts else "") + (" (or null)" if self.none else "")

    def check(self, where, key, value):
        """``value`` converted (an int where a float is expected); ValueError naming ``[where] key``."""
        if value is None and self.none:
            return None
        if not _has_kind(value, self.kind) or (self.item and not all(_has_kind(v, self.item) for v in value)):
            spelled = (" (TOML writes true and false in lowercase)" if self.kind is bool and isinstance(value, str)
                       and value.lower() in ("true", "false") else "")
            raise ValueError(f"[{where}] {key} = {value!r} should be {self.describe()}{spelled}")
        if self.kind is float:
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"[{where}] {key} = {value!r} should be a finite number")
        if not self._in_range(value):
            problem = "is not allowed" if self.choices is not None else "is out of range"
            hint = ""
            if self.choices is not None:
                hint = did_you_mean([v for v in value if v not in self.choices] if self.kind is list else value,
                                    self.choices)
            raise ValueError(f"[{where}] {key} = {value!r} {problem}{hint}; {key} must be {self.describe()}")
        return list(value) if self.kind is list else value

    def _in_range(self, v):
        if self.choices is not None:
            return (set(v) <= set(self.choices)) if self.kind is list else v in self.choices
        if self.kind is int and abs(v) > MAX_INT:
            return False
        if self.lo is not None and (v <= self.lo if self.open[0] else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.open[1] else v <= self.hi)


def _has_kind(value, kind):
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, (list, tuple))
    return isinstance(value, kind)


def positive(kind=int, none=False):
    return Key(kind, 0, open=(True, False), none=none) if kind is float else Key(kind, 1, none=none)


NONNEG_INT, NONNEG_FLOAT, FRACTION, BOOL, STR = Key(int, 0), Key(float, 0), Key(float, 0, 1), Key(bool), Key(str)


def _key_for(default):
    """The rule for a key known only by its default value."""
    if default is None or default is inspect.Parameter.empty:
        raise TypeError("a key without a default value of a known type needs a rule (a Key) in its section's rules")
    kind = next(k for k in (bool, int, float, str, list) if _has_kind(default, k))
    return {int: NONNEG_INT, float: Key(float)}.get(kind, Key(kind))


def check_section(where, values, rules, defaults=None):
    """Check one section's keys: none unknown, each of its type and range. Returns the converted values.

    ``rules``: {key: Key} for the keys with a known rule; ``defaults``: {key: default} for the valid keys
    (a key without a rule follows its default's type). Unknown keys raise one error listing the valid keys.
    """
    valid = rules if defaults is None else defaults
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in [{where}]{did_you_mean(unknown, valid)}; valid keys: "
                         f"{sorted(valid)}")
    out = {}
    for key, value in values.items():
        rule = rules.get(key) or _key_for(defaults[key])
        out[key] = rule.check(where, key, value)
    return out
