// numformer explorer: draws what numformer computed (numformer/explorer/data.py) and applies the sampler's
// filters to the logits exactly as numformer.sampling does. No library, no network in a static page; a
// server page (numformer explore SOURCE) asks its server's JSON API for new analyses.
"use strict";

// -- numformer.sampling, line for line (temperature, then top-k, then top-p, in float64) -----------------------
const TOP_P_TOL = 1e-12;          // sampling.TOP_P_TOL

function minusMax(x) {            // sampling._minus_max: z - max z; +inf logits certain, an all -inf row stays
  let m = -Infinity;
  for (const v of x) if (v > m) m = v;
  if (m === Infinity) return x.map((v) => (v === Infinity ? 0 : -Infinity));
  const shift = Number.isFinite(m) ? m : 0;
  return x.map((v) => v - shift);
}

function softmax64(x) {           // sampling._softmax64: exp(z - max z) / sum; an all -inf row gives zeros
  const e = minusMax(x).map(Math.exp);
  let s = 0;
  for (const v of e) s += v;
  return e.map((v) => v / (s > 0 ? s : 1));
}

function orderDescending(x) {     // np.argsort(-x, kind="stable"): ties keep the lower index first
  return x.map((_, i) => i).sort((a, b) => (x[b] - x[a]) || (a - b));
}

function topKFilter(x, k) {       // sampling.top_k_filter: ties with the k-th largest are kept
  const V = x.length;
  k = Math.min(Math.max(k, 1), V);
  const kth = x.slice().sort((a, b) => b - a)[k - 1];
  return x.map((v) => (v < kth ? -Infinity : v));
}

function topPFilter(x, p) {       // sampling.top_p_filter
  if (p === null || p === 1) return x.slice();
  const order = orderDescending(x);
  const sorted = order.map((i) => x[i]);
  const probs = softmax64(sorted);
  let cumBefore = 0, nKeep = 0;   // token i is removed when the tokens before it hold >= p
  for (let i = 0; i < probs.length; i++) {
    if (i < 1 || !(cumBefore >= p - TOP_P_TOL)) nKeep++;
    cumBefore += probs[i];
  }
  const threshold = sorted[nKeep - 1];      // the smallest kept logit: tokens tied with it stay
  return x.map((v) => (v < threshold ? -Infinity : v));
}

function topKTopP(x, topK, topP) {     // sampling._top_k_top_p
  if (topK !== null) x = topKFilter(x, topK);
  if (topP !== null) x = topPFilter(x, topP);
  return x;
}

function warpLogits(logits, temperature, topK, topP) {     // sampling.warp_logits
  let x = logits.map(Number);
  if (temperature !== 1) x = x.map((v) => v / temperature);
  return topKTopP(x, topK, topP);
}

function nextTokenProbabilities(logits, temperature, topK, topP) {     // sampling.next_token_probabilities
  // what sample_next draws from; temperature 0 is greedy: all the mass on the argmax (its first index)
  if (temperature === 0) {
    let best = 0;
    logits.forEach((v, i) => { if (v > logits[best]) best = i; });
    return logits.map((_, i) => (i === best ? 1 : 0));
  }
  // (z - max z) / T: the same distribution as z / T without overflow, however small T (sampling._scaled_logits)
  return softmax64(topKTopP(minusMax(logits.map(Number)).map((v) => v / temperature), topK, topP));
}

// -- the page -------------------------------------------------------------------------------------------------
const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
const FORMAT = 1;
const $ = (id) => document.getElementById(id);
const state = {analysis: DATA.analysis, shown: 0, selected: 0, logits: {}, busy: false};

function visible(text) {          // whitespace drawn so that a token of spaces or a newline can be seen
  return text.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/ /g, "\u2423");
}

