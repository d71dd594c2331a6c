"""IMDB, AG News and Multi30k tasks on fixtures written by the tests (and on the real data when present)."""
import json
from pathlib import Path

import numpy as np
import pytest

from numformer.data import IGNORE, make_task

from test_data_loaders import write_gz, write_imdb_tarball

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared datasets not found at {SHARED}")

POS = ["great film , loved it", "wonderful acting and a great story", "loved the great music", "a great great film"]
NEG = ["bad film , hated it", "terrible acting and a bad story", "boring bad music", "an awful bad film"]


@pytest.fixture
def imdb_tgz(tmp_path):
    files = {}
    for i in range(10):
        files[f"aclImdb/train/pos/{i}_9.txt"] = POS[i % 4] + f" wordp{i}"
        files[f"aclImdb/train/neg/{i}_2.txt"] = NEG[i % 4] + f" wordn{i}"
        files[f"aclImdb/test/pos/{i}_8.txt"] = POS[(i + 1) % 4] + " testonlyword"
        files[f"aclImdb/test/neg/{i}_1.txt"] = NEG[(i + 1) % 4] + " testonlyword<br />"
    return str(write_imdb_tarball(tmp_path / "aclImdb_v1.tar.gz", files))


def imdb(path, **kw):
    return make_task({"task": "imdb", "path": path, "val_size": 4, "min_freq": 1, **kw}, seed=0)


def test_imdb_splits_and_vocab_from_train_only(imdb_tgz):
    t = imdb(imdb_tgz)
    assert [len(t.data[s]) for s in ("train", "val", "test")] == [16, 4, 20]
    assert not set(t.data["train"].ids) & set(t.data["val"].ids)
    vocab = set(t.tokenizer.tokens)
    assert "testonlyword" not in vocab and "br" not in vocab          # test words never enter the vocabulary
    val_only = {w for x in t.data["val"].texts for w in x.split()} - {w for x in t.data["train"].texts
                                                                      for w in x.split()}
    assert val_only and not (val_only & vocab)                         # nor do words seen only in val
    assert t.model_config() == {"vocab_size": t.tokenizer.vocab_size, "n_classes": 2, "pad_id": 0, "max_len": 256}
    other = make_task({"task": "imdb", "path": imdb_tgz, "val_size": 4, "min_freq": 1}, seed=1)
    assert set(other.data["val"].ids) != set(t.data["val"].ids)        # val is chosen with the seed


def test_imdb_batches_truncation_and_padding(imdb_tgz):
    t = imdb(imdb_tgz, max_len=5)
    b = t.train_batch(8, np.random.default_rng(0))
    ids, y = b.inputs["ids"], b.targets
    assert ids.shape[0] == 8 and ids.shape[1] <= 5 and y.shape == (8,) and set(y.tolist()) <= {0, 1}
    assert (ids[:, 0] == t.tokenizer.special_id("<cls>")).all()
    for i, row in zip(b.extra["index"], ids):
        full = t.tokenizer.encode(t.data["train"].texts[i], add_cls=True)
        n = int((row != 0).sum())
        assert row[:n].tolist() == full[:5][:n] and (row[n:] == 0).all()   # head kept, padding after
    b2 = t.train_batch(8, np.random.default_rng(0))
    np.testing.assert_array_equal(b.inputs["ids"], b2.inputs["ids"])
    seen = np.concatenate([bb.extra["index"] for bb in t.eval_batches("test", 6)])
    assert sorted(seen.tolist()) == list(range(20))                    # every test review exactly once


def test_imdb_tokenizer_state_roundtrip(imdb_tgz, tmp_path):
    t = imdb(imdb_tgz)
    state = json.loads(json.dumps(t.tokenizer_state()))
    t2 = make_task({"task": "imdb", "path": imdb_tgz, "val_size": 4, "min_freq": 5}, seed=0, tokenizer_state=state)
    assert t2.tokenizer.tokens == t.tokenizer.tokens                    # the saved vocabulary wins
    with pytest.raises(ValueError, match="saved tokenizer is 'word'"):
        make_task({"task": "imdb", "path": imdb_tgz, "val_size": 4, "tokenizer": "bpe"}, 0, state)


