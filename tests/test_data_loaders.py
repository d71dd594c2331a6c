"""Dataset loaders on small fixtures written by the tests, and on the real files when ../shared/data exists."""
import gzip
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from numformer.data.text_datasets import (clean_agnews_text, load_agnews, load_agnews_csv, load_imdb,
                                          load_parallel)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"

IMDB_FILES = {
    "aclImdb/train/pos/0_9.txt": "A wonderful film.<br /><br />Loved it.",
    "aclImdb/train/pos/1_7.txt": "Pretty good.",
    "aclImdb/train/neg/0_2.txt": "Terrible.",
    "aclImdb/train/neg/3_1.txt": "Awful, awful film.",
    "aclImdb/test/pos/0_10.txt": "Masterpiece!",
    "aclImdb/test/neg/0_4.txt": "Not good.",
    "aclImdb/README": "readme",
    "aclImdb/imdb.vocab": "the\nand\n",
}


def write_imdb_tarball(path, files=IMDB_FILES):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_imdb_folder(root, files=IMDB_FILES):
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return root / "aclImdb"


def check_imdb(d):
    tr, te = d["train"], d["test"]
    assert len(tr) == 4 and len(te) == 2
    assert tr.labels.tolist() == [0, 0, 1, 1]                   # sorted by (label, id); label 1 = pos
    assert tr.texts == ["Terrible.", "Awful, awful film.", "A wonderful film.<br /><br />Loved it.", "Pretty good."]
    assert tr.ids == ["neg/0_2", "neg/3_1", "pos/0_9", "pos/1_7"]
    assert te.labels.tolist() == [0, 1] and tr.class_names == ["neg", "pos"]


def test_imdb_tarball_read_in_place(tmp_path):
    tgz = write_imdb_tarball(tmp_path / "aclImdb_v1.tar.gz")
    check_imdb(load_imdb(str(tgz)))
    check_imdb(load_imdb(str(tmp_path)))                          # a folder holding the tarball
    assert not (tmp_path / "aclImdb").exists()                    # nothing extracted


def test_imdb_extracted_folder(tmp_path):
    root = write_imdb_folder(tmp_path)
    check_imdb(load_imdb(str(root)))
    check_imdb(load_imdb(str(tmp_path)))                          # the folder holding aclImdb/


def test_imdb_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no IMDB data at"):
        load_imdb(str(tmp_path / "missing.tar.gz"))
    bad = dict(IMDB_FILES)
    bad["aclImdb/train/pos/review.txt"] = "no rating in the name"
    tgz = write_imdb_tarball(tmp_path / "bad.tar.gz", bad)
    with pytest.raises(ValueError, match=r"bad\.tar\.gz.*review\.txt.*ID_RATING"):
        load_imdb(str(tgz))
    wrong = {k: v for k, v in IMDB_FILES.items()}
    wrong["aclImdb/train/pos/5_2.txt"] = "rating 2 cannot be positive"
    with pytest.raises(ValueError, match="rating 2, impossible for a pos review"):
        load_imdb(str(write_imdb_tarball(tmp_path / "wrong.tar.gz", wrong)))
    no_test = {k: v for k, v in IMDB_FILES.items() if "/test/" not in k}
    with pytest.raises(ValueError, match="no reviews found for the 'test' split"):
        load_imdb(str(write_imdb_tarball(tmp_path / "notest.tar.gz", no_test)))
    (tmp_path / "junk.tar.gz").write_bytes(b"this is not gzip")
    with pytest.raises(ValueError, match="not a readable IMDB tarball"):
        load_imdb(str(tmp_path / "junk.tar.gz"))


