"""An error that names a missing optional dependency says how to install it from numformer's checkout (numformer
is not on PyPI: ``pip install "numformer[mpi]"`` would fetch nothing, or a stranger's package)."""
from __future__ import annotations

import re
from pathlib import Path

from numformer._install import install_hint

SRC = Path(__file__).resolve().parents[1] / "src" / "numformer"


def test_the_hint_installs_the_checkouts_extra_or_the_package():
    assert install_hint("mpi", "mpi4py mpich") == \
        "pip install -e \".[mpi]\" in numformer's checkout (or pip install mpi4py mpich)"


def test_no_message_installs_numformer_from_an_index():
    found = [f"{path.relative_to(SRC)}:{n}" for path in sorted(SRC.rglob("*.py")) if path.name != "_install.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"numformer\[\w+\]", line)]
    assert not found, f"pip install 'numformer[extra]' fails (numformer is not on PyPI): use install_hint at {found}"
