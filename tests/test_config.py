"""Unit tests for transformer_lib.config (chapters 5, 6, 9 and 11): ACTIVATIONS, GPTConfig, GPT_PRESETS,
gpt_param_count, TrainConfig, TRAIN_PRESETS, Seq2SeqConfig."""

import dataclasses
import json

import pytest
import torch

import transformer_lib
from transformer_lib import encoder_decoder
from transformer_lib.config import (
    GPT_PRESETS,
    MAX_BATCH_SIZE,
    MAX_STEPS,
    TRAIN_PRESETS,
    GPTConfig,
    Seq2SeqConfig,
    TrainConfig,
    gpt_param_count,
)
from transformer_lib.gpt import GPT


def test_gpt_config_defaults_are_gpt2_small():
    c = GPTConfig()
    assert (c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size) == (12, 12, 768, 1024, 50257)
    assert (c.dropout, c.bias, c.activation, c.layer_norm_eps) == (0.0, True, "gelu", 1e-5)
    assert [f for f in c.to_dict()] == ["n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout",
                                        "bias", "activation", "layer_norm_eps", "position", "qk_norm",
                                        "tie_embeddings", "zero_init", "logit_softcap"]


def test_gpt_config_is_frozen_and_replace_validates(tiny_config):
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_config.n_layer = 3
    assert dataclasses.replace(tiny_config, dropout=0.1).dropout == 0.1
    with pytest.raises(ValueError, match="n_layer"):
        dataclasses.replace(tiny_config, n_layer=0)
    assert hash(tiny_config) == hash(GPTConfig.from_preset("tiny"))  # frozen dataclasses are hashable


@pytest.mark.parametrize("field", ["n_layer", "n_head", "n_embd", "block_size", "vocab_size"])
@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError),
                                        ("4", TypeError)])
def test_gpt_config_int_fields_are_validated(field, bad, error):
    with pytest.raises(error, match=f"GPTConfig: {field} must be"):
        GPTConfig(**{field: bad})


def test_gpt_config_n_embd_divisible_by_n_head():
    with pytest.raises(ValueError, match=r"GPTConfig: n_embd must be divisible by n_head, got n_embd=100 and n_head=3"):
        GPTConfig(n_embd=100, n_head=3)


@pytest.mark.parametrize("bad, error", [(-0.1, ValueError), (1.0, ValueError), (True, TypeError), ("0.1", TypeError)])
def test_gpt_config_dropout_is_validated(bad, error):
    with pytest.raises(error, match="GPTConfig: dropout must be"):
        GPTConfig(dropout=bad)


@pytest.mark.parametrize("bad", [1, 0, "True", None])
def test_gpt_config_bias_must_be_bool(bad):
    with pytest.raises(TypeError, match="GPTConfig: bias must be a bool"):
        GPTConfig(bias=bad)


@pytest.mark.parametrize("bad", ["swish", None])
def test_gpt_config_activation_is_validated(bad):
    with pytest.raises(ValueError, match=f"GPTConfig: activation must be one of .*'gelu_tanh'.*got activation={bad!r}"):
        GPTConfig(activation=bad)


@pytest.mark.parametrize("bad, error", [(0.0, ValueError), (-1e-5, ValueError), (float("nan"), ValueError),
                                        (float("inf"), ValueError), ("1e-5", TypeError), (False, TypeError)])
def test_gpt_config_layer_norm_eps_is_validated(bad, error):
    with pytest.raises(error, match="GPTConfig: layer_norm_eps must be"):
        GPTConfig(layer_norm_eps=bad)


def test_gpt_config_normalises_numbers():
    c = GPTConfig(dropout=0, layer_norm_eps=1)
    assert type(c.dropout) is float and type(c.layer_norm_eps) is float


def test_gpt_config_json_round_trip(tmp_path):
    for c in [GPTConfig.from_preset(n) for n in GPT_PRESETS] + [
        GPTConfig(n_layer=3, n_head=2, n_embd=10, block_size=7, vocab_size=11, dropout=0.25, bias=False,
                  activation="relu", layer_norm_eps=1e-6)
    ]:
        path = tmp_path / "config.json"
        c.to_json(path)
        back = GPTConfig.from_json(path)
        assert back == c
        assert [type(v) for v in back.to_dict().values()] == [type(v) for v in c.to_dict().values()]
        assert json.loads(path.read_text()) == c.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left behind


