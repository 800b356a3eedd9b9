"""Unit tests for transformer_lib.gpt2 (chapter 7), against Hugging Face transformers' GPT-2.

Every model here is a small GPT-2 with random weights built offline by transformers; no test
touches the network.
"""

import ast
import copy
import hashlib
import inspect
import re
from types import SimpleNamespace

import pytest
import safetensors.torch
import torch

import transformer_lib.gpt2 as gpt2_module
from transformer_lib.config import GPT_PRESETS, GPTConfig
from transformer_lib.gpt import GPT
from transformer_lib.gpt2 import (
    GPT2_CHECKPOINTS,
    HF_CONV1D_WEIGHTS,
    gpt2_config_from_hf,
    hf_gpt2_key_map,
    load_gpt2_weights,
    load_hf_gpt2_state_dict,
)
from transformer_lib.hub import DATA_ENV, GPT2_REVISION, PINNED_FILES


def hf_transformers():
    """The reference implementation; a test that needs it is skipped where it is not installed."""
    return pytest.importorskip("transformers")


# float32: the two implementations order their sums differently (logits of a few units);
# float64: the same argument at 1e-16, with a wide margin.
ATOL = {torch.float32: 1e-5, torch.float64: 1e-10}
N_LAYER, N_HEAD, N_EMBD, N_POS, VOCAB = 2, 4, 64, 128, 512


def small_hf_config(**overrides):
    kwargs = dict(
        n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, n_positions=N_POS, vocab_size=VOCAB,
        initializer_range=0.125, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
    )
    return hf_transformers().GPT2Config(**{**kwargs, **overrides})


def small_hf_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return hf_transformers().GPT2LMHeadModel(small_hf_config(**overrides)).eval()


def our_config(**overrides):
    kwargs = dict(n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, block_size=N_POS, vocab_size=VOCAB,
                  activation="gelu_tanh")
    return GPTConfig(**{**kwargs, **overrides})


@pytest.fixture(scope="module")
def hf():
    return small_hf_model()


@pytest.fixture(scope="module")
def hf_sd(hf):
    return {k: v.clone() for k, v in hf.state_dict().items()}


@pytest.fixture(scope="module")
def idx():
    return torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(1))


def params_equal(a, b):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


@torch.no_grad()
def greedy(next_logits, idx, n):
    for _ in range(n):
        idx = torch.cat([idx, next_logits(idx)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


# ---------------------------------------------------------------- constants and the key map


def test_constants_pin_one_revision():
    assert re.fullmatch(r"[0-9a-f]{40}", GPT2_REVISION)
    small = PINNED_FILES[GPT2_CHECKPOINTS["gpt2"]]
    assert GPT2_CHECKPOINTS["gpt2"] == "gpt2-124M.safetensors" and re.fullmatch(r"[0-9a-f]{64}", small.sha256)
    assert small.url == f"https://huggingface.co/openai-community/gpt2/resolve/{GPT2_REVISION}/model.safetensors"
    assert small.revision == GPT2_REVISION
    assert HF_CONV1D_WEIGHTS == ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def test_checkpoints_are_the_four_gpt2_presets():
    assert list(GPT2_CHECKPOINTS) == ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]
    assert set(GPT2_CHECKPOINTS) <= set(GPT_PRESETS)
    filenames = list(GPT2_CHECKPOINTS.values())
    assert len(set(filenames)) == 4 and all(f.endswith(".safetensors") for f in filenames)
    for name, key in GPT2_CHECKPOINTS.items():
        pin = PINNED_FILES[key]
        assert pin.url.startswith(f"https://huggingface.co/openai-community/{name}/resolve/")
        assert re.fullmatch(r"[0-9a-f]{40}", pin.revision)
        assert pin.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", pin.sha256)
    assert PINNED_FILES[GPT2_CHECKPOINTS["gpt2-medium"]].sha256 and PINNED_FILES[GPT2_CHECKPOINTS["gpt2-xl"]].sha256
    assert PINNED_FILES[GPT2_CHECKPOINTS["gpt2-large"]].sha256 is None  # not pinned: needs sha256=, see below


@pytest.mark.parametrize("n_layer", [1, 3])
def test_key_map_pairs_hf_names_with_our_parameters(n_layer):
    key_map = hf_gpt2_key_map(n_layer)
    assert len(key_map) == 12 * n_layer + 4
    assert all(k.startswith("transformer.") for k in key_map)
    assert key_map["transformer.wte.weight"] == "wte.weight"
    assert key_map["transformer.wpe.weight"] == "wpe.weight"
    assert key_map[f"transformer.h.{n_layer - 1}.attn.c_attn.weight"] == f"blocks.{n_layer - 1}.attn.in_proj.weight"
    assert key_map["transformer.h.0.attn.c_proj.bias"] == "blocks.0.attn.out_proj.bias"
    assert key_map["transformer.h.0.mlp.c_fc.weight"] == "blocks.0.mlp.fc1.weight"
    assert key_map["transformer.h.0.mlp.c_proj.weight"] == "blocks.0.mlp.fc2.weight"
    assert key_map["transformer.h.0.ln_2.bias"] == "blocks.0.ln2.bias"
    assert key_map["transformer.ln_f.weight"] == "ln_f.weight"
    # Exactly the parameters of both models: ours (the tied head once), theirs without lm_head.
    ours = GPT(our_config(n_layer=n_layer))
    assert sorted(key_map.values()) == sorted(name for name, _ in ours.named_parameters())
    theirs = hf_transformers().GPT2LMHeadModel(small_hf_config(n_layer=n_layer))
    assert set(key_map) == set(theirs.state_dict()) - {"lm_head.weight"}


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (True, TypeError), (2.0, TypeError)])
def test_key_map_rejects_bad_n_layer(bad, error):
    with pytest.raises(error, match="hf_gpt2_key_map: n_layer"):
        hf_gpt2_key_map(bad)


