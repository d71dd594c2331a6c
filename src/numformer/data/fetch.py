"""Where the public datasets are found, and downloads that are checked and cached (with ``pooch``).

A task that reads a public dataset (imdb, agnews, multi30k) looks for each of
its files in this order, and uses the first it finds:

1. the config's ``[data] path`` (handled by the task: nothing here is consulted);
2. the data folder named by the environment variable ``NUMFORMER_DATA``, laid
   out as the registry's paths say (``aclImdb_v1.tar.gz``, ``ag_news_csv/test.csv``,
   ``multi30k/train.de.gz``, ...);
3. the cache, ``pooch.os_cache("numformer")`` (``~/.cache/numformer`` on Linux),
   or the folder named by ``NUMFORMER_CACHE``; it has the same layout, so it
   can itself serve as a data folder;
4. a stand-in in the data folder, where the registry accepts one (the extracted
   ``aclImdb`` folder for the IMDB tarball, ``train_subset_20k.csv`` for the
   full AG News training set);
5. a download from the official URL into the cache, announced with its URL and
   size, with a progress bar, and checked against the registry's hash. A file
   that fails the check is deleted (nothing is cached); an interrupted download
   leaves no partial file (pooch's temporary file of a process killed outright
   is removed by the next download into that folder).

Downloads into one cache folder take turns (``cache_lock``: a lock file beside the files), so processes sharing
a cache check, replace and download each file one at a time. A cache folder that cannot be written is one line
naming it and ``NUMFORMER_CACHE``, which moves the cache.

``NUMFORMER_DATA_MIRROR`` replaces every official URL by ``MIRROR/<path>``
(a server holding a copy of the data folder; the tests serve one on 127.0.0.1);
it must be an http(s):// URL. ``NUMFORMER_CACHE`` must not be a file.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .._install import install_hint
from .notices import is_quiet

DATA_ENV = "NUMFORMER_DATA"
CACHE_ENV = "NUMFORMER_CACHE"
MIRROR_ENV = "NUMFORMER_DATA_MIRROR"
TIMEOUT_S = 30                      # seconds without an answer before a download is given up
LOCK_NAME = ".numformer-download.lock"  # in a cache folder while a process checks or downloads a file there
POOCH_TEMP = re.compile(r"tmp[a-z0-9_]{8}")     # pooch's temporary download (tempfile's name, no suffix)


class DataUnavailable(ValueError):
    """A dataset file could not be found locally nor downloaded (the message says where to put it)."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset: its place in a data folder, where it comes from, its hash and size."""

    path: str                      # inside a data folder and the cache, e.g. "ag_news_csv/train.csv"
    url: str                       # the official source
    known_hash: str                # "md5:..." or "sha256:..." (pooch's format)
    size: int                      # bytes
    exact_size: bool = True        # False: an estimate (shown as "about ...")
    stand_ins: tuple = ()          # paths in the data folder accepted in its place when it is nowhere local


@dataclass(frozen=True)
class Dataset:
    name: str
    title: str
    files: tuple

    def file(self, path: str) -> RemoteFile:
        for f in self.files:
            if f.path == path:
                return f
        raise ValueError(f"{self.name} has no file {path!r} in the registry; its files: "
                         f"{[f.path for f in self.files]}")


_AG = "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv"
_M30K = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
# Multi30k hashes and sizes: measured on byte-identical copies of the official files.
_M30K_FILES = {
    "train.de.gz": ("81ff90b99829c0cd4b1b587d394afd39", 637044),
    "train.en.gz": ("0065d13af80720a55ca8153d126e6627", 568929),
    "val.de.gz": ("6e0e229eb049e3fc99a1ef02fb2d5f91", 24681),
    "val.en.gz": ("2b69aa9253948ac9f67e94917272dd40", 21650),
    "test_2016_flickr.de.gz": ("efd67d314d98489b716b145475101932", 22890),
    "test_2016_flickr.en.gz": ("ff2c0fcb4893a13bd73414306bc250ae", 21077),
}

