"""What a reader cross-checks between pages, checked so that it cannot go stale: the tutorials' numbers and
titles against the nav, the model diagrams against the configs their pages train, the printed samples against
the results they come from, figures whose legend would hide a curve, the Hugging Face families the pages name
against those numformer loads, and the notation of a normal distribution.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_docs_pages import drawn_figures, page_text

ROOT = Path(__file__).resolve().parents[1]
NAV_TUTORIAL = re.compile(r"^\s+- (\d+)\. (.+): (tutorials/[\w-]+\.md)$", re.M)


def nav_tutorials():
    """[(number, title, path)] of the Tutorials section of mkdocs.yml, in order."""
    found = [(int(n), title, path) for n, title, path in
             NAV_TUTORIAL.findall((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))]
    assert [n for n, _, _ in found] == list(range(1, len(found) + 1)), "the nav's tutorials are not numbered 1, 2, …"
    return found


def test_every_tutorial_is_in_the_nav():
    in_nav = {path for _, _, path in nav_tutorials()}
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs" / "tutorials").glob("*.md")}
    assert in_nav == on_disk


@pytest.mark.parametrize("number, title, path", nav_tutorials(), ids=lambda v: str(v))
def test_a_tutorials_heading_is_its_nav_entry(number, title, path):
    first = (ROOT / "docs" / path).read_text(encoding="utf-8").splitlines()[0]
    assert first == f"# {number}. {title}", f"docs/{path} opens with {first!r}; the nav says {number}. {title}"


def test_the_home_page_table_numbers_the_tutorials_as_the_nav():
    """Every tutorial linked from docs/index.md is named "N. Title" as in the nav, and every tutorial is linked."""
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    links = re.findall(r"\[([^\]]+)\]\((tutorials/[\w-]+\.md)\)", text)
    nav = {path: f"{n}. {title}" for n, title, path in nav_tutorials()}
    wrong = [(label, path) for label, path in links if re.match(r"\d+\.", label) and label != nav[path]]
    assert not wrong, f"docs/index.md numbers or names these tutorials unlike the nav: {wrong} (nav: {nav})"
    missing = [name for path, name in nav.items() if f"[{name}]({path})" not in text]
    assert not missing, f"docs/index.md does not link {missing}"


def test_the_readme_lists_the_tutorials_in_the_navs_order():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\s+(\d+)\. \[[^\]]+\]\(docs/(tutorials/[\w-]+\.md)\)", text, re.M)
    assert [(int(n), path) for n, path in listed] == [(n, path) for n, _, path in nav_tutorials()]


def png_description(path):
    from PIL import Image

    with Image.open(path) as image:
        return image.info.get("Description")


@pytest.mark.parametrize("name", sorted(drawn_figures().MODEL_DRAWINGS))
def test_a_model_diagram_shows_the_model_its_page_trains(name):
    """The committed diagram (its Description: the diagram as text) is the model of the config its page shows."""
    pytest.importorskip("matplotlib")
    from numformer.analysis.diagram import format_model_diagram

    diagrams = drawn_figures()
    page, config = diagrams.MODEL_DRAWINGS[name]
    assert f"../figures/{name}" in (ROOT / "docs" / page).read_text(encoding="utf-8"), f"docs/{page} shows no {name}"
    model, (batch, seq_len, tgt_len) = diagrams.model_of(config())
    committed = png_description(ROOT / "docs" / "figures" / name)
    assert committed == format_model_diagram(model, batch, seq_len, tgt_len), (
        f"docs/figures/{name} does not show the model of docs/{page}: run `python docs/figures/diagrams.py`")


def test_the_encoder_decoder_diagram_is_drawn_from_the_pages_config():
    diagrams = drawn_figures()
    model, _ = diagrams.model_of(diagrams.MODEL_DRAWINGS["transformer_copy.png"][1]())
    config = diagrams.page_config("tutorials/encoder-decoder.md")["model"]
    block = model.encoder.layers[0]
    assert (block.norm_first, block.activation, block.ff.linear1.out_features) == \
        (config["norm_first"], config["activation"], config["d_ff"])


def test_the_first_gpt_samples_are_those_of_the_quoted_run():
    """The samples "Train your first GPT" prints are results/shakespeare_char_samples.json's, and those come
    from the weights whose loss the page quotes (results/shakespeare_char.json)."""
    samples = json.loads((ROOT / "results" / "shakespeare_char_samples.json").read_text(encoding="utf-8"))
    quoted = json.loads((ROOT / "results" / "shakespeare_char.json").read_text(encoding="utf-8"))
    assert samples["val_loss"] == pytest.approx(quoted["best_val_loss"], abs=1e-6)
    text = page_text("docs/tutorials/first-gpt.md", tiny=False)
    printed = re.search(r"it prints:\n\n```text\n(.*?)```", text, re.S).group(1)
    expected = "".join(f"--- {name}\n{sample}\n" for name, sample in samples["samples"].items())
    assert printed == expected, "first-gpt.md's samples are not those of results/shakespeare_char_samples.json"
    assert f'{samples["new_tokens"]}, rng={samples["seed"]}' in text and f'"{samples["prompt"]}"' in text


@pytest.mark.parametrize("plot", ["plot_accuracy_vs_length", "plot_position_accuracy"])
def test_the_positional_figures_legend_hides_no_curve(plot):
    """The legend sits beside the panels, not on them (it hid the reversal curves)."""
    pytest.importorskip("matplotlib")
    from numformer.experiments import positional

    record = json.loads((ROOT / "results" / "positional.json").read_text(encoding="utf-8"))
    vocab = int(record["config"]["data"]["vocab"])
    runs = positional.runs_from_record(record)
    args = (runs, record["L"], record["eval_lengths"], vocab) if plot == "plot_accuracy_vs_length" else \
        (runs, record["L"], vocab)
    fig = getattr(positional, plot)(*args, path=None)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert all(ax.get_legend() is None for ax in fig.axes) and fig.legends
    legend = fig.legends[0].get_window_extent(renderer)
    assert not any(legend.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_a_diagram_title_counts_its_layers_in_words():
    from numformer.analysis.diagram import model_diagram
    from numformer.models import GPT

    assert ", 1 layer," in model_diagram(GPT(10, 8, n_layers=1, n_heads=2, d_model=8), 2, 8)[0]
    assert ", 2 layers," in model_diagram(GPT(10, 8, n_layers=2, n_heads=2, d_model=8), 2, 8)[0]


def test_a_normal_distribution_is_written_with_its_variance():
    """N(μ, σ²): a standard deviation written in the variance's place (N(0, 0.02)) is the slip a learner met."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    slips = [f"{p.relative_to(ROOT)}: {m.group()}" for p in pages
             for m in re.finditer(r"N\(0, ?0?\.\d+\)", p.read_text(encoding="utf-8"))]
    assert not slips, slips


