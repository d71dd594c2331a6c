"""IMDB / AG News end to end: quick reproduce on tiny fixture data, numformer classify, the saliency figure.

The fixtures are written by the tests (an IMDB tarball, AG News CSVs with and
without a header row). Tests on ../shared/data skip when it is absent; the full
runs are marked slow.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from numformer.cli import main
from numformer.data import make_task

from test_data_loaders import write_imdb_tarball

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared datasets not found at {SHARED}")

POS = ["a great film , i loved it and the acting was wonderful", "wonderful story , great music , loved every minute",
       "the best movie of the year , great great fun", "brilliant and moving , a wonderful cast"]
NEG = ["a bad film , i hated it and the acting was awful", "terrible story , boring music , hated every minute",
       "the worst movie of the year , bad bad fun", "dull and stupid , an awful cast"]
FILLER = "the plot follows a family in a small town over one long summer and nothing else happens at all"


@pytest.fixture(scope="module")
def imdb_tgz(tmp_path_factory):
    files = {}
    for i in range(30):
        files[f"aclImdb/train/pos/{i}_{7 + i % 4}.txt"] = f"{POS[i % 4]} . {FILLER} <br /><br /> {POS[(i + 1) % 4]}"
        files[f"aclImdb/train/neg/{i}_{1 + i % 4}.txt"] = f"{NEG[i % 4]} . {FILLER} <br /><br /> {NEG[(i + 1) % 4]}"
    for i in range(12):
        files[f"aclImdb/test/pos/{i}_9.txt"] = f"{POS[(i + 2) % 4]} . {FILLER}"
        files[f"aclImdb/test/neg/{i}_2.txt"] = f"{NEG[(i + 2) % 4]} . {FILLER}"
    return str(write_imdb_tarball(tmp_path_factory.mktemp("imdb") / "aclImdb_v1.tar.gz", files))


TOPICS = {1: "election minister war government", 2: "football coach season match", 3: "stocks profit market shares",
          4: "software internet computer space"}


@pytest.fixture(scope="module")
def agnews_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("agnews")
    rows = lambda n, k: [f'"{c}","News {c} #39;{i}","a report on {TOPICS[c].split()[(i + k) % 4]} and '  # noqa: E731
                         f'{TOPICS[c].split()[(i + k + 1) % 4]} \\ more #36;{i}"' for i in range(n) for c in TOPICS]
    (d / "train_subset_20k.csv").write_text("class_index,title,description\n" + "\n".join(rows(15, 0)) + "\n")
    (d / "test.csv").write_text("\n".join(rows(6, 2)) + "\n")                    # the headerless variant
    (d / "classes.txt").write_text("World\nSports\nBusiness\nSci/Tech\n")
    return str(d)


def quick(name, path, tmp, *extra):
    results, runs = tmp / "results", tmp / "runs"
    argv = ["reproduce", name, "--quick", "--results", str(results), "--runs", str(runs), "--quiet",
            "--set", f"data.path={path}", "--set", "data.val_size=8", *extra]
    assert main(argv) == 0
    return results, runs / name


# ------------------------------------------------------------------------------------------------ reproduce
@pytest.mark.parametrize("name", ["imdb", "agnews"])
def test_quick_reproduce_writes_results_and_saliency_figure(name, imdb_tgz, agnews_dir, tmp_path, capsys):
    path = imdb_tgz if name == "imdb" else agnews_dir
    results, run_dir = quick(name, path, tmp_path)
    record = json.loads((results / f"{name}.json").read_text())
    assert {"accuracy", "test_loss"} <= set(record["figures"])
    assert record["targets"] == {"accuracy": ">= 0.87" if name == "imdb" else ">= 0.9"}
    assert record["time_limit_minutes"] == 60
    for key in ("config", "seed", "wall_time_s", "commit", "machine", "steps"):
        assert key in record
    assert record["config"]["train"]["max_steps"] == 24 and record["config"]["model"]["type"] == "classifier"
    for png in (f"{name}_loss.png", f"{name}_attention.png", f"{name}_saliency.png"):
        data = (results / "figures" / png).read_bytes()
        assert len(data) > 2000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    md = (results / f"{name}.md").read_text()
    assert f"figures/{name}_saliency.png" in md and "words for the prediction" in md
    assert f"[{name}]({name}.md)" in (results / "README.md").read_text()
    assert f"{name}: test_loss" in capsys.readouterr().out
    tok = json.loads((run_dir / "tokenizer.json").read_text())
    assert tok["label_names"] == (["negative", "positive"] if name == "imdb"
                                  else ["World", "Sports", "Business", "Sci/Tech"])


def test_experiments_registered():
    from numformer.experiments import resolve

    assert [e.name for e in resolve("text")] == ["imdb", "agnews"]
    imdb, = resolve("imdb")
    assert imdb.targets[0].metric == "accuracy" and imdb.targets[0].value == 0.87
    for name in ("imdb", "agnews"):
        from numformer.config import load_config
        from numformer.experiments.runner import find_config

        cfg = load_config(find_config(name))
        assert cfg["model"]["type"] == "classifier" and cfg["data"]["task"] == name


# ------------------------------------------------------------------------------------------------- classify
@pytest.fixture(scope="module")
def imdb_run(imdb_tgz, tmp_path_factory):
    """A tiny trained IMDB run whose texts are truncated (head and tail kept), so that truncation matters."""
    tmp = tmp_path_factory.mktemp("imdb_run")
    _, run_dir = quick("imdb", imdb_tgz, tmp, "--set", "data.max_len=12", "--set", "data.truncate=head_tail",
                       "--set", "train.max_steps=40", "--set", "train.lr=3e-3")
    return run_dir


def test_classify_prints_label_and_probability(imdb_run, capsys):
    assert main(["classify", str(imdb_run), "a great film , i loved it and the acting was wonderful"]) == 0
    label, prob = capsys.readouterr().out.strip().split("\t")
    assert label in ("negative", "positive") and 0.5 <= float(prob) <= 1.0
    assert main(["classify", str(imdb_run), "great", "awful bad film", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert [x["text"] for x in lines] == ["great", "awful bad film"]
    for x in lines:
        assert set(x["probabilities"]) == {"negative", "positive"}
        assert abs(sum(x["probabilities"].values()) - 1) < 1e-6
        assert x["probability"] == max(x["probabilities"].values())


def test_classify_tokenizes_exactly_as_training(imdb_run):
    """The command's probabilities equal the model's on the task's own ids (same tokenizer, <cls>, truncation)."""
    from numformer.train.inference import classify_texts
    from numformer.ops import softmax_forward
    from numformer.train import load_model, load_task

    task, model = load_task(imdb_run), load_model(imdb_run)
    texts = task.data["test"].texts[:6]
    assert max(len(t.split()) for t in texts) > 12                     # long enough to be truncated
    got = classify_texts(imdb_run, texts)
    for text, ids, r in zip(texts, task.ids["test"][:6], got):
        assert len(ids) == 12 and ids[0] == task.tokenizer.special_id("<cls>")
        full = task.tokenizer.encode(text, add_cls=True)
        assert ids.tolist() == full[:7] + full[-5:]                   # <cls> + 6 head + 5 tail tokens
        p = softmax_forward(np.asarray(model(ids[None]), dtype=np.float64), axis=-1)[0][0]
        model.clear_cache()
        assert r["truncated"] and r["tokens"] == 12
        np.testing.assert_allclose([r["probabilities"][n] for n in ("negative", "positive")], p, rtol=1e-6)


