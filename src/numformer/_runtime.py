"""Process-level settings that make NumPy training faster: ``numformer.set_fast_runtime()``.

Nothing here runs on import. ``set_fast_runtime()`` is called explicitly by the
benchmark and the trainer (and by users who want it); it never changes a
numerical result.

What it does (glibc only; elsewhere it is a no-op that says so):

* Raises malloc's mmap and trim thresholds (``mallopt``). By default glibc
  serves every block over 128 KiB with a fresh ``mmap`` and gives it back with
  ``munmap`` when freed, and trims the heap top after each large free. A
  training step allocates and frees hundreds of such arrays (activations,
  gradients, temporaries), so each one costs page faults and zeroing of fresh
  pages by the kernel: more time than the arithmetic on it. With the
  thresholds raised, freed blocks stay in the heap and are reused at once.
  The price: memory freed by NumPy is kept by the process (its peak resident
  size stays reserved) instead of being returned to the operating system.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

# Blocks below this size come from the heap and are reused; glibc caps the value at 32 MiB on 64-bit
# (HEAP_MAX_SIZE / 2), so larger arrays are still mmapped.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024
TOP_PAD = 64 * 1024 * 1024

_state = {"applied": False, "malloc": None}


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()             # only glibc has it (not musl)
        return libc
    except (OSError, AttributeError):
        return None


def set_fast_runtime(malloc=True):
    """Tune the process for NumPy training (see the module docstring). Idempotent; returns what was applied.

    malloc: raise glibc's mmap/trim thresholds so that large temporaries are
    reused instead of being mapped and unmapped at every step.

    Returns {"malloc": "glibc mallopt: ..." or the reason it was skipped}.
    """
    if malloc and _state["malloc"] is None:
        libc = _libc()
        if libc is None:
            _state["malloc"] = "skipped (not glibc)"
        else:
            ok = (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                  and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
                  and libc.mallopt(_M_TOP_PAD, TOP_PAD) == 1)
            _state["malloc"] = (f"glibc {libc.gnu_get_libc_version().decode()} mallopt: mmap threshold "
                                f"{MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB, "
                                f"top pad {TOP_PAD >> 20} MiB" if ok else "mallopt refused the settings")
        _state["applied"] = True
    return {"malloc": _state["malloc"] or "not requested"}


def fast_runtime_status():
    """What set_fast_runtime() has applied in this process (for benchmark reports)."""
    return {"malloc": _state["malloc"] or "default (set_fast_runtime() not called)"}