# ---------------------------------------------------------------- conversion


def test_from_hf_copies_every_tensor_exactly(hf, hf_sd):
    model = GPT.from_hf(hf.state_dict(), our_config())
    assert isinstance(model, GPT)
    params = dict(model.named_parameters())
    for hf_key, ours in hf_gpt2_key_map(N_LAYER).items():
        expected = hf_sd[hf_key].T if hf_key.endswith(HF_CONV1D_WEIGHTS) else hf_sd[hf_key]
        assert torch.equal(params[ours], expected), hf_key
    assert model.lm_head.weight is model.wte.weight
    assert torch.equal(model.lm_head.weight, hf_sd["lm_head.weight"])


def test_from_hf_reads_a_model_or_a_state_dict_with_its_config(hf):
    from_model = GPT.from_hf(hf)
    assert from_model.config == gpt2_config_from_hf(hf.config) and not from_model.training
    assert params_equal(from_model, GPT.from_hf(hf.state_dict(), gpt2_config_from_hf(hf.config)))
    double = GPT.from_hf(copy.deepcopy(hf).to(torch.float64))
    assert double.wte.weight.dtype == torch.float64  # the checkpoint's dtype
    with pytest.raises(TypeError, match="GPT.from_hf: config is required with a state dict"):
        GPT.from_hf(hf.state_dict())
    with pytest.raises(TypeError, match="GPT.from_hf: model must be a transformers GPT-2 model or its state dict, got str"):
        GPT.from_hf("gpt2")


@pytest.mark.parametrize("dtype", list(ATOL))
def test_logits_equal_transformers(dtype, idx):
    hf = small_hf_model()
    model = GPT.from_hf(hf.state_dict(), gpt2_config_from_hf(hf.config)).eval()
    hf, model = hf.to(dtype), model.to(dtype)
    with torch.no_grad():
        ours, ref = model(idx)[0], hf(idx).logits
    assert ours.shape == (3, 40, VOCAB) and ours.dtype == dtype
    torch.testing.assert_close(ours, ref, rtol=0, atol=ATOL[dtype])


def test_loss_equals_transformers(hf, idx):
    model = GPT.from_hf(hf.state_dict(), our_config()).eval()
    with torch.no_grad():
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
        ref = hf(idx, labels=idx).loss  # transformers shifts the labels itself
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-5)


def test_float32_checkpoint_loads_into_float64_model(hf, idx):
    model = GPT(our_config()).double().eval()
    load_hf_gpt2_state_dict(model, hf.state_dict())
    assert model.wte.weight.dtype == torch.float64
    hf64 = small_hf_model().double()
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf64(idx).logits, rtol=0, atol=ATOL[torch.float64])


def test_greedy_tokens_identical(hf, idx):
    model = GPT.from_hf(hf.state_dict(), our_config()).eval()
    prompt = idx[:, :6]
    ours = greedy(lambda x: model(x)[0], prompt, 20)
    ref = greedy(lambda x: hf(x).logits, prompt, 20)
    assert ours.shape == (3, 26)
    assert torch.equal(ours, ref)