def test_classify_errors(imdb_run, tmp_path, capsys):
    assert main(["classify", str(imdb_run), "   "]) == 2
    assert "empty text" in capsys.readouterr().err
    assert main(["classify", str(imdb_run), "good", ""]) == 2
    assert "empty text (number 2 of 2)" in capsys.readouterr().err
    assert main(["classify", str(tmp_path / "nowhere"), "good"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    gpt = tmp_path / "gpt_run"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model": {"type": "gpt", "vocab_size": 10, "block_size": 8},
                                                 "data": {"task": "text"},
                                                 "train": {"dtype": "float32"}}))
    assert main(["classify", str(gpt), "good"]) == 2
    err = capsys.readouterr().err
    assert "holds a 'gpt' model" in err and "text classifier run" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["classify", str(empty), "good"]) == 2
    assert "not a numformer run folder" in capsys.readouterr().err


def test_classify_refuses_a_synthetic_tasks_classifier_in_one_line(tmp_path, capsys):
    """reproduce parity trains a classifier on symbol sequences; classify said nothing of it and crashed inside
    the tokenizer (no <cls> to add)."""
    from numformer.experiments.synthetic import PARITY_CLASSIFIER, PARITY_CLASSIFIER_QUICK
    from numformer.train import Trainer

    run = tmp_path / "parity_classifier"
    Trainer(PARITY_CLASSIFIER, run, overrides=PARITY_CLASSIFIER_QUICK + ["train.processes=1"], quiet=True).train()
    capsys.readouterr()
    assert main(["classify", str(run), "0 1 1"]) == 2
    err = capsys.readouterr().err
    assert "trained on the 'parity' task's symbol sequences" in err and f"numformer eval {run}" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------------- task preprocessing
