"""How an error says what to install. numformer is installed from its checkout (it is not on PyPI, so
``pip install numformer[hf]`` would fetch nothing, or a stranger's package): an optional dependency is the
extra of that checkout, or the package itself."""
from __future__ import annotations


def install_hint(extra, packages):
    """'pip install -e ".[EXTRA]" in numformer's checkout (or pip install PACKAGES)', for an error message."""
    return f"pip install -e \".[{extra}]\" in numformer's checkout (or pip install {packages})"