def test_imdb_hidden_files_are_skipped(tmp_path):
    """An extracted aclImdb folder holding macOS's .DS_Store (or a tarball with ._* AppleDouble files) was refused
    as an unexpected review file; hidden files are skipped, as the text loader skips them."""
    root = write_imdb_folder(tmp_path / "x")
    (root / "train" / "pos" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    check_imdb(load_imdb(str(root)))
    tgz = write_imdb_tarball(tmp_path / "mac.tar.gz", {**IMDB_FILES, "aclImdb/train/neg/._0_2.txt": "\x00"})
    check_imdb(load_imdb(str(tgz)))


# ------------------------------------------------------------------------------------------------ AG News
HEADERLESS = (
    '"3","Fears for T N pension","Unions say they are \'disappointed\' after talks."\n'
    '"4","Space race (SPACE.com)","A second\\team competing for the  #36;10 million prize, a contest for\\privately'
    ' funded flight."\n'
    '"1","Iraq #39;s vote","Leaders met \\\\ again &amp; agreed; costs \\$85 &lt;B&gt;bold&lt;/B&gt; '
    'at Dell Inc. &lt;DELL.O&gt;"\n'
    '"2","Sports","He said ""great"" #151; twice"\n'
)
WITH_HEADER = "class_index,title,description\n" + (
    '1,World news,"Multi-line\nquoted field"\n'
    '4,Tech,Plain description without quotes\n'
)


def test_clean_agnews_text():
    assert clean_agnews_text("A second\\team") == "A second team"
    assert clean_agnews_text("social\\network") == "social network"       # bare backslash, not "\n"
    assert clean_agnews_text("para\\\\graph") == "para graph"
    assert clean_agnews_text("costs \\$85") == "costs $85"
    assert clean_agnews_text("the  #36;10 million") == "the $10 million"
    assert clean_agnews_text("America #39;s top") == "America's top"
    assert clean_agnews_text("a  #39;fully functioning #39; democracy") == "a 'fully functioning' democracy"
    assert clean_agnews_text("x &amp; y &quot;z&quot;") == 'x & y "z"'
    assert clean_agnews_text("a #151; b") == "a— b"                      # Windows-1252 em dash
    assert clean_agnews_text("#x2014;") == "\u2014"
    assert clean_agnews_text("Dell &lt;DELL.O&gt; &lt;A HREF=\"http://x\"&gt;link&lt;/A&gt;") == "Dell <DELL.O> link"


def test_agnews_headerless_and_header_variants(tmp_path):
    (tmp_path / "test.csv").write_text(HEADERLESS, encoding="utf-8")
    (tmp_path / "train_subset_20k.csv").write_text(WITH_HEADER, encoding="utf-8")
    (tmp_path / "classes.txt").write_text("World\nSports\nBusiness\nSci/Tech\n")
    te = load_agnews(str(tmp_path), "test")
    assert te.labels.tolist() == [2, 3, 0, 1]                     # classes 1..4 -> 0..3
    assert te.class_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert te.texts[0] == "Fears for T N pension Unions say they are 'disappointed' after talks."
    assert te.texts[1] == ("Space race (SPACE.com) A second team competing for the $10 million prize, a contest "
                           "for privately funded flight.")
    assert te.texts[2] == "Iraq's vote Leaders met again & agreed; costs $85 bold at Dell Inc. <DELL.O>"
    assert te.texts[3] == 'Sports He said "great"— twice'
    tr = load_agnews(str(tmp_path), "train")                      # falls back to train_subset_20k.csv
    assert tr.labels.tolist() == [0, 3]
    assert tr.texts == ["World news Multi-line quoted field", "Tech Plain description without quotes"]
    (tmp_path / "train.csv").write_text('"2","Full","train file"\n')
    assert load_agnews(str(tmp_path), "train").labels.tolist() == [1]     # train.csv preferred
    assert load_agnews(str(tmp_path), "train", train_file="train_subset_20k.csv").labels.tolist() == [0, 3]


@pytest.mark.parametrize("content, line, message", [
    ('"1","a","b"\n"2","only two"\n', 2, "expected 3 fields"),
    ('"1","a","b"\n"1","a","b"\n"7","a","b"\n', 3, r"class '7' is not an integer in 1\.\.4"),
    ('class_index,title,description\n1,a,b\nx,a,b\n', 3, "class 'x'"),
    ('"1","a","b"\n"2","unterminated,"b\n', 2, "malformed CSV"),
])
def test_agnews_malformed_rows_name_file_and_line(tmp_path, content, line, message):
    p = tmp_path / "bad.csv"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"bad\.csv, line {line}: .*{message}"):
        load_agnews_csv(str(p))


def test_agnews_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no AG News folder"):
        load_agnews(str(tmp_path / "nope"), "test")
    with pytest.raises(FileNotFoundError, match="no AG News train file.*train.csv, train_subset_20k.csv"):
        load_agnews(str(tmp_path), "train")


def test_agnews_files_with_a_byte_order_mark(tmp_path):
    """A headerless CSV saved with a UTF-8 byte-order mark lost its first row (taken for a header) and classes.txt
    gave the class '\\ufeffWorld'; the mark is dropped, as read_text drops it. A classes.txt that is not UTF-8
    is one error naming it (it was the codec's message alone)."""
    (tmp_path / "test.csv").write_bytes(b"\xef\xbb\xbf" + HEADERLESS.encode("utf-8"))
    (tmp_path / "classes.txt").write_bytes(b"\xef\xbb\xbfWorld\nSports\nBusiness\nSci/Tech\n")
    te = load_agnews(str(tmp_path), "test")
    assert te.labels.tolist() == [2, 3, 0, 1] and te.class_names == ["World", "Sports", "Business", "Sci/Tech"]
    (tmp_path / "classes.txt").write_bytes(b"World\nSports\nBusiness\nSci/Tech\nW\xf6rld\n")
    with pytest.raises(ValueError, match=r"classes\.txt is not valid UTF-8 text: byte offset 32 \(line 5\).*"
                                         r"convert the file to UTF-8"):
        load_agnews(str(tmp_path), "test")


