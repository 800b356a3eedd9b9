"""Unit tests for transformer_lib.grpo (chapter 25): the advantages and the loss against DeepSeekMath's formulas
written out in float64, the other averages, the gradient, refusals of bad inputs, agreement with TRL's
GRPOTrainer on fixed tensors, and one training step of a tiny GPT and a tiny Llama."""

import math
import os

import pytest
import torch

from transformer_lib.arithmetic import END, VOCAB, chat_prompt, check_answer, sample_problems
from transformer_lib.config import GPTConfig, LlamaConfig
from transformer_lib.data import CharTokenizer
from transformer_lib.gpt import GPT
from transformer_lib.grpo import group_advantages, grpo_loss, grpo_train
from transformer_lib.llama import Llama

TOK = CharTokenizer(VOCAB)
EPS, BETA = 0.2, 0.04


# ------------------------------------------------------------------------------------------------
# DeepSeekMath (arXiv:2402.03300), eq. 3 and 4 and section 4.1.2, in Python floats
# ------------------------------------------------------------------------------------------------
def paper_advantages(rewards, G):
    out = []
    for q in range(len(rewards) // G):
        r = rewards[q * G:(q + 1) * G]
        mean = sum(r) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (G - 1))
        out += [(x - mean) / std for x in r]
    return out


def paper_objective(lp, lp_old, lp_ref, adv, G, eps=EPS, beta=BETA):
    groups, J = len(adv) // G, 0.0
    for q in range(groups):
        for i in range(q * G, (q + 1) * G):
            for t in range(len(lp[i])):
                rho, x = math.exp(lp[i][t] - lp_old[i][t]), math.exp(lp_ref[i][t] - lp[i][t])
                surrogate = min(rho * adv[i], min(max(rho, 1 - eps), 1 + eps) * adv[i])
                J += (surrogate - beta * (x - math.log(x) - 1)) / len(lp[i]) / G
    return J / groups


