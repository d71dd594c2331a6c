"""Loaders for the text datasets in the formats users download.

- ``load_imdb``: the Large Movie Review Dataset (Maas et al. 2011), read straight
  from the official tarball ``aclImdb_v1.tar.gz`` (nothing is extracted to disk)
  or from its extracted ``aclImdb/`` folder: ``aclImdb/{train,test}/{pos,neg}/ID_RATING.txt``.
- ``load_agnews``: AG News CSV files (Zhang et al. 2015), with or without a header row.
- ``load_parallel``: line-aligned text files such as Multi30k's ``train.de.gz`` / ``train.en.gz``.

Wrong paths and malformed files raise one error naming the file (and the line).
"""
from __future__ import annotations

import html
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .files import csv_rows, read_lines, read_parallel  # noqa: F401  (read_lines: part of this module's API)


@dataclass
class LabeledTexts:
    """Texts with integer labels (and an identifier per text, e.g. the IMDB file name)."""

    texts: list[str]
    labels: np.ndarray
    ids: list[str] = field(default_factory=list)
    class_names: list[str] = field(default_factory=list)
    source: str = ""                # the file the texts were read from (for reports)

    def __len__(self):
        return len(self.texts)

    def subset(self, index) -> "LabeledTexts":
        index = np.asarray(index, dtype=np.int64)
        return LabeledTexts([self.texts[i] for i in index], self.labels[index],
                            [self.ids[i] for i in index] if self.ids else [], self.class_names, self.source)


# --------------------------------------------------------------------------------------------------- IMDB
IMDB_CLASSES = ["neg", "pos"]                       # label 0 = negative, 1 = positive
_IMDB_MEMBER = re.compile(r"(?:^|/)aclImdb/(train|test)/(pos|neg)/([^/]+)$")
_IMDB_NAME = re.compile(r"^(\d+)_(\d+)\.txt$")


def _imdb_record(path_in_set, name, raw, splits, out):
    m = _IMDB_MEMBER.search(path_in_set)
    if m is None or m.group(1) not in splits:
        return
    split, polarity, fname = m.groups()
    if fname.startswith("."):                   # a hidden file (macOS .DS_Store, ._* AppleDouble) in the tarball
        return
    n = _IMDB_NAME.match(fname)
    if n is None:
        raise ValueError(f"{name}: unexpected IMDB file {path_in_set!r}; review files are named ID_RATING.txt")
    rating = int(n.group(2))
    if not (polarity == "pos" and 7 <= rating <= 10 or polarity == "neg" and 1 <= rating <= 4):
        raise ValueError(f"{name}: {path_in_set!r} has rating {rating}, impossible for a {polarity} review "
                         "(pos: 7-10, neg: 1-4)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: {path_in_set!r} is not UTF-8 text ({e})") from None
    out[split].append((polarity == "pos", int(n.group(1)), rating, text))