# ------------------------------------------------------------------------------------------------ Multi30k
def write_gz(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def test_parallel_aligned_and_misaligned(tmp_path):
    write_gz(tmp_path / "train.de.gz", ["Ein Hund läuft.", "Zwei Männer."])
    write_gz(tmp_path / "train.en.gz", ["A dog runs.", "Two men."])
    (tmp_path / "val.de").write_text("Hallo.\n", encoding="utf-8")            # plain text works too
    (tmp_path / "val.en").write_text("Hello.\n", encoding="utf-8")
    src, tgt = load_parallel(str(tmp_path), "train", "de", "en")
    assert src == ["Ein Hund läuft.", "Zwei Männer."] and tgt == ["A dog runs.", "Two men."]
    assert load_parallel(str(tmp_path), "val", "en", "de") == (["Hello."], ["Hallo."])
    write_gz(tmp_path / "test.de.gz", ["a", "b", "c"])
    write_gz(tmp_path / "test.en.gz", ["a", "b"])
    with pytest.raises(ValueError, match=r"misaligned.*test\.de\.gz has 3 lines but .*test\.en\.gz has 2"):
        load_parallel(str(tmp_path), "test", "de", "en")
    with pytest.raises(FileNotFoundError, match=r"no train\.fr\.gz"):
        load_parallel(str(tmp_path), "train", "de", "fr")
    (tmp_path / "bad.de.gz").write_bytes(b"not gzip at all")
    write_gz(tmp_path / "bad.en.gz", ["x"])
    with pytest.raises(ValueError, match=r"bad\.de\.gz: cannot read"):
        load_parallel(str(tmp_path), "bad", "de", "en")


# ------------------------------------------------------------------------------------------------ real data
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared datasets not found at {SHARED}")


@needs_shared
def test_real_agnews_row_counts():
    d = SHARED / "ag_news_csv"
    te, tr = load_agnews(str(d), "test"), load_agnews(str(d), "train")
    assert len(te) == 7600 and len(tr) == 20000
    assert np.bincount(te.labels).tolist() == [1900] * 4 and np.bincount(tr.labels).tolist() == [5000] * 4
    assert te.class_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert not any("#39;" in t or "&lt;" in t or "\\" in t for t in te.texts + tr.texts)


@needs_shared
def test_real_multi30k_line_counts():
    d = str(SHARED / "multi30k")
    counts = [len(load_parallel(d, s, "de", "en")[0]) for s in ("train", "val", "test_2016_flickr")]
    assert counts == [29000, 1014, 1000]


@needs_shared
def test_real_imdb_counts():
    d = load_imdb(str(SHARED / "aclImdb_v1.tar.gz"))
    assert len(d["train"]) == 25000 and len(d["test"]) == 25000
    assert d["train"].labels.sum() == 12500 and d["test"].labels.sum() == 12500
    assert any("<br />" in t for t in d["train"].texts[:200])


def test_an_archive_given_as_a_text_corpus_is_refused(tmp_path):
    """A tar (gzipped or not), zip or bzip2 file is no text corpus: its headers would be trained on."""
    import bz2
    import zipfile

    from numformer.data import make_task

    write_imdb_tarball(tmp_path / "aclImdb_v1.tar.gz")
    with tarfile.open(tmp_path / "notes.tar", "w") as tar:
        tar.add(tmp_path / "aclImdb_v1.tar.gz", arcname="inner.bin")
    with zipfile.ZipFile(tmp_path / "notes.zip", "w") as z:
        z.writestr("a.txt", "some text\n")
    (tmp_path / "notes.bz2").write_bytes(bz2.compress(b"some text\n" * 20))
    cases = {"aclImdb_v1.tar.gz": r"is a tar archive \(compressed\), not a text file: it is read by "
                                  r"task = \"imdb\"", "notes.tar": "is a tar archive, not a text file: extract",
             "notes.zip": "is a zip archive, not a text file", "notes.bz2": "is a bzip2 file, not a text file"}
    for name, says in cases.items():
        for tokenizer in ("char", "bpe"):
            with pytest.raises(ValueError, match=says):
                make_task({"task": "text", "path": str(tmp_path / name), "tokenizer": tokenizer,
                           "vocab_size": 260})
    write_gz(tmp_path / "plain.txt.gz", ["a plain text corpus, gzipped, is read as documented"] * 20)
    assert make_task({"task": "text", "path": str(tmp_path / "plain.txt.gz"), "block_size": 8}).splits["train"].size
