"""data_files.json: the files a run's task read, with their size and SHA-256, so that --resume, eval and the other
readers of a run folder refuse data that changed since the run read them (numformer.data.fingerprint).

A resumed run on an edited corpus would train its last steps on other data than its first, and eval would report
figures for data the run never saw, both silently; now each is one line naming the file, how it changed and the
fix, and nothing in the run folder is touched.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys

import numpy as np
import pytest

from numformer.data import Batch, Task, fingerprint, make_task, register_task
from numformer.data.token_files import token_cache_root, token_dtype, write_tokens_dir
from numformer.data.tokenizers import ByteLevelBPE
from numformer.run_files import DATA_FILES
from numformer.train import Trainer, load_task

from conftest import one_error_line
from test_run_folder_edits import snapshot

LINES = "".join(f"line {i}: the king and the queen walk to the castle\n" for i in range(300))


def config(path, **train):
    return {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
            "data": {"task": "text", "path": str(path), "block_size": 16},
            "train": {"max_steps": 4, "batch_size": 4, "eval_every": 2, "checkpoint_every": 2, "processes": 1,
                      "seed": 0, "eval_batches": 1, **train}}


@pytest.fixture
def run(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(LINES, encoding="utf-8")
    Trainer(config(corpus), tmp_path / "run", quiet=True).train()
    return tmp_path / "run", corpus


def recorded(run_dir):
    return json.loads((run_dir / DATA_FILES).read_text(encoding="utf-8"))


def test_a_new_run_records_the_files_its_task_read(run):
    run_dir, corpus = run
    data = corpus.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert recorded(run_dir) == {"version": 1, "folders": [], "files": [
        {"path": str(corpus.resolve()), "bytes": len(data), "sha256": digest}], "sequences": [
        {"path": str(corpus.parent.resolve()), "files": 1, "bytes": len(data),
         "sha256": hashlib.sha256(f"{digest}\0{len(data)}\n".encode()).hexdigest()}]}


def test_resume_refuses_changed_data_and_touches_nothing(run, run_cli):
    run_dir, corpus = run
    corpus.write_text(LINES.replace("king", "walk"), encoding="utf-8")          # same size, other bytes
    before = snapshot(run_dir)
    rc, _, err = run_cli("train", "--out", run_dir, "--resume", "--set", "train.max_steps=6")
    line = one_error_line(rc, err, "train")
    assert f"data file {corpus.resolve()} has changed since the run read it" in line
    assert "--resume would go on training it on other data" in line and f"delete {run_dir / DATA_FILES}" in line
    assert snapshot(run_dir) == before
    corpus.write_text(LINES, encoding="utf-8")                                    # the run's data again
    assert Trainer(None, run_dir, resume=True, overrides=["train.max_steps=6"], quiet=True).train()["steps"] == 6


def test_resume_refuses_a_data_path_set_to_other_data(run, run_cli, tmp_path):
    """--set data.path may move the run to where the same data now are, not to other data (before: the run went
    on training on the new file, its data_files.json still naming the old one, which was still in place)."""
    run_dir, corpus = run
    other = tmp_path / "other.txt"
    other.write_text(LINES[:len(LINES) // 2], encoding="utf-8")
    before = snapshot(run_dir)
    rc, _, err = run_cli("train", "--out", run_dir, "--resume", "--set", f"data.path={other}")
    line = one_error_line(rc, err, "train")
    assert f"data file {other.resolve()} holds data the run did not read" in line and "--resume would" in line
    assert snapshot(run_dir) == before
    same = tmp_path / "same.txt"
    same.write_text(LINES, encoding="utf-8")
    resumed = Trainer(None, run_dir, resume=True, overrides=[f"data.path={same}", "train.max_steps=6"], quiet=True)
    assert resumed.train()["steps"] == 6


def test_eval_and_load_task_refuse_changed_data(run, run_cli):
    run_dir, corpus = run
    corpus.write_text(LINES + "the king\n", encoding="utf-8")
    line = one_error_line(*run_cli("eval", run_dir)[::2], "eval")
    assert f"data file {corpus.resolve()} has changed" in line and "would not be the run's" in line
    with pytest.raises(ValueError, match="has changed since the run read it"):
        load_task(run_dir)
    corpus.unlink()
    (run_dir.parent / "moved.txt").write_text(LINES, encoding="utf-8")
    with pytest.raises(ValueError):             # the task's own error: its file is not there
        load_task(run_dir)


def test_deleting_data_files_json_accepts_the_data_as_they_are(run):
    run_dir, corpus = run
    corpus.write_text(LINES + "the king\n", encoding="utf-8")
    (run_dir / DATA_FILES).unlink()
    load_task(run_dir)                          # a run without the file (as before numformer wrote it): no check
    Trainer(None, run_dir, resume=True, overrides=["train.max_steps=6"], quiet=True).train()
    data = corpus.read_bytes()                  # the resumed run records its data
    assert recorded(run_dir)["files"] == [{"path": str(corpus.resolve()), "bytes": len(data),
                                           "sha256": hashlib.sha256(data).hexdigest()}]


def test_a_damaged_data_files_json_is_named(run):
    run_dir, _ = run
    (run_dir / DATA_FILES).write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{run_dir / DATA_FILES} is damaged"):
        load_task(run_dir)


def test_the_same_data_read_from_another_place_is_the_run_s(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("first", encoding="utf-8")
    b.write_text("second", encoding="utf-8")
    old = fingerprint.fingerprint([a, b])
    copy = tmp_path / "elsewhere" / "a.txt"
    copy.parent.mkdir()
    copy.write_text("first", encoding="utf-8")
    a.unlink()
    assert fingerprint.changes(old, fingerprint.fingerprint([copy, b])) == []     # moved: the same bytes
    gone = fingerprint.changes(old, fingerprint.fingerprint([b]))
    assert gone == [f"data file {a.resolve()} is gone (the run read 5 bytes, SHA-256 "
                    f"{hashlib.sha256(b'first').hexdigest()[:12]})"]
    a.write_text("first", encoding="utf-8")
    old = fingerprint.fingerprint([a, b])
    a.write_text("second", encoding="utf-8")                                    # swapped: both changed
    b.write_text("first", encoding="utf-8")
    lines = fingerprint.changes(old, fingerprint.fingerprint([a, b]))
    assert [line.split(" has changed")[0] for line in lines] == [f"data file {a.resolve()}", f"data file {b.resolve()}"]


def test_a_file_not_read_again_is_checked_where_it_was(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("tokens cached", encoding="utf-8")
    old = fingerprint.fingerprint([a])
    assert fingerprint.changes(old, fingerprint.fingerprint([])) == []           # a cache served the task
    a.write_text("tokens edited", encoding="utf-8")
    assert "has changed" in fingerprint.changes(old, fingerprint.fingerprint([]))[0]


def test_a_folder_read_whole_is_one_entry(tmp_path):
    folder = tmp_path / "reviews"
    folder.mkdir()
    for i in range(fingerprint.FOLDER_FILES):
        (folder / f"{i}.txt").write_text(f"review {i}", encoding="utf-8")
    with fingerprint.reading() as read:
        texts = [p.read_text(encoding="utf-8") for p in sorted(folder.iterdir())]
    old = fingerprint.fingerprint(read)
    assert old["files"] == [] and len(texts) == fingerprint.FOLDER_FILES
    (entry_,) = old["folders"]
    assert entry_["path"] == str(folder.resolve()) and entry_["files"] == fingerprint.FOLDER_FILES
    assert entry_["bytes"] == sum(len(t) for t in texts)
    (folder / "extra.txt").write_text("a review added", encoding="utf-8")
    line, = fingerprint.changes(old, fingerprint.fingerprint([]))
    assert line.startswith(f"data folder {folder.resolve()} has changed since the run read it (then "
                           f"{fingerprint.FOLDER_FILES} files")
    assert fingerprint.fingerprint(read)["folders"] == []       # part of a folder: each file on its own
    assert len(fingerprint.fingerprint(read)["files"]) == fingerprint.FOLDER_FILES


def test_a_folder_entry_counts_the_files_it_hashed(tmp_path):
    """A file listed but gone before it is hashed is not counted: the entry describes the bytes it digested."""
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name, encoding="utf-8")
    whole = fingerprint.folder_entry(tmp_path)
    assert whole["files"] == 2 and whole["bytes"] == 10
    (tmp_path / "b.txt").unlink()
    listed_before = fingerprint.folder_entry(tmp_path, ["a.txt", "b.txt"])
    assert listed_before == fingerprint.folder_entry(tmp_path) and listed_before["files"] == 1
    assert fingerprint.folder_entry(tmp_path / "a.txt") is None and fingerprint.folder_entry(tmp_path / "no") is None


def test_only_data_read_is_recorded(tmp_path, monkeypatch):
    data, written, excluded = tmp_path / "data.bin", tmp_path / "out.txt", tmp_path / "run" / "config.json"
    data.write_bytes(b"\0\1\2")
    excluded.parent.mkdir()
    excluded.write_text("{}", encoding="utf-8")
    module = tmp_path / "fingerprint_probe_module.py"
    module.write_text("VALUE = 1\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with fingerprint.reading() as read:
        fd = os.open(data, os.O_RDONLY)
        os.close(fd)
        written.write_text("a file written is no data", encoding="utf-8")
        excluded.read_text(encoding="utf-8")
        importlib.import_module("fingerprint_probe_module")     # Python's own files (.py, .pyc) are not data
        json.loads((tmp_path / "run" / "config.json").read_text(encoding="utf-8"))
    sys.modules.pop("fingerprint_probe_module", None)
    doc = fingerprint.fingerprint(read, excluded=[tmp_path / "run"])
    assert [e["path"] for e in doc["files"]] == [str(data.resolve())]
    with fingerprint.reading() as outer, fingerprint.reading() as inner:        # nested: both see the read
        data.read_bytes()
    assert {str(data)} <= {str(p) for p in outer} and {str(data)} <= {str(p) for p in inner}
    data.read_bytes()                                                           # no recording open: nothing kept
    assert {str(p) for p in outer} == {str(p) for p in inner}


def test_token_files_and_cached_tokenizations_count_as_data(tmp_path):
    folder = tmp_path / "tokens"
    ids = list(np.random.default_rng(0).integers(0, 300, 4000))
    tok = ByteLevelBPE.train("the king and the queen " * 40, 300)
    write_tokens_dir(folder, {"train": [ids[:3000]], "val": [ids[3000:]]}, tok.to_dict(), token_dtype(300), {})
    with fingerprint.reading() as read:                 # train.bin is read window by window later: noted here
        make_task({"task": "text", "tokens_dir": str(folder), "block_size": 16})
    paths = [e["path"] for e in fingerprint.fingerprint(read)["files"]]
    assert str((folder / "train.bin").resolve()) in paths and str((folder / "val.bin").resolve()) in paths
    corpus = tmp_path / "bpe.txt"
    corpus.write_text("the king and the queen walk to the castle " * 200, encoding="utf-8")
    data = {"task": "text", "path": str(corpus), "tokenizer": "bpe", "vocab_size": 280, "block_size": 16}
    make_task(data)                                     # the tokenization made, and kept in the cache
    with fingerprint.reading() as read:
        make_task(data)                                 # served by the cache: the corpus is noted all the same
    doc = fingerprint.fingerprint(read, excluded=[token_cache_root()])
    assert [e["path"] for e in doc["files"]] == [str(corpus.resolve())]


@register_task("fingerprint_probe")
class OwnFileTask(Task):
    """A user's task that reads a file of its own with plain open(): recorded as numformer's loaders are."""

    model_type = "gpt"
    data_keys = {"path": ""}

    def __init__(self, data_config, seed=0, tokenizer_state=None):
        super().__init__(data_config, seed, tokenizer_state)
        with open(self.config["path"], encoding="utf-8") as f:
            self.values = np.array([int(v) for v in f.read().split()]) % 8

    def model_config(self):
        return {"vocab_size": 8, "block_size": 4}

    def train_batch(self, batch_size, rng):
        x = rng.choice(self.values, (batch_size, 5))
        return Batch({"idx": x[:, :-1]}, x[:, 1:])

    def eval_batches(self, split, batch_size):
        yield self.train_batch(batch_size, np.random.default_rng(0))


def test_a_user_task_s_own_files_are_recorded(tmp_path):
    numbers = tmp_path / "numbers.txt"
    numbers.write_text(" ".join(map(str, range(50))), encoding="utf-8")
    cfg = {"model": {"type": "gpt", "n_layers": 1, "n_heads": 2, "d_model": 16},
           "data": {"task": "fingerprint_probe", "path": str(numbers)},
           "train": {"max_steps": 2, "batch_size": 2, "eval_every": 2, "processes": 1, "eval_batches": 1}}
    Trainer(cfg, tmp_path / "run", quiet=True).train()
    assert [e["path"] for e in recorded(tmp_path / "run")["files"]] == [str(numbers.resolve())]
    numbers.write_text("1 2 3", encoding="utf-8")
    with pytest.raises(ValueError, match=f"data file {numbers.resolve()} has changed"):
        load_task(tmp_path / "run")


@pytest.fixture
def folder_run(tmp_path):
    """A run on a corpus folder of two files, joined in name order (a.txt trains, b.txt mostly validates)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(LINES[:2000], encoding="utf-8")
    (corpus / "b.txt").write_text(LINES[2000:], encoding="utf-8")
    Trainer(config(corpus), tmp_path / "run", quiet=True).train()
    return tmp_path / "run", corpus