def test_gpt_config_to_json_replaces_an_existing_file(tmp_path, tiny_config):
    path = tmp_path / "config.json"
    path.write_text("old contents")
    tiny_config.to_json(path)
    assert GPTConfig.from_json(path) == tiny_config


def test_gpt_config_from_dict_missing_keys_take_defaults_and_unknown_keys_fail():
    assert GPTConfig.from_dict({"n_layer": 2}) == GPTConfig(n_layer=2)
    with pytest.raises(ValueError, match=r"GPTConfig.from_dict: unknown keys \['n_embed', 'lr'\]"):
        GPTConfig.from_dict({"n_embed": 10, "lr": 1e-3})
    with pytest.raises(TypeError, match="GPTConfig.from_dict: d must be a mapping"):
        GPTConfig.from_dict([("n_layer", 2)])


def test_gpt_config_from_json_invalid_json_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"n_layer": 2,')
    with pytest.raises(ValueError, match=r"GPTConfig.from_json: .*broken.json is not valid JSON"):
        GPTConfig.from_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"broken.json must hold a JSON object"):
        GPTConfig.from_json(path)
    path.write_text('{"n_layer": 0}')
    with pytest.raises(ValueError, match="GPTConfig: n_layer must be"):
        GPTConfig.from_json(path)


def test_gpt_config_json_files_of_the_wrong_kind_name_the_file(tmp_path, tiny_config):
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"activation": "g\xe9lu"}')  # Latin-1, not UTF-8
    with pytest.raises(ValueError, match=r"GPTConfig.from_json: .*latin1.json is not UTF-8 text"):
        GPTConfig.from_json(latin1)
    with pytest.raises(IsADirectoryError, match="GPTConfig.from_json: path must be a file, got the directory"):
        GPTConfig.from_json(tmp_path)
    with pytest.raises(FileNotFoundError, match="GPTConfig.from_json: path: no such file: .*nowhere.json"):
        GPTConfig.from_json(tmp_path / "nowhere.json")
    with pytest.raises(TypeError, match="GPTConfig.from_json: path must be a str or os.PathLike"):
        GPTConfig.from_json(None)
    with pytest.raises(IsADirectoryError, match="GPTConfig.to_json: path must be a file"):
        tiny_config.to_json(tmp_path)
    with pytest.raises(FileNotFoundError, match="GPTConfig.to_json: path: no such directory: .*missing"):
        tiny_config.to_json(tmp_path / "missing" / "config.json")
    with pytest.raises(NotADirectoryError, match="GPTConfig.to_json: path: .*latin1.json is a file"):
        tiny_config.to_json(latin1 / "config.json")
    assert latin1.read_bytes() == b'{"activation": "g\xe9lu"}'  # nothing written


def test_gpt_presets(tiny_config):
    assert list(GPT_PRESETS) == ["tiny", "baby", "shakespeare-char", "speedrun", "gpt2", "gpt2-medium", "gpt2-large",
                                 "gpt2-xl"]
    tiny, baby = tiny_config, GPTConfig.from_preset("baby")
    assert (tiny.n_layer, tiny.n_head, tiny.n_embd, tiny.block_size, tiny.vocab_size) == (2, 2, 32, 16, 65)
    assert (baby.n_layer, baby.n_head, baby.n_embd, baby.block_size, baby.vocab_size) == (4, 4, 128, 64, 65)
    assert (baby.dropout, baby.bias) == (0.0, False)
    sc = GPTConfig.from_preset("shakespeare-char")
    assert (sc.n_layer, sc.n_head, sc.n_embd, sc.block_size, sc.vocab_size, sc.dropout, sc.bias) == (
        6, 6, 384, 256, 65, 0.2, False)
    assert GPTConfig.from_preset("shakespeare-char", dropout=0.0).dropout == 0.0
    assert GPT_PRESETS["shakespeare-char"]["dropout"] == 0.2  # overrides do not modify the preset
    speedrun = GPTConfig.from_preset("speedrun")  # the baby's widths with Chapter 21's changes
    assert (speedrun.n_layer, speedrun.n_embd, speedrun.position, speedrun.tie_embeddings) == (4, 128, "rope", False)