def find_imdb(path):
    """The tarball or aclImdb folder at or under ``path``."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        if os.path.isdir(os.path.join(path, "train")) or os.path.isdir(os.path.join(path, "test")):
            return path
        for cand in ("aclImdb", "aclImdb_v1.tar.gz"):
            if os.path.exists(os.path.join(path, cand)):
                return os.path.join(path, cand)
    raise FileNotFoundError(f"no IMDB data at {path!r}: give the official aclImdb_v1.tar.gz, its extracted aclImdb "
                            "folder, or a folder containing either (download: "
                            "https://ai.stanford.edu/~amaas/data/sentiment/)")


def _visible_files(folder):
    """The regular files directly in ``folder`` whose names do not start with a dot, in name order ([] when
    there is no such folder)."""
    if not os.path.isdir(folder):
        return []
    return sorted(e.path for e in os.scandir(folder) if e.is_file() and not e.name.startswith("."))


def imdb_review_files(folder, splits=("train", "test"), unlabelled=False) -> list[str]:
    """The files of an extracted aclImdb ``folder`` that ``load_imdb(folder, splits)`` reads (those of SPLIT/neg
    and SPLIT/pos) and, with ``unlabelled``, those ``load_imdb_unlabelled`` reads (train/unsup): every regular
    file of these folders but hidden ones (macOS's .DS_Store, ._* AppleDouble files), each folder in name order."""
    folders = [os.path.join(folder, split, polarity) for split in splits for polarity in ("neg", "pos")]
    folders += [os.path.join(folder, "train", "unsup")] if unlabelled else []
    return [f for d in folders for f in _visible_files(d)]


def load_imdb(path: str, splits=("train", "test")) -> dict[str, LabeledTexts]:
    """{split: LabeledTexts} for IMDB, label 1 = positive; sorted by (label, review id) for determinism.

    ``path``: ``aclImdb_v1.tar.gz`` (read with tarfile, no extraction), the
    extracted ``aclImdb`` folder, or a folder containing one of them.
    """
    splits = tuple(splits)
    src = find_imdb(path)
    out = {s: [] for s in splits}
    if os.path.isfile(src):
        try:
            with tarfile.open(src, "r:*") as tar:
                for member in tar:
                    if member.isfile() and _IMDB_MEMBER.search(member.name):
                        _imdb_record(member.name, src, tar.extractfile(member).read(), splits, out)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ValueError(f"{src}: not a readable IMDB tarball ({e})") from None
    else:
        for review in imdb_review_files(os.path.normpath(src), splits):     # hidden files skipped, as by path
            split, polarity, fname = Path(review).parts[-3:]
            with open(review, "rb") as f:
                _imdb_record(f"aclImdb/{split}/{polarity}/{fname}", review, f.read(), splits, out)
    result = {}
    for split, rows in out.items():
        if not rows:
            raise ValueError(f"{src}: no reviews found for the {split!r} split (expected aclImdb/{split}/pos/*.txt "
                             f"and aclImdb/{split}/neg/*.txt)")
        rows.sort(key=lambda r: (r[0], r[1]))
        result[split] = LabeledTexts([r[3] for r in rows], np.array([int(r[0]) for r in rows], dtype=np.int64),
                                     [f"{'pos' if r[0] else 'neg'}/{r[1]}_{r[2]}" for r in rows], list(IMDB_CLASSES),
                                     str(src))
    return result


_IMDB_UNSUP = re.compile(r"(?:^|/)aclImdb/train/unsup/(\d+)_\d+\.txt$")


def load_imdb_unlabelled(path: str) -> list[str]:
    """The 50,000 unlabelled reviews of IMDB's ``train/unsup`` folder, in review-id order ([] when the tarball or
    folder has none). The test reviews are not read."""
    src = find_imdb(path)
    found = []

    def keep(name, raw):
        m = _IMDB_UNSUP.search(name)
        if m is not None:
            try:
                found.append((int(m.group(1)), raw.decode("utf-8")))
            except UnicodeDecodeError as e:
                raise ValueError(f"{src}: {name!r} is not UTF-8 text ({e})") from None

    if os.path.isfile(src):
        try:
            with tarfile.open(src, "r:*") as tar:
                for member in tar:
                    if member.isfile() and _IMDB_UNSUP.search(member.name):
                        keep(member.name, tar.extractfile(member).read())
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ValueError(f"{src}: not a readable IMDB tarball ({e})") from None
    else:
        for review in imdb_review_files(os.path.normpath(src), splits=(), unlabelled=True):
            with open(review, "rb") as f:
                keep(f"aclImdb/train/unsup/{os.path.basename(review)}", f.read())
    return [text for _, text in sorted(found)]


# ------------------------------------------------------------------------------------------------ AG News
AGNEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]
_NUM_ENTITY = re.compile(r" ?#(x[0-9a-fA-F]+|\d+);")
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_SPACES = re.compile(r"\s+")


def _entity_char(m):
    code = m.group(1)
    n = int(code[1:], 16) if code[0] in "xX" else int(code)
    if 128 <= n <= 159:                  # Windows-1252 code points written as numbers (#151; is an em dash)
        return bytes([n]).decode("cp1252", errors="replace")
    try:
        return chr(n)
    except (ValueError, OverflowError):
        return m.group(0)


def clean_agnews_text(text: str) -> str:
    """Undo the escapes of the AG News CSV release.

    - Line breaks were written as a bare backslash ("a second\\team" is "a second team"),
      paragraph breaks as two. The readme says ``\\n``, but the files contain
      words such as "social\\network", so only the backslash is a break: each run
      of backslashes becomes a space, except ``\\$``, an escaped dollar sign ("\\$85" is "$85").
    - HTML entities: ``&amp;`` ``&lt;`` ``&quot;`` and numeric ones, which the
      release wrote without their ``&`` and after a space ("America #39;s",
      " #36;10 million"): those become "America's" and "$10 million". Codes
      128-159 are read as Windows-1252 (#151; is an em dash).
    - HTML markup that the entities decode to (``<A HREF=...>``, ``<B>``) is
      removed; ticker symbols such as ``<TXN.N>`` are kept.
    """
    text = re.sub(r"\\+", " ", text.replace("\\$", "$"))
    text = html.unescape(text)
    text = _NUM_ENTITY.sub(_entity_char, text)
    text = _TAG.sub(" ", text)
    return _SPACES.sub(" ", text).strip()


def read_class_names(folder: str) -> list[str] | None:
    """Class names from ``classes.txt`` (one per line) in ``folder``, or None if there is none."""
    return read_class_names_file(os.path.join(folder, "classes.txt"))