@pytest.mark.parametrize("edit", ["copy added", "renamed"])
def test_resume_and_eval_refuse_a_corpus_folder_joined_in_another_order_or_with_a_copy(folder_run, run_cli, edit):
    """Every file's content is still one the run read, but the text is not the run's: a copy of a.txt adds its
    text again, a.txt renamed z.txt comes after b.txt (another train/validation split). Before: both accepted,
    the resumed run trained on other data, eval reported another split's figures."""
    run_dir, corpus = folder_run
    if edit == "copy added":
        (corpus / "a2.txt").write_bytes((corpus / "a.txt").read_bytes())
    else:
        (corpus / "a.txt").rename(corpus / "z.txt")
    before = snapshot(run_dir)
    line = one_error_line(*run_cli("train", "--out", run_dir, "--resume", "--set", "train.max_steps=6")[::2], "train")
    assert f"the files of {corpus.resolve()} are not joined as the run joined them (then 2 files" in line
    assert "--resume would go on training it on other data" in line and f"delete {run_dir / DATA_FILES}" in line
    assert snapshot(run_dir) == before
    assert "are not joined as the run joined them" in one_error_line(*run_cli("eval", run_dir)[::2], "eval")
    if edit == "copy added":
        (corpus / "a2.txt").unlink()
    else:
        (corpus / "z.txt").rename(corpus / "a.txt")
    assert Trainer(None, run_dir, resume=True, overrides=["train.max_steps=6"], quiet=True).train()["steps"] == 6