@pytest.mark.parametrize("name, shape, n_params", [
    ("gpt2", (12, 12, 768), 124_439_808),
    ("gpt2-medium", (24, 16, 1024), 354_823_168),
    ("gpt2-large", (36, 20, 1280), 774_030_080),
    ("gpt2-xl", (48, 25, 1600), 1_557_611_200),
])
def test_gpt2_presets_have_the_shapes_of_the_released_models(name, shape, n_params):
    c = GPTConfig.from_preset(name)
    assert (c.n_layer, c.n_head, c.n_embd) == shape
    assert (c.block_size, c.vocab_size, c.dropout, c.bias, c.activation) == (1024, 50257, 0.0, True, "gelu_tanh")
    assert gpt_param_count(c) == n_params  # the parameter counts the released checkpoints report


def test_gpt_presets_errors():
    with pytest.raises(ValueError, match=r"GPTConfig.from_preset: name must be one of 'tiny', 'baby'.*got name='gpt3'"):
        GPTConfig.from_preset("gpt3")
    with pytest.raises(ValueError, match=r"unknown keys \['n_embed'\]"):
        GPTConfig.from_preset("tiny", n_embed=64)


@pytest.mark.parametrize(
    "config",
    [GPTConfig.from_preset(n) for n in GPT_PRESETS]
    + [GPTConfig(n_layer=L, n_head=h, n_embd=d, block_size=T, vocab_size=V, bias=b)
       for (L, h, d, T, V) in ((1, 1, 8, 5, 7), (3, 3, 24, 9, 100)) for b in (True, False)],
    ids=lambda c: f"L{c.n_layer}-d{c.n_embd}-V{c.vocab_size}-bias{c.bias}",
)
def test_gpt_param_count_formula(config):
    with torch.device("meta"):  # shapes without storage: instant even for gpt2-xl
        model = GPT(config)
    assert gpt_param_count(config) == sum(p.numel() for p in model.parameters())
    assert gpt_param_count(config, non_embedding=True) == model.num_params()


def test_gpt_param_count_errors():
    with pytest.raises(TypeError, match="gpt_param_count: config must be a GPTConfig"):
        gpt_param_count({"n_layer": 1})


# ---------------------------------------------------------------- Seq2SeqConfig

SMALL = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=32, n_head=4, n_encoder_layers=2, n_decoder_layers=2,
             d_ff=64, dropout=0.0, max_len=16)


def test_seq2seq_config_defaults_and_json(tmp_path):
    c = Seq2SeqConfig(100, 120)
    assert (c.d_model, c.n_head, c.n_encoder_layers, c.n_decoder_layers, c.d_ff, c.dropout) == (512, 8, 6, 6, 2048, 0.1)
    assert (c.max_len, c.activation, c.norm_first, c.bias, c.pad_id, c.tie_embeddings) == (512, "relu", False, True, 0, True)
    other = Seq2SeqConfig(**SMALL, activation="gelu", norm_first=True, bias=False, pad_id=3, tie_embeddings=False)
    for cfg in (c, other):
        cfg.to_json(tmp_path / "s2s.json")
        assert Seq2SeqConfig.from_json(tmp_path / "s2s.json") == cfg
    with pytest.raises(ValueError, match=r"Seq2SeqConfig.from_dict: missing required keys \['tgt_vocab_size'\]"):
        Seq2SeqConfig.from_dict({"src_vocab_size": 5})
    with pytest.raises(ValueError, match=r"Seq2SeqConfig.from_dict: unknown keys \['vocab_size'\]"):
        Seq2SeqConfig.from_dict({"src_vocab_size": 5, "tgt_vocab_size": 5, "vocab_size": 5})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="Seq2SeqConfig.from_json: .*bad.json is not valid JSON"):
        Seq2SeqConfig.from_json(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(src_vocab_size=0), ValueError, "src_vocab_size must be an int >= 1"),
        (dict(tgt_vocab_size=True), TypeError, "tgt_vocab_size must be an int"),
        (dict(d_model=30, n_head=4), ValueError, "d_model must be divisible by n_head, got d_model=30 and n_head=4"),
        (dict(d_model=33, n_head=3), ValueError, "d_model must be even"),
        (dict(n_encoder_layers=0), ValueError, "n_encoder_layers must be"),
        (dict(n_decoder_layers=1.0), TypeError, "n_decoder_layers must be an int"),
        (dict(d_ff=-1), ValueError, "d_ff must be"),
        (dict(dropout=1.0), ValueError, "dropout must be"),
        (dict(max_len=0), ValueError, "max_len must be"),
        (dict(activation="gelu_new"), ValueError, "activation must be one of"),
        (dict(norm_first=1), TypeError, "norm_first must be a bool"),
        (dict(bias="yes"), TypeError, "bias must be a bool"),
        (dict(layer_norm_eps=0), ValueError, "layer_norm_eps must be"),
        (dict(pad_id=-1), ValueError, "pad_id must be an int >= 0"),
        (dict(pad_id=11), ValueError, "pad_id must be an id of both vocabularies, got pad_id=11"),
        (dict(tie_embeddings=None), TypeError, "tie_embeddings must be a bool"),
    ],
)
def test_seq2seq_config_validation(kwargs, error, match):
    with pytest.raises(error, match=f"Seq2SeqConfig: {match}"):
        Seq2SeqConfig(**{**SMALL, **kwargs})