REGISTRY: dict[str, Dataset] = {d.name: d for d in (
    Dataset("imdb", "IMDB movie reviews (Maas et al. 2011): 25,000 train + 25,000 test, plus 50,000 unlabelled", (
        RemoteFile("aclImdb_v1.tar.gz", "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
                   "md5:7c2ac02c03563afcf9b574c7e56c153a", 84125825, stand_ins=("aclImdb",)),)),
    Dataset("agnews", "AG News topics (Zhang et al. 2015): 120,000 train + 7,600 test rows, 4 classes", (
        RemoteFile("ag_news_csv/train.csv", f"{_AG}/train.csv", "md5:b1a00f826fdfbd249f79597b59e1dc12",
                   29_500_000, exact_size=False, stand_ins=("ag_news_csv/train_subset_20k.csv",)),
        RemoteFile("ag_news_csv/test.csv", f"{_AG}/test.csv", "md5:d52ea96a97a2d943681189a97654912d", 1857427),
        RemoteFile("ag_news_csv/classes.txt", f"{_AG}/classes.txt", "md5:eb57fd781a350c341c55d4dcfc46782a", 31))),
    Dataset("multi30k", "Multi30k task 1, German-English: 29,000 / 1,014 / 1,000 sentence pairs", tuple(
        RemoteFile(f"multi30k/{name}", f"{_M30K}/{name}", f"md5:{md5}", size)
        for name, (md5, size) in _M30K_FILES.items())),
)}


