"""Tests of transformer_lib.causal_lm: the base class that GPT and Llama share (issue 21).

Saving and loading through the base (``config.json`` records ``model_type``, ``from_pretrained``
dispatches on it), ``train`` and checkpoints for a Llama, and ``generate`` with and without the cache.
"""

import json

import pytest
import torch

from transformer_lib.causal_lm import CausalLM
from transformer_lib.checkpoint import load_checkpoint
from transformer_lib.config import GPTConfig, LlamaConfig, TrainConfig
from transformer_lib.gpt import GPT
from transformer_lib.interpret import logit_lens, trace
from transformer_lib.llama import Llama
from transformer_lib.rundir import CHECKPOINT_FILE
from transformer_lib.serialization import CONFIG_NAME
from transformer_lib.training import train

SMALL = LlamaConfig(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_kv_head=2, n_inner=64, block_size=16)


def small_llama(seed: int = 0, **overrides) -> Llama:
    torch.manual_seed(seed)
    config = SMALL if not overrides else LlamaConfig(**{**SMALL.to_dict(), **overrides})
    return Llama(config).eval()


def test_gpt_and_llama_are_causal_lms():
    assert issubclass(GPT, CausalLM) and issubclass(Llama, CausalLM)
    assert CausalLM.model_classes["gpt"] is GPT and CausalLM.model_classes["llama"] is Llama
    with pytest.raises(TypeError, match="Llama: config must be a LlamaConfig, got config=GPTConfig"):
        Llama(GPTConfig.from_preset("tiny"))


@pytest.mark.parametrize("tie", [True, False])
def test_llama_save_pretrained_round_trip_is_exact(tmp_path, tie):
    model = small_llama(tie_embeddings=tie, qk_norm=True)
    model.save_pretrained(tmp_path / "llama")
    assert json.loads((tmp_path / "llama" / CONFIG_NAME).read_text())["model_type"] == "llama"
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    state = torch.random.get_rng_state()
    for cls in (CausalLM, Llama):
        loaded = cls.from_pretrained(tmp_path / "llama")
        assert type(loaded) is Llama and loaded.config == model.config and not loaded.training
        assert torch.equal(loaded(idx)[0], model(idx)[0])  # bit for bit
        assert (loaded.lm_head.weight is loaded.tok_emb.weight) == tie
    assert torch.equal(torch.random.get_rng_state(), state)  # loading draws nothing from the global generator


def test_a_gpt_directory_loads_as_a_gpt_through_the_base(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny")).eval()
    model.save_pretrained(tmp_path / "gpt")
    loaded = CausalLM.from_pretrained(tmp_path / "gpt")
    assert type(loaded) is GPT and loaded.config == model.config
    idx = torch.randint(0, 65, (1, 16), generator=torch.Generator().manual_seed(1))
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    with pytest.raises(TypeError, match=r"holds a GPT \(model_type 'gpt'\), not a Llama"):
        Llama.from_pretrained(tmp_path / "gpt")
    small_llama().save_pretrained(tmp_path / "llama")
    with pytest.raises(TypeError, match=r"holds a Llama \(model_type 'llama'\), not a GPT"):
        GPT.from_pretrained(tmp_path / "llama")


def test_a_directory_without_model_type_is_a_gpt(tmp_path):
    """Directories written before config.json recorded model_type hold GPTs."""
    torch.manual_seed(0)
    GPT(GPTConfig.from_preset("tiny")).save_pretrained(tmp_path)
    path = tmp_path / CONFIG_NAME
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "model_type"}))
    assert type(CausalLM.from_pretrained(tmp_path)) is GPT


def test_llama_generate_is_the_same_with_and_without_the_cache():
    model = small_llama().double()
    idx = torch.randint(0, 50, (2, 3), generator=torch.Generator().manual_seed(2))
    cached = model.generate(idx, 20, temperature=0)  # 23 tokens > block_size: the window slides
    assert cached.shape == (2, 23)
    assert torch.equal(cached, model.generate(idx, 20, temperature=0, use_cache=False))
    assert model.kv_cache_geometry() == (2, 2, 8)  # n_kv_head heads per layer, not n_head


def test_train_trains_a_small_llama_and_resumes(tmp_path):
    model = small_llama().train()
    data = torch.randint(0, 50, (400,), generator=torch.Generator().manual_seed(3))
    config = TrainConfig(max_steps=4, batch_size=4, eval_interval=4, eval_iters=1, warmup_steps=1,
                         checkpoint_interval=2, device="cpu", seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    history = train(model, data[:300], data[300:], config, out_dir=tmp_path, progress=False, stop_at=2)
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in history)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    checkpoint = load_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert checkpoint["model_config_class"] == "LlamaConfig" and checkpoint["model_config"] == SMALL.to_dict()
    history = train(small_llama(seed=1).train(), data[:300], data[300:], config, out_dir=tmp_path,
                    progress=False, resume=True)
    assert len(history) == 4
    with pytest.raises(ValueError, match="was written for model_config="):
        train(GPT(GPTConfig.from_preset("tiny", vocab_size=50)), data[:300], data[300:], config,
              out_dir=tmp_path, progress=False, resume=True)


def test_trace_and_logit_lens_read_a_llama():
    model = small_llama(qk_norm=True)
    idx = torch.randint(0, SMALL.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    tr = trace(model, idx)
    assert tr.attn.shape == (SMALL.n_layer, 2, SMALL.n_head, 9, 9)
    assert torch.equal(tr.logits, model(idx)[0])
    assert torch.equal(logit_lens(model, tr.hidden[-1]), tr.logits)
    with pytest.raises(TypeError, match="trace: model must be a transformer_lib CausalLM"):
        trace(torch.nn.Linear(2, 2), idx)


def test_from_pretrained_of_a_missing_directory_names_it(tmp_path):
    for cls in (CausalLM, Llama):
        with pytest.raises(FileNotFoundError, match=rf"{cls.__name__}.from_pretrained: name_or_dir must be a directory "
                                                     r"written by save_pretrained, got name_or_dir='.*nowhere'"):
            cls.from_pretrained(tmp_path / "nowhere")
