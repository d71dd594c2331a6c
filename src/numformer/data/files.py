"""Reading the user's own files: text, tables (CSV / TSV / JSONL) and parallel text, with one clear error each.

Every reader decodes the whole file at once, so that a byte that is not valid
in the encoding is reported with its exact offset in the file (and its line).
Files ending in ``.gz`` are decompressed transparently.
"""
from __future__ import annotations

import csv
import glob
import gzip
import io
import json
import os
from pathlib import Path

from .._limits import check_bounds

TABLE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
                 ".json": "jsonl"}


# the first bytes of archives and compressed files (after a .gz is decompressed): not text, though a tar's
# headers decode as text and would otherwise be trained on
_MAGIC = ((b"\x1f\x8b", "gzip file"), (b"PK\x03\x04", "zip archive"), (b"BZh", "bzip2 file"),
          (b"\xfd7zXZ\x00", "xz file"), (b"\x28\xb5\x2f\xfd", "zstd file"), (b"7z\xbc\xaf\x27\x1c", "7z archive"))
# the datasets whose archive numformer reads itself: the task to name instead
_ARCHIVE_TASKS = (("aclimdb", 'task = "imdb" (or "imdb_lm")'),)


def check_not_archive(path, head: bytes) -> None:
    """One ValueError when ``head``, the first bytes of ``path``'s content (a ``.gz`` decompressed), are an
    archive's or a compressed file's: a text reader would read its binary headers as text."""
    kind = next((k for magic, k in _MAGIC if head.startswith(magic)), None)
    if kind is None and head[257:262] == b"ustar":
        kind = "tar archive"
    if kind is None:
        return
    name = Path(path).name
    kind = f"{kind} (compressed)" if name.endswith(".gz") and kind != "gzip file" else kind
    task = next((t for stem, t in _ARCHIVE_TASKS if name.lower().startswith(stem)), None)
    fix = (f"it is read by {task} with [data] path set to it" if task else
           "extract its text files and point [data] path at them (a .gz of one text file is read as is)")
    raise ValueError(f"{path} is a {kind}, not a text file: {fix}")


def _head(p: Path, n: int = 512) -> bytes:
    """The first ``n`` bytes of a file's content (of its decompressed content for a ``.gz``)."""
    try:
        with (gzip.open if p.name.endswith(".gz") else open)(p, "rb") as f:
            return f.read(n)
    except (OSError, EOFError):      # a damaged .gz: the reader's own error says so
        return b""


def read_text(path, encoding: str = "utf-8", allow_empty: bool = False) -> str:
    """The text of ``path`` (``.gz`` decompressed); a leading byte-order mark is dropped.

    Errors (ValueError unless the file is missing): not decodable (the file, the byte
    offset and the line are named), an unreadable gzip file, an empty file.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no file at {str(path)!r}" + (" (it is a folder)" if p.is_dir() else ""))
    raw = p.read_bytes()
    where = ""
    if p.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:                 # gzip.BadGzipFile is an OSError
            raise ValueError(f"{path}: cannot read ({e})") from None
        where = " of the uncompressed text"
    check_not_archive(path, raw[:512])
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path} is not valid {encoding} text: byte offset {e.start}{where} (line {line}) "
                         f"holds {raw[e.start:e.start + 1]!r} ({e.reason}); convert the file to {encoding} "
                         f"(e.g. iconv -f latin1 -t utf-8)" + ("" if encoding.lower() != "utf-8" else
                                                               " or set [data] encoding")) from None
    except LookupError:
        raise ValueError(f"[data] encoding = {encoding!r} is not a known text encoding (e.g. 'utf-8', 'latin-1')"
                         ) from None
    text = text.removeprefix("\ufeff")
    if not allow_empty and not text.strip():
        raise ValueError(f"{path}: empty file" + ("" if not raw else " (only white space)"))
    return text


def iter_text(path, encoding: str = "utf-8", block_bytes: int = 1 << 20):
    """The text of ``path`` in chunks of about ``block_bytes`` bytes, each ending with a line break (but the
    last), so that a file larger than memory can be read: ``"".join(iter_text(p))`` equals ``read_text(p)``.

    The same checks as ``read_text`` (the byte offset and line of a byte that is not valid text, an empty
    file). Encodings in which a line break is not the byte 0x0A (UTF-16, UTF-32) are read whole.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no file at {str(path)!r}" + (" (it is a folder)" if p.is_dir() else ""))
    try:
        ascii_compatible = "a\n".encode(encoding) == b"a\n"
    except LookupError:
        raise ValueError(f"[data] encoding = {encoding!r} is not a known text encoding (e.g. 'utf-8', 'latin-1')"
                         ) from None
    if not ascii_compatible:
        yield read_text(path, encoding)
        return
    check_not_archive(path, _head(p))
    opener = gzip.open if p.name.endswith(".gz") else open
    offset, lines, pending, seen_text = 0, 0, b"", False
    try:
        with opener(p, "rb") as f:
            while True:
                block = f.read(block_bytes)
                data = pending + block
                if not data:
                    break
                cut = _cut(data, block_bytes) if block else len(data)
                if cut == 0:                 # no line break yet: read on
                    pending = data
                    continue
                part, pending = data[:cut], data[cut:]
                text = _decode_part(path, part, encoding, offset, lines, first=offset == 0)
                seen_text = seen_text or bool(text.strip())
                if text:
                    yield text
                offset, lines = offset + len(part), lines + part.count(b"\n")
    except (OSError, EOFError) as e:                 # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot read ({e})") from None
    if not seen_text:
        raise ValueError(f"{path}: empty file" + ("" if offset == 0 else " (only white space)"))


