"""The explorer without a browser: its numbers are numformer's (run_with_cache, the logit lens, the sampler),
the static page is self-contained, the JSON API answers and refuses as documented, and `numformer explore`
serves on 127.0.0.1 and writes static pages. tests/test_explorer_browser.py clicks the page in chromium."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import numformer
from conftest import EXPLORER_PROMPT, hf_bpe_folder, src_env
from numformer import analysis as A
from numformer.explorer import (FORMAT, Explorer, analyse, make_server, page_data, position_logits, prompt_ids,
                                read_page_data, refresh_static_page, render_page, write_static_page)
from numformer.explorer import data as explorer_data

ROOT = Path(__file__).resolve().parents[1]
DOCS_PAGE = ROOT / "docs" / "explorer" / "shakespeare_char.html"
PROMPT = EXPLORER_PROMPT


@pytest.fixture(scope="module")
def loaded(explorer_run):
    return numformer.load(explorer_run)


def test_the_analysis_holds_numformers_numbers(loaded):
    model, tokenizer = loaded
    ids = np.array(tokenizer.encode(PROMPT))
    a = analyse(model, tokenizer, ids)
    logits, cache = model.run_with_cache(ids[None])
    T = len(ids)
    assert a["ids"] == ids.tolist() and "".join(a["tokens"]) == PROMPT
    assert len(a["attention"]) == model.n_layers
    for layer, heads in enumerate(a["attention"]):
        pattern = cache["pattern", layer][0]
        assert len(heads) == pattern.shape[0]
        for h, rows in enumerate(heads):
            assert [len(r) for r in rows] == list(range(1, T + 1))          # query t sees keys 0..t
            for q, row in enumerate(rows):
                assert np.abs(np.array(row) - pattern[h, q, :q + 1]).max() <= 5e-6
                assert abs(sum(row) - 1) < 1e-4
    assert np.array_equal(np.array(a["logits"], dtype=np.float32), logits[0])     # float32 values, exactly
    lens = A.logit_lens(model, ids)
    top, probs = lens.top(explorer_data.LENS_TOP)
    assert a["lens"]["stages"] == ["embeddings", "layer 0", "layer 1"]
    assert a["lens"]["ids"] == top[:, 0].tolist()
    assert np.abs(np.array(a["lens"]["probs"]) - probs[:, 0]).max() <= 5e-6
    assert np.abs(np.array(a["lens"]["actual"]) - lens.next_token_probability()[:, 0]).max() <= 5e-6
    order = np.argsort(-logits[0].astype(np.float64), axis=-1, kind="stable")[:, :explorer_data.NEXT_TOP]
    assert a["next"] == order.tolist()
    named = set(a["ids"]) | set(np.ravel(a["lens"]["ids"]).tolist()) | set(np.ravel(a["next"]).tolist())
    assert a["vocab"] == {str(i): tokenizer.decode([i]) for i in sorted(named)}


def test_large_vocabularies_send_the_logits_of_one_position_on_request(loaded):
    model, tokenizer = loaded
    ids = tokenizer.encode(PROMPT)
    a = analyse(model, tokenizer, ids, inline_logits=False)
    assert a["logits"] is None
    full = model(np.array(ids)[None])[0]
    for t in (0, 5, len(ids) - 1):
        assert np.allclose(position_logits(model, ids, t), full[t], atol=1e-5)
    with pytest.raises(ValueError, match=r"position must be in \[0, 15\)"):
        position_logits(model, ids, 15)


def test_bad_sequences_are_refused_by_name(loaded):
    model, tokenizer = loaded
    with pytest.raises(ValueError, match="the text is empty"):
        analyse(model, tokenizer, [])
    with pytest.raises(ValueError, match="has 33 tokens but the model reads at most 32"):
        analyse(model, tokenizer, [1] * 33)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 52\)"):
        analyse(model, tokenizer, [1, 52])
    with pytest.raises(ValueError, match="at most 17 new tokens fit"):
        prompt_ids(model, tokenizer, PROMPT, 18)


def test_generated_tokens_are_those_numformer_generate_prints(loaded, explorer_run, run_cli):
    model, tokenizer = loaded
    ids, n_prompt = prompt_ids(model, tokenizer, "ROMEO:", 12, seed=3, temperature=0.8, top_k=10)
    assert n_prompt == 6 and len(ids) == 18
    rc, out, _ = run_cli("generate", explorer_run, "--prompt", "ROMEO:", "--max-new-tokens", 12, "--seed", 3,
                         "--temperature", 0.8, "--top-k", 10)
    assert rc == 0 and out == tokenizer.decode(ids.tolist()) + "\n"


def test_the_static_page_is_self_contained(loaded, tmp_path):
    model, tokenizer = loaded
    ids, n_prompt = prompt_ids(model, tokenizer, "ROMEO:", 4, seed=0)
    data = page_data(model, tokenizer, ids, n_prompt, "tiny </script> run", "static")
    path = write_static_page(tmp_path / "page.html", data)
    text = path.read_text(encoding="utf-8")
    assert read_page_data(path) == json.loads(json.dumps(data))
    assert text.count("</script>") == 2 and "<" not in read_data_text(text)    # the source's "</script>" escaped
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", text), "the page loads nothing from elsewhere"
    assert not re.search(r"https?://", text) and "@import" not in text and "url(" not in text
    assert "<title>numformer explorer: tiny &lt;/script&gt; run</title>" in text
    with pytest.raises(ValueError, match="ending in .html"):
        write_static_page(tmp_path / "page.txt", data)
    text = text.replace('"format":1', '"format":0').replace("<h1>", "<h1>old ")
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="format 0; this numformer writes format 1"):
        refresh_static_page(path)
    path.write_text(text.replace('"format":0', '"format":1'), encoding="utf-8")
    assert "<h1>old" not in refresh_static_page(path).read_text(encoding="utf-8")    # today's template again
    assert read_page_data(path) == json.loads(json.dumps(data))
    (tmp_path / "other.html").write_text("<html></html>")
    with pytest.raises(ValueError, match="not a page written by `numformer explore --static`"):
        read_page_data(tmp_path / "other.html")
    with pytest.raises(ValueError, match="exists and is not a page `numformer explore --static` wrote"):
        write_static_page(tmp_path / "other.html", data)                       # a file of the user's: refused
    assert (tmp_path / "other.html").read_text() == "<html></html>"
    (tmp_path / "deep.html").write_text('<script type="application/json" id="explorer-data">' + "[" * 200 + "]" * 200 + "</script>")
    with pytest.raises(ValueError, match="nest"):
        read_page_data(tmp_path / "deep.html")                                 # within _limits' bounds
    assert read_page_data(write_static_page(path, {**data, "prompt_text": "again"}))["prompt_text"] == "again"


def read_data_text(page):
    return re.search(r'id="explorer-data">(.*?)</script>', page, re.S).group(1)


@pytest.fixture
def server(explorer_server):
    return explorer_server


def post(server, path, body, raw=None, content_type="application/json", host=None):
    """(status, reply) of a POST to the server's API."""
    headers = {"Content-Type": content_type, **({"Host": host} if host else {})}
    request = urllib.request.Request(server.url + path.lstrip("/"), data=raw if raw is not None else
                                     json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_server_answers_on_127_0_0_1_only(server, loaded):
    model, tokenizer = loaded
    assert server.server_address[0] == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(server.url, timeout=30) as reply:
        page = reply.read().decode()
    data = json.loads(read_data_text(page))
    assert data["mode"] == "server" and data["format"] == FORMAT and data["analysis"]["ids"] == tokenizer.encode(PROMPT)
    status, a = post(server, "/api/analyze", {"text": "First Citizen:"})
    assert status == 200 and a == json.loads(json.dumps(analyse(model, tokenizer, tokenizer.encode("First Citizen:"))))
    status, a = post(server, "/api/analyze", {"ids": [1, 2, 3]})
    assert status == 200 and a["ids"] == [1, 2, 3]
    status, reply = post(server, "/api/logits", {"ids": a["ids"], "position": 1})
    assert status == 200 and reply["logits"] == a["logits"][1]


def test_a_step_appends_the_sampled_token(server, loaded):
    model, tokenizer = loaded
    ids = tokenizer.encode(PROMPT)
    status, reply = post(server, "/api/step", {"ids": ids, "greedy": True})
    assert status == 200 and reply["token"] == int(np.argmax(model(np.array(ids)[None])[0, -1]))
    assert reply["analysis"]["ids"] == ids + [reply["token"]]
    status, reply = post(server, "/api/step", {"ids": ids, "temperature": 0.7, "top_k": 3, "top_p": 0.9})
    expected = numformer.sampling.sample_next(model(np.array(ids)[None])[0, -1], np.random.default_rng(0), 0.7,
                                              3, 0.9)
    assert status == 200 and reply["token"] == int(expected)           # the server's rng: seed 0, first draw


@pytest.mark.parametrize("path, body, status, message", [
    ("/api/analyze", {"text": ""}, 400, "the prompt is empty"),
    ("/api/analyze", {"text": 5}, 400, "'text' must be a string"),
    ("/api/analyze", {"ids": [1, "a"]}, 400, "'ids' must be a list of token ids"),
    ("/api/logits", {"ids": [1, 2]}, 400, "'position' must be an integer"),
    ("/api/step", {"ids": [1] * 32}, 400, "the context is full"),
    ("/api/step", {"ids": [1], "temperature": -1}, 400, "temperature must be a finite number >= 0"),
    ("/api/step", {"ids": [1], "top_p": 2}, 400, "top_p must be in (0, 1]"),
    ("/api/nothing", {}, 404, "no API /api/nothing"),
    ("/api/analyze", [1, 2], 400, "send a JSON object"),
])
def test_bad_requests_get_one_clear_error(server, path, body, status, message):
    got, reply = post(server, path, body)
    assert got == status and message in reply["error"], reply


def test_a_request_that_is_not_json_is_refused(server):
    assert post(server, "/api/analyze", None, raw=b"{not json")[0] == 400
    assert post(server, "/api/analyze", None, raw=b'{"text": "a"}', content_type="text/plain") == \
        (415, {"error": "send Content-Type: application/json"})
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(server.url + "favicon.ico", timeout=30)


def test_pages_of_other_sites_cannot_use_the_server(server):
    """A request naming another host (a page whose name was rebound to 127.0.0.1) is refused; localhost is fine."""
    port = server.server_address[1]
    assert post(server, "/api/analyze", {"text": "a"}, host=f"evil.example:{port}") == \
        (403, {"error": f"the explorer answers at {server.url} only"})
    with pytest.raises(urllib.error.HTTPError, match="403"):
        urllib.request.urlopen(urllib.request.Request(server.url, headers={"Host": f"evil.example:{port}"}),
                               timeout=30)
    assert post(server, "/api/analyze", {"text": "a"}, host=f"localhost:{port}")[0] == 200


def test_a_port_in_use_is_one_clear_error(server, loaded):
    model, tokenizer = loaded
    with pytest.raises(ValueError, match=f"port {server.server_address[1]} is in use; choose another with --port"):
        make_server(Explorer(model, tokenizer), server.server_address[1], page_data(model, tokenizer, None, 0, "t",
                                                                                   "server"))


def test_explore_static_writes_a_page(explorer_run, run_cli, tmp_path, loaded):
    model, tokenizer = loaded
    rc, out, err = run_cli("explore", explorer_run, "--static", tmp_path / "p.html", "--prompt", "ROMEO:",
                           "--seed", 1, "--top-p", 0.9)
    assert rc == 0 and out.startswith(f"wrote {tmp_path / 'p.html'} (") and "26 tokens" in out, err
    data = read_page_data(tmp_path / "p.html")
    ids, n_prompt = prompt_ids(model, tokenizer, "ROMEO:", 20, seed=1, top_p=0.9)
    assert data == json.loads(json.dumps(page_data(model, tokenizer, ids, n_prompt, str(explorer_run), "static",
                                                   {"top_p": 0.9}, inline_logits=True)))
    rc, out, _ = run_cli("explore", explorer_run, "--static", tmp_path / "new" / "g.html", "--prompt", "ROMEO:",
                         "--greedy", "--max-new-tokens", 3)        # into a folder not made yet, as export and train
    assert rc == 0 and read_page_data(tmp_path / "new" / "g.html")["sampling"]["temperature"] == 0
    assert f"made the folder {tmp_path / 'new'}" in out          # said, not done silently


def test_the_default_number_of_new_tokens_is_what_fits(explorer_run, run_cli, tmp_path):
    """--static's default (20 new tokens) is capped to the room the context (block_size 32) leaves after the
    prompt (15 tokens): the user gave no --max-new-tokens, so none is refused."""
    rc, out, err = run_cli("explore", explorer_run, "--static", tmp_path / "p.html", "--prompt", EXPLORER_PROMPT)
    assert rc == 0 and "32 tokens" in out, err
    data = read_page_data(tmp_path / "p.html")
    assert len(data["analysis"]["ids"]) == 32 and data["n_prompt"] == 15


@pytest.mark.parametrize("where, message", [
    ("notes.txt/p.html", "notes.txt/p.html: notes.txt is a file, not a folder; give a path in a folder"),
    ("notes.txt/a/p.html", "notes.txt is a file, not a folder"),
    ("dir.html", "dir.html is a folder; give the name of a new .html file"),
    pytest.param("/proc/p.html", "/proc/p.html: a new file cannot be made in the folder /proc (",
                 marks=pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here")),
])
def test_a_static_path_that_cannot_be_written_is_named(explorer_run, cli_error, tmp_path, monkeypatch, where,
                                                       message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    (tmp_path / "dir.html").mkdir()
    assert message in cli_error("explore", explorer_run, "--static", where, "--prompt", "a")
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert not any((tmp_path / "dir.html").iterdir())


@pytest.mark.parametrize("args, message", [
    (["--static", "p.html"], "--static writes the page of one prompt; give it with --prompt TEXT"),
    (["--static", "p.html", "--prompt", "a", "--port", "1"], "--port is the server's"),
    (["--static", "p.html", "--prompt", "ROMEO:", "--max-new-tokens", "40"], "at most 26 new tokens fit"),
    (["--prompt", "a", "--temperature", "-1"], "--temperature must be a number >= 0 (0: greedy), got -1.0"),
    (["--prompt", "a", "--greedy", "--temperature", "0.5"], "--greedy always takes the most likely token, so "
                                                             "--temperature would do nothing"),
    (["--port", "70000"], "--port must be in 0..65535"),
    (["--static", "p.txt", "--prompt", "a"], "ending in .html"),
    (["--prompt", "\u00e9"], "not in the vocabulary of 52: '\u00e9'"),
])
def test_explore_errors_are_one_line(explorer_run, cli_error, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert message in cli_error("explore", explorer_run, *args)


def test_a_missing_source_is_one_line(cli_error, tmp_path):
    assert "missing does not exist" in cli_error("explore", tmp_path / "missing", "--port", "0")


@pytest.mark.skipif(sys.platform == "win32", reason="Ctrl-C is sent as SIGINT, which Windows processes do not take")
def test_explore_serves_until_interrupted(explorer_run):
    """The command itself, in a process of its own: prints its URL, serves the page, stops on Ctrl-C (130)."""
    process = subprocess.Popen([sys.executable, "-m", "numformer.cli", "explore", str(explorer_run), "--port", "0",
                                "--prompt", "ROMEO:"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=src_env())
    try:
        line = process.stdout.readline()
        url = re.search(r"at (http://127\.0\.0\.1:\d+/) \(Ctrl-C stops\)", line)
        assert url, line + process.stderr.read() if process.poll() is not None else line
        with urllib.request.urlopen(url.group(1), timeout=30) as reply:
            assert '"mode":"server"' in reply.read().decode()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 130


def test_a_hugging_face_folder_is_explored(tmp_path, run_cli):
    from numformer.data.text import read_corpus

    folder = hf_bpe_folder(tmp_path / "hf", read_corpus("")[:5000])
    rc, out, err = run_cli("explore", folder, "--static", tmp_path / "p.html", "--prompt", "First Citizen",
                           "--max-new-tokens", 5, "--seed", 0)
    assert rc == 0, err
    data = read_page_data(tmp_path / "p.html")
    assert "".join(data["analysis"]["tokens"][:data["n_prompt"]]) == "First Citizen"
    assert len(data["analysis"]["logits"][0]) == data["model"]["vocab_size"] == 300


def test_the_docs_page_is_current():
    """docs/explorer/shakespeare_char.html (the docs site embeds it) is the page this numformer writes for its
    data: the data's format, the template, stylesheet and script are today's. Rewrite it with the command of
    docs/tutorials/researcher.md ("The explorer in the browser"), or keep its data and refresh the rest."""
    data = read_page_data(DOCS_PAGE)
    assert data["format"] == FORMAT and data["mode"] == "static"
    assert DOCS_PAGE.read_text(encoding="utf-8") == render_page(data), \
        ("the docs page is out of date: python -c 'import numformer.explorer as e; "
         "e.refresh_static_page(\"docs/explorer/shakespeare_char.html\")' (or the command in researcher.md)")
    assert DOCS_PAGE.stat().st_size < 400_000
    assert data["model"]["source"] == "runs/shakespeare_char" and data["model"]["vocab_size"] == 65
