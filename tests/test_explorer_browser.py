"""The explorer page in a real browser: Debian's chromium, headless, started by the test and driven over the
DevTools protocol (tests/headless_chromium.py); skipped, saying why, where no chromium is installed.

The static page is opened from file:// and the served page from the server on 127.0.0.1. The tests click
tokens with real mouse events, move the sampling controls (a key press on the temperature slider, then set
values), step through tokens, type a prompt, and compare what the page shows with numformer's own numbers:
the attention pattern of ``run_with_cache``, ``numformer.sampling.next_token_probabilities``, the logit lens.
Every test ends with no console error, no uncaught exception and no failed request.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import numformer
from conftest import EXPLORER_PROMPT
from headless_chromium import Chromium, skip_reason
from numformer import analysis as A
from numformer.explorer import page_data, prompt_ids, write_static_page
from numformer.sampling import next_token_probabilities

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

PROMPT, NEW = EXPLORER_PROMPT, 8


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Chromium.start(tmp_path_factory.mktemp("chromium-profile")) as chromium:
        yield chromium


@pytest.fixture(scope="module")
def loaded(explorer_run):
    return numformer.load(explorer_run)


@pytest.fixture(scope="module")
def static_page(loaded, tmp_path_factory):
    model, tokenizer = loaded
    ids, n_prompt = prompt_ids(model, tokenizer, PROMPT, NEW, seed=0)
    path = tmp_path_factory.mktemp("static") / "explorer.html"
    write_static_page(path, page_data(model, tokenizer, ids, n_prompt, "tiny run", "static", inline_logits=True))
    return path, ids, n_prompt


def open_page(browser, url):
    page = browser.new_page()
    page.goto(url)
    page.evaluate("window.numformerExplorer.ready")
    return page


def visible(text):
    return text.replace("\n", "\u21b5").replace("\t", "\u21e5").replace(" ", "\u2423")


SHOWN_TOKENS = "[...document.querySelectorAll('#tokens .token')].map((e) => e.textContent)"
GRID = """[...document.querySelectorAll('#attention .attn-cell')].map((c) => ({layer: +c.dataset.layer,
    head: +c.dataset.head, values: [...c.querySelectorAll('.attn-bar')].map((b) => +b.dataset.value)}))"""
SHOWN_PROBABILITIES = """[...document.querySelectorAll('#next-tokens .prob-row')].map((r) => [+r.dataset.id,
    +r.dataset.prob])"""


def set_control(page, element, value):
    """Move a slider to ``value`` as a user's drag ends: the value set, an input event fired."""
    page.evaluate(f"(() => {{ const e = document.getElementById({json.dumps(element)}); e.value = {value}; "
                  f"e.dispatchEvent(new Event('input')); }})()")


def wait_until(page, condition):
    """Wait (in the page, up to 20 s) until the JavaScript ``condition`` holds."""
    assert page.evaluate(f"new Promise((done) => {{ const t0 = Date.now(); const check = () => ({condition}) ? "
                         f"done(true) : Date.now() - t0 > 20000 ? done(false) : setTimeout(check, 20); "
                         f"check(); }})"), condition


def no_problems(page):
    assert page.problems() == []


def test_the_static_page_shows_the_tokens_and_the_attention_from_a_clicked_one(browser, static_page, loaded):
    model, tokenizer = loaded
    path, ids, n_prompt = static_page
    page = open_page(browser, path.as_uri())
    assert page.evaluate(SHOWN_TOKENS) == [visible(c) for c in PROMPT]
    _, cache = model.run_with_cache(ids[None])
    for position in (3, 0, n_prompt - 1):
        page.click(f'#tokens .token[data-position="{position}"]')
        assert page.evaluate("document.querySelector('.token.selected').dataset.position") == str(position)
        cells = page.evaluate(GRID)
        assert [(c["layer"], c["head"]) for c in cells] == [(layer, h) for layer in range(2) for h in range(2)]
        for c in cells:
            expected = cache["pattern", c["layer"]][0, c["head"], position, :position + 1]
            assert len(c["values"]) == position + 1
            assert np.abs(np.array(c["values"]) - expected).max() <= 1e-5
    assert page.requested_urls() == [path.as_uri()]          # nothing else: no network, no other file
    no_problems(page)


