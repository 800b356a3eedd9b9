"""The website's playground (book/playground.md, book/_static/playground.js) in a real browser.

The built page is served from ``_build/html`` by a local HTTP server and driven in headless Chromium
by Selenium. What the page computes in JavaScript is checked against the library: the logits within
a tolerance derived from float32 rounding (:func:`rounding_model`), greedy decoding exactly, the sampling
distribution of ``sample_next``, the attention of ``transformer_lib.interpret.trace``, and the
messages for bad input. Without Chromium, its driver, Selenium or the built site the tests skip and
say why; with ``TRANSFORMER_LIB_REQUIRE_BROWSER=1`` (set by ``.ci/run``) they fail instead.
"""

import copy
import functools
import http.server
import math
import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
PAGE = "book/playground.html"
U = 2.0**-24  # float32's unit roundoff
REQUIRED = os.environ.get("TRANSFORMER_LIB_REQUIRE_BROWSER") == "1"

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def _missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -r requirements.txt)"
    if not (shutil.which("chromium") or shutil.which("chromium-browser")) or not shutil.which("chromedriver"):
        return "Chromium or its driver is missing (Debian: apt-get install chromium chromium-driver)"
    if not (SITE / PAGE).is_file():
        return f"the website is not built ({SITE / PAGE} is missing): run jupyter-book build . first"
    for name in ("playground.js", "playground-ui.js"):
        if not (SITE / "_static" / name).is_file() or (SITE / "_static" / name).read_bytes() != (ROOT / "book" / "_static" / name).read_bytes():
            return f"the built site's _static/{name} differs from book/_static/{name}: rebuild the website"
    return None