def test_exact_gelu_gives_different_logits(hf, idx):
    tanh = GPT.from_hf(hf.state_dict(), our_config()).eval()
    exact = GPT.from_hf(hf.state_dict(), our_config(activation="gelu")).eval()
    with torch.no_grad():
        assert (tanh(idx)[0] - exact(idx)[0]).abs().max() > 10 * ATOL[torch.float32]


def test_keys_without_prefix_and_buffers_are_accepted(hf, hf_sd):
    """The layout of the Hub's model.safetensors: no prefix, no lm_head, mask buffers per block."""
    raw = {k.removeprefix("transformer."): v for k, v in hf_sd.items() if k != "lm_head.weight"}
    for i in range(N_LAYER):
        raw[f"h.{i}.attn.bias"] = torch.ones(N_POS, N_POS).tril().view(1, 1, N_POS, N_POS)
        raw[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    assert params_equal(GPT.from_hf(raw, our_config()), GPT.from_hf(hf_sd, our_config()))


def test_gpt2model_state_dict_loads(hf):
    """GPT2Model (no LM head) names its tensors without the prefix."""
    raw = hf.transformer.state_dict()
    assert "wte.weight" in raw
    assert params_equal(GPT.from_hf(raw, our_config()), GPT.from_hf(hf.state_dict(), our_config()))


# ---------------------------------------------------------------- loader errors


def test_missing_keys_are_listed(hf_sd):
    sd = {k: v for k, v in hf_sd.items() if k != "transformer.h.1.mlp.c_fc.bias"}
    with pytest.raises(ValueError, match=r"no value for 1 parameters.*blocks\.1\.mlp\.fc1\.bias"):
        GPT.from_hf(sd, our_config())


def test_unexpected_keys_are_listed(hf_sd):
    sd = {**hf_sd, "transformer.h.0.attn.q_attn.weight": torch.zeros(N_EMBD, N_EMBD)}
    with pytest.raises(ValueError, match=r"1 keys that are not parameters.*transformer\.h\.0\.attn\.q_attn\.weight"):
        GPT.from_hf(sd, our_config())


def test_extra_blocks_are_unexpected_and_absent_blocks_missing(hf_sd):
    with pytest.raises(ValueError, match=r"12 keys that are not parameters of a GPT-2 with n_layer=1.*transformer\.h\.1\.ln_1\.weight"):
        GPT.from_hf(hf_sd, our_config(n_layer=1))
    with pytest.raises(ValueError, match=r"no value for 12 parameters.*blocks\.2\.ln1\.weight"):
        GPT.from_hf(hf_sd, our_config(n_layer=3))


def test_shape_mismatch_names_key_and_both_shapes(hf_sd):
    with pytest.raises(ValueError, match=re.escape("transformer.wte.weight -> wte.weight: ours (512, 32), the checkpoint's (512, 64)")):
        GPT.from_hf(hf_sd, our_config(n_embd=32))


def test_shape_mismatch_after_transpose_is_described(hf_sd):
    sd = dict(hf_sd)
    sd["transformer.h.0.mlp.c_fc.weight"] = hf_sd["transformer.h.0.mlp.c_fc.weight"].T  # already transposed
    with pytest.raises(ValueError, match=re.escape(
        "transformer.h.0.mlp.c_fc.weight -> blocks.0.mlp.fc1.weight: ours (256, 64), "
        "the checkpoint's (64, 256) after the Conv1D transpose"
    )):
        GPT.from_hf(sd, our_config())


def test_failed_load_leaves_model_unchanged(hf_sd):
    model = GPT(our_config())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sd = {k: v for k, v in hf_sd.items() if k != "transformer.ln_f.bias"}
    with pytest.raises(ValueError, match="ln_f.bias"):
        load_hf_gpt2_state_dict(model, sd)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bias_false_config_is_rejected(hf_sd):
    with pytest.raises(ValueError, match="model.config.bias must be True"):
        GPT.from_hf(hf_sd, our_config(bias=False))


def test_untied_head_is_rejected(hf_sd):
    sd = {**hf_sd, "lm_head.weight": hf_sd["lm_head.weight"] + 1.0}
    with pytest.raises(ValueError, match=r"lm_head\.weight.*differs from the token embedding"):
        GPT.from_hf(sd, our_config())


def test_same_tensor_under_two_names_is_rejected(hf_sd):
    sd = {**hf_sd, "wpe.weight": hf_sd["transformer.wpe.weight"]}
    with pytest.raises(ValueError, match=r"holds 'wpe\.weight' twice"):
        GPT.from_hf(sd, our_config())


def test_loader_type_errors(hf_sd):
    with pytest.raises(TypeError, match="load_hf_gpt2_state_dict: model must be"):
        load_hf_gpt2_state_dict(torch.nn.Linear(2, 2), hf_sd)
    with pytest.raises(TypeError, match="load_hf_gpt2_state_dict: state_dict must be a mapping"):
        load_hf_gpt2_state_dict(GPT(our_config()), list(hf_sd.items()))
    with pytest.raises(TypeError, match=r"state_dict\['transformer\.wte\.weight'\] must be a floating tensor, got ndarray"):
        load_hf_gpt2_state_dict(GPT(our_config()), {**hf_sd, "transformer.wte.weight": hf_sd["transformer.wte.weight"].numpy()})
    with pytest.raises(TypeError, match="keys of state_dict must be str"):
        load_hf_gpt2_state_dict(GPT(our_config()), {**hf_sd, 3: torch.zeros(1)})


# ---------------------------------------------------------------- gpt2_config_from_hf


@pytest.mark.parametrize("hf_act, ours", [("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu")])
def test_config_from_hf_maps_fields_and_activation(hf_act, ours):
    cfg = gpt2_config_from_hf(small_hf_config(activation_function=hf_act, layer_norm_epsilon=1e-6))
    assert cfg == GPTConfig(n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, block_size=N_POS, vocab_size=VOCAB,
                            dropout=0.0, bias=True, activation=ours, layer_norm_eps=1e-6)


def test_config_from_hf_of_gpt2_defaults_is_the_gpt2_preset():
    assert gpt2_config_from_hf(hf_transformers().GPT2Config()) == GPTConfig.from_preset("gpt2")


def test_config_from_hf_is_duck_typed():
    fake = SimpleNamespace(n_layer=1, n_head=2, n_embd=8, n_positions=16, vocab_size=10,
                           activation_function="gelu_new", layer_norm_epsilon=1e-5)
    assert gpt2_config_from_hf(fake) == GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=16, vocab_size=10,
                                                  activation="gelu_tanh")


