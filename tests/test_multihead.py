"""Unit tests for transformer_lib.multihead (chapter 4), against torch.nn.MultiheadAttention and autograd."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import transformer_lib.multihead as multihead
from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.multihead import MultiHeadAttention, _matmul_attention, merge_heads, split_heads

# float32: eps 1.2e-7, outputs of order 1, different summation orders -> a few ulp; float64 likewise.
ATOL = {torch.float32: 1e-6, torch.float64: 1e-12}
GRAD_ATOL = 1e-10  # float64, the backward pass chains more operations
DTYPES = list(ATOL)
B, L, S, D_MODEL, N_HEAD = 2, 5, 7, 12, 3


def make_pair(dtype=torch.float64, bias=True, dropout=0.0, seed=0):
    """torch's module (eval mode, random biases) and ours copied from it with from_torch."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D_MODEL, N_HEAD, dropout=dropout, bias=bias, batch_first=True, dtype=dtype).eval()
    if bias:
        with torch.no_grad():  # torch initialises the biases to zero, which would leave them untested
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    return MultiHeadAttention.from_torch(ref), ref


def make_inputs(dtype=torch.float64, seed=1, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, L, D_MODEL), (B, S, D_MODEL), (B, S, D_MODEL)]
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_(requires_grad) for s in shapes]