@pytest.fixture(scope="module")
def site():
    """The built website, served on a free port of 127.0.0.1 for the module's tests; yields its base URL."""
    why = _missing()
    if why:
        if REQUIRED:
            pytest.fail(f"TRANSFORMER_LIB_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    # The constructor binds and listens, so requests wait in the backlog until serve_forever runs.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def driver(site):
    """Headless Chromium with the playground loaded (its model too), recording the console."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    browser.set_script_timeout(300)
    try:
        browser.get(site + PAGE)
        loaded = browser.execute_async_script(
            "const done = arguments[0];"
            "window.playground.loaded.then(() => done(null), (e) => done(String(e)));")
        assert loaded is None, f"the page could not load its model: {loaded}"
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def book():
    """The shipped model and its tokenizer, as the library loads them (float32, eval mode)."""
    from transformer_lib.pretrained import load_book_model

    model, tok = load_book_model()
    return model.eval(), tok


# Errors that every page of the website logs, whatever it holds (the API reference too); not the playground's.
SITE_WIDE = {
    # sphinx-thebe 0.3.1 writes its configuration script twice into the head of every page.
    r"Uncaught SyntaxError: Identifier 'THEBE_JS_URL' has already been declared",
    # pydata-sphinx-theme 0.17 under sphinx-book-theme 1.3 starts with an empty theme mode (then uses "auto").
    r"Got invalid theme mode: \. Resetting to auto\.",
}


def console_errors(driver) -> list[str]:
    """The console's errors since the last call (reading the log empties it), less the site-wide ones."""
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    return [m for m in errors if not any(re.search(pattern, m) for pattern in SITE_WIDE)]


def run_page(driver, prompt: str, *, temperature="0", top_k="", top_p="", seed="0", chars="100") -> dict:
    """Fill in the page's controls, press Generate as a reader would, and wait for the run to end."""
    from selenium.webdriver.common.by import By

    driver.execute_script(
        "const [p, t, k, tp, s, n] = arguments;"
        "const set = (id, v) => { document.getElementById(id).value = v; };"
        "set('pg-prompt', p); set('pg-temperature', t); set('pg-top-k', k); set('pg-top-p', tp);"
        "set('pg-seed', s); set('pg-tokens', n); window.playground.finished = null;",
        prompt, temperature, top_k, top_p, seed, chars)
    driver.find_element(By.ID, "pg-run").click()
    return driver.execute_async_script(
        "const done = arguments[0], s = window.playground;"
        "Promise.resolve(s.finished).then(() => done({"
        "  message: document.getElementById('pg-message').textContent,"
        "  output: document.getElementById('pg-output').textContent,"
        "  text: s.done ? s.text : null, ttftMs: s.ttftMs, runs: s.runs}));")


def page_logits(driver, prompt: str) -> torch.Tensor:
    """The page's logits (T, V) at every position of ``prompt``, one token at a time through its KV cache."""
    rows = driver.execute_script(
        "const { model, tokenizer } = window.playground, cache = model.newCache();"
        "return tokenizer.encode(arguments[0]).map((id) => Array.from(model.step(id, cache)));", prompt)
    return torch.tensor(rows, dtype=torch.float64)


# ---- the tolerance: float32 rounding, propagated through the model -------------------------------------
#
# A float32 operation rounds its result v with a relative error of at most u = 2^-24 (an addition, a
# product: u|v|), a sum or dot product of n terms is within gamma_n = n u / (1 - n u) times the sum of
# its |terms| (in any order of summation: PyTorch's blocked kernels and the page's loops alike), and
# exp and erf are accurate to 2u. The weights are exact on both sides (the same float32 numbers).
# A worst-case bound that pushes every rounding the same way through every layer's |W| is useless
# here (it grows past 1e10 over four blocks: it ignores that errors in different directions
# cancel), so the errors are propagated as what they are to first order, a sum of many independent
# roundings: `rounding_model` runs the model in float64 with every rounding site replaced by a
# random error uniform within its worst-case bound above (its full bound, not the typical sqrt(n) u),
# and measures the spread of each output over `SAMPLES` runs. The tolerance of one float32 side is
# Z standard deviations of that spread, the estimate inflated by its sampling error at three
# standard errors (1 + 3 / sqrt(2 SAMPLES)); the page and PyTorch, two float32 sides, may then
# differ by twice that. With Z = 6 a correct page fails an element with probability below 1e-8.

SAMPLES, Z = 16, 6.0


def _gamma(n):
    """gamma_n = n u / (1 - n u): the relative error bound of a float32 sum or dot product of n terms."""
    return n * U / (1 - n * U)


def _forward(model, ids: list[int], rounding):
    """The model's forward pass in float64, batched over a leading axis of size K, with ``rounding(v, bound)``
    applied at every place a float32 computation rounds: ``v`` and the worst-case size of that rounding."""
    c = model.config
    assert (c.position, c.activation, c.bias, c.qk_norm, c.logit_softcap) == ("learned", "gelu", False, False, 0.0)
    W = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    T, C, H = len(ids), c.n_embd, c.n_head
    d = C // H
    causal = np.tril(np.ones((T, T), dtype=bool))
    keys = causal.sum(-1, keepdims=True)  # query t reads t + 1 keys

    def linear(x, w):  # x @ w.T, a dot product of w.shape[1] terms
        return rounding(x @ w.T, _gamma(w.shape[1]) * (np.abs(x) @ np.abs(w).T))

    def add(a, b):
        return rounding(a + b, U * np.abs(a + b))

    def layer_norm(x, w):  # mean, deviations, biased variance, 1 / sqrt(var + eps), two products
        n = x.shape[-1]
        mu = rounding(x.mean(-1, keepdims=True), _gamma(n) * np.abs(x).mean(-1, keepdims=True))
        dev = rounding(x - mu, U * np.abs(x - mu))
        var = rounding((dev * dev).mean(-1, keepdims=True), _gamma(n + 1) * (dev * dev).mean(-1, keepdims=True))
        r = 1 / np.sqrt(var + c.layer_norm_eps)
        r = rounding(r, 3 * U * r)  # + eps, sqrt, reciprocal
        y = rounding(dev * r, U * np.abs(dev * r))
        return rounding(y * w, U * np.abs(y * w))

    x = rounding(np.broadcast_to(W["wte.weight"][ids] + W["wpe.weight"][:T], (1, T, C)),
                 U * np.abs(W["wte.weight"][ids] + W["wpe.weight"][:T]))
    attn = []
    for i in range(c.n_layer):
        p = f"blocks.{i}."
        qkv = linear(layer_norm(x, W[p + "ln1.weight"]), W[p + "attn.in_proj.weight"])
        q, k, v = qkv.reshape(-1, T, 3, H, d).transpose(2, 0, 3, 1, 4)  # (K, H, T, d) each
        s = q @ k.swapaxes(-1, -2) / math.sqrt(d)
        s = rounding(s, (_gamma(d) + U) * (np.abs(q) @ np.abs(k).swapaxes(-1, -2)) / math.sqrt(d))
        z = np.where(causal, s - np.max(s, -1, keepdims=True, where=causal, initial=-np.inf), -np.inf)
        z = rounding(z, np.where(causal, U * np.abs(np.where(causal, z, 0)), 0))
        e = rounding(np.exp(z), 2 * U * np.exp(z))
        tot = rounding(e.sum(-1, keepdims=True), _gamma(keys) * e.sum(-1, keepdims=True))
        pr = rounding(e / tot, U * e / tot)
        attn.append(pr)
        o = rounding(pr @ v, _gamma(keys) * (pr @ np.abs(v)))
        x = add(x, linear(o.transpose(0, 2, 1, 3).reshape(-1, T, C), W[p + "attn.out_proj.weight"]))
        f = linear(layer_norm(x, W[p + "ln2.weight"]), W[p + "mlp.fc1.weight"])
        g = 0.5 * f * (1 + torch.erf(torch.from_numpy(f / math.sqrt(2))).numpy())
        g = rounding(g, 3 * U * np.abs(f) + 2 * U * np.abs(g))  # x / sqrt 2, erf, 1 + erf, two products
        x = add(x, linear(g, W[p + "mlp.fc2.weight"]))
    logits = linear(layer_norm(x, W["ln_f.weight"]), W["wte.weight"])  # the tied output layer
    return logits, np.stack(attn, axis=1)  # (K, T, V), (K, L, H, T, T)


def rounding_model(model, ids: list[int]) -> dict:
    """The exact (float64) logits (T, V) and attention (L, H, T, T) of ``model`` on ``ids``, and the
    tolerance of one float32 computation of each (the model of the comment above)."""
    logits, attn = _forward(model, ids, lambda v, bound: v)
    rng = np.random.default_rng(0)
    noisy = _forward(model, ids, lambda v, bound: v + bound * rng.uniform(-1, 1, (SAMPLES,) + np.shape(v)[1:]))
    factor = Z * (1 + 3 / math.sqrt(2 * SAMPLES))
    rms = lambda a, b: np.sqrt(((a - b) ** 2).mean(0))  # noqa: E731
    return {"logits": logits[0], "tol_logits": factor * rms(noisy[0], logits),
            "attn": attn[0], "tol_attn": factor * rms(noisy[1], attn)}


PROMPTS = [
    "ROMEO:\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "KING RICHARD III:\nNow is the winter of our discontent made glori",  # the whole context
]
assert len(PROMPTS[2]) == 64


def test_rounding_model_is_the_model_and_covers_torch(book):
    """The float64 forward pass of rounding_model is the library's model, and PyTorch's own float32
    logits and attention are within one side's tolerance of it: the check of the tolerance itself."""
    from transformer_lib.interpret import trace

    model, tok = book
    ids = tok.encode(PROMPTS[2])
    ref = rounding_model(model, ids)
    with torch.no_grad():
        f64 = copy.deepcopy(model).double()(torch.tensor([ids]))[0][0].numpy()
    assert np.abs(ref["logits"] - f64).max() < 1e-10
    tr = trace(model, torch.tensor([ids]))
    err = np.abs(tr.logits[0].double().numpy() - ref["logits"])
    assert (err <= ref["tol_logits"]).all()
    assert (np.abs(tr.attn[:, 0].double().numpy() - ref["attn"]) <= ref["tol_attn"]).all()
    print(f"PyTorch float32 - float64: max {err.max():.3g} against a tolerance up to {ref['tol_logits'].max():.3g}")


def test_page_logits_match_torch_within_the_derived_tolerance(driver, book):
    """The page's logits at every position of three prompts (the last fills the context), computed one
    token at a time through its KV cache, against PyTorch's forward pass on the whole prompt."""
    model, tok = book
    worst = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        ours = page_logits(driver, prompt).numpy()
        with torch.no_grad():
            torch_logits = model(torch.tensor([ids]))[0][0].double().numpy()
        ref = rounding_model(model, ids)
        diff = np.abs(ours - torch_logits)
        assert (diff <= 2 * ref["tol_logits"]).all(), f"{prompt!r}: max |page - torch| = {diff.max():.3g}"
        assert (np.abs(ours - ref["logits"]) <= ref["tol_logits"]).all()  # and the page alone is within one side's
        worst.append((diff.max(), 2 * ref["tol_logits"].min(), 2 * ref["tol_logits"].max(), np.abs(torch_logits).max()))
    diff, low, high, size = (max(w[i] for w in worst) if i != 1 else min(w[i] for w in worst) for i in range(4))
    print(f"max |page - torch| logit = {diff:.3g}; derived tolerance {low:.3g} to {high:.3g} per logit "
          f"(logits up to {size:.3g})")
    assert console_errors(driver) == []


def test_greedy_text_is_the_librarys(driver, book):
    """Temperature 0 through the page's controls gives generate(temperature=0)'s characters, past the
    64-character context (where both rebuild the cache from the last 64)."""
    model, tok = book
    prompt, n = "ROMEO:\n", 100
    ids = torch.tensor([tok.encode(prompt)])
    page = run_page(driver, prompt, temperature="0", chars=str(n))
    assert page["message"] == ""
    expected = tok.decode(model.generate(ids, n, temperature=0)[0, ids.size(1):].tolist())
    if page["text"] != expected:  # say whether the first difference is a near tie, within rounding
        i = next(i for i, (a, b) in enumerate(zip(page["text"], expected)) if a != b)
        seq = tok.encode(prompt + expected[:i])[-model.config.block_size:]
        ref = rounding_model(model, seq)
        top2 = np.sort(ref["logits"][-1])[-2:]
        pytest.fail(f"character {i}: page {page['text'][i]!r}, library {expected[i]!r}; the two best logits differ "
                    f"by {top2[1] - top2[0]:.3g}, twice the tolerance is {2 * ref['tol_logits'][-1].max():.3g}")
    assert page["output"] == prompt + expected
    assert console_errors(driver) == []


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, None, None), (0.7, 5, None), (1.3, None, 0.9), (0.8, 20, 0.5), (2.0, 3, 0.99), (1e-3, None, None),
])
def test_sampling_distribution_is_sample_nexts(driver, book, temperature, top_k, top_p):
    """The distribution the page draws from is sample_next's: shift, temperature, top-k, top-p, softmax."""
    from transformer_lib.generation import top_k_filter, top_p_filter

    model, tok = book
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode(PROMPTS[1])]))[0][0, -8:]  # (8, V) float32
    filtered, ours = driver.execute_script(
        "const [rows, t, k, p] = arguments, opts = {temperature: t, topK: k, topP: p};"
        "return [rows.map((r) => Playground.filterLogits(Float32Array.from(r), opts).map((v) => v > -Infinity)),"
        "        rows.map((r) => Playground.nextTokenProbs(Float32Array.from(r), opts))];",
        logits.tolist(), temperature, top_k, top_p)
    z = (logits - logits.amax(-1, keepdim=True)) / temperature
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    assert torch.equal(torch.tensor(filtered), z > float("-inf"))  # the same tokens kept
    probs, ours = torch.softmax(z, -1).double(), torch.tensor(ours, dtype=torch.float64)
    # PyTorch's float32 softmax of V terms is within (V + 4) u of each probability (the sum, exp, the
    # division), and below float32's smallest normal number it underflows: the page computes in float64.
    V = logits.size(-1)
    assert (ours - probs).abs().le((V + 4) * U * probs + 2.0**-126).all(), (ours - probs).abs().max()