def test_seq2seq_config_is_frozen():
    c = Seq2SeqConfig(**SMALL)
    with pytest.raises(AttributeError):
        c.d_model = 64
    assert type(Seq2SeqConfig(**{**SMALL, "dropout": 0}).dropout) is float


def test_seq2seq_config_lives_in_config_and_at_the_top_level():
    assert transformer_lib.Seq2SeqConfig is Seq2SeqConfig and Seq2SeqConfig.__module__ == "transformer_lib.config"
    assert "Seq2SeqConfig" not in encoder_decoder.__all__


# ---------------------------------------------------------------- Chapter 21's architecture options

def test_gpt_config_architecture_options_default_to_gpt2():
    c = GPTConfig()
    assert (c.position, c.qk_norm, c.tie_embeddings, c.zero_init, c.logit_softcap) == ("learned", False, True,
                                                                                       False, 0.0)
    assert type(GPTConfig(logit_softcap=15).logit_softcap) is float  # an int is normalised, like dropout
    assert GPTConfig(activation="relu2").activation == "relu2"


@pytest.mark.parametrize("bad", ["alibi", "Rope", "", None])
def test_gpt_config_position_is_validated(bad):
    with pytest.raises(ValueError, match=f"GPTConfig: position must be one of .*'learned'.*'rope'.*got position="):
        GPTConfig(position=bad)


def test_gpt_config_rope_needs_an_even_head_width():
    with pytest.raises(ValueError, match=r"GPTConfig: position='rope' needs an even head width.*n_embd=30 and "
                                         r"n_head=2 \(width 15\)"):
        GPTConfig(n_embd=30, n_head=2, position="rope")
    assert GPTConfig(n_embd=30, n_head=2).position == "learned"  # an odd head width is fine without RoPE
    assert GPTConfig(n_embd=30, n_head=3, position="rope").n_embd == 30  # width 10: even, so accepted


@pytest.mark.parametrize("bad, error", [(-1.0, ValueError), (-1e-9, ValueError), (float("nan"), ValueError),
                                        (float("inf"), ValueError), ("30", TypeError), (True, TypeError)])
def test_gpt_config_logit_softcap_is_validated(bad, error):
    with pytest.raises(error, match="GPTConfig: logit_softcap must be"):
        GPTConfig(logit_softcap=bad)


@pytest.mark.parametrize("field", ["qk_norm", "tie_embeddings", "zero_init"])
@pytest.mark.parametrize("bad", [1, 0, "True", None])
def test_gpt_config_bool_options_must_be_bool(field, bad):
    with pytest.raises(TypeError, match=f"GPTConfig: {field} must be a bool"):
        GPTConfig(**{field: bad})


def test_gpt_config_json_round_trip_with_architecture_options(tmp_path):
    c = GPTConfig.from_preset("tiny", position="rope", qk_norm=True, tie_embeddings=False, zero_init=True,
                              logit_softcap=30.0, activation="relu2")
    c.to_json(tmp_path / "config.json")
    back = GPTConfig.from_json(tmp_path / "config.json")
    assert back == c and back.to_dict()["position"] == "rope" and back.logit_softcap == 30.0