# ------------------------------------------------------------------------------------------------ places
def data_dir() -> Path | None:
    """The folder named by NUMFORMER_DATA (None when unset or empty); an error if it is not a folder."""
    value = os.environ.get(DATA_ENV, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataUnavailable(f"{DATA_ENV} = {value!r} is not a folder; point it at a folder of datasets "
                              f"(laid out as `numformer data list` shows) or unset it")
    return path


def cache_dir() -> Path | None:
    """NUMFORMER_CACHE, else pooch's per-user cache folder for numformer (None without pooch)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value:
        path = Path(value).expanduser()
        # the folder is made on first download, but a file on its path would only fail then, deep inside
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            where = "" if blocker == path else f" ({blocker} is a file)"
            raise DataUnavailable(f"{CACHE_ENV} = {value!r} is not a folder{where}; point it at a folder "
                                  f"for downloads (made if missing) or unset it")
        return path
    # pooch.os_cache's folder, read from platformdirs (a dependency of pooch): importing pooch itself loads
    # tqdm.auto, which warns in a notebook without ipywidgets although nothing is downloaded
    if importlib.util.find_spec("pooch") is None:
        return None
    import platformdirs
    return Path(platformdirs.user_cache_dir("numformer"))


def source_url(f: RemoteFile) -> str:
    """The official URL, or MIRROR/<path> when NUMFORMER_DATA_MIRROR is set (an error unless http(s)://)."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    if mirror and not re.match(r"https?://[^/\s]", mirror, re.IGNORECASE):
        raise DataUnavailable(f"{MIRROR_ENV} = {mirror!r} is not an http:// or https:// URL; give the "
                              f"server's URL (e.g. http://127.0.0.1:8000/data), or for a local folder of "
                              f"datasets unset it and set {DATA_ENV} to that folder")
    return f"{mirror.rstrip('/')}/{f.path}" if mirror else f.url


def human_size(f_or_bytes) -> str:
    n = f_or_bytes.size if isinstance(f_or_bytes, RemoteFile) else int(f_or_bytes)
    about = "about " if isinstance(f_or_bytes, RemoteFile) and not f_or_bytes.exact_size else ""
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{about}{n:,} {unit}" if unit == "bytes" else f"{about}{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def find_local(f: RemoteFile) -> tuple[Path, str] | None:
    """(path, "data folder" | "cache" | "stand-in") of the first local copy of ``f``, or None."""
    data, cache = data_dir(), cache_dir()
    places = [(data, f.path, "data folder"), (cache, f.path, "cache")]
    places += [(data, s, "stand-in") for s in f.stand_ins]
    for base, rel, kind in places:
        if base is not None and (base / rel).exists():
            return base / rel, kind
    return None


# ------------------------------------------------------------------------------------------------ download
def download(f: RemoteFile, quiet: bool = False) -> Path:
    """Download ``f`` into the cache with pooch (progress bar, hash check); returns its path.

    An existing cached copy is re-checked and kept when its hash matches (no request is made, nothing written).
    Otherwise the check and download happen holding the cache folder's lock (``cache_lock``), after removing
    pooch's leftovers there: a copy another process fixed meanwhile is kept; one that fails its hash is removed
    first, and the one-line DataUnavailable of a failed download then says so. Raises DataUnavailable with one
    line naming the URL and where to put the file by hand, or naming the cache folder when it is not writable.
    """
    cache = cache_dir()
    if cache is None:
        return _download(f, quiet)                  # says that downloading needs pooch
    target = cache / f.path
    if target.is_file() and _hash_ok(target, f):
        return target
    new_dirs = [d for d in (target.parent, *target.parent.parents) if not d.exists()]
    try:
        with cache_lock(target.parent):
            _remove_leftovers(target.parent)
            return _download_again(f, target, quiet)
    except DataUnavailable:
        _remove_empty(new_dirs)
        raise
    except OSError as e:                            # the cache folder or its lock file cannot be made
        _remove_empty(new_dirs)
        raise DataUnavailable(f"the cache folder {cache} is not writable ({e.strerror or e}), so {f.path} cannot "
                              f"be downloaded into it: set {CACHE_ENV} to a writable folder, or download "
                              f"{source_url(f)} by hand into a folder of datasets as {f.path} and set {DATA_ENV} "
                              f"to that folder") from None


def _download_again(f: RemoteFile, stale: Path, quiet: bool) -> Path:
    """Download ``f`` to ``stale`` (its place in the cache; the cache folder's lock held), removing first a copy
    there that fails its hash; a copy that passes it (another process downloaded it meanwhile) is kept."""
    if not stale.is_file() or _hash_ok(stale, f):
        return _download(f, quiet)
    stale.unlink()
    try:
        path = _download(f, quiet)
    except DataUnavailable as e:
        raise DataUnavailable(f"the cached {stale} failed its hash check ({f.known_hash}) and was removed; "
                              f"downloading it again failed: {e}") from None
    print(f"numformer: the cached {stale} does not match its hash {f.known_hash}; it was deleted and downloaded "
          f"again", file=sys.stderr)
    return path


def _download(f: RemoteFile, quiet: bool) -> Path:
    cache = cache_dir()
    url = source_url(f)
    quiet = quiet or is_quiet()
    try:
        import pooch
    except ImportError:
        raise DataUnavailable(f"{f.path} is not in the data folder nor the cache, and downloading it needs "
                              f"pooch: {install_hint('data', 'pooch')}; or download {url} by hand and set "
                              f"{DATA_ENV} to the folder holding {f.path})") from None
    target = cache / f.path
    by_hand = (f"download it by hand to {target} (or to $NUMFORMER_DATA/{f.path}), "
               f"or set [data] path to your copy")
    if not quiet and not target.exists():
        print(f"numformer: downloading {f.path} ({human_size(f)}) from {url} to {target}", file=sys.stderr)
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel("WARNING")                      # our line above replaces pooch's own announcement
    bar = None if quiet else ProgressBar()
    try:
        downloader = pooch.HTTPDownloader(progressbar=bar or False, timeout=TIMEOUT_S)
        return Path(pooch.retrieve(url, known_hash=f.known_hash, fname=target.name, path=target.parent,
                                   downloader=downloader))
    except ValueError as e:                          # pooch: hash mismatch (the download is deleted)
        if "hash" not in str(e):
            raise DataUnavailable(f"cannot download {url} ({e}); {by_hand}") from None
        got = re.search(r"but got (\w+)", str(e))
        raise DataUnavailable(f"{url} does not match its known hash {f.known_hash}"
                              + (f" (got {got.group(1)})" if got else "")
                              + f": the download was deleted and nothing was cached; try again, or {by_hand}"
                              ) from None
    except Exception as e:                           # requests' connection errors, HTTP errors, timeouts
        if not _is_network_error(e):
            raise
        raise DataUnavailable(f"cannot download {url} ({_reason(e)}); {by_hand}") from None
    finally:
        if bar is not None:
            bar.close()                             # before the error line, not when the bar is collected
        logger.setLevel(level)


class ProgressBar:
    """pooch's progress bar (a tqdm bar on stderr, as pooch draws it) made on the first bytes and closed by its
    owner whatever happens: pooch closes its own only after a complete download, so a broken one left it to be
    drawn when collected, after the error line."""

    def __init__(self):
        self.total, self._bar = None, None

    def update(self, n):
        if self._bar is None:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=self.total, ncols=79, ascii=sys.platform == "win32", unit="B", unit_scale=True,
                             leave=True)
        self._bar.update(n)

    def reset(self):
        if self._bar is not None:
            self._bar.reset()

    def close(self):
        if self._bar is not None:
            self._bar.close()


@contextlib.contextmanager
def cache_lock(folder: Path):
    """Hold ``folder``'s download lock (``LOCK_NAME``, made with the folder if missing; removed on release) for the
    ``with``: processes sharing a cache check and download its files one at a time (before: each removed a copy
    failing its hash, and the others' checks found it gone). Without fcntl nor msvcrt, no lock."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock(fd)
            if _same_file(fd, path):
                break                   # else its holder removed it meanwhile: lock the file there now
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)             # while still held, so that no process locks the removed file
        os.close(fd)


def _lock(fd):
    """Wait for an exclusive lock on the open file ``fd`` (released when it is closed)."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    try:
        import msvcrt
    except ImportError:         # pragma: no cover - neither POSIX nor Windows
        return
    while True:
        try:
            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)       # gives up after 10 s: try again
            return
        except OSError:
            continue


def _same_file(fd, path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _remove_leftovers(folder: Path):
    """Remove pooch's temporary files in ``folder`` (the cache folder's lock held, so no download of this
    process's or another's is writing one): those of a download killed outright (SIGKILL, power loss), which
    pooch could not remove."""
    with os.scandir(folder) as entries:
        for e in entries:
            if POOCH_TEMP.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(e.path)


def _remove_empty(folders):
    """Remove the folders a failed download created (innermost first), if they are still empty."""
    for d in folders:
        try:
            d.rmdir()
        except OSError:
            return


def _is_network_error(e: Exception) -> bool:
    try:
        import requests
    except ImportError:      # pragma: no cover - pooch depends on requests
        return isinstance(e, OSError)
    return isinstance(e, (requests.exceptions.RequestException, OSError))


def _reason(e: Exception) -> str:
    """A short reason: the HTTP status, or the message of the innermost cause of a connection error."""
    response = getattr(e, "response", None)
    if response is not None:
        return f"HTTP {response.status_code} {response.reason}"
    inner = e
    for _ in range(8):                  # requests -> urllib3 MaxRetryError -> its reason (NewConnectionError ...)
        reason = getattr(inner, "reason", None)
        nxt = reason if isinstance(reason, BaseException) else (
            inner.args[0] if inner.args and isinstance(inner.args[0], BaseException) else None)
        if nxt is None:
            break
        inner = nxt
    text = inner.args[0] if inner.args and isinstance(inner.args[0], str) else str(inner)
    return re.sub(r"^<[^>]*>:\s*", "", text)[:200].strip() or type(inner).__name__


# ------------------------------------------------------------------------------------------------ API
def dataset(name: str) -> Dataset:
    if name not in REGISTRY:
        raise ValueError(f"no dataset {name!r} in the registry; choose one of {sorted(REGISTRY)}")
    return REGISTRY[name]


def locate(name: str, paths=None, quiet: bool = False) -> dict[str, Path]:
    """{registry path: local path} for the files of dataset ``name`` (all, or those in ``paths``).

    Each file is looked for in the data folder, the cache and the stand-ins (see the
    module docstring) and downloaded into the cache when it is nowhere local. A cached
    file is checked against its hash on every use (files in the data folder are trusted:
    the IMDB copy there may be a repack of the official tarball).
    """
    ds = dataset(name)
    files = ds.files if paths is None else [ds.file(p) for p in paths]
    out = {}
    for f in files:
        found = find_local(f)
        if found and found[1] == "cache" and not _hash_ok(found[0], f):
            found = None                    # download() removes it, and says so
        out[f.path] = found[0] if found else download(f, quiet=quiet)
    return out


def _hash_ok(path: Path, f: RemoteFile) -> bool:
    """Whether a cached file still has the registry's hash (True without pooch, which wrote it)."""
    try:
        import pooch
    except ImportError:
        return True
    alg, digest = f.known_hash.split(":", 1)
    try:
        return pooch.file_hash(str(path), alg=alg) == digest.lower()
    except FileNotFoundError:           # removed meanwhile by another process (which downloads it again)
        return False


def fetch(name: str, quiet: bool = False) -> list[tuple[str, Path, str]]:
    """Make every file of ``name`` available locally: [(registry path, local path, how)].

    A file already in the data folder is left there; any other is downloaded
    into the cache (or re-checked there, without a request, when cached).
    """
    out = []
    for f in dataset(name).files:
        data = data_dir()
        if data is not None and (data / f.path).exists():
            out.append((f.path, data / f.path, "in the data folder"))
            continue
        cache = cache_dir()
        was_cached = cache is not None and (cache / f.path).exists()
        path = download(f, quiet=quiet)
        out.append((f.path, path, "cached, hash checked" if was_cached else "downloaded, hash checked"))
    return out


def status(name: str) -> list[dict]:
    """One dict per file of ``name``: path, size, url, where (data folder / cache / stand-in / missing), local.
    The size is the local copy's when there is one, with the official size beside it where they differ (a data
    folder's file is not hash-checked: it may be a subset or another version; an estimated size differs by
    more than a tenth; a stand-in always), or "a folder" for an extracted one."""
    rows = []
    for f in dataset(name).files:
        found = find_local(f)
        size = human_size(f)
        if found and found[0].is_dir():
            size = f"a folder (official {human_size(f)})"
        elif found:
            here = found[0].stat().st_size
            differs = found[1] == "stand-in" or (here != f.size if f.exact_size else abs(here - f.size) > f.size / 10)
            size = f"{human_size(here)} (official {human_size(f)})" if differs else human_size(here)
        rows.append({"path": f.path, "size": size, "url": source_url(f),
                     "where": found[1] if found else "missing", "local": str(found[0]) if found else ""})
    return rows