def test_same_seed_same_text(driver, book):
    model, tok = book
    settings = dict(temperature="0.8", top_k="20", top_p="0.9", chars="50")
    first = run_page(driver, "JULIET:\n", seed="7", **settings)
    again = run_page(driver, "JULIET:\n", seed="7", **settings)
    other = run_page(driver, "JULIET:\n", seed="8", **settings)
    assert first["message"] == "" and len(first["text"]) == 50
    assert again["text"] == first["text"]
    assert other["text"] != first["text"]
    # top_k = 1 keeps the most likely token only, so sampling is greedy whatever the seed.
    ids = torch.tensor([tok.encode("JULIET:\n")])
    greedy = tok.decode(model.generate(ids, 40, temperature=0)[0, ids.size(1):].tolist())
    assert run_page(driver, "JULIET:\n", temperature="1", top_k="1", seed="123", chars="40")["text"] == greedy
    assert console_errors(driver) == []


@pytest.mark.parametrize("prompt, chars", [("To be, or not", 30), ("ROMEO:\n", 100)])
def test_attention_shown_is_traces(driver, book, prompt, chars):
    """The heat map's rows sum to 1 over the visible keys and equal trace's attention on the tokens the
    model read last (the whole text, or after the context is full, its last 64 characters)."""
    from transformer_lib.interpret import trace

    model, tok = book
    run_page(driver, prompt, temperature="0", chars=str(chars))
    L, H = model.config.n_layer, model.config.n_head
    shown = driver.execute_script(
        "const s = window.playground, out = [];"
        "for (let l = 0; l < arguments[0]; l++) for (let h = 0; h < arguments[1]; h++) out.push(s.attention(l, h));"
        "return out;", L, H)
    ids = shown[0]["ids"]
    assert len(ids) == min(len(prompt) + chars - 1, model.config.block_size)
    tr = trace(model, torch.tensor([ids])).attn[:, 0].double().numpy()  # (L, H, T, T)
    ref = rounding_model(model, ids)
    T = len(ids)
    for n, rows in enumerate(shown):
        l, h = divmod(n, H)
        assert [len(r) for r in rows["rows"]] == list(range(1, T + 1))  # row t: keys 0..t, the visible ones
        full = np.zeros((T, T))
        for t, r in enumerate(rows["rows"]):
            full[t, : t + 1] = r
        # each weight is stored in float32 (relative error u) from a float64 softmax: sums within 2u of 1
        assert np.abs(full.sum(-1) - 1).max() <= 2 * U
        assert (np.abs(full - tr[l, h]) <= 2 * ref["tol_attn"][l, h]).all(), f"layer {l}, head {h}"
    assert console_errors(driver) == []


