"""Unit tests for transformer_lib.dpo (chapter 24): dpo_loss against the closed form of the KL-regularised
objective, its gradient, and TRL's DPOTrainer on a Hugging Face Llama (loss, rewards, gradients);
train_dpo on the library's GPT and Llama, and its refusals."""

import copy

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.arithmetic import END, VOCAB, chat_prompt, sample_problems
from transformer_lib.config import GPTConfig, LlamaConfig
from transformer_lib.data import CharTokenizer
from transformer_lib.dpo import dpo_loss, train_dpo
from transformer_lib.gpt import GPT
from transformer_lib.llama import Llama
from transformer_lib.sft import sft_example, token_logps

TOK = CharTokenizer(VOCAB)
pytestmark = pytest.mark.filterwarnings(r"ignore:`(is_)?gradient_checkpointing` is deprecated:FutureWarning")


def test_closed_form_of_the_kl_regularised_objective():
    """float64: at the optimum pi* = pi_ref exp(r / beta) / Z of max E[r] - beta KL(pi || pi_ref), the implicit
    rewards are the true rewards minus beta log Z, and the loss is the Bradley-Terry -log sigmoid(r_w - r_l)."""
    g = torch.Generator().manual_seed(0)
    beta = 0.3
    ref_logp = torch.log_softmax(torch.randn(5, 7, generator=g, dtype=torch.float64), dim=-1)  # 5 prompts, 7 answers
    reward = 2 * torch.randn(5, 7, generator=g, dtype=torch.float64)
    opt_logp = torch.log_softmax(ref_logp + reward / beta, dim=-1)
    log_z = torch.logsumexp(ref_logp + reward / beta, dim=-1)
    rows, w, l = torch.arange(5), torch.tensor([0, 3, 6, 2, 1]), torch.tensor([4, 1, 2, 5, 0])
    losses, r_w, r_l = dpo_loss(opt_logp[rows, w], opt_logp[rows, l], ref_logp[rows, w], ref_logp[rows, l], beta=beta)
    torch.testing.assert_close(losses, -F.logsigmoid(reward[rows, w] - reward[rows, l]), atol=1e-12, rtol=0)
    torch.testing.assert_close(r_w, reward[rows, w] - beta * log_z, atol=1e-12, rtol=0)
    torch.testing.assert_close(r_l, reward[rows, l] - beta * log_z, atol=1e-12, rtol=0)


def test_gradient_through_token_logps_float64():
    """d loss / d logits = -beta sigmoid(-h) d(log pi(y_w) - log pi(y_l)) / d logits; prompt and padding get none."""
    g = torch.Generator().manual_seed(1)
    beta, B, T, V = 0.7, 3, 5, 11
    logits = torch.randn(2 * B, T, V, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logits = torch.randn(2 * B, T, V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (2 * B, T), generator=g)
    targets[:, :2] = -1  # the prompt
    targets[1, 4:] = -1  # padding
    pc, pr = token_logps(logits, targets).sum(-1).chunk(2)
    rc, rr = token_logps(ref_logits, targets).sum(-1).chunk(2)
    losses, r_w, r_l = dpo_loss(pc, pr, rc, rr, beta=beta)
    assert pc.dtype == torch.float64 and not r_w.requires_grad and not r_l.requires_grad
    (grad,) = torch.autograd.grad(losses.sum(), logits, retain_graph=True)
    h = beta * ((pc - rc) - (pr - rr)).detach()
    (want,) = torch.autograd.grad((pc - pr) @ (-beta * torch.sigmoid(-h)), logits)
    torch.testing.assert_close(grad, want, atol=1e-12, rtol=1e-10)
    assert grad[:, :2].abs().max() == 0 and grad[1, 4:].abs().max() == 0


@pytest.mark.parametrize("bad, match", [
    (dict(beta=0.0), "beta must be"),
    (dict(beta=-1), "beta must be"),
    (dict(policy_rejected_logps=torch.zeros(3)), r"policy_rejected_logps must have shape \(4\)"),
    (dict(reference_chosen_logps=torch.zeros(4, 1)), "reference_chosen_logps must be 1-D"),
    (dict(policy_chosen_logps=torch.zeros(4, dtype=torch.long)), "policy_chosen_logps must be a floating-point"),
])
def test_dpo_loss_refuses_bad_arguments(bad, match):
    args = dict(policy_chosen_logps=torch.zeros(4), policy_rejected_logps=torch.zeros(4),
                reference_chosen_logps=torch.zeros(4), reference_rejected_logps=torch.zeros(4), beta=0.1)
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        dpo_loss(**args)


def pairs(n=8):
    out = []
    for p in sample_problems(n, held_out=False, seed=0):
        q = chat_prompt(p.question)
        wrong = str(int(p.answer) + 1) + END
        out.append((sft_example(TOK, q, p.answer + END), sft_example(TOK, q, wrong)))
    return out


def tiny(kind):
    torch.manual_seed(0)
    if kind == "gpt":
        return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=len(VOCAB), dropout=0.0))
    return Llama(LlamaConfig(n_layer=1, n_head=2, n_kv_head=1, n_embd=32, block_size=64, vocab_size=len(VOCAB)))


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_train_dpo_raises_the_margin_on_gpt_and_llama(kind):
    policy = tiny(kind)
    reference = copy.deepcopy(policy)
    history = train_dpo(policy, reference, pairs(), steps=30, batch_size=8, beta=0.5, lr=3e-3, seed=0)
    assert len(history) == 30 and not policy.training
    assert abs(history[0]["dpo_loss"] - 0.6931) < 1e-3  # step 0: policy == reference, loss log 2
    first, last = history[0], history[-1]
    assert last["chosen_reward"] - last["rejected_reward"] > first["chosen_reward"] - first["rejected_reward"] + 0.5
    for p, q in zip(reference.parameters(), tiny(kind).parameters()):
        assert torch.equal(p, q)  # the reference never moved


