// The book's GPT in plain JavaScript: the safetensors reader, the character tokenizer, the forward
// pass with a KV cache, and the sampler of transformer_lib.generation. No dependencies; the page's
// interface is playground-ui.js. Weights and activations are stored in Float32Arrays (float32, as
// in PyTorch); sums are accumulated in JavaScript numbers (float64).
(function (root) {
  "use strict";

  // ---- safetensors: 8 bytes of header length (little-endian u64), a JSON header, the raw data.
  function readSafetensors(buffer) {
    if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
      throw new Error("safetensors holds little-endian numbers; this machine is big-endian");
    }
    const view = new DataView(buffer);
    const headerLen = Number(view.getBigUint64(0, true));
    if (headerLen > buffer.byteLength - 8) throw new Error("not a safetensors file: header longer than the file");
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, headerLen)));
    const base = 8 + headerLen, tensors = {};
    for (const [name, info] of Object.entries(header)) {
      if (name === "__metadata__") continue;
      if (info.dtype !== "F32") throw new Error(`tensor ${name} is ${info.dtype}; the playground reads F32 only`);
      const [start, end] = info.data_offsets;
      // A Float32Array view needs a 4-byte-aligned offset; otherwise copy the bytes.
      const data = (base + start) % 4 === 0
        ? new Float32Array(buffer, base + start, (end - start) / 4)
        : new Float32Array(buffer.slice(base + start, end));
      tensors[name] = { shape: info.shape, data };
    }
    return { tensors, metadata: header.__metadata__ || {} };
  }

  // ---- the character tokenizer of chapter 1 (transformer_lib.data.CharTokenizer)
  class CharTokenizer {
    constructor(json) {
      if (json.format !== "transformer_lib.char_tokenizer/1") throw new Error(`unknown tokenizer format ${json.format}`);
      this.chars = json.chars;
      this.ids = new Map(this.chars.map((c, i) => [c, i]));
    }
    get vocabSize() { return this.chars.length; }
    // Array.from splits by code point, so an emoji is one (unknown) character, as in Python.
    encode(text) {
      return Array.from(text).map((c, i) => {
        const id = this.ids.get(c);
        if (id === undefined) {
          throw new RangeError(`The character ${JSON.stringify(c)} (position ${i + 1} of the prompt) is not in ` +
            `the model's vocabulary; it knows these ${this.vocabSize}: ${JSON.stringify(this.chars.join(""))}`);
        }
        return id;
      });
    }
    decode(ids) { return ids.map((i) => this.chars[i]).join(""); }
  }

  // ---- float32 kernels on Float32Arrays
  // out[i] = sum_j W[i, j] x[j] (+ b[i]), W row-major (n_out, n_in), as nn.Linear.
  function linear(out, W, x, b) {
    const nOut = out.length, nIn = x.length;
    for (let i = 0; i < nOut; i++) {
      let s = 0, row = i * nIn;
      for (let j = 0; j < nIn; j++) s += W[row + j] * x[j];
      out[i] = b ? s + b[i] : s;
    }
    return out;
  }

  function layerNorm(out, x, w, b, eps) {
    const n = x.length;
    let mean = 0, v = 0;
    for (let i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (let i = 0; i < n; i++) v += (x[i] - mean) ** 2;
    const inv = 1 / Math.sqrt(v / n + eps);  // biased variance, as F.layer_norm
    for (let i = 0; i < n; i++) out[i] = (x[i] - mean) * inv * w[i] + (b ? b[i] : 0);
    return out;
  }

  // erf to float64 accuracy (JavaScript has none): its Taylor series near 0, a continued fraction
  // for erfc beyond 3, where the series would cancel.
  function erf(x) {
    const z = Math.abs(x);
    if (z < 3) {
      let term = z, sum = z;
      for (let n = 1; Math.abs(term) > 1e-17 * Math.abs(sum); n++) {
        term *= -z * z / n;
        sum += term / (2 * n + 1);
      }
      return Math.sign(x) * sum * 2 / Math.sqrt(Math.PI);
    }
    let f = z;  // erfc(z) = exp(-z^2) / sqrt(pi) / (z + (1/2) / (z + 1 / (z + (3/2) / (z + ...))))
    for (let k = 60; k >= 1; k--) f = z + (k / 2) / f;
    return Math.sign(x) * (1 - Math.exp(-z * z) / Math.sqrt(Math.PI) / f);
  }

  const ACTIVATIONS = {
    gelu: (x) => 0.5 * x * (1 + erf(x / Math.SQRT2)),
    gelu_tanh: (x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3))),
    relu: (x) => Math.max(x, 0),
    relu2: (x) => Math.max(x, 0) ** 2,
  };

  // ---- the GPT of chapter 6: learned positions, pre-norm blocks, tied output layer
  class GPT {
    constructor(config, tensors) {
      const c = { position: "learned", qk_norm: false, tie_embeddings: true, logit_softcap: 0, ...config };
      if (c.position !== "learned" || c.qk_norm || !(c.activation in ACTIVATIONS)) {
        throw new Error(`the playground runs GPTs with learned positions, no QK-norm and activation in ` +
          `${Object.keys(ACTIVATIONS)}; got position=${c.position}, qk_norm=${c.qk_norm}, activation=${c.activation}`);
      }
      this.config = c;
      const t = (name, optional) => {
        if (!(name in tensors)) {
          if (optional) return null;
          throw new Error(`model.safetensors has no tensor ${name}`);
        }
        return tensors[name].data;
      };
      const bias = (name) => (c.bias ? t(name) : null);
      this.wte = t("wte.weight");
      this.wpe = t("wpe.weight");
      this.blocks = [];
      for (let l = 0; l < c.n_layer; l++) {
        const p = `blocks.${l}.`;
        this.blocks.push({
          ln1: [t(p + "ln1.weight"), bias(p + "ln1.bias")], ln2: [t(p + "ln2.weight"), bias(p + "ln2.bias")],
          inProj: [t(p + "attn.in_proj.weight"), bias(p + "attn.in_proj.bias")],
          outProj: [t(p + "attn.out_proj.weight"), bias(p + "attn.out_proj.bias")],
          fc1: [t(p + "mlp.fc1.weight"), bias(p + "mlp.fc1.bias")], fc2: [t(p + "mlp.fc2.weight"), bias(p + "mlp.fc2.bias")],
        });
      }
      this.lnF = [t("ln_f.weight"), bias("ln_f.bias")];
      this.lmHead = c.tie_embeddings ? this.wte : t("lm_head.weight");
      this.act = ACTIVATIONS[c.activation];
      this.nParams = Object.values(tensors).reduce((n, x) => n + x.data.length, 0);
    }

    // An empty KV cache: keys and values of every layer, (block_size, n_embd) each, and the
    // attention rows of every layer and head (attn[l][h][t] = what query t gave keys 0..t).
    newCache() {
      const { n_layer, n_head, n_embd, block_size } = this.config;
      const make = () => Array.from({ length: n_layer }, () => new Float32Array(block_size * n_embd));
      return { length: 0, k: make(), v: make(),
               attn: Array.from({ length: n_layer }, () => Array.from({ length: n_head }, () => [])) };
    }

    // Run one token at position cache.length; append its keys and values; return its next-token logits.
    step(id, cache) {
      const { n_embd: C, n_head: H, block_size, layer_norm_eps: eps, vocab_size: V } = this.config;
      const t = cache.length, d = C / H;
      if (t >= block_size) throw new Error(`the KV cache is full (block_size=${block_size})`);
      const x = new Float32Array(C), h = new Float32Array(C), o = new Float32Array(C), a = new Float32Array(C);
      const qkv = new Float32Array(3 * C), f = new Float32Array(4 * C);
      for (let i = 0; i < C; i++) x[i] = this.wte[id * C + i] + this.wpe[t * C + i];
      this.blocks.forEach((blk, l) => {
        linear(qkv, blk.inProj[0], layerNorm(h, x, blk.ln1[0], blk.ln1[1], eps), blk.inProj[1]);
        const K = cache.k[l], Vc = cache.v[l];
        K.set(qkv.subarray(C, 2 * C), t * C);  // q | k | v, each split into heads of width d
        Vc.set(qkv.subarray(2 * C), t * C);
        for (let hd = 0; hd < H; hd++) {
          const p = new Float32Array(t + 1);
          let max = -Infinity, sum = 0;
          for (let s = 0; s <= t; s++) {  // causal: keys 0..t are all there is
            let dot = 0;
            for (let j = 0; j < d; j++) dot += qkv[hd * d + j] * K[s * C + hd * d + j];
            p[s] = dot / Math.sqrt(d);
            max = Math.max(max, p[s]);
          }
          for (let s = 0; s <= t; s++) sum += (p[s] = Math.exp(p[s] - max));
          for (let s = 0; s <= t; s++) p[s] /= sum;
          for (let j = 0; j < d; j++) {
            let acc = 0;
            for (let s = 0; s <= t; s++) acc += p[s] * Vc[s * C + hd * d + j];
            o[hd * d + j] = acc;
          }
          cache.attn[l][hd][t] = p;
        }
        linear(a, blk.outProj[0], o, blk.outProj[1]);
        for (let i = 0; i < C; i++) x[i] += a[i];
        linear(f, blk.fc1[0], layerNorm(h, x, blk.ln2[0], blk.ln2[1], eps), blk.fc1[1]);
        for (let i = 0; i < f.length; i++) f[i] = this.act(f[i]);
        linear(a, blk.fc2[0], f, blk.fc2[1]);
        for (let i = 0; i < C; i++) x[i] += a[i];
      });
      cache.length = t + 1;
      const logits = linear(new Float32Array(V), this.lmHead, layerNorm(h, x, this.lnF[0], this.lnF[1], eps));
      const cap = this.config.logit_softcap;
      if (cap > 0) for (let i = 0; i < V; i++) logits[i] = cap * Math.tanh(logits[i] / cap);
      return logits;
    }

    // Logits of the token after seq[0..n-1], as transformer_lib.generation._next_logits: the cache
    // holds seq[0..n-2] unless it is empty or full; then it is rebuilt from the last block_size
    // tokens (learned positions cannot slide).
    nextLogits(seq, n, cache) {
      const bs = this.config.block_size;
      if (cache.length === 0 || cache.length === bs) {
        Object.assign(cache, this.newCache());
        let logits;
        for (let i = Math.max(0, n - bs); i < n; i++) logits = this.step(seq[i], cache);
        cache.start = Math.max(0, n - bs);  // the position in seq of the cache's first token
        return logits;
      }
      return this.step(seq[n - 1], cache);
    }
  }

  // ---- sampling, as transformer_lib.generation.sample_next
  // A seeded 32-bit generator (mulberry32); the same seed gives the same numbers in every browser.
  function rng(seed) {
    let a = seed >>> 0;
    return function () {
      a = (a + 0x6d2b79f5) >>> 0;
      let r = Math.imul(a ^ (a >>> 15), 1 | a);
      r = (r + Math.imul(r ^ (r >>> 7), 61 | r)) ^ r;
      return ((r ^ (r >>> 14)) >>> 0) / 4294967296;  // in [0, 1)
    };
  }

  function softmax(z) {
    const max = Math.max(...z), e = z.map((v) => Math.exp(v - max)), s = e.reduce((a, b) => a + b, 0);
    return e.map((v) => v / s);
  }

  // sample_next's logits before its softmax: shifted so the largest is 0, divided by the temperature,
  // the top_k largest kept (ties kept), then the smallest set of most likely tokens whose probability
  // reaches top_p (the most likely always kept); the others -Infinity.
  function filterLogits(logits, { temperature = 1, topK = null, topP = null } = {}) {
    const top = Math.max(...logits);
    let z = Array.from(logits, (v) => (v - top) / temperature);
    if (topK !== null) {
      const kth = [...z].sort((a, b) => b - a)[Math.min(topK, z.length) - 1];
      z = z.map((v) => (v < kth ? -Infinity : v));
    }
    if (topP !== null && topP < 1) {
      const order = z.map((_, i) => i).sort((i, j) => z[j] - z[i]);
      const p = softmax(order.map((i) => z[i]));
      let above = 0;
      order.forEach((i, r) => {
        if (r > 0 && above >= topP) z[i] = -Infinity;
        above += p[r];
      });
    }
    return z;
  }

  const nextTokenProbs = (logits, opts) => softmax(filterLogits(logits, opts));

  // temperature 0 is greedy decoding: the most likely token, the lowest id among equal logits.
  function sampleNext(logits, opts, random) {
    if (opts.temperature === 0) return logits.indexOf(Math.max(...logits));
    const probs = nextTokenProbs(logits, opts), u = random();
    let acc = 0, last = 0;
    for (let i = 0; i < probs.length; i++) {
      if (probs[i] === 0) continue;
      acc += probs[i];
      last = i;
      if (u < acc) return i;
    }
    return last;  // u fell in the rounding gap between acc and 1
  }

  // Continue the ids `prompt`, one token at a time: yields {id, logits, cache} after each step.
  function* generate(model, prompt, { maxNewTokens, temperature = 1, topK = null, topP = null, seed = 0 }) {
    const seq = prompt.slice(), cache = model.newCache(), random = rng(seed);
    for (let n = prompt.length; n < prompt.length + maxNewTokens; n++) {
      const logits = model.nextLogits(seq, n, cache);
      const id = sampleNext(logits, { temperature, topK, topP }, random);
      seq.push(id);
      yield { id, logits, cache, seq };
    }
  }

  async function loadModel(baseUrl) {
    const get = async (name, how) => {
      const r = await fetch(new URL(name, baseUrl));
      if (!r.ok) throw new Error(`could not load ${name} (HTTP ${r.status})`);
      return r[how]();
    };
    const [config, tok, buffer, provenance] = await Promise.all([
      get("config.json", "json"), get("tokenizer.json", "json"), get("model.safetensors", "arrayBuffer"),
      get("provenance.json", "json")]);
    const model = new GPT(config, readSafetensors(buffer).tensors);
    return { model, tokenizer: new CharTokenizer(tok), provenance, bytes: buffer.byteLength };
  }

  const api = { readSafetensors, CharTokenizer, GPT, erf, rng, filterLogits, nextTokenProbs, sampleNext, generate, loadModel };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.Playground = api;
})(this);