@pytest.mark.parametrize("prompt, expected", [
    ("", "Type a prompt first"),
    ("Hello #1", 'The character "#" (position 7 of the prompt) is not in the model\'s vocabulary'),
    ("Café", 'The character "é" (position 4 of the prompt) is not in the model\'s vocabulary'),
    ("Good night \U0001F319", 'The character "\U0001F319" (position 12 of the prompt)'),
    ("x" * 65, "The prompt has 65 characters, but the model reads at most 64"),
])
def test_bad_prompt_gets_a_message(driver, prompt, expected):
    before = run_page(driver, "ROMEO:\n", chars="5")
    page = run_page(driver, prompt, chars="5")
    assert expected in page["message"]
    assert page["runs"] == before["runs"]  # nothing generated
    assert console_errors(driver) == []


@pytest.mark.parametrize("field, value, expected", [
    ("temperature", "-1", "Temperature must be a number ≥ 0"),
    ("top_p", "0", "Top-p must be in (0, 1]"),
    ("top_k", "2.5", "Top-k must be a whole number ≥ 1"),
    ("seed", "", "The seed must be a whole number"),
    ("chars", "0", "The number of new characters must be"),
])
def test_bad_setting_gets_a_message(driver, field, value, expected):
    page = run_page(driver, "ROMEO:\n", **{field: value})
    assert expected in page["message"]
    assert console_errors(driver) == []