def shown_matches_numformer(page, logits, temperature, top_k, top_p):
    """The page's probabilities (all, and the rows it lists) against numformer's sampler on the same logits."""
    wanted = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    wait_until(page, f"JSON.stringify(window.numformerExplorer.shownFor) === JSON.stringify(Object.assign("
                     f"{{position: window.numformerExplorer.shownFor.position}}, {json.dumps(wanted)}))")
    expected = next_token_probabilities(logits, temperature, top_k, top_p)
    assert np.abs(np.array(page.evaluate("window.numformerExplorer.probabilities")) - expected).max() <= 1e-12
    rows = page.evaluate(SHOWN_PROBABILITIES)
    order = np.argsort(-expected, kind="stable")[:20]
    order = order[expected[order] > 0]
    assert [r[0] for r in rows] == order.tolist()
    assert np.abs(np.array([r[1] for r in rows]) - expected[order]).max() <= 1e-12
    assert page.evaluate("document.getElementById('kept').textContent").startswith(f"({(expected > 0).sum()} of")
    return expected


def test_the_sampling_controls_give_numformers_probabilities(browser, static_page, loaded):
    model, tokenizer = loaded
    path, ids, n_prompt = static_page
    page = open_page(browser, path.as_uri())
    position = 4
    page.click(f'#tokens .token[data-position="{position}"]')
    logits, _ = model.run_with_cache(ids[None])
    logits = logits[0, position]
    at_one = shown_matches_numformer(page, logits, 1.0, None, None)
    page.click("#temperature")                                  # focus the slider, then move it with the keyboard
    page.evaluate("document.getElementById('temperature').value = 1; document.getElementById('temperature').focus()")
    for key in ("ArrowLeft", "ArrowLeft"):
        for kind in ("keyDown", "keyUp"):
            page.send("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": 37})
    assert page.evaluate("document.getElementById('temperature').value") == "0.9"
    assert np.abs(shown_matches_numformer(page, logits, 0.9, None, None) - at_one).max() > 1e-4
    for temperature, top_k, top_p in [(0.5, None, None), (1.7, 5, None), (1.0, None, 0.8), (0.7, 10, 0.9),
                                      (1.3, 3, 0.5), (0.0, None, None)]:
        set_control(page, "temperature", temperature)
        set_control(page, "top-k", top_k or 0)
        set_control(page, "top-p", top_p or 1)
        shown_matches_numformer(page, logits, temperature, top_k, top_p)
    # the plain forward pass (the fused kernels, no hooks) gives the same distribution to float32 rounding
    plain = model(ids[None])[0, position]
    for element, value in (("temperature", 0.8), ("top-k", 3), ("top-p", 0.5)):
        set_control(page, element, value)
    shown = np.array(page.evaluate("window.numformerExplorer.probabilities"))
    assert np.abs(shown - next_token_probabilities(plain, 0.8, 3, 0.5)).max() <= 1e-6
    no_problems(page)


def test_the_filters_in_javascript_equal_numformers_on_hard_cases(browser, static_page):
    """Ties at the k-th logit and at the top-p threshold, a set reaching p exactly, -inf and +inf logits, huge
    logits, a temperature so small that logits / T overflows (the greedy token, ties sharing it)."""
    page = open_page(browser, static_page[0].as_uri())
    rng = np.random.default_rng(0)
    cases = [([2.0, 1.0, 1.0, 1.0, 0.0], 1.0, 2, None), ([2.0, 1.0, 1.0, 1.0, 0.0], 1.0, None, 0.5),
             (np.log([0.5, 0.25, 0.125, 0.125]).tolist(), 1.0, None, 0.75),
             (np.log([0.5, 0.25, 0.125, 0.125]).tolist(), 1.0, None, 0.875),
             ([0.0, -np.inf, 3.0, -np.inf], 0.6, 2, 0.99), ([1e4, 1e4 - 1, -1e4], 1.0, None, 0.7),
             ([1.0, 1.0, 1.0], 2.0, 1, None), ([5.0, 3.0, 5.0, 1.0], 0.0, None, None),
             ([1.0, np.inf, 2.0], 1.0, None, None), ([np.inf, 0.0, np.inf, -np.inf], 0.5, 2, 0.9),
             ([1.0, 3.0, 2.0, 3.0], 1e-320, None, None), (rng.normal(0, 3, 50).tolist(), 1e-320, 5, 0.9)]
    cases += [(rng.normal(0, 3, 500).tolist(), float(t), int(k) or None, float(p) if p < 1 else None)
              for t, k, p in zip(rng.uniform(0.1, 2, 12), rng.integers(0, 50, 12), rng.uniform(0.1, 1.3, 12))]
    wire = [([{-np.inf: None, np.inf: "inf"}.get(v, v) for v in x], t, k, p) for x, t, k, p in cases]
    got = page.evaluate(f"{json.dumps(wire)}.map(([x, t, k, p]) => window.numformerExplorer.nextTokenProbabilities("
                        f"x.map((v) => v === null ? -Infinity : v === 'inf' ? Infinity : v), t, k, p))")
    for (x, t, k, p), shown in zip(cases, got):
        expected = next_token_probabilities(np.array(x), t, k, p)
        assert np.abs(np.array(shown) - expected).max() <= 1e-12, (x[:6], t, k, p)
    no_problems(page)