def test_config_from_hf_rejects_unknown_activation():
    with pytest.raises(ValueError, match="gpt2_config_from_hf: hf_config.activation_function must be one of .*got activation_function='relu'"):
        gpt2_config_from_hf(small_hf_config(activation_function="relu"))


def test_config_from_hf_requires_the_attributes():
    with pytest.raises(TypeError, match="gpt2_config_from_hf: .* without n_positions, layer_norm_epsilon"):
        gpt2_config_from_hf(SimpleNamespace(n_layer=1, n_head=2, n_embd=8, vocab_size=10, activation_function="gelu"))


@pytest.mark.parametrize("override, name", [
    (dict(n_inner=100), "n_inner=100"),
    (dict(scale_attn_weights=False), "scale_attn_weights=False"),
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings=False"),
])
def test_config_from_hf_rejects_variants_gpt_does_not_compute(override, name):
    with pytest.raises(ValueError, match=f"gpt2_config_from_hf: GPT computes GPT-2's original architecture .*got {name}"):
        gpt2_config_from_hf(small_hf_config(**override))


def test_config_from_hf_accepts_explicit_default_n_inner():
    assert gpt2_config_from_hf(small_hf_config(n_inner=4 * N_EMBD)) == our_config()


# ---------------------------------------------------------------- the weights file (no network)


def hub_layout(hf_sd):
    """The tensors of ``hf_sd`` in the layout of the Hub's model.safetensors: no prefix, no head, mask buffers."""
    raw = {k.removeprefix("transformer."): v.contiguous() for k, v in hf_sd.items() if k != "lm_head.weight"}
    for i in range(N_LAYER):
        raw[f"h.{i}.attn.bias"] = torch.ones(1, 1, N_POS, N_POS).tril()
    return raw


