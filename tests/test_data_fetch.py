"""Datasets on a fresh machine: downloads (from a local http.server), hash checks, the cache, the lookup order.

No test reaches the internet: NUMFORMER_DATA_MIRROR points every download at a
server on 127.0.0.1 that serves a temporary folder (or a closed port). The real
registry entries are checked against ../shared/data (or $NUMFORMER_DATA) where
those files are byte-identical copies; those tests skip when it is absent.
"""
from __future__ import annotations

import concurrent.futures
import errno
import gc
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import src_env
from numformer.cli import main
from numformer.data import fetch as F
from numformer.data import make_task

pytest.importorskip("pooch", reason="downloads need pooch (the data extra)")

SHARED = Path(os.environ.get("NUMFORMER_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")
needs_shared = pytest.mark.skipif(not (SHARED / "multi30k").is_dir() or not (SHARED / "ag_news_csv").is_dir(),
                                  reason=f"shared datasets not found at {SHARED} (set NUMFORMER_DATA)")


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A server on 127.0.0.1 for a folder (root), recording each request path; paths in ``drop`` get the
    headers and half of the body, then the connection is closed. The cache is a fresh folder."""
    root = tmp_path / "mirror"
    root.mkdir()
    state = SimpleNamespace(root=root, requests=[], drop=set(), cache=tmp_path / "cache")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(state.root), **kwargs)

        def log_message(self, *args):
            pass

        def do_GET(self):
            state.requests.append(self.path)
            if self.path.lstrip("/") in state.drop:
                data = (state.root / self.path.lstrip("/")).read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[:len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv(F.MIRROR_ENV, state.url)
    monkeypatch.setenv(F.CACHE_ENV, str(state.cache))
    monkeypatch.delenv(F.DATA_ENV, raising=False)
    yield state
    server.shutdown()
    server.server_close()


def md5(data: bytes) -> str:
    return "md5:" + hashlib.md5(data).hexdigest()


@pytest.fixture
def toy(mirror, monkeypatch):
    """A two-file dataset "toy" in the registry, served by the mirror."""
    files = {"toy/a.txt": b"first file\n" * 50, "toy/b.txt": b"second file\n" * 20}
    (mirror.root / "toy").mkdir()
    for rel, data in files.items():
        (mirror.root / rel).write_bytes(data)
    ds = F.Dataset("toy", "a toy dataset", tuple(F.RemoteFile(rel, f"https://example.invalid/{rel}", md5(data),
                                                              len(data)) for rel, data in files.items()))
    monkeypatch.setitem(F.REGISTRY, "toy", ds)
    mirror.files = files
    return mirror


def cached_files(mirror):
    return sorted(str(p.relative_to(mirror.cache)) for p in mirror.cache.rglob("*") if p.is_file()) \
        if mirror.cache.exists() else []


# ------------------------------------------------------------------------------------------------ downloads
def test_first_use_downloads_and_verifies_then_no_request(toy, capsys):
    got = F.locate("toy")
    assert sorted(toy.requests) == ["/toy/a.txt", "/toy/b.txt"]
    for rel, data in toy.files.items():
        assert got[rel] == toy.cache / rel and got[rel].read_bytes() == data
    err = capsys.readouterr().err
    assert f"downloading toy/a.txt (550 bytes) from {toy.url}/toy/a.txt to {toy.cache / 'toy/a.txt'}" in err
    assert F.locate("toy") == got and len(toy.requests) == 2           # second use: no request
    assert [how for _, _, how in F.fetch("toy", quiet=True)] == ["cached, hash checked"] * 2
    assert len(toy.requests) == 2                                       # fetch re-checks the hash locally


def test_corrupted_download_is_rejected_and_nothing_cached(toy):
    (toy.root / "toy/a.txt").write_bytes(b"tampered\n" * 50)
    with pytest.raises(F.DataUnavailable) as e:
        F.locate("toy", ["toy/a.txt"], quiet=True)
    msg = str(e.value)
    assert f"{toy.url}/toy/a.txt does not match its known hash {md5(toy.files['toy/a.txt'])}" in msg
    assert f"(got {hashlib.md5((toy.root / 'toy/a.txt').read_bytes()).hexdigest()})" in msg
    assert "the download was deleted and nothing was cached" in msg
    assert cached_files(toy) == [] and not (toy.cache / "toy").exists()


def test_dropped_connection_leaves_no_partial_file(toy):
    toy.drop.add("toy/a.txt")
    with pytest.raises(F.DataUnavailable, match=r"cannot download .*toy/a\.txt"):
        F.locate("toy", ["toy/a.txt"], quiet=True)
    assert toy.requests == ["/toy/a.txt"] and cached_files(toy) == []


def test_offline_message_names_url_and_where_to_put_the_file(toy, monkeypatch):
    with socket.socket() as s:                                          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(F.MIRROR_ENV, f"http://127.0.0.1:{port}")
    with pytest.raises(F.DataUnavailable) as e:
        F.locate("toy", quiet=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"cannot download http://127.0.0.1:{port}/toy/a.txt (")
    assert f"download it by hand to {toy.cache / 'toy/a.txt'}" in msg and cached_files(toy) == []


def test_http_error_and_cli_error_line(toy, capsys):
    (toy.root / "toy/b.txt").unlink()
    assert main(["data", "fetch", "toy", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("numformer data: error: cannot download") and "HTTP 404" in err[0]
    assert cached_files(toy) == ["toy/a.txt"]                           # the good file stays cached
    assert main(["data", "fetch", "nothing"]) == 2
    assert "no dataset 'nothing' in the registry" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ lookup order
def agnews_folder(folder, n_per_class, name="train.csv"):
    """An AG News CSV folder with n_per_class training rows per class and 2 test rows per class."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = lambda n: "".join(f'"{c}","title {c} {i}","words of topic{c} and item {i}"\n'  # noqa: E731
                             for i in range(n) for c in (1, 2, 3, 4))
    (folder / name).write_text(rows(n_per_class))
    (folder / "test.csv").write_text(rows(2))
    (folder / "classes.txt").write_text("World\nSports\nBusiness\nSci/Tech\n")
    return folder