def test_imdb_bpe_and_evaluate(imdb_tgz):
    pytest.importorskip("tokenizers")
    t = imdb(imdb_tgz, tokenizer="bpe", vocab_size=300)
    assert t.tokenizer.vocab_size <= 300

    class Oracle:
        training = True

        def __call__(self, ids):
            out = np.zeros((len(ids), 2))
            for i, row in enumerate(ids):           # the fixture's classes differ in these words
                words = t.tokenizer.decode(row)
                out[i, int(any(w in words for w in ("great", "loved", "wonderful")))] = 1
            return out

        def eval(self):
            self.training = False

        def train(self, mode=True):
            self.training = mode

    assert t.evaluate(Oracle(), "test") == {"accuracy": 1.0}
    assert t.evaluate(Oracle(), "val") == {"accuracy": 1.0}


def test_missing_data_path_says_which_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no IMDB data at .*Set \[data\] path"):
        make_task({"task": "imdb", "path": str(tmp_path / "nowhere")})
    with pytest.raises(FileNotFoundError, match=r"no AG News folder.*Set \[data\] path"):
        make_task({"task": "agnews", "path": str(tmp_path / "nowhere")})
    with pytest.raises(FileNotFoundError, match=r"parallel-text folder.*Set \[data\] path"):
        make_task({"task": "multi30k", "path": str(tmp_path / "nowhere")})


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_translation_missing_file_names_its_key(tmp_path, split):
    (tmp_path / "a.fr").write_text("un chat\nun chien\n" * 10, encoding="utf-8")
    (tmp_path / "a.en").write_text("a cat\na dog\n" * 10, encoding="utf-8")
    pair = [str(tmp_path / "a.fr"), str(tmp_path / "a.en")]
    data = {"task": "translation", "train": pair, split: [str(tmp_path / "nosuch"), pair[1]]}
    with pytest.raises(ValueError, match=rf"no file at .*nosuch'\. Set \[data\] {split} \(relative"):
        make_task(data)


def test_classification_missing_test_file_names_test_path(tmp_path):
    (tmp_path / "r.csv").write_text("text,label\n" + "good film,pos\nbad film,neg\n" * 10, encoding="utf-8")
    with pytest.raises(ValueError, match=r"no file at .*nosuch.csv'\. Set \[data\] test_path \("):
        make_task({"task": "classification", "path": str(tmp_path / "r.csv"),
                   "test_path": str(tmp_path / "nosuch.csv")})


def _agnews_rows():
    return "\n".join(f'"{c}","Title {c} {i}","text about topic{c} number {i}"' for i in range(6)
                     for c in (1, 2, 3, 4)) + "\n"


def test_agnews_class_beyond_a_cut_classes_txt_names_that_file(tmp_path):
    (tmp_path / "train.csv").write_text(_agnews_rows(), encoding="utf-8")
    (tmp_path / "test.csv").write_text(_agnews_rows(), encoding="utf-8")
    (tmp_path / "classes.txt").write_text("World\nSports\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 3: class '3' is not an integer in 1\.\.2 \(.*classes\.txt lists 2 "
                                         r"class names"):
        make_task({"task": "agnews", "path": str(tmp_path), "val_size": 4, "min_freq": 1})


def test_agnews_path_may_be_the_data_folder_holding_ag_news_csv(tmp_path):
    folder = tmp_path / "ag_news_csv"
    folder.mkdir()
    (folder / "train.csv").write_text(_agnews_rows(), encoding="utf-8")
    (folder / "test.csv").write_text(_agnews_rows(), encoding="utf-8")
    t = make_task({"task": "agnews", "path": str(tmp_path), "val_size": 4, "min_freq": 1}, seed=0)
    assert [len(t.data[s]) for s in ("train", "val", "test")] == [20, 4, 24]


def test_agnews_task(tmp_path):
    rows = [f'"{c}","Title {c} {i}","text about topic{c} number {i} \\ more #39;s"' for i in range(6)
            for c in (1, 2, 3, 4)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "test.csv").write_text("\n".join(rows[:8]) + "\n")
    t = make_task({"task": "agnews", "path": str(tmp_path), "val_size": 4, "min_freq": 1}, seed=0)
    assert t.class_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert t.model_config()["n_classes"] == 4 and t.model_config()["max_len"] == 128
    assert [len(t.data[s]) for s in ("train", "val", "test")] == [20, 4, 8]
    b = t.train_batch(5, np.random.default_rng(0))
    for i, label in zip(b.extra["index"], b.targets):
        assert f"topic{label + 1}" in t.data["train"].texts[i].lower()
    assert "\\" not in " ".join(t.data["train"].texts) and "'s" in t.data["train"].texts[0]


