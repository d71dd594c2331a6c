"""What differs between Linux, macOS and Windows, in one place: the run-folder lock, stop signals, forked workers
(how many bytes a pipe still holds, which an MPI rank's abort waits on, and the CPU time another process used).

Everything else in numformer is portable Python (``pathlib``, text files opened
as UTF-8). Each function below looks up what the platform has instead of
assuming it, so importing numformer never fails for want of a POSIX module;
a feature a platform lacks is refused with one line when it is asked for.

The run-folder lock (``open_lock``, ``try_lock``, ``unlock``, ``close_lock``),
non-blocking, per process, released by the operating system when the process
ends (a crashed writer leaves no lock behind):

* POSIX (Linux, macOS): ``flock`` on the folder itself, shared (readers) or
  exclusive (the writer). Nothing is added to the folder.
* Windows (no ``fcntl``): ``msvcrt.locking`` byte-range locks on a file
  ``.numformer.lock`` in the folder (a folder cannot be opened as a file
  there). ``msvcrt`` has no shared mode, so readers and the writer share out
  bytes: the writer locks bytes ``0 .. READER_SLOTS``, a reader one byte of its
  own in ``1 .. READER_SLOTS``. Two readers take different bytes and do not
  conflict; a reader and the writer always overlap, and so do two writers.

The lock primitive is chosen by what imports (``fcntl``, else ``msvcrt``), not
by the platform's name, which is what lets the tests run the Windows branch on
Linux (tests/test_platform_simulation.py hides ``fcntl`` and supplies an
``msvcrt`` whose ``locking`` keeps the CRT's contract).
"""
from __future__ import annotations

import errno
import os
import signal
import stat
import sys

try:                                    # POSIX
    import fcntl
except ImportError:
    fcntl = None
try:                                    # Windows
    import msvcrt
except ImportError:
    msvcrt = None
try:                                    # POSIX: the unread-bytes count of a pipe
    from termios import FIONREAD
except ImportError:
    FIONREAD = None

LOCK_FILE = ".numformer.lock"           # Windows only: the file whose bytes carry a folder's lock
READER_SLOTS = 64                       # Windows only: readers that may hold one folder at once

_reader_slot: dict[int, int] = {}       # Windows: lock fd -> the byte a shared holder locked (absent: exclusive)


def name():
    """'Linux', 'macOS', 'Windows' or the platform's own name."""
    return {"linux": "Linux", "darwin": "macOS", "win32": "Windows", "cygwin": "Windows"}.get(sys.platform,
                                                                                              sys.platform)


# -- the run-folder lock -------------------------------------------------------------------------------------

def lock_target(folder):
    """The path whose file the lock of ``folder`` is held on: the folder itself (POSIX), its lock file (Windows)."""
    return os.fspath(folder) if fcntl is not None else os.path.join(folder, LOCK_FILE)


def open_lock(folder):
    """A file descriptor to hold ``folder``'s lock on (``folder`` exists); not inherited by child processes."""
    if fcntl is not None:
        return os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    if msvcrt is not None:
        return os.open(lock_target(folder), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOINHERIT", 0), 0o666)
    raise OSError(errno.ENOSYS, f"this platform ({name()}) has neither fcntl nor msvcrt, so numformer cannot lock "
                                f"a run folder; run numformer on Linux, macOS or Windows")


def try_lock(fd, exclusive):
    """Take (or convert to) a shared or exclusive lock on ``fd`` without waiting; False when another process holds
    a conflicting one."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True
    held = fd in _reader_slot
    if held and not exclusive:
        return True
    if held and exclusive:                  # shared -> exclusive: the whole range, our own byte released first
        slot = _reader_slot.pop(fd)
        _byte_unlock(fd, slot, 1)
        if _byte_lock(fd, 0, READER_SLOTS + 1):
            return True
        if not _byte_lock(fd, slot, 1):     # give the shared lock back (a writer may have slipped in between)
            raise OSError(errno.EAGAIN, "lost the shared lock of a run folder while converting it")
        _reader_slot[fd] = slot
        return False
    if exclusive:
        return _byte_lock(fd, 0, READER_SLOTS + 1)
    for slot in range(1, READER_SLOTS + 1):
        if _byte_lock(fd, slot, 1):
            _reader_slot[fd] = slot
            return True
    return False


def unlock(fd):
    """Release the lock held on ``fd`` (the descriptor stays open)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return
    slot = _reader_slot.pop(fd, None)
    if slot is None:
        _byte_unlock(fd, 0, READER_SLOTS + 1)
    else:
        _byte_unlock(fd, slot, 1)


def locked_folder_now(fd):
    """Where the folder whose lock ``fd`` holds is now: its path (it may have been moved or renamed), "" when it
    was deleted, None when the platform cannot tell.

    POSIX: ``fd`` is open on the folder itself, which the system keeps while it is open; a deleted folder has
    no link left (``st_nlink`` 0), and its current path is ``/proc/self/fd/N`` (Linux) or ``F_GETPATH``
    (macOS). Windows: ``fd`` is the lock file inside the folder, which Windows does not let be moved or
    deleted while open, so it cannot tell."""
    if fcntl is None:
        return None
    if os.fstat(fd).st_nlink == 0:
        return ""
    try:
        if sys.platform.startswith("linux"):
            now = os.readlink(f"/proc/self/fd/{fd}")
            return "" if now.endswith(" (deleted)") and not os.path.isdir(now) else now
        if hasattr(fcntl, "F_GETPATH"):
            return os.fsdecode(fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024)).split(b"\0", 1)[0])
    except OSError:
        pass
    return None


