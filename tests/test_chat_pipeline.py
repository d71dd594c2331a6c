"""numformer reproduce chat_pipeline: the conversations and pairs it builds, its measures (Wilson intervals, labels
read from replies), and its quick version end to end on the real data (skipped when ../shared/data is absent)."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from numformer.cli import main
from numformer.data.chat import ChatFormat, encode_chat
from numformer.data.tokenizers import ByteLevelBPE
from numformer.experiments import _chat_data as cd
from numformer.experiments._chat_eval import parse_label, reply_text, wilson

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NUMFORMER_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")
needs_shared = pytest.mark.skipif(not (SHARED / "aclImdb_v1.tar.gz").is_file()
                                  or not (SHARED / "instructions").is_dir(),
                                  reason=f"shared datasets not found at {SHARED}")

POS = "A wonderful film, moving and funny. I loved the horror of it. " * 3
NEG = "A dull comedy. The plot was boring and the acting awful, a waste of time. " * 2


@pytest.fixture(scope="module")
def tok():
    corpus = (POS + NEG + "Is this review positive or negative? Write a review about a movie. User: Assistant: ") * 20
    return ByteLevelBPE.train([corpus], 400, special_tokens=[cd.END])


def test_topics_are_the_first_genre_word_of_the_review():
    assert cd.topic_of("A slow western, then a horror ending.") == "a western"
    assert cd.topic_of("The HORROR! Zombies everywhere.") == "a horror film"
    assert cd.topic_of("I saw it twice.") == cd.DEFAULT_TOPIC
    assert cd.topic_of("a sci-fi romance") == "a science fiction film"


def test_a_long_review_keeps_its_head_and_its_end_within_the_room(tok):
    ids = tok.encode(POS * 10 + "The end was awful.")
    text = cd.fit_review(tok, ids, 60, 20)
    assert text.startswith(tok.decode(ids[:20]).rstrip()) and text.endswith("The end was awful.")
    assert cd.CUT in text and len(tok.encode(text)) <= 60
    assert cd.fit_review(tok, ids[:30], 60, 20) == tok.decode(ids[:30])


def test_conversations_take_the_loss_on_the_label_and_the_end_of_text(tok):
    fmt = ChatFormat.default()
    ids, labels = encode_chat((tok, fmt), cd.classify_messages(POS, 1))
    taken = tok.decode([i for i, label in zip(ids, labels) if label != -100])
    assert taken == f" positive{cd.END}\n\n" and tok.eos_id in [i for i, lab in zip(ids, labels) if lab != -100]
    assert fmt.render(cd.write_messages(0, "a comedy")).startswith("User: Write a negative review about a comedy.")
    room = cd.review_room(tok, 128)
    review = cd.fit_review(tok, tok.encode(POS * 20), room, 16)
    assert len(encode_chat((tok, fmt), cd.classify_messages(review, 0))[0]) <= 129


def test_preference_pairs_match_lengths_and_use_each_review_once_per_side(tok):
    texts = [POS[:40 * (i + 1)] for i in range(4)] + [NEG[:35 * (i + 1)] for i in range(4)]
    reviews = cd.Reviews(texts, [1] * 4 + [0] * 4, tok)
    pairs = cd.preference_pairs(reviews, {0: [4, 5, 6, 7], 1: [3, 2, 1, 0]})
    assert len(pairs) == 8
    assert sorted(p["chosen"] for p in pairs) == sorted(t.strip() + cd.END for t in texts)
    assert sorted(p["rejected"] for p in pairs) == sorted(p["chosen"] for p in pairs)
    for p in pairs:           # the shortest positive is matched with the shortest negative, and so on
        assert abs(len(p["chosen"]) - len(p["rejected"])) <= 35 * 4 - 40 * 3
        assert ("positive" in p["prompt"]) == p["chosen"].startswith("A wonderful")


def test_short_reviews_are_drawn_per_label_within_the_limit(tok):
    reviews = cd.Reviews([POS[:20], POS * 5, NEG[:30], NEG[:25], POS[:30]], [1, 1, 0, 0, 1], tok)
    short = cd.short_reviews(reviews, 20, np.random.default_rng(0), need=2)
    assert sorted(short[1]) == [0, 4] and sorted(short[0]) == [2, 3]
    assert list(cd.short_reviews(reviews, 20, np.random.default_rng(0), need=2, skip=[0])[1]) == [4]


def test_the_instruction_split_is_85_10_5_in_file_order():
    train, test, val = cd.instruction_split(list(range(1100)))
    assert (len(train), len(test), len(val)) == (935, 110, 55) and train[-1] == 934 and test[0] == 935


def test_an_instruction_record_whose_input_is_not_text_is_one_line_naming_it(tmp_path):
    """``"input": 5`` in the instruction set passed read_instructions and stopped the pipeline later with an
    AttributeError (``5.strip()``)."""
    path = tmp_path / "instruction-data.json"
    path.write_text(json.dumps([{"instruction": "Add", "input": "", "output": "6"},
                                {"instruction": "Add", "input": 5, "output": "6"}]))
    with pytest.raises(ValueError, match=f'{path}: record 1: "input" is the number 5, not a string'):
        cd.read_instructions(path)


def test_wilson_interval_and_labels_read_from_replies(tok):
    lo, hi = wilson(85, 100)
    assert abs(lo - 0.7672) < 1e-3 and abs(hi - 0.9069) < 1e-3        # the textbook values
    assert wilson(0, 0) == (0.0, 1.0) and wilson(10, 10)[1] == pytest.approx(1.0)
    assert parse_label(" Positive.") == 1 and parse_label("negative, clearly") == 0 and parse_label("") is None
    assert parse_label("It is positive") is None
    ids = tok.encode(" negative" + cd.END + "\n\nUser: more")
    assert reply_text(tok, ids, tok.eos_id) == "negative"
    assert reply_text(tok, tok.encode(" A good film.\nUser: next"), tok.eos_id) == "A good film."


@pytest.mark.slow        # the whole pipeline on the real data, about a minute (make test-slow)
@needs_shared
def test_quick_chat_pipeline_on_the_real_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NUMFORMER_DATA", str(SHARED))
    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", "chat_pipeline", "--quick", "--results", str(results), "--runs", str(runs),
                 "--quiet"]) == 0
    r = json.loads((results / "chat_pipeline.json").read_text())
    assert set(r["targets"]) == {"accuracy", "judged_share"} and r["floor"] == {"accuracy": 0.8}
    for key in ("accuracy", "judged_share", "dpo_accuracy", "dpo_judged_share", "dpo_reward_accuracy",
                "lora_r8_accuracy", "lora_r16_accuracy"):
        assert 0 <= r["figures"][key] <= 1, key
    assert list(r["runs"]) == ["sft_full", "sft_lora_r8", "sft_lora_r16", "dpo"]
    full, r8, r16 = (r["runs"][k]["measured"] for k in ("sft_full", "sft_lora_r8", "sft_lora_r16"))
    assert full["trainable_parameters"] == full["parameters"]
    assert 0 < r8["trainable_parameters"] < r16["trainable_parameters"] < full["parameters"]
    assert all(m["peak_rss_bytes"] > 20 * 2 ** 20 for m in (full, r8, r16))
    assert r["run_configs"]["sft_lora_r8"]["lora"]["r"] == 8 and r["run_configs"]["dpo"]["train"]["objective"] == "dpo"
    assert r["timing"]["imdb_lm"]["source"] == "trained" and (results / "imdb_lm.md").is_file()
    assert r["results"]["sft_full"]["classify"]["n"] == 24 and r["results"]["dpo"]["write"]["n"] == 8
    assert len(r["chat"]["input"]) == 3 and r["chat"]["command"].startswith("numformer chat ")
    page = (results / "chat_pipeline.md").read_text()
    for heading in ("## The stages", "## Full fine-tuning against LoRA", "## DPO: before and after",
                    "## A chat session", "(quick run)"):
        assert heading in page
    judge = r["timing"]["imdb"]["test_accuracy"]            # the judge run's own accuracy, not imdb.md's
    assert f"the judge's own errors (its test accuracy: {judge:.4f}, its run in the stages below)" in page
    assert (results / "figures" / "chat_pipeline_curves.png").stat().st_size > 1000
    assert "[chat_pipeline](chat_pipeline.md)" in (results / "README.md").read_text()
    sft = [json.loads(line) for line in (runs / "chat_pipeline" / "data" / "sft.jsonl").read_text().splitlines()]
    assert len(sft) == 48 + 24 + 16
    assert all(c["messages"][-1]["content"].endswith(cd.END) for c in sft)


def test_every_run_folder_is_planned_and_one_holding_files_is_refused(tmp_path, monkeypatch):
    from numformer.experiments import EXPERIMENTS, Context, resolve
    from numformer.experiments.runner import check_before_running

    exp = resolve("chat_pipeline")[0]
    ctx = Context(runs_dir=tmp_path / "runs", results_dir=tmp_path / "results", quick=True)
    planned = exp.run_dirs(exp, ctx)
    root = tmp_path / "runs" / "chat_pipeline"
    assert planned == [(tmp_path / "runs" / "imdb_lm", None), (tmp_path / "runs" / "imdb", None)] + [
        (root / name, None) for name in ("sft_full", "sft_lora_r8", "sft_lora_r16", "dpo")]
    (root / "sft_lora_r8").mkdir(parents=True)
    (root / "sft_lora_r8" / "notes.txt").write_text("mine")
    why = dict(exp.run_dirs(exp, ctx))[root / "sft_lora_r8"]
    assert why == "the run it starts from (imdb_lm) is trained again"
    with pytest.raises(ValueError, match="sft_lora_r8 .*already holds a run"):
        check_before_running(exp, ctx)
    assert "imdb_lm" in EXPERIMENTS and "imdb" in EXPERIMENTS


def test_a_base_run_of_another_commit_or_config_is_not_reused_and_named(tmp_path, monkeypatch):
    """The pipeline's reuse check is _runs.reusable_run's (the class of tests/test_ablation_reuse.py): a finished
    base run is reused only when its config and commit are the ones wanted, and the runs fine-tuned from a base
    trained again are trained again too."""
    import numformer.experiments.chat_pipeline as cp
    from numformer.experiments import Context

    from conftest import set_commit

    set_commit(monkeypatch, "abc1234")
    wanted = {"model": {"type": "gpt"}, "data": {"task": "imdb_lm"}, "train": {"lr": 0.002}}
    monkeypatch.setattr(cp, "base_resolved", lambda name, ctx, cfg: json.loads(json.dumps(wanted)))
    ctx = Context(runs_dir=tmp_path / "runs", results_dir=tmp_path / "results", quick=True)
    cfg = cp.pipeline_config(ctx)
    summary = {"steps": 10, "best_val_loss": 4.0, "tokens_seen": 100, "tokens_per_s": 1.0, "train_seconds": 1.0,
               "parameters": 5, "stopped_by": "max_steps", "interrupted": False, "commit": "abc1234"}
    for name in ("imdb_lm", "imdb"):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps(wanted))
        (run / "summary.json").write_text(json.dumps(summary))
    stages = {s.name: s for s in cp.plan(ctx, cfg)}
    assert stages["imdb_lm"].summary is not None and stages["imdb"].summary is not None      # both reused
    (tmp_path / "runs" / "imdb_lm" / "summary.json").write_text(json.dumps({**summary, "commit": "def5678"}))
    stages = {s.name: s for s in cp.plan(ctx, cfg)}
    assert stages["imdb_lm"].summary is None and "trained by commit def5678, whose src/ or configs/ differ from this commit abc1234" in \
        stages["imdb_lm"].why
    assert all(stages[n].summary is None for n in ("sft_full", "sft_lora_r8", "dpo"))     # built on it: again
    (tmp_path / "runs" / "imdb" / "config.json").write_text(json.dumps({**wanted, "train": {"lr": 0.5}}))
    stages = {s.name: s for s in cp.plan(ctx, cfg)}
    assert "its config.json differs from the config wanted (train.lr 0.5 -> 0.002)" in stages["imdb"].why


def test_a_target_met_by_a_numpy_figure_is_a_json_boolean():
    """A share computed with NumPy is an np.float64, which compares to an np.bool_ that json cannot write: the
    real pipeline's record failed to be written after an hour of training (the quick run's shares were floats)."""
    from numformer.experiments import Target

    met = {t: Target("accuracy", 0.85, op).met({"accuracy": np.float64(0.9)}) for t, op in (("a", ">="), ("b", "<="))}
    assert met == {"a": True, "b": False} and all(type(v) is bool for v in met.values())
    assert json.loads(json.dumps(met)) == met


def test_given_runs_are_used_whatever_commit_trained_them_but_only_with_the_config_wanted(tmp_path, monkeypatch):
    """pipeline.given_runs names an earlier pipeline's fine-tuning runs, evaluated again without training (as
    lm_run / judge_run name base runs): any commit (the page names it), but the config this pipeline would train,
    a finished run and its measured.json; anything else is one error naming the folder."""
    import numformer.experiments.chat_pipeline as cp
    from numformer.experiments import Context

    from conftest import set_commit

    set_commit(monkeypatch, "abc1234")
    ctx = Context(runs_dir=tmp_path / "runs", results_dir=tmp_path / "results", quick=True)
    given = tmp_path / "earlier"
    cfg = cp.pipeline_config(dataclasses.replace(ctx, overrides=["pipeline.lm_run=" + str(tmp_path / "lm"),
                                                                 "pipeline.judge_run=" + str(tmp_path / "judge"),
                                                                 "pipeline.given_runs=" + str(given)]))
    summary = {"steps": 4, "best_val_loss": 4.0, "tokens_seen": 100, "tokens_per_s": 1.0, "train_seconds": 1.0,
               "parameters": 5, "stopped_by": "max_steps", "interrupted": False, "commit": "def5678"}
    for name in ("lm", "judge"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(cp, "resolve_config", lambda c, sizes_only=False: ({**c, "resolved": True}, None))
    for name, config in cp.stage_configs(cfg, ctx).items():
        (given / name).mkdir(parents=True)
        (given / name / "config.json").write_text(json.dumps({**config, "resolved": True}))
        (given / name / "summary.json").write_text(json.dumps(summary))
        (given / name / cp.MEASURED).write_text("{}")
    stages = cp.plan(ctx, cfg)
    assert [s.name for s in stages if s.given] == ["imdb_lm", "imdb", "sft_full", "sft_lora_r8", "sft_lora_r16",
                                                   "dpo"]
    assert all(s.summary["commit"] == "def5678" for s in stages)                # another commit: used
    (given / "dpo" / cp.MEASURED).unlink()
    with pytest.raises(ValueError, match=r"given_runs: .*dpo cannot be used as the dpo run: it has no measured"):
        cp.plan(ctx, cfg)
    (given / "dpo" / cp.MEASURED).write_text("{}")
    (given / "sft_full" / "summary.json").write_text(json.dumps({**summary, "stopped_by": "interrupted"}))
    with pytest.raises(ValueError, match="sft_full run: its run did not finish"):
        cp.plan(ctx, cfg)
    (given / "sft_full" / "summary.json").write_text(json.dumps(summary))
    (given / "sft_lora_r8" / "config.json").write_text(json.dumps({"model": {}, "data": {}, "train": {}}))
    with pytest.raises(ValueError, match="sft_lora_r8 run: its config.json differs from the config wanted"):
        cp.plan(ctx, cfg)


@pytest.mark.parametrize("judge_run, named", [
    ("/elsewhere/runs/imdb", "judged by the classifier /elsewhere/runs/imdb (pipeline.judge_run)."),
    ("", "judged by the classifier `imdb` under --runs (`reproduce imdb`).")])
def test_the_page_names_the_judge_the_pipeline_used(judge_run, named):
    from numformer.experiments._chat_page import recipe_section

    record = json.loads((ROOT / "results" / "chat_pipeline.json").read_text(encoding="utf-8"))
    record["config"]["pipeline"]["judge_run"] = judge_run
    evaluation = [line for line in recipe_section(record) if line.startswith("- **Evaluation**")]
    assert len(evaluation) == 1 and evaluation[0].endswith(named)
