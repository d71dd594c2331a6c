"""Simulated Windows: what Windows lacks is hidden from this interpreter before anything else runs.

Put this folder first on PYTHONPATH and every Python process started with it (and its children) runs as
numformer would on Windows, as far as Python's modules tell:

* the POSIX-only modules fcntl, resource, pwd, grp and termios cannot be imported;
* ``signal`` keeps only the signals Windows has (SIGINT, SIGTERM, SIGABRT, SIGFPE, SIGILL, SIGSEGV);
* ``os`` loses fork, register_at_fork, fchmod, chown, getuid, major/minor, O_DIRECTORY, O_CLOEXEC, ...;
* numformer._platform finds ``msvcrt``: the stand-in beside this file (_msvcrt_standin.py: byte-range
  locking with Windows' contract, on Linux's OFD locks). It is given to that module alone, while it
  imports: the standard library (subprocess, getpass) takes an importable ``msvcrt`` for "this is
  Windows" and would then need the rest of Windows (_winapi).

What it cannot hide: the file system (Linux paths, /proc) and ``sys.platform``, which stays "linux"
(numformer chooses by what imports, never by the platform's name). Libraries that choose their code
by ``sys.platform`` (torch) take their Linux path and need what is hidden here: list them in
NUMFORMER_SIM_PRELOAD (comma-separated) to import them before the hiding.
"""
import importlib.abc
import importlib.machinery
import os
import signal
import sys

import _msvcrt_standin  # imported while fcntl is still there

for _name in filter(None, os.environ.get("NUMFORMER_SIM_PRELOAD", "").split(",")):
    __import__(_name)

HIDDEN_MODULES = {"fcntl", "resource", "pwd", "grp", "termios"}
WINDOWS_SIGNALS = {"SIGINT", "SIGTERM", "SIGABRT", "SIGFPE", "SIGILL", "SIGSEGV"}
HIDDEN_OS = ("fork", "forkpty", "register_at_fork", "fchmod", "fchown", "chown", "lchown", "getuid", "geteuid",
             "getgid", "getegid", "getpwnam", "major", "minor", "makedev", "O_DIRECTORY", "O_CLOEXEC",
             "sched_getaffinity", "getloadavg")


class _HideModules(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in HIDDEN_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r} (simulated Windows)", name=name)
        return None


class _GiveMsvcrtToPlatform(importlib.abc.MetaPathFinder):
    """numformer._platform imports with the stand-in as ``msvcrt``; nothing else sees it."""

    def find_spec(self, name, path=None, target=None):
        if name != "numformer._platform":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                sys.modules["msvcrt"] = _msvcrt_standin
                try:
                    run(module)
                finally:
                    del sys.modules["msvcrt"]
            spec.loader.exec_module = exec_module
        return spec


for _name in HIDDEN_MODULES:
    sys.modules.pop(_name, None)
sys.meta_path[:0] = [_HideModules(), _GiveMsvcrtToPlatform()]
for _name in [n for n in dir(signal) if n.startswith("SIG") and not n.startswith("SIG_") and n not in WINDOWS_SIGNALS]:
    delattr(signal, _name)
for _name in HIDDEN_OS:
    if hasattr(os, _name):
        delattr(os, _name)
os.environ["NUMFORMER_SIMULATED_WINDOWS"] = "1"