def close_lock(fd):
    """Close the descriptor of a lock (releasing it, if still held)."""
    _reader_slot.pop(fd, None)
    os.close(fd)


def _byte_lock(fd, start, count):
    os.lseek(fd, start, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, count)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EDEADLK, errno.EAGAIN):
            return False
        raise
    return True


def _byte_unlock(fd, start, count):
    os.lseek(fd, start, os.SEEK_SET)
    msvcrt.locking(fd, msvcrt.LK_UNLCK, count)


# -- signals and forked workers ------------------------------------------------------------------------------

def pipe_unread(fd):
    """The bytes written to the pipe ``fd`` that its reader has not taken yet; None when ``fd`` is not a pipe
    (a terminal, a file) or the platform cannot tell."""
    if fcntl is None or FIONREAD is None or not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return None
    unread = bytearray(4)
    fcntl.ioctl(fd, FIONREAD, unread)
    return int.from_bytes(unread, sys.byteorder)


def point_at_null_device(stream):
    """Point the file descriptor of ``stream`` (stdout, stderr) at the null device, after its reader went away
    (a closed pipe), so that nothing written to it fails again, the interpreter's flush at exit included (what
    the Python documentation advises for SIGPIPE). A stream without a descriptor (a test's, an IDE's) is left."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def signals(*names):
    """The signals of ``names`` this platform has (Windows has SIGTERM, not SIGHUP or SIGUSR1), in that order."""
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


def forked_workers_unavailable():
    """Why data-parallel workers (``os.fork``) cannot run here, with what to use instead; None on Linux.

    Linux only: macOS has ``fork``, but forking a process that has started threads (BLAS, numformer's own pool)
    is unsafe there, and Windows has no ``fork`` at all."""
    if sys.platform.startswith("linux") and hasattr(os, "fork"):
        return None
    return (f"data-parallel training forks worker processes, which numformer supports on Linux only (this is "
            f"{name()}{'' if hasattr(os, 'fork') else ', which has no fork'}); train in one process "
            f"(numformer's threads use every core) or across processes with MPI (mpiexec -n N numformer train)")


def process_cpu_seconds(pid):
    """CPU seconds (user + system) the process ``pid`` has used so far, from Linux's ``/proc/PID/stat``; None
    where that cannot be read (another platform, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()     # the command name, in parentheses, may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


MEMINFO = "/proc/meminfo"                                   # Linux: the kernel's memory figures
CGROUP_MEMORY = "/sys/fs/cgroup"                            # Linux: cgroup v2 (a container's memory limit)


def available_memory():
    """Bytes of memory a new allocation can still get on Linux: the kernel's estimate of what is available
    without swapping (MemAvailable) plus free swap, and no more than the room left under the cgroup's limit
    (cgroup v2 ``memory.max`` minus ``memory.current``, as in a container); None elsewhere or when unreadable."""
    try:
        with open(MEMINFO, encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        available = (int(fields["MemAvailable"].split()[0]) + int(fields.get("SwapFree", "0 kB").split()[0])) * 1024
    except (OSError, ValueError, KeyError, IndexError):
        return None
    try:
        with open(os.path.join(CGROUP_MEMORY, "memory.max"), encoding="ascii") as f:
            limit = f.read().strip()
        with open(os.path.join(CGROUP_MEMORY, "memory.current"), encoding="ascii") as f:
            used = int(f.read().strip())
        if limit != "max":
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available


FLAG_ON, FLAG_OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")     # env_flag's words, any case


def env_flag(name):
    """Whether the environment variable ``name`` (a yes-or-no setting) is on: 1, true, yes or on; off when
    unset, empty, 0, false, no or off (any case, spaces around ignored). Anything else is one ValueError naming
    the variable and the values it takes, rather than a guess."""
    value = os.environ.get(name, "")
    if value.strip().lower() in FLAG_ON:
        return True
    if value.strip().lower() in FLAG_OFF:
        return False
    raise ValueError(f"environment variable {name}={value!r} is neither on nor off: set it to 1 (or true, yes, "
                     f"on) or to 0 (or false, no, off), or unset it")


# Set on (``env_flag``) to load a model that ``check_memory`` finds too large for this machine.
NO_MEMORY_CHECK = "NUMFORMER_NO_MEMORY_CHECK"


def check_memory(source, need, weights):
    """One ValueError when loading ``source`` needs ``need`` bytes (its weights and the reading's temporaries;
    ``weights`` says what the weights are, for the message) and this machine has less left
    (``available_memory``): loading would end in the operating system killing the process, with no message.
    Nothing is checked where the memory left is unknown, or with NUMFORMER_NO_MEMORY_CHECK on (``env_flag``)."""
    if env_flag(NO_MEMORY_CHECK):
        return
    available = available_memory()
    if available is None:
        return
    if need > available:
        raise ValueError(f"{source} needs about {need / 2 ** 30:.1f} GiB of memory ({weights}), but this machine "
                         f"has {available / 2 ** 30:.1f} GiB left (free memory and swap); close other programs or "
                         f"use a machine with more memory (or set {NO_MEMORY_CHECK}=1 to try anyway)")