def cache_agnews(mirror, monkeypatch, n_per_class):
    """An AG News folder in the cache, with the registry's agnews entry hashed to match it."""
    folder = agnews_folder(mirror.cache / "ag_news_csv", n_per_class)
    real = F.REGISTRY["agnews"]
    files = tuple(F.RemoteFile(f.path, f.url, md5((mirror.cache / f.path).read_bytes()), f.size,
                               stand_ins=f.stand_ins) for f in real.files)
    monkeypatch.setitem(F.REGISTRY, "agnews", F.Dataset("agnews", real.title, files))
    return folder


def agnews_train_rows(path=""):
    t = make_task({"task": "agnews", "path": path, "val_size": 4, "min_freq": 1}, seed=0)
    return t.train_rows, t.describe()


def test_path_then_data_folder_then_cache(mirror, tmp_path, monkeypatch):
    cache_agnews(mirror, monkeypatch, 5)                                # the cache: 20 rows
    data = tmp_path / "data"
    agnews_folder(data / "ag_news_csv", 6)                              # the data folder: 24 rows
    own = agnews_folder(tmp_path / "own", 7)                            # [data] path: 28 rows
    assert agnews_train_rows()[0] == 20
    monkeypatch.setenv(F.DATA_ENV, str(data))
    rows, described = agnews_train_rows()
    assert rows == 24 and f"training file {data / 'ag_news_csv' / 'train.csv'} (24 rows)" in described
    assert agnews_train_rows(str(own))[0] == 28
    assert mirror.requests == []


