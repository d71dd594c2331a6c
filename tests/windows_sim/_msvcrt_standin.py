"""A stand-in for Windows' ``msvcrt`` on Linux, for the simulated-Windows tests (see sitecustomize.py here).

It has only what numformer uses: ``locking(fd, mode, nbytes)`` with the C runtime's contract: lock or
unlock ``nbytes`` bytes from the file's current position; ``LK_NBLCK`` fails at once with
``OSError(EACCES)`` when another handle holds any of those bytes; a lock belongs to the handle (two
handles conflict even in one process) and goes when the handle is closed or its process ends.

Linux's open-file-description locks (``F_OFD_SETLK``) have exactly these properties, so they carry it.
(Two differences that numformer's code never meets: Windows refuses to lock a range twice through the
same handle and to unlock a range that is not locked; Linux allows both.)
"""
import errno
import fcntl
import os
import struct

LK_UNLCK, LK_LOCK, LK_NBLCK, LK_RLCK, LK_NBRLCK = 0, 1, 2, 3, 4


def locking(fd, mode, nbytes):
    start = os.lseek(fd, 0, os.SEEK_CUR)
    if mode == LK_UNLCK:
        kind = fcntl.F_UNLCK
    elif mode in (LK_NBLCK, LK_NBRLCK):        # Windows' "read" locks are exclusive too
        kind = fcntl.F_WRLCK
    else:
        raise ValueError("this stand-in never waits: use LK_NBLCK (numformer's lock never waits either)")
    # struct flock {short l_type; short l_whence; off_t l_start; off_t l_len; pid_t l_pid;}: l_pid 0 for OFD
    request = struct.pack("@hhqqi4x", kind, os.SEEK_SET, start, nbytes, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            raise OSError(errno.EACCES, "Permission denied") from None       # what the CRT reports
        raise