def test_train_dpo_refuses_bad_inputs():
    policy = tiny("gpt")
    with pytest.raises(ValueError, match="reference must be a separate copy"):
        train_dpo(policy, policy, pairs(), steps=1)
    with pytest.raises(ValueError, match="pairs must be a non-empty list"):
        train_dpo(policy, copy.deepcopy(policy), [], steps=1)
    with pytest.raises(ValueError, match="pairs must be a non-empty list"):
        train_dpo(policy, copy.deepcopy(policy), [(1, 2, 3)], steps=1)
    with pytest.raises(ValueError, match="nll_weight must be"):
        train_dpo(policy, copy.deepcopy(policy), pairs(), steps=1, nll_weight=-1)
    with pytest.raises(ValueError, match="warmup_steps must be"):
        train_dpo(policy, copy.deepcopy(policy), pairs(), steps=2, warmup_steps=2)
    long = [(sft_example(TOK, "a" * 70, "b"), sft_example(TOK, "a" * 70, "c"))]
    with pytest.raises(ValueError, match="block_size=64"):
        train_dpo(policy, copy.deepcopy(policy), long, steps=1)
    frozen = copy.deepcopy(policy).requires_grad_(False)
    with pytest.raises(ValueError, match="none \\(all frozen\\)"):
        train_dpo(frozen, copy.deepcopy(policy), pairs(), steps=1)


# --- against TRL's DPOTrainer --------------------------------------------------------------------------------

BETA = 0.5  # larger than TRL's default 0.1 so that the margins, and the loss, are far from log 2
WORDS = "<pad> </s> <unk> the cat dog sat ran on mat a big small red blue is".split()
PAIRS = {  # different lengths, so the collator right-pads both halves of the batch
    "prompt": ["the cat", "a dog", "the big red", "is the mat"],
    "chosen": [" sat on the mat", " ran", " cat sat", " blue"],
    "rejected": [" ran", " sat on a big mat", " dog", " red is small"],
}
# float32. A summed log-prob is a sum of <= 7 terms of size <= ~6 (V = 16), so |logps| <= ~40, where float32's
# spacing is ~4e-6. TRL gets its per-token log-probs from a chunked fused LM head (matmul and logsumexp in another
# order), ours from a full log_softmax, so the sums may differ by a few ulps of 40: 1e-4 on logps, and on the
# rewards (beta * a difference of two) and the loss (slope <= beta in the margin) too.
ATOL = 1e-4


def _hf_tokenizer(tokenizers, transformers):
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>",
                                                unk_token="<unk>")