ARCH_CONFIGS = [
    GPTConfig(n_layer=L, n_head=2, n_embd=16, block_size=T, vocab_size=V, bias=bias, position=position,
              tie_embeddings=tie, qk_norm=qk)
    for (L, T, V) in ((1, 5, 7), (3, 9, 100))
    for bias in (True, False)
    for position in ("learned", "rope")
    for tie in (True, False)
    for qk in (False, True)
]


@pytest.mark.parametrize(
    "config", ARCH_CONFIGS,
    ids=lambda c: f"L{c.n_layer}-V{c.vocab_size}-bias{c.bias}-{c.position}-tie{c.tie_embeddings}-qk{c.qk_norm}",
)
def test_gpt_param_count_formula_with_rope_and_untied_head(config):
    with torch.device("meta"):
        model = GPT(config)
    assert gpt_param_count(config) == sum(p.numel() for p in model.parameters())
    assert gpt_param_count(config, non_embedding=True) == model.num_params()
    d, V, T = config.n_embd, config.vocab_size, config.block_size
    base = gpt_param_count(dataclasses.replace(config, position="learned", tie_embeddings=True))
    # RoPE has no T x d table, an untied head adds a V x d matrix (QK-norm has no parameters)
    assert gpt_param_count(config) == base - (T * d if config.position == "rope" else 0) + (
        0 if config.tie_embeddings else V * d)


# ---------------------------------------------------------------- TrainConfig
@pytest.mark.parametrize("kw,exc,match", [
    (dict(max_steps=0), ValueError, "max_steps"),
    (dict(batch_size=2.5), TypeError, "batch_size"),
    (dict(eval_iters=True), TypeError, "eval_iters"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(lr=0.0), ValueError, "lr"),
    (dict(lr=float("nan")), ValueError, "lr"),
    (dict(min_lr=1.0), ValueError, "min_lr must be <= lr"),
    (dict(warmup_steps=3000), ValueError, "warmup_steps must be < max_steps"),
    (dict(betas=(0.9,)), ValueError, "betas"),
    (dict(betas=(0.9, 1.2)), ValueError, "betas"),
    (dict(grad_clip=-1.0), ValueError, "grad_clip"),
    (dict(device=0), TypeError, "device"),
    (dict(device="gpu7"), ValueError, "device"),
    (dict(device="meta"), ValueError, "device must hold data"),
    (dict(precision="float16"), ValueError, "precision"),
    (dict(seed=2**63), ValueError, r"seed must be an int in \[0, 9223372036854775807\]"),
    (dict(seed=10**30), ValueError, "seed"),
    (dict(max_steps=MAX_STEPS + 1), ValueError, "max_steps"),
    (dict(max_steps=10**30, warmup_steps=5), ValueError, "max_steps"),
    (dict(batch_size=MAX_BATCH_SIZE + 1), ValueError, "batch_size"),
    (dict(eval_iters=10**12), ValueError, "eval_iters"),
    (dict(eval_interval=10**12), ValueError, "eval_interval"),
])
def test_train_config_validation(kw, exc, match):
    with pytest.raises(exc, match=f"TrainConfig: .*{match}"):
        TrainConfig(**kw)


def test_train_config_dict_and_json_round_trip(tmp_path):
    c = TrainConfig(betas=[0.8, 0.9], device=torch.device("cpu"))
    assert c.betas == (0.8, 0.9) and c.device == "cpu"  # normalised: a tuple and a str
    assert TrainConfig.from_dict(c.to_dict()) == c
    c.to_json(tmp_path / "train.json")
    assert TrainConfig.from_json(tmp_path / "train.json") == c
    with pytest.raises(ValueError, match="unknown keys.*learning_rate"):
        TrainConfig.from_dict({"learning_rate": 1e-3})


def test_train_config_is_frozen():
    c = TrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.lr = 1.0
    assert dataclasses.replace(c, lr=2e-3).lr == 2e-3 and c.lr == 1e-3
    with pytest.raises(ValueError, match="min_lr"):  # a variant is validated like a new config
        dataclasses.replace(c, min_lr=1.0)
    assert hash(c) == hash(TrainConfig())


