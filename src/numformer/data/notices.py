"""The lines data preparation prints on stderr (downloads, a BPE being learnt, token files being written),
and the switch that silences them: ``numformer train --quiet`` (``Trainer(quiet=True)``) builds its task
inside ``quiet_data()``, since the task is made deep inside the config's resolution, far from the flag."""
from __future__ import annotations

import contextlib
import contextvars
import sys

_QUIET = contextvars.ContextVar("numformer_data_quiet", default=False)


@contextlib.contextmanager
def quiet_data(quiet: bool = True):
    """Within the block, data preparation prints nothing (when ``quiet``)."""
    token = _QUIET.set(bool(quiet))
    try:
        yield
    finally:
        _QUIET.reset(token)


def is_quiet() -> bool:
    """Whether the current code runs inside ``quiet_data()``."""
    return _QUIET.get()


def say(message: str) -> None:
    """One ``numformer: ...`` line on stderr, unless quiet."""
    if not is_quiet():
        print(f"numformer: {message}", file=sys.stderr, flush=True)