@pytest.fixture
def m30k(tmp_path):
    de = ["ein hund läuft .", "zwei männer spielen fußball .", "ein kind schläft", "ein hund schläft ."] * 3
    en = ["a dog runs .", "two men play soccer .", "a child sleeps", "a dog sleeps ."] * 3
    for split, n in (("train", 12), ("val", 4), ("test_2016_flickr", 4)):
        write_gz(tmp_path / f"{split}.de.gz", de[:n])
        write_gz(tmp_path / f"{split}.en.gz", en[:n])
    return str(tmp_path)


@pytest.mark.parametrize("joint", [False, True])
def test_multi30k_teacher_forcing_batches(m30k, joint):
    t = make_task({"task": "multi30k", "path": m30k, "min_freq": 1, "joint_vocab": joint, "buckets": 2}, seed=0)
    cfg = t.model_config()
    assert cfg["src_pad_id"] == cfg["tgt_pad_id"] == 0
    assert (cfg["bos_id"], cfg["eos_id"]) == (t.bos_id, t.eos_id)          # kept by the model for generate()
    assert (cfg["src_vocab_size"] == cfg["tgt_vocab_size"]) if joint else cfg["src_vocab_size"] != cfg["tgt_vocab_size"]
    b = t.train_batch(6, np.random.default_rng(0))
    src, tgt_in, y = b.inputs["src"], b.inputs["tgt"], b.targets
    assert (tgt_in[:, 0] == t.bos_id).all()
    for i, x, yin, yy in zip(b.extra["index"], src, tgt_in, y):
        ref = t.tgt_tokenizer.encode(t.references("train")[i])
        n = len(ref)
        assert yy[:n].tolist() == ref and yy[n] == t.eos_id and (yy[n + 1:] == IGNORE).all()
        assert yin[1:n + 1].tolist() == ref and (yin[n + 1:] == 0).all()
        assert t.src_tokenizer.decode(x) == t.sources("train")[i]
        assert t.decode_target(yy[yy != IGNORE]) == t.references("train")[i]
    # bucketing (buckets = 2): every batch is drawn from one half of the pairs sorted by length
    # (source + target tokens), so its lengths spread far less than those of uniform random batches
    lengths = t.lengths["train"]
    halves = [set(h.tolist()) for h in np.array_split(np.argsort(lengths, kind="stable"), 2)]
    rng = np.random.default_rng(0)
    batches = [t.train_batch(6, rng).extra["index"] for _ in range(200)]
    assert all(any(set(ix.tolist()) <= h for h in halves) for ix in batches)
    bucketed = np.mean([np.ptp(lengths[ix]) for ix in batches])
    rng = np.random.default_rng(1)
    uniform = np.mean([np.ptp(lengths[rng.integers(0, lengths.size, 6)]) for _ in range(200)])
    assert bucketed < 0.75 * uniform, (bucketed, uniform)         # ~1.9 against ~3.3 on this data
    state = json.loads(json.dumps(t.tokenizer_state()))
    t2 = make_task({"task": "multi30k", "path": m30k, "joint_vocab": joint}, seed=0, tokenizer_state=state)
    assert t2.tgt_tokenizer.encode("a dog runs .") == t.tgt_tokenizer.encode("a dog runs .")
    assert t.evaluate(None, "val") == {}
    assert sum(len(bb.targets) for bb in t.eval_batches("test", 3)) == 4


def test_multi30k_truncation(m30k):
    t = make_task({"task": "multi30k", "path": m30k, "min_freq": 1, "max_len": 3}, seed=0)
    b = next(t.eval_batches("val", 4))
    assert b.inputs["src"].shape[1] <= 3 and b.inputs["tgt"].shape[1] <= 3
    assert ((b.targets == t.eos_id).sum(axis=1) == 1).all()            # <eos> kept after truncation


# ------------------------------------------------------------------------------------------------ real data
@needs_shared
def test_real_agnews_and_multi30k_tasks():
    ag = make_task({"task": "agnews", "path": str(SHARED / "ag_news_csv")}, seed=0)
    assert len(ag.data["test"]) == 7600 and len(ag.data["train"]) + len(ag.data["val"]) == 20000
    mt = make_task({"task": "multi30k", "path": str(SHARED / "multi30k")}, seed=0)
    assert [len(mt.sources(s)) for s in ("train", "val", "test")] == [29000, 1014, 1000]
    assert 4000 < mt.tgt_tokenizer.vocab_size < 10000