def test_truncation_modes_and_cls():
    from numformer.data.text_tasks import encode_for_classifier
    from numformer.data.tokenizers import WordTokenizer

    tok = WordTokenizer.build(["a b c d e f g h"], cls_token=True)
    text = "a b c d e f g h"
    dec = lambda ids: tok.decode(ids[0], skip_special=False)  # noqa: E731
    assert dec(encode_for_classifier(tok, [text], 5, True, "head")) == "<cls> a b c d"
    assert dec(encode_for_classifier(tok, [text], 5, True, "tail")) == "<cls> e f g h"
    assert dec(encode_for_classifier(tok, [text], 6, True, "head_tail")) == "<cls> a b c g h"
    assert dec(encode_for_classifier(tok, [text], 20, True, "head_tail")) == "<cls> " + text
    assert dec(encode_for_classifier(tok, [text], 4, False, "head_tail")) == "a b g h"
    with pytest.raises(ValueError, match="truncate = 'middle'"):
        encode_for_classifier(tok, [text], 4, True, "middle")


def test_token_dropout_n_test_and_labels(imdb_tgz):
    cfg = {"task": "imdb", "path": imdb_tgz, "val_size": 8, "min_freq": 1, "n_test": 10}
    t = make_task({**cfg, "token_dropout": 0.5}, seed=0)
    plain = make_task(cfg, seed=0)
    assert len(t.data["test"]) == 10 and 0 < t.data["test"].labels.sum() < 10       # a seeded sample of both
    assert t.data["test"].ids == plain.data["test"].ids
    b, p = t.train_batch(16, np.random.default_rng(3)), plain.train_batch(16, np.random.default_rng(3))
    np.testing.assert_array_equal(b.extra["index"], p.extra["index"])
    changed = b.inputs["ids"] != p.inputs["ids"]
    assert changed.any() and (b.inputs["ids"][changed] == t.tokenizer.unk_id).all()
    assert (b.inputs["ids"][:, 0] == t.tokenizer.special_id("<cls>")).all()        # <cls> and padding kept
    assert ((b.inputs["ids"] == 0) == (p.inputs["ids"] == 0)).all()
    assert next(iter(t.eval_batches("test", 4))).inputs["ids"].tolist() == \
        next(iter(plain.eval_batches("test", 4))).inputs["ids"].tolist()            # evaluation untouched
    inputs, labels = t.analysis_example("test")
    assert labels["ids"][0] == "<cls>" and len(labels["ids"]) == inputs["ids"].shape[1]
    assert all(w in t.tokenizer.stoi for w in labels["ids"])
    assert t.label_names == ["negative", "positive"] and t.class_names == ["neg", "pos"]
    with pytest.raises(ValueError, match="token_dropout must be in"):
        make_task({**cfg, "token_dropout": 1.0}, seed=0)


def test_word_scores_and_figure(imdb_run, tmp_path):
    from numformer.experiments.text_classification import plot_word_saliency, word_scores
    from numformer.train import load_model, load_task

    task, model = load_task(imdb_run), load_model(imdb_run)
    ids = task.ids["test"][0]
    attn, sal, probs = word_scores(model, ids)
    assert attn.shape == sal.shape == (len(ids),) and probs.shape == (2,)
    assert abs(attn.sum() - 1) < 1e-5                      # mean pooling: the mean of attention rows
    assert np.isfinite(sal).all() and np.abs(sal).max() > 0
    path = tmp_path / "sal.png"
    plot_word_saliency([{"words": task.token_labels(ids), "attention": attn, "saliency": sal,
                         "header": "a $5 test"}], path=path, title="t")
    assert path.stat().st_size > 2000


# -------------------------------------------------------------------------------------------- real data
@needs_shared
def test_quick_reproduce_on_real_agnews(tmp_path):
    results, run_dir = quick("agnews", str(SHARED / "ag_news_csv"), tmp_path, "--set", "data.val_size=100")
    record = json.loads((results / "agnews.json").read_text())
    assert record["figures"]["accuracy"] >= 0.0 and (results / "figures" / "agnews_saliency.png").stat().st_size
    assert "200 test texts" in record["task"]


@pytest.mark.slow
@needs_shared
@pytest.mark.parametrize("name,target", [("imdb", 0.87), ("agnews", 0.90)])
def test_full_run_reaches_target(name, target, tmp_path):
    """The full experiment (tens of minutes): the test accuracy target of issue 6 on the full test set."""
    results = tmp_path / "results"
    assert main(["reproduce", name, "--results", str(results), "--runs", str(tmp_path / "runs"), "--quiet"]) == 0
    record = json.loads((results / f"{name}.json").read_text())
    assert record["figures"]["accuracy"] >= target