@pytest.fixture
def fake_gpt2_file(tmp_path, monkeypatch, hf_sd):
    """A small GPT-2 saved as the "gpt2" checkpoint, with that checkpoint and preset pointing at it."""
    file = tmp_path / GPT2_CHECKPOINTS["gpt2"]
    safetensors.torch.save_file(hub_layout(hf_sd), str(file))
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    monkeypatch.setitem(PINNED_FILES, file.name, PINNED_FILES[file.name]._replace(sha256=digest))
    monkeypatch.setitem(GPT_PRESETS, "gpt2", {**GPT_PRESETS["gpt2"], **our_config().to_dict()})
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    return file


def test_load_gpt2_weights_reads_the_verified_file(fake_gpt2_file, hf_sd):
    for loaded in (load_gpt2_weights("gpt2"), load_gpt2_weights(path=fake_gpt2_file)):
        raw = hub_layout(hf_sd)
        assert loaded.keys() == raw.keys() and all(torch.equal(loaded[k], raw[k]) for k in raw)
        assert params_equal(GPT.from_hf(loaded, our_config()), GPT.from_hf(hf_sd, our_config()))


def test_from_pretrained_by_name_equals_transformers(fake_gpt2_file, hf, idx):
    rng = torch.get_rng_state()
    model = GPT.from_pretrained("gpt2")
    assert torch.equal(torch.get_rng_state(), rng)  # the random initialisation did not touch the global RNG
    assert not model.training and model.config == our_config()
    assert model.lm_head.weight is model.wte.weight
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(idx).logits, rtol=0, atol=ATOL[torch.float32])


def test_load_gpt2_weights_rejects_a_file_with_the_wrong_checksum(tmp_path):
    (tmp_path / "gpt2-124M.safetensors").write_bytes(b"not the GPT-2 weights")
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_gpt2_weights(path=tmp_path)
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_gpt2_weights("gpt2", tmp_path / "gpt2-124M.safetensors")


def test_load_gpt2_weights_offline_override_without_the_file(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="gpt2-124M.safetensors"):
        load_gpt2_weights(path=tmp_path)
    with pytest.raises(FileNotFoundError, match="gpt2-medium-355M.safetensors"):
        load_gpt2_weights("gpt2-medium", path=tmp_path)
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=DATA_ENV):
        load_gpt2_weights()
    with pytest.raises(FileNotFoundError, match=DATA_ENV):
        GPT.from_pretrained("gpt2-xl")


def test_load_gpt2_weights_name_errors(tmp_path):
    with pytest.raises(ValueError, match=r"load_gpt2_weights: name must be one of 'gpt2', 'gpt2-medium'.*got name='gpt3'"):
        load_gpt2_weights("gpt3")
    unpinned = (r"load_gpt2_weights: the book pins no SHA-256 digest for name='gpt2-large' "
                r"\(only for 'gpt2', 'gpt2-medium', 'gpt2-xl'\).*pass sha256=.*openai-community/gpt2-large/resolve/")
    with pytest.raises(ValueError, match=unpinned):
        load_gpt2_weights("gpt2-large", path=tmp_path)
    with pytest.raises(ValueError, match=unpinned):
        GPT.from_pretrained("gpt2-large")
    with pytest.raises(ValueError, match=r"sha256='0+' differs from the digest pinned for name='gpt2'"):
        load_gpt2_weights("gpt2", path=tmp_path, sha256="0" * 64)
    with pytest.raises(TypeError, match="load_gpt2_weights: sha256 must be a str or None, got int"):
        load_gpt2_weights("gpt2-large", path=tmp_path, sha256=1)


def test_load_gpt2_weights_unpinned_size_verified_against_the_callers_digest(tmp_path, hf_sd):
    file = tmp_path / GPT2_CHECKPOINTS["gpt2-large"]
    safetensors.torch.save_file(hub_layout(hf_sd), str(file))
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    loaded = load_gpt2_weights("gpt2-large", path=tmp_path, sha256=digest.upper())
    assert set(loaded) == set(hub_layout(hf_sd)) and torch.equal(loaded["wte.weight"], hf_sd["transformer.wte.weight"])
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_gpt2_weights("gpt2-large", path=file, sha256="0" * 64)
    assert PINNED_FILES[GPT2_CHECKPOINTS["gpt2-large"]].sha256 is None    # the caller's digest pinned nothing


def test_module_imports_the_config_not_the_model_and_not_transformers():
    tree = ast.parse(inspect.getsource(gpt2_module))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in imported if m.split(".")[0] == "transformers"], imported
    assert "transformer_lib.config" in imported and "transformer_lib.gpt" not in imported
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    local = [f.name for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not local, f"function-local imports in {local}"
