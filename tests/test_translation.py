"""Translation end to end: a toy parallel corpus learned perfectly, `numformer translate`, BLEU, Multi30k."""
from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from numformer.cli import main

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_multi30k = pytest.mark.skipif(not (SHARED / "multi30k").is_dir(),
                                    reason=f"Multi30k not found at {SHARED / 'multi30k'}")

TOY_CONFIG = """
[model]
type = "transformer"
d_model = 64
n_heads = 4
n_layers = 2
d_ff = 128
dropout = 0.0
norm_first = true

[data]
task = "multi30k"
path = "{path}"
tokenizer = "word"
min_freq = 1
max_len = 12
buckets = 1
beam_size = 3

[train]
max_steps = 400
batch_size = 32
lr = 3e-3
schedule = "cosine"
warmup_steps = 20
eval_every = 200
checkpoint_every = 1000
log_every = 50
seed = 1337
"""


def write_gz(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def write_reversal_corpus(folder, seed=0):
    """Digit strings (3 to 6 digits, space-separated) and their reversal, as Multi30k-style gzip files."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 2000), ("val", 50), ("test_2016_flickr", 50)):
        digits = [[str(d) for d in rng.integers(0, 10, rng.integers(3, 7))] for _ in range(n)]
        write_gz(folder / f"{split}.de.gz", [" ".join(x) for x in digits])
        write_gz(folder / f"{split}.en.gz", [" ".join(reversed(x)) for x in digits])
    return folder


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """`numformer train` on the reversal corpus (a few seconds); returns the run folder."""
    base = tmp_path_factory.mktemp("toy_translation")
    data = write_reversal_corpus(base / "data")
    cfg = base / "toy.toml"
    cfg.write_text(TOY_CONFIG.format(path=data.as_posix()))
    run = base / "run"
    assert main(["train", str(cfg), "--out", str(run), "--quiet"]) == 0
    return run


def _translate(capsys, *args):
    capsys.readouterr()
    rc = main(["translate", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_toy_corpus_is_translated_perfectly(toy_run):
    from numformer.train import load_model, load_task

    model, task = load_model(toy_run), load_task(toy_run)
    sources, refs = task.sources("test"), task.references("test")
    greedy = task.translate(model, sources)
    assert greedy == refs                                  # every held-out digit string reversed exactly
    assert task.translate(model, sources, beam_size=1) == greedy
    assert task.translate(model, sources, beam_size=3) == refs
    figures = task.evaluate(model, "test")
    assert figures["bleu_greedy"] == pytest.approx(100.0) and figures["bleu_beam"] == pytest.approx(100.0)
    assert task.last_translations["greedy"] == refs and task.last_translations["references"] == refs
    assert task.evaluate(model, "val") == {}               # periodic evaluations: loss only by default


def test_translate_command(toy_run, capsys):
    rc, out, err = _translate(capsys, toy_run, "3 1 4 1 5", "2 7 1")
    assert rc == 0 and out.splitlines() == ["5 1 4 1 3", "1 7 2"]
    for flags in (["--greedy"], ["--beam", "4"], ["--beam", "1"]):
        rc, out, _ = _translate(capsys, toy_run, "9 8 7 6", *flags)
        assert rc == 0 and out.strip() == "6 7 8 9"
    rc, out, _ = _translate(capsys, toy_run, "1 2 3 4 5 6", "--max-length", "3")
    assert rc == 0 and out.strip() == "6 5 4"               # cut after 3 tokens


def test_translate_reads_a_file(toy_run, tmp_path, capsys):
    f = tmp_path / "in.txt"
    f.write_text("1 2 3\n4 5 6\n", encoding="utf-8")
    rc, out, _ = _translate(capsys, toy_run, "--file", f)
    assert rc == 0 and out.splitlines() == ["3 2 1", "6 5 4"]
    f.write_text("1 2 3\n\n4 5 6\n", encoding="utf-8")
    rc, out, err = _translate(capsys, toy_run, "7 8", "--file", f)
    assert rc == 2 and out == "" and f"line 2 of --file {f} is empty: one sentence per line" in err
    rc, _, err = _translate(capsys, toy_run, "1 2", "--max-length", "0")
    assert rc == 2 and "--max-length must be at least 1 (target tokens), got 0" in err


def test_unknown_source_tokens_map_to_unk(toy_run, capsys):
    from numformer.train.inference import load_translator

    _, src_tok, _, _ = load_translator(toy_run)
    assert src_tok.encode("1 x 2 zebra") == [src_tok.stoi["1"], src_tok.unk_id, src_tok.stoi["2"], src_tok.unk_id]
    assert src_tok.unk_id == 1 and src_tok.tokens[1] == "<unk>"
    rc, out, err = _translate(capsys, toy_run, "1 x 2")
    assert rc == 0 and len(out.splitlines()) == 1           # still translated, with <unk> in the source
    assert "read as <unk>: x" in err


def test_empty_input_is_a_clear_error(toy_run, capsys):
    for text in ("", "   "):
        rc, out, err = _translate(capsys, toy_run, text)
        assert rc == 2 and out == "" and "empty input" in err and "give a sentence" in err
    rc, _, err = _translate(capsys, toy_run)
    assert rc == 2 and "nothing to translate" in err
    from numformer.train.inference import load_translator
    from numformer.data.text_tasks import translate_texts

    model, src_tok, tgt_tok, _ = load_translator(toy_run)
    with pytest.raises(ValueError, match=r"empty source sentence \(number 2 of 2\)"):
        translate_texts(model, src_tok, tgt_tok, ["1 2", " "])
    with pytest.raises(ValueError, match="empty src"):
        model.generate(np.zeros((1, 0), dtype=np.int64), max_length=5, greedy=True, bos_id=2, eos_id=3)


def test_translate_needs_a_transformer_run(tmp_path, capsys):
    rc, _, err = _translate(capsys, tmp_path, "1 2")
    assert rc == 2 and "not a numformer run folder" in err


# ------------------------------------------------------------------------------------------------ BLEU
def _ngrams(tokens, n):
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def reference_bleu(hypotheses, references):
    """Papineni et al.'s corpus BLEU-4 on whitespace tokens (uniform weights, no smoothing), in percent."""
    matches, totals, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
    for h, r in zip(hypotheses, references):
        h, r = h.split(), r.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc, rc = _ngrams(h, n), _ngrams(r, n)
            matches[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(sum(math.log(m / t) for m, t in zip(matches, totals)) / 4)


HYPS = ["a man rides a bike down the street", "two dogs play in the green grass",
        "a woman is reading a book", "the children are playing on the beach near the water"]
REFS = ["a man rides his bike down the road", "two dogs are playing in the grass",
        "a woman is reading a book", "children are playing on the beach by the water"]


def test_bleu_equals_sacrebleu_and_the_definition():
    sacrebleu = pytest.importorskip("sacrebleu")
    from numformer.data.text_tasks import bleu_signature, corpus_bleu

    ours = corpus_bleu(HYPS, REFS)
    assert ours == sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert ours == pytest.approx(reference_bleu(HYPS, REFS), abs=1e-9)
    assert 0 < ours < 100
    short = HYPS[:3] + ["children play"]                  # shorter than the references: brevity penalty < 1
    assert corpus_bleu(short, REFS) == pytest.approx(reference_bleu(short, REFS), abs=1e-9)
    assert corpus_bleu(REFS, REFS) == pytest.approx(100.0)
    # sacrebleu's default 13a tokenization splits punctuation: detokenized text scores like tokenized text,
    assert corpus_bleu(["A dog runs.", "Two men, talking."], ["A dog runs .", "Two men , talking ."]) == \
        pytest.approx(100.0)
    # and it is case-sensitive (the multi30k tokenizer is cased for this reason).
    assert corpus_bleu(["a dog runs in the park ."], ["A dog runs in the park ."]) < 100
    assert "case:mixed" in bleu_signature(HYPS, REFS) and "tok:13a" in bleu_signature(HYPS, REFS)
    with pytest.raises(ValueError, match="3 hypotheses for 4 references"):
        corpus_bleu(HYPS[:3], REFS)


# ------------------------------------------------------------------------------------------------ Multi30k
@needs_multi30k
def test_quick_reproduce_multi30k(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])          # [data] path is relative to the project
    monkeypatch.setenv("NUMFORMER_DATA", str(SHARED))                 # the data the skip condition found
    results, runs = tmp_path / "results", tmp_path / "runs"
    assert main(["reproduce", "multi30k", "--quick", "--results", str(results), "--runs", str(runs),
                 "--quiet"]) == 0
    record = json.loads((results / "multi30k.json").read_text())
    figures = record["figures"]
    assert {"bleu_greedy", "bleu_beam", "test_loss", "decode_greedy_s", "decode_beam_s"} <= set(figures)
    assert record["targets"] == {"bleu_beam": ">= 30"} and record["time_limit_minutes"] == 120
    assert record["config"]["data"]["lowercase"] is False and record["config"]["train"]["label_smoothing"] == 0.1
    assert record["config"]["train"]["schedule"] == "noam"
    md = (results / "multi30k.md").read_text()
    assert "Example translations" in md and "tok:13a" in md
    for png in ("multi30k_cross_attention.png", "multi30k_cross_attention_mean.png", "multi30k_loss.png"):
        assert (results / "figures" / png).stat().st_size > 1000
    beam = (results / "translations" / "multi30k_test_2016_flickr_beam.en").read_text().splitlines()
    assert len(beam) == 20                                         # the quick run's 20 test pairs
    rc, out, err = _translate(capsys, runs / "multi30k", "Ein Mann fährt Fahrrad.", "--greedy")
    assert rc == 0 and len(out.splitlines()) == 1


@pytest.mark.slow
@needs_multi30k
def test_full_multi30k_reaches_bleu_30(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    results = tmp_path / "results"
    assert main(["reproduce", "multi30k", "--results", str(results), "--runs", str(tmp_path / "runs"),
                 "--quiet"]) == 0
    record = json.loads((results / "multi30k.json").read_text())
    assert record["figures"]["bleu_beam"] >= 30
