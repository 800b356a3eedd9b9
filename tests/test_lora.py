"""Unit tests for transformer_lib.lora (chapter 23): LoRALinear, apply_lora and merge_lora, against peft."""

import copy

import pytest
import torch
from torch import nn

from transformer_lib.config import GPTConfig, LlamaConfig
from transformer_lib.gpt import GPT
from transformer_lib.llama import Llama
from transformer_lib.lora import LoRALinear, apply_lora, merge_lora

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def hf_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                      num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).eval()


def randomize_b(model, seed=1):
    """Give every LoRA B a non-zero value, so that the update matters."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.lora_B.weight.data.copy_(0.1 * torch.randn(m.lora_B.weight.shape, generator=g))


def test_starts_equal_to_base_and_freezes_it():
    base = nn.Linear(20, 12)
    layer = LoRALinear(base, r=4, alpha=8)
    x = torch.randn(3, 5, 20)
    assert torch.equal(layer(x), base(x))
    assert layer.scaling == 2.0 and not base.weight.requires_grad and not base.bias.requires_grad
    assert layer.lora_A.weight.shape == (4, 20) and layer.lora_B.weight.shape == (12, 4)
    assert layer.lora_A.weight.abs().sum() > 0 and not layer.lora_B.weight.any()


def test_gradients_match_the_formulas():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(10, 6, bias=False), r=3, alpha=6)
    nn.init.normal_(layer.lora_B.weight)
    x, g = torch.randn(7, 10, dtype=torch.float64), torch.randn(7, 6, dtype=torch.float64)
    layer.double()
    layer(x).backward(g)
    A, B = layer.lora_A.weight, layer.lora_B.weight
    torch.testing.assert_close(B.grad, layer.scaling * g.T @ (x @ A.T), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(A.grad, layer.scaling * B.T @ g.T @ x, rtol=1e-12, atol=1e-12)


def test_merge_is_the_same_function():
    torch.manual_seed(0)
    model = apply_lora(GPT(GPTConfig.from_preset("tiny")), r=2, alpha=4, target_modules=["in_proj", "fc2"])
    randomize_b(model)
    x = torch.randint(0, 65, (2, 9))
    before = model(x)[0]
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(model(x)[0], before, rtol=0, atol=1e-5)


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["o_proj", "down_proj", "gate_proj"]])
def test_against_peft(targets):
    hf = hf_llama()
    ours = apply_lora(Llama.from_hf(hf).eval(), r=3, alpha=7, target_modules=targets)
    randomize_b(ours)
    theirs = peft.get_peft_model(copy.deepcopy(hf), peft.LoraConfig(r=3, lora_alpha=7, target_modules=targets))
    ours_by_name = {n: m for n, m in ours.named_modules() if isinstance(m, LoRALinear)}
    copied = 0
    for name, module in theirs.named_modules():
        if isinstance(getattr(module, "lora_A", None), nn.ModuleDict):
            layer, kind = int(name.split("layers.")[1].split(".")[0]), name.rsplit(".", 1)[1]
            group = "attn" if kind in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            mine = ours_by_name[f"blocks.{layer}.{group}.{kind}"]
            module.lora_A["default"].weight.data.copy_(mine.lora_A.weight)
            module.lora_B["default"].weight.data.copy_(mine.lora_B.weight)
            assert module.scaling["default"] == mine.scaling
            copied += 1
    assert copied == len(ours_by_name) == 2 * len(targets)
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], theirs(ids).logits, rtol=0, atol=1e-5)
    trainable = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)
    assert trainable(ours) == trainable(theirs) > 0
    merged = theirs.merge_and_unload()
    merge_lora(ours)
    for i in range(2):
        for kind in targets:
            group, hf_group = ("attn", "self_attn") if kind.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else ("mlp", "mlp")
            w_ours = getattr(getattr(ours.blocks[i], group), kind).weight
            w_theirs = getattr(getattr(merged.model.layers[i], hf_group), kind).weight
            torch.testing.assert_close(w_ours, w_theirs, rtol=0, atol=1e-6)


def test_only_lora_parameters_train():
    model = apply_lora(GPT(GPTConfig.from_preset("tiny")), r=2, alpha=2, target_modules=["in_proj"])
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names == {f"blocks.{i}.attn.in_proj.lora_{ab}.weight" for i in range(2) for ab in "AB"}


def test_save_pretrained_of_an_unmerged_model_writes_the_merged_one(tmp_path):
    torch.manual_seed(0)
    model = apply_lora(GPT(GPTConfig.from_preset("tiny")).eval(), r=2, alpha=4, target_modules=["in_proj"])
    randomize_b(model)
    x = torch.randint(0, 65, (2, 9))
    expected = model(x)[0]
    model.save_pretrained(tmp_path / "saved")
    assert any(isinstance(m, LoRALinear) for m in model.modules())  # the model itself stays unmerged
    loaded = GPT.from_pretrained(tmp_path / "saved")
    torch.testing.assert_close(loaded(x)[0], expected, rtol=0, atol=1e-5)


def test_training_checkpoint_of_an_unmerged_model_round_trips_and_a_merged_model_saves(tmp_path):
    """save_checkpoint/load_checkpoint keep the adapters (base and lora_ weights, AdamW state of the trained
    ones); after merge_lora the model is a plain GPT and save_pretrained writes it unchanged."""
    from transformer_lib.checkpoint import load_checkpoint, save_checkpoint
    from transformer_lib.config import TrainConfig

    def adapted():
        torch.manual_seed(0)
        return apply_lora(GPT(GPTConfig.from_preset("tiny")).eval(), r=2, alpha=4, target_modules=["in_proj", "fc1"])

    model = adapted()
    randomize_b(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    x = torch.randint(0, 65, (2, 9))
    model(x)[0].sum().backward()
    optimizer.step()
    save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=optimizer, step=1, model_config=model.config,
                    train_config=TrainConfig(max_steps=2, eval_interval=1, warmup_steps=0),
                    generator=torch.Generator().manual_seed(0))
    fresh = adapted()
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-3)
    load_checkpoint(tmp_path / "ckpt.pt", model=fresh, optimizer=fresh_opt)
    assert torch.equal(fresh(x)[0], model(x)[0])
    assert any(k.endswith("lora_B.weight") for k in fresh.state_dict())
    merged = merge_lora(fresh)
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    merged.save_pretrained(tmp_path / "merged")
    torch.testing.assert_close(GPT.from_pretrained(tmp_path / "merged")(x)[0], model(x)[0], rtol=0, atol=1e-5)


def test_lora_on_a_meta_device_model_allocates_nothing():
    with torch.device("meta"):
        model = Llama(LlamaConfig())
    apply_lora(model, r=8, alpha=16, target_modules=["q_proj", "v_proj"])
    c = LlamaConfig()
    kv = c.n_kv_head * (c.n_embd // c.n_head)
    expected = c.n_layer * 8 * ((c.n_embd + c.n_embd) + (c.n_embd + kv))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(r=0, alpha=1), ValueError, "r must be an int in [1, 6]"),
    (dict(r=7, alpha=1), ValueError, "r must be an int in [1, 6]"),
    (dict(r=2, alpha=0), ValueError, "alpha must be"),
    (dict(r=2, alpha=1, dropout=1.0), ValueError, "dropout must be"),
    (dict(r=2.0, alpha=1), TypeError, "r must be an int"),
])
def test_lora_linear_refuses_bad_arguments(kwargs, error, words):
    with pytest.raises(error, match=None) as info:
        LoRALinear(nn.Linear(6, 8), **kwargs)
    assert words in str(info.value) and str(info.value).startswith("LoRALinear:")


def test_lora_linear_refuses_a_non_linear_base():
    with pytest.raises(TypeError, match="base must be an nn.Linear, got base=Conv1d"):
        LoRALinear(nn.Conv1d(3, 3, 1), r=1, alpha=1)


def test_apply_lora_refuses_bad_targets():
    with pytest.raises(ValueError, match=r"target_modules must select at least one nn.Linear.*in_proj"):
        apply_lora(GPT(GPTConfig.from_preset("tiny")), r=2, alpha=2, target_modules=["q_proj"])
    with pytest.raises(TypeError, match="target_modules must be a list of str"):
        apply_lora(GPT(GPTConfig.from_preset("tiny")), r=2, alpha=2, target_modules="in_proj")
    with pytest.raises(ValueError, match="at least one layer"):
        apply_lora(GPT(GPTConfig.from_preset("tiny")), r=2, alpha=2, target_modules=[])
    model = apply_lora(GPT(GPTConfig.from_preset("tiny")), r=2, alpha=2, target_modules=["in_proj"])
    with pytest.raises(ValueError, match="already adapted"):
        apply_lora(model, r=2, alpha=2, target_modules=["in_proj"])


def test_apply_lora_refuses_a_tied_output_layer_and_adapts_an_untied_one():
    """A tied lm_head shares wte's tensor: merging would write the update into the embedding, so apply_lora
    refuses it (before changing anything); an untied lm_head is adapted, and the model still runs and merges."""
    tied = GPT(GPTConfig.from_preset("tiny", vocab_size=65))
    assert tied.lm_head.weight is tied.wte.weight
    with pytest.raises(ValueError, match=r"lm_head\.weight is tied to wte\.weight.*target_modules=\['lm_head'\]"
                                         r".*train_token_rows"):
        apply_lora(tied, r=2, alpha=4, target_modules=["lm_head"])
    assert not any(isinstance(m, LoRALinear) for m in tied.modules()) and tied.wte.weight.requires_grad
    torch.manual_seed(0)
    untied = apply_lora(GPT(GPTConfig.from_preset("tiny", vocab_size=65, tie_embeddings=False)).eval(), r=2, alpha=4,
                        target_modules=["lm_head"])
    assert isinstance(untied.lm_head, LoRALinear) and untied.lm_head.weight is untied.lm_head.base.weight
    randomize_b(untied)
    x = torch.randint(0, 65, (2, 9))
    before = untied(x)[0]
    merge_lora(untied)
    torch.testing.assert_close(untied(x)[0], before, rtol=0, atol=1e-5)


def test_apply_lora_freezes_the_adapters_of_an_earlier_call():
    """As the docstring says: a second call freezes everything but its own new matrices."""
    model = apply_lora(GPT(GPTConfig.from_preset("tiny")), r=2, alpha=2, target_modules=["in_proj"])
    apply_lora(model, r=2, alpha=2, target_modules=["fc1"])
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names == {f"blocks.{i}.mlp.fc1.lora_{ab}.weight" for i in range(2) for ab in "AB"}