def _hf_llama(transformers, seed):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0, eos_token_id=1, bos_token_id=None,
        tie_word_embeddings=False,
        initializer_range=0.5,  # the default 0.02 gives near-uniform predictions and near-zero rewards
    )
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    """A real DPOTrainer; TRL's loss and logged metrics on the whole batch and on each pair alone."""
    trl = pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    tokenizers = pytest.importorskip("tokenizers")
    datasets.disable_progress_bars()
    policy, ref = _hf_llama(transformers, 0), _hf_llama(transformers, 1)
    # Our log-probs come from copies TRL never sees: the trainer patches its models' forward (a fused LM head).
    ours = copy.deepcopy(policy), copy.deepcopy(ref)
    train = datasets.Dataset.from_dict(PAIRS)
    args = trl.DPOConfig(
        output_dir=str(tmp_path_factory.mktemp("dpo")), report_to=[], beta=BETA,
        bf16=False,  # TRL's configs default to bf16=True (mixed precision), even on the CPU
        use_cpu=True, per_device_train_batch_size=len(train), save_strategy="no", seed=0,
    )
    trainer = trl.DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=train,
                             processing_class=_hf_tokenizer(tokenizers, transformers))
    rows = [trainer.train_dataset[i] for i in range(len(train))]

    def trl_loss(examples):
        inputs = trainer._prepare_inputs(trainer.data_collator(examples))
        trainer._metrics["train"].clear()
        with trainer.compute_loss_context_manager():  # what Trainer.training_step wraps compute_loss in
            loss = trainer.compute_loss(trainer.model, inputs)
        return inputs, loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}

    return dict(trainer=trainer, trl_policy=policy, ours=ours, batch=trl_loss(rows),
                per_pair=[trl_loss([r]) for r in rows])


def _ours(run, inputs):
    """Our dpo_loss on the log-probs of our copies, from TRL's batch: [chosen..., rejected...], a response mask."""
    ids, mask = inputs["input_ids"], inputs["completion_mask"]
    targets = torch.full_like(ids, -1)
    targets[:, :-1] = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -1)  # shift to our convention, -1 off the response
    policy, ref = run["ours"]
    pc, pr = token_logps(policy(input_ids=ids, attention_mask=inputs["attention_mask"]).logits, targets).sum(-1).chunk(2)
    with torch.no_grad():
        rc, rr = token_logps(ref(input_ids=ids, attention_mask=inputs["attention_mask"]).logits, targets).sum(-1).chunk(2)
    return dpo_loss(pc, pr, rc, rr, beta=BETA), pc, pr


def test_trainer_runs_the_sigmoid_loss_in_float32(trl_run):
    t = trl_run["trainer"]
    assert t.loss_types == ["sigmoid"] and t.beta == BETA and t.label_smoothing == 0.0
    assert t.accelerator.mixed_precision == "no"


def test_batch_matches_trl(trl_run):
    inputs, loss, metrics = trl_run["batch"]
    (losses, r_w, r_l), pc, pr = _ours(trl_run, inputs)
    margins = r_w - r_l
    assert margins.abs().min() > 1e-2  # so that rewards/accuracies is not decided by rounding
    assert abs(losses.mean().item() - 0.6931) > 0.05  # not the trivial policy == reference value
    torch.testing.assert_close(losses.mean(), loss.detach(), atol=ATOL, rtol=0)
    for key, value in [("rewards/chosen", r_w), ("rewards/rejected", r_l), ("rewards/margins", margins),
                       ("logps/chosen", pc), ("logps/rejected", pr)]:
        assert abs(value.mean().item() - metrics[key]) <= ATOL, (key, value.mean().item(), metrics[key])
    assert (margins > 0).float().mean().item() == metrics["rewards/accuracies"]


def test_each_pair_matches_trl(trl_run):
    for inputs, loss, metrics in trl_run["per_pair"]:
        (losses, r_w, r_l), _, _ = _ours(trl_run, inputs)
        torch.testing.assert_close(losses, loss.detach().reshape(1), atol=ATOL, rtol=0)
        assert abs(r_w.item() - metrics["rewards/chosen"]) <= ATOL
        assert abs(r_l.item() - metrics["rewards/rejected"]) <= ATOL


def test_gradients_match_trl(trl_run):
    """TRL's fused LM head has its own backward; the policy's gradients must agree with autograd through ours."""
    trainer, (inputs, _, _) = trl_run["trainer"], trl_run["batch"]
    trl_policy, policy = trl_run["trl_policy"], trl_run["ours"][0]
    trl_policy.zero_grad()
    policy.zero_grad()
    trainer.compute_loss(trainer.model, inputs).backward()
    _ours(trl_run, inputs)[0][0].mean().backward()
    for (name, p_trl), p in zip(trl_policy.named_parameters(), policy.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_trl.grad, atol=1e-5, rtol=1e-4, msg=name)
    trl_policy.zero_grad()
    policy.zero_grad()