def random_case(B=3, G=4, T=7, seed=0):
    """Ragged answers (1..T tokens, both extremes), ratios beyond both clip edges, rewards of mixed signs;
    padded positions hold garbage, which the loss must ignore."""
    g = torch.Generator().manual_seed(seed)
    N = B * G
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[0], lengths[1] = 1, T
    mask = torch.arange(T) < lengths[:, None]
    logps = torch.log(torch.rand(N, T, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    ratio = torch.tensor([0.5, 0.7, 0.79, 0.85, 1.0, 1.1, 1.19, 1.3, 1.6], dtype=torch.float64)[
        torch.randint(9, (N, T), generator=g)]
    old = logps - torch.log(ratio)
    ref = logps + 0.5 * torch.randn(N, T, generator=g, dtype=torch.float64)
    logps = torch.where(mask, logps, torch.tensor(1e4, dtype=torch.float64))  # exp overflows where masked
    rewards = torch.tensor([0.0, 1.0, 1.0, 3.0, 2.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0, 4.0], dtype=torch.float64)[:N]
    return logps, old, ref, mask, rewards, G


def rows(x, mask):
    return [row[: int(n)] for row, n in zip(x.tolist(), mask.sum(1).tolist())]


def test_the_case_covers_every_clip_region():
    logps, old, ref, mask, rewards, G = random_case()
    A = group_advantages(rewards, G)[:, None]
    r = torch.exp(logps - old)
    for region in ((r < 1 - EPS) & (A < 0), (r < 1 - EPS) & (A > 0), (r > 1 + EPS) & (A > 0),
                   (r > 1 + EPS) & (A < 0), (r > 1 - EPS) & (r < 1 + EPS)):
        assert (region & mask).any()


def test_advantages_match_the_paper():
    _, _, _, _, rewards, G = random_case()
    ours = group_advantages(rewards, G, eps=0.0)
    torch.testing.assert_close(ours, torch.tensor(paper_advantages(rewards.tolist(), G), dtype=torch.float64),
                               rtol=0, atol=1e-12)
    assert torch.equal(group_advantages(torch.full((6,), 2.0), 3), torch.zeros(6))  # equal rewards: 0, not 0/0


def test_advantage_scales():
    r = torch.tensor([0.0, 1.0, 1.0, 1.0, 3.0, 5.0], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(r, 3, scale="none"), torch.tensor([-2 / 3, 1 / 3, 1 / 3, -2.0, 0.0, 2.0],
                                                                                   dtype=torch.float64))
    centred = group_advantages(r, 3, scale="none")
    torch.testing.assert_close(group_advantages(r, 3, scale="batch", eps=0.0), centred / r.std())


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_loss_is_minus_the_papers_objective(dtype, tol):
    logps, old, ref, mask, rewards, G = random_case()
    J = paper_objective(rows(logps, mask), rows(old, mask), rows(ref, mask),
                        paper_advantages(rewards.tolist(), G), G)
    adv = group_advantages(rewards, G, eps=0.0)
    loss, stats = grpo_loss(logps.to(dtype), old.to(dtype), ref.to(dtype), adv.to(dtype), mask, beta=BETA)
    assert loss.dtype == dtype and torch.isfinite(loss)
    assert loss.item() == pytest.approx(-J, rel=tol, abs=tol)
    d = ref - logps
    assert stats["kl"] == pytest.approx((torch.exp(d) - d - 1)[mask].mean().item(), rel=tol)
    assert 0.0 < stats["clip_frac"] < 1.0


def test_other_averages():
    logps, old, ref, mask, rewards, G = random_case()
    adv = group_advantages(rewards, G)
    ratio = torch.exp(logps - old)
    per_token = -torch.min(ratio * adv[:, None], ratio.clamp(1 - EPS, 1 + EPS) * adv[:, None])
    d = ref - logps
    per_token = torch.where(mask, per_token + BETA * (torch.exp(d) - d - 1), 0.0)
    args = (logps, old, ref, adv, mask)
    assert grpo_loss(*args, loss_type="bnpo")[0].item() == pytest.approx((per_token.sum() / mask.sum()).item(), rel=1e-12)
    assert grpo_loss(*args, loss_type="dr_grpo", max_tokens=9)[0].item() == pytest.approx(
        (per_token.sum() / (per_token.size(0) * 9)).item(), rel=1e-12)
    full = torch.ones_like(mask)  # equal lengths: the paper's average is the token mean
    assert grpo_loss(*args[:4], full)[0].item() == pytest.approx(grpo_loss(*args[:4], full, loss_type="bnpo")[0].item(),
                                                                 rel=1e-12)


def test_clip_eps_high_moves_only_the_upper_edge():
    logps, old, ref, mask, rewards, G = random_case()
    adv = group_advantages(rewards, G)
    low = grpo_loss(logps, old, ref, adv, mask)[1]["clip_frac"]
    high = grpo_loss(logps, old, ref, adv, mask, clip_eps_high=0.35)[1]["clip_frac"]
    assert high < low  # fewer tokens clipped above, the same below


def test_gradient_at_ratio_one_is_the_policy_gradient_plus_the_k3_gradient():
    logps, _, ref, mask, rewards, G = random_case()
    logps = torch.where(mask, logps, 0.0).requires_grad_(True)
    adv = group_advantages(rewards, G)
    loss, stats = grpo_loss(logps, logps.detach(), ref, adv, mask, beta=BETA)
    (grad,) = torch.autograd.grad(loss, logps)
    n = mask.sum(1, keepdim=True)
    expected = mask * (-adv[:, None] + BETA * (1 - torch.exp(ref - logps.detach()))) / (logps.size(0) * n)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    assert stats["clip_frac"] == 0.0


@pytest.mark.parametrize("call,match", [
    (lambda: group_advantages(torch.ones(6), 1), "group_size must be"),
    (lambda: group_advantages(torch.ones(7), 3), "rewards must hold whole groups of group_size=3"),
    (lambda: group_advantages(torch.ones(6, dtype=torch.long), 3), "rewards must be a floating-point"),
    (lambda: group_advantages(torch.ones(6), 3, scale="std"), "scale must be one of"),
    (lambda: grpo_loss(torch.zeros(2, 3), torch.zeros(2, 4), None, torch.zeros(2), torch.ones(2, 3), beta=0.0),
     "old_logps must have shape"),
    (lambda: grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), None, torch.zeros(3), torch.ones(2, 3), beta=0.0),
     "advantages must have shape"),
    (lambda: grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), None, torch.zeros(2), torch.ones(2, 3)),
     "ref_logps must be given when beta > 0"),
    (lambda: grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), None, torch.zeros(2), torch.ones(2, 3), beta=0.0,
                       loss_type="dr_grpo"), "max_tokens must be given"),
    (lambda: grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), None, torch.zeros(2), torch.ones(2, 3), beta=0.0,
                       clip_eps=1.0), "clip_eps must be"),
    (lambda: grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), None, torch.zeros(2), torch.ones(2, 3), beta=0.0,
                       loss_type="dapo"), "loss_type must be one of"),
])
def test_bad_inputs_are_refused_naming_the_argument(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=len(VOCAB), dropout=0.0))


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    return Llama(LlamaConfig(vocab_size=len(VOCAB), n_embd=32, n_layer=2, n_head=4, n_kv_head=2, n_inner=64,
                             block_size=64))