def read_class_names_file(p: str) -> list[str] | None:
    """Class names from a UTF-8 file with one per line (a leading byte-order mark dropped), or None if there is
    no such file; a file that is not UTF-8 is a ValueError naming it, the byte offset and the line."""
    if not os.path.isfile(p):
        return None
    with open(p, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{p} is not valid UTF-8 text: byte offset {e.start} (line {line}) "
                         f"holds {raw[e.start:e.start + 1]!r} ({e.reason}); convert the file to UTF-8 "
                         f"(e.g. iconv -f latin1 -t utf-8)") from None
    names = [line.strip() for line in text.split("\n") if line.strip()]
    if not names:
        raise ValueError(f"{p}: no class names")
    return names


def load_agnews_csv(path: str, class_names: list[str] | None = None, classes_file: str = "") -> LabeledTexts:
    """One AG News CSV file: ``"class","title","description"`` rows, optionally after a header row.

    Classes 1..C in the file become labels 0..C-1 (a leading UTF-8 byte-order mark is dropped, so that a
    headerless file keeps its first row). Text = title + " " + description,
    both cleaned with ``clean_agnews_text``. A malformed row raises a ValueError
    naming the file and line (and ``classes_file``, where the class names came from, for a class
    beyond them).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no AG News CSV file at {path!r}")
    class_names = list(class_names) if class_names else list(AGNEWS_CLASSES)
    C = len(class_names)
    texts, labels = [], []
    with open(path, encoding="utf-8-sig", newline="") as f:      # -sig: a byte-order mark is not the first class
        for n, (line, row) in enumerate(csv_rows(path, f)):
            if n == 0 and not row[0].strip().isdigit():      # a header row such as class_index,title,description
                if len(row) != 3:
                    raise ValueError(f"{path}, line {line}: expected a header with 3 columns "
                                     f"(class_index,title,description), got {len(row)}: {row[:5]}")
                continue
            if len(row) != 3:
                raise ValueError(f"{path}, line {line}: expected 3 fields (class, title, description), "
                                 f"got {len(row)}")
            cls = row[0].strip()
            if not cls.isdigit() or not 1 <= int(cls) <= C:
                raise ValueError(f"{path}, line {line}: class {cls!r} is not an integer in 1..{C}"
                                 + (f" ({classes_file} lists {C} class names: restore the missing ones)"
                                    if classes_file and cls.isdigit() and int(cls) > C else ""))
            labels.append(int(cls) - 1)
            texts.append(f"{clean_agnews_text(row[1])} {clean_agnews_text(row[2])}".strip())
    if not texts:
        raise ValueError(f"{path}: no rows")
    return LabeledTexts(texts, np.array(labels, dtype=np.int64), [], class_names, str(path))


def load_agnews(path: str, split: str, train_file: str = "", test_file: str = "test.csv") -> LabeledTexts:
    """AG News ``split`` ("train" or "test") from a folder of CSV files.

    train: ``train_file`` if given, else ``train.csv`` (the full release), else
    ``train_subset_20k.csv``; test: ``test_file``. Class names come from
    ``classes.txt`` when present (World, Sports, Business, Sci/Tech otherwise).
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no AG News folder at {path!r}: give the folder holding train.csv / test.csv "
                                "(and classes.txt) from ag_news_csv.tgz")
    inner = os.path.join(path, "ag_news_csv")
    if os.path.isdir(inner) and not any(n.endswith(".csv") for n in os.listdir(path)):
        path = inner                # the data folder's layout: the CSV files are in its ag_news_csv/
    if split == "train":
        names = [train_file] if train_file else ["train.csv", "train_subset_20k.csv"]
    elif split == "test":
        names = [test_file]
    else:
        raise ValueError(f"AG News split must be 'train' or 'test', got {split!r}")
    for name in names:
        p = os.path.join(path, name)
        if os.path.isfile(p):
            return load_agnews_csv(p, read_class_names(path), os.path.join(path, "classes.txt"))
    raise FileNotFoundError(f"no AG News {split} file in {path!r} (looked for {', '.join(names)})")


# ------------------------------------------------------------------------------------------- parallel text
def _find_split_file(folder, split, lang):
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(f"no {split}.{lang}.gz (or {split}.{lang}) in {folder!r}")


def load_parallel(path: str, split: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Aligned (sources, targets) from ``{split}.{src_lang}[.gz]`` and ``{split}.{tgt_lang}[.gz]``.

    The two files must have the same number of lines (line i of one translates
    line i of the other); otherwise a ValueError names both files and counts.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no parallel-text folder at {path!r}: give the folder holding files such as "
                                f"train.{src_lang}.gz and train.{tgt_lang}.gz (Multi30k task 1)")
    return read_parallel(_find_split_file(path, split, src_lang), _find_split_file(path, split, tgt_lang))
