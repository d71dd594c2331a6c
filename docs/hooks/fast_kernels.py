"""MkDocs hook: show a "The fast kernel" box only when the module it documents exists.

The tutorials show the reference function of ``numformer.ops`` (the code that is the equation) and,
folded under it, the speed path of ``numformer.kernels``::

    ??? note "The fast kernel"
        ::: numformer.kernels.normalization.layer_norm_backward

A box whose module cannot be found is left out of the page (the reference stays). A module that
exists without the named function still fails the strict build, as any broken API reference does.
"""
from __future__ import annotations

import importlib.util
import re

BOX = re.compile(r'^\?\?\? note "The fast kernel"\n((?:    .*\n|\n)+?)(?=\S|\Z)', re.M)
TARGET = re.compile(r"^    ::: ([\w.]+)", re.M)


def module_exists(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def on_page_markdown(markdown, page, config, files):
    def keep_or_drop(match):
        target = TARGET.search(match.group(1))
        if target and module_exists(target.group(1).rpartition(".")[0]):
            return match.group(0)
        return ""

    return BOX.sub(keep_or_drop, markdown)