# README: "Every layer (...) is a forward function and a backward function you can read, derived in the docs":
# each layer it names -> the heading of the tutorial section that derives its backward pass
DERIVED = {"linear": "Linear", "embedding": "Embedding", "layer norm": "Layer norm", "softmax": "Softmax",
           "cross-entropy": "Cross-entropy", "dropout": "Dropout", "GELU": "GELU",
           "attention with its masks": "Attention", "positional encodings": "The position table",
           "RMSNorm": "RMSNorm", "SwiGLU": "SwiGLU", "RoPE": "RoPE"}


def test_every_layer_the_readme_calls_derived_has_its_derivation():
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    listed = re.search(r"Every layer \((.+?)\) is a forward function", readme)
    assert listed, "README.md no longer lists the layers whose backward passes the docs derive"
    layers = [name.strip() for name in listed.group(1).split(",")]
    assert layers == list(DERIVED), "name the layer's derivation (its tutorial heading) in DERIVED"
    headings = {m.group(1).strip() for page in (ROOT / "docs" / "tutorials").glob("*.md")
                for m in re.finditer(r"^#{2,3} (.+)$", page.read_text(encoding="utf-8"), re.M)}
    missing = {layer: heading for layer, heading in DERIVED.items() if heading not in headings}
    assert not missing, f"README.md says these are derived, but no tutorial has the section: {missing}"


