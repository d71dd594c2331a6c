"""How an error says what to install. numformer is installed from its checkout (it is not on PyPI, so
``pip install numformer[hf]`` would fetch nothing, or a stranger's package): an optional dependency is the
extra of that checkout, or the package itself.

A feature that needs an optional package raises ``MissingDependency`` (an ImportError) naming the feature and
what to install; the command line prints it as one error line, where any other ImportError is a bug."""
from __future__ import annotations

import importlib.util

# import name -> (the extra of pyproject.toml that installs it, what pip installs without the checkout)
PROVIDED_BY = {
    "torch": ("test", "torch==2.13.0"),            # pinned: an unpinned torch is a multi-GB CUDA build
    "transformers": ("test", "transformers"),
    "tokenizers": ("nlp", "tokenizers"),
    "regex": ("nlp", "regex"),
    "sacrebleu": ("nlp", "sacrebleu"),
    "mpi4py": ("mpi", "mpi4py mpich"),
}


class MissingDependency(ImportError):
    """An optional package that a feature needs is not installed; the message says which, and how to install it."""


def install_hint(extra, packages):
    """'pip install -e ".[EXTRA]" in numformer's checkout (or pip install PACKAGES)', for an error message."""
    return f"pip install -e \".[{extra}]\" in numformer's checkout (or pip install {packages})"


def require(modules, feature):
    """MissingDependency '``feature`` needs M: install hint' when a module of ``modules`` (import names, keys of
    ``PROVIDED_BY``) is not installed; nothing is imported."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        extra = PROVIDED_BY[missing[0]][0]
        packages = " ".join(PROVIDED_BY[m][1] for m in missing)
        raise MissingDependency(f"{feature} needs {' and '.join(missing)}, not installed: "
                                f"{install_hint(extra, packages)}")
