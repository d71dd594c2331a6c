"""Every own-data recipe of docs/reference/data.md ("Your own data") trains verbatim and learns.

The TOML blocks of that section are written to files exactly as the page shows them; the files they name
are generated here (small, seeded: a made-up language, topic sentences, labelled reviews, parallel
sentences), and `numformer train` runs in that folder. A recipe learns when its validation loss ends well
below the unigram level (the entropy of the validation targets' own distribution: what a model that ignores
its input can reach at best) and its output is not one repeated token.
"""
from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from numformer.cli import main
from numformer.config import load_config, resolve_config

DATA_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "data.md"

# A tiny made-up language pair: each source word has one target word; sentences of 3 to 8 words.
FR = ("le chat chien homme femme voit mange grand petit rouge bleu maison pomme livre lit court vite lentement "
      "enfant oiseau").split()
EN = "the cat dog man woman sees eats big small red blue house apple book reads runs fast slowly child bird".split()
SENTIMENT = {"positive": "wonderful moving great superb brilliant loved", "negative": "boring awful dull poor weak hated"}
FILLER = "the film story acting plot a was and of it this".split()


def own_data_recipes():
    """The ```toml blocks of data.md's "Your own data" section, in page order."""
    page = DATA_PAGE.read_text(encoding="utf-8")
    section = page.split("## Your own data", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```toml\n(.*?)```", section, flags=re.S)


def sentences(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        idx = rng.integers(0, len(FR), rng.integers(3, 9))
        out.append((" ".join(FR[i] for i in idx).capitalize() + " .", " ".join(EN[i] for i in idx).capitalize() + " ."))
    return out


def reviews(n, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = ("positive", "negative")[i % 2]
        words = list(rng.choice(SENTIMENT[label].split(), 2)) + list(rng.choice(FILLER, 8))
        rows.append((" ".join(rng.permutation(words)).capitalize() + ".", label))
    return rows


def write_reviews(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "review", "sentiment"])
        w.writerows((i, text, label) for i, (text, label) in enumerate(rows))


def write_files(config):
    """Generate the files a recipe's [data] names, in the current folder."""
    data = config["data"]
    if data["task"] == "text":
        folder = Path(data["path"])
        folder.mkdir(parents=True)
        for k in range(3):      # ~60 KB of sentences of the made-up English, in three files
            text = "\n".join(e for _, e in sentences(700, seed=10 + k))
            (folder / f"part{k}.txt").write_text(text + "\n", encoding="utf-8")
    elif data["task"] == "classification":
        write_reviews(data["path"], reviews(1200, seed=0))
        write_reviews(data["test_path"], reviews(200, seed=1))
    elif data["task"] == "translation":
        src, tgt = (Path(p) for p in data["train"])
        src.parent.mkdir(parents=True, exist_ok=True)
        pairs = sentences(2000, seed=0)
        src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        tgt.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
        Path(data["test"][0]).write_text("".join(f"{s}\t{t}\n" for s, t in sentences(100, seed=1)),
                                         encoding="utf-8")
    else:
        raise AssertionError(f"no generator for the recipe of task {data['task']!r}; add one here")


def unigram_level(task):
    """The entropy (nats) of the validation targets' own distribution: the best loss without the input."""
    counts = Counter()
    for batch in task.eval_batches("val", 64):
        t = np.asarray(batch.targets).ravel()
        counts.update(t[t != -100].tolist())
    p = np.array(list(counts.values()), dtype=float) / sum(counts.values())
    return float(-(p * np.log(p)).sum())


def test_the_page_has_the_three_recipes():
    tasks = [load_config_text(t)["data"]["task"] for t in own_data_recipes()]
    assert tasks == ["text", "classification", "translation"]


def load_config_text(text):
    import tomllib

    return tomllib.loads(text)


@pytest.mark.parametrize("index", range(3), ids=["text", "classification", "translation"])
def test_recipe_learns_verbatim(index, tmp_path, monkeypatch, capsys):
    text = own_data_recipes()[index]
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "recipe.toml"
    cfg.write_text(text, encoding="utf-8")
    config = load_config(cfg)
    write_files(config)
    _, task = resolve_config(config)
    level = unigram_level(task)
    assert main(["train", str(cfg), "--out", "runs/recipe", "--quiet"]) == 0
    summary = json.loads(Path("runs/recipe/summary.json").read_text())
    assert summary["best_val_loss"] < 0.5 * level, (summary["best_val_loss"], level)
    capsys.readouterr()
    kind = config["data"]["task"]
    if kind == "text":
        assert main(["generate", "runs/recipe", "--prompt", "The", "--max-new-tokens", "80", "--seed", "0"]) == 0
        words = capsys.readouterr().out.split()
        assert len(set(words)) >= 5, words
        assert sum(w.lower() in EN for w in words) >= len(words) // 2, words   # mostly real words
    elif kind == "classification":
        assert main(["eval", "runs/recipe", "--split", "test", "--json"]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["accuracy"] > 0.9
        assert main(["classify", "runs/recipe", "A wonderful, moving film.", "The plot was boring and dull."]) == 0
        out = capsys.readouterr().out.splitlines()
        assert "positive" in out[0] and "negative" in out[1], out
    else:
        src, tgt = sentences(1, seed=7)[0]
        assert main(["translate", "runs/recipe", src]) == 0
        words = capsys.readouterr().out.split()
        assert len(set(words)) >= 3, words            # not one repeated token
        assert math.isfinite(summary["best_val_loss"])