PROBLEMS = sample_problems(16, held_out=False, seed=0)
PROMPTS = [chat_prompt(p.question) for p in PROBLEMS]


def reward(i, completion):  # a dense reward, so that a random model gets different rewards within a group
    return float(check_answer(PROBLEMS[i], completion)) + completion.count("1") / 4


@pytest.mark.parametrize("make", [tiny_gpt, tiny_llama], ids=["gpt", "llama"])
def test_one_training_step_moves_the_model(make):
    model = make()
    before = [p.detach().clone() for p in model.parameters()]
    history = grpo_train(model, TOK, PROMPTS, reward, steps=2, prompts_per_step=3, group_size=4, max_new_tokens=5,
                         stop=END, lr=1e-2, updates_per_batch=2)
    assert len(history) == 2 and set(history[0]) == {"reward", "loss", "kl", "clip_frac", "no_signal"}
    assert all(math.isfinite(v) for h in history for v in h.values())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters())) and not model.training
    assert history[-1]["kl"] > 0  # the second step's policy differs from the frozen reference


def test_training_is_reproducible_with_a_seed():
    runs = []
    for _ in range(2):
        model = tiny_gpt()
        grpo_train(model, TOK, PROMPTS, reward, steps=2, prompts_per_step=2, group_size=3, max_new_tokens=4,
                   stop=END, seed=5)
        runs.append(torch.cat([p.flatten() for p in model.parameters()]))
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("kwargs,match", [
    (dict(group_size=1), "group_size must be >= 2, since an answer's advantage"),
    (dict(stop="ab"), "stop must be a str of exactly one token"),
    (dict(max_new_tokens=60), "must fit in block_size"),
    (dict(reward=lambda i, c: float("nan")), "reward must return a finite number"),
    (dict(reward=3), "reward must be callable"),
    (dict(prompts="a prompt"), "prompts must be a non-empty list"),
    (dict(loss_type="ppo"), "loss_type must be one of"),
    (dict(lr=0.0), "lr must be"),
])
def test_grpo_train_refuses_bad_arguments(kwargs, match):
    args = dict(prompts=PROMPTS, reward=reward, steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises((TypeError, ValueError), match=match):
        grpo_train(tiny_gpt(), TOK, args.pop("prompts"), args.pop("reward"), **args)


def test_grpo_train_refuses_a_frozen_model():
    with pytest.raises(ValueError, match="no parameter|require a gradient"):
        grpo_train(tiny_gpt().requires_grad_(False), TOK, PROMPTS, reward, steps=1, group_size=2, max_new_tokens=3)


# ------------------------------------------------------------------------------------------------
# TRL's GRPOTrainer (a real trainer on a tiny random Llama, built offline): the same loss and gradient
# ------------------------------------------------------------------------------------------------
V = 32


@pytest.fixture(scope="module")
def trl_model_dir(tmp_path_factory):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tiny_llama")
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(V - 2)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    LlamaForCausalLM(HFLlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   pad_token_id=0, eos_token_id=1, bos_token_id=1)).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def make_trainer(model_dir, **config):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    args = GRPOConfig(output_dir=str(model_dir / "out"), report_to=[], use_cpu=True, save_strategy="no",
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=6, seed=0,
                      bf16=False,  # TRL's default autocasts to bfloat16, on the CPU too
                      use_bias_correction_kl=False, **config)  # its default weights k3 by the ratio
    def zero_reward(completions, **kwargs):  # the tests give the advantages themselves
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model=model, reward_funcs=zero_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["w1 w2 w3", "w4 w5"]}), processing_class=tok)
    with torch.no_grad():  # move the policy away from the reference, else the KL is exactly 0
        g = torch.Generator().manual_seed(1)
        for p in trainer.model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def hf_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """(N, T) log-probabilities of the completions (right-padded) after left-padded prompts, TRL's layout."""
    logits = model(input_ids=torch.cat([prompt_ids, completion_ids], 1),
                   attention_mask=torch.cat([prompt_mask, completion_mask], 1)).logits
    logits = logits[:, -completion_ids.size(1) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def fixed_inputs(trainer):
    """2 prompts x 4 answers; prompts left-padded, answers right-padded, ragged; old log-probs off both clip edges."""
    g = torch.Generator().manual_seed(2)
    N, P, T = 8, 4, 6
    prompt_mask = (torch.arange(P) >= (P - torch.tensor([4, 4, 4, 4, 2, 2, 2, 2]))[:, None]).long()
    prompt_ids = torch.randint(2, V, (N, P), generator=g).masked_fill(prompt_mask == 0, 0)
    completion_mask = (torch.arange(T) < torch.tensor([6, 3, 1, 5, 6, 2, 4, 6])[:, None]).long()
    completion_ids = torch.randint(2, V, (N, T), generator=g).masked_fill(completion_mask == 0, 0)
    ids = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
               completion_mask=completion_mask)
    with torch.no_grad():
        current = hf_logps(trainer.model, **ids)
        ref = hf_logps(trainer.ref_model, **ids) if trainer.ref_model is not None else None
    ratio = torch.tensor([0.6, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5])[torch.randint(7, (N, T), generator=g)]
    inputs = dict(**ids, advantages=group_advantages(torch.tensor([0.0, 1.0, 3.0, 1.0, 2.0, 2.0, 0.0, 4.0]), 4),
                  old_per_token_logps=current - torch.log(ratio), num_items_in_batch=completion_mask.sum())
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    return inputs


