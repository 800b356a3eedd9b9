"""Unit tests for transformer_lib.generation (chapter 12): samplers, the KV cache and generate."""

import ast
import math

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import transformer_lib.generation
from transformer_lib.config import GPTConfig
from transformer_lib.generation import KVCache, _next_logits, generate, sample_next, top_k_filter, top_p_filter
from transformer_lib.gpt import GPT

INF = float("-inf")
TINY = GPTConfig.from_preset("tiny")  # 2 layers, 2 heads, 32 wide, block_size 16, vocab 65
N_DRAWS = 20_000
Z_TOL = 4.5  # standard errors; a correct sampler exceeds it for one of 6 tokens with probability ~4e-5


def make_model(config=TINY, dtype=torch.float32, seed=0):
    """A GPT in eval mode whose logits are far from flat (weights scaled up), so greedy ties are unlikely."""
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model.to(dtype).eval()


def ids(shape, vocab=65, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- top_k_filter


def test_top_k_filter_hand_cases():
    z = torch.tensor([1.0, 3.0, 2.0, 5.0, 4.0, 0.0])
    assert torch.equal(top_k_filter(z, 3), torch.tensor([INF, 3.0, INF, 5.0, 4.0, INF]))
    assert torch.equal(top_k_filter(z, 1), torch.tensor([INF, INF, INF, 5.0, INF, INF]))
    assert torch.equal(top_k_filter(z, 6), z) and torch.equal(top_k_filter(z, 100), z)
    # a tie with the k-th largest keeps every tied token
    assert torch.equal(top_k_filter(torch.tensor([1.0, 2.0, 2.0, 0.0]), 1), torch.tensor([INF, 2.0, 2.0, INF]))


def test_top_k_filter_rows_are_independent_and_dtype_is_kept():
    z = torch.randn(2, 3, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = top_k_filter(z, 4)
    assert out.shape == z.shape and out.dtype == torch.float64
    assert (out.isfinite().sum(-1) == 4).all()
    for i in range(2):
        for j in range(3):
            assert torch.equal(out[i, j], top_k_filter(z[i, j], 4))


def test_top_k_filter_matches_hugging_face_warper():
    transformers = pytest.importorskip("transformers")
    z = torch.randn(50, 65, generator=torch.Generator().manual_seed(1))
    for k in (1, 5, 40):
        ref = transformers.TopKLogitsWarper(top_k=k)(None, z.clone())
        assert torch.equal(top_k_filter(z, k), ref)


# ---------------------------------------------------------------- top_p_filter


def test_top_p_filter_hand_cases():
    probs = torch.tensor([0.15, 0.05, 0.5, 0.1, 0.2])
    z = probs.log()
    expected = {0.01: [2], 0.45: [2], 0.6: [2, 4], 0.8: [0, 2, 4], 0.9: [0, 2, 3, 4], 0.99: [0, 1, 2, 3, 4],
                1.0: [0, 1, 2, 3, 4]}
    for p, kept in expected.items():
        out = top_p_filter(z, p)
        assert out.isfinite().nonzero().flatten().tolist() == kept, p
        assert torch.equal(out[kept], z[kept])


def test_top_p_filter_always_keeps_the_most_likely_token():
    z = torch.tensor([[0.0, 10.0, 1.0], [3.0, 2.0, 1.0]])
    out = top_p_filter(z, 1e-6)
    assert out.isfinite().nonzero().tolist() == [[0, 1], [1, 0]]


def test_top_p_filter_matches_hugging_face_warper():
    transformers = pytest.importorskip("transformers")
    z = 2 * torch.randn(50, 65, generator=torch.Generator().manual_seed(2))
    for p in (0.1, 0.5, 0.9, 0.99):
        ref = transformers.TopPLogitsWarper(top_p=p)(None, z.clone())
        assert torch.equal(top_p_filter(z, p).isfinite(), ref.isfinite()), p


@pytest.mark.parametrize("filt, arg", [(top_k_filter, 3), (top_p_filter, 0.5)])
def test_filters_refuse_logits_that_are_not_floating_or_empty(filt, arg):
    name = filt.__name__
    with pytest.raises(TypeError, match=f"{name}: logits must be a floating-point tensor, got logits.dtype=torch.int64"):
        filt(torch.tensor([1, 2, 3]), arg)  # topk of int64 works, the -inf fill would overflow
    with pytest.raises(ValueError, match=f"{name}: logits"):
        filt(torch.zeros(2, 0), arg)
    with pytest.raises(TypeError, match=f"{name}: logits must be a tensor"):
        filt([1.0, 2.0], arg)


# ---------------------------------------------------------------- sample_next

P6 = np.array([0.35, 0.25, 0.18, 0.12, 0.07, 0.03])


def _target(tau, top_k=None, top_p=None):
    q = P6 ** (1 / tau) / (P6 ** (1 / tau)).sum()
    order = np.argsort(-q)
    keep = np.zeros(6, dtype=bool)
    keep[order[: top_k or 6]] = True
    q = np.where(keep, q, 0) / q[keep].sum()
    if top_p is not None:
        above = np.cumsum(q[order]) - q[order]
        keep[order[above >= top_p]] = False
        q = np.where(keep, q, 0) / q[keep].sum()
    return q


@pytest.mark.parametrize(
    "tau, top_k, top_p",
    [(1.0, None, None), (0.5, None, None), (2.0, None, None), (1.0, 2, None), (1.0, None, 0.5),
     (0.7, 4, 0.9)],
)
def test_sample_next_draws_from_the_truncated_renormalised_distribution(tau, top_k, top_p):
    z = torch.tensor(np.log(P6), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    draws = sample_next(z.expand(N_DRAWS, 6), temperature=tau, top_k=top_k, top_p=top_p, generator=g)
    assert draws.shape == (N_DRAWS, 1) and draws.dtype == torch.int64
    freq = np.bincount(draws.flatten().numpy(), minlength=6) / N_DRAWS
    q = _target(tau, top_k, top_p)
    kept = q > 0
    assert (freq[~kept] == 0).all()
    z_scores = np.abs(freq[kept] - q[kept]) / np.sqrt(q[kept] * (1 - q[kept]) / N_DRAWS)
    assert z_scores.max() <= Z_TOL, z_scores


def test_sample_next_statistical_check_can_fail():
    # The same test against the wrong target (the untruncated distribution) fails by far.
    z = torch.tensor(np.log(P6), dtype=torch.float32)
    draws = sample_next(z.expand(N_DRAWS, 6), top_k=2, generator=torch.Generator().manual_seed(0))
    freq = np.bincount(draws.flatten().numpy(), minlength=6) / N_DRAWS
    assert (np.abs(freq - P6) / np.sqrt(P6 * (1 - P6) / N_DRAWS)).max() > 20


def test_sample_next_greedy_is_argmax_and_ignores_filters():
    z = torch.tensor([[0.1, 2.0, 2.0, -1.0], [5.0, 0.0, 1.0, 4.9]])
    for kw in ({}, {"top_k": 3}, {"top_p": 0.2}):
        assert sample_next(z, temperature=0, **kw).tolist() == [[1], [0]]  # ties: the lowest id


def test_sample_next_keeps_leading_dimensions():
    z = torch.randn(2, 3, 7)
    assert sample_next(z, generator=torch.Generator().manual_seed(0)).shape == (2, 3, 1)
    assert sample_next(z[0, 0]).shape == (1,)


def test_sample_next_same_seed_same_draws():
    z = torch.randn(8, 65, generator=torch.Generator().manual_seed(3))
    a = sample_next(z, top_p=0.9, generator=torch.Generator().manual_seed(5))
    b = sample_next(z, top_p=0.9, generator=torch.Generator().manual_seed(5))
    c = sample_next(z[0].expand(200, 65), generator=torch.Generator().manual_seed(6))
    d = sample_next(z[0].expand(200, 65), generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and not torch.equal(c, d)


# ---------------------------------------------------------------- KVCache


def test_kv_cache_shapes_memory_and_views():
    cache = KVCache(3, 2, 4, 8, 10)
    assert cache.k.shape == cache.v.shape == (3, 2, 4, 10, 8)
    assert len(cache) == 3 and cache.length == 0 and cache.max_len == 10
    assert cache.nbytes == 2 * 3 * 2 * 10 * (4 * 8) * 4
    assert KVCache(3, 2, 4, 8, 10, dtype=torch.float16, device="meta").nbytes == cache.nbytes // 2
    k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    k_all, v_all = cache[1].update(k, v)
    assert torch.equal(k_all, k) and torch.equal(v_all, v)
    assert k_all.data_ptr() == cache.k[1].data_ptr()  # a view of the preallocated tensor, not a copy
    k2 = torch.randn(2, 4, 1, 8)
    k_all, _ = cache[1].update(k2, k2)
    assert k_all.shape == (2, 4, 7, 8) and torch.equal(k_all[:, :, 6:], k2)
    assert cache[1].length == 7 and cache[0].length == 0


def test_kv_cache_for_model_crop_and_reset():
    model = make_model().double()
    cache = KVCache.for_model(model, batch_size=3)
    assert cache.k.shape == (2, 3, 2, 16, 16) and cache.k.dtype == torch.float64
    assert KVCache.for_model(model, 1, max_len=5).max_len == 5
    with torch.no_grad():
        model(ids((3, 9)).long(), kv_cache=cache)
    assert cache.length == 9 and all(layer.length == 9 for layer in cache)
    cache.crop(4)
    assert cache.length == 4 and all(layer.length == 4 for layer in cache)
    cache.reset()
    assert cache.length == 0


def test_kv_cache_errors():
    cache = KVCache(1, 2, 4, 8, 5)
    with pytest.raises(ValueError, match=r"KVCache: cannot add t=6 positions to the 0 stored, max_len=5"):
        cache[0].update(torch.zeros(2, 4, 6, 8), torch.zeros(2, 4, 6, 8))
    with pytest.raises(ValueError, match=r"KVCache: k and v must have shape \(B, h, t, head_dim\) = \(2, 4, t, 8\)"):
        cache[0].update(torch.zeros(2, 3, 1, 8), torch.zeros(2, 3, 1, 8))
    with pytest.raises(ValueError, match="n_head"):
        KVCache(1, 1, 0, 8, 5)
    with pytest.raises(TypeError, match="max_len"):
        KVCache(1, 1, 1, 8, 5.0)
    with pytest.raises(TypeError, match="dtype"):
        KVCache(1, 1, 1, 8, 5, dtype=torch.int64)
    with pytest.raises(ValueError, match="device"):
        KVCache(1, 1, 1, 8, 5, device="nowhere")
    with pytest.raises(ValueError, match=r"KVCache.for_model: max_len .*block_size=16.*max_len=17"):
        KVCache.for_model(GPT(TINY), 1, max_len=17)
    with pytest.raises(TypeError, match="KVCache.for_model: model"):
        KVCache.for_model(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match=r"KVCache.crop: length .*\[0, 0\].*length=1"):
        cache.crop(1)
    with pytest.raises(TypeError, match="KVCache.crop: length"):
        cache.crop(None)


# ---------------------------------------------------------------- the model with the cache


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
def test_logits_through_the_cache_equal_one_forward_pass(dtype, atol):
    model = make_model(dtype=dtype)
    idx = ids((3, 16))
    cache = KVCache.for_model(model, batch_size=3)
    with torch.no_grad():
        whole = model(idx)[0]
        pieces = [model(idx[:, a:b], kv_cache=cache)[0] for a, b in ((0, 5), (5, 6), (6, 7), (7, 11), (11, 16))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=0, atol=atol)


@pytest.mark.parametrize("t", [1, 7, 16])
def test_flops_of_a_full_pass_and_a_cached_step_match_chapter_12s_count(t):
    """F_full(t) = t (24 L C^2 + 2 C V) + 4 L C t^2 and F_cached(t) = F_full(t) / t, attention included: under
    the math backend attention is two batched matmuls, which FlopCounterMode counts."""
    model = make_model()
    L, C, V = TINY.n_layer, TINY.n_embd, TINY.vocab_size
    x = ids((1, t), seed=9)
    cache = KVCache.for_model(model, batch_size=1)
    with torch.no_grad():
        if t > 1:
            model(x[:, :-1], kv_cache=cache)  # the cache holds the first t - 1 positions
        counts = []
        for run in (lambda: model(x), lambda: model(x[:, -1:], kv_cache=cache)):
            with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
                run()
            counts.append(counter.get_total_flops())
    full, cached = counts
    assert full == t * (24 * L * C**2 + 2 * C * V) + 4 * L * C * t**2
    assert cached * t == full


def test_next_logits_past_block_size_equal_recomputation_on_the_window():
    model = make_model()
    seq = ids((2, 50), seed=4)
    cache = KVCache.for_model(model, batch_size=2)
    with torch.no_grad():
        for n in range(1, 51):
            full = model(seq[:, max(0, n - 16):n])[0][:, -1]
            torch.testing.assert_close(_next_logits(model, seq, n, cache), full, rtol=0, atol=1e-4)
            assert cache.length == min(n, 16)


# ---------------------------------------------------------------- generate


def test_greedy_tokens_with_and_without_the_cache_are_identical_past_block_size():
    model = make_model()
    prompt = ids((3, 5), seed=5)
    with_cache = generate(model, prompt, 40, temperature=0)
    without = generate(model, prompt, 40, temperature=0, use_cache=False)
    assert with_cache.shape == (3, 45) and torch.equal(with_cache[:, :5], prompt)
    assert torch.equal(with_cache, without)
    with torch.no_grad():  # and they are the argmax of the model on the last block_size tokens
        for n in (5, 16, 30, 44):
            assert with_cache[:, n].tolist() == model(with_cache[:, max(0, n - 16):n])[0][:, -1].argmax(-1).tolist()


def test_sampled_tokens_with_and_without_the_cache_are_identical_for_the_same_seed():
    model = make_model()
    prompt = ids((2, 3), seed=6)
    kw = dict(temperature=0.9, top_k=30, top_p=0.95)
    a = generate(model, prompt, 30, generator=torch.Generator().manual_seed(1), **kw)
    b = generate(model, prompt, 30, use_cache=False, generator=torch.Generator().manual_seed(1), **kw)
    c = generate(model, prompt, 30, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_generate_with_a_prompt_longer_than_block_size():
    model = make_model()
    prompt = ids((1, 20), seed=7)
    out = generate(model, prompt, 3, temperature=0)
    assert torch.equal(out, generate(model, prompt, 3, temperature=0, use_cache=False))
    with torch.no_grad():
        assert out[0, 20].item() == model(prompt[:, -16:])[0][0, -1].argmax().item()


def test_generate_restores_the_mode_returns_a_normal_tensor_and_equals_the_method():
    model = make_model().train()
    prompt = ids((2, 4), seed=8)
    out = generate(model, prompt, 10, temperature=0)
    assert model.training and not torch.is_inference(out) and out.dtype == torch.int64
    assert torch.equal(model.generate(prompt, 10, temperature=0), out)
    assert model.training
    empty = generate(model, prompt, 0)
    assert torch.equal(empty, prompt) and empty.data_ptr() != prompt.data_ptr()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(model=torch.nn.Linear(2, 2)), TypeError, "generate: model .*got Linear"),
        (dict(idx=torch.zeros(1, 3)), TypeError, "generate: idx .*int64"),
        (dict(idx=[[1, 2]]), TypeError, "generate: idx .*list"),
        (dict(idx=torch.zeros(3, dtype=torch.long)), ValueError, r"generate: idx .*\(3,\)"),
        (dict(idx=torch.zeros(1, 0, dtype=torch.long)), ValueError, r"generate: idx .*\(1, 0\)"),
        (dict(idx=torch.tensor([[1, 65]])), ValueError, r"generate: idx must hold ids in \[0, vocab_size=65\), got the id 65"),
        (dict(idx=torch.tensor([[-1, 2]])), ValueError, "generate: idx must hold ids .*got the id -1"),
        (dict(max_new_tokens=-1), ValueError, "generate: max_new_tokens"),
        (dict(max_new_tokens=2.0), TypeError, "generate: max_new_tokens"),
        (dict(temperature=-0.5), ValueError, "generate: temperature .*>= 0.*temperature=-0.5"),
        (dict(temperature=math.inf), ValueError, "generate: temperature"),
        (dict(temperature="hot"), TypeError, "generate: temperature"),
        (dict(top_k=0), ValueError, "generate: top_k .*top_k=0"),
        (dict(top_k=2.5), TypeError, "generate: top_k"),
        (dict(top_p=0.0), ValueError, r"generate: top_p .*\(0, 1\].*top_p=0.0"),
        (dict(top_p=1.5), ValueError, "generate: top_p .*top_p=1.5"),
        (dict(top_p=math.nan), ValueError, "generate: top_p"),
        (dict(use_cache=1), TypeError, "generate: use_cache"),
        (dict(generator=0), TypeError, "generate: generator"),
        (dict(callback="print"), TypeError, "generate: callback"),
    ],
)
def test_generate_errors(kwargs, error, match):
    args = dict(model=GPT(TINY), idx=ids((1, 3)), max_new_tokens=2)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        generate(args.pop("model"), args.pop("idx"), args.pop("max_new_tokens"), **args)


@pytest.mark.parametrize("max_new_tokens, use_cache", [(10**13, True), (10**13, False), (2**62, False)])
def test_generate_refuses_an_output_that_cannot_fit_before_allocating_it(max_new_tokens, use_cache):
    """10**13 new tokens would be a 160 TB output: refused naming max_new_tokens, not an allocator error."""
    with pytest.raises(ValueError, match=rf"generate: max_new_tokens={max_new_tokens} \(a 2 x {max_new_tokens + 3} "
                                         r"int64 output.* would need .*iB, more than the .* of memory of the device cpu"):
        generate(GPT(TINY), ids((2, 3)), max_new_tokens, use_cache=use_cache)


def test_kv_cache_refuses_a_cache_that_cannot_fit():
    with pytest.raises(ValueError, match=r"KVCache: the keys and values, 2 x 1000000 x 1000000 x 12 x 1024 x 64 .* "
                                         r"would need .*PiB, more than"):
        KVCache(10**6, 10**6, 12, 64, 1024)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="KVCache: device must be a device of this machine, got device='cuda'"):
            KVCache(1, 1, 1, 1, 1, device="cuda")


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-45, 1e-30, 1e-8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tiny_temperature_is_greedy_not_nan(temperature, dtype):
    """z / 1e-300 overflows (and 1e-300 rounds to 0 in float32): the largest logit is subtracted first."""
    torch.manual_seed(0)
    model = GPT(TINY).to(dtype)
    prompt = ids((2, 3))
    greedy = generate(model, prompt, 6, temperature=0)
    assert torch.equal(generate(model, prompt, 6, temperature=temperature), greedy)
    z = torch.tensor([[0.5, 3.0, -2.0, 3.0, float("-inf")]], dtype=dtype).expand(2000, 5)
    draws = sample_next(z, temperature=temperature, generator=torch.Generator().manual_seed(0)).flatten()
    counts = torch.bincount(draws, minlength=5)
    assert counts[[0, 2, 4]].sum() == 0 and 900 < counts[1] < 1100  # the two tied maxima, each about half


def test_shifting_by_the_largest_logit_keeps_the_draws_of_an_ordinary_temperature():
    z = torch.randn(500, 40, generator=torch.Generator().manual_seed(3)) * 4
    ours = sample_next(z, temperature=0.7, generator=torch.Generator().manual_seed(1))
    naive = torch.multinomial(torch.softmax(z / 0.7, dim=-1), 1, generator=torch.Generator().manual_seed(1))
    assert (ours == naive).float().mean() > 0.99  # equal up to rounding at the edges of a draw


@pytest.mark.parametrize("kw", [dict(top_p=1e-300), dict(top_p=1e-50, top_k=3), dict(top_k=10**30), dict(top_k=1)])
def test_extreme_top_k_and_top_p_values(kw):
    torch.manual_seed(0)
    model = GPT(TINY)
    prompt = ids((2, 3))
    out = generate(model, prompt, 5, generator=torch.Generator().manual_seed(0), **kw)
    if kw.get("top_k") != 10**30:  # the tiniest nucleus, like top_k=1, is the most likely token
        assert torch.equal(out, generate(model, prompt, 5, temperature=0))
    z = torch.tensor([[1.0, 2.0, 0.5]])
    assert top_p_filter(z, 1e-300).isfinite().tolist() == [[False, True, False]]


@pytest.mark.parametrize("bad, match", [(float("nan"), "got nan in row \\(1,\\)"), (float("inf"), "got inf in row \\(1,\\)")])
def test_sample_next_refuses_nan_and_inf_logits_on_the_cpu(bad, match):
    z = torch.zeros(3, 4)
    z[1, 2] = bad
    for kw in (dict(), dict(temperature=1e-300), dict(top_k=2), dict(top_p=0.5)):
        with pytest.raises(ValueError, match="sample_next: logits must have a finite largest value in every row, " + match):
            sample_next(z, **kw)
    with pytest.raises(ValueError, match="sample_next: logits must have a finite largest value .*got -inf"):
        sample_next(torch.full((4,), float("-inf")))


def test_sampler_errors():
    # The filters check their scalar argument; the logits are not checked (they are the inner step of
    # every generated token). sample_next, a user's entry point, checks all its arguments.
    z = torch.randn(4)
    with pytest.raises(ValueError, match="top_k_filter: k .*k=0"):
        top_k_filter(z, 0)
    with pytest.raises(TypeError, match="top_k_filter: k"):
        top_k_filter(z, True)
    with pytest.raises(ValueError, match=r"top_p_filter: p .*\(0, 1\].*p=0"):
        top_p_filter(z, 0)
    with pytest.raises(ValueError, match="top_p_filter: p"):
        top_p_filter(z, math.nan)
    with pytest.raises(TypeError, match="top_p_filter: p"):
        top_p_filter(z, "0.5")
    with pytest.raises(TypeError, match="sample_next: logits .*floating"):
        sample_next(torch.arange(4))
    with pytest.raises(TypeError, match="sample_next: logits"):
        sample_next([0.1, 0.2])
    with pytest.raises(ValueError, match="sample_next: logits"):
        sample_next(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="sample_next: temperature"):
        sample_next(z, temperature=-1.0)
    with pytest.raises(ValueError, match="sample_next: top_k .*top_k=-3"):
        sample_next(z, top_k=-3)
    with pytest.raises(ValueError, match="sample_next: top_p"):
        sample_next(z, top_p=2.0)
    with pytest.raises(TypeError, match="sample_next: generator"):
        sample_next(z, generator=1)


def test_callback_streams_each_new_column():
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny", vocab_size=11))
    idx = torch.randint(0, 11, (2, 3))
    seen = []
    out = generate(model, idx, 7, temperature=1.0, generator=torch.Generator().manual_seed(5), callback=seen.append)
    assert len(seen) == 7 and all(column.shape == (2, 1) for column in seen)
    assert torch.equal(torch.cat(seen, dim=1), out[:, 3:])


def test_generate_restores_the_mode_when_a_step_fails():
    model = make_model().train()

    def stop(column):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        generate(model, ids((1, 3)), 5, callback=stop)
    assert model.training


# ---------------------------------------------------------------- duck typing: generation never imports gpt


class Wrapped(torch.nn.Module):
    """Not a GPT: a module with GPT's interface (a config, model(idx, kv_cache=...))."""

    def __init__(self, gpt):
        super().__init__()
        self.inner = gpt
        self.config = gpt.config

    def forward(self, idx, targets=None, *, kv_cache=None):
        return self.inner(idx, targets, kv_cache=kv_cache)


def test_generate_and_kv_cache_accept_any_module_with_the_interface():
    model = make_model()
    wrapped = Wrapped(model).eval()
    prompt = ids((2, 4), seed=9)
    for use_cache in (True, False):
        assert torch.equal(generate(wrapped, prompt, 20, temperature=0, use_cache=use_cache),
                           generate(model, prompt, 20, temperature=0))
    cache = KVCache.for_model(wrapped, batch_size=2)
    assert cache.k.shape == (2, 2, 2, 16, 16)


def test_generation_module_does_not_import_the_model():
    tree = ast.parse(open(transformer_lib.generation.__file__, encoding="utf-8").read())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not imported & {"transformer_lib.gpt", "transformer_lib.model", "transformer_lib.config"}, imported