def test_full_agnews_train_in_cache_beats_the_subset_in_the_data_folder(mirror, tmp_path, monkeypatch):
    data = tmp_path / "data"
    agnews_folder(data / "ag_news_csv", 3, name="train_subset_20k.csv")
    monkeypatch.setenv(F.DATA_ENV, str(data))
    rows, described = agnews_train_rows()                               # only the subset: it stands in
    assert rows == 12 and "train_subset_20k.csv (12 rows)" in described
    cache_agnews(mirror, monkeypatch, 5)
    assert agnews_train_rows()[0] == 20 and mirror.requests == []


def test_data_folder_must_exist(monkeypatch, tmp_path):
    monkeypatch.setenv(F.DATA_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="NUMFORMER_DATA = .*nowhere' is not a folder"):
        make_task({"task": "multi30k"}, seed=0)


@pytest.mark.parametrize("below", ["", "sub"])
def test_cache_must_be_a_folder(toy, capsys, monkeypatch, tmp_path, below):
    """NUMFORMER_CACHE on a file (or below one) is one error naming it, before any download."""
    a_file = tmp_path / "tiny.toml"
    a_file.write_text("[model]\n", encoding="utf-8")
    monkeypatch.setenv(F.CACHE_ENV, str(a_file / below if below else a_file))
    for argv in (["data", "fetch", "toy"], ["data", "list"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"NUMFORMER_CACHE = '{a_file}" in err[0], err
        assert "is not a folder" in err[0] and "or unset it" in err[0]
    assert toy.requests == []
    with pytest.raises(F.DataUnavailable, match="NUMFORMER_CACHE"):
        make_task({"task": "text", "path": str(a_file), "tokenizer": "bpe", "vocab_size": 260}, seed=0)


@pytest.mark.parametrize("value", ["127.0.0.1:18731/good", "/srv/data", "ftp://host/data"])
def test_mirror_needs_an_http_url(toy, capsys, monkeypatch, value):
    monkeypatch.setenv(F.MIRROR_ENV, value)
    assert main(["data", "fetch", "toy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"NUMFORMER_DATA_MIRROR = {value!r} is not an http:// or https:// URL" in err[0]
    assert "set NUMFORMER_DATA to that folder" in err[0] and "by hand" not in err[0]
    assert toy.requests == [] and cached_files(toy) == []


def test_multi30k_other_languages_need_a_path(mirror):
    with pytest.raises(FileNotFoundError, match=r"registry holds Multi30k.*de and en only.*Set \[data\] path"):
        make_task({"task": "multi30k", "src_lang": "fr"}, seed=0)


def test_data_list(toy, capsys, monkeypatch, tmp_path):
    F.locate("toy", ["toy/a.txt"], quiet=True)
    capsys.readouterr()
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert f"cache:       {toy.cache}" in out and "toy: a toy dataset; 790 bytes; partly here" in out
    assert "cached" in out and str(toy.cache / "toy/a.txt") in out and f"{toy.url}/toy/b.txt" in out
    for name in ("imdb", "agnews", "multi30k"):
        assert f"\n{name}: " in out


def test_data_list_shows_the_size_of_the_file_here(toy, capsys, monkeypatch, tmp_path):
    """A data folder's file is used as it is (no hash check): the list shows its size, and the official one
    beside it where they differ (a subset, another version)."""
    data = tmp_path / "data"
    (data / "toy").mkdir(parents=True)
    (data / "toy/a.txt").write_bytes(toy.files["toy/a.txt"][:100])
    (data / "toy/b.txt").write_bytes(toy.files["toy/b.txt"])
    monkeypatch.setenv(F.DATA_ENV, str(data))
    assert main(["data", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  toy/")}
    assert "100 bytes (official 550 bytes)  in the data folder" in rows["toy/a.txt"]
    assert " 240 bytes  in the data folder" in rows["toy/b.txt"] and "official" not in rows["toy/b.txt"]
    (data / "toy/a.txt").unlink()
    (data / "toy/a.txt").mkdir()                                   # an extracted copy
    monkeypatch.setitem(F.REGISTRY, "toy", F.Dataset("toy", "t", (
        F.REGISTRY["toy"].files[0], F.RemoteFile("toy/b.txt", "https://example.invalid/b", "md5:0", 2400,
                                                 exact_size=False))))
    assert main(["data", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  toy/")}
    assert "a folder (official 550 bytes)" in rows["toy/a.txt"]
    assert "240 bytes (official about 2.4 kB)" in rows["toy/b.txt"]           # an estimate, off by far more


def test_train_quiet_prints_no_download_line(mirror, monkeypatch, tmp_path, run_cli):
    """--quiet reaches the task's download (made while the config is resolved): nothing on stderr."""
    agnews_folder(mirror.root / "ag_news_csv", 8)
    real = F.REGISTRY["agnews"]
    files = tuple(F.RemoteFile(f.path, f.url, md5((mirror.root / f.path).read_bytes()), f.size)
                  for f in real.files)
    monkeypatch.setitem(F.REGISTRY, "agnews", F.Dataset("agnews", real.title, files))
    cfg = tmp_path / "ag.toml"
    cfg.write_text('[model]\ntype = "classifier"\nn_layers = 1\nn_heads = 2\nd_model = 16\n'
                   '[data]\ntask = "agnews"\nmax_len = 16\nval_size = 4\nmin_freq = 1\n'
                   '[train]\nmax_steps = 2\nbatch_size = 4\neval_every = 2\nprocesses = 1\n', encoding="utf-8")
    rc, out, err = run_cli("train", cfg, "--out", tmp_path / "run", "--quiet")
    assert rc == 0 and err == "" and out == "", err
    assert sorted(mirror.requests) == ["/ag_news_csv/classes.txt", "/ag_news_csv/test.csv",
                                       "/ag_news_csv/train.csv"]


# ------------------------------------------------------------------------------------------------ real entries
@needs_shared
def test_registry_hashes_match_the_shared_copies():
    """AG News test.csv and the Multi30k files in ../shared/data are byte-identical to the official ones."""
    checked = [F.REGISTRY["agnews"].file("ag_news_csv/test.csv"), *F.REGISTRY["multi30k"].files]
    for f in checked:
        data = (SHARED / f.path).read_bytes()
        alg, digest = f.known_hash.split(":")
        assert hashlib.new(alg, data).hexdigest() == digest, f.path
        assert len(data) == f.size, f.path


@needs_shared
def test_multi30k_fetched_through_pooch_with_the_real_hashes(mirror, capsys):
    """The whole path with the real registry entries: served from a copy, hash-checked, cached, then used."""
    mirror.root = SHARED                                                # serve the shared folder itself
    assert main(["data", "fetch", "multi30k", "--quiet"]) == 0
    assert len(mirror.requests) == 6 and len(cached_files(mirror)) == 6
    t = make_task({"task": "multi30k", "n_train": 50, "n_eval": 5}, seed=0)
    assert [len(t.sources(s)) for s in ("train", "val", "test")] == [50, 5, 5] and len(mirror.requests) == 6
    assert json.loads(json.dumps(t.tokenizer_state()))


def test_reproduce_agnews_says_which_training_set(mirror, tmp_path, monkeypatch):
    """Without a path, agnews takes the data folder's subset when the full set is nowhere, and says so."""
    data = tmp_path / "data"
    agnews_folder(data / "ag_news_csv", 12, name="train_subset_20k.csv")
    monkeypatch.setenv(F.DATA_ENV, str(data))
    results = tmp_path / "results"
    assert main(["reproduce", "agnews", "--quick", "--results", str(results), "--runs", str(tmp_path / "runs"),
                 "--quiet", "--set", "data.val_size=8", "--set", "train.max_steps=2"]) == 0
    record = json.loads((results / "agnews.json").read_text())
    assert record["figures"]["train_rows"] == 48
    subset = data / "ag_news_csv" / "train_subset_20k.csv"
    assert f"training file {subset} (48 rows)" in record["task"]
    md = (results / "agnews.md").read_text()
    assert f"**Training set**: {subset} (48 rows): not the full 120,000-row training set" in md
    assert mirror.requests == []


def test_imdb_downloaded_in_the_official_layout(mirror, monkeypatch, capsys):
    """The official tarball also holds 50,000 unlabelled reviews and bag-of-words files: they are skipped."""
    from test_data_loaders import IMDB_FILES, write_imdb_tarball

    files = {**IMDB_FILES, "aclImdb/train/unsup/0_0.txt": "unlabelled", "aclImdb/train/labeledBow.feat": "0 0:1",
             "aclImdb/train/urls_pos.txt": "http://example.invalid"}
    tgz = write_imdb_tarball(mirror.root / "aclImdb_v1.tar.gz", files)
    entry = F.REGISTRY["imdb"].files[0]
    fake = F.Dataset("imdb", "IMDB", (F.RemoteFile(entry.path, entry.url, md5(tgz.read_bytes()),
                                                   tgz.stat().st_size, stand_ins=entry.stand_ins),))
    monkeypatch.setitem(F.REGISTRY, "imdb", fake)
    t = make_task({"task": "imdb", "val_size": 1, "min_freq": 1}, seed=0)
    n_train = sum(1 for k in IMDB_FILES if k.startswith("aclImdb/train/"))
    assert len(t.data["train"]) + len(t.data["val"]) == n_train and mirror.requests == ["/aclImdb_v1.tar.gz"]
    assert f"training file {mirror.cache / 'aclImdb_v1.tar.gz'}" in t.describe()
    assert "downloading aclImdb_v1.tar.gz" in capsys.readouterr().err


def test_corrupted_cache_is_downloaded_again(toy, capsys):
    F.locate("toy", ["toy/a.txt"], quiet=True)
    cached = toy.cache / "toy/a.txt"
    cached.write_bytes(b"bit rot")
    assert F.locate("toy", ["toy/a.txt"], quiet=True)["toy/a.txt"].read_bytes() == toy.files["toy/a.txt"]
    assert toy.requests == ["/toy/a.txt", "/toy/a.txt"]
    assert f"the cached {cached} does not match its hash" in capsys.readouterr().err


def test_without_pooch_local_data_works_and_downloads_ask_for_it(toy, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pooch", None)                    # import pooch fails
    monkeypatch.delenv(F.CACHE_ENV)
    assert F.cache_dir() is None
    data = tmp_path / "data"
    (data / "toy").mkdir(parents=True)
    (data / "toy/a.txt").write_bytes(b"mine")
    monkeypatch.setenv(F.DATA_ENV, str(data))
    assert F.locate("toy", ["toy/a.txt"])["toy/a.txt"] == data / "toy/a.txt"
    with pytest.raises(F.DataUnavailable, match=r"toy/b\.txt is not in the data folder nor the cache, and "
                                                r"downloading it needs pooch: pip install -e \"\.\[data\]\" in "
                                                r"numformer's checkout \(or pip install pooch\)"):
        F.locate("toy")
    assert toy.requests == []


def test_a_cached_file_failing_its_hash_while_offline_says_so(toy, monkeypatch, capsys):
    """Issue 27, item 13: the message names the cached copy and its failed hash (and the copy is removed), not
    only the refused download."""
    F.locate("toy", quiet=True)
    cached = toy.cache / "toy/a.txt"
    cached.write_bytes(b"bit rot")
    with socket.socket() as s:                                          # the mirror is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(F.MIRROR_ENV, f"http://127.0.0.1:{port}")
    capsys.readouterr()
    assert main(["data", "fetch", "toy", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"numformer data: error: the cached {cached} failed its hash check "
                                               f"({md5(toy.files['toy/a.txt'])}) and was removed; downloading it "
                                               f"again failed: cannot download http://127.0.0.1:{port}/toy/a.txt")
    assert cached_files(toy) == ["toy/b.txt"]
    with pytest.raises(F.DataUnavailable, match="failed its hash check"):
        cached.write_bytes(b"bit rot")
        F.locate("toy", ["toy/a.txt"], quiet=True)
    assert not cached.exists()


def test_the_cache_is_poochs_folder_for_numformer(monkeypatch):
    """Found without importing pooch (which loads tqdm.auto: a warning in a notebook without ipywidgets)."""
    pooch = pytest.importorskip("pooch")
    monkeypatch.delenv(F.CACHE_ENV, raising=False)
    assert F.cache_dir() == pooch.os_cache("numformer")
    fresh = ("import sys; from numformer.data.fetch import cache_dir; folder = cache_dir(); "
             "print(folder is not None, 'pooch' in sys.modules, 'tqdm' in sys.modules)")
    env = {k: v for k, v in src_env().items() if k != F.CACHE_ENV}
    done = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.split() == ["True", "False", "False"], done.stderr
    monkeypatch.setitem(sys.modules, "pooch", None)
    assert F.cache_dir() is None


# ------------------------------------------------------------------------------------------------ a shared cache
def test_processes_sharing_a_cache_whose_copy_fails_its_hash_all_get_the_file(toy, monkeypatch):
    """Before: each removed the bad copy, and the others' hash check or removal found it gone ("...: no such file
    or folder"); now they take turns (the cache folder's lock) and the first downloads it again."""
    F.locate("toy", ["toy/a.txt"], quiet=True)
    cached = toy.cache / "toy/a.txt"
    cached.write_bytes(b"bit rot" * 20)
    hash_ok, together, seen = F._hash_ok, threading.Barrier(6), threading.local()

    def checked_together(path, f):          # every process finds the bad copy at once, then goes on
        ok = hash_ok(path, f)
        if not getattr(seen, "once", False):
            seen.once = True
            together.wait(timeout=10)
        return ok

    monkeypatch.setattr(F, "_hash_ok", checked_together)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda _: F.locate("toy", ["toy/a.txt"], quiet=True)["toy/a.txt"], range(6)))
    assert got == [cached] * 6 and cached.read_bytes() == toy.files["toy/a.txt"]
    assert toy.requests.count("/toy/a.txt") == 2                    # downloaded again once
    assert cached_files(toy) == ["toy/a.txt"]                       # the lock file is removed after use


def test_a_download_killed_outright_leaves_a_temporary_file_removed_by_the_next(toy):
    (toy.cache / "toy").mkdir(parents=True)
    (toy.cache / "toy/tmpk1ll3d_0").write_bytes(b"half a download")       # pooch's name for its temporary file
    (toy.cache / "toy/tmp_notes.txt").write_bytes(b"not pooch's")
    F.locate("toy", ["toy/a.txt"], quiet=True)
    assert cached_files(toy) == ["toy/a.txt", "toy/tmp_notes.txt"]


def test_a_cache_that_cannot_be_written_is_named_with_the_setting_that_moves_it(toy, monkeypatch, capsys):
    """Before: "cannot download URL (Read-only file system); download it by hand to <that same cache>"."""
    toy.cache.mkdir()
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(toy.cache)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert main(["data", "fetch", "toy", "--quiet"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"numformer data: error: the cache folder {toy.cache} is not writable (Read-only file system), so "
                    f"toy/a.txt cannot be downloaded into it: set NUMFORMER_CACHE to a writable folder, or download "
                    f"{toy.url}/toy/a.txt by hand into a folder of datasets as toy/a.txt and set NUMFORMER_DATA to "
                    f"that folder")
    assert toy.requests == []


def test_a_broken_download_s_progress_bar_comes_before_the_error_line(toy, capsys):
    """Before: pooch's bar of a broken download was drawn when collected, after the error line."""
    toy.drop.add("toy/a.txt")
    assert main(["data", "fetch", "toy"]) == 2
    gc.collect()                            # a bar still referenced by the error's frames is drawn now
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("numformer: downloading toy/a.txt")
    assert err[-1].startswith(f"numformer data: error: cannot download {toy.url}/toy/a.txt")