def _cut(data: bytes, block_bytes: int) -> int:
    """Where to end a chunk of ``data``: after its last line break; in a line longer than 16 blocks, where a
    UTF-8 character starts; 0 to read on."""
    cut = data.rfind(b"\n") + 1
    if cut or len(data) < 16 * block_bytes:
        return cut
    cut = len(data) - 4
    while cut < len(data) and 0x80 <= data[cut] < 0xC0:
        cut += 1
    return cut


def _decode_part(path, part: bytes, encoding, offset, lines, first):
    try:
        text = part.decode(encoding)
    except UnicodeDecodeError as e:
        line = lines + part.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path} is not valid {encoding} text: byte offset {offset + e.start} (line {line}) holds "
                         f"{part[e.start:e.start + 1]!r} ({e.reason}); convert the file to {encoding} "
                         f"(e.g. iconv -f latin1 -t utf-8)" + ("" if encoding.lower() != "utf-8" else
                                                               " or set [data] encoding")) from None
    return text.removeprefix("\ufeff") if first else text


def split_lines(text: str) -> list[str]:
    """``text``'s lines without their ends, split at line feeds (and "\\r\\n") only: ``str.splitlines`` also
    splits at U+2028, U+0085 and form feeds, which a sentence or a JSON string may hold, and would break a
    record or shift a parallel file's lines."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_lines(path) -> list[str]:
    """The lines of a UTF-8 file without their line ends (an empty file is an error)."""
    return split_lines(read_text(path))


def folder_files(folder) -> list[str]:
    """Every regular file in ``folder``, recursively, sorted; hidden files (and those in hidden folders) are
    skipped: a folder's files as numformer reads a folder of data."""
    return sorted(str(p) for p in Path(folder).rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def expand_paths(path: str = "", paths=()) -> list[str]:
    """Files named by ``path`` (a file, a folder: every file in it, recursively, sorted; or a glob pattern)
    and by the list ``paths`` (each one the same). Hidden files are skipped; nothing found is an error, and so is
    a file named twice (by path and paths, or by two patterns): it would be read twice, and the end of the
    first copy, which trains, is the text of the second one's end, which validates."""
    items = ([path] if path else []) + list(paths or [])
    out, seen = [], {}
    for item in items:
        item = str(item)
        if any(ch in item for ch in "*?["):
            found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
            if not found:
                raise FileNotFoundError(f"no file matches {item!r}")
        elif os.path.isdir(item):
            found = folder_files(item)
            if not found:
                raise FileNotFoundError(f"the folder {item!r} holds no files")
        elif os.path.isfile(item):
            found = [item]
        else:
            raise FileNotFoundError(f"no such file or folder: {item!r}")
        for file in found:
            real = os.path.realpath(file)
            if real in seen:
                raise ValueError(f"[data] path and paths name the file {file!r} twice (by {seen[real]!r} and by "
                                 f"{item!r}): each file is read once; remove the repeat")
            seen[real] = item
        out += found
    return out


# --------------------------------------------------------------------------------------------------- tables
def table_format(path, fmt: str = "") -> str:
    """"csv", "tsv" or "jsonl": ``fmt`` when given, else from the file's extension (``.gz`` ignored)."""
    if fmt:
        if fmt not in ("csv", "tsv", "jsonl"):
            raise ValueError(f"[data] format = {fmt!r} is not supported; choose 'csv', 'tsv' or 'jsonl'")
        return fmt
    name = str(path).removesuffix(".gz")
    ext = os.path.splitext(name)[1].lower()
    if ext not in TABLE_FORMATS:
        raise ValueError(f"cannot tell the format of {path} from its extension; name it .csv, .tsv or .jsonl, "
                         f"or set [data] format = 'csv', 'tsv' or 'jsonl'")
    return TABLE_FORMATS[ext]


def read_table(path, fmt: str = "", header: bool = True) -> tuple[list[str], list[tuple[int, dict]]]:
    """(column names, [(line number, {column: value}), ...]) of a CSV, TSV or JSON-lines file.

    CSV and TSV: the first row names the columns (``header``), else the columns are
    named by position, "0", "1", ...; TSV fields are taken literally (no quoting).
    JSONL: one JSON object per line; its keys are the columns. Blank lines are skipped.
    """
    fmt = table_format(path, fmt)
    text = read_text(path)
    if fmt == "jsonl":
        return _read_jsonl(path, text)
    columns, rows = None, []
    for line, row in csv_rows(path, io.StringIO(text, newline=""), fmt):
        if columns is None:
            columns = [c.strip() for c in row] if header else [str(i) for i in range(len(row))]
            if header:
                _check_header(path, line, columns)
                continue
        if len(row) != len(columns):
            raise ValueError(f"{path}, line {line}: {len(row)} fields, but the "
                             f"{'header has' if header else 'first row has'} {len(columns)}")
        rows.append((line, dict(zip(columns, row))))
    if not rows:
        raise ValueError(f"{path}: no data rows" + (" after the header" if header and columns else ""))
    return columns, rows


def _check_header(path, line, columns) -> None:
    """One ValueError when a header row names a column twice: a row keeps one of the two values (the last),
    so a duplicated ``label`` column would silently train on the other one. Unnamed columns (empty names, e.g. a
    spreadsheet's trailing commas) may repeat."""
    seen = {}
    for i, name in enumerate(columns, 1):
        if name and name in seen:
            raise ValueError(f"{path}, line {line}: the header names the column {name!r} twice (columns {seen[name]} "
                             f"and {i}); a row would keep only the last one: rename or remove one of them")
        seen.setdefault(name, i)


# csv's default limit on a field (131,072 characters) is below a long document; numformer reads a whole file
# into memory and bounds no line of it (JSONL and text lines neither), so a CSV field may be as long as a file
CSV_FIELD_LIMIT = 2 ** 31 - 1       # the largest limit csv accepts on every platform (a C long)


def csv_rows(path, lines, fmt="csv"):
    """(line number, fields) of each non-blank row of CSV or TSV ``lines`` (an open file or a StringIO); TSV
    fields are taken literally (no quoting); a field may hold up to ``CSV_FIELD_LIMIT`` characters. A malformed
    row, or bytes that are not UTF-8, raise one ValueError naming ``path`` and the line."""
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {"delimiter": ","}
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    reader = csv.reader(lines, strict=True, **dialect)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise ValueError(f"{path}, line {reader.line_num}: malformed {fmt.upper()} ({e})") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e}); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                             ) from None
        if row and any(c.strip() for c in row):
            yield reader.line_num, row


