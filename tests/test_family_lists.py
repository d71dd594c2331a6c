"""Every place that lists the Hugging Face families numformer reads names each family of the code's table
(``numformer.interop.hf.FAMILIES``), and the Hugging Face page's install lines give what its own examples
need (issue 36: import-hf --help, cli.md and index.md omitted Qwen2)."""
from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

from numformer.cli import main

ROOT = Path(__file__).resolve().parents[1]
# model_type -> the name the docs use; a family added to the table without a name here fails the first test
NAMES = {"gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma 2",
         "gemma3_text": "Gemma 3", "arcee": "Arcee"}


def test_every_family_of_the_table_has_a_name():
    from numformer.interop.hf import FAMILIES

    assert set(NAMES) == set(FAMILIES)


def _help(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*args, "--help"])
    return " ".join(out.getvalue().split())


def _line(path, contains):
    (line,) = [line for line in (ROOT / path).read_text(encoding="utf-8").splitlines() if contains in line]
    return line


def _paragraph(path, contains):
    (paragraph,) = [p for p in re.split(r"\n\s*\n", (ROOT / path).read_text(encoding="utf-8")) if contains in p]
    return " ".join(paragraph.split())


PLACES = {
    "numformer --help": lambda: _help(),
    "numformer import-hf --help": lambda: _help("import-hf"),
    "numformer export --help": lambda: _help("export"),
    "docs/reference/cli.md, import-hf": lambda: _line("docs/reference/cli.md", "`numformer import-hf SOURCE"),
    "docs/reference/cli.md, export": lambda: _line("docs/reference/cli.md", "`numformer export RUN_DIR"),
    "docs/index.md": lambda: _paragraph("docs/index.md", "exports Hugging Face"),
    "README.md": lambda: _paragraph("README.md", "exports Hugging Face"),
    "docs/reference/hf-checkpoints.md": lambda: _paragraph("docs/reference/hf-checkpoints.md",
                                                           "numformer reads and writes"),
}


@pytest.mark.parametrize("place", list(PLACES))
def test_each_list_of_families_names_every_family(place):
    text = PLACES[place]()
    missing = [name for name in NAMES.values() if not re.search(rf"\b{re.escape(name)}\b", text)]
    assert not missing, f"{place} does not name {missing}: {text[:300]}"


def test_the_how_to_sends_a_new_family_to_every_list():
    """docs/how-to/adding-a-model-family.md's table names this test and every file whose list it checks (the table
    once ended at the Hugging Face page, and a new family failed here)."""
    table = (ROOT / "docs" / "how-to" / "adding-a-model-family.md").read_text(encoding="utf-8")
    table = table[table.index("## The files a family touches"):table.index("That is all")]
    files = {"tests/test_family_lists.py", "src/numformer/commands/import_hf.py", "src/numformer/commands/export.py"}
    files |= {place.split(",")[0] for place in PLACES if not place.startswith("numformer")}
    for path in sorted(files):
        assert (ROOT / path).is_file() and f"`{path}`" in table, path


def _pip_lines(page):
    return [line for line in page.splitlines() if line.strip().startswith("pip install")]


def _installed_by(lines):
    """The distributions the page's pip lines install: named ones, the extras' and the core dependencies."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {re.split(r"[<>=!;\[ ]", d)[0].lower() for d in project["dependencies"]}
    for line in lines:
        words = line.split("#")[0].split()[2:]
        for word in words:
            extras = re.findall(r"\[([\w,]+)\]", word)
            for extra in (extras[0].split(",") if extras else []):
                names |= {re.split(r"[<>=!;\[ ]", d)[0].lower()
                          for d in project["optional-dependencies"][extra]}
            if not extras and not word.startswith("-") and word not in (".", "-e"):
                names.add(word.lower())
    return names


# the module or command a page uses -> the distribution that provides it
PROVIDED_BY = {"numpy": "numpy", "tokenizers": "tokenizers", "huggingface_hub": "huggingface_hub",
               "transformers": "transformers", "torch": "torch", "safetensors": "safetensors", "hf": "huggingface_hub"}


def test_the_hugging_face_page_installs_what_its_examples_use():
    page = (ROOT / "docs" / "reference" / "hf-checkpoints.md").read_text(encoding="utf-8")
    installed = _installed_by(_pip_lines(page))
    used = set()
    for block in re.findall(r"```python\n(.*?)```", page, re.S):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Import):
                used |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                used.add(node.module.split(".")[0])
    for block in re.findall(r"```bash\n(.*?)```", page, re.S):
        commands = block.replace("\\\n", " ").splitlines()          # a command continued with a backslash
        used |= {line.split()[0] for line in commands if line.strip() and not line.startswith("#")}
    used |= {"transformers", "torch"} if "from_pretrained(DIR)" in page else set()   # loading an export
    used -= {"numformer", "pip"}
    missing = sorted(u for u in used if PROVIDED_BY.get(u, u) not in installed)
    assert not missing, f"the install lines of hf-checkpoints.md ({_pip_lines(page)}) do not give {missing}"