def random_allowed(*shape, seed=2):
    """Random boolean mask (True = may attend) whose every row keeps key 0."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(*shape, generator=g) < 0.6
    mask[..., 0] = True
    return mask


KM_L = padding_mask([L, 3])  # key_mask: True at real tokens, (B, L); torch's key_padding_mask is ~KM_L
KM_S = padding_mask([S, 4])  # True at real tokens, (B, S)


def assert_close(a, b, dtype, atol=None):
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b, rtol=0, atol=ATOL[dtype] if atol is None else atol)


# ---------------------------------------------------------------- split_heads / merge_heads


def test_split_heads_slices_channels_as_a_view():
    x = torch.randn(2, 5, 12)
    xh = split_heads(x, 3)
    assert xh.shape == (2, 3, 5, 4)
    for i in range(3):
        assert torch.equal(xh[:, i], x[:, :, 4 * i : 4 * (i + 1)])
    assert xh.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    xh[0, 1, 2, 3] = 123.0  # writing through the view changes x
    assert x[0, 2, 1 * 4 + 3] == 123.0


def test_merge_heads_inverts_split_heads():
    x = torch.randn(2, 5, 12)
    assert torch.equal(merge_heads(split_heads(x, 4)), x)
    y = torch.randn(2, 4, 5, 3)
    merged = merge_heads(y)
    assert merged.shape == (2, 5, 12)
    assert torch.equal(split_heads(merged, 4), y)


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize("bias", [True, False])
def test_attributes_and_parameters(bias):
    m = MultiHeadAttention(12, 3, dropout=0.1, bias=bias)
    assert (m.d_model, m.n_head, m.head_dim, m.dropout) == (12, 3, 4, 0.1)
    assert isinstance(m.dropout, float)
    shapes = {name: tuple(p.shape) for name, p in m.named_parameters()}
    expected = {"in_proj.weight": (36, 12), "out_proj.weight": (12, 12)}
    if bias:
        expected |= {"in_proj.bias": (36,), "out_proj.bias": (12,)}
    assert shapes == expected
    assert sum(p.numel() for p in m.parameters()) == 4 * 12 * 12 + (4 * 12 if bias else 0)


@pytest.mark.parametrize(
    "args, kwargs, error, name",
    [
        ((0, 1), {}, ValueError, "d_model"),
        ((12, -2), {}, ValueError, "n_head"),
        ((12.0, 3), {}, TypeError, "d_model"),
        ((12, None), {}, TypeError, "n_head"),
        ((12, 3), {"dropout": 1.0}, ValueError, "dropout"),
        ((12, 3), {"dropout": -0.1}, ValueError, "dropout"),
        ((12, 3), {"dropout": "0.1"}, TypeError, "dropout"),
        ((12, 3), {"bias": 1}, TypeError, "bias"),
    ],
)
def test_constructor_errors(args, kwargs, error, name):
    with pytest.raises(error, match=f"MultiHeadAttention: {name} .*got {name}="):
        MultiHeadAttention(*args, **kwargs)


def test_constructor_error_names_d_model_and_n_head_when_they_do_not_divide():
    with pytest.raises(ValueError, match="MultiHeadAttention: d_model .*n_head.*d_model=10 and n_head=3"):
        MultiHeadAttention(10, 3)


# ---------------------------------------------------------------- against nn.MultiheadAttention

# Each mode: (kwargs for ours, kwargs for torch, cross-attention?). torch's boolean attn_mask is
# True = masked, ours True = may attend; torch's key_padding_mask is True at padding, our key_mask
# True at real tokens; torch's 3-D mask is (B * h, L, S), ours (B, L, S).
_ALLOWED = random_allowed(L, L)
_ALLOWED_B = random_allowed(B, L, L, seed=3)
_ALLOWED_BH = random_allowed(B, N_HEAD, L, S, seed=4)
_FLOAT = torch.randn(L, L, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
MODES = {
    "self": (dict(), dict(), False),
    "key_mask": (dict(key_mask=KM_L), dict(key_padding_mask=~KM_L), False),
    "bool attn_mask (L, S)": (dict(attn_mask=_ALLOWED), dict(attn_mask=~_ALLOWED), False),
    "bool attn_mask (B, L, S)": (
        dict(attn_mask=_ALLOWED_B),
        dict(attn_mask=~_ALLOWED_B.repeat_interleave(N_HEAD, dim=0)),
        False,
    ),
    "float attn_mask": (dict(attn_mask=_FLOAT), dict(attn_mask=_FLOAT), False),
    "causal": (dict(is_causal=True), dict(attn_mask=~causal_mask(L), is_causal=True), False),
    "causal + key_mask": (
        dict(is_causal=True, key_mask=KM_L),
        dict(attn_mask=~causal_mask(L), key_padding_mask=~KM_L),
        False,
    ),
    "causal + float attn_mask": (
        dict(is_causal=True, attn_mask=_FLOAT),
        dict(attn_mask=_FLOAT.masked_fill(~causal_mask(L), float("-inf"))),
        False,
    ),
    "cross": (dict(), dict(), True),
    "cross + key_mask": (dict(key_mask=KM_S), dict(key_padding_mask=~KM_S), True),
    "cross + per-head attn_mask (B, h, L, S)": (
        dict(attn_mask=_ALLOWED_BH),
        dict(attn_mask=~_ALLOWED_BH.flatten(0, 1)),
        True,
    ),
}


def _cast(kwargs, dtype):
    return {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kwargs.items()}


def run_both(mode, dtype, bias, separate_kv=False, **extra):
    ours_kw, ref_kw, cross = MODES[mode]
    ours, ref = make_pair(dtype, bias)
    query, key, value = make_inputs(dtype)
    if not cross:
        key = value = query
    elif not separate_kv:
        value = key
    out = ours(query, None if not cross else key, None if not cross else value, **_cast(ours_kw, dtype), **extra)
    want = ref(query, key, value, **_cast(ref_kw, dtype), **extra)
    return out, want


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", list(MODES))
def test_output_matches_torch(mode, dtype, bias):
    (out, w), (out_ref, _) = run_both(mode, dtype, bias, need_weights=False)
    assert w is None
    assert out.dtype == dtype and out.shape == (B, L, D_MODEL)
    assert_close(out, out_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_with_separate_key_and_value_matches_torch(dtype):
    (out, _), (out_ref, _) = run_both("cross + key_mask", dtype, True, separate_kv=True, need_weights=False)
    assert_close(out, out_ref, dtype)


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["causal + key_mask", "cross + key_mask", "bool attn_mask (B, L, S)"])
def test_weights_match_torch(mode, dtype, average):
    (out, w), (out_ref, w_ref) = run_both(mode, dtype, True, need_weights=True, average_attn_weights=average)
    n_keys = S if MODES[mode][2] else L
    assert w.shape == ((B, L, n_keys) if average else (B, N_HEAD, L, n_keys))
    assert_close(out, out_ref, dtype)
    assert_close(w, w_ref, dtype)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), rtol=0, atol=ATOL[dtype] * 10)


@pytest.mark.parametrize("mode", ["causal + key_mask", "cross + key_mask"])
def test_gradients_match_autograd_through_torch(mode):
    ours, ref = make_pair(torch.float64)
    query, key, value = make_inputs(torch.float64, requires_grad=True)
    ours_kw, ref_kw, cross = MODES[mode]
    if cross:
        inputs, out = [query, key, value], ours(query, key, value, **ours_kw)[0]
        out_ref = ref(query, key, value, **ref_kw, need_weights=False)[0]
    else:
        inputs, out = [query], ours(query, **ours_kw)[0]
        out_ref = ref(query, query, query, **ref_kw, need_weights=False)[0]
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    ours_params = [ours.in_proj.weight, ours.in_proj.bias, ours.out_proj.weight, ours.out_proj.bias]
    ref_params = [ref.in_proj_weight, ref.in_proj_bias, ref.out_proj.weight, ref.out_proj.bias]
    grads = torch.autograd.grad((out * upstream).sum(), inputs + ours_params)
    grads_ref = torch.autograd.grad((out_ref * upstream).sum(), inputs + ref_params)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=GRAD_ATOL)


# ---------------------------------------------------------------- internal consistency


@pytest.mark.parametrize("mode", list(MODES))
def test_fast_path_equals_weights_path(mode):
    ours, _ = make_pair(torch.float64)
    query, key, _ = make_inputs(torch.float64)
    ours_kw, _, cross = MODES[mode]
    key = key if cross else None
    fast, none = ours(query, key, **ours_kw)
    slow, w = ours(query, key, need_weights=True, average_attn_weights=False, **ours_kw)
    assert none is None and w.shape == (B, N_HEAD, L, S if cross else L)
    assert_close(fast, slow, torch.float64)


def test_self_attention_path_equals_cross_attention_path_on_the_same_values():
    ours, _ = make_pair(torch.float64)
    query, _, _ = make_inputs(torch.float64)
    self_out, _ = ours(query, is_causal=True)
    cross_out, _ = ours(query, query.clone(), query.clone(), is_causal=True)  # not `is query`: cross path
    assert_close(self_out, cross_out, torch.float64)


def test_float_key_mask_equals_boolean():
    ours, _ = make_pair(torch.float64)
    query, _, _ = make_inputs(torch.float64)
    additive = torch.zeros(B, L, dtype=torch.float64).masked_fill(~KM_L, float("-inf"))  # 0 at real tokens
    for need_weights in (False, True):
        out_bool, _ = ours(query, key_mask=KM_L, attn_mask=_ALLOWED, need_weights=need_weights)
        out_float, _ = ours(query, key_mask=additive, attn_mask=_ALLOWED, need_weights=need_weights)
        assert_close(out_bool, out_float, torch.float64)


@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_query_gets_zero_attention(need_weights):
    ours, _ = make_pair(torch.float64)
    query, _, _ = make_inputs(torch.float64)
    allowed = torch.ones(L, L, dtype=torch.bool)
    allowed[2] = False  # query 2 may attend to nothing
    out, w = ours(query, attn_mask=allowed, need_weights=need_weights, average_attn_weights=False)
    assert torch.isfinite(out).all()
    assert_close(out[:, 2], ours.out_proj.bias.expand(B, D_MODEL), torch.float64)  # zero attention output
    if need_weights:
        assert torch.equal(w[:, :, 2], torch.zeros_like(w[:, :, 2]))


def test_mask_dtype_follows_query_dtype():
    ours, _ = make_pair(torch.float32)
    query, _, _ = make_inputs(torch.float32)
    out64_mask, _ = ours(query, attn_mask=_FLOAT)  # float64 mask, float32 query: cast
    out32_mask, _ = ours(query, attn_mask=_FLOAT.float())
    assert out64_mask.dtype == torch.float32
    assert torch.equal(out64_mask, out32_mask)


# ---------------------------------------------------------------- dropout and modes


def test_dropout_only_in_training():
    ours, _ = make_pair(torch.float64, dropout=0.5)
    query, _, _ = make_inputs(torch.float64)
    no_dropout, _ = make_pair(torch.float64, dropout=0.0)
    ours.eval()
    for need_weights in (False, True):
        a, _ = ours(query, is_causal=True, need_weights=need_weights)
        b, _ = no_dropout(query, is_causal=True, need_weights=need_weights)
        assert_close(a, b, torch.float64)  # eval: dropout is off
    ours.train()
    torch.manual_seed(0)
    a, _ = ours(query, is_causal=True)
    torch.manual_seed(1)
    c, _ = ours(query, is_causal=True)
    assert (a - b).abs().max() > 1e-3 and (a - c).abs().max() > 1e-3  # training: random, differs


def test_dropout_in_training_matches_torch_with_the_same_seed():
    for need_weights in (False, True):
        ours, ref = make_pair(torch.float64, dropout=0.3)
        ours.train(), ref.train()
        query, _, _ = make_inputs(torch.float64)
        torch.manual_seed(42)
        out, w = ours(query, key_mask=KM_L, need_weights=need_weights)
        torch.manual_seed(42)
        out_ref, w_ref = ref(query, query, query, key_padding_mask=~KM_L, need_weights=need_weights)
        assert_close(out, out_ref, torch.float64)
        if need_weights:  # the weights after dropout: zeros and 1 / (1 - p) rescaled entries
            assert_close(w, w_ref, torch.float64)


def test_dropout_weights_are_zeroed_and_rescaled():
    ours, _ = make_pair(torch.float64, dropout=0.5)
    query, _, _ = make_inputs(torch.float64)
    ours.eval()
    _, w_eval = ours(query, need_weights=True, average_attn_weights=False)
    ours.train()
    torch.manual_seed(0)
    _, w_train = ours(query, need_weights=True, average_attn_weights=False)
    kept = w_train != 0
    assert 0 < kept.float().mean() < 1
    assert_close(w_train[kept], 2.0 * w_eval[kept], torch.float64)


# ---------------------------------------------------------------- from_torch


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_copies_weights_dtype_dropout_and_mode(bias):
    ref = nn.MultiheadAttention(D_MODEL, N_HEAD, dropout=0.2, bias=bias, batch_first=True, dtype=torch.float64)
    ours = MultiHeadAttention.from_torch(ref)
    assert ours.training and ours.dropout == 0.2 and ours.in_proj.weight.dtype == torch.float64
    assert torch.equal(ours.in_proj.weight, ref.in_proj_weight)
    assert torch.equal(ours.out_proj.weight, ref.out_proj.weight)
    assert (ours.in_proj.bias is None) == (not bias) == (ours.out_proj.bias is None)
    assert ours.in_proj.weight.data_ptr() != ref.in_proj_weight.data_ptr()  # a copy, not shared
    assert not MultiHeadAttention.from_torch(ref.eval()).training


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: nn.Linear(4, 4), TypeError, "mha must be a torch.nn.MultiheadAttention, got Linear"),
        (lambda: nn.MultiheadAttention(12, 3), ValueError, "batch_first=True"),
        (lambda: nn.MultiheadAttention(12, 3, kdim=8, batch_first=True), ValueError, "kdim == vdim == embed_dim"),
        (lambda: nn.MultiheadAttention(12, 3, add_bias_kv=True, batch_first=True), ValueError, "add_bias_kv=False"),
        (lambda: nn.MultiheadAttention(12, 3, add_zero_attn=True, batch_first=True), ValueError, "add_zero_attn=False"),
    ],
)
def test_from_torch_errors(make, error, match):
    with pytest.raises(error, match="MultiHeadAttention.from_torch: .*" + match):
        MultiHeadAttention.from_torch(make())


# ---------------------------------------------------------------- forward: the masks and batch sizes are checked


@pytest.mark.parametrize("need_weights", [False, True])
def test_forward_checks_how_the_inputs_fit_together_and_leaves_the_rest_to_pytorch(need_weights):
    m = MultiHeadAttention(D_MODEL, N_HEAD)
    with pytest.raises(RuntimeError):  # a wrong width fails in the projection, with PyTorch's message
        m(torch.zeros(B, L, 8), need_weights=need_weights)
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward: key must have the batch size of query, "
                                         r"got query.shape=\(2, 5, 12\) and key.shape=\(3, 7, 12\)"):
        m(torch.zeros(B, L, D_MODEL), torch.zeros(3, S, D_MODEL), need_weights=need_weights)
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward: value must have the \(B, S\) of key, "
                                         r"got key.shape=\(2, 7, 12\) and value.shape=\(2, 6, 12\)"):
        m(torch.zeros(B, L, D_MODEL), torch.zeros(B, S, D_MODEL), torch.zeros(B, S - 1, D_MODEL), need_weights=need_weights)
    # key_mask's shape is checked (metadata); attn_mask's is left to PyTorch's kernels: never silent.
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward: key_mask must have shape \(B, S\) = \(2, 5\) "
                                         r".*got key_mask.shape=\(2, 6\)"):
        m(torch.zeros(B, L, D_MODEL), key_mask=torch.ones(B, L + 1, dtype=torch.bool), need_weights=need_weights)
    with pytest.raises((RuntimeError, ValueError)):
        m(torch.zeros(B, L, D_MODEL), attn_mask=torch.ones(L, L + 1, dtype=torch.bool), need_weights=need_weights)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_forward_refuses_inf_and_nan_in_float_masks(bad, need_weights):
    """A float mask is added to the scores: +inf or NaN would make the row NaN, so it is refused (on the CPU)."""
    m = MultiHeadAttention(D_MODEL, N_HEAD)
    x = make_inputs(torch.float32)[0]
    mask = torch.zeros(L, L)
    mask[2, 1] = bad
    with pytest.raises(ValueError, match=rf"MultiHeadAttention.forward: attn_mask must hold finite numbers or -inf "
                                         rf".*got {bad} at index \(2, 1\)"):
        m(x, attn_mask=mask, need_weights=need_weights)
    kpm = torch.zeros(B, L)
    kpm[1, 4] = bad
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward: key_mask must hold finite numbers"):
        m(x, key_mask=kpm, need_weights=need_weights)
    with pytest.raises(TypeError, match=r"MultiHeadAttention.forward: key_mask must be a bool or floating tensor, "
                                        r"got key_mask.dtype=torch.int64"):
        m(x, key_mask=torch.ones(B, L, dtype=torch.long), need_weights=need_weights)
    with pytest.raises(TypeError, match=r"MultiHeadAttention.forward: attn_mask must be a bool or floating tensor, "
                                        r"got attn_mask.dtype=torch.int64"):
        m(x, attn_mask=torch.ones(L, L, dtype=torch.long), need_weights=need_weights)
    with pytest.raises(ValueError, match=r"MultiHeadAttention.forward: key_mask must be on the device of query, "
                                         r"cpu, got key_mask.device=meta"):
        m(x, key_mask=torch.ones(B, L, dtype=torch.bool, device="meta"), need_weights=need_weights)


def test_float_mask_of_minus_inf_rows_gives_zero_output_not_nan():
    """The documented behaviour for a query with no key to attend to: zero weights, finite output."""
    m = MultiHeadAttention(D_MODEL, N_HEAD, bias=False)
    x = make_inputs(torch.float32)[0]
    mask = torch.zeros(L, L)
    mask[3] = float("-inf")
    out, weights = m(x, attn_mask=mask, need_weights=True)
    assert torch.isfinite(out).all()
    assert torch.equal(out[:, 3], torch.zeros_like(out[:, 3])) and torch.equal(weights[:, 3], torch.zeros_like(weights[:, 3]))
    out_fast, _ = m(x, attn_mask=mask)
    torch.testing.assert_close(out_fast, out)


def test_forward_accepts_other_float_dtypes_under_autocast():
    m = MultiHeadAttention(D_MODEL, N_HEAD)  # float32 weights
    x = make_inputs(torch.float32)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = m(x.bfloat16())
    assert out.dtype == torch.bfloat16 and out.shape == x.shape


@pytest.mark.parametrize("cross", [False, True])
def test_forward_uses_split_heads_and_merge_heads(monkeypatch, cross):
    calls = {"split_heads": 0, "merge_heads": 0}

    def counted(name):
        original = getattr(multihead, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)

        return wrapper

    for name in calls:
        monkeypatch.setattr(multihead, name, counted(name))
    query, key, value = make_inputs(torch.float32)
    m = MultiHeadAttention(D_MODEL, N_HEAD)
    m(query, key, value) if cross else m(query)
    assert calls == {"split_heads": 3 if cross else 1, "merge_heads": 1}  # self-attention: q, k, v in one call


def test_forward_is_traceable_by_torch_export():
    ours, _ = make_pair(torch.float32)
    query, key, _ = make_inputs(torch.float32)
    kwargs = {"key_mask": KM_S, "attn_mask": _ALLOWED_BH}
    exported = torch.export.export(ours, (query, key), kwargs)
    torch.testing.assert_close(exported.module()(query, key, **kwargs)[0], ours(query, key, **kwargs)[0], rtol=0, atol=0)


# ---------------------------------------------------------------- kv_cache (chapter 12)


PIECES = [(0, 4), (4, 5), (5, 7), (7, 8), (8, 11)]  # a prefix, single positions and blocks of 2 and 3


@pytest.mark.parametrize("need_weights", [False, True])
def test_kv_cache_in_pieces_equals_causal_attention_over_the_whole(need_weights, concat_cache):
    m, _ = make_pair()
    x = torch.randn(B, 11, D_MODEL, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    whole, w_whole = m(x, is_causal=True, need_weights=True, average_attn_weights=False)
    cache = concat_cache()
    for a, b in PIECES:
        out, w = m(x[:, a:b], is_causal=True, kv_cache=cache, need_weights=need_weights, average_attn_weights=False)
        assert_close(out, whole[:, a:b], torch.float64)
        if need_weights:  # the new queries see keys 0 .. b - 1, bottom-right aligned
            assert w.shape == (B, N_HEAD, b - a, b)
            assert_close(w, w_whole[:, :, a:b, :b], torch.float64)
    assert cache.k.shape == (B, N_HEAD, 11, D_MODEL // N_HEAD)


def test_kv_cache_with_an_attn_mask_and_key_padding_over_all_positions(concat_cache):
    m, _ = make_pair()
    T = 11
    x = torch.randn(B, T, D_MODEL, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    allowed = random_allowed(T, T)
    keys = torch.ones(B, T, dtype=torch.bool)
    keys[1, 2] = False  # sequence 1 ignores its position 2 (never the first key, so no row is empty)
    whole, _ = m(x, attn_mask=allowed, key_mask=keys, is_causal=True)
    cache = concat_cache()
    for a, b in PIECES:
        out, _ = m(x[:, a:b], attn_mask=allowed[a:b, :b], key_mask=keys[:, :b], is_causal=True, kv_cache=cache)
        assert_close(out, whole[:, a:b], torch.float64)


def test_kv_cache_without_is_causal_attends_to_every_stored_key(concat_cache):
    m, _ = make_pair()
    x = torch.randn(B, 6, D_MODEL, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    cache = concat_cache()
    m(x[:, :4], kv_cache=cache)
    out, _ = m(x[:, 4:], kv_cache=cache)
    assert_close(out, m(x)[0][:, 4:], torch.float64)


def test_kv_cache_with_cross_attention_is_refused(concat_cache):
    m = MultiHeadAttention(D_MODEL, N_HEAD)
    x, mem, _ = make_inputs(torch.float32)
    with pytest.raises(ValueError, match="MultiHeadAttention.forward: kv_cache works with self-attention only"):
        m(x, mem, kv_cache=concat_cache())


# ---------------------------------------------------------------- bfloat16 on a CPU: the matmul path
@pytest.mark.parametrize("is_causal", [False, True])
def test_matmul_attention_equals_sdpa_in_float64(is_causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ours = _matmul_attention(q, k, v, is_causal, 0.0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)
    go = torch.randn(ours.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(ours, (q, k, v), go)
    grads_ref = torch.autograd.grad(ref, (q, k, v), go)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_the_bfloat16_probe_reads_the_processor():
    expected = any(getattr(torch.cpu, probe, lambda: False)()
                   for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    assert multihead.cpu_has_bfloat16_matmul() is expected


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("bfloat16_matmul", [False, True], ids=["fused kernel", "two matmuls"])
def test_bfloat16_on_cpu_matches_float32(is_causal, autocast, bfloat16_matmul, monkeypatch):
    # Both answers of the probe, whichever this CPU gives: the fused kernel and the two matmuls.
    monkeypatch.setattr(multihead, "cpu_has_bfloat16_matmul", lambda: bfloat16_matmul)
    calls = []
    monkeypatch.setattr(multihead, "_matmul_attention", lambda *a: calls.append(1) or _matmul_attention(*a))
    # bfloat16 keeps 8 bits of mantissa: relative error about 4e-3 per rounding; outputs of order 1.
    mha32, _ = make_pair(torch.float32)
    x = make_inputs(torch.float32)[0]
    ref = mha32(x, is_causal=is_causal)[0]
    if autocast:  # a float32 module under torch.autocast: the projections run in bfloat16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = mha32(x, is_causal=is_causal)[0]
    else:
        mha16, _ = make_pair(torch.float32)
        out = mha16.to(torch.bfloat16)(x.to(torch.bfloat16), is_causal=is_causal)[0]
    assert out.dtype == torch.bfloat16 and len(calls) == bfloat16_matmul  # the path the probe chose
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)


def test_bfloat16_with_a_padding_mask_still_matches_float32():
    mha32, _ = make_pair(torch.float32)
    x = make_inputs(torch.float32)[0]
    pad = padding_mask([L, 3], L)
    ref = mha32(x, key_mask=pad, is_causal=True)[0]
    out = mha32.to(torch.bfloat16)(x.to(torch.bfloat16), key_mask=pad, is_causal=True)[0]
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)


def test_bfloat16_dropout_only_in_training_and_seeded():
    mha, _ = make_pair(torch.float32, dropout=0.5)
    mha = mha.to(torch.bfloat16)
    x = make_inputs(torch.bfloat16)[0]
    evaluated = mha.eval()(x, is_causal=True)[0]
    mha.train()
    torch.manual_seed(7)
    a = mha(x, is_causal=True)[0]
    torch.manual_seed(7)
    b = mha(x, is_causal=True)[0]
    assert torch.equal(a, b) and not torch.allclose(a, evaluated)


# ---------------------------------------------------------------- causality: a future input changes no earlier output


def largest_change_before(forward, T=7, seed=0):
    """Change the input at each position t in turn; the largest change of an output at a position < t."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D_MODEL, generator=g, dtype=torch.float64)
    y = forward(x)
    worst = 0.0
    for t in range(1, T):
        changed = x.clone()
        changed[:, t] = torch.randn(B, D_MODEL, generator=g, dtype=torch.float64)
        worst = max(worst, (forward(changed)[:, :t] - y[:, :t]).abs().max().item())
    return worst