function tokenText(id) {
  const text = state.analysis.vocab[String(id)];
  return text === undefined ? "#" + id : text;
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setStatus(text, error) {
  $("status").textContent = text || "";
  $("status").classList.toggle("error", Boolean(error));
}

function controls() {             // the sampler's arguments the controls hold (null: that filter is off)
  const k = Number($("top-k").value), p = Number($("top-p").value);
  return {temperature: Number($("temperature").value), top_k: k > 0 ? k : null, top_p: p < 1 ? p : null};
}

function showControls() {
  const c = controls();
  $("temperature-value").textContent = c.temperature === 0 ? "0 (greedy)" : c.temperature.toFixed(2);
  $("top-k-value").textContent = c.top_k === null ? "off" : String(c.top_k);
  $("top-p-value").textContent = c.top_p === null ? "off" : c.top_p.toFixed(2);
}

function renderSummary() {
  const m = DATA.model;
  const heads = m.heads.every((h) => h === m.heads[0]) ? m.heads[0] + " heads" : "heads " + m.heads.join("/");
  $("model-summary").textContent = `${m.source}: a GPT of ${m.n_layers} layers, ${heads}, ` +
    `vocabulary ${m.vocab_size}, context ${m.block_size}, ${m.parameters.toLocaleString("en")} parameters`;
}

function renderTokens() {
  const box = $("tokens");
  box.replaceChildren();
  const a = state.analysis;
  for (let t = 0; t < state.shown; t++) {
    const span = el("span", "token", visible(a.tokens[t]));
    span.dataset.position = String(t);
    span.title = `position ${t}, id ${a.ids[t]}`;
    if (t >= DATA.n_prompt) span.classList.add("generated");
    if (t === state.selected) span.classList.add("selected");
    span.addEventListener("click", () => select(t));
    box.appendChild(span);
    if (a.tokens[t].endsWith("\n")) box.appendChild(el("span", "token-break"));
  }
  $("back").disabled = state.shown <= 1;
  $("next").disabled = DATA.mode === "static" && state.shown >= a.ids.length;
}

function shadeTokens(weights) {   // hovering a head's cell: each token shaded by the head's weight on it
  document.querySelectorAll("#tokens .token").forEach((node) => {
    const w = weights === null ? null : weights[Number(node.dataset.position)];
    node.style.background = w === null || w === undefined ? "" : `rgba(var(--accent-rgb), ${0.85 * w})`;
    node.style.color = w !== null && w > 0.55 ? "#fff" : "";
  });
}

function renderAttention() {
  const t = state.selected, a = state.analysis, grid = $("attention");
  $("attention-from").textContent = `"${visible(a.tokens[t])}" (position ${t})`;
  const maxHeads = Math.max(...a.attention.map((layer) => layer.length));
  grid.style.gridTemplateColumns = `auto repeat(${maxHeads}, minmax(0, 1fr))`;
  grid.replaceChildren(el("span"));
  for (let h = 0; h < maxHeads; h++) grid.appendChild(el("span", "attn-label", "head " + h));
  a.attention.forEach((layer, l) => {
    grid.appendChild(el("span", "attn-label", "layer " + l));
    for (let h = 0; h < maxHeads; h++) {
      if (h >= layer.length) { grid.appendChild(el("span")); continue; }
      const row = layer[h][t], cell = el("div", "attn-cell");
      cell.dataset.layer = String(l);
      cell.dataset.head = String(h);
      cell.title = `layer ${l}, head ${h}`;
      row.forEach((w, j) => {
        const bar = el("div", "attn-bar");
        bar.dataset.key = String(j);
        bar.dataset.value = String(w);
        bar.title = `"${visible(a.tokens[j])}" (position ${j}): ${w.toFixed(4)}`;
        bar.style.background = `rgba(var(--accent-rgb), ${w})`;
        bar.style.flexBasis = `${100 / state.shown}%`;        // one width per position: rows line up
        cell.appendChild(bar);
      });
      cell.addEventListener("mouseenter", () => shadeTokens(row));
      cell.addEventListener("mouseleave", () => shadeTokens(null));
      grid.appendChild(cell);
    }
  });
}

function actualNext() {           // the token that follows the selected one, once it is shown
  const t = state.selected;
  return t + 1 < state.shown ? state.analysis.ids[t + 1] : null;
}

async function logitsAt(t) {      // the analysis carries the logits, or the server sends one position's
  const a = state.analysis;
  const key = a.ids.slice(0, t + 1).join(",");
  if (!(key in state.logits)) {
    const row = a.logits ? a.logits[t] : (await api("api/logits", {ids: a.ids, position: t})).logits;
    // the decimals of a float32 logit name it; Math.fround gives back the model's value exactly
    state.logits[key] = a.logits_dtype === "float32" ? row.map(Math.fround) : row;
  }
  return state.logits[key];
}

async function renderNext() {
  const t = state.selected, list = $("next-tokens");
  const logits = await logitsAt(t);
  if (t !== state.selected) return;                       // another token was clicked meanwhile
  const c = controls();
  const probs = nextTokenProbabilities(logits, c.temperature, c.top_k, c.top_p);
  const kept = probs.filter((p) => p > 0).length;
  $("kept").textContent = `(${kept} of ${probs.length} tokens possible)`;
  const order = orderDescending(probs).slice(0, 20).filter((i) => probs[i] > 0);
  const top = order.length ? probs[order[0]] : 1;
  const actual = actualNext();
  list.replaceChildren();
  for (const i of order) {
    const row = el("li", "prob-row" + (i === actual ? " actual" : ""));
    row.dataset.id = String(i);
    row.dataset.prob = String(probs[i]);
    row.append(el("span", "tok", visible(tokenText(i))), el("span"), el("span", "num", probs[i].toFixed(4)));
    row.children[1].appendChild(el("div", "bar")).style.width = (100 * probs[i] / top).toFixed(2) + "%";
    list.appendChild(row);
  }
  Object.assign(window.numformerExplorer, {probabilities: probs, shownFor: {position: t, ...c}});
}

function renderLens() {
  const t = state.selected, a = state.analysis, lens = a.lens, table = $("lens");
  const actual = actualNext();
  table.replaceChildren();
  const head = el("tr");
  head.append(el("th", "", "stage"));
  for (let k = 0; k < lens.ids[0][t].length; k++) head.append(el("th", "", "top " + (k + 1)));
  if (actual !== null) head.append(el("th", "", `p("${visible(tokenText(actual))}")`));
  table.appendChild(head);
  lens.stages.forEach((stage, s) => {
    const row = el("tr", "lens-row");
    row.dataset.stage = String(s);
    row.appendChild(el("th", "", stage));
    lens.ids[s][t].forEach((id, k) => {
      const p = lens.probs[s][t][k], cell = el("td", "lens-cell" + (id === actual ? " actual" : ""));
      cell.dataset.id = String(id);
      cell.dataset.prob = String(p);
      cell.style.background = `rgba(var(--accent-rgb), ${0.45 * p})`;
      cell.append(el("span", "tok", visible(tokenText(id))), el("span", "num", p.toFixed(3)));
      row.appendChild(cell);
    });
    if (actual !== null) row.appendChild(el("td", "lens-actual", lens.actual[s][t].toFixed(3)));
    table.appendChild(row);
  });
}

async function renderAll() {
  renderTokens();
  renderAttention();
  renderLens();
  await renderNext();
}

function run(task) {              // one action at a time; failures go to the status line, not the console
  if (state.busy) return Promise.resolve();
  state.busy = true;
  document.body.classList.add("busy");
  return Promise.resolve().then(task).catch(fail)
    .finally(() => { state.busy = false; document.body.classList.remove("busy"); });
}

function fail(e) {
  setStatus(String(e.message || e), true);
}

function select(t) {              // not queued behind run(): a click always wins, renderNext drops stale work
  state.selected = t;
  return renderAll().catch(fail);
}

async function api(path, body) {
  const response = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                      body: JSON.stringify(body)});
  const reply = await response.json();
  if (!response.ok) throw new Error(reply.error || response.statusText);
  return reply;
}

