"""Tests of the command line's ``finetune`` (the appendix on engineering files and the command line).

The happy paths run in-process on a tiny GPT saved with ``save_pretrained`` and a CharTokenizer over
``arithmetic.VOCAB`` (and once on the shipped ``arith-baby``); the run directory they write is read by
``generate`` and ``evaluate`` unchanged. The bad invocations are one table (``CASES``): argv, a setup,
the exit status and fragments the single stderr line must hold (the file and line number for a fault
of DATA.jsonl).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import torch

import transformer_lib.cli_finetune
from transformer_lib.arithmetic import ASSISTANT, END, SPECIAL, USER, VOCAB, chat_prompt
from transformer_lib.checkpoint import load_checkpoint
from transformer_lib.cli import build_parser, main
from transformer_lib.cli_common import EXIT_FAILURE, EXIT_USAGE
from transformer_lib.cli_finetune import CHAT_ROLES, FINETUNE_DEFAULTS, LORA_TARGETS, _conversation_example
from transformer_lib.config import GPTConfig
from transformer_lib.data import CharTokenizer
from transformer_lib.gpt import GPT
from transformer_lib.lora import LoRALinear, apply_lora, merge_lora, train_token_rows
from transformer_lib.rundir import CHECKPOINT_FILE, METRICS_FILE, RUN_FILE, RUN_FORMAT, TOKENIZER_FILE, read_run
from transformer_lib.sft import fine_tune, sft_example

CONVERSATIONS = [
    [("user", "2+3=?"), ("assistant", "5")],
    [("user", "add 4 and 4."), ("assistant", "8"), ("user", "8+1=?"), ("assistant", "9")],
    [("user", "what is 6 plus 1?"), ("assistant", "7")],
]
# Tiny and fast: 3 steps of 2 conversations, no warm-up, on the CPU.
FAST = ["--max-steps", "3", "--warmup-steps", "0", "--batch-size", "2", "--device", "cpu"]


def jsonl(conversations) -> str:
    return "".join(json.dumps({"messages": [{"role": r, "content": c} for r, c in conv]}) + "\n"
                   for conv in conversations)


def run_main(capsys, *args) -> tuple[int, str, str]:
    status = main([*map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _assert_one_line_error(status, err, *needles, expected, out=""):
    """Exit status ``expected``, exactly one non-empty line on stderr naming ``needles``, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == expected, (status, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("transformer_lib") and ": error: " in lines[0], err
    assert "Traceback" not in err and "Traceback" not in out, err
    for needle in needles:
        assert needle in lines[0], (needle, err)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A module-wide folder: ``base/`` (a tiny GPT saved with save_pretrained and a tokenizer over VOCAB),
    ``chats.jsonl`` (CONVERSATIONS), and ``run/``, the base fine-tuned for 3 steps by the command."""
    root = tmp_path_factory.mktemp("finetune")
    torch.manual_seed(0)
    GPT(GPTConfig.from_preset("tiny", vocab_size=len(VOCAB), block_size=64)).save_pretrained(root / "base")
    CharTokenizer(VOCAB).save(root / "base" / TOKENIZER_FILE)
    (root / "chats.jsonl").write_text(jsonl(CONVERSATIONS), encoding="utf-8")
    assert main(["finetune", str(root / "base"), str(root / "chats.jsonl"), "--out", str(root / "run"), *FAST]) == 0
    return root


def state(directory: Path) -> dict:
    """The weights of a run directory (ckpt.pt) or of a saved model directory."""
    if (directory / CHECKPOINT_FILE).exists():
        return load_checkpoint(directory / CHECKPOINT_FILE)["model"]
    return GPT.from_pretrained(directory).state_dict()


def tokenizer() -> CharTokenizer:
    return CharTokenizer(VOCAB)


# ---------------------------------------------------------------- the chat template
def test_one_exchange_is_chapter_22s_sft_example():
    tok = tokenizer()
    ours = _conversation_example(tok, [{"role": "user", "content": "2+3=?"}, {"role": "assistant", "content": "5"}])
    assert ours == sft_example(tok, chat_prompt("2+3=?"), "5" + END)
    assert CHAT_ROLES == {"user": USER, "assistant": ASSISTANT}


def test_every_assistant_turn_is_trained_and_nothing_else():
    tok = tokenizer()
    messages = [{"role": r, "content": c} for r, c in CONVERSATIONS[1]]
    x, y = _conversation_example(tok, messages)
    text = USER + "add 4 and 4." + END + ASSISTANT + "8" + END + USER + "8+1=?" + END + ASSISTANT + "9" + END
    assert x == tok.encode(text)[:-1] and len(y) == len(x)
    assert tok.decode([t for t in y if t >= 0]) == "8" + END + "9" + END
    # the second turn's targets are sft_example's with the whole first exchange in the prompt (Chapter 22, ex. 3)
    second = sft_example(tok, text[: text.rindex(ASSISTANT) + 1], "9" + END)
    assert y[-2:] == second[1][-2:] and x == second[0]


# ---------------------------------------------------------------- the run directory
def test_writes_a_run_directory_with_the_losses(files):
    run = files / "run"
    assert sorted(p.name for p in run.iterdir()) == sorted([CHECKPOINT_FILE, METRICS_FILE, RUN_FILE, TOKENIZER_FILE])
    stored = read_run(run)
    assert stored.checkpoint["step"] == 3 and stored.train_config.max_steps == 3
    assert stored.tokenizer.chars == tuple(VOCAB)
    records = [json.loads(line) for line in (run / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["train_loss"] for r in records] == stored.checkpoint["metrics"]["losses"]
    assert records[0]["lr"] == pytest.approx(1e-3) and records[-1]["lr"] < records[0]["lr"]
    run_file = json.loads((run / RUN_FILE).read_text())
    assert run_file["format"] == RUN_FORMAT and run_file["finetune"]["conversations"] == 3


def test_the_losses_are_fine_tunes_on_the_same_examples(files):
    """The command is the library's fine_tune on _conversation_example's examples, bit for bit (one process)."""
    tok = tokenizer()
    model = GPT.from_pretrained(files / "base")
    examples = [_conversation_example(tok, [{"role": r, "content": c} for r, c in conv]) for conv in CONVERSATIONS]
    losses = fine_tune(model, examples, steps=3, batch_size=2, lr=1e-3, warmup_steps=0, seed=0)
    assert losses == load_checkpoint(files / "run" / CHECKPOINT_FILE)["metrics"]["losses"]
    assert all(torch.equal(v, state(files / "run")[k]) for k, v in model.state_dict().items())


def test_generate_and_evaluate_read_the_run(files, tmp_path, capsys):
    prompt = chat_prompt("2+3=?")
    status, out, err = run_main(capsys, "generate", "--checkpoint", files / "run", "--prompt", prompt,
                                "--max-new-tokens", 4, "--temperature", 0, "--device", "cpu")
    assert status == 0 and err == "" and out.startswith(prompt) and len(out) == len(prompt) + 4 + 1  # + "\n"
    text = tmp_path / "text.txt"
    text.write_text("what is 2 plus 3? 5\n" * 10, encoding="utf-8")
    status, out, err = run_main(capsys, "evaluate", "--checkpoint", files / "run", "--data", text, "--device", "cpu")
    assert status == 0 and err == "" and out.startswith("val_loss ")
    assert float(out.split()[1]) > 0


def test_full_fine_tuning_changes_the_weights(files):
    base, tuned = state(files / "base"), state(files / "run")
    assert base.keys() == tuned.keys()
    assert all(not torch.equal(base[k], tuned[k]) for k in ("wte.weight", "wpe.weight", "blocks.0.ln1.weight"))


def test_lora_changes_only_the_adapted_matrices_and_the_special_rows(files, tmp_path, capsys):
    status, out, err = run_main(capsys, "finetune", files / "base", files / "chats.jsonl", "--out", tmp_path / "lora",
                                *FAST, "--lora-r", 2)
    assert status == 0 and err == "", err
    base, lora, full = state(files / "base"), state(tmp_path / "lora"), state(files / "run")
    assert lora.keys() == base.keys()  # merged: a plain GPT, no lora_A / lora_B
    recorded = json.loads((tmp_path / "lora" / RUN_FILE).read_text())["finetune"]
    assert (recorded["lora_r"], recorded["lora_alpha"]) == (2, 4.0)  # alpha defaults to 2 r
    adapted = [k for k in base if k.endswith(".weight") and any(f".{t}." in k for t in LORA_TARGETS)]
    assert adapted and all(not torch.equal(base[k], lora[k]) for k in adapted)
    special = [VOCAB.index(c) for c in SPECIAL.values()]
    others = [i for i in range(len(VOCAB)) if i not in special]
    assert torch.equal(base["wte.weight"][others], lora["wte.weight"][others])
    assert not torch.equal(base["wte.weight"][special], lora["wte.weight"][special])
    frozen = [k for k in base if k not in adapted and k not in ("wte.weight", "lm_head.weight")]  # lm_head: tied
    assert frozen and all(torch.equal(base[k], lora[k]) for k in frozen)

    def changed(tuned):
        return sum(int((base[k] != tuned[k]).sum()) for k in base)
    assert 0 < changed(lora) < changed(full)
    # and the merged run is what generate reads
    status, out, _ = run_main(capsys, "generate", "--checkpoint", tmp_path / "lora", "--prompt", chat_prompt("2+3=?"),
                              "--max-new-tokens", 2, "--device", "cpu")
    assert status == 0 and out.startswith(chat_prompt("2+3=?"))


def test_lora_run_is_apply_lora_then_fine_tune(files, tmp_path, capsys):
    """--lora-r R --lora-alpha A: apply_lora on LORA_TARGETS (A matrices from the seed), the special rows trained."""
    assert run_main(capsys, "finetune", files / "base", files / "chats.jsonl", "--out", tmp_path / "lora",
                    *FAST, "--lora-r", 3, "--lora-alpha", 5, "--lr", 0.01, "--seed", 4)[0] == 0
    tok = tokenizer()
    model = GPT.from_pretrained(files / "base")
    torch.manual_seed(4)
    apply_lora(model, r=3, alpha=5, target_modules=LORA_TARGETS)
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 4 * model.config.n_layer
    train_token_rows(model.wte.weight, [tok.encode(c)[0] for c in SPECIAL.values()])
    examples = [_conversation_example(tok, [{"role": r, "content": c} for r, c in conv]) for conv in CONVERSATIONS]
    losses = fine_tune(model, examples, steps=3, batch_size=2, lr=0.01, warmup_steps=0, seed=4)
    assert losses == load_checkpoint(tmp_path / "lora" / CHECKPOINT_FILE)["metrics"]["losses"]
    merged = merge_lora(model).state_dict()
    assert all(torch.equal(v, state(tmp_path / "lora")[k]) for k, v in merged.items())


def test_init_special_tokens_resets_their_rows_to_the_mean(files, tmp_path, capsys, monkeypatch):
    seen = {}
    real = transformer_lib.cli_finetune.fine_tune  # looked up in cli_finetune, where finetune_command runs

    def spy(model, examples, **kwargs):
        seen["wte"] = model.wte.weight.detach().clone()
        return real(model, examples, **kwargs)
    monkeypatch.setattr(transformer_lib.cli_finetune, "fine_tune", spy)
    assert run_main(capsys, "finetune", files / "base", files / "chats.jsonl", "--out", tmp_path / "init", *FAST,
                    "--init-special-tokens")[0] == 0
    special = [VOCAB.index(c) for c in SPECIAL.values()]
    others = [i for i in range(len(VOCAB)) if i not in special]
    mean = state(files / "base")["wte.weight"][others].mean(0)
    assert all(torch.equal(seen["wte"][i], mean) for i in special)
    assert json.loads((tmp_path / "init" / RUN_FILE).read_text())["finetune"]["init_special_tokens"] is True


def test_base_can_be_a_run_of_finetune(files, tmp_path, capsys):
    status, out, err = run_main(capsys, "finetune", files / "run", files / "chats.jsonl", "--out", tmp_path / "again",
                                *FAST)
    assert status == 0 and err == "" and f"{tmp_path / 'again'}/ holds" in out
    assert read_run(tmp_path / "again").checkpoint["step"] == 3
    assert not torch.equal(state(files / "run")["wte.weight"], state(tmp_path / "again")["wte.weight"])


def test_base_can_be_a_run_of_train_whose_text_has_the_template(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("".join(chat_prompt(f"{a}+{a}=?") + f"{2 * a}" + END + "\n" for a in range(40)), encoding="utf-8")
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "pre"), "--preset", "tiny", "--max-steps", "2",
                 "--warmup-steps", "0", "--eval-interval", "2", "--batch-size", "2", "--no-progress",
                 "--device", "cpu"]) == 0
    chats = tmp_path / "chats.jsonl"
    chats.write_text(jsonl([[("user", "1+1=?"), ("assistant", "2")]]), encoding="utf-8")
    status, _, err = run_main(capsys, "finetune", tmp_path / "pre", chats, "--out", tmp_path / "ft", *FAST)
    assert status == 0 and err == "", err
    assert read_run(tmp_path / "ft").tokenizer.chars == read_run(tmp_path / "pre").tokenizer.chars


def test_the_shipped_arith_baby_by_name(tmp_path, capsys):
    chats = tmp_path / "chats.jsonl"
    chats.write_text(jsonl(CONVERSATIONS), encoding="utf-8")
    status, _, err = run_main(capsys, "finetune", "arith-baby", chats, "--out", tmp_path / "ft", "--max-steps", 2,
                              "--warmup-steps", 0, "--batch-size", 2, "--device", "cpu")
    assert status == 0 and err == "", err
    assert read_run(tmp_path / "ft").model_config.n_embd == 128


def test_out_may_hold_other_files_as_for_train(files, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("kept")
    assert run_main(capsys, "finetune", files / "base", files / "chats.jsonl", "--out", tmp_path / "out", *FAST)[0] == 0
    assert (tmp_path / "out" / "notes.txt").read_text() == "kept" and (tmp_path / "out" / CHECKPOINT_FILE).exists()


def test_help_lists_the_flags_and_exit_statuses(capsys):
    status, out, _ = run_main(capsys, "finetune", "--help")
    text = " ".join(out.split())
    assert status == 0 and "Exit status: 0 done, 1 the run failed" in text
    for flag in ("BASE", "DATA.jsonl", "--out", "--max-steps", "--lora-r", "--lora-alpha", "--init-special-tokens"):
        assert flag in text
    assert f"optimizer steps (default: {FINETUNE_DEFAULTS['max_steps']})" in text
    status, out, _ = run_main(capsys, "--help")
    assert status == 0 and "finetune" in out


# ---------------------------------------------------------------- bad invocations: one table
class Case(NamedTuple):
    argv: list[str]  # "{tmp}", "{base}" (a copy of the saved tiny model), "{data}" (a JSONL written by setup) filled in
    status: int  # 2 bad arguments, 1 a failed run
    fragments: tuple[str, ...]  # what the one stderr line must hold; "{data}" and "{tmp}" are filled in
    setup: Callable[[Path], None] | None = None


NEW = "{tmp}/new"  # the run directory, which no failing case may create
FT = ["finetune", "{base}", "{data}", "--out", NEW, *FAST]
GOOD = jsonl(CONVERSATIONS)


def data(content: str | bytes):
    """DATA.jsonl holds ``content``."""
    def setup(tmp: Path):
        (tmp / "data.jsonl").write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return setup


def line3(line: str):
    """DATA.jsonl: two good conversations, then ``line`` as line 3, then a good one."""
    good = GOOD.splitlines()
    return data("\n".join([good[0], good[2], line, good[1]]) + "\n")


def message(*messages) -> str:
    return json.dumps({"messages": list(messages)})


def in_base(change: Callable[[Path], None]):
    return lambda tmp: (data(GOOD)(tmp), change(tmp / "base"))


U, A = {"role": "user", "content": "2+3=?"}, {"role": "assistant", "content": "5"}
LINE3 = ("{data}:3:",)

CASES = {
    # DATA.jsonl, line by line: status 1, the file and line number
    "not JSON": Case(FT, 1, (*LINE3, "not valid JSON"), line3('{"messages": [')),
    "a JSON list": Case(FT, 1, (*LINE3, "object"), line3("[1, 2]")),
    "another top-level key": Case(FT, 1, (*LINE3, "prompt"), line3(json.dumps({"prompt": "x", "completion": "y"}))),
    "messages not a list": Case(FT, 1, (*LINE3, '"messages"'), line3(json.dumps({"messages": "hi"}))),
    "messages empty": Case(FT, 1, (*LINE3, '"messages"'), line3(json.dumps({"messages": []}))),
    "message without content": Case(FT, 1, (*LINE3, "messages[1]"), line3(message(U, {"role": "assistant"}))),
    "content not a string": Case(FT, 1, (*LINE3, "messages[1]"),
                                 line3(message(U, {"role": "assistant", "content": 5}))),
    "message with another key": Case(FT, 1, (*LINE3, "messages[0]"), line3(message({**U, "name": "x"}, A))),
    "system role": Case(FT, 1, (*LINE3, "'system'", "no system turn"),
                        line3(message({"role": "system", "content": "be brief"}, U, A))),
    "unknown role": Case(FT, 1, (*LINE3, "'bot'"), line3(message(U, {"role": "bot", "content": "5"}))),
    "no assistant turn": Case(FT, 1, (*LINE3, "no assistant turn"), line3(message(U))),
    "two user turns": Case(FT, 1, (*LINE3, "alternate"), line3(message(U, U, A))),
    "assistant first": Case(FT, 1, (*LINE3, "alternate"), line3(message(A, U, A))),
    "ends with the user": Case(FT, 1, (*LINE3, "alternate"), line3(message(U, A, U))),
    "character the tokenizer lacks": Case(FT, 1, (*LINE3, "messages[1]", "U+00E9", "cannot encode"),
                                          line3(message(U, {"role": "assistant", "content": "caf\u00e9"}))),
    "upper case the tokenizer lacks": Case(FT, 1, (*LINE3, "messages[0]", "'W'"),
                                           line3(message({"role": "user", "content": "What?"}, A))),
    "reserved end token in content": Case(FT, 1, (*LINE3, "<|end|>", "U+0003"),
                                          line3(message(U, {"role": "assistant", "content": "5" + END}))),
    "longer than block_size": Case(FT, 1, (*LINE3, "block_size=64", "at most 65"),
                                   line3(message({"role": "user", "content": "1+1=?" * 20}, A))),
    "line 1 after a blank line counts": Case(FT, 1, ("{data}:2:", "not valid JSON"), data("\n{\n")),
    # DATA.jsonl as a file: status 1
    "data missing": Case(["finetune", "{base}", "{tmp}/missing.jsonl", "--out", NEW], 1, ("missing.jsonl",)),
    "data empty": Case(FT, 1, ("{data}", "empty"), data("")),
    "data blank lines only": Case(FT, 1, ("{data}", "no conversation"), data("\n  \n\n")),
    "data not UTF-8": Case(FT, 1, ("{data}", "UTF-8"), data(b'{"messages": "\xff"}\n')),
    # BASE: status 1
    "base missing": Case(["finetune", "{tmp}/nowhere", "{data}", "--out", NEW], 1, ("BASE", "nowhere"), data(GOOD)),
    "base a file": Case(["finetune", "{data}", "{data}", "--out", NEW], 1, ("BASE", "is a file"), data(GOOD)),
    "base without tokenizer.json": Case(FT, 1, ("BASE", TOKENIZER_FILE),
                                        in_base(lambda b: (b / TOKENIZER_FILE).unlink())),
    "base without model.safetensors": Case(FT, 1, ("BASE", "model.safetensors"),
                                           in_base(lambda b: (b / "model.safetensors").unlink())),
    "base empty directory": Case(FT, 1, ("BASE",), in_base(lambda b: [p.unlink() for p in b.iterdir()])),
    "base tokenizer of another size": Case(FT, 1, ("BASE", TOKENIZER_FILE),
                                           in_base(lambda b: CharTokenizer(VOCAB[:-1]).save(b / TOKENIZER_FILE))),
    "base tokenizer without the template": Case(FT, 1, ("BASE", "special characters"), in_base(
        lambda b: CharTokenizer("\n!\"#" + VOCAB[4:]).save(b / TOKENIZER_FILE))),
    "base run with a corrupt checkpoint": Case(FT, 1, ("BASE", CHECKPOINT_FILE),
                                               in_base(lambda b: (b / CHECKPOINT_FILE).write_bytes(b"\0" * 64))),
    # flags: status 2, the flag
    "without --out": Case(["finetune", "{base}", "{data}"], 2, ("--out",), data(GOOD)),
    "without DATA": Case(["finetune", "{base}", "--out", NEW], 2, ("DATA.jsonl",)),
    "--max-steps 0": Case([*FT, "--max-steps", "0"], 2, ("--max-steps 0",), data(GOOD)),
    "--max-steps below the default warm-up": Case([*FT[:5], "--max-steps", "5"], 2,
                                                  ("--max-steps 5", "--warmup-steps 20 (the default)"), data(GOOD)),
    "--batch-size 0": Case([*FT, "--batch-size", "0"], 2, ("--batch-size 0",), data(GOOD)),
    "--lr inf": Case([*FT, "--lr", "inf"], 2, ("--lr inf",), data(GOOD)),
    "--lr -1": Case([*FT, "--lr", "-1"], 2, ("--lr -1",), data(GOOD)),
    "--warmup-steps -1": Case([*FT, "--warmup-steps", "-1"], 2, ("--warmup-steps -1",), data(GOOD)),
    "--seed -1": Case([*FT, "--seed", "-1"], 2, ("--seed -1",), data(GOOD)),
    "--seed 2**63": Case([*FT, "--seed", str(2**63)], 2, ("--seed",), data(GOOD)),
    "--lora-r 0": Case([*FT, "--lora-r", "0"], 2, ("--lora-r",), data(GOOD)),
    "--lora-r beyond n_embd": Case([*FT, "--lora-r", "33"], 2, ("--lora-r 33", "n_embd=32"), data(GOOD)),
    "--lora-alpha 0": Case([*FT, "--lora-r", "2", "--lora-alpha", "0"], 2, ("--lora-alpha",), data(GOOD)),
    "--lora-alpha without --lora-r": Case([*FT, "--lora-alpha", "4"], 2, ("--lora-alpha", "--lora-r"), data(GOOD)),
    "--init-special-tokens=1": Case([*FT, "--init-special-tokens=1"], 2, ("--init-special-tokens",), data(GOOD)),
    "--device banana": Case([*FT, "--device", "banana"], 2, ("--device",), data(GOOD)),
    "--out holds a run": Case([*FT[:3], "--out", "{base}/..", *FAST], 2, ("--out", "already holds a run"),
                              lambda tmp: (data(GOOD)(tmp), (tmp / "metrics.jsonl").write_text(""))),
    # --out: status 1
    "--out under a file": Case([*FT[:3], "--out", "{data}/run", *FAST], 1, ("--out",), data(GOOD)),
}
if not torch.cuda.is_available():
    CASES["--device cuda without a GPU"] = Case([*FT, "--device", "cuda"], 1, ("--device cuda",), data(GOOD))


def _prepare(case: Case, tmp: Path, files: Path) -> tuple[list[str], list[str]]:
    shutil.copytree(files / "base", tmp / "base")
    if case.setup is not None:
        case.setup(tmp)
    fill = {"{tmp}": str(tmp), "{base}": str(tmp / "base"), "{data}": str(tmp / "data.jsonl")}

    def filled(text):
        for key, value in fill.items():
            text = text.replace(key, value)
        return text
    return [filled(a) for a in case.argv], [filled(f) for f in case.fragments]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_invocation_is_one_line(name, tmp_path, files, capsys):
    case = CASES[name]
    argv, fragments = _prepare(case, tmp_path, files)
    capsys.readouterr()
    status, out, err = run_main(capsys, *argv)
    _assert_one_line_error(status, err, *fragments, expected=case.status, out=out)
    assert not (tmp_path / "new").exists()  # nothing written before every check has passed
    assert out == ""


def test_the_table_covers_every_flag_of_finetune():
    finetune = build_parser()._subparsers._group_actions[0].choices["finetune"]
    flags = {a.option_strings[-1] for a in finetune._actions if a.option_strings and a.option_strings[-1] != "--help"}
    tested = {arg.split("=")[0] for case in CASES.values() for arg in case.argv if arg.startswith("--")}
    assert flags <= tested, flags - tested
    assert {c.status for c in CASES.values()} == {EXIT_FAILURE, EXIT_USAGE}


@pytest.mark.subprocess
def test_a_bad_line_in_a_process(tmp_path, files):
    case = CASES["no assistant turn"]
    argv, fragments = _prepare(case, tmp_path, files)
    result = subprocess.run([sys.executable, "-m", "transformer_lib", *argv], capture_output=True, text=True,
                            timeout=300)
    _assert_one_line_error(result.returncode, result.stderr, *fragments, expected=1, out=result.stdout)


def test_a_run_of_finetune_is_not_changed_by_a_refused_finetune_into_it(files, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(files / "run", run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    status, _, err = run_main(capsys, "finetune", files / "base", files / "chats.jsonl", "--out", run, *FAST)
    _assert_one_line_error(status, err, "--out", expected=EXIT_USAGE)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_train_resume_refuses_a_run_of_finetune_naming_the_reason(files, tmp_path, capsys):
    """A run of finetune keeps no optimizer state: ``train --resume`` says so (not a tokenizer mismatch), and
    changes nothing."""
    run = tmp_path / "run"
    shutil.copytree(files / "run", run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    status, _, err = run_main(capsys, "train", "--data", files / "chats.jsonl", "--out", run, "--resume",
                              "--no-progress", "--device", "cpu")
    _assert_one_line_error(status, err, "--resume", "run of finetune", "no optimizer state", "as BASE",
                           expected=EXIT_USAGE)
    assert "tokenizer" not in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