def test_page_is_self_contained_and_fast(driver, book, site):
    """Every file the page loaded came from the site itself; prints the bytes loaded and the time to first token."""
    from pathlib import PurePosixPath

    entries = driver.execute_script(
        "return performance.getEntriesByType('resource').map((e) => [e.name, e.encodedBodySize]);")
    outside = [name for name, _ in entries if not name.startswith(site)]
    assert outside == [], f"the page fetched files from elsewhere: {outside}"
    sizes = {PurePosixPath(name).name: size for name, size in entries}
    for name in ("playground.js", "playground-ui.js", "model.safetensors", "config.json", "tokenizer.json"):
        assert name in sizes
    served = SITE / "_static" / "models" / "shakespeare-baby" / "model.safetensors"
    assert served.read_bytes() == (ROOT / "book" / "models" / "shakespeare-baby" / "model.safetensors").read_bytes()
    page = run_page(driver, PROMPTS[2], temperature="0.8", seed="1", chars="20")  # a whole context to read first
    load_ms, n_params = driver.execute_script("return [window.playground.loadMs, window.playground.model.nParams]")
    assert n_params == book[0].num_params(non_embedding=False)
    js_bytes = sizes["playground.js"] + sizes["playground-ui.js"]
    model_bytes = sum(sizes[n] for n in ("model.safetensors", "config.json", "tokenizer.json", "provenance.json"))
    print(f"loaded: {js_bytes} bytes of JavaScript, {model_bytes} bytes of model; model ready in {load_ms:.0f} ms; "
          f"first token {page['ttftMs']:.1f} ms after Generate with a {len(PROMPTS[2])}-character prompt")
    assert console_errors(driver) == []