function show(analysis, shown) {
  state.analysis = analysis;
  state.shown = shown;
  state.selected = shown - 1;
  state.logits = {};
  return renderAll();
}

function analyse() {
  return run(async () => {
    setStatus("analysing...");
    const analysis = await api("api/analyze", {text: $("prompt").value});
    DATA.n_prompt = analysis.ids.length;
    await show(analysis, analysis.ids.length);
    setStatus("");
  });
}

function step(delta) {
  return run(async () => {
    const a = state.analysis;
    if (delta < 0) state.shown = Math.max(1, state.shown - 1);
    else if (state.shown < a.ids.length) state.shown += 1;
    else if (DATA.mode === "server") {
      setStatus("generating...");
      const c = controls();
      const reply = await api("api/step", {ids: a.ids, greedy: $("greedy").checked, ...c});
      await show(reply.analysis, reply.analysis.ids.length);
      setStatus(`sampled "${visible(tokenText(reply.token))}"`);
      return;
    }
    state.selected = state.shown - 1;
    await renderAll();
  });
}

function setUp() {
  document.body.classList.add(DATA.mode);
  renderSummary();
  const s = DATA.sampling, topK = $("top-k");
  topK.max = String(Math.max(Math.min(DATA.model.vocab_size, 100), s.top_k || 0));
  $("temperature").value = String(s.temperature);
  topK.value = String(s.top_k || 0);
  $("top-p").value = String(s.top_p === null ? 1 : s.top_p);
  for (const id of ["temperature", "top-k", "top-p"]) {
    $(id).addEventListener("input", () => { showControls(); renderNext().catch(fail); });
  }
  showControls();
  $("next").addEventListener("click", () => step(1));
  $("back").addEventListener("click", () => step(-1));
  $("analyse").addEventListener("click", analyse);
  if (DATA.format !== FORMAT) {
    setStatus(`this page's data has format ${DATA.format}; this page reads format ${FORMAT}`, true);
    return Promise.resolve();
  }
  if (state.analysis === null) {
    setStatus("type a prompt and press Analyse");
    return Promise.resolve();
  }
  if (DATA.mode === "server") $("prompt").value = state.analysis.tokens.slice(0, DATA.n_prompt).join("");
  return show(state.analysis, DATA.n_prompt);
}

// what the tests read: the filters, the state, the distribution shown (and for which position and controls)
window.numformerExplorer = {nextTokenProbabilities, warpLogits, state, probabilities: null, shownFor: null,
                            ready: null};
window.numformerExplorer.ready = run(setUp);