def test_a_data_files_json_without_sequences_is_checked_as_before(folder_run):
    """A run folder written before the order of a corpus's files was recorded: its files are checked as they
    were (a renamed file of the same content is accepted), its order is not."""
    run_dir, corpus = folder_run
    doc = recorded(run_dir)
    assert [s["files"] for s in doc.pop("sequences")] == [2]
    (run_dir / DATA_FILES).write_text(json.dumps(doc), encoding="utf-8")
    (corpus / "a.txt").rename(corpus / "z.txt")
    load_task(run_dir)
    (corpus / "z.txt").write_text("the queen and the king\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"data file {corpus.resolve() / 'a.txt'} is gone"):
        load_task(run_dir)


def test_the_order_of_files_is_their_content_s_not_their_names(tmp_path):
    """A sequence is the files' contents in order: the same files read from another folder are the same data, a
    file renamed keeping its place too; another order or a copy added is not."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("first", encoding="utf-8")
    b.write_text("second", encoding="utf-8")

    def read(*paths):
        with fingerprint.reading() as recording:
            fingerprint.note_sequence(paths)
        return fingerprint.fingerprint(recording)

    old = read(a, b)
    (entry_,) = old["sequences"]
    assert entry_["path"] == str(tmp_path.resolve()) and (entry_["files"], entry_["bytes"]) == (2, 11)
    elsewhere = tmp_path / "moved"
    elsewhere.mkdir()
    (elsewhere / "0.txt").write_text("first", encoding="utf-8")
    assert fingerprint.reordered(old, read(elsewhere / "0.txt", b)) == []
    (line,) = fingerprint.reordered(old, read(b, a))
    assert line.startswith(f"the files of {tmp_path.resolve()} are not joined as the run joined them (then 2 files, "
                           f"11 bytes, SHA-256 {entry_['sha256'][:12]} in order; now 2 files, 11 bytes")
    assert fingerprint.reordered(old, read(a, elsewhere / "0.txt", b)) != []
    assert fingerprint.reordered({k: v for k, v in old.items() if k != "sequences"}, read(b, a)) == []


def test_a_run_folder_inside_its_data_folder_is_refused(tmp_path, run_cli):
    """Before: the first run trained, then every --resume, eval and new run on the folder read the run's
    checkpoint as text ("checkpoint.safetensors is not valid utf-8 text ... convert the file")."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(LINES, encoding="utf-8")
    toml = tmp_path / "text.toml"
    toml.write_text('[model]\nn_layers = 1\nd_model = 16\nn_heads = 2\n[data]\ntask = "text"\nblock_size = 16\n'
                    f'path = "{corpus}"\n[train]\nmax_steps = 2\nbatch_size = 4\nprocesses = 1\n', encoding="utf-8")
    line = one_error_line(*run_cli("train", toml, "--out", corpus / "run")[::2], "train")
    assert f"--out {corpus / 'run'} is inside the data folder [data] path = '{corpus}'" in line
    assert f"give --out a folder outside {corpus}" in line and not (corpus / "run").exists()
    assert run_cli("train", toml, "--out", tmp_path / "run", "--quiet")[0] == 0
    (tmp_path / "run").rename(corpus / "run")                  # put there by hand, or by an older numformer
    for args in (("train", "--out", corpus / "run", "--resume"), ("eval", corpus / "run"),
                 ("train", toml, "--out", tmp_path / "new")):
        line = one_error_line(*run_cli(*args)[::2], args[0])
        assert f"{corpus / 'run'} is a numformer run folder (config.json and checkpoint.safetensors), not text" in line
        assert "move the run folder out of the data folder" in line


def test_a_fine_tuning_source_is_not_the_run_s_data(run, tmp_path):
    """The init_from source is the model a run starts from: its files are not recorded as the run's data, and
    the source training on (its weights, its config.json) changes nothing for the fine-tuned run's --resume or
    eval. A data_files.json that recorded them (written before) has them left out."""
    source, corpus = run
    tuned_config = {**config(corpus), "model": {"init_from": str(source)}}
    tuned = tmp_path / "tuned"
    Trainer(tuned_config, tuned, quiet=True).train()
    document = recorded(tuned)
    assert [e["path"] for e in document["files"]] == [str(corpus.resolve())]
    older = {**document, "files": document["files"] + [fingerprint.file_entry(source.resolve() / "config.json")]}
    (tuned / DATA_FILES).write_text(json.dumps(older), encoding="utf-8")
    Trainer(None, source, resume=True, overrides=["train.max_steps=6"], quiet=True).train()   # the source moves on
    assert Trainer(None, tuned, resume=True, overrides=["train.max_steps=6"], quiet=True).train()["steps"] == 6
    assert load_task(tuned) is not None


def test_files_read_by_any_thread_while_a_source_is_read_are_not_data(tmp_path):
    """``fingerprint.not_data`` covers every thread: a hub download reads in worker threads (its token file
    among them), and none of that is the run's data; a file read outside the block still is."""
    import threading

    source, data = tmp_path / "source.json", tmp_path / "data.txt"
    source.write_text("{}", encoding="utf-8")
    data.write_text("data", encoding="utf-8")

    def read_in_a_thread(path):
        worker = threading.Thread(target=path.read_bytes)
        worker.start()
        worker.join()

    with fingerprint.reading() as read:
        with fingerprint.not_data():
            read_in_a_thread(source)
        read_in_a_thread(data)
    assert [str(p) for p in fingerprint.data_paths(read)] == [str(data.resolve())]


TOKENIZERS_SEEN = []


@register_task("fingerprint_probe_source_tokenizer")
class SourceTokenizerTask(OwnFileTask):
    """A user's task that takes the tokenizer it is given (a fine-tuning source's) and keeps no tokenizer.json."""

    def __init__(self, data_config, seed=0, tokenizer_state=None):
        super().__init__(data_config, seed, tokenizer_state)
        TOKENIZERS_SEEN.append(tokenizer_state)


def test_a_resumed_user_task_without_tokenizer_json_gets_the_source_s_tokenizer_again(run, tmp_path):
    """Resuming takes the source's architecture from the run's config.json, but a task of the user's that
    keeps no tokenizer.json took the source's tokenizer when the run began: it gets it again on --resume."""
    source, _ = run
    numbers = tmp_path / "numbers.txt"
    numbers.write_text(" ".join(map(str, range(50))), encoding="utf-8")
    cfg = {"model": {"init_from": str(source)},
           "data": {"task": "fingerprint_probe_source_tokenizer", "path": str(numbers)},
           "train": {"max_steps": 2, "batch_size": 2, "eval_every": 2, "checkpoint_every": 2, "processes": 1,
                     "eval_batches": 1}}
    TOKENIZERS_SEEN.clear()
    Trainer(cfg, tmp_path / "tuned", quiet=True).train()
    Trainer(None, tmp_path / "tuned", resume=True, overrides=["train.max_steps=3"], quiet=True).train()
    source_tokenizer = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    assert TOKENIZERS_SEEN and all(state == source_tokenizer for state in TOKENIZERS_SEEN), TOKENIZERS_SEEN