def test_the_logit_lens_and_stepping_through_the_generated_tokens(browser, static_page, loaded):
    model, tokenizer = loaded
    path, ids, n_prompt = static_page
    page = open_page(browser, path.as_uri())
    top, probs = A.logit_lens(model, ids).top(5)
    rows = page.evaluate("""[...document.querySelectorAll('#lens .lens-row')].map((r) =>
        [...r.querySelectorAll('.lens-cell')].map((c) => [+c.dataset.id, +c.dataset.prob]))""")
    t = n_prompt - 1                                  # the last shown token is selected
    assert len(rows) == model.n_layers + 1
    assert [[c[0] for c in row] for row in rows] == top[:, 0, t].tolist()
    assert np.abs(np.array([[c[1] for c in row] for row in rows]) - probs[:, 0, t]).max() <= 1e-5
    for step in range(1, NEW + 1):
        page.click("#next")
        assert page.evaluate(SHOWN_TOKENS) == [visible(tokenizer.decode([i])) for i in ids[:n_prompt + step]]
    assert page.evaluate("document.querySelectorAll('.token.generated').length") == NEW
    assert page.evaluate("document.getElementById('next').disabled") is True
    page.click("#back")
    assert len(page.evaluate(SHOWN_TOKENS)) == n_prompt + NEW - 1
    assert page.evaluate("document.querySelector('.token.selected').dataset.position") == str(n_prompt + NEW - 2)
    no_problems(page)


def test_the_served_page_steps_and_analyses_new_prompts(browser, explorer_server, loaded, tmp_path):
    model, tokenizer = loaded
    page = open_page(browser, explorer_server.url)
    assert page.evaluate(SHOWN_TOKENS) == [visible(c) for c in PROMPT]
    page.click('#tokens .token[data-position="2"]')
    assert len(page.evaluate(GRID)) == 4
    page.click("#greedy")
    page.click("#next")
    wait_until(page, f"document.querySelectorAll('#tokens .token').length === {len(PROMPT) + 1}")
    ids = tokenizer.encode(PROMPT)
    greedy = int(np.argmax(model(np.array(ids)[None])[0, -1]))
    assert page.evaluate(SHOWN_TOKENS)[-1] == visible(tokenizer.decode([greedy]))
    page.click("#prompt")
    page.evaluate("document.getElementById('prompt').select()")
    page.send("Input.insertText", {"text": "First Citizen:"})      # typed, as a keyboard would
    page.click("#analyse")
    wait_until(page, "document.querySelectorAll('#tokens .token').length === 14")
    assert page.evaluate(SHOWN_TOKENS) == [visible(c) for c in "First Citizen:"]
    assert page.evaluate("document.getElementById('status').textContent") == ""
    page.screenshot(tmp_path / "served.png")
    assert (tmp_path / "served.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    no_problems(page)


def test_a_bad_prompt_is_shown_on_the_page_not_thrown(browser, explorer_server):
    page = open_page(browser, explorer_server.url)
    page.click("#prompt")
    page.evaluate("document.getElementById('prompt').value = '\u00e9'")
    page.click("#analyse")
    wait_until(page, "document.getElementById('status').classList.contains('error')")
    assert "not in the vocabulary" in page.evaluate("document.getElementById('status').textContent")
    problems = page.problems()           # the server's 400 reply is a failed resource for chromium, nothing else
    assert all("status of 400" in p for p in problems) and len(problems) <= 1, problems


def test_a_page_without_logits_asks_the_server_for_them(browser, explorer_server, loaded, monkeypatch):
    """Large vocabularies: an analysis leaves the logits out and the page fetches one position's at a time."""
    from numformer.explorer import data

    model, tokenizer = loaded
    monkeypatch.setattr(data, "INLINE_LOGITS", 0)
    page = open_page(browser, explorer_server.url)
    page.evaluate("document.getElementById('prompt').value = 'First Citizen:'")
    page.click("#analyse")
    wait_until(page, "document.querySelectorAll('#tokens .token').length === 14")
    assert page.evaluate("window.numformerExplorer.state.analysis.logits") is None
    page.click('#tokens .token[data-position="6"]')
    set_control(page, "temperature", 0.6)
    wait_until(page, "(window.numformerExplorer.shownFor || {}).position === 6")
    logits, _ = model.run_with_cache(np.array(tokenizer.encode("First C"))[None])
    shown_matches_numformer(page, logits[0, -1], 0.6, None, None)
    assert any(url.endswith("/api/logits") for url in page.requested_urls())
    no_problems(page)