@pytest.mark.parametrize("trl_type,ours,beta", [("grpo", "grpo", 0.04), ("bnpo", "bnpo", 0.04),
                                                ("dapo", "bnpo", 0.04), ("dapo", "bnpo", 0.0),
                                                ("dr_grpo", "dr_grpo", 0.04)])
def test_loss_and_gradient_match_trl(trl_model_dir, trl_type, ours, beta):
    trainer = make_trainer(trl_model_dir, loss_type=trl_type, beta=beta)
    inputs = fixed_inputs(trainer)
    trainer.model.zero_grad()
    loss_trl = trainer._compute_loss(trainer.model, inputs)
    loss_trl.backward()
    grad_trl = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    trainer.model.zero_grad()
    logps = hf_logps(trainer.model, inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                     inputs["completion_mask"])
    loss, stats = grpo_loss(logps, inputs["old_per_token_logps"], inputs.get("ref_per_token_logps"),
                            inputs["advantages"], inputs["completion_mask"], clip_eps=trainer.epsilon_low, beta=beta,
                            loss_type=ours, max_tokens=trainer.max_completion_length)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    # float32 on both sides, the same weights; TRL's chunked log-softmax against a full one
    assert loss.item() == pytest.approx(loss_trl.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(grad, grad_trl, rtol=1e-5, atol=1e-6)
    metrics = trainer._metrics["train"]
    assert stats["clip_frac"] > 0 and stats["clip_frac"] == pytest.approx(metrics["clip_ratio/region_mean"][-1], abs=1e-6)
    if beta:
        assert stats["kl"] == pytest.approx(metrics["kl"][-1], rel=1e-5)


def test_advantages_match_trls_formula():
    pytest.importorskip("trl")
    from trl.trainer.utils import nanstd

    r = torch.randint(0, 4, (5 * 6,), generator=torch.Generator().manual_seed(1)).float()
    r[:6] = 2.0
    mean = r.view(-1, 6).mean(1).repeat_interleave(6)
    std = nanstd(r.view(-1, 6), dim=1).repeat_interleave(6)  # trl/trainer/grpo_trainer.py, scale_rewards="group"
    torch.testing.assert_close(group_advantages(r, 6), (r - mean) / (std + 1e-4), rtol=1e-6, atol=1e-6)