# -- "Where a new part belongs" (engine page) and "Adding a model family": the files and names they send a reader to
PACKAGE = ROOT / "src" / "numformer"
FILE_NAME = re.compile(r"`((?:[\w]+/)*[\w]+\.py)`'s `(\w+)`")          # `models/config.py`'s `from_keywords`
PATH = re.compile(r"`((?:src/numformer/)?(?:[\w]+/)+(?:[\w]+\.py)?)`")   # `ops/`, `interop/hf/families.py`


def _section(page, heading):
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize("page, heading", [("reference/engine.md", "## Where a new part belongs"),
                                           ("how-to/adding-a-model-family.md", "## The files a family touches")])
def test_the_files_and_names_a_new_part_goes_to_exist(page, heading):
    """Every folder and file the section names exists, and every `file.py`'s `name` is defined in that file (the
    section once sent a new tokenizer to data/tokenizers.py, which had become a package)."""
    text = _section(page, heading)
    paths = {p.removeprefix("src/numformer/") for p in PATH.findall(text) if "FAMILY" not in p}
    assert len(paths) >= 3, paths
    for path in sorted(paths):
        assert (PACKAGE / path).exists() or (ROOT / path).exists(), f"docs/{page} names `{path}`, which is not there"
    named = FILE_NAME.findall(text)
    for path, name in named:
        source = next(p for p in (PACKAGE / path, ROOT / path) if p.exists()).read_text(encoding="utf-8")
        assert re.search(rf"^\s*(def |class )?{name}\b", source, re.M), f"docs/{page}: {path} defines no {name}"


def test_a_files_line_count_quoted_by_the_docs_is_its_own():
    """"(`interop/hf/qwen3.py`, 62 lines)": the file has that many lines (the how-to said 70 for a 62-line file)."""
    quoted = re.compile(r"`((?:[\w]+/)*[\w]+\.py)`, (\d+) lines")
    found = 0
    for page in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]:
        for path, n in quoted.findall(page.read_text(encoding="utf-8")):
            lines = len((PACKAGE / path).read_text(encoding="utf-8").splitlines())
            assert lines == int(n), f"{page.relative_to(ROOT)} says {path} has {n} lines; it has {lines}"
            found += 1
    assert found


def test_the_experiments_reference_lists_every_experiment():
    from numformer.experiments import EXPERIMENTS, load_all

    load_all()
    table = (ROOT / "docs" / "reference" / "reproduce.md").read_text(encoding="utf-8").split("\n\n", 3)[2]
    named = set(re.findall(r"`(\w+)`", "\n".join(line.split(" | ")[0] for line in table.splitlines())))
    assert sorted(set(EXPERIMENTS) - named) == []


def test_the_cli_reference_names_every_benchmark_part():
    from numformer.bench.runner import available_parts

    text = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    listed = text[text.index("`numformer bench PART` takes"):]
    listed = set(re.findall(r"`([\w-]+)`", listed[:listed.index("([Benchmarks]")]))
    assert sorted({p.replace("_", "-") for p in available_parts()} - listed) == []


def test_a_tutorials_next_link_is_the_next_tutorial_of_the_nav():
    paths = [path for _, _, path in nav_tutorials()]
    for here, after in zip(paths, paths[1:]):
        next_lines = [line for line in (ROOT / "docs" / here).read_text(encoding="utf-8").splitlines()
                      if line.startswith("Next:")]
        for line in next_lines:
            assert re.search(r"\]\(([\w-]+\.md)", line).group(1) == Path(after).name, f"{here}: {line}"
