"""Unit tests for transformer_lib.sft (chapter 22): examples with the loss on the response, padding and
packing, the loss against Hugging Face's -100 convention, fine_tune, init_new_tokens and complete."""


import pytest
import torch
import torch.nn.functional as F

from transformer_lib.arithmetic import END, VOCAB, chat_prompt, sample_problems
from transformer_lib.config import GPTConfig, LlamaConfig
from transformer_lib.data import CharTokenizer
from transformer_lib.gpt import GPT
from transformer_lib.llama import Llama
from transformer_lib.sft import (
    complete, fine_tune, init_new_tokens, pack_examples, pad_examples, sft_example, token_logps,
)

TOK = CharTokenizer(VOCAB)


def examples(n=12, seed=0):
    return [sft_example(TOK, chat_prompt(p.question), p.answer + END)
            for p in sample_problems(n, held_out=False, seed=seed)]


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=len(VOCAB), dropout=0.0))


def test_example_targets_only_the_response():
    x, y = sft_example(TOK, "ab", "cde")
    assert x == TOK.encode("abcd") and y == [-1] + TOK.encode("cde")


def test_loss_equals_hugging_faces_minus_100_convention():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False)).eval()
    ours = Llama.from_hf(hf).eval()
    batch = examples(5)
    X, Y = pad_examples(batch)
    T = X.size(1)
    labels = torch.tensor([[-100] + [-100 if t < 0 else t for t in y] + [-100] * (T - len(y)) for _, y in batch])
    with torch.no_grad():
        ours_loss = ours(X, Y)[1]
        hf_loss = hf(input_ids=torch.cat([X, torch.zeros_like(X[:, :1])], 1), labels=labels).loss
    torch.testing.assert_close(ours_loss, hf_loss, rtol=0, atol=1e-5)


def test_right_padding_changes_no_loss():
    model = tiny_gpt().eval()
    batch = examples(6)
    X, Y = pad_examples(batch)
    with torch.no_grad():
        padded = model(X, Y)[1].item()
        sums = [model(torch.tensor([x]), torch.tensor([y]))[1].item() * sum(t >= 0 for t in y) for x, y in batch]
    assert abs(padded - sum(sums) / sum(sum(t >= 0 for t in y) for _, y in batch)) < 1e-5


def test_packing_keeps_every_target_in_order_and_respects_the_block():
    batch = examples(30)
    X, Y = pack_examples(batch, 40)
    assert X.size(1) <= 40 and torch.equal(Y[Y >= 0], pad_examples(batch)[1][pad_examples(batch)[1] >= 0])
    with pytest.raises(ValueError, match="every example must fit in block_size=5"):
        pack_examples(batch, 5)


@pytest.mark.parametrize("model_fn", [tiny_gpt, lambda: Llama(LlamaConfig(
    vocab_size=len(VOCAB), n_embd=32, n_layer=2, n_head=4, n_kv_head=2, n_inner=64, block_size=64))])
def test_fine_tune_lowers_the_loss_for_gpt_and_llama(model_fn):
    torch.manual_seed(0)
    model = model_fn()
    batch = examples(64)
    X, Y = pad_examples(batch)
    with torch.no_grad():
        before = model(X, Y)[1].item()
    losses = fine_tune(model, batch, steps=40, batch_size=16, lr=3e-3, warmup_steps=4)
    with torch.no_grad():
        after = model(X, Y)[1].item()
    assert len(losses) == 40 and after < before - 1.0 and not model.training


def test_fine_tune_trains_only_what_requires_grad():
    model = tiny_gpt()
    model.wte.requires_grad_(False)
    frozen = model.wte.weight.detach().clone()
    fine_tune(model, examples(8), steps=3, batch_size=4)
    assert torch.equal(model.wte.weight, frozen)


def test_complete_matches_generate_row_by_row():
    model = tiny_gpt().eval()
    prompts = [chat_prompt(q) for q in ("add 1 and 2.", "what is 10 plus 20?", "add 3 and 4.")]
    outs = complete(model, TOK, prompts, 5)
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([TOK.encode(prompt)])
        assert out == TOK.decode(model.generate(ids, 5, temperature=0.0)[0, ids.size(1):].tolist())
    stopped = complete(model, TOK, prompts, 5, stop=outs[0][:1])
    assert stopped[0] == outs[0][:1]


def test_init_new_tokens_sets_the_mean_of_the_other_rows():
    w = torch.randn(6, 4)
    before = w.clone()
    init_new_tokens(w, [1, 4])
    torch.testing.assert_close(w[1], before[[0, 2, 3, 5]].mean(0))
    assert torch.equal(w[4], w[1]) and torch.equal(w[[0, 2, 3, 5]], before[[0, 2, 3, 5]])
    with pytest.raises(ValueError, match="token_ids must name some rows but not all 6"):
        init_new_tokens(w, range(6))
    with pytest.raises(ValueError, match="token_ids must be an int in"):
        init_new_tokens(w, [6])


@pytest.mark.parametrize("call, error, words", [
    (lambda: sft_example(TOK, "", "a"), ValueError, "sft_example: prompt must be a non-empty str"),
    (lambda: sft_example(TOK, "a", 3), TypeError, "sft_example: response must be a str"),
    (lambda: pad_examples([]), ValueError, "pad_examples: examples must be a non-empty list"),
    (lambda: pad_examples([([1, 2], [3])]), ValueError, "examples[0] must be (inputs, targets) of the same"),
    (lambda: fine_tune(tiny_gpt(), examples(2), steps=0), ValueError, "fine_tune: steps must be an int >= 1"),
    (lambda: fine_tune(tiny_gpt().requires_grad_(False), examples(2), steps=1), ValueError, "all frozen"),
    (lambda: fine_tune(tiny_gpt(), [([1] * 70, [1] * 70)], steps=1), ValueError, "block_size=64"),
    (lambda: complete(tiny_gpt(), TOK, "abc", 3), ValueError, "complete: prompts must be a non-empty list"),
])
def test_bad_input_gets_a_clear_error(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_token_logps_is_minus_cross_entropy_per_token(dtype):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g, dtype=dtype)
    targets = torch.randint(0, 11, (3, 7), generator=g)
    targets[0, :3] = -1
    targets[2, 5:] = -1
    got = token_logps(logits, targets)
    want = -F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-1, reduction="none")
    assert got.dtype == dtype and got.shape == (3, 7)
    torch.testing.assert_close(got, want)
    assert torch.all(got[targets < 0] == 0)
