// The playground page: reads the controls, streams the model's continuation, draws the attention
// of the chosen layer and head. The model itself is playground.js (window.Playground).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const modelUrl = new URL("models/shakespeare-baby/", document.currentScript.src);
  // What the page holds, readable from the console (and by tests/test_playground.py).
  const state = (window.playground = { model: null, tokenizer: null, running: false, stop: false, runs: 0 });

  function show(message) { $("pg-message").textContent = message; }
  function status(text) { $("pg-status").textContent = text; }

  // The settings, or {error} with a sentence for the reader; the bounds are sample_next's.
  function readSettings() {
    const { block_size } = state.model.config;
    const prompt = $("pg-prompt").value, n = Array.from(prompt).length;
    if (n === 0) return { error: "Type a prompt first: the model continues a text, so it needs at least one character." };
    if (n > block_size) {
      return { error: `The prompt has ${n} characters, but the model reads at most ${block_size} (its context, ` +
        `block_size): shorten it by ${n - block_size}.` };
    }
    let ids;
    try { ids = state.tokenizer.encode(prompt); } catch (err) {
      if (err instanceof RangeError) return { error: err.message };
      throw err;
    }
    const num = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));
    const temperature = num("pg-temperature"), topK = num("pg-top-k"), topP = num("pg-top-p");
    const seed = num("pg-seed"), maxNewTokens = num("pg-tokens");
    if (temperature === null || !(temperature >= 0)) return { error: "Temperature must be a number ≥ 0 (0 is greedy decoding)." };
    if (topK !== null && !(Number.isInteger(topK) && topK >= 1)) return { error: "Top-k must be a whole number ≥ 1, or empty for no top-k." };
    if (topP !== null && !(topP > 0 && topP <= 1)) return { error: "Top-p must be in (0, 1], or empty for no top-p." };
    if (seed === null || !(Number.isInteger(seed) && seed >= 0 && seed < 2 ** 32)) return { error: "The seed must be a whole number from 0 to 4294967295." };
    if (maxNewTokens === null || !(Number.isInteger(maxNewTokens) && maxNewTokens >= 1 && maxNewTokens <= 2000)) {
      return { error: "The number of new characters must be a whole number from 1 to 2000." };
    }
    return { ids, temperature, topK, topP, seed, maxNewTokens };
  }

  const nextFrame = () => new Promise((resolve) => requestAnimationFrame(resolve));

  async function run() {
    const s = readSettings();
    if (s.error) { show(s.error); return; }
    show("");
    Object.assign(state, { running: true, stop: false, done: false, ttftMs: null, ids: s.ids.slice() });
    $("pg-run").disabled = true; $("pg-stop").disabled = false;
    const out = $("pg-output"), gen = document.createElement("span");
    out.textContent = state.tokenizer.decode(s.ids);
    gen.className = "pg-gen";
    out.append(gen);
    const t0 = performance.now();
    let lastPaint = t0;
    for (const step of Playground.generate(state.model, s.ids, s)) {
      if (state.ttftMs === null) state.ttftMs = performance.now() - t0;
      state.ids.push(step.id);
      state.cache = step.cache;
      gen.textContent += state.tokenizer.chars[step.id];
      if (performance.now() - lastPaint > 30 || state.ids.length === s.ids.length + 1) {
        drawAttention();
        await nextFrame();  // let the page show the text so far
        lastPaint = performance.now();
      }
      if (state.stop) break;
    }
    const secs = (performance.now() - t0) / 1000, made = state.ids.length - s.ids.length;
    status(`${made} characters in ${secs.toFixed(2)} s (${(made / secs).toFixed(0)} per second); ` +
      `the first after ${state.ttftMs.toFixed(0)} ms.`);
    drawAttention();
    Object.assign(state, { running: false, done: true, text: gen.textContent, runs: state.runs + 1 });
    $("pg-run").disabled = false; $("pg-stop").disabled = true;
  }

  // The attention rows of layer l, head h over the tokens the model read last (its window), one row
  // per query, each over keys 0..query: the matrix the heat map shows.
  state.attention = function (l, h) {
    const c = state.cache;
    return { ids: state.ids.slice(c.start, c.start + c.length), rows: c.attn[l][h].slice(0, c.length).map((r) => Array.from(r)) };
  };

  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function viridis(p) {
    const x = Math.min(Math.max(p, 0), 1) * (VIRIDIS.length - 1), i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i;
    return `rgb(${VIRIDIS[i].map((a, k) => Math.round(a + f * (VIRIDIS[i + 1][k] - a))).join(",")})`;
  }
  const glyph = (c) => ({ "\n": "↵", " ": "␣" }[c] || c);

  function drawAttention() {
    if (!state.cache) return;
    const l = Number($("pg-layer").value), h = Number($("pg-head").value);
    const { ids, rows } = state.attention(l, h), n = ids.length, chars = ids.map((i) => glyph(state.tokenizer.chars[i]));
    const canvas = $("pg-attention"), size = 384, pad = 28, cell = size / n, dpr = window.devicePixelRatio || 1;
    canvas.width = (size + pad + 8) * dpr; canvas.height = (size + pad + 8) * dpr;
    canvas.style.width = `${size + pad + 8}px`;
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.fillStyle = getComputedStyle(canvas).color;
    g.font = `${Math.min(12, Math.max(7, cell))}px monospace`;
    g.textAlign = "center"; g.textBaseline = "middle";
    const every = Math.ceil(9 / cell);  // label every position only when the cells are wide enough
    for (let i = 0; i < n; i += every) {
      g.fillText(chars[i], pad + (i + 0.5) * cell, pad / 2);    // keys along the top
      g.fillText(chars[i], pad / 2, pad + (i + 0.5) * cell);    // queries down the side
    }
    rows.forEach((row, q) => row.forEach((p, k) => {
      g.fillStyle = viridis(p);
      g.fillRect(pad + k * cell, pad + q * cell, Math.ceil(cell), Math.ceil(cell));
    }));
    g.strokeStyle = g.fillStyle = getComputedStyle(canvas).color;
    g.strokeRect(pad, pad, size, size);
    Object.assign(canvas.dataset, { n, pad, cell });
    $("pg-attention-title").textContent = `Layer ${l + 1}, head ${h + 1}: how much each query (row) reads ` +
      `each key (column) of the last ${n} characters; above the diagonal is masked.`;
  }

  function hover(event) {
    const canvas = $("pg-attention"), { n, pad, cell } = canvas.dataset;
    if (!n) return;
    const r = canvas.getBoundingClientRect();
    const k = Math.floor((event.clientX - r.left - pad) / cell), q = Math.floor((event.clientY - r.top - pad) / cell);
    if (q < 0 || k < 0 || q >= n || k >= n) return;
    const { ids, rows } = state.attention(Number($("pg-layer").value), Number($("pg-head").value));
    const ch = (i) => JSON.stringify(state.tokenizer.chars[ids[i]]);
    $("pg-hover").textContent = k > q ? `key ${ch(k)} is after query ${ch(q)}: masked`
      : `query ${ch(q)} (position ${q + 1}) gives key ${ch(k)} (position ${k + 1}) weight ${rows[q][k].toFixed(3)}`;
  }

  async function start() {
    status("Loading the model…");
    const t0 = performance.now();
    try {
      Object.assign(state, await Playground.loadModel(modelUrl));
    } catch (err) {
      show(`The model could not be loaded from ${modelUrl}: ${err.message}` + (location.protocol === "file:"
        ? ". Browsers do not let a page opened from a file fetch other files: serve the site over HTTP, " +
          "e.g. python -m http.server --directory _build/html" : ""));
      throw err;
    }
    state.loadMs = performance.now() - t0;
    const { n_layer, n_head, n_embd, block_size, vocab_size } = state.model.config, p = state.provenance;
    for (const [id, count] of [["pg-layer", n_layer], ["pg-head", n_head]]) {
      $(id).replaceChildren(...Array.from({ length: count }, (_, i) => new Option(String(i + 1), String(i))));
      $(id).addEventListener("change", drawAttention);
    }
    $("pg-model").textContent = `${state.model.nParams.toLocaleString("en")} parameters (` +
      `${p.parameters.toLocaleString("en")} without the position embeddings, as num_params() counts): ${n_layer} layers, ` +
      `${n_head} heads, width ${n_embd}, a context of ${block_size} characters from a vocabulary of ${vocab_size}; ` +
      `trained for ${p.steps} steps (${Math.round(p.training_seconds / 60)} minutes on a CPU), validation loss ` +
      `${p.whole_validation_loss.toFixed(3)} nats per character.`;
    $("pg-context").textContent = String(block_size);
    status(`Model loaded (${(state.bytes / 1e6).toFixed(1)} MB) in ${state.loadMs.toFixed(0)} ms.`);
    $("pg-run").disabled = false;
    $("pg-run").addEventListener("click", () => { state.finished = run(); });
    $("pg-stop").addEventListener("click", () => { state.stop = true; });
    $("pg-attention").addEventListener("mousemove", hover);
    state.ready = true;
  }
  state.loaded = start();
})();