def json_lines(text, path, hint):
    """(line number, value) of each non-blank line of the JSON-lines ``text`` of ``path``; one error naming the
    line that is not JSON. Every line's nesting is checked at once (one vectorized pass: a dataset may be larger
    than the files numformer writes, ``hint`` says what a line should hold); lines are split at line feeds only
    (``split_lines``: JSON strings may hold U+2028, U+0085 or form feeds unescaped)."""
    check_bounds(text, str(path), max_bytes=len(text) + 1, hint=hint)
    for n, line in enumerate(split_lines(text), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {n}: not valid JSON ({e.msg}); JSON lines hold one value per line") \
                from None


def _read_jsonl(path, text):
    columns, rows = {}, []
    for n, obj in json_lines(text, path, hint="a JSONL row is one flat JSON object"):
        if not isinstance(obj, dict):
            raise ValueError(f"{path}, line {n}: a JSON {type(obj).__name__}, but JSONL rows must be objects "
                             '({"text": ..., "label": ...})')
        columns.update(dict.fromkeys(obj))
        rows.append((n, obj))
    if not rows:
        raise ValueError(f"{path}: no data rows")
    return list(columns), rows


def _cell(value) -> str:
    """A table value as text: strings as they are, numbers and booleans as JSON writes them."""
    return value if isinstance(value, str) else json.dumps(value)


def read_labeled(path, text_columns, label_column, fmt: str = "", header: bool = True):
    """(texts, label strings, line numbers) of a table: text = the ``text_columns`` joined by a space.

    A missing column is an error naming the file, the column and the columns there are; an empty label or text,
    and (JSONL) a label or text that is a list or an object, are errors naming the line.
    """
    columns, rows = read_table(path, fmt, header)
    for col, key in [(c, "text_column") for c in text_columns] + [(label_column, "label_column")]:
        if col not in columns:
            raise ValueError(f"{path} has no column {col!r} (its columns: {', '.join(map(repr, columns))}); "
                             f"set [data] {key}" + ("s" if key == "text_column" and len(text_columns) > 1 else ""))
    texts, labels, lines = [], [], []
    for line, row in rows:
        if any(c not in row for c in (*text_columns, label_column)):
            missing = [c for c in (*text_columns, label_column) if c not in row]
            raise ValueError(f"{path}, line {line}: no {missing[0]!r} in this row")
        nested = next((c for c in (label_column, *text_columns) if isinstance(row[c], (list, dict))), None)
        if nested is not None:
            raise ValueError(f"{path}, line {line}: the {'label' if nested == label_column else 'text'} in column "
                             f"{nested!r} is a JSON {'list' if isinstance(row[nested], list) else 'object'} "
                             f"({json.dumps(row[nested])[:40]}); it must be one string, number or boolean")
        text = " ".join(_cell(row[c]).strip() for c in text_columns if row[c] is not None).strip()
        label = row[label_column]
        if label is None or not _cell(label).strip():
            raise ValueError(f"{path}, line {line}: empty label in column {label_column!r}")
        if not text:
            raise ValueError(f"{path}, line {line}: empty text in column(s) {', '.join(map(repr, text_columns))}")
        texts.append(text)
        labels.append(_cell(label).strip())
        lines.append(line)
    return texts, labels, lines


# ------------------------------------------------------------------------------------------- parallel text
def read_parallel(src_path, tgt_path) -> tuple[list[str], list[str]]:
    """Line-aligned (sources, targets): line i of one file translates line i of the other.

    Different line counts are an error naming both files and both counts; a line that is empty (or white space)
    in one file but not in the other is an error naming the file and the line. A line empty in both files is
    skipped, as a blank line of a TSV of pairs is.
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"misaligned parallel files: {src_path} has {len(src)} lines but {tgt_path} has "
                         f"{len(tgt)}; line i of one must translate line i of the other")
    keep = []
    for n, (s, t) in enumerate(zip(src, tgt), 1):
        if s.strip() and t.strip():
            keep.append(n - 1)
        elif s.strip() or t.strip():
            blank, other = (src_path, tgt_path) if t.strip() else (tgt_path, src_path)
            raise ValueError(f"{blank}, line {n}: empty, but line {n} of {other} is not: a pair needs both sides "
                             f"(a blank line in one file only shifts every later pair); remove the line from both "
                             f"files, or fill it in")
    if len(keep) == len(src):
        return src, tgt
    return [src[i] for i in keep], [tgt[i] for i in keep]


def read_pairs(path) -> tuple[list[str], list[str]]:
    """(sources, targets) from a TSV of pairs: one ``source<TAB>target`` per line (blank lines skipped)."""
    src, tgt = [], []
    for n, line in enumerate(split_lines(read_text(path)), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise ValueError(f"{path}, line {n}: expected 'source<TAB>target' (2 non-empty fields), got "
                             f"{len(fields)} field(s): {line[:60]!r}")
        src.append(fields[0])
        tgt.append(fields[1])
    return src, tgt