@pytest.mark.parametrize("need_weights", [False, True])
def test_is_causal_output_ignores_future_inputs(need_weights):
    ours, _ = make_pair(torch.float64)
    assert largest_change_before(lambda x: ours(x, is_causal=True, need_weights=need_weights)[0]) <= 1e-12
    # the weights of a query put nothing on later keys, so they too ignore a later input
    if need_weights:
        weights = lambda x: ours(x, is_causal=True, need_weights=True, average_attn_weights=False)[1].transpose(1, 2)  # (B, L, h, S)
        assert largest_change_before(weights) <= 1e-12
    # and the test can fail: without is_causal a later input does change earlier outputs
    assert largest_change_before(lambda x: ours(x, need_weights=need_weights)[0]) > 1e-3


def test_is_causal_through_a_kv_cache_ignores_future_inputs(concat_cache):
    ours, _ = make_pair(torch.float64)

    def in_pieces(x):  # the sequence fed as 3, 1 and 3 positions through a fresh cache
        cache, outs, start = concat_cache(), [], 0
        for n in (3, 1, 3):
            outs.append(ours(x[:, start : start + n], is_causal=True, kv_cache=cache)[0])
            start += n
        return torch.cat(outs, dim=1)

    assert largest_change_before(in_pieces) <= 1e-12
