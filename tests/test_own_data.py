"""The user's own data for every task: text files, a labelled table, parallel text; and one clear error each
for bad input. The files are small fixtures written here; the models train a few steps end to end."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from numformer.cli import main
from numformer.data import make_task, register_task
from numformer.data.tasks import CopyTask

MODEL = {
    "classifier": 'type = "classifier"\nd_model = 32\nn_heads = 2\nn_layers = 1\nd_ff = 64\ndropout = 0.0',
    "transformer": 'type = "transformer"\nd_model = 32\nn_heads = 2\nn_layers = 1\nd_ff = 64\ndropout = 0.0',
    "gpt": 'type = "gpt"\nd_model = 32\nn_heads = 2\nn_layers = 1',
}
TRAIN = "max_steps = 12\nbatch_size = 16\nlr = 3e-3\neval_every = 6\ncheckpoint_every = 1000\nlog_every = 6\nseed = 0"


def toml_value(v):
    return json.dumps(v) if not isinstance(v, bool) else str(v).lower()


def train(tmp_path, model, data: dict, name="run"):
    """`numformer train` on a config with these [data] keys; returns the run folder."""
    cfg = tmp_path / f"{name}.toml"
    lines = "\n".join(f"{k} = {toml_value(v)}" for k, v in data.items())
    cfg.write_text(f"[model]\n{MODEL[model]}\n\n[data]\n{lines}\n\n[train]\n{TRAIN}\n", encoding="utf-8")
    run = tmp_path / name
    assert main(["train", str(cfg), "--out", str(run), "--quiet"]) == 0
    return run


WORDS = {"sports": "match goal team coach season", "science": "atom cell laser orbit theory",
         "money": "stock bank price market profit"}


def labelled_rows(n, seed=0):
    """n (text, label) rows: each text is 6 words of its topic and 2 common words."""
    rng = np.random.default_rng(seed)
    labels = list(WORDS)
    rows = []
    for i in range(n):
        label = labels[i % 3]
        words = list(rng.choice(WORDS[label].split(), 6)) + ["the", "news"]
        rows.append((" ".join(rng.permutation(words)), label))
    return rows


def write_csv(path, rows, text_col="review", label_col="topic", sep=","):
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=sep, quoting=csv.QUOTE_MINIMAL if sep == "," else csv.QUOTE_NONE)
        w.writerow(["id", text_col, label_col])
        for i, (text, label) in enumerate(rows):
            w.writerow([i, text, label])
    return path


# ----------------------------------------------------------------------------------------------------- text
def test_text_from_several_files_and_a_folder(tmp_path, capsys):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("to be or not to be\n" * 40, encoding="utf-8")
    (folder / "sub" / "b.txt").write_text("that is the question" * 30, encoding="utf-8")  # no final newline
    (folder / ".hidden").write_text("\x00 skipped", encoding="utf-8")
    t = make_task({"task": "text", "path": str(folder), "block_size": 8})
    text = (folder / "a.txt").read_text() + (folder / "sub" / "b.txt").read_text() + "\n"
    assert t.tokenizer.decode(np.concatenate([t.splits["train"], t.splits["val"]])) == text
    t2 = make_task({"task": "text", "paths": [str(folder / "sub" / "b.txt"), str(folder / "a.txt")], "block_size": 8})
    assert len(t2.splits["train"]) + len(t2.splits["val"]) == len(text)
    t3 = make_task({"task": "text", "path": str(folder / "*.txt"), "block_size": 8})
    assert "question" not in t3.tokenizer.decode(t3.splits["val"])  # the glob matched a.txt only
    with pytest.raises(ValueError, match=r"\[data\] path and paths name the file '.*a\.txt' twice \(by '.*corpus' "
                                         r"and by '.*a\.txt'\): each file is read once; remove the repeat"):
        make_task({"task": "text", "path": str(folder), "paths": [str(folder / "a.txt")], "block_size": 8})
    run = train(tmp_path, "gpt", {"task": "text", "path": str(folder), "block_size": 16})
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "to be", "--max-new-tokens", "10", "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith("to be")


# ------------------------------------------------------------------------------------------- classification
@pytest.fixture(scope="module")
def topics_csv(tmp_path_factory):
    d = tmp_path_factory.mktemp("own_cls")
    return write_csv(d / "train.csv", labelled_rows(300)), write_csv(d / "test.csv", labelled_rows(60, seed=1))


def test_classification_from_a_csv_pair_trains_and_classifies(topics_csv, tmp_path, capsys):
    train_csv, test_csv = topics_csv
    data = {"task": "classification", "path": str(train_csv), "test_path": str(test_csv), "text_column": "review",
            "label_column": "topic", "min_freq": 1, "max_len": 16}
    t = make_task(data, seed=0)
    assert t.label_names == ["money", "science", "sports"]                     # from the data, sorted
    assert [len(t.data[s]) for s in ("train", "val", "test")] == [270, 30, 60]  # val: a tenth, held out
    assert "train.csv (300 rows)" in t.describe()
    run = train(tmp_path, "classifier", data)
    capsys.readouterr()
    assert main(["classify", str(run), "--json", "the atom and the laser", "bank stock price"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(results) == 2 and all(r["label"] in WORDS for r in results)
    assert all(abs(sum(r["probabilities"].values()) - 1) < 1e-6 for r in results)


def test_classification_from_tsv_and_jsonl_single_file(tmp_path):
    rows = labelled_rows(100)
    tsv = write_csv(tmp_path / "data.tsv", rows, "text", "label", sep="\t")
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps({"title": t.split()[0], "body": t, "stars": i % 3 + 1}) + "\n"
                             for i, (t, _) in enumerate(rows)), encoding="utf-8")
    t = make_task({"task": "classification", "path": str(tsv), "min_freq": 1}, seed=0)
    assert [len(t.data[s]) for s in ("train", "val", "test")] == [81, 9, 10]   # test, then val: a tenth each
    j = make_task({"task": "classification", "path": str(jsonl), "text_columns": ["title", "body"],
                   "label_column": "stars", "test_size": 20, "val_size": 5, "min_freq": 1}, seed=0)
    assert j.label_names == ["1", "2", "3"] and [len(j.data[s]) for s in ("train", "val", "test")] == [75, 5, 20]
    assert all(x.split()[0] == x.split()[1] for x in j.data["train"].texts)   # title + " " + body
    headless = tmp_path / "headless.csv"
    headless.write_text("".join(f'{label},"{text}"\n' for text, label in rows), encoding="utf-8")
    h = make_task({"task": "classification", "path": str(headless), "header": False, "text_column": "1",
                   "label_column": "0", "min_freq": 1}, seed=0)
    assert h.label_names == sorted(WORDS)


# ------------------------------------------------------------------------------------------------ translation
def reversal_pairs(n, seed=0):
    rng = np.random.default_rng(seed)
    src = [" ".join(str(d) for d in rng.integers(0, 10, rng.integers(3, 6))) for _ in range(n)]
    return src, [" ".join(reversed(s.split())) for s in src]


def test_translation_from_parallel_files_and_tsv(tmp_path, capsys):
    src, tgt = reversal_pairs(300)
    (tmp_path / "train.src").write_text("\n".join(src[:250]) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "train.tgt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(tgt[:250]) + "\n")
    (tmp_path / "test.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(src[250:], tgt[250:])), encoding="utf-8")
    data = {"task": "translation", "train": [str(tmp_path / "train.src"), str(tmp_path / "train.tgt.gz")],
            "test": [str(tmp_path / "test.tsv")], "min_freq": 1, "max_len": 10, "beam_size": 2}
    t = make_task(data, seed=0)
    assert [len(t.sources(s)) for s in ("train", "val", "test")] == [225, 25, 50]
    assert t.sources("test")[0] == src[250] and t.references("test")[0] == tgt[250]
    assert "(val held out of train)" in t.describe()
    run = train(tmp_path, "transformer", data)
    from numformer.train import load_model, load_task

    figures = load_task(run).evaluate(load_model(run), "test")
    assert set(figures) >= {"bleu_greedy", "bleu_beam"} and 0.0 <= figures["bleu_greedy"] <= 100.0
    capsys.readouterr()
    assert main(["translate", str(run), "1 2 3", "4 5 6 7"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    pairs = tmp_path / "all.tsv"
    pairs.write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt)), encoding="utf-8")
    t2 = make_task({"task": "translation", "train": [str(pairs)], "val_size": 30, "test_size": 20}, seed=0)
    assert [len(t2.sources(s)) for s in ("train", "val", "test")] == [250, 30, 20]


# ------------------------------------------------------------------------------------------------ bad input
def test_csv_without_the_named_column(topics_csv):
    with pytest.raises(ValueError, match=r"train\.csv has no column 'text' \(its columns: 'id', 'review', "
                                         r"'topic'\); set \[data\] text_column"):
        make_task({"task": "classification", "path": str(topics_csv[0]), "label_column": "topic"}, seed=0)
    with pytest.raises(ValueError, match=r"no column 'label'.*set \[data\] label_column"):
        make_task({"task": "classification", "path": str(topics_csv[0]), "text_column": "review"}, seed=0)


def test_unknown_label_at_test_time(topics_csv, tmp_path):
    test = write_csv(tmp_path / "test.csv", labelled_rows(5) + [("a story about cooking", "food")])
    with pytest.raises(ValueError, match=r"test\.csv, line 7: label 'food' does not occur in the training data "
                                         r".*train\.csv \(its labels: 'money', 'science', 'sports'\)"):
        make_task({"task": "classification", "path": str(topics_csv[0]), "test_path": str(test),
                   "text_column": "review", "label_column": "topic"}, seed=0)


def test_misaligned_parallel_files_name_both_counts(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"misaligned parallel files: .*a\.de has 3 lines but .*a\.en has 2"):
        make_task({"task": "translation", "train": [str(tmp_path / "a.de"), str(tmp_path / "a.en")]}, seed=0)
    with pytest.raises(ValueError, match=r"names 3 files; give two line-aligned files"):
        make_task({"task": "translation", "train": [str(tmp_path / "a.de")] * 3}, seed=0)
    (tmp_path / "p.tsv").write_text("eins\tone\nzwei\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.tsv, line 2: expected 'source<TAB>target'"):
        make_task({"task": "translation", "train": [str(tmp_path / "p.tsv")]}, seed=0)


def test_empty_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    (tmp_path / "blank.txt").write_text("\n\n  \n", encoding="utf-8")
    (tmp_path / "x.en").write_text("one\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.csv: empty file"):
        make_task({"task": "classification", "path": str(empty)}, seed=0)
    with pytest.raises(ValueError, match=r"blank\.txt: empty file \(only white space\)"):
        make_task({"task": "text", "path": str(tmp_path / "blank.txt")})
    with pytest.raises(ValueError, match=r"blank\.txt: empty file"):
        make_task({"task": "translation", "train": [str(tmp_path / "blank.txt"), str(tmp_path / "x.en")]}, seed=0)
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"header\.csv: no data rows after the header"):
        make_task({"task": "classification", "path": str(header_only)}, seed=0)


def test_non_utf8_text_names_file_and_byte_offset(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("first line\ncaf\u00e9 au lait\n".encode("latin-1"))
    msg = r"latin1\.txt is not valid utf-8 text: byte offset 14 \(line 2\) holds b'\\xe9'"
    with pytest.raises(ValueError, match=msg):
        make_task({"task": "text", "path": str(bad)})
    csv_bad = tmp_path / "bad.csv"
    csv_bad.write_bytes(b"text,label\n" + "na\u00efve,a\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"bad\.csv is not valid utf-8 text: byte offset 13 \(line 2\)"):
        make_task({"task": "classification", "path": str(csv_bad)}, seed=0)
    with gzip.open(tmp_path / "bad.de.gz", "wb") as f:
        f.write(b"ok\n\xff\n")
    (tmp_path / "ok.en").write_text("ok\nok\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.de\.gz is not valid utf-8 text: byte offset 3 of the uncompressed "
                                         r"text \(line 2\)"):
        make_task({"task": "translation", "train": [str(tmp_path / "bad.de.gz"), str(tmp_path / "ok.en")]}, seed=0)


def test_other_table_errors(tmp_path):
    odd = tmp_path / "data.xlsx"
    odd.write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match=r"cannot tell the format of .*data\.xlsx.*set \[data\] format"):
        make_task({"task": "classification", "path": str(odd)}, seed=0)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("text,label\nhello,a\nworld,b,extra\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ragged\.csv, line 3: 3 fields, but the header has 2"):
        make_task({"task": "classification", "path": str(ragged)}, seed=0)
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"text": "a", "label": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: a JSON list, but JSONL rows must be objects"):
        make_task({"task": "classification", "path": str(jl)}, seed=0)
    with pytest.raises(ValueError, match="set text_column or text_columns, not both"):
        make_task({"task": "classification", "path": str(ragged), "text_column": "a", "text_columns": ["b"]})
    with pytest.raises(FileNotFoundError, match=r"set \[data\] path to your training file"):
        make_task({"task": "classification"}, seed=0)
    with pytest.raises(FileNotFoundError, match=r"set \[data\] train = "):
        make_task({"task": "translation"}, seed=0)


# ----------------------------------------------------------------------- labels and pairs as the files hold them
def test_one_label_value_spelled_two_ways_is_refused_and_the_order_is_total(tmp_path):
    """"0" and "0.0" (or 1 and true) were two classes whose ids followed Python's string hashing: the same run
    read in two processes (eval, --resume) saw its labels permuted. Now one line names both spellings and their
    lines; every other label set sorts the same in every process (numbers numerically, else by their text)."""
    num = tmp_path / "num.csv"
    num.write_text("text,label\na,1\nb,1.0\nc,0\nd,0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"num\.csv: the label column 'label' holds '1' \(line 2\) and '1\.0' "
                                         r"\(line 3\), one value spelled two ways.*write every label the same way"):
        make_task({"task": "classification", "path": str(num)}, seed=0)
    jl = tmp_path / "mix.jsonl"
    jl.write_text("".join(json.dumps({"text": t, "label": v}) + "\n" for t, v in
                          [("good", 1), ("bad", 0), ("fine", True), ("poor", 0), ("nice", 1)]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"holds '1' \(line 1\) and 'true' \(line 3\), one value spelled two ways"):
        make_task({"task": "classification", "path": str(jl)}, seed=0)
    from numformer.data.user_tasks import label_order
    assert label_order(["10", "9", "-1", "9"]) == ["-1", "9", "10"]
    assert label_order(["b", "10", "a", "9"]) == ["10", "9", "a", "b"]
    assert label_order(["true", "false", "nan", "x"]) == ["false", "nan", "true", "x"]


def test_classification_refuses_junk_it_used_to_load(tmp_path):
    """A header naming a column twice (the last one silently won), a JSONL label that is a list or an object,
    test_path naming the training file (the test scored the training rows), and a label column whose labels are
    nearly all different (text and label columns swapped: 40 classes from 40 rows): one line each."""
    dup = tmp_path / "dup.csv"
    dup.write_text("text,label,label\na,pos,neg\nb,neg,pos\nc,pos,neg\nd,neg,pos\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dup\.csv, line 1: the header names the column 'label' twice \(columns 2 "
                                         r"and 3\).*rename or remove one"):
        make_task({"task": "classification", "path": str(dup)}, seed=0)
    for value, kind in (([1], "list"), ({"y": 1}, "object")):
        jl = tmp_path / "nested.jsonl"
        jl.write_text("".join(json.dumps({"text": f"t{i}", "label": i % 2}) + "\n" for i in range(6))
                      + json.dumps({"text": "x", "label": value}) + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=rf"nested\.jsonl, line 7: the label in column 'label' is a JSON {kind}"):
            make_task({"task": "classification", "path": str(jl)}, seed=0)
    same = tmp_path / "same.csv"
    same.write_text("text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(40)), encoding="utf-8")
    with pytest.raises(ValueError, match=r"test_path names the training file .*same\.csv.*give a separate test file"):
        make_task({"task": "classification", "path": str(same), "test_path": str(tmp_path / "." / "same.csv")})
    swap = tmp_path / "swap.csv"
    swap.write_text("label,text\n" + "".join(f"review {i},{'pos' if i % 2 else 'neg'}\n" for i in range(40)),
                    encoding="utf-8")
    with pytest.raises(ValueError, match=r"swap\.csv: in the label column 'label', 40 of the 40 rows have a label no "
                                         r"other row has .*\(swapped\?\)"):
        make_task({"task": "classification", "path": str(swap)}, seed=0)


def test_saved_label_names_must_be_the_datas(topics_csv, tmp_path, capsys):
    """eval and --resume rebuild the labels from the data: when they are not the run's saved label_names (in its
    tokenizer.json), label id i would name another class than the model learned; one line says so."""
    train_csv, _ = topics_csv
    data = {"task": "classification", "path": str(tmp_path / "t.csv"), "text_column": "review",
            "label_column": "topic", "min_freq": 1, "max_len": 16}
    (tmp_path / "t.csv").write_text(train_csv.read_text(encoding="utf-8"), encoding="utf-8")
    t = make_task(data, seed=0)
    assert make_task(data, seed=0, tokenizer_state=t.tokenizer_state()).label_names == t.label_names
    with pytest.raises(ValueError, match=r"the run's classes \(label_names in its tokenizer\.json\) are \['sports', "
                                         r"'money', 'science'\] \(3\) but the data gives \['money', 'science', "
                                         r"'sports'\] \(3\)"):
        make_task(data, seed=0, tokenizer_state={**t.tokenizer_state(), "label_names": ["sports", "money", "science"]})
    run = train(tmp_path, "classifier", data)
    (tmp_path / "t.csv").write_text(train_csv.read_text(encoding="utf-8").replace(",money", ",finance"),
                                    encoding="utf-8")
    (run / "data_files.json").unlink()          # the data accepted as they are now: the labels are still checked
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    assert "the data gives ['finance', 'science', 'sports']" in capsys.readouterr().err


def test_fine_tuning_a_classifier_on_data_of_another_number_of_classes_is_refused(topics_csv, tmp_path, capsys):
    """[model] init_from keeps the source's output layer, one row a class: on data of 2 classes a 3-class model
    trained with an output no label reaches (and classify then failed), on data of more classes the first step
    failed on a label id. The saved label_names refuse other classes first; without them (a run written before
    they were saved, or a task of one's own that saves none) the class counts are compared."""
    from numformer.config import merge_init_from
    train_csv, test_csv = topics_csv
    data = {"task": "classification", "path": str(train_csv), "test_path": str(test_csv), "text_column": "review",
            "label_column": "topic", "min_freq": 1, "max_len": 16}
    source = train(tmp_path, "classifier", data, name="source")
    two = tmp_path / "two.csv"
    two.write_text("".join(line + "\n" for line in train_csv.read_text(encoding="utf-8").splitlines()
                           if not line.endswith(",money")), encoding="utf-8")

    def fine_tune(name, **changes):
        cfg = tmp_path / f"{name}.toml"
        lines = "\n".join(f"{k} = {toml_value(v)}" for k, v in {**data, **changes}.items())
        cfg.write_text(f'[model]\ninit_from = "{source}"\n\n[data]\n{lines}\n\n[train]\n{TRAIN}\n', encoding="utf-8")
        capsys.readouterr()
        return main(["train", str(cfg), "--out", str(tmp_path / name), "--quiet"]), capsys.readouterr().err

    rc, err = fine_tune("labelled", path=str(two), test_path="")
    assert rc == 2 and "the run's classes (label_names in its tokenizer.json) are ['money', 'science', 'sports'] " \
                       "(3) but the data gives ['science', 'sports'] (2)" in err
    state = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    del state["label_names"]
    (source / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    rc, err = fine_tune("two", path=str(two), test_path="")
    assert rc == 2 and not (tmp_path / "two" / "model.safetensors").exists()
    assert f"the data has 2 classes but the init_from model '{source}' classifies into 3 (n_classes" in err
    assert "fine-tune it on data of its 3 classes, the same labels in the same order, or train a new model" in err
    assert fine_tune("three")[0] == 0                                   # the source's 3 classes: fine-tuned
    model = json.loads((source / "config.json").read_text(encoding="utf-8"))["model"]
    with pytest.raises(ValueError, match=r"^the data has 4 classes but the init_from model 'src' classifies into 3"):
        merge_init_from("src", {}, {**model, "type": "classifier"}, {"vocab_size": 4, "n_classes": 4}, {})
    assert merge_init_from("src", {}, {**model, "type": "classifier"}, {"n_classes": 3}, {})["n_classes"] == 3


def fine_tune(tmp_path, source, name, data, capsys):
    """`numformer train` of a config with ``[model] init_from = source`` and these [data] keys into
    tmp_path / name; returns (exit code, stderr)."""
    cfg = tmp_path / f"{name}.toml"
    lines = "\n".join(f"{k} = {toml_value(v)}" for k, v in data.items())
    cfg.write_text(f'[model]\ninit_from = "{source}"\n\n[data]\n{lines}\n\n[train]\n{TRAIN}\n', encoding="utf-8")
    capsys.readouterr()
    return main(["train", str(cfg), "--out", str(tmp_path / name), "--quiet"]), capsys.readouterr().err


def test_fine_tuning_a_classifier_past_the_sources_max_len_is_refused(topics_csv, tmp_path, capsys):
    """A fine-tuned classifier keeps the source's max_len, its position table's rows: data of a larger max_len was
    taken without a word (config.json then held both figures), and texts longer than the table failed at the
    first batch ("sequence positions up to 32 exceed the positional table of length 16; ... build the model with
    a larger max_len"), after config.json and tokenizer.json were written. Now one error before anything is
    written; a smaller max_len trains on the table's first rows, and RoPE or ALiBi positions (no table) are not
    compared."""
    from numformer.config import merge_init_from
    train_csv, test_csv = topics_csv
    data = {"task": "classification", "path": str(train_csv), "test_path": str(test_csv), "text_column": "review",
            "label_column": "topic", "min_freq": 1, "max_len": 16}
    source = train(tmp_path, "classifier", data, name="source")
    rc, err = fine_tune(tmp_path, source, "long", {**data, "max_len": 32}, capsys)
    assert rc == 2 and not (tmp_path / "long").exists()
    assert (f"the data's max_len (32) exceeds the max_len of the init_from model '{source}' (16); its sinusoidal "
            f"position table has 16 rows: set [data] max_len <= 16") in err
    assert "or train a new model on this data (without [model] init_from)" in err
    assert fine_tune(tmp_path, source, "short", {**data, "max_len": 8}, capsys)[0] == 0
    assert json.loads((tmp_path / "short" / "config.json").read_text(encoding="utf-8"))["model"]["max_len"] == 16
    model = {**json.loads((source / "config.json").read_text(encoding="utf-8"))["model"], "type": "classifier"}
    with pytest.raises(ValueError, match=r"^the data's max_len \(64\) exceeds the max_len of the init_from model "
                                         r"'src' \(16\); its learned position table has 16 rows"):
        merge_init_from("src", {}, {**model, "positional": "learned"}, {"max_len": 64}, {"max_len": 64})
    for positional in ("rope", "alibi"):
        assert merge_init_from("src", {}, {**model, "positional": positional}, {"max_len": 64}, {})["max_len"] == 16
    copy = {"task": "copy", "length": 32, "test_lengths": [63]}         # a synthetic task: max_len follows lengths
    with pytest.raises(ValueError, match=r"learned position table has 16 rows: make the sequences shorter "
                                         r"\(\[data\] length and test_lengths: max_len follows the longest\)"):
        merge_init_from("src", {}, {**model, "positional": "learned"}, {"max_len": 64}, copy)


def test_fine_tuning_a_transformer_past_the_sources_max_len_is_refused(tmp_path, capsys):
    """The encoder-decoder's sinusoidal tables have the source's max_len rows: a translation of a larger
    [data] max_len failed at the first batch ("sequence positions up to 16 exceed the positional table of length
    10"), after config.json and tokenizer.json were written; now one error before anything is written."""
    src, tgt = reversal_pairs(120)
    (tmp_path / "a.src").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "a.tgt").write_text("\n".join(" ".join([t] * 3) for t in tgt) + "\n", encoding="utf-8")
    data = {"task": "translation", "train": [str(tmp_path / "a.src"), str(tmp_path / "a.tgt")], "min_freq": 1,
            "max_len": 10, "beam_size": 1}
    source = train(tmp_path, "transformer", data, name="source")
    rc, err = fine_tune(tmp_path, source, "long", {**data, "max_len": 24}, capsys)
    assert rc == 2 and not (tmp_path / "long").exists()
    assert (f"the data's max_len (24) exceeds the max_len of the init_from model '{source}' (10); its sinusoidal "
            f"position table has 10 rows: set [data] max_len <= 10") in err
    assert fine_tune(tmp_path, source, "same", data, capsys)[0] == 0


@register_task("test_own_vocabulary_copy")
class OwnVocabularyCopy(CopyTask):
    """The copy task with a vocabulary of its own (``vocab`` symbols), whatever the init_from run saved: a task of
    the user's own that does not restore the source's tokenizer."""

    def __init__(self, data_config, seed=0, tokenizer_state=None):
        super().__init__(data_config, seed, None)


def test_fine_tuning_a_transformer_on_a_larger_vocabulary_is_refused(tmp_path):
    """A Transformer's src_vocab_size / tgt_vocab_size were not compared with the init_from model's (only a GPT's
    or a classifier's vocab_size was): a task whose vocabulary outgrew the source's failed at the first batch
    ("token ids [11, 12] are outside the vocabulary [0, 11); check the tokenizer or raise vocab_size"), after
    config.json and tokenizer.json were written. (numformer's own tasks restore the source's vocabulary, or
    refuse another one.) Now one error before anything is written; the source's vocabulary still trains."""
    from numformer.config import merge_init_from
    from numformer.train import Trainer

    def config(vocab, **model):
        return {"model": model, "data": {"task": "test_own_vocabulary_copy", "model_type": "transformer",
                                         "length": 4, "vocab": vocab, "n_val": 16, "n_test": 16},
                "train": {"max_steps": 2, "batch_size": 8, "eval_every": 2, "checkpoint_every": 1000}}
    Trainer(config(6, type="transformer", d_model=16, n_heads=2, n_layers=1, d_ff=32), tmp_path / "source",
            quiet=True).train()
    source = str(tmp_path / "source")
    with pytest.raises(ValueError, match=r"^the source-language vocabulary \(13\) exceeds the src_vocab_size of "
                                         r"the init_from model '.*source' \(11\); use the model's own tokenizers"):
        Trainer(config(8, init_from=source), tmp_path / "more", quiet=True)
    assert not (tmp_path / "more").exists()
    Trainer(config(6, init_from=source), tmp_path / "same", quiet=True).train()
    assert (tmp_path / "same" / "model.safetensors").exists()
    model = json.loads((tmp_path / "source" / "config.json").read_text(encoding="utf-8"))["model"]
    with pytest.raises(ValueError, match=r"^the target-language vocabulary \(12\) exceeds the tgt_vocab_size"):
        merge_init_from("src", {}, model, {"src_vocab_size": 11, "tgt_vocab_size": 12}, {})


def test_parallel_lines_empty_on_one_side_are_refused(tmp_path):
    """Blank lines at different places of two parallel files (same line count) gave pairs with an empty side and
    shifted every pair between them; now the first one-sided blank line is an error naming the file and the line.
    A line blank in both files is skipped (as a blank line of a TSV of pairs is)."""
    (tmp_path / "a.de").write_text("ein hund\n\neine katze\nein mann\nzwei frauen\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("a dog\na cat\n\na man\ntwo women\n", encoding="utf-8")
    data = {"task": "translation", "train": [str(tmp_path / "a.de"), str(tmp_path / "a.en")], "val_size": 1,
            "test_size": 1, "min_freq": 1}
    with pytest.raises(ValueError, match=r"a\.de, line 2: empty, but line 2 of .*a\.en is not.*remove the line "
                                         r"from both files"):
        make_task(data, seed=0)
    (tmp_path / "a.de").write_text("ein hund\n\neine katze\nein mann\nzwei frauen\n\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("a dog\n  \na cat\na man\ntwo women\n\n", encoding="utf-8")
    t = make_task(data, seed=0)
    pairs = {p for v in t.text.values() for p in zip(*v)}
    assert pairs == {("ein hund", "a dog"), ("eine katze", "a cat"), ("ein mann", "a man"),
                     ("zwei frauen", "two women")}
    with pytest.raises(ValueError, match=r"\[data\] test names the training file .*a\.de.*give separate test files"):
        make_task({**data, "test": [str(tmp_path / "a.de"), str(tmp_path / "a.en")]}, seed=0)


def test_a_csv_field_longer_than_csvs_default_limit(tmp_path):
    """A CSV cell over 131,072 characters (a long document) was "field larger than field limit (131072)" with no
    fix; numformer bounds no line of a file it reads (JSONL and text neither), so neither does it bound a field."""
    long = tmp_path / "long.csv"
    long.write_text("text,label\n" + "word " * 30000 + ",pos\n" + "".join(f"t{i},{'pos' if i % 2 else 'neg'}\n"
                                                                         for i in range(20)), encoding="utf-8")
    t = make_task({"task": "classification", "path": str(long), "min_freq": 1, "val_size": 2, "test_size": 2})
    assert max(len(x) for s in t.data.values() for x in s.texts) == len("word " * 30000) - 1