def test_train_config_presets():
    baby = TrainConfig.from_preset("shakespeare-baby")
    # Chapter 10's CPU recipe, the command line's defaults
    assert (baby.batch_size, baby.lr, baby.min_lr, baby.warmup_steps) == (12, 4e-3, 4e-5, 50)
    assert (baby.betas, baby.weight_decay, baby.grad_clip, baby.seed) == ((0.9, 0.99), 0.1, 1.0, 1337)
    assert baby.checkpoint_interval == baby.eval_interval == 250
    char = TrainConfig.from_preset("shakespeare-char", max_steps=1000)  # nanoGPT's GPU recipe
    assert (char.max_steps, char.batch_size, char.lr, char.min_lr, char.warmup_steps) == (1000, 64, 1e-3, 1e-4, 100)
    for name, fields in TRAIN_PRESETS.items():
        assert TrainConfig.from_preset(name).to_dict() == {**TrainConfig().to_dict(), **fields}


def test_train_config_preset_errors():
    with pytest.raises(ValueError, match="name.*shakespeare-baby"):  # the message lists the presets
        TrainConfig.from_preset("shakespeare")
    with pytest.raises(ValueError, match="unknown keys.*max_step"):
        TrainConfig.from_preset("shakespeare-baby", max_step=10)
    with pytest.raises(ValueError, match="warmup_steps must be < max_steps"):
        TrainConfig.from_preset("shakespeare-baby", max_steps=50)




# ---------------------------------------------------------------- TrainConfig: Chapter 21's fields
@pytest.mark.parametrize("kw,exc,match", [
    (dict(optimizer="sgd"), ValueError, "optimizer must be one of 'adamw', 'muon'"),
    (dict(optimizer=None), ValueError, "optimizer"),
    (dict(muon_lr=0.0), ValueError, "muon_lr"),
    (dict(muon_lr=-0.02), ValueError, "muon_lr"),
    (dict(muon_lr=float("nan")), ValueError, "muon_lr"),
    (dict(muon_lr="0.02"), TypeError, "muon_lr"),
    (dict(muon_split_qkv="yes"), TypeError, "muon_split_qkv"),
    (dict(muon_split_qkv=1), TypeError, "muon_split_qkv"),
    (dict(compile="yes"), TypeError, "compile"),
    (dict(compile=1), TypeError, "compile"),
    (dict(schedule="linear"), ValueError, "schedule must be one of 'cosine', 'wsd'"),
    (dict(decay_frac=0.0), ValueError, "decay_frac"),
    (dict(decay_frac=1.5), ValueError, "decay_frac"),
    (dict(decay_frac=True), TypeError, "decay_frac"),
    (dict(time_budget=-1.0), ValueError, "time_budget"),
    (dict(time_budget=float("nan")), ValueError, "time_budget"),
    (dict(time_budget=float("inf")), ValueError, "time_budget"),
    (dict(time_budget="60"), TypeError, "time_budget"),
])
def test_train_config_validation_of_the_speedrun_fields(kw, exc, match):
    with pytest.raises(exc, match=f"TrainConfig: {match}"):
        TrainConfig(**kw)


def test_train_config_speedrun_fields_defaults_and_round_trip(tmp_path):
    c = TrainConfig()
    assert (c.optimizer, c.schedule, c.time_budget) == ("adamw", "cosine", 0.0)  # Chapter 9's recipe
    assert 0 < c.decay_frac <= 1 and c.muon_lr > 0
    d = TrainConfig(optimizer="muon", muon_lr=0.02, schedule="wsd", decay_frac=1, time_budget=30)
    assert type(d.decay_frac) is float and type(d.time_budget) is float  # ints are normalised
    d.to_json(tmp_path / "train.json")
    assert TrainConfig.from_json(tmp_path / "train.json") == d
    speedrun = TrainConfig.from_preset("speedrun")
    assert speedrun.optimizer == "muon" and speedrun.time_budget > 0  # a time-budget recipe with Muon
    assert speedrun.compile and not c.compile  # compiled outside the budget; Chapter 9's runs are eager


